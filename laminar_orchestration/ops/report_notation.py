"""How `laminar report` denotes things: a colour per node and per transition, times and durations as text.

The SVG figure, the PNG and the HTML tables share them, so a node has one colour
and a time one spelling throughout the report: `node_color`, the marker colours,
the time axis's round ticks (`axis_ticks`) and their labels, durations, UTC times,
and the words for a grant's kind and reason.
"""

from __future__ import annotations

import html
import math
from datetime import UTC, datetime

from laminar_orchestration.identity import UNASSIGNED
from laminar_orchestration.ops.timeline import PLACEMENT, EpochSpan

__all__ = [
    "FAILOVER_COLOR",
    "MIGRATION_COLOR",
    "PLACEMENT_COLOR",
    "axis_ticks",
    "clock_text",
    "duration_text",
    "elapsed_text",
    "escaped",
    "grant_kind_text",
    "node_color",
    "reason_text",
    "text_color",
    "utc_text",
]

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
FAILOVER_COLOR = "#d62728"
MIGRATION_COLOR = "#1f3a93"
PLACEMENT_COLOR = "#6b6b6b"


def node_color(node: int) -> str:
    """The colour of `node` in every figure (grey for unassigned)."""
    if node == UNASSIGNED:
        return _UNASSIGNED_COLOR
    return _PALETTE[(node - 1) % len(_PALETTE)]


def text_color(background: str) -> str:
    # Dark text on light fills (yellow, pink), white on the rest: WCAG relative luminance.
    r, g, b = (int(background[i : i + 2], 16) / 255 for i in (1, 3, 5))
    lum = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "#1b1b1b" if lum > 0.55 else "#ffffff"


# --- the time axis ----------------------------------------------------------------------

_TICK_STEPS_S = (
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800,
    3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800,
)  # fmt: skip


def axis_ticks(start: datetime, end: datetime, target: int = 8) -> tuple[float, list[datetime]]:
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


def clock_text(t: datetime, step: float) -> str:
    t = t.astimezone(UTC)
    if step < 1:
        return t.strftime("%H:%M:%S.") + f"{t.microsecond // 1000:03d}"[: 1 if step >= 0.1 else 2]
    if step >= 86400:
        return t.strftime("%b %d")
    return t.strftime("%H:%M:%S") if step < 60 else t.strftime("%H:%M")


def elapsed_text(seconds: float, span: float) -> str:
    """Time since the start of the axis: +12.5s on short axes, +m:ss (or +h:mm:ss) on long ones."""
    if span < 10:
        return f"+{seconds:.2f}s"
    if span < 120:
        return f"+{seconds:.1f}s"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"+{h}:{m:02d}:{sec:02d}" if h else f"+{m}:{sec:02d}"


def duration_text(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def utc_text(t: datetime | None) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if t else "-"


def grant_kind_text(span: EpochSpan) -> str:
    # A placement is granted the way a forced move is (a fence of node 0, "unassigned"), but nobody is fenced.
    return PLACEMENT if span.transition == PLACEMENT else span.grant_kind


def reason_text(span: EpochSpan) -> str:
    if span.transition == PLACEMENT:
        return span.reason.replace(f"fence node {UNASSIGNED}", f"place on node {span.node}")
    return span.reason


def escaped(value: object) -> str:
    return html.escape(str(value), quote=True)
