"""`laminar report`: the ownership timeline of a store as one self-contained HTML file.

Every partition gets a horizontal lane; every epoch grant is a bar coloured by
the node it was granted to, from the grant's ``granted_at`` to the next grant
(or to the end of the report). A graceful release leaves a hatched gap between
the old owner's release and the new owner's grant: the only time the partition
is not processed during a planned move. Markers show how each epoch began:
a migration (a graceful ``acquire`` grant from a previous owner), a failover
(a ``fence`` grant that took the partition away from a node without its
cooperation) or a placement (from unassigned). Below the timeline: every grant
and the committed offsets per partition.

Everything is read through the ledger, manifest and source APIs (probing keys,
no listing), so the report works on a live cluster as well as on a stopped
one. The HTML uses inline SVG and CSS only; when matplotlib happens to be
importable (it is not a dependency) a PNG of the timeline is written too.
"""

from __future__ import annotations

import html
import importlib
import math
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from laminar_orchestration.identity import UNASSIGNED
from laminar_orchestration.ops.timeline import (
    FAILOVER,
    FENCED,
    MIGRATION,
    PLACEMENT,
    EpochSpan,
    PartitionSummary,
    TimelineReport,
    collect_report,
)
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import LocalObjectStore, ObjectStore

# Tableau 10 without its red: red is reserved for failover markers.
_PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#9c755f",
    "#ff9da7",
    "#bab0ac",
    "#86bcb6",
)
_UNASSIGNED_COLOR = "#c8c8c8"
_FAILOVER_COLOR = "#d62728"
_MIGRATION_COLOR = "#1f3a93"
_PLACEMENT_COLOR = "#6b6b6b"


def node_color(node: int) -> str:
    """The colour of `node` in every figure (grey for unassigned)."""
    if node == UNASSIGNED:
        return _UNASSIGNED_COLOR
    return _PALETTE[(node - 1) % len(_PALETTE)]


def _text_color(background: str) -> str:
    # Dark text on light fills (yellow, pink), white on the rest: WCAG relative luminance.
    r, g, b = (int(background[i : i + 2], 16) / 255 for i in (1, 3, 5))
    lum = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "#1b1b1b" if lum > 0.55 else "#ffffff"


# --- the time axis ----------------------------------------------------------------------

_TICK_STEPS_S = (
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800,
    3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800,
)  # fmt: skip


def _ticks(start: datetime, end: datetime, target: int = 8) -> tuple[float, list[datetime]]:
    """Round tick times between `start` and `end`: about `target` of them, at a 1-2-5 style step."""
    span = max((end - start).total_seconds(), 1e-3)
    step = next((s for s in _TICK_STEPS_S if span / s <= target), _TICK_STEPS_S[-1])
    # Integer multiples of the step (no accumulated float drift), rounded to the millisecond.
    k = math.ceil(start.timestamp() / step - 1e-9)
    ticks = []
    while k * step <= end.timestamp() + 1e-9:
        ticks.append(datetime.fromtimestamp(round(k * step, 3), UTC))
        k += 1
    return step, ticks


def _clock(t: datetime, step: float) -> str:
    t = t.astimezone(UTC)
    if step < 1:
        return t.strftime("%H:%M:%S.") + f"{t.microsecond // 1000:03d}"[: 1 if step >= 0.1 else 2]
    if step >= 86400:
        return t.strftime("%b %d")
    return t.strftime("%H:%M:%S") if step < 60 else t.strftime("%H:%M")


def _elapsed(seconds: float, span: float) -> str:
    """Time since the start of the axis: +12.5s on short axes, +m:ss (or +h:mm:ss) on long ones."""
    if span < 10:
        return f"+{seconds:.2f}s"
    if span < 120:
        return f"+{seconds:.1f}s"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"+{h}:{m:02d}:{sec:02d}" if h else f"+{m}:{sec:02d}"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _iso(t: datetime | None) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if t else "-"


# --- SVG ----------------------------------------------------------------------------------

_W = 1200
_LEFT = 132
_RIGHT = 36
_TOP = 14
_LANE = 46
_BAR = 22
_BAR_OFFSET = 16  # bar top within its lane: room for the markers above it
_AXIS = 42

