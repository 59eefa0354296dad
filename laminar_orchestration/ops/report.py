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
importable (it is not a dependency) a PNG of the timeline is written too
(`report_svg`, `report_png`), both in the colours and time notation of
`report_notation`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from laminar_orchestration.identity import UNASSIGNED
from laminar_orchestration.ops.report_notation import (
    duration_text,
    escaped,
    grant_kind_text,
    node_color,
    reason_text,
    utc_text,
)
from laminar_orchestration.ops.report_png import render_png
from laminar_orchestration.ops.report_svg import render_svg
from laminar_orchestration.ops.timeline import FAILOVER, MIGRATION, TimelineReport, collect_report
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import LocalObjectStore, ObjectStore

__all__ = ["REPORT_FILE_NAME", "ReportFiles", "default_report_path", "render_html", "write_report"]

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
            f'<td class="num">{p.epoch}</td><td>{escaped(p.status)}</td>'
            f'<td class="num committed">{p.committed_offset:,}</td><td class="num">{p.source_end:,}</td>'
            f'<td{lag_class}>{p.lag:,}</td><td class="num">{p.manifests:,}</td>'
            f"<td>{escaped(utc_text(p.last_commit_at))}</td></tr>"
        )
    yield "</tbody></table>"


def _grants_table(report: TimelineReport) -> Iterator[str]:
    columns = ["partition", "epoch", "node", "kind", "from", "reason", "granted at (UTC)", "released at (UTC)", "held"]
    yield _table_head("grants", columns, {"partition", "epoch", "held"})
    for s in report.spans:
        held_until = s.released_at or s.ends_at
        # A released epoch is over even when no later grant exists yet: "current" only while it is held.
        holding = s.current and s.released_at is None
        held = duration_text((held_until - s.granted_at).total_seconds()) + (" (current)" if holding else "")
        kind = grant_kind_text(s)
        # The tag says it already when the kind is the transition ("placement"): no word twice.
        kind_cell = "" if kind == s.transition else f"<code>{escaped(kind)}</code> "
        yield (
            f'<tr data-partition="{s.partition}" data-epoch="{s.epoch}"><td class="num">{s.partition}</td>'
            f'<td class="num">{s.epoch}</td><td>{_node_cell(s.node)}</td>'
            f'<td>{kind_cell}<span class="tag {s.transition}">{s.transition}</span></td>'
            f'<td>{_node_cell(s.previous_owner)}</td><td class="reason">{escaped(reason_text(s)) or "-"}</td>'
            f"<td>{escaped(utc_text(s.granted_at))}</td><td>{escaped(utc_text(s.released_at))}</td>"
            f'<td class="num">{escaped(held)}</td></tr>'
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
        ("", duration_text((report.end - report.start).total_seconds()), "timeline span"),
    ]
    stat_html = "".join(
        f'<div class="stat {c}"><b>{escaped(v)}</b><span>{escaped(label)}</span></div>' for c, v, label in stats
    )
    nodes = ", ".join(f"node {n.node} {n.status} (gen {n.generation})" for n in report.nodes) or "none"
    start, end, generated = (escaped(utc_text(t)) for t in (report.start, report.end, report.generated_at))
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
<p class="meta">store <code>{escaped(report.store_url)}</code> · cluster <code>{escaped(report.cluster_id[:12])}</code>
· {start} → {end} UTC · generated {generated} UTC</p>
<div class="stats">{stat_html}</div>
<section class="card">
<h2>Who owned which partition, epoch by epoch</h2>
{render_svg(report)}
<p class="note">Each bar is one epoch grant, coloured by the node it was granted to, from the grant to the next
grant. Hatched: the old owner released the partition and the new owner has not taken it yet (the pause of a
graceful move). A diamond marks a migration, a red bolt a failover (the old owner was fenced without its
cooperation). Hover for details. Member nodes: {escaped(nodes)}.</p>
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
