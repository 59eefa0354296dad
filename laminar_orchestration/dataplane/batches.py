"""A batch in flight: its Spark aggregate running on a thread of its own.

The aggregate has no side effect (nothing is written before its commit), so
whoever started it can drop it at any time, and a batch started ahead of time
(the first batch of a handoff, or of a failover a standby saw coming) is
committed only by a worker that checks it began at that worker's committed
offset and carries its epoch.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from laminar_orchestration.dataplane.engine import BatchEngine, spark_takes_table
from laminar_orchestration.errors import LaminarError
from laminar_orchestration.processing.contract import EventTimeProgress, ProcessorFailed, processor_error
from laminar_orchestration.protocol.segments import SourceBatch

if TYPE_CHECKING:
    from laminar_orchestration.dataplane.restore import StateReplica

#: How long the files of a failed or cancelled batch stay, so its tasks wind down before they go.
ABANDONED_FILES_GRACE_S = 5.0


@dataclass(frozen=True)
class InFlightBatch:
    """A batch whose aggregate is running: its events, the job, the epoch its records are stamped
    with, its Spark job group and the cluster epoch it began under."""

    batch: SourceBatch
    #: The batch's aggregate and the time.monotonic() its Spark job finished.
    future: Future[tuple[pa.Table, float]]
    epoch: int
    group: str
    cluster_epoch: int
    #: time.monotonic() when the batch was read, and when its files were staged for Spark.
    read_at: float
    staged_at: float
    #: The event-time progress the aggregate was given: the committed one at the batch's start.
    progress: EventTimeProgress = field(default_factory=EventTimeProgress)

    def matches(self, offset: int, epoch: int) -> bool:
        """Whether a worker at committed `offset` holding `epoch` may commit this batch."""
        return self.batch.start_offset == offset and self.epoch == epoch


@dataclass(frozen=True)
class ReadAhead:
    """The previous values of a started batch's keys, read from the local copy before the batch is
    merged: while Spark aggregates it, while a standby waits for a failover, or a target for its
    grant. The commit then only merges.

    Read for the batch's event keys, so it needs nothing of the aggregate. Valid only for the batch
    in Spark job group `group`, and only while the copy holds the state at `offset`: a copy only
    ever moves forward, so the same offset means the same values.
    """

    group: str
    offset: int
    #: The distinct keys read, and their values (null for keys the state does not hold), row-aligned.
    keys: pa.Array
    values: pa.Table

    def serves(self, inflight: InFlightBatch, offset: int) -> bool:
        """Whether these values may stand in for the read of `inflight` at committed `offset`."""
        return self.group == inflight.group and self.offset == offset == inflight.batch.start_offset

    def previous(self, keys: pa.Array | pa.ChunkedArray) -> pa.Table | None:
        """The values of `keys` (an aggregate's ``key`` column), row-aligned; None when a key was not
        read (a processor whose aggregate makes keys of its own): the caller reads them all."""
        positions = pc.index_in(keys, value_set=self.keys)
        if positions.null_count:
            return None
        return self.values.take(positions)


def read_ahead(inflight: InFlightBatch | None, replica: StateReplica) -> ReadAhead | None:
    """Read the values of `inflight`'s event keys from the local copy, if the copy holds the state the
    batch starts from; None otherwise (no batch, or the copy is elsewhere, also if a write moved it
    while the read waited for the store). Safe on any thread: the store checks its offset and reads in one step."""
    if inflight is None:
        return None
    store = replica.store
    start = inflight.batch.start_offset
    if store is None or store.source_offset != start:
        return None
    keys = inflight.batch.keys()
    values = store.get_many_at(keys.to_pylist(), start)
    return None if values is None else ReadAhead(inflight.group, start, keys, values)


def refresh_read_ahead(
    inflight: InFlightBatch | None, ahead: ReadAhead | None, replica: StateReplica, offset: int
) -> ReadAhead | None:
    """`ahead` while it still serves `inflight` at committed `offset`; else a new read (`read_ahead`)."""
    if inflight is not None and ahead is not None and ahead.serves(inflight, offset):
        return ahead
    return read_ahead(inflight, replica)


def start_aggregate(
    engine: BatchEngine,
    executor: Executor,
    batch: SourceBatch,
    directory: Path,
    *,
    epoch: int,
    generation: int,
    group: str,
    cluster_epoch: int,
    read_at: float,
    on_done: Callable[[], None] | None = None,
    progress: EventTimeProgress | None = None,
) -> InFlightBatch:
    """Stage `batch` as the engine's input and start its aggregate on `executor`.

    The batch goes as one table or as Parquet files in `directory`, whichever costs Spark
    less (`spark_takes_table`). Jobs run in Spark job group `group`, so `cancel` can abandon
    them. The files go once the aggregate ends, however it ends; `on_done` is called then.
    """
    as_table = spark_takes_table(batch.events, len(batch.payloads))
    events = batch.to_table() if as_table else batch.write_parquet(directory)
    staged_at = time.monotonic()

    def aggregate() -> tuple[pa.Table, float]:
        table = engine.aggregate(events, epoch=epoch, generation=generation, job_group=group, progress=progress)
        return table, time.monotonic()

    future = executor.submit(aggregate)

    def finished(done: Future[tuple[pa.Table, float]]) -> None:
        if done.cancelled() or done.exception() is not None:
            remove_after_grace(directory)
        else:
            shutil.rmtree(directory, ignore_errors=True)
        if on_done is not None:
            on_done()

    future.add_done_callback(finished)
    return InFlightBatch(
        batch, future, epoch, group, cluster_epoch, read_at, staged_at, progress or EventTimeProgress()
    )


@contextlib.contextmanager
def poison_check(batch: SourceBatch, processor: str = "") -> Iterator[None]:
    """Raise `UndecodableSegment` instead of a failure of `batch` that an undecodable event caused.

    A key that is not valid UTF-8 (a segment written before `SourceLog.append` checked keys, or by a
    writer that bypassed it) fails the batch wherever the keys are decoded first: in the engine, or
    in the node turning the aggregate's keys into state-store keys. That failure repeats on every
    retry, so it is named for what it is, the segment and the event's offset, and the node does not
    restart the partition. Laminar's own errors (a fence, a store outage, a conflict) already say
    what they are and pass unchanged, as does any failure of a batch whose events all decode. Costs
    nothing while the batch succeeds: the check decodes the batch only after a failure. A failure
    of the `processor`'s own making on Spark (`processor_error`) is `ProcessorFailed`, as permanent.
    """
    try:
        yield
    except LaminarError:
        raise
    except Exception as exc:
        poison = batch.undecodable()
        if poison is not None:
            raise poison from exc
        if processor and processor_error(exc):
            raise ProcessorFailed(processor, batch.start_offset, f"{type(exc).__name__}: {exc}") from exc
        raise


def remove_after_grace(directory: Path) -> None:
    """Remove `directory` (batch files) once a cancelled job's tasks have wound down.

    They may still be reading the files for a moment: removing them at once makes Spark
    log a missing-file error for a batch nobody wants any more.
    """
    remover = threading.Timer(ABANDONED_FILES_GRACE_S, shutil.rmtree, (directory,), {"ignore_errors": True})
    remover.daemon = True
    remover.start()


def cancel(engine: BatchEngine, inflight: InFlightBatch) -> None:
    """Drop a batch that will not be committed; its Spark job stops instead of using the CPU."""
    if not inflight.future.done():
        try:
            engine.cancel(inflight.group)
        except Exception:  # Spark stopping: the job goes with it
            return