_TRANSITION_TEXT = {
    PLACEMENT: "placement (from unassigned)",
    MIGRATION: "migration (graceful: drain, release, acquire)",
    FAILOVER: "failover (forced: old owner fenced)",
    FENCED: "fenced, granted to nobody",
}


def _marker(transition: str) -> str:
    """The SVG of a marker centred on (0, 0)."""
    if transition == FAILOVER:
        bolt = "M1.6,-5.2 L-3.2,0.8 L-0.2,0.8 L-1.6,5.2 L3.2,-0.8 L0.2,-0.8 Z"
        return (
            f'<circle r="8" fill="{_FAILOVER_COLOR}" stroke="#fff" stroke-width="1.5"/><path d="{bolt}" fill="#fff"/>'
        )
    if transition == MIGRATION:
        return (
            f'<path d="M0,-8 L8,0 L0,8 L-8,0 Z" fill="{_MIGRATION_COLOR}" stroke="#fff" stroke-width="1.5"/>'
            '<path d="M-3.5,0 L3,0 M0.5,-2.8 L3.3,0 L0.5,2.8" stroke="#fff" stroke-width="1.5" fill="none"/>'
        )
    if transition == FENCED:
        return '<rect x="-5" y="-5" width="10" height="10" fill="#1b1b1b" stroke="#fff" stroke-width="1.5"/>'
    return f'<circle r="4.5" fill="#fff" stroke="{_PLACEMENT_COLOR}" stroke-width="2"/>'


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


class _Svg:
    """Accumulates SVG elements; coordinates are in a fixed-width viewBox that scales to the page."""

    def __init__(self, report: TimelineReport) -> None:
        self.report = report
        self.t0 = report.start.timestamp()
        self.span = max(report.end.timestamp() - self.t0, 1e-3)
        self.parts: list[str] = []

    def x(self, t: datetime) -> float:
        frac = (t.timestamp() - self.t0) / self.span
        return _LEFT + min(max(frac, 0.0), 1.0) * (_W - _LEFT - _RIGHT)

    def add(self, element: str) -> None:
        self.parts.append(element)


def render_svg(report: TimelineReport) -> str:
    """The timeline figure: one lane per partition, a bar per epoch, markers, time axis and legend."""
    svg = _Svg(report)
    lanes_h = max(1, len(report.partitions)) * _LANE
    axis_y = _TOP + lanes_h
    nodes = report.node_ids
    legend_rows = _legend_rows(report, nodes)
    height = axis_y + _AXIS + 22 * len(legend_rows) + 10

    defs = []
    for n in nodes:
        color = node_color(n)
        defs.append(
            f'<pattern id="released-{n}" patternUnits="userSpaceOnUse" width="6" height="6" '
            f'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff"/>'
            f'<line x1="0" y1="0" x2="0" y2="6" stroke="{color}" stroke-width="2.4"/></pattern>'
        )
    svg.add(f"<defs>{''.join(defs)}</defs>")

    # Grid and axis first, so the bars are drawn over the grid lines.
    step, ticks = _ticks(report.start, report.end)
    svg.add('<g class="axis">')
    for t in ticks:
        x = svg.x(t)
        svg.add(f'<line x1="{x:.1f}" y1="{_TOP - 4}" x2="{x:.1f}" y2="{axis_y + 4}" class="grid"/>')
        svg.add(f'<text x="{x:.1f}" y="{axis_y + 18}" class="tick">{_esc(_clock(t, step))}</text>')
        rel = _elapsed(t.timestamp() - svg.t0, svg.span)
        svg.add(f'<text x="{x:.1f}" y="{axis_y + 31}" class="tick rel">{_esc(rel)}</text>')
    svg.add(f'<line x1="{_LEFT}" y1="{axis_y}" x2="{_W - _RIGHT}" y2="{axis_y}" class="baseline"/>')
    svg.add(f'<text x="{_LEFT - 10}" y="{axis_y + 18}" class="axis-title">UTC</text>')
    svg.add("</g>")

    for i, part in enumerate(report.partitions):
        _lane(svg, part, _TOP + i * _LANE, i)

    end_x = svg.x(report.end)
    svg.add(
        f'<line x1="{end_x:.1f}" y1="{_TOP - 6}" x2="{end_x:.1f}" y2="{axis_y}" class="end-line">'
        f"<title>last activity seen in the store: {_esc(_iso(report.end))} UTC</title></line>"
    )
    _legend(svg, legend_rows, axis_y + _AXIS + 6)

    body = "\n".join(svg.parts)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {height}" width="100%" '
        f'class="timeline" role="img" aria-label="ownership timeline of {len(report.partitions)} partitions">\n'
        f"<title>Ownership timeline</title>\n<style>{_SVG_CSS}</style>\n{body}\n</svg>"
    )


