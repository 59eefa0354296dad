"""A node's reports on the moves it takes part in: one small record per node, polled by the drivers.

A move waits on a node at every phase. The node's heartbeat record carries every partition's
progress (a hundred entries on a busy node) and is written once per heartbeat interval; a move's
phases are reported here instead, at once, and only for the partitions in a move, so a driver
polls a record of a few entries however many partitions the node runs. Only the node writes its
record (compare-and-swap, like its node record). A report is bookkeeping, not authority: every
grant is still decided by the ledger (a release record, the fence), never by a report.

Drivers in one process share one `MoveReports` per ledger (`MoveReports.of`): it reads a node's
record at most once per look, however many moves wait on that node.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from laminar_orchestration import clock
from laminar_orchestration.identity import NodeId
from laminar_orchestration.protocol.capabilities import LedgerWriter, ledger_key
from laminar_orchestration.protocol.keys import move_report_key
from laminar_orchestration.protocol.ledger import Ledger, NodeIdentityConflict
from laminar_orchestration.protocol.records import PartitionProgress, Record, new_write_id, now, parse_record
from laminar_orchestration.store import PreconditionFailed

__all__ = ["MoveReportRecord", "MoveReporter", "MoveReports"]


class MoveReportRecord(Record):
    """What one node reports about the partitions it is moving (as old owner or target)."""

    kind: Literal["move-report"] = "move-report"
    node: int = Field(ge=1)
    #: The node process's generation (`NodeRecord.generation`): an older process never overwrites a newer one's.
    generation: int = Field(ge=1)
    reported_at: datetime
    #: Partition -> its progress in the move in flight (`PartitionProgress.migration_id` names the move).
    partitions: dict[int, PartitionProgress] = Field(default_factory=dict)
    write_id: str = Field(default_factory=new_write_id)


class MoveReporter:
    """A node process's writer of its move report; thread-safe, and a write only when the report changed."""

    def __init__(self, writer: LedgerWriter, node: NodeId, generation: int) -> None:
        self._writer = writer
        self._node = node
        self._generation = generation
        self._key = move_report_key(node)
        self._etag: str | None = None
        self._last: dict[int, PartitionProgress] | None = None
        self._lock = threading.Lock()

    def report(self, partitions: Mapping[int, PartitionProgress]) -> bool:
        """Write `partitions` as this node's moves unless they are what it wrote last; True if written.

        NodeIdentityConflict when a newer process of the same node id owns the record.
        """
        with self._lock:
            wanted = dict(partitions)
            if wanted == self._last:
                return False
            record = MoveReportRecord(
                node=self._node, generation=self._generation, reported_at=now(), partitions=wanted
            )
            data = record.model_dump_json().encode()
            key = ledger_key(self._key)
            while True:
                if self._etag is None:
                    self._etag = self._current_etag()
                try:
                    if self._etag is None:
                        self._etag = self._writer.create(key, data)
                    else:
                        self._etag = self._writer.swap(key, data, self._etag)
                    break
                except PreconditionFailed:
                    self._etag = None  # another process of this node id wrote since: look again
            self._last = wanted
            return True

    def _current_etag(self) -> str | None:
        """The record's ETag to swap over, None when there is none; refused if a newer generation wrote it."""
        obj = self._writer.get(self._key)
        if obj is None:
            return None
        theirs = parse_record(self._key, obj.data, MoveReportRecord)
        if theirs.generation > self._generation:
            raise NodeIdentityConflict(self._node, self._generation)
        return obj.etag


@dataclass(frozen=True)
class _Look:
    record: MoveReportRecord | None
    #: `clock.current().monotonic()` when the read that returned `record` began.
    started: float


#: While the drivers in a process wait on more than two nodes at once (a failover's burst), their
#: reads of the move reports are spaced to about this many a second in all, not one per node every
#: poll interval: ten targets polled every 10 ms would be a thousand GETs a second.
MOVE_REPORT_READS_PER_S = 25.0
#: A node counts as waited on while one of its reports was read within this many seconds.
_WAITED_ON_S = 1.0


class MoveReports:
    """The move reports the drivers in this process wait on; thread-safe.

    A read younger than the caller's `max_age_s` is shared: many moves waiting on one node cost
    one GET per look, not one per move. While more than two nodes are waited on, a read is shared
    for at least their number / `MOVE_REPORT_READS_PER_S` seconds.
    """

    _boards: ClassVar[weakref.WeakKeyDictionary[Ledger, MoveReports]] = weakref.WeakKeyDictionary()
    _boards_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._reader = LedgerWriter(ledger.store)
        self._looks: dict[int, _Look] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()

    def _waited_on(self) -> int:
        at = clock.current().monotonic()
        with self._lock:
            return sum(1 for look in self._looks.values() if at - look.started <= _WAITED_ON_S)

    def busy(self) -> bool:
        """Whether the drivers in this process wait on more than two nodes (more than one move)."""
        return self._waited_on() > 2

    def _spacing(self) -> float:
        """The least age of a shared read: 0 while at most two nodes are waited on (one move)."""
        waited_on = self._waited_on()
        return 0.0 if waited_on <= 2 else waited_on / MOVE_REPORT_READS_PER_S

    @classmethod
    def of(cls, ledger: Ledger) -> MoveReports:
        """The one board of `ledger` (created on first use), shared by every driver that uses it."""
        with cls._boards_lock:
            board = cls._boards.get(ledger)
            if board is None:
                board = cls._boards[ledger] = cls(ledger)
            return board

    def progress(self, node: NodeId, partition: int, *, max_age_s: float = 0.0) -> PartitionProgress | None:
        """`node`'s report on `partition`'s move, from a read at most `max_age_s` old.

        A node that has written no move report (a node process from before move reports) is
        read through its node record, where it reports its moves with every heartbeat.
        """
        record = self.read(node, max_age_s=max_age_s)
        if record is None:
            older = self._ledger.members.node(node)
            return None if older is None else older.partitions.get(partition)
        return record.partitions.get(partition)

    def read(self, node: NodeId, *, max_age_s: float = 0.0) -> MoveReportRecord | None:
        """`node`'s move report (None before it wrote one), from a read begun at most `max_age_s` ago."""
        with self._lock:
            lock = self._locks.setdefault(int(node), threading.Lock())
        with lock:  # one read in flight per node: the others wait for it and share it
            look = self._looks.get(int(node))
            if look is not None and clock.current().monotonic() - look.started <= max(max_age_s, self._spacing()):
                return look.record
            started = clock.current().monotonic()
            key = move_report_key(node)
            obj = self._reader.get(key)
            record = None if obj is None else parse_record(key, obj.data, MoveReportRecord)
            with self._lock:
                self._looks[int(node)] = _Look(record, started)
            return record
