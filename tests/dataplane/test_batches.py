"""A batch in flight: a batch costs O(batch), since it reads its keys from the local store once, while
Spark aggregates it, writes only them and never scans the store; an abandoned batch is dropped at once
and the same events commit once; a cancelled batch's files stay while its tasks wind down.

Nodes run in-process (`laminar_dev.chaos.ArrowNode`: the real runtime, batches aggregated without Spark).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pyarrow as pa
import pytest

from laminar_dev.chaos import ArrowBatchEngine, ArrowNode
from laminar_orchestration.dataplane import batches
from laminar_orchestration.dataplane.engine import BatchEvents
from laminar_orchestration.dataplane.restore import committed_state
from laminar_orchestration.dataplane.statestore import PartitionStateStore
from laminar_orchestration.ops.verify import audit_partition
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore
from tests.dataplane import plane


def test_batch_touches_only_its_keys_in_the_local_store(
    local_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="laminar.node")
    store = local_store
    Ledger(store).init_cluster(1)
    source = SourceLog(store, partitions=1)
    seeded = [f"s{i:05d}" for i in range(50_000)]
    source.append(0, plane.events(seeded, [1.0] * len(seeded)))
    plane.assign(store, 0, 1)
    with plane.running(ArrowNode(plane.node_config(store, 1, tmp_path / "n1"), store=store)) as node:
        plane.wait_until(lambda: plane.committed_offset(store) == 50_000, 60, "the 50k seed keys to be committed")

        def applied_locally() -> bool:
            worker = node.workers.get(plane.P0)
            return worker is not None and worker.commits == 1

        plane.wait_until(applied_locally, 30, "the seed commit to be applied to the local store")

        reads: list[int] = []
        writes: list[tuple[int, int]] = []
        scans: list[int] = []
        get_many, apply, scan = PartitionStateStore.get_many, PartitionStateStore.apply, PartitionStateStore.scan

        def spy_get_many(self: PartitionStateStore, keys: Sequence[str]) -> pa.Table:
            reads.append(len(keys))
            return get_many(self, keys)

        def spy_apply(
            self: PartitionStateStore, rows: pa.Table, source_offset: int, *, deleted: pa.Array | None = None
        ) -> None:
            writes.append((rows.num_rows, source_offset))
            apply(self, rows, source_offset, deleted=deleted)

        def spy_scan(self: PartitionStateStore, *, rows_per_batch: int = 65_536) -> Iterator[pa.Table]:
            scans.append(1)
            return scan(self, rows_per_batch=rows_per_batch)

        monkeypatch.setattr(PartitionStateStore, "get_many", spy_get_many)
        monkeypatch.setattr(PartitionStateStore, "apply", spy_apply)
        monkeypatch.setattr(PartitionStateStore, "scan", spy_scan)

        # 120 events over 7 distinct keys: 3 the state already holds, 4 new.
        batch_keys = ["s00001", "s12345", "s49999", "new-1", "new-2", "new-3", "new-4"]
        source.append(0, plane.events([batch_keys[i % 7] for i in range(120)]))
        plane.wait_until(lambda: plane.committed_offset(store) == 50_120, 30, "the small batch to be committed")
        plane.wait_until(lambda: bool(writes), 10, "the commit to be applied locally")
        time.sleep(0.1)  # anything else the batch would do to the store happens now
        monkeypatch.undo()
        timings = node.workers[plane.P0].last_batch

    assert reads == [7], f"multi-gets of the batch read {reads} keys; the batch touched 7 of 50,000"
    assert writes == [(7, 50_120)], f"local writes {writes}; expected the 7 touched keys at offset 50,120"
    assert scans == [], "a batch scanned the whole local store"
    m = plane.current_manifest(store)
    assert m.deltas[-1].rows == 7 and (m.deltas[-1].start_offset, m.deltas[-1].end_offset) == (50_000, 50_120)
    state, offset = committed_state(store, 0)
    assert offset == 50_120 and state.num_rows == 50_004
    assert plane.as_dict(state) == plane.reference_state(store)
    # Where the batch's time went is kept and logged at debug level, for operators and the benchmarks.
    assert timings is not None and timings.events == 120
    assert min(dataclasses.astuple(timings)) >= 0
    assert any("committed [50000, 50120): 120 events: stage" in r.getMessage() for r in caplog.records)


def _committed_at(store: ObjectStore, offset: int) -> bool:
    return plane.committed_offset(store) == offset


class _AggregateAwaitsRead(ArrowBatchEngine):
    """The n-th aggregate returns only once the local store has served n multi-gets (or after 10 s):
    a node that reads a batch's keys only after its aggregate never gets there. The read may come
    before the aggregate starts: the batch thread stages the batch's files first."""

    def __init__(self) -> None:
        self.reads = 0
        self.read = threading.Condition()
        self.read_before_done: list[bool] = []

    def note_read(self) -> None:
        with self.read:
            self.reads += 1
            self.read.notify_all()

    def aggregate(
        self, events: BatchEvents, *, epoch: int, generation: int, job_group: str | None = None, progress: object = None
    ) -> pa.Table:
        with self.read:
            nth = len(self.read_before_done) + 1
            self.read_before_done.append(self.read.wait_for(lambda: self.reads >= nth, 10))
        return super().aggregate(events, epoch=epoch, generation=generation, job_group=job_group)