def _lane(svg: _Svg, part: PartitionSummary, top: float, index: int) -> None:
    svg.add(f'<g class="lane" data-partition="{part.partition}">')
    if index % 2 == 0:
        svg.add(f'<rect x="0" y="{top}" width="{_W}" height="{_LANE}" class="lane-bg"/>')
    svg.add(f'<text x="12" y="{top + _BAR_OFFSET + 10}" class="lane-label">partition {part.partition}</text>')
    owner = f"node {part.owner}" if part.owner != UNASSIGNED else "unassigned"
    svg.add(f'<text x="12" y="{top + _BAR_OFFSET + 23}" class="lane-sub">epoch {part.epoch} · {_esc(owner)}</text>')
    bar_y = top + _BAR_OFFSET
    if not part.spans:
        svg.add(f'<text x="{_LEFT + 6}" y="{bar_y + 15}" class="lane-sub">never granted</text>')
    for span in part.spans:
        _bar(svg, span, bar_y)
    # Markers last, so neighbouring bars never cover them.
    for span in part.spans:
        x = svg.x(span.granted_at)
        title = (
            f"partition {span.partition}: {_TRANSITION_TEXT[span.transition]} to "
            f"{'node ' + str(span.node) if span.node else 'nobody'} at epoch {span.epoch}"
            + (f" (from node {span.previous_owner})" if span.previous_owner else "")
            + f", {_iso(span.granted_at)} UTC"
            + (f": {_reason_text(span)}" if span.reason else "")
        )
        svg.add(
            f'<g class="marker {span.transition}" data-partition="{span.partition}" data-epoch="{span.epoch}" '
            f'data-node="{span.node}" data-from="{span.previous_owner}" '
            f'transform="translate({x:.1f},{bar_y:.1f})"><title>{_esc(title)}</title>{_marker(span.transition)}</g>'
        )
    svg.add("</g>")


def _bar(svg: _Svg, span: EpochSpan, y: float) -> None:
    x0 = svg.x(span.granted_at)
    x_end = svg.x(span.ends_at)
    held_until = span.released_at if span.released_at is not None else span.ends_at
    x1 = min(svg.x(held_until), x_end)
    width = max(x1 - x0, 1.5)  # every epoch stays visible, however short
    color = node_color(span.node)
    who = f"node {span.node}" if span.node else "nobody"
    held = (held_until - span.granted_at).total_seconds()
    title = (
        f"partition {span.partition} · epoch {span.epoch} · {who} · {_grant_kind_text(span)}\n"
        f"granted {_iso(span.granted_at)} UTC, held {_duration(held)}"
        + (f", released {_iso(span.released_at)} UTC" if span.released_at else "")
        + (f"\n{_reason_text(span)}" if span.reason else "")
    )
    svg.add(
        f'<rect class="bar" data-partition="{span.partition}" data-epoch="{span.epoch}" data-node="{span.node}" '
        f'data-kind="{span.grant_kind}" data-transition="{span.transition}" x="{x0:.1f}" y="{y:.1f}" '
        f'width="{width:.1f}" height="{_BAR}" rx="3" fill="{color}"><title>{_esc(title)}</title></rect>'
    )
    if span.released_at is not None and x_end - x1 >= 0.5:
        gap = (span.ends_at - span.released_at).total_seconds()
        what = "until the next grant" if not span.current else "not granted since"
        svg.add(
            f'<rect class="released" data-partition="{span.partition}" data-epoch="{span.epoch}" '
            f'x="{x1:.1f}" y="{y + 3:.1f}" width="{x_end - x1:.1f}" height="{_BAR - 6}" '
            f'fill="url(#released-{span.node})"><title>epoch {span.epoch} released by {who}, '
            f"{what}: {_esc(_duration(gap))}</title></rect>"
        )
    label = f"e{span.epoch} · n{span.node}" if width >= 62 else f"e{span.epoch}" if width >= 24 else ""
    if label:
        svg.add(
            f'<text x="{x0 + 6:.1f}" y="{y + 15:.1f}" class="bar-label" fill="{_text_color(color)}">'
            f"{_esc(label)}</text>"
        )


