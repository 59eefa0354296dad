"""The load both sides of the windowed benchmark get: page views on an event-time clock that runs
`SPEEDUP` times faster than the wall clock, produced on a fixed schedule, with the wall-clock time
each tick was appended (what a window's end-to-end latency is measured from).

Tick ``i`` carries `EVENTS_PER_TICK` events over `KEYS` users; its largest event time is exactly
``tick_event_time(i)`` (its first event), the others are spread over the tick's span, 10 % of them
up to 45 s out of order (inside the minute of lateness: applied) and 2 % 3-10 minutes behind (below
every watermark: late, counted and dropped by both systems). A 5-minute window therefore closes
(the watermark, the largest event time minus 1 minute, reaches its end) at a known tick: the first
whose event time is at least the window's end plus the lateness, and the window's latency is its
emission's wall-clock time minus that tick's append.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .common import median, percentile

KEYS = 5_000
EVENTS_PER_TICK = 500
TICK_S = 0.25
#: Event-time seconds per wall-clock second: a 5-minute window closes every 10 s of the run.
SPEEDUP = 30
WINDOW_MS = 5 * 60_000
LATENESS_MS = 60_000
#: The first tick's event time (a multiple of the window, so windows line up with ticks).
EVENT_TIME_0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TICK_EVENT_MS = int(TICK_S * SPEEDUP * 1000)
#: Ticks appended at once before the scheduled load (a backlog: how fast each side catches up).
BACKLOG_TICKS = 240
SALT = 2_026
PAGES = np.array(["/", "/a", "/b", "/cart", "/pay"])

#: The clicks-shaped events, as the Spark side reads them (its file source) and the generator makes them.
CLICKS = pa.schema(
    [
        pa.field("user", pa.string()),
        pa.field("page", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("at", pa.timestamp("ms", "UTC")),
    ]
)


def tick_event_time(tick: int) -> int:
    """The largest event time (epoch ms) of tick `tick`."""
    return EVENT_TIME_0 + tick * TICK_EVENT_MS


def closing_tick(window_end_ms: int) -> int:
    """The first tick whose events take the watermark to `window_end_ms` (the window is final then)."""
    return max(0, math.ceil((window_end_ms + LATENESS_MS - EVENT_TIME_0) / TICK_EVENT_MS))


def clicks(tick: int, count: int = EVENTS_PER_TICK, salt: int = SALT) -> pa.Table:
    """Tick `tick`'s page views (deterministic per salt and tick)."""
    rng = np.random.default_rng(salt * 100_003 + tick)
    top = tick_event_time(tick)
    at = top - rng.integers(0, TICK_EVENT_MS, size=count)
    shuffled = rng.random(count)
    at = np.where(shuffled < 0.10, at - rng.integers(0, 45_000, size=count), at)
    at = np.where(shuffled > 0.98, top - rng.integers(3 * 60_000, 10 * 60_000, size=count), at)
    at[0] = top
    users = np.char.add("u", rng.integers(0, KEYS, size=count).astype(str))
    return pa.Table.from_arrays(
        [
            pa.array(users.tolist(), pa.string()),
            pa.array(PAGES[rng.integers(0, len(PAGES), size=count)].tolist(), pa.string()),
            pa.array(rng.integers(0, 100_000, size=count) / 100.0, pa.float64()),
            pa.array(at, pa.int64()).cast(pa.timestamp("ms", "UTC")),
        ],
        schema=CLICKS,
    )


def backlog(salt: int = SALT) -> pa.Table:
    return pa.concat_tables([clicks(i, salt=salt) for i in range(BACKLOG_TICKS)])


def as_default_schema(table: pa.Table) -> pa.Table:
    """The same events in the source log's default schema: user -> key, amount -> value, at -> ts (ms)."""
    return pa.table(
        {
            "key": table["user"],
            "value": table["amount"],
            "ts": table["at"].cast(pa.int64()),
        }
    )


class ScheduledLoad(threading.Thread):
    """Appends tick ``BACKLOG_TICKS + i`` at ``start + i * TICK_S`` (catching up if late); records when
    each append completed (wall clock) and how many events it held."""

    def __init__(self, append: Callable[[pa.Table], None], salt: int = SALT) -> None:
        super().__init__(name="windows-load", daemon=True)
        self._append = append
        self._salt = salt
        self._stop_event = threading.Event()
        self.appended_at: dict[int, float] = {}
        self.events = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            t0 = time.monotonic()
            i = 0
            while not self._stop_event.is_set():
                delay = t0 + i * TICK_S - time.monotonic()
                if delay > 0 and self._stop_event.wait(delay):
                    break
                tick = BACKLOG_TICKS + i
                table = clicks(tick, salt=self._salt)
                self._append(table)
                self.appended_at[tick] = time.time()
                self.events += table.num_rows
                i += 1
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop_event.set()
        self.join(60)
        if self.error is not None:
            raise RuntimeError(f"the load failed: {self.error}") from self.error

    @property
    def last_tick(self) -> int:
        return max(self.appended_at, default=BACKLOG_TICKS - 1)


@dataclass
class Latencies:
    """Per closed window: its emission's wall-clock time minus its closing tick's append (seconds)."""

    samples: list[float] = field(default_factory=list)
    #: Windows whose closing tick was not a scheduled one (the backlog) or was never appended.
    skipped: int = 0

    def p(self, q: float) -> float:
        return percentile(self.samples, q) if self.samples else math.nan

    @property
    def p50(self) -> float:
        return median(self.samples) if self.samples else math.nan


def window_latencies(
    emitted: dict[int, float], appended_at: dict[int, float], during: tuple[float, float] | None = None
) -> Latencies:
    """`emitted`: window end (ms) -> when its last row was emitted (wall clock). Only windows whose
    closing tick was appended inside `during` (wall clock) count, when given."""
    out = Latencies()
    for end, at in sorted(emitted.items()):
        appended = appended_at.get(closing_tick(end))
        if appended is None or (during is not None and not during[0] <= appended <= during[1]):
            out.skipped += 1
            continue
        out.samples.append(at - appended)
    return out


def window_rows(rows: Sequence[tuple[str, int, int]], after_ms: int) -> set[tuple[str, int, int]]:
    """(key, window start ms, views) rows of windows starting at or after `after_ms`."""
    return {r for r in rows if r[1] >= after_ms}