def test_touched_keys_are_read_while_the_batch_is_aggregated(
    local_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous values of a batch's keys come from the local store while Spark aggregates the
    batch, not after: the commit only merges. One multi-get per batch, and the state stays exact."""
    store = local_store
    Ledger(store).init_cluster(1)
    source = SourceLog(store, partitions=1)
    engine = _AggregateAwaitsRead()
    get_many = PartitionStateStore.get_many

    def spy_get_many(self: PartitionStateStore, keys: Sequence[str]) -> pa.Table:
        engine.note_read()
        return get_many(self, keys)

    monkeypatch.setattr(PartitionStateStore, "get_many", spy_get_many)

    class ReadingNode(ArrowNode):
        def start_spark(self) -> None:
            self.engine = engine

    plane.assign(store, 0, 1)
    with plane.running(ReadingNode(plane.node_config(store, 1, tmp_path / "n1"), store=store)):
        for end in (40, 90, 150):
            source.append(0, plane.events([f"k{i % 9}" for i in range(end - source.end_offset(0))]))
            plane.wait_until(partial(_committed_at, store, end), 30, f"offset {end} to be committed")
    assert engine.read_before_done == [True, True, True]
    assert engine.reads == 3  # one multi-get per batch: the commit reads nothing more
    state, offset = committed_state(store, 0)
    assert offset == 150 and plane.as_dict(state) == plane.reference_state(store)


class _FirstBatchHangs(ArrowBatchEngine):
    """The first aggregate blocks until released (a Spark job a cancel did not reach); later ones run at once."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def aggregate(
        self, events: BatchEvents, *, epoch: int, generation: int, job_group: str | None = None, progress: object = None
    ) -> pa.Table:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            assert self.release.wait(30)
        return super().aggregate(events, epoch=epoch, generation=generation, job_group=job_group)


def test_an_abandoned_batch_is_dropped_at_once_and_the_same_events_commit_once(
    local_store: ObjectStore, tmp_path: Path
) -> None:
    store = local_store
    Ledger(store).init_cluster(1)
    source = SourceLog(store, partitions=1)
    source.append(0, plane.events([f"k{i % 7}" for i in range(50)]))
    plane.assign(store, 0, 1)
    engine = _FirstBatchHangs()

    class HangingNode(ArrowNode):
        def start_spark(self) -> None:
            self.engine = engine

    node = HangingNode(plane.node_config(store, 1, tmp_path / "n1"), store=store)
    with plane.running(node):
        assert engine.entered.wait(30), "the first batch never started"
        worker = node.workers[plane.P0]
        started = time.monotonic()
        worker.abandon_batch()  # what a drain or the kill-switch does
        # The worker does not wait for the hung job: it reads the same events again at once.
        plane.wait_until(lambda: worker.batches.started >= 2, 5, "the worker to start the batch again")
        assert time.monotonic() - started < 1.0
        engine.release.set()  # the abandoned job ends now, while the retry waits behind it
        plane.wait_until(lambda: plane.committed_offset(store) == 50, 30, "the retried batch to commit")
        assert worker.progress().error is None and not worker.finished
    audit = audit_partition(store, plane.P0)
    assert audit.ok and audit.duplicates == 0 and audit.losses == 0, audit.issues


class _FailsWhenReleased(ArrowBatchEngine):
    """Every aggregate blocks until released, then fails (a cancelled Spark job)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def aggregate(
        self, events: BatchEvents, *, epoch: int, generation: int, job_group: str | None = None, progress: object = None
    ) -> pa.Table:
        assert self.release.wait(30)
        raise RuntimeError(f"job group {job_group} cancelled")


def test_a_cancelled_batch_keeps_its_files_while_its_tasks_wind_down(
    local_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's cancelled tasks may still read the batch's files: removing them at once makes Spark log
    missing-file errors for a batch nobody wants. A committed batch's files go at once."""
    monkeypatch.setattr(batches, "ABANDONED_FILES_GRACE_S", 1.5)
    monkeypatch.setattr(batches, "spark_takes_table", lambda events, files: False)  # the batch goes as files
    source = SourceLog(local_store, partitions=1)
    source.append(0, plane.events([f"k{i % 7}" for i in range(50)]))
    batch = source.read(plane.P0, 0, 1_000)
    assert batch is not None
    engine = _FailsWhenReleased()
    with ThreadPoolExecutor(1) as pool:
        failed = batches.start_aggregate(
            engine, pool, batch, tmp_path / "cancelled", epoch=1, generation=0, group="g1", cluster_epoch=1, read_at=0
        )
        engine.release.set()
        with pytest.raises(RuntimeError):
            failed.future.result(10)
        time.sleep(0.2)  # the future's callbacks run just after its result is set
        assert (tmp_path / "cancelled").exists(), "removed while the cancelled job may still read it"
        plane.wait_until(lambda: not (tmp_path / "cancelled").exists(), 10, "the cancelled batch's files to go")
        done = batches.start_aggregate(
            ArrowBatchEngine(),
            pool,
            batch,
            tmp_path / "done",
            epoch=1,
            generation=0,
            group="g2",
            cluster_epoch=1,
            read_at=0,
        )
        assert done.future.result(10)[0].num_rows == 7
        plane.wait_until(lambda: not (tmp_path / "done").exists(), 1, "the committed batch's files to go at once")