def _legend_rows(report: TimelineReport, nodes: list[int]) -> list[list[tuple[str, str]]]:
    """Legend items (kind, label) wrapped into rows that fit the figure's width."""
    status = {n.node: n.status for n in report.nodes}
    items: list[tuple[str, str]] = []
    for n in nodes:
        items.append((f"node:{n}", f"node {n}" + (f" ({status[n]})" if n in status else "")))
    if any(s.node == UNASSIGNED for s in report.spans):
        items.append(("node:0", "nobody"))
    items.append(("released", "released, awaiting the new owner"))
    for t in (MIGRATION, FAILOVER, PLACEMENT):
        items.append((f"marker:{t}", t))
    if report.count(FENCED):
        items.append((f"marker:{FENCED}", "fenced to nobody"))
    rows: list[list[tuple[str, str]]] = [[]]
    x = float(_LEFT)
    for item in items:
        w = _legend_width(item[1])
        if x + w > _W - _RIGHT and rows[-1]:
            rows.append([])
            x = float(_LEFT)
        rows[-1].append(item)
        x += w
    return rows


def _legend_width(label: str) -> float:
    return 30 + 6.6 * len(label) + 18


def _legend(svg: _Svg, rows: list[list[tuple[str, str]]], y0: float) -> None:
    svg.add('<g class="legend">')
    for r, row in enumerate(rows):
        y = y0 + r * 22
        x = float(_LEFT)
        for kind, label in row:
            if kind.startswith("node:"):
                n = int(kind.split(":")[1])
                svg.add(f'<rect x="{x:.1f}" y="{y - 6:.1f}" width="22" height="12" rx="2" fill="{node_color(n)}"/>')
            elif kind == "released":
                first = next(iter(svg.report.node_ids), 1)
                svg.add(
                    f'<rect x="{x:.1f}" y="{y - 5:.1f}" width="22" height="10" fill="url(#released-{first})" '
                    'stroke="#999" stroke-width="0.5"/>'
                )
            else:
                svg.add(f'<g transform="translate({x + 11:.1f},{y:.1f})">{_marker(kind.split(":")[1])}</g>')
            svg.add(f'<text x="{x + 30:.1f}" y="{y + 4:.1f}" class="legend-text">{_esc(label)}</text>')
            x += _legend_width(label)
    svg.add("</g>")


_SVG_CSS = """
.timeline text { font-family: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
.lane-bg { fill: #f6f7f9; }
.lane-label { font-size: 13px; font-weight: 600; fill: #1b1b1b; }
.lane-sub { font-size: 11px; fill: #6b6b6b; }
.bar { stroke: #fff; stroke-width: 1; }
.bar-label { font-size: 11px; font-weight: 600; pointer-events: none; }
.grid { stroke: #dde1e6; stroke-dasharray: 3 3; }
.baseline { stroke: #8a8f98; }
.tick { font-size: 11px; fill: #3d4148; text-anchor: middle; }
.tick.rel { fill: #8a8f98; font-size: 10px; }
.axis-title { font-size: 10px; fill: #8a8f98; text-anchor: end; }
.end-line { stroke: #8a8f98; stroke-dasharray: 2 4; }
.legend-text { font-size: 12px; fill: #3d4148; }
.marker { cursor: help; }
"""


# --- HTML -----------------------------------------------------------------------------------

