"""What a worker knows of its partition's log beyond its committed offset, and when it reads it.

The node reads the log ends producers record (one object for every partition, `SourceLog.log_ends`)
every `log_ends_poll_s` and hands each worker its partition's; a producer's doorbell may announce an
end sooner. Both are hints recorded after the segments they cover: a worker that has reached the
end they show waits for them to move instead of polling its log, and still polls it every
`source_fallback_poll_s` (a producer may die between its segments and recording their end).
The ends are trusted for `LOG_ENDS_TRUST_S` after the node last read them: a worker waiting on them
wakes when that runs out, and while the node cannot read them its worker polls its log with the
idle backoff (up to `idle_poll_max_s`), as without recorded ends.

A log that had events at the last read is busy: its producer has likely appended while the batch
ran. Unless a doorbell announces its appends, the worker looks again at once, then after 50 ms,
100 ms ... up to 1 s while it finds nothing (six reads after a burst), rather than waiting up to
a poll of the recorded ends: a loaded partition's batches follow each other, and a move drains
right after its last one. A worker that starts on a partition whose last batch was committed
moments ago (a move's new owner; a seal is no batch) probes its log the same way: its first read
may come before the producer's next append.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from laminar_orchestration import clock
from laminar_orchestration.protocol.records import now

#: The recorded log ends are trusted while the node read them within this long; after that (the
#: node cannot read them) the worker polls its log again.
LOG_ENDS_TRUST_S = 30.0
#: A doorbell heard within this long announces the producer's appends: a busy log is not re-read
#: on the guess that it grew.
DOORBELL_TRUST_S = 10.0
#: The re-reads of a busy log: the first wait after an empty one, doubling up to the last.
BUSY_PROBE_FIRST_S = 0.05
BUSY_PROBE_LAST_S = 1.0
#: A partition whose last batch was committed this recently when a worker starts on it is busy.
BUSY_AT_START_S = 5.0


@dataclass
class LogWatch:
    """One worker's view of its log end (guarded by the worker's lock)."""

    fallback_s: float
    #: The newest end announced, by the recorded log ends or a doorbell.
    known_end: int = 0
    #: When the node last handed over the recorded log ends (monotonic); None: it never did.
    ends_seen_at: float | None = None
    #: When the worker last read its log, and whether that read reached the end.
    read_at: float = 0.0
    at_end: bool = False
    #: The wait before re-reading a busy log (0: at once; past `BUSY_PROBE_LAST_S`: not busy).
    probe_s: float = float("inf")
    #: When a producer's doorbell last announced an end (monotonic); None: never.
    doorbell_at: float | None = None

    def advanced(self, end_offset: int, *, from_log_ends: bool, read_at: float | None = None) -> bool:
        """Record an announced end; True if it moved (the worker should look). Recorded ends count as
        seen when the node read them (`read_at`, monotonic; None: now), not when they were handed over."""
        if from_log_ends:
            seen = clock.current().monotonic() if read_at is None else read_at
            self.ends_seen_at = seen if self.ends_seen_at is None else max(self.ends_seen_at, seen)
        else:
            self.doorbell_at = clock.current().monotonic()
        if end_offset > self.known_end:
            self.known_end = end_offset
            return True
        return False

    def started_at(self, last_commit_at: datetime | None) -> None:
        """The worker starts from a batch committed at `last_commit_at` (None: none, or only a seal):
        if that was moments ago the log is busy, and an empty first read is followed by probes, not a poll."""
        if last_commit_at is not None and (now() - last_commit_at).total_seconds() <= BUSY_AT_START_S:
            self.probe_s = 0.0

    def read_limit(self, committed: int) -> int | None:
        """Where the next read may stop without probing past it: the announced end, if ahead. A
        worker's first read is not limited: what a producer appended without recording its end
        (it died in between) is found when the partition starts, not at the fallback poll."""
        if self.read_at == 0.0:
            return None
        return self.known_end if self.known_end > committed else None

    def shows_an_empty_log(self) -> bool:
        """Whether the recorded ends, read lately, show that nothing was ever appended to the log: a
        read ahead would find nothing. (A log with events is read ahead whatever the ends show: they
        may be up to a poll behind, and the first batch of a handoff is on its critical path.)"""
        seen = self.ends_seen_at
        return seen is not None and clock.current().monotonic() - seen <= LOG_ENDS_TRUST_S and self.known_end == 0

    def after_read(self, limit: int | None, batch_end: int | None) -> None:
        """A read from the committed offset stopped at `batch_end` (None: nothing there)."""
        self.read_at = clock.current().monotonic()
        self.at_end = batch_end is None or (limit is not None and batch_end >= limit)
        if batch_end is not None:
            self.probe_s = 0.0
        else:
            self.probe_s = BUSY_PROBE_FIRST_S if self.probe_s == 0.0 else self.probe_s * 2

    def idle_until(self, committed: int) -> float | None:
        """While the ends are watched and show nothing past `committed`, which the last read
        reached: when the fallback poll (or the end of the ends' trust) is due. None: read the log now."""
        seen = self.ends_seen_at
        if (
            not self.at_end
            or seen is None
            or clock.current().monotonic() - seen > LOG_ENDS_TRUST_S
            or self.known_end > committed
        ):
            return None
        if self.probe_s <= BUSY_PROBE_LAST_S and not self._doorbell_rings():
            due = self.read_at + self.probe_s  # busy: the log has probably grown since the last read
        else:
            due = self.read_at + self.fallback_s
        # Wake when the ends stop being trusted: if the node cannot read them any more, poll the log.
        due = min(due, seen + LOG_ENDS_TRUST_S)
        return due if due > clock.current().monotonic() else None

    def _doorbell_rings(self) -> bool:
        heard = self.doorbell_at
        return heard is not None and clock.current().monotonic() - heard <= DOORBELL_TRUST_S
