"""Warm standby: a node keeps a copy of a partition it does not own by following the manifest chain.

A `StandbyFollower` polls the partition's current manifest and brings its
local `StateReplica` to it: the snapshot once (files it already holds are
reused), then only the deltas each newly published manifest names. It never
reads a delta no manifest names, so a zombie's uncommitted work is never
applied. When the node takes the partition over (a failover to it, a
migration towards it) the worker adopts the replica and applies only the
last few deltas instead of downloading the whole state.

While the partition's owner looks dead (its heartbeat is overdue but the
failover has not been launched yet), a `TakeoverSpeculation` also starts the
first batch a forced takeover would run: Spark's aggregate of the events after
the replica's offset, stamped with the epoch the fence will mint. The worker
that takes over commits it only if it begins at the offset that worker restores
and carries the epoch it is granted; otherwise it is dropped. Nothing of it is
written before that commit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from laminar_orchestration.dataplane.batches import (
    InFlightBatch,
    ReadAhead,
    cancel,
    refresh_read_ahead,
    start_aggregate,
)
from laminar_orchestration.dataplane.engine import BatchEngine
from laminar_orchestration.dataplane.restore import StateReplica, progress_of
from laminar_orchestration.errors import LaminarError
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.processing.contract import EventTimeProgress
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.membership import NodeView
from laminar_orchestration.protocol.records import NodeStatus, PartitionStatus
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import StoreError

log = logging.getLogger("laminar.standby")


#: A standby suspects the owner once its heartbeat is older than this fraction of its timeout.
SUSPECT_AFTER = 0.5
#: How often a standby reads the owner's ledger and node records (a few GETs), unless the chain
#: just advanced (then the owner is alive).
OWNER_CHECK_S = 0.5


class TakeoverSpeculation:
    """Starts, on this node's Spark, the first batch of a forced takeover that looks imminent.

    One per node, shared by its standby followers. It only reads (the ledger, the
    source) and runs Spark jobs; a batch it starts is committed, if ever, by a
    worker that checks it (`InFlightBatch.matches`).
    """

    def __init__(
        self,
        *,
        node: int,
        ledger: Ledger,
        source: SourceLog,
        engine: Callable[[], BatchEngine],
        generation: Callable[[], int],
        cluster_epoch: Callable[[], int],
        batch_max_events: int,
        workdir: Path,
    ) -> None:
        self._node = node
        self._ledger = ledger
        self._source = source
        self._engine = engine
        self._generation = generation
        self._cluster_epoch = cluster_epoch
        self._batch_max_events = batch_max_events
        self._workdir = workdir
        self._seq = 0
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"node-{node}-speculation")

    def takeover_epoch(self, partition: PartitionId) -> int | None:
        """The epoch a forced takeover of `partition` would be granted, if its owner looks dead; else None."""
        own = self._ledger.ownership(partition)
        if own is None or own.status != PartitionStatus.ACTIVE or own.owner == self._node:
            return None
        record = self._ledger.members.node(NodeId(own.owner))
        if record is not None:
            view = NodeView.judge(record)
            if record.status != NodeStatus.ALIVE:
                return None  # leaving or left: it drains and releases, no fence comes
            if view.heartbeat_age_s <= record.heartbeat_timeout_s * SUSPECT_AFTER:
                return None
        return own.epoch + 1

    def start(
        self, partition: PartitionId, offset: int, epoch: int, progress: EventTimeProgress | None = None
    ) -> InFlightBatch | None:
        """Start the aggregate of the events from `offset` (None if there are none yet)."""
        read_at = time.monotonic()
        batch = self._source.read(partition, offset, self._batch_max_events)
        if batch is None:
            return None
        with self._lock:
            self._seq += 1
            seq = self._seq
        inflight = start_aggregate(
            self._engine(),
            self._executor,
            batch,
            self._workdir / f"speculative-p{int(partition)}-{offset}-{seq}",
            epoch=epoch,
            generation=self._generation(),
            group=f"laminar-n{self._node}-p{int(partition)}-speculative-{seq}",
            cluster_epoch=self._cluster_epoch(),
            read_at=read_at,
            progress=progress,
        )
        log.info(
            "node %s: partition %s: owner looks dead; first takeover batch [%s, %s) started at epoch %s",
            self._node,
            partition,
            batch.start_offset,
            batch.end_offset,
            epoch,
        )
        return inflight

    def cancel(self, inflight: InFlightBatch) -> None:
        cancel(self._engine(), inflight)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class StandbyFollower(threading.Thread):
    """Keeps `replica` equal to the newest committed manifest of its partition, until `stop`.

    With a `speculation`, it also keeps a forced takeover's first batch started
    while the owner looks dead (`speculative`, handed over with the replica).
    """

    def __init__(
        self,
        replica: StateReplica,
        reader: ManifestReader,
        *,
        poll_s: float,
        node: int,
        speculation: TakeoverSpeculation | None = None,
    ) -> None:
        super().__init__(name=f"standby-{replica.partition}", daemon=True)
        self.replica = replica
        self._reader = reader
        self._poll_s = poll_s
        self._node = node
        self._speculation = speculation
        self._next_owner_check = 0.0
        self._advanced_at = 0.0
        self._stop_requested = threading.Event()
        #: The newest committed offset seen in the chain, and the one the replica reflects.
        self.committed_offset = 0
        #: The event-time progress committed with `committed_offset`.
        self.committed_progress = EventTimeProgress()
        self.error: str | None = None
        #: A forced takeover's first batch, started while the owner looks dead, and its keys'
        #: values read from the copy once its aggregate is done (the takeover only merges).
        self.speculative: InFlightBatch | None = None
        self.read_ahead: ReadAhead | None = None

    @property
    def partition(self) -> int:
        return self.replica.partition

    @property
    def lag(self) -> int:
        """Committed events the replica does not reflect yet (what a takeover would still apply)."""
        return max(0, self.committed_offset - self.replica.source_offset)

    def run(self) -> None:
        while not self._stop_requested.is_set():
            self.follow_once()
            self._stop_requested.wait(self._poll_s)

    def follow_once(self) -> None:
        """One step: read the chain's newest manifest and catch up to it."""
        try:
            version = self._reader.current(self.replica.partition)  # type: ignore[arg-type]
            if version is None:
                return
            if version.manifest.source_offset != self.committed_offset:
                self._advanced_at = time.monotonic()
            self.committed_offset = version.manifest.source_offset
            self.committed_progress = progress_of(version.manifest)
            if self.replica.store is None or self.replica.source_offset != self.committed_offset:
                self.replica.catch_up(version.manifest)
            self._speculate()
            self._read_ahead()
            self.error = None
        except (LaminarError, StoreError) as exc:
            # A standby is an optimisation: it reports the problem and tries again next poll.
            if self.error != str(exc):
                log.warning("node %s: standby of partition %s: %s", self._node, self.partition, exc)
            self.error = str(exc)

    def _speculate(self) -> None:
        """Keep a takeover's first batch started while the owner looks dead, and only then."""
        speculation, current = self._speculation, self.speculative
        if speculation is None:
            return
        offset = self.replica.source_offset
        if current is not None and current.batch.start_offset != offset:
            # The owner committed after all: the batch no longer starts where a takeover would.
            speculation.cancel(current)
            self.speculative = current = None
        clock = time.monotonic()
        if clock < self._next_owner_check or clock - self._advanced_at < OWNER_CHECK_S:
            return
        self._next_owner_check = clock + OWNER_CHECK_S
        epoch = speculation.takeover_epoch(PartitionId(self.partition))
        if epoch is None:
            if current is not None:
                speculation.cancel(current)
                self.speculative = None
            return
        if current is not None and current.matches(offset, epoch):
            return
        if current is not None:
            speculation.cancel(current)
        self.speculative = speculation.start(PartitionId(self.partition), offset, epoch, self.committed_progress)

    def _read_ahead(self) -> None:
        # On this thread, the only one that writes the copy: nothing moves it during the read.
        self.read_ahead = refresh_read_ahead(
            self.speculative, self.read_ahead, self.replica, self.replica.source_offset
        )

    def stop(self) -> StateReplica:
        """Stop following (after the step in progress) and hand the replica over."""
        self._stop_requested.set()
        if self.is_alive():
            self.join()
        return self.replica

    def drop_speculative(self) -> None:
        """Cancel the takeover batch nobody will commit (the follower is not taken over)."""
        if self.speculative is not None and self._speculation is not None:
            self._speculation.cancel(self.speculative)
        self.speculative, self.read_ahead = None, None