_PAGE_CSS = """
:root { color-scheme: light; }
body { margin: 0; background: #eef0f3; color: #1b1b1b;
       font: 14px/1.45 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 20px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 0 0 12px; }
.meta { color: #5b6068; margin: 0 0 16px; }
code { font: 12.5px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #e3e6ea;
       padding: 1px 5px; border-radius: 4px; }
.stats { display: flex; flex-wrap: wrap; gap: 10px; margin-bottom: 16px; }
.stat { background: #fff; border-radius: 8px; padding: 10px 16px; min-width: 110px;
        box-shadow: 0 1px 2px rgba(0,0,0,.06); }
.stat b { display: block; font-size: 20px; }
.stat span { color: #5b6068; font-size: 12px; }
.stat.failover b { color: #d62728; } .stat.migration b { color: #1f3a93; }
.card { background: #fff; border-radius: 10px; padding: 16px 18px; margin-bottom: 18px;
        box-shadow: 0 1px 3px rgba(0,0,0,.08); overflow-x: auto; }
.note { color: #5b6068; font-size: 12.5px; margin: 8px 0 0; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid #e6e8eb; white-space: nowrap; }
th { font-weight: 600; color: #3d4148; background: #f6f7f9; position: sticky; top: 0; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.reason { white-space: normal; color: #3d4148; max-width: 420px; }
tbody tr:hover { background: #f8f9fb; }
.chip { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px;
        vertical-align: -1px; }
.tag { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 12px; }
.tag.migration { background: #e3e8f7; color: #1f3a93; }
.tag.failover { background: #fbe3e3; color: #b31d1e; }
.tag.placement { background: #ececec; color: #4a4a4a; }
.tag.fenced { background: #333; color: #fff; }
.lag-high { color: #b31d1e; font-weight: 600; }
"""


def _node_cell(node: int) -> str:
    if node == UNASSIGNED:
        return '<span class="chip" style="background:#c8c8c8"></span>-'
    return f'<span class="chip" style="background:{node_color(node)}"></span>node {node}'


def _table_head(name: str, columns: Sequence[str], numeric: Collection[str]) -> str:
    """A table's opening tags and header row; the `numeric` columns are right-aligned (class "num")."""
    cells = "".join(f'<th class="num">{c}</th>' if c in numeric else f"<th>{c}</th>" for c in columns)
    return f'<table class="{name}"><thead><tr>{cells}</tr></thead><tbody>'


def _offsets_table(report: TimelineReport) -> Iterator[str]:
    columns = [
        "partition",
        "owner",
        "epoch",
        "status",
        "committed offset",
        "source end",
        "lag",
        "manifests",
        "last commit (UTC)",
    ]
    yield _table_head("offsets", columns, {"partition", "epoch", "committed offset", "source end", "lag", "manifests"})
    for p in report.partitions:
        lag_class = (
            ' class="num lag-high"' if p.lag > 0 and p.source_end and p.lag * 10 > p.source_end else ' class="num"'
        )
        yield (
            f'<tr data-partition="{p.partition}"><td class="num">{p.partition}</td><td>{_node_cell(p.owner)}</td>'
            f'<td class="num">{p.epoch}</td><td>{_esc(p.status)}</td>'
            f'<td class="num committed">{p.committed_offset:,}</td><td class="num">{p.source_end:,}</td>'
            f'<td{lag_class}>{p.lag:,}</td><td class="num">{p.manifests:,}</td>'
            f"<td>{_esc(_iso(p.last_commit_at))}</td></tr>"
        )
    yield "</tbody></table>"


def _grant_kind_text(span: EpochSpan) -> str:
    # A placement is granted the way a forced move is (a fence of node 0, "unassigned"), but nobody is fenced.
    return PLACEMENT if span.transition == PLACEMENT else span.grant_kind


def _reason_text(span: EpochSpan) -> str:
    if span.transition == PLACEMENT:
        return span.reason.replace(f"fence node {UNASSIGNED}", f"place on node {span.node}")
    return span.reason


