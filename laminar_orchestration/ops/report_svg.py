"""The ownership timeline as an SVG figure: a lane per partition, a bar per epoch, markers, time axis, legend.

Coordinates are in a fixed-width viewBox that scales to the page; the figure
carries its own CSS, so the HTML report embeds it as it is.
"""

from __future__ import annotations

from datetime import datetime

from laminar_orchestration.identity import UNASSIGNED
from laminar_orchestration.ops.report_notation import (
    FAILOVER_COLOR,
    MIGRATION_COLOR,
    PLACEMENT_COLOR,
    axis_ticks,
    clock_text,
    duration_text,
    elapsed_text,
    escaped,
    grant_kind_text,
    node_color,
    reason_text,
    text_color,
    utc_text,
)
from laminar_orchestration.ops.timeline import (
    FAILOVER,
    FENCED,
    MIGRATION,
    PLACEMENT,
    EpochSpan,
    PartitionSummary,
    TimelineReport,
)

__all__ = ["render_svg"]

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
        return f'<circle r="8" fill="{FAILOVER_COLOR}" stroke="#fff" stroke-width="1.5"/><path d="{bolt}" fill="#fff"/>'
    if transition == MIGRATION:
        return (
            f'<path d="M0,-8 L8,0 L0,8 L-8,0 Z" fill="{MIGRATION_COLOR}" stroke="#fff" stroke-width="1.5"/>'
            '<path d="M-3.5,0 L3,0 M0.5,-2.8 L3.3,0 L0.5,2.8" stroke="#fff" stroke-width="1.5" fill="none"/>'
        )
    if transition == FENCED:
        return '<rect x="-5" y="-5" width="10" height="10" fill="#1b1b1b" stroke="#fff" stroke-width="1.5"/>'
    return f'<circle r="4.5" fill="#fff" stroke="{PLACEMENT_COLOR}" stroke-width="2"/>'


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
    step, ticks = axis_ticks(report.start, report.end)
    svg.add('<g class="axis">')
    for t in ticks:
        x = svg.x(t)
        svg.add(f'<line x1="{x:.1f}" y1="{_TOP - 4}" x2="{x:.1f}" y2="{axis_y + 4}" class="grid"/>')
        svg.add(f'<text x="{x:.1f}" y="{axis_y + 18}" class="tick">{escaped(clock_text(t, step))}</text>')
        rel = elapsed_text(t.timestamp() - svg.t0, svg.span)
        svg.add(f'<text x="{x:.1f}" y="{axis_y + 31}" class="tick rel">{escaped(rel)}</text>')
    svg.add(f'<line x1="{_LEFT}" y1="{axis_y}" x2="{_W - _RIGHT}" y2="{axis_y}" class="baseline"/>')
    svg.add(f'<text x="{_LEFT - 10}" y="{axis_y + 18}" class="axis-title">UTC</text>')
    svg.add("</g>")

    for i, part in enumerate(report.partitions):
        _lane(svg, part, _TOP + i * _LANE, i)

    end_x = svg.x(report.end)
    svg.add(
        f'<line x1="{end_x:.1f}" y1="{_TOP - 6}" x2="{end_x:.1f}" y2="{axis_y}" class="end-line">'
        f"<title>last activity seen in the store: {escaped(utc_text(report.end))} UTC</title></line>"
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
    svg.add(f'<text x="12" y="{top + _BAR_OFFSET + 23}" class="lane-sub">epoch {part.epoch} · {escaped(owner)}</text>')
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
            + f", {utc_text(span.granted_at)} UTC"
            + (f": {reason_text(span)}" if span.reason else "")
        )
        svg.add(
            f'<g class="marker {span.transition}" data-partition="{span.partition}" data-epoch="{span.epoch}" '
            f'data-node="{span.node}" data-from="{span.previous_owner}" '
            f'transform="translate({x:.1f},{bar_y:.1f})"><title>{escaped(title)}</title>{_marker(span.transition)}</g>'
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
        f"partition {span.partition} · epoch {span.epoch} · {who} · {grant_kind_text(span)}\n"
        f"granted {utc_text(span.granted_at)} UTC, held {duration_text(held)}"
        + (f", released {utc_text(span.released_at)} UTC" if span.released_at else "")
        + (f"\n{reason_text(span)}" if span.reason else "")
    )
    svg.add(
        f'<rect class="bar" data-partition="{span.partition}" data-epoch="{span.epoch}" data-node="{span.node}" '
        f'data-kind="{span.grant_kind}" data-transition="{span.transition}" x="{x0:.1f}" y="{y:.1f}" '
        f'width="{width:.1f}" height="{_BAR}" rx="3" fill="{color}"><title>{escaped(title)}</title></rect>'
    )
    if span.released_at is not None and x_end - x1 >= 0.5:
        gap = (span.ends_at - span.released_at).total_seconds()
        what = "until the next grant" if not span.current else "not granted since"
        svg.add(
            f'<rect class="released" data-partition="{span.partition}" data-epoch="{span.epoch}" '
            f'x="{x1:.1f}" y="{y + 3:.1f}" width="{x_end - x1:.1f}" height="{_BAR - 6}" '
            f'fill="url(#released-{span.node})"><title>epoch {span.epoch} released by {who}, '
            f"{what}: {escaped(duration_text(gap))}</title></rect>"
        )
    label = f"e{span.epoch} · n{span.node}" if width >= 62 else f"e{span.epoch}" if width >= 24 else ""
    if label:
        svg.add(
            f'<text x="{x0 + 6:.1f}" y="{y + 15:.1f}" class="bar-label" fill="{text_color(color)}">'
            f"{escaped(label)}</text>"
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
            svg.add(f'<text x="{x + 30:.1f}" y="{y + 4:.1f}" class="legend-text">{escaped(label)}</text>')
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
