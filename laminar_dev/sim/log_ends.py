"""The log-ends scenario: a partition's worker waits on the recorded log ends while the node cannot read them.

A seed decides when producers append to the log, when the node cannot read the recorded log ends
(store faults, for spans up to minutes) and when the partition moves to a new worker. The node reads
the ends every `log_ends_poll_s` and hands them over as the node does (with the time it read them);
the worker's loop is that of `PartitionWorker`: the real `LogWatch` decides when it waits and when
it reads, on a simulated clock, and an empty read backs off from `idle_poll_s` to `idle_poll_max_s`.

Promises checked: once the ends have been unreadable longer than their trust (`LOG_ENDS_TRUST_S`),
a caught-up worker reads its log within about `idle_poll_max_s` of an append; and a new worker is
never handed the node's last-read ends as seen later than the node read them.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from laminar_orchestration.clock import use_clock
from laminar_orchestration.dataplane.log_watch import LOG_ENDS_TRUST_S, LogWatch

from .clock import EPOCH_START
from .reverts import Knobs, reverted

#: The node's settings the scenario runs with (the defaults of `NodeConfig`).
IDLE_POLL_S = 0.05
IDLE_POLL_MAX_S = 2.0
LOG_ENDS_POLL_S = 2.0
FALLBACK_POLL_S = 300.0
BATCH_MAX_EVENTS = 100
#: How long a simulated run lasts, and the slack on "within `idle_poll_max_s`".
HORIZON_S = 240.0
SLACK_S = 0.25
#: The simulated clock starts here: a `LogWatch` reads 0.0 as "never read".
START_S = 1_000.0


class Broken(enum.Enum):
    """Which promise a run broke."""

    APPEND_NOT_SEEN = "append_not_seen"
    STALE_ENDS_AS_FRESH = "stale_ends_as_fresh"


@dataclass(frozen=True)
class Violation:
    """A broken promise: at `at` (simulated s from the start), with what happened."""

    broken: Broken
    at: float
    detail: str


@dataclass(frozen=True)
class LogEndsResult:
    """One run's shape and the promises it broke."""

    seed: int
    outages: tuple[tuple[float, float], ...]
    appends: int
    moves: int
    #: Appends to a caught-up log while the ends had been unreadable past their trust: the bound applied.
    checked: int
    violations: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass
class _Clock:
    """The simulated clock the watch reads (`laminar_orchestration.clock`, installed for the run)."""

    t: float = START_S
    entropy: random.Random = field(default_factory=lambda: random.Random(0))

    def monotonic(self) -> float:
        return self.t

    def now(self) -> datetime:
        return EPOCH_START + timedelta(seconds=self.t)

    def random_bytes(self, n: int) -> bytes:
        return self.entropy.randbytes(n)


@dataclass
class _Worker:
    """`PartitionWorker._process`'s waiting and reading, with batches that take no time."""

    clock: _Clock
    committed: int
    watch: LogWatch = field(default_factory=lambda: LogWatch(fallback_s=FALLBACK_POLL_S))
    idle_wait: float = IDLE_POLL_S

    def step(self, log_end: int, reads: list[float]) -> float:
        """Run the loop once at the clock's time; returns when it runs next (unless an end wakes it)."""
        t = self.clock.t
        due = self.watch.idle_until(self.committed)
        if due is not None:
            return due
        limit = self.watch.read_limit(self.committed)
        upto = log_end if limit is None else min(limit, log_end)
        batch_end = min(upto, self.committed + BATCH_MAX_EVENTS) if upto > self.committed else None
        reads.append(t)
        self.watch.after_read(limit, batch_end)
        if batch_end is None:
            wake = t + self.idle_wait if self.watch.idle_until(self.committed) is None else t
            self.idle_wait = min(self.idle_wait * 2, max(IDLE_POLL_S, IDLE_POLL_MAX_S))
            return wake
        self.idle_wait = IDLE_POLL_S
        self.committed = batch_end
        return t


def _spans(rng: random.Random) -> tuple[tuple[float, float], ...]:
    """1-3 outages of the recorded ends, 10 s to 2.5 min each."""
    spans = []
    for _ in range(rng.randint(1, 3)):
        start = rng.uniform(0.0, HORIZON_S - 20.0)
        spans.append((start, start + rng.uniform(10.0, 150.0)))
    return tuple(sorted(spans))


def run_log_ends_scenario(seed: int, knobs: Knobs | None = None) -> LogEndsResult:
    """Run the partition `seed` shapes (with the fixes `knobs` revert put back)."""
    rng = random.Random(seed)
    outages = _spans(rng)
    appends = sorted((rng.uniform(0.0, HORIZON_S), rng.randint(1, 50)) for _ in range(rng.randint(6, 20)))
    moves = sorted(rng.uniform(0.0, HORIZON_S) for _ in range(rng.randint(0, 2)))
    clock = _Clock()
    violations: list[Violation] = []
    reads: list[float] = []
    # (when, when the node last read the ends) of each append to a log its worker had caught up with.
    watched: list[tuple[float, float | None]] = []
    log_end = 0
    ends_read: tuple[int, float] | None = None  # the node's last-read ends and when it read them
    next_read = START_S
    worker = _Worker(clock, committed=0)
    wake = START_S
    pending = [(START_S + a, n) for a, n in appends]
    pending_moves = [START_S + m for m in moves]
    with reverted(knobs or Knobs()), use_clock(clock):
        for _ in range(200_000):
            t = min(next_read, wake, *(a for a, _ in pending[:1]), *pending_moves[:1])
            if t > START_S + HORIZON_S:
                break
            clock.t = t
            if pending and pending[0][0] == t:
                _, n = pending.pop(0)
                if worker.committed == log_end:
                    watched.append((t, None if ends_read is None else ends_read[1]))
                log_end += n
            if next_read == t:
                if not any(s <= t - START_S < e for s, e in outages):
                    ends_read = (log_end, t)
                    if worker.watch.advanced(log_end, from_log_ends=True, read_at=t):
                        wake = t
                next_read = t + LOG_ENDS_POLL_S
            if pending_moves and pending_moves[0] == t:
                pending_moves.pop(0)
                worker = _Worker(clock, committed=worker.committed)
                wake = t
                if ends_read is not None:
                    worker.watch.advanced(ends_read[0], from_log_ends=True, read_at=ends_read[1])
                    seen = worker.watch.ends_seen_at
                    if seen is not None and seen > ends_read[1]:
                        violations.append(
                            Violation(
                                Broken.STALE_ENDS_AS_FRESH,
                                t - START_S,
                                f"ends read {t - ends_read[1]:.1f} s ago handed over as seen {t - seen:.1f} s ago",
                            )
                        )
            if wake == t:
                wake = worker.step(log_end, reads)
    checked = 0
    for at, read_at in watched:
        if read_at is not None and at - read_at <= LOG_ENDS_TRUST_S:
            continue  # the ends are still trusted: the worker may wait for them to move
        if at + IDLE_POLL_MAX_S + SLACK_S > START_S + HORIZON_S:
            continue  # too late in the run to tell
        checked += 1
        looked = next((r for r in reads if r >= at), None)
        if looked is None or looked - at > IDLE_POLL_MAX_S + SLACK_S:
            after = "never" if looked is None else f"{looked - at:.1f} s later"
            unread = "never read" if read_at is None else f"unread for {at - read_at:.1f} s"
            violations.append(
                Violation(Broken.APPEND_NOT_SEEN, at - START_S, f"append with the ends {unread}: log read {after}")
            )
    return LogEndsResult(seed, outages, len(appends), len(moves), checked, tuple(violations))