def _grants_table(report: TimelineReport) -> Iterator[str]:
    columns = ["partition", "epoch", "node", "kind", "from", "reason", "granted at (UTC)", "released at (UTC)", "held"]
    yield _table_head("grants", columns, {"partition", "epoch", "held"})
    for s in report.spans:
        held_until = s.released_at or s.ends_at
        # A released epoch is over even when no later grant exists yet: "current" only while it is held.
        holding = s.current and s.released_at is None
        held = _duration((held_until - s.granted_at).total_seconds()) + (" (current)" if holding else "")
        kind = _grant_kind_text(s)
        # The tag says it already when the kind is the transition ("placement"): no word twice.
        kind_cell = "" if kind == s.transition else f"<code>{_esc(kind)}</code> "
        yield (
            f'<tr data-partition="{s.partition}" data-epoch="{s.epoch}"><td class="num">{s.partition}</td>'
            f'<td class="num">{s.epoch}</td><td>{_node_cell(s.node)}</td>'
            f'<td>{kind_cell}<span class="tag {s.transition}">{s.transition}</span></td>'
            f'<td>{_node_cell(s.previous_owner)}</td><td class="reason">{_esc(_reason_text(s)) or "-"}</td>'
            f"<td>{_esc(_iso(s.granted_at))}</td><td>{_esc(_iso(s.released_at))}</td>"
            f'<td class="num">{_esc(held)}</td></tr>'
        )
    yield "</tbody></table>"


