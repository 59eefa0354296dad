"""A partition worker's batches before their commit (`BatchPipeline`): each aggregated on a thread of its
own in a job group of its own, dropped at once when abandoned, started ahead during a handoff and
committed only at the offset and epoch it began at, its keys' values read ahead off the worker's thread.

The engine is the pyarrow fold (no Spark) holding each batch while a test keeps it in flight; the
source log is real, on a local store.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pyarrow as pa
import pytest

from laminar_dev.chaos import ArrowBatchEngine
from laminar_orchestration.dataplane.batches import InFlightBatch
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.dataplane.host import WorkerHost
from laminar_orchestration.dataplane.pipeline import BatchPipeline
from laminar_orchestration.dataplane.restore import StateReplica
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.segments import SourceBatch
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import LocalObjectStore


class HeldEngine(ArrowBatchEngine):
    """Aggregates like `ArrowBatchEngine`; while `hold` is set each batch stays in flight until `release`."""

    def __init__(self) -> None:
        self.hold, self.release, self.entered = threading.Event(), threading.Event(), threading.Event()
        self.calls: list[tuple[int, str | None]] = []
        self.cancelled: list[str] = []

    def before_batch(self, epoch: int, job_group: str | None) -> None:
        self.calls.append((epoch, job_group))
        self.entered.set()
        if self.hold.is_set():
            assert self.release.wait(30), "the batch was never let go"

    def cancel(self, job_group: str) -> None:
        self.cancelled.append(job_group)


@dataclass
class LocalState:
    """A partition's local store as the read-ahead sees it: its offset, and its values read in one step."""

    source_offset: int = 0
    values: dict[str, int] = field(default_factory=lambda: {"a": 1, "b": 2, "c": 3})
    #: While set, a read waits for `let_go` (a first read of a just-restored large store).
    hold: threading.Event = field(default_factory=threading.Event)
    let_go: threading.Event = field(default_factory=threading.Event)
    reading: threading.Event = field(default_factory=threading.Event)
    failure: Exception | None = None
    reads: list[list[str]] = field(default_factory=list)

    def get_many_at(self, keys: Sequence[str], source_offset: int) -> pa.Table | None:
        self.reads.append(list(keys))
        self.reading.set()
        if self.hold.is_set():
            assert self.let_go.wait(30), "the read was never let go"
        if self.failure is not None:
            raise self.failure
        if source_offset != self.source_offset:
            return None
        return pa.table({"count": pa.array([self.values.get(k) for k in keys], pa.int64())})


@dataclass
class Copy:
    store: LocalState


@dataclass
class Host:
    """What the pipeline uses of the node: its id, engine, source log, config and epochs."""

    engine: HeldEngine
    source: SourceLog
    config: NodeConfig
    id: NodeId = field(default_factory=lambda: NodeId(1))
    generation: int = 3
    cluster_epoch: int = 7


@dataclass
class Piped:
    pipeline: BatchPipeline
    engine: HeldEngine
    source: SourceLog
    wakeup: threading.Condition
    state: LocalState

    def batch(self, offset: int = 0) -> SourceBatch:
        read = self.source.read(0, offset, 3)
        assert read is not None
        return read


@pytest.fixture
def piped(tmp_path: Path) -> Iterator[Piped]:
    """A pipeline of partition 0 on node 1; its log holds segments [0, 3) and [3, 5)."""
    store = LocalObjectStore(tmp_path / "store")
    source = SourceLog(store, segment_events=3)
    source.append(0, pa.table({"key": ["a", "b", "c", "a", "b"], "value": [1.0, 2.0, 3.0, 4.0, 5.0]}))
    engine, wakeup, state = HeldEngine(), threading.Condition(), LocalState()
    host = Host(engine, source, NodeConfig(store_url=store.url, node_id=1, batch_max_events=3))
    (tmp_path / "work").mkdir()
    pipeline = BatchPipeline(
        cast(WorkerHost, host), PartitionId(0), cast(StateReplica, Copy(state)), tmp_path / "work", wakeup
    )
    yield Piped(pipeline, engine, source, wakeup, state)
    engine.release.set()  # a batch a test left in flight ends, so its thread does
    state.let_go.set()
    pipeline.close()


def _await_on_a_thread(piped: Piped, inflight: InFlightBatch) -> tuple[threading.Thread, list[object]]:
    """The worker awaiting `inflight` on a thread of its own; the list gets what `await_batch` returned."""
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(piped.pipeline.await_batch(inflight, lambda: False)))
    worker.start()
    return worker, got


def test_a_batch_is_aggregated_on_a_thread_of_its_own_and_wakes_the_worker_when_done(piped: Piped) -> None:
    piped.engine.hold.set()
    inflight = piped.pipeline.start(piped.batch(), read_at=0.0, epoch=5)
    assert piped.engine.entered.wait(10) and not inflight.future.done()  # start returned while it runs
    with piped.wakeup:
        piped.engine.release.set()
        assert piped.wakeup.wait(10), "the worker was not woken when the batch ended"
    result = piped.pipeline.await_batch(inflight, lambda: False)
    assert result is not None
    aggregate, _ = result
    assert sorted(aggregate["key"].to_pylist()) == ["a", "b", "c"]
    # Stamped with the epoch it was started for and the cluster epoch it began under.
    assert (inflight.epoch, inflight.cluster_epoch, inflight.batch.start_offset) == (5, 7, 0)
    assert piped.engine.calls == [(5, inflight.group)]


