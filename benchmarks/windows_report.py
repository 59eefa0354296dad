"""The windowed benchmark's table: both sides' figures side by side, the ratios the targets are
about (laminar over Spark SS, from the same run), the state over the run, and the notes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from .baseline_load import LAMINAR, SS
from .common import Row, median, verdict
from .windows_load import (
    BACKLOG_TICKS,
    EVENTS_PER_TICK,
    KEYS,
    SPEEDUP,
    TICK_EVENT_MS,
    TICK_S,
    Latencies,
    tick_event_time,
    window_latencies,
)
from .windows_spark import SideRun, StateSample

#: laminar's planned-move unavailability and kill recovery: at most this fraction of Spark SS's.
RATIO_TARGET = 0.25
#: The state is flat when its size late in the run is within this factor of its size early on.
FLAT_TARGET = 1.2


def s(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f} s"


def lst(xs: Sequence[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


def growth(samples: Sequence[StateSample], value: str) -> tuple[float, float, float]:
    """(early, late, late / early): medians of the first and last thirds of the samples after the first minute."""
    kept = [getattr(x, value) for x in samples if x.elapsed_s >= 60.0] or [getattr(x, value) for x in samples]
    if not kept:
        return math.nan, math.nan, math.nan
    third = max(1, len(kept) // 3)
    early, late = median(kept[:third]), median(kept[-third:])
    return early, late, (late / early if early else math.nan)


def duplicates(rows: Sequence[tuple[str, int, int]]) -> int:
    """(key, window) emitted more than once: extra emissions."""
    return sum(n - 1 for n in Counter((k, w) for k, w, _ in rows).values() if n > 1)


def steady_latency(run: SideRun) -> Latencies:
    return window_latencies(run.window_emitted, run.appended_at, run.steady_window)


def build_rows(ss: SideRun, lam: SideRun, minutes: float) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []

    def add(fig: str, system: str, value: str, target: str = "-", verdict_: str = "info") -> None:
        rows.append(Row(fig, system, value, target, verdict_))

    def ratio(fig: str, a: float | None, b: float | None, target: float | None = None) -> None:
        if a is None or b is None or not b > 0 or math.isnan(a):
            add(fig, "ratio", "n/a", f"<= {target:.2f}" if target else "-", "not measured" if target else "info")
            return
        r = a / b
        shown = f"{r:.2f} ({a:.2f} / {b:.2f})"
        if target is None:
            add(fig, "ratio", shown)
        else:
            add(fig, "ratio", shown, f"<= {target:.2f}", verdict(r, target))

    rate = EVENTS_PER_TICK / TICK_S
    sides = ((SS, ss), (LAMINAR, lam))
    # 1. catch-up
    for name, run in sides:
        tput = run.catch_up_events / run.catch_up_s if run.catch_up_s else math.nan
        add(f"1. catch-up: {run.catch_up_events:,} events appended at once -> all processed (events/s)", name,
            f"{tput:,.0f} ({run.catch_up_s:.2f} s)")  # fmt: skip
    ratio("1. catch-up throughput: laminar / spark-ss",
          lam.catch_up_events / lam.catch_up_s if lam.catch_up_s else None,
          ss.catch_up_events / ss.catch_up_s if ss.catch_up_s else None)  # fmt: skip
    # 2. steady load
    steady = f"2. steady {rate:,.0f} events/s, first {minutes / 2:g} min, undisturbed"
    lats = {}
    for name, run in sides:
        done = run.steady_events_done / run.steady_s if run.steady_s else math.nan
        add(
            f"{steady}: processed events/s",
            name,
            f"{done:,.0f} (in {run.steady_events_in / max(run.steady_s, 1e-9):,.0f})",
        )
        per_m = run.cpu_s / (run.steady_events_done / 1e6) if run.steady_events_done else math.nan
        add(f"{steady}: CPU s per 1M events (every process of the side)", name, f"{per_m:,.1f} ({run.cpu_s:.0f} s)")
    for name, run in sides:
        lat = lats[name] = steady_latency(run)
        add(f"{steady}: window latency p50 / p95 (closing event appended -> window emitted)", name,
            f"{s(lat.p50)} / {s(lat.p(95))} (n={len(lat.samples)})")  # fmt: skip
    ratio("2. window latency p50: laminar / spark-ss", lats[LAMINAR].p50, lats[SS].p50)
    # 3. planned move, 4. kill
    for name, run in sides:
        if run.moves:
            add(f"3. planned move: unavailability, last data batch -> first on the new owner (median of "
                f"{len(run.moves)})", name, s(median([m.unavailable_s for m in run.moves])))  # fmt: skip
    for name, run in sides:
        if run.moves:
            how = "stop -> first data batch on B" if name == SS else "launch -> new owner's first data commit"
            add(f"3. planned move: {how} (median)", name, s(median([m.recovery_s for m in run.moves])))
    ratio("3. planned move unavailability: laminar / spark-ss (warm standby)",
          median([m.unavailable_s for m in lam.moves]) if lam.moves else None,
          median([m.unavailable_s for m in ss.moves]) if ss.moves else None, RATIO_TARGET)  # fmt: skip
    for name, run in sides:
        if run.kills:
            add(f"4. killed owner: detection (median of {len(run.kills)})", name,
                s(median([k.detection_s for k in run.kills])))  # fmt: skip
    for name, run in sides:
        if run.kills:
            how = "start query on the warm standby" if name == SS else "forced failover launch"
            add(f"4. killed owner: recovery, {how} -> first data batch (median of {len(run.kills)})", name,
                s(median([k.recovery_s for k in run.kills])))  # fmt: skip
    for name, run in sides:
        if run.kills:
            add("4. killed owner: unavailability, last data batch -> first elsewhere (median)", name,
                s(median([k.unavailable_s for k in run.kills])))  # fmt: skip
    ratio("4. kill recovery: laminar / spark-ss (warm standby)",
          median([k.recovery_s for k in lam.kills]) if lam.kills else None,
          median([k.recovery_s for k in ss.kills]) if ss.kills else None, RATIO_TARGET)  # fmt: skip
    # 5. state over the run
    for name, run, label, unit, field_ in (
        (LAMINAR, lam, "keys in `laminar query` (committed state rows)", "", "rows"),
        (LAMINAR, lam, "latest snapshot bytes", " MB", "bytes"),
        (SS, ss, "state rows (numRowsTotal)", "", "rows"),
        (SS, ss, "checkpoint state/ bytes (RocksDB changelog + snapshots)", " MB", "bytes"),
    ):
        early, late, g = growth(run.states, field_)
        scale = 1e6 if unit else 1.0
        value = f"{early / scale:,.2f}{unit} -> {late / scale:,.2f}{unit} (x{g:.2f})" if unit else \
            f"{early:,.0f} -> {late:,.0f} (x{g:.2f})"  # fmt: skip
        fig = f"5. state over {minutes:g} min, sampled every 30 s: {label}, early -> late median"
        if name == LAMINAR:
            add(fig, name, value, f"flat (<= x{FLAT_TARGET})",
                verdict(g, FLAT_TARGET) if not math.isnan(g) else "not measured")  # fmt: skip
        else:
            add(fig, name, value)
    # 6. output
    for name, run in sides:
        dup = duplicates(run.rows)
        ok = "met" if dup == 0 else "FAILED"
        fig = "6. (key, window) rows emitted more than once, whole run"
        add(fig, name, str(dup), "0" if name == LAMINAR else "-", ok if name == LAMINAR else "info")
    after = tick_event_time(BACKLOG_TICKS) + 10 * 60_000
    a = {(k, w): v for k, w, v in ss.rows if w >= after}
    b = {(k, w): v for k, w, v in lam.rows if w >= after}
    both = set(a) & set(b)
    same = sum(1 for x in both if a[x] == b[x])
    add("6. windows emitted by both sides (after the backlog): equal views / both / only one side", "both",
        f"{same:,} / {len(both):,} / {len(set(a) ^ set(b)):,}")  # fmt: skip
    if lam.late_events is not None:
        add("6. late events counted (committed in the manifest), whole run", LAMINAR, f"{lam.late_events:,}")
    return rows, notes(ss, lam, rate)


def notes(ss: SideRun, lam: SideRun, rate: float) -> list[str]:
    out: list[str] = []
    for name, run in ((SS, ss), (LAMINAR, lam)):
        if run.moves:
            out.append(f"3 {name}: unavailability {lst([m.unavailable_s for m in run.moves])} s; to first data "
                       f"batch {lst([m.recovery_s for m in run.moves])} s; moves "
                       + ", ".join(f"{m.src}->{m.dst}" for m in run.moves))  # fmt: skip
        if run.kills:
            out.append(f"4 {name}: detection {lst([k.detection_s for k in run.kills])} s; recovery "
                       f"{lst([k.recovery_s for k in run.kills])} s; unavailability "
                       f"{lst([k.unavailable_s for k in run.kills])} s; "
                       + ", ".join(f"{k.src}->{k.dst}" for k in run.kills))  # fmt: skip
        if run.states:
            out.append(f"5 {name} samples (s: rows / MB): " + ", ".join(
                f"{x.elapsed_s:.0f}: {x.rows:,} / {x.bytes / 1e6:.2f}" for x in run.states))  # fmt: skip
        lat = steady_latency(run)
        if lat.samples:
            out.append(f"2 {name}: {len(lat.samples)} windows closed in the steady half, latency min "
                       f"{min(lat.samples):.2f} s, max {max(lat.samples):.2f} s")  # fmt: skip
    out.append(
        f"load: {rate:,.0f} page views/s ({EVENTS_PER_TICK} every {TICK_S} s) over {KEYS:,} users; the event-time "
        f"clock runs x{SPEEDUP} (a tick spans {TICK_EVENT_MS / 1000:.1f} s of event time), so a 5-minute window "
        "closes every 10 s of the run; 10 % of events up to 45 s out of order (applied), 2 % 3-10 min behind "
        f"(late on both sides); {BACKLOG_TICKS} ticks appended at once first (the catch-up), then one tick per "
        f"{TICK_S} s on a fixed schedule; the same events on both sides"
    )
    out.append(
        "window latency: a window [s, e) is final once an event at >= e + 1 min is in the log; its latency is "
        "the wall-clock time from that tick's append to the commit (laminar: manifest committed_at) or the "
        "foreachBatch write (spark-ss) of the window's last row; spark-ss applies a watermark one micro-batch "
        "after the batch that advanced it (its no-data batch emits the window)"
    )
    out.append(
        "data batch: spark-ss = a micro-batch with numInputRows > 0 (its progress: start + triggerExecution); "
        "laminar = a manifest committing events. Moves and kills land at a uniformly random point of the "
        "owner's batch interval, after >= 3 batches"
    )
    out += ss.notes + lam.notes
    return out