def render_html(report: TimelineReport) -> str:
    """The whole report page: summary, timeline (inline SVG), offsets and grants tables."""
    committed = sum(p.committed_offset for p in report.partitions)
    lag = sum(p.lag for p in report.partitions)
    stats = [
        ("", len(report.partitions), "partitions"),
        ("", len(report.spans), "epochs granted"),
        ("migration", report.count(MIGRATION), "migrations"),
        ("failover", report.count(FAILOVER), "failovers"),
        ("", f"{committed:,}", "events committed"),
        ("", f"{lag:,}", "events of lag"),
        ("", _duration((report.end - report.start).total_seconds()), "timeline span"),
    ]
    stat_html = "".join(
        f'<div class="stat {c}"><b>{_esc(v)}</b><span>{_esc(label)}</span></div>' for c, v, label in stats
    )
    nodes = ", ".join(f"node {n.node} {n.status} (gen {n.generation})" for n in report.nodes) or "none"
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>laminar · ownership timeline</title>
<style>{_PAGE_CSS}</style>
</head>
<body>
<main>
<h1>Ownership timeline</h1>
<p class="meta">store <code>{_esc(report.store_url)}</code> · cluster <code>{_esc(report.cluster_id[:12])}</code>
· {_esc(_iso(report.start))} → {_esc(_iso(report.end))} UTC · generated {_esc(_iso(report.generated_at))} UTC</p>
<div class="stats">{stat_html}</div>
<section class="card">
<h2>Who owned which partition, epoch by epoch</h2>
{render_svg(report)}
<p class="note">Each bar is one epoch grant, coloured by the node it was granted to, from the grant to the next
grant. Hatched: the old owner released the partition and the new owner has not taken it yet (the pause of a
graceful move). A diamond marks a migration, a red bolt a failover (the old owner was fenced without its
cooperation). Hover for details. Member nodes: {_esc(nodes)}.</p>
</section>
<section class="card">
<h2>Committed offsets</h2>
{"".join(_offsets_table(report))}
</section>
<section class="card">
<h2>Epoch grants</h2>
{"".join(_grants_table(report))}
</section>
</main>
</body>
</html>
"""


# --- PNG (optional) -------------------------------------------------------------------------


def render_png(report: TimelineReport, path: Path) -> bool:
    """Write the timeline as a PNG with matplotlib if it is importable; False when it is not."""
    try:
        # Looked up at run time: matplotlib is optional, and not a dependency to type-check against.
        mpl: Any = importlib.import_module("matplotlib")
        mpl.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
        mdates: Any = importlib.import_module("matplotlib.dates")
        patches: Any = importlib.import_module("matplotlib.patches")
        lines: Any = importlib.import_module("matplotlib.lines")
    except ImportError:
        return False
    parts = report.partitions
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.62 * max(1, len(parts))), dpi=144)
    span_days = max((report.end - report.start).total_seconds(), 1e-3) / 86400
    for row, part in enumerate(parts):
        y = len(parts) - 1 - row
        for s in part.spans:
            start = mdates.date2num(s.granted_at)
            held = mdates.date2num(s.released_at or s.ends_at) - start
            ax.broken_barh([(start, max(held, span_days / 800))], (y - 0.3, 0.6), facecolors=node_color(s.node),
                           edgecolors="white", linewidth=0.8)  # fmt: skip
            if s.released_at is not None and s.ends_at > s.released_at:
                gap = mdates.date2num(s.ends_at) - mdates.date2num(s.released_at)
                ax.broken_barh([(mdates.date2num(s.released_at), gap)], (y - 0.2, 0.4), facecolors="white",
                               edgecolors=node_color(s.node), hatch="////", linewidth=0)  # fmt: skip
            if held > span_days / 25:
                ax.text(start + span_days / 300, y, f"e{s.epoch} · n{s.node}", va="center", ha="left",
                        fontsize=7.5, color=_text_color(node_color(s.node)), fontweight="bold")  # fmt: skip
            style = {
                MIGRATION: {"marker": "D", "color": _MIGRATION_COLOR, "s": 42},
                FAILOVER: {"marker": "X", "color": _FAILOVER_COLOR, "s": 70},
                PLACEMENT: {"marker": "o", "color": "white", "s": 22, "edgecolors": _PLACEMENT_COLOR},
                FENCED: {"marker": "s", "color": "#1b1b1b", "s": 30},
            }[s.transition]
            ax.scatter([start], [y + 0.3], zorder=5, linewidths=1.0, **style)
    ax.set_yticks(range(len(parts)))
    ax.set_yticklabels([f"partition {p.partition}" for p in reversed(parts)])
    ax.set_ylim(-0.7, len(parts) - 0.3)
    ax.set_xlim(mdates.date2num(report.start), mdates.date2num(report.end))
    step, ticks = _ticks(report.start, report.end)  # the same round ticks as the SVG
    ax.set_xticks([mdates.date2num(t) for t in ticks], [_clock(t, step) for t in ticks])
    ax.set_xlabel("UTC")
    ax.grid(axis="x", linestyle=":", color="#c0c4ca")
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    handles = [patches.Patch(color=node_color(n), label=f"node {n}") for n in report.node_ids]
    handles += [
        lines.Line2D([], [], marker="D", color=_MIGRATION_COLOR, linestyle="", label="migration"),
        lines.Line2D([], [], marker="X", color=_FAILOVER_COLOR, linestyle="", markersize=8, label="failover"),
        lines.Line2D(
            [],
            [],
            marker="o",
            markerfacecolor="white",
            markeredgecolor=_PLACEMENT_COLOR,
            linestyle="",
            label="placement",
        ),
        patches.Patch(facecolor="white", edgecolor="#888", hatch="////", label="released"),
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.5 / max(1, len(parts))),
              ncol=min(len(handles), 8), frameon=False, fontsize=8)  # fmt: skip
    ax.set_title("Ownership timeline", loc="left", fontsize=11, fontweight="bold")
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return True


#: The report's file name when no path is given.
REPORT_FILE_NAME = "laminar-report.html"


def default_report_path(store: ObjectStore) -> Path:
    """Where the report goes when no path is given: beside a local store's directory (for the
    demo, its demo directory), else under ``./.laminar/`` (git-ignored) for a remote store."""
    if isinstance(store, LocalObjectStore):
        return store.root.parent / REPORT_FILE_NAME
    return Path.cwd() / ".laminar" / REPORT_FILE_NAME


@dataclass(frozen=True)
class ReportFiles:
    """What `write_report` wrote."""

    report: TimelineReport
    html: Path
    #: None when no PNG was written; `png_skipped` says why.
    png: Path | None
    #: Why no PNG was written (matplotlib missing, or none asked for); None when one was.
    png_skipped: str | None = None


def write_report(ledger: Ledger, out: Path, *, png: bool = True) -> ReportFiles:
    """Write the HTML report to `out`, and a PNG beside it (same name, ``.png``) when matplotlib is importable."""
    report = collect_report(ledger)
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(report), encoding="utf-8")
    if not png:
        return ReportFiles(report, out, None, "no PNG asked for")
    png_path = out.with_suffix(".png")
    if not render_png(report, png_path):
        return ReportFiles(report, out, None, "matplotlib is not installed (pip install matplotlib)")
    return ReportFiles(report, out, png_path)
