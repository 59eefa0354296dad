"""The ownership timeline as a PNG, drawn with matplotlib when it happens to be importable (not a dependency).

The same lanes, colours, markers and round time ticks as the SVG figure.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from laminar_orchestration.ops.report_notation import (
    FAILOVER_COLOR,
    MIGRATION_COLOR,
    PLACEMENT_COLOR,
    axis_ticks,
    clock_text,
    node_color,
    text_color,
)
from laminar_orchestration.ops.timeline import FAILOVER, FENCED, MIGRATION, PLACEMENT, TimelineReport

__all__ = ["render_png"]


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
                        fontsize=7.5, color=text_color(node_color(s.node)), fontweight="bold")  # fmt: skip
            style = {
                MIGRATION: {"marker": "D", "color": MIGRATION_COLOR, "s": 42},
                FAILOVER: {"marker": "X", "color": FAILOVER_COLOR, "s": 70},
                PLACEMENT: {"marker": "o", "color": "white", "s": 22, "edgecolors": PLACEMENT_COLOR},
                FENCED: {"marker": "s", "color": "#1b1b1b", "s": 30},
            }[s.transition]
            ax.scatter([start], [y + 0.3], zorder=5, linewidths=1.0, **style)
    ax.set_yticks(range(len(parts)))
    ax.set_yticklabels([f"partition {p.partition}" for p in reversed(parts)])
    ax.set_ylim(-0.7, len(parts) - 0.3)
    ax.set_xlim(mdates.date2num(report.start), mdates.date2num(report.end))
    step, ticks = axis_ticks(report.start, report.end)  # the same round ticks as the SVG
    ax.set_xticks([mdates.date2num(t) for t in ticks], [clock_text(t, step) for t in ticks])
    ax.set_xlabel("UTC")
    ax.grid(axis="x", linestyle=":", color="#c0c4ca")
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    handles = [patches.Patch(color=node_color(n), label=f"node {n}") for n in report.node_ids]
    handles += [
        lines.Line2D([], [], marker="D", color=MIGRATION_COLOR, linestyle="", label="migration"),
        lines.Line2D([], [], marker="X", color=FAILOVER_COLOR, linestyle="", markersize=8, label="failover"),
        lines.Line2D(
            [],
            [],
            marker="o",
            markerfacecolor="white",
            markeredgecolor=PLACEMENT_COLOR,
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