def test_each_attempt_of_a_batch_runs_in_a_job_group_of_its_own(piped: Piped) -> None:
    first = piped.pipeline.start(piped.batch(), read_at=0.0, epoch=5)
    again = piped.pipeline.start(piped.batch(), read_at=0.0, epoch=5)
    # An abandoned attempt's cancel must not reach the next attempt of the same events.
    assert first.group != again.group and piped.pipeline.started == 2
    assert "n1" in first.group and "p0" in first.group
    assert piped.pipeline.await_batch(again, lambda: False) is not None


def test_abandon_drops_the_awaited_batch_at_once_and_cancels_its_job(piped: Piped) -> None:
    piped.engine.hold.set()
    inflight = piped.pipeline.start(piped.batch(), read_at=0.0, epoch=5)
    worker, got = _await_on_a_thread(piped, inflight)
    assert piped.engine.entered.wait(10)
    piped.pipeline.abandon()
    worker.join(10)
    assert not worker.is_alive() and got == [None]
    assert not inflight.future.done()  # dropped without waiting for the aggregate
    piped.pipeline.abandon()
    assert piped.engine.cancelled == [inflight.group]


def test_a_worker_asked_to_leave_drops_the_batch_it_awaits(piped: Piped) -> None:
    piped.engine.hold.set()
    inflight = piped.pipeline.start(piped.batch(), read_at=0.0, epoch=5)
    assert piped.pipeline.await_batch(inflight, lambda: True) is None
    assert piped.engine.cancelled == [inflight.group]


def test_a_batch_started_ahead_is_committed_only_at_the_offset_and_epoch_it_began_at(piped: Piped) -> None:
    piped.engine.hold.set()
    piped.pipeline.prefetch(2, 0)
    first = piped.pipeline.prefetched
    assert first is not None and first.matches(0, 2)
    piped.pipeline.prefetch(2, 0)  # the same handoff asks again: the batch under way serves
    assert piped.pipeline.prefetched is first and piped.pipeline.started == 1

    piped.pipeline.prefetch(3, 0)  # the handoff went to another epoch: the first batch is dropped
    second = piped.pipeline.prefetched
    assert second is not None and second.matches(0, 3) and piped.engine.cancelled == [first.group]
    assert piped.pipeline.take_prefetched(0, 2) is None  # not ours to commit: dropped too
    assert piped.engine.cancelled == [first.group, second.group] and piped.pipeline.prefetched is None

    piped.pipeline.prefetch(3, 0)
    third = piped.pipeline.take_prefetched(0, 3)
    assert third is not None and third.matches(0, 3) and piped.pipeline.prefetched is None
    piped.pipeline.abandon()  # it is now the awaited batch: a drain drops it like any other
    assert piped.engine.cancelled == [first.group, second.group, third.group]


def test_nothing_is_started_ahead_where_the_log_has_nothing_to_read(
    piped: Piped, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    read = piped.source.read

    def counted(partition: int, offset: int, max_events: int) -> SourceBatch | None:
        reads.append(offset)
        return read(partition, offset, max_events)

    monkeypatch.setattr(piped.source, "read", counted)
    piped.pipeline.prefetch(2, 0, log_is_empty_past=True)  # the recorded log ends say so: not even a read
    assert reads == [] and piped.pipeline.prefetched is None
    piped.pipeline.prefetch(2, 5)  # at the log's end
    assert reads == [5] and piped.pipeline.prefetched is None and piped.pipeline.started == 0


def test_values_read_ahead_serve_their_batch_once_and_only_at_the_offset_read(piped: Piped) -> None:
    inflight = piped.pipeline.start(piped.batch(), read_at=0.0, epoch=5)
    piped.pipeline.read_ahead_of(inflight, 0)
    values = piped.pipeline.values_read_ahead(inflight, 0, pa.array(["c", "a"]))
    assert values is not None and values["count"].to_pylist() == [3, 1]  # in the aggregate's row order
    assert piped.pipeline.values_read_ahead(inflight, 0, pa.array(["a"])) is None  # used up
    piped.pipeline.read_ahead_of(inflight, 0)
    # The worker committed past the read: those values are no longer the batch's previous values.
    assert piped.pipeline.values_read_ahead(inflight, 3, pa.array(["a"])) is None


def test_the_read_ahead_never_holds_up_the_worker_and_a_failed_one_only_costs_the_read(piped: Piped) -> None:
    inflight = piped.pipeline.start(piped.batch(), read_at=0.0, epoch=5)
    piped.state.hold.set()
    piped.pipeline.read_ahead_of(inflight, 0)  # returns while the read is held
    assert piped.state.reading.wait(10)
    piped.pipeline.read_ahead_of(inflight, 0)  # the same batch at the same offset: no second read
    piped.state.let_go.set()
    values = piped.pipeline.values_read_ahead(inflight, 0, pa.array(["b"]))
    assert values is not None and values["count"].to_pylist() == [2] and len(piped.state.reads) == 1

    piped.state.failure = OSError("the local store is closing")
    piped.pipeline.read_ahead_of(inflight, 0)
    assert piped.pipeline.values_read_ahead(inflight, 0, pa.array(["b"])) is None  # the commit reads them itself
