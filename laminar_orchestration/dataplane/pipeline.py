"""A partition worker's batches before their commit (`BatchPipeline`): started on a thread of their
own, started ahead during a handoff, their keys' values read ahead, dropped at once when abandoned.

Nothing here writes anything outside the worker's scratch directory: the worker
commits a batch (`PartitionWorker._commit`) only once it checks the batch began
at its committed offset under its epoch (`InFlightBatch.matches`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa

from laminar_orchestration.dataplane.batches import InFlightBatch, ReadAhead, cancel, read_ahead, start_aggregate
from laminar_orchestration.dataplane.host import WorkerHost
from laminar_orchestration.dataplane.restore import StateReplica
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.processing.contract import EventTimeProgress
from laminar_orchestration.protocol.segments import SourceBatch

log = logging.getLogger("laminar.node")


class BatchPipeline:
    """The batches of one partition worker: the one in flight, the one started ahead, and the values
    read ahead for them.

    `wakeup` is the condition the worker waits on: it is notified when a batch ends or is abandoned.
    """

    def __init__(
        self,
        host: WorkerHost,
        partition: PartitionId,
        replica: StateReplica,
        workdir: Path,
        wakeup: threading.Condition,
        *,
        prefetched: InFlightBatch | None = None,
        ahead: ReadAhead | None = None,
    ) -> None:
        self._host = host
        self._partition = partition
        self._replica = replica
        self._workdir = workdir
        self._wakeup = wakeup
        #: Batches started so far (every attempt: an abandoned batch is started again).
        self.started = 0
        #: The Spark job group of the batch the worker awaits; `abandon` cancels it.
        self._group: str | None = None
        self._abandoned = threading.Event()
        #: A batch started ahead (a handoff's first batch); committed only if it matches then.
        self.prefetched: InFlightBatch | None = prefetched
        if prefetched is not None:
            prefetched.future.add_done_callback(lambda _: self._wake())
        #: The prefetched batch's keys' values, read while the worker waited on the handoff.
        self._read_ahead: ReadAhead | None = ahead
        #: That read while it runs: off the worker's thread, which must answer each handoff step at once
        #: (a first read of a just-restored 100 MB store takes about a second).
        self._reading_ahead: tuple[str, int, Future[ReadAhead | None]] | None = None  # (batch group, offset, read)
        self._read_thread = ThreadPoolExecutor(1, thread_name_prefix=f"partition-{partition}-read")
        #: Runs the batch's Spark job, so the worker can drop it without waiting for it.
        self._batch_thread = ThreadPoolExecutor(1, thread_name_prefix=f"partition-{partition}-batch")

    def close(self) -> None:
        """Stop taking batches; wait only for a read of the local store (it is closed or handed on next)."""
        self._batch_thread.shutdown(wait=False)
        self.collect_read_ahead()
        self._read_thread.shutdown(wait=False)

    def abandon(self) -> None:
        """Cancel the awaited Spark batch: nothing of it was written, so dropping it is safe and makes
        a drain (or a kill-switch) take milliseconds instead of a batch's duration."""
        group = self._group
        if group is not None and not self._abandoned.is_set():
            self._abandoned.set()
            self._wake()
            try:
                self._host.engine.cancel(group)
            except Exception as exc:  # the job then runs to its end in the background, unused
                log.warning("node %s: partition %s: cancel failed: %s", self._host.id, self._partition, exc)

    def prefetch(
        self,
        epoch: int,
        offset: int,
        *,
        log_is_empty_past: bool = False,
        progress: EventTimeProgress | None = None,
    ) -> None:
        """Start the first batch's Spark work (from `offset`, stamped `epoch`) as soon as the committed
        offset is final; it commits only once the move is Active, and only if it began at the offset
        and epoch the worker then holds. `log_is_empty_past`: nothing is past `offset` to read (the
        recorded log ends show an empty log)."""
        current = self.prefetched
        if current is not None and current.matches(offset, epoch):
            return
        if current is not None:
            cancel(self._host.engine, current)
            self.prefetched = None
        if log_is_empty_past:
            return
        read_at = time.monotonic()
        batch = self._host.source.read(self._partition, offset, self._host.config.batch_max_events)
        if batch is not None:
            self.prefetched = self.start(batch, read_at=read_at, epoch=epoch, progress=progress)

    def take_prefetched(
        self, offset: int, epoch: int, progress: EventTimeProgress | None = None
    ) -> InFlightBatch | None:
        """The batch started ahead, if a worker at committed `offset` holding `epoch` may commit it
        (it is then the awaited batch); one started for a handoff that went differently is dropped."""
        inflight, self.prefetched = self.prefetched, None
        # A watermarked processor's batch judged lateness by the progress it started with: it must be this one.
        judged = progress is None or not self._host.engine.processor.watermarked or inflight is None
        if inflight is not None and (
            not inflight.matches(offset, epoch) or not (judged or inflight.progress == progress)
        ):
            cancel(self._host.engine, inflight)  # another offset or epoch: not ours to commit
            inflight = None
        if inflight is not None:
            self._group = inflight.group  # a drain abandons it like one started here
        return inflight

    def start(
        self, batch: SourceBatch, *, read_at: float, epoch: int, progress: EventTimeProgress | None = None
    ) -> InFlightBatch:
        """Stage the batch's files and start its aggregate on the batch thread.

        The thread lets the worker drop the batch without waiting for it: a Spark cancel only
        reaches a job already submitted, and planning takes most of a small batch. An abandoned
        job winds down in the background; its files go with it.
        """
        self.started += 1
        self._abandoned.clear()
        self._group = group = f"laminar-n{self._host.id}-p{self._partition}-b{self.started}"
        return start_aggregate(
            self._host.engine,
            self._batch_thread,
            batch,
            # Unique per attempt: an abandoned job of the same offsets removes only its own files.
            self._workdir / f"batch-{batch.start_offset}-{self.started}",
            epoch=epoch,
            generation=self._host.generation,
            group=group,
            # The cluster epoch this batch began under; its commit must still be inside the window.
            cluster_epoch=self._host.cluster_epoch,
            read_at=read_at,
            on_done=self._wake,
            progress=progress,
        )

    def await_batch(self, inflight: InFlightBatch, leaving: Callable[[], bool]) -> tuple[pa.Table, float] | None:
        """The batch's aggregate (and when it finished), or None as soon as the batch is abandoned
        (drain, stop, fence: `leaving` says whether the worker is asked to go)."""
        try:
            with self._wakeup:
                while not inflight.future.done() and not self._abandoned.is_set() and not leaving():
                    self._wakeup.wait(0.5)
            if not inflight.future.done() and leaving():
                self.abandon()  # asked while the batch was staged, before it had a group to abandon
            if self._abandoned.is_set():
                return None
            return inflight.future.result()
        finally:
            self._group = None

    def read_ahead_of(self, inflight: InFlightBatch | None, offset: int) -> None:
        """Start reading `inflight`'s keys' values from the copy at committed `offset` on the read thread,
        unless values that serve it are read or being read. Never blocks: the worker must answer a drain,
        a stop or a handoff step at once. A write before `collect_read_ahead` only wastes the read:
        the store reads nothing once it holds another offset (`get_many_at`)."""
        if self._reading_ahead is not None and self._reading_ahead[2].done():
            self.collect_read_ahead()
        if inflight is None:
            return
        ahead = self._read_ahead
        if ahead is not None and ahead.serves(inflight, offset):
            return
        if self._reading_ahead is not None and self._reading_ahead[:2] == (inflight.group, offset):
            return
        # One read thread: a read still running for a dropped batch ends before this one starts.
        future = self._read_thread.submit(read_ahead, inflight, self._replica)
        self._reading_ahead = (inflight.group, offset, future)

    def collect_read_ahead(self) -> None:
        """Wait for the last read `read_ahead_of` started (before anything writes the copy)."""
        reading, self._reading_ahead = self._reading_ahead, None
        if reading is None:
            return
        try:
            self._read_ahead = reading[2].result()
        except Exception:  # an optimisation only: the commit reads the values itself
            log.debug("node %s: partition %s: read-ahead failed", self._host.id, self._partition, exc_info=True)
            self._read_ahead = None

    def values_read_ahead(
        self, inflight: InFlightBatch, offset: int, keys: pa.Array | pa.ChunkedArray
    ) -> pa.Table | None:
        """The previous values of `keys` (`inflight`'s aggregate's) read ahead for it at committed `offset`,
        row-aligned; None when none serve it: the caller reads them. The values are used up either way."""
        self.collect_read_ahead()
        ahead, self._read_ahead = self._read_ahead, None
        if ahead is not None and ahead.serves(inflight, offset):
            return ahead.previous(keys)
        return None

    def _wake(self) -> None:
        with self._wakeup:
            self._wakeup.notify_all()
