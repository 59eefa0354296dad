"""The data plane's promises: a batch costs O(batch), restore is snapshot + deltas (no replay, no
Spark), the processor contract, corrupt checkpoints are named and refused, a crashed node's local
store is reused only when it sits on the committed lineage, a failed local write loses nothing,
and `laminar query` answers from the newest delta or the snapshot.

Nodes run in-process (`laminar_dev.chaos.ArrowNode`: the real runtime, batches aggregated without Spark),
except the processor-contract test, which runs a real `Node` on a local SparkSession.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from laminar_dev.chaos import ArrowBatchEngine, ArrowNode
from laminar_orchestration import cli
from laminar_orchestration.dataplane import batches
from laminar_orchestration.dataplane.checkpoint import CheckpointCorrupt, next_checkpoint
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.dataplane.engine import (
    ARROW_INPUT_SMALL_EVENTS,
    SPARK_JAVA_OPTIONS,
    BatchEvents,
    KeyedProcessor,
    SparkBatchEngine,
    build_spark_session,
    keyed_aggregation,
    spark_conf,
)
from laminar_orchestration.dataplane.node import Node
from laminar_orchestration.dataplane.restore import CatchUp, StateReplica, committed_state
from laminar_orchestration.dataplane.statestore import InvalidStateSchema, LocalStateWriteFailed, PartitionStateStore
from laminar_orchestration.errors import CorruptDataError, exit_code
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.ops.verify import audit_partition, audit_store, reference_batch_aggregate, reference_fold
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.fencing import FencingToken
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import ArtifactRef, DeltaRef, PartitionManifest, SnapshotRef
from laminar_orchestration.protocol.segments import ROW_GROUP_EVENTS, SourceBatch
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import DesiredState, DesiredStates
from laminar_orchestration.store import ObjectStore, open_store
from tests.commits import commit_all
from tests.spies import spy_source_reads

P0 = PartitionId(0)
#: The test writer that builds checkpoints through `commit_all` (never a running node).
WRITER = NodeId(9)
SCHEMA = keyed_aggregation.state_schema
STATE_COLUMNS = ("count", "sum", "min", "max", "last", "last_offset")
TS0 = 1_700_000_000_000


# --- helpers -------------------------------------------------------------------------------------


def events(keys: Sequence[str], values: Sequence[float] | None = None) -> pa.Table:
    """Input rows for `SourceLog.append`; integer-valued floats so sums are exact."""
    vals = values if values is not None else [float((i * 7) % 101) for i in range(len(keys))]
    return pa.table(
        {
            "key": pa.array(list(keys), pa.string()),
            "value": pa.array(list(vals), pa.float64()),
            "ts": pa.array(range(TS0, TS0 + len(keys)), pa.int64()),
        }
    )


def source_events(store: ObjectStore, partition: int = 0, below: int | None = None) -> pa.Table:
    """Every event of the partition's source log (with offsets), optionally only below `below`."""
    parts = [b.to_table() for b in SourceLog(store).iter_batches(partition, 0, 10_000_000)]
    table = pa.concat_tables(parts)
    if below is not None:
        table = table.filter(pc.less(table["offset"], below))
    return table


def as_dict(table: pa.Table, columns: Sequence[str] = STATE_COLUMNS) -> dict[str, tuple[object, ...]]:
    cols = [table[c].to_pylist() for c in columns]
    return {k: tuple(row) for k, *row in zip(table["key"].to_pylist(), *cols, strict=True)}


def reference_state(store: ObjectStore, partition: int = 0, below: int | None = None) -> dict[str, tuple[object, ...]]:
    """The reference fold (verify.reference_fold) of the partition's events."""
    return as_dict(reference_fold(source_events(store, partition, below)))


def current_manifest(store: ObjectStore, partition: int = 0) -> PartitionManifest:
    current = ManifestReader(store).current(PartitionId(partition))
    assert current is not None
    return current.manifest


def committed_offset(store: ObjectStore, partition: int = 0) -> int:
    current = ManifestReader(store).current(PartitionId(partition))
    return current.manifest.source_offset if current else 0


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


def assign(store: ObjectStore, partition: int, node: int) -> None:
    """What placement does: record `node` as the partition's desired owner and grant it the next epoch
    (the control plane grants; the node adopts). A node not yet joined will join as generation 1."""

    def change(d: DesiredState) -> DesiredState:
        return d.model_copy(update={"owner": node})

    ledger = Ledger(store)
    DesiredStates(ledger).update(PartitionId(partition), change)
    own = ledger.ownership(PartitionId(partition))
    assert own is not None
    record = ledger.node(NodeId(node))
    generation = record.generation if record is not None else 1
    ledger.acquire(
        PartitionId(partition), NodeId(node), expected_epoch=own.epoch, reason="place", generation=generation
    )


def reported_error(store: ObjectStore, node: int, partition: int = 0) -> str | None:
    """The partition's `PartitionProgress.error` in the node's last heartbeat (what the control plane sees)."""
    record = Ledger(store).node(NodeId(node))
    if record is None:
        return None
    progress = record.partitions.get(partition)
    return progress.error if progress else None


def node_config(store: ObjectStore, node: int, workdir: Path, **overrides: Any) -> NodeConfig:
    settings: dict[str, Any] = {
        "store_url": store.url,
        "node_id": node,
        "workdir": str(workdir),
        "heartbeat_interval_s": 0.1,
        "reconcile_interval_s": 0.02,
        "idle_poll_s": 0.02,
        "refresh_interval_s": 0.5,
        "restart_backoff_initial_s": 0.05,
        "restart_backoff_max_s": 0.2,
        # No snapshot unless a test asks for one: snapshots read the whole store.
        "checkpoint_every_batches": 1_000,
        "checkpoint_every_s": 3_600.0,
    }
    settings.update(overrides)
    return NodeConfig(**settings)


@contextlib.contextmanager
def running(node: Node) -> Iterator[Node]:
    """Run `node` in a thread of this process; stop and join it on exit."""
    thread = threading.Thread(target=node.run, kwargs={"install_signals": False}, name=f"node-{node.id}", daemon=True)
    thread.start()
    try:
        yield node
    finally:
        node.stop()
        thread.join(timeout=60)
        assert not thread.is_alive(), f"node {node.id} did not stop"


@dataclass
class Lineage:
    """A partition committed as snapshot + two deltas by a writer at epoch 1 (`WRITER`)."""

    token: FencingToken
    snapshot_end: int
    delta_ends: list[int]
    manifest: PartitionManifest
    #: Keys by where their newest committed values live.
    snapshot_only: str = "a5"
    older_delta_only: str = "b-only"
    newest_delta: str = "shared"
    versions: list[PartitionManifest] = field(default_factory=list)

    @property
    def boundaries(self) -> set[int]:
        return {self.snapshot_end, *self.delta_ends}


def build_lineage(store: ObjectStore, *, partitions: int = 1) -> Lineage:
    """Chunk A committed and snapshotted, then chunks B and C committed as deltas."""
    ledger = Ledger(store)
    ledger.init_cluster(partitions)
    source = SourceLog(store, partitions=partitions, segment_events=100)
    token = ledger.acquire(P0, WRITER, expected_epoch=0, reason="test writer")
    chunk_a = [f"a{i}" for i in range(40)] * 5 + ["shared"] * 3
    chunk_b = ["shared"] * 4 + ["b-only"] * 2 + ["a1"] * 2
    chunk_c = ["shared"] * 5 + ["c-only"]
    source.append(0, events(chunk_a))
    commit_all(store, token, snapshot_every=1)
    source.append(0, events(chunk_b, [float(v) for v in range(10, 18)]))
    commit_all(store, token, snapshot_every=None)
    source.append(0, events(chunk_c, [float(v) for v in range(50, 56)]))
    commit_all(store, token, snapshot_every=None)
    m = current_manifest(store)
    assert m.snapshot is not None and len(m.deltas) == 2, "setup: snapshot + two deltas"
    a_end = len(chunk_a)
    assert m.snapshot.source_offset == a_end
    assert [d.end_offset for d in m.deltas] == [a_end + len(chunk_b), a_end + len(chunk_b) + len(chunk_c)]
    versions = [v.manifest for v in ManifestReader(store).history(P0)]
    return Lineage(token, a_end, [d.end_offset for d in m.deltas], m, versions=versions)


def fence_writer(store: ObjectStore, lineage: Lineage) -> None:
    """The test writer is gone: fence it to "unassigned" (as a failover does), so a placed node may acquire it."""
    Ledger(store).fence(P0, UNASSIGNED, expected_epoch=lineage.token.epoch, reason="test writer gone")


def replica_state(replica: StateReplica) -> dict[str, tuple[object, ...]]:
    assert replica.store is not None
    return as_dict(replica.store.to_table())


def rewrite(store: ObjectStore, key: str, change: Callable[[bytes], bytes]) -> None:
    """Replace an object's bytes in place (what a bit flip or a truncating copy on the bucket does)."""
    obj = store.get(key)
    store.put_if_match(key, change(obj.data), obj.etag, obj.metadata)


def flip_byte(data: bytes) -> bytes:
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]


@dataclass
class Calls:
    """What spies saw, in order."""

    reads: list[int] = field(default_factory=list)  # SourceLog.read from_offset
    segments: list[int] = field(default_factory=list)  # SourceLog._load start offset (a segment GET)
    aggregates: int = 0
    catch_ups: list[tuple[CatchUp, int, int, int]] = field(default_factory=list)  # stats, reads, segments, aggs


def spy_data_plane(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Record source reads, segment loads, batch aggregates and restores (every node of this process)."""
    calls = Calls(reads=spy_source_reads(monkeypatch))
    load, aggregate, catch_up = SourceLog._load, ArrowBatchEngine.aggregate, StateReplica.catch_up

    def spy_load(self: SourceLog, partition: int, start: int) -> Any:
        calls.segments.append(start)
        return load(self, partition, start)

    def spy_aggregate(self: ArrowBatchEngine, events: BatchEvents, **kwargs: Any) -> pa.Table:
        calls.aggregates += 1
        return aggregate(self, events, **kwargs)

    def spy_catch_up(self: StateReplica, manifest: PartitionManifest | None) -> CatchUp:
        stats = catch_up(self, manifest)
        calls.catch_ups.append((stats, len(calls.reads), len(calls.segments), calls.aggregates))
        return stats

    monkeypatch.setattr(SourceLog, "_load", spy_load)
    monkeypatch.setattr(ArrowBatchEngine, "aggregate", spy_aggregate)
    monkeypatch.setattr(StateReplica, "catch_up", spy_catch_up)
    return calls


# --- 1. a batch costs O(batch) ------------------------------------------------------------------------


def _delta(start: int, end: int) -> DeltaRef:
    ref = ArtifactRef(key=f"checkpoints/00000/d-{start}-{end}", size=1, sha256="0" * 64)
    return DeltaRef(ref=ref, start_offset=start, end_offset=end, rows=1)


def test_a_snapshot_replaces_exactly_the_deltas_below_its_offset() -> None:
    deltas = [_delta(0, 10), _delta(10, 20), _delta(20, 30)]
    new = _delta(30, 40)
    snapshot = SnapshotRef(source_offset=20, files=[])
    assert next_checkpoint(snapshot, deltas, new) == (snapshot, [deltas[2], new])
    # No snapshot: every delta stays; no new delta (a snapshot's own manifest): nothing is added.
    assert next_checkpoint(None, deltas, new) == (None, [*deltas, new])
    assert next_checkpoint(snapshot, deltas) == (snapshot, [deltas[2]])
    # A snapshot at the newest commit covers every delta.
    assert next_checkpoint(SnapshotRef(source_offset=30, files=[]), deltas)[1] == []


def test_batch_touches_only_its_keys_in_the_local_store(
    local_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="laminar.node")
    store = local_store
    Ledger(store).init_cluster(1)
    source = SourceLog(store, partitions=1)
    seeded = [f"s{i:05d}" for i in range(50_000)]
    source.append(0, events(seeded, [1.0] * len(seeded)))
    assign(store, 0, 1)
    with running(ArrowNode(node_config(store, 1, tmp_path / "n1"), store=store)) as node:
        wait_until(lambda: committed_offset(store) == 50_000, 60, "the 50k seed keys to be committed")

        def applied_locally() -> bool:
            worker = node.workers.get(P0)
            return worker is not None and worker.commits == 1

        wait_until(applied_locally, 30, "the seed commit to be applied to the local store")

        reads: list[int] = []
        writes: list[tuple[int, int]] = []
        scans: list[int] = []
        get_many, apply, scan = PartitionStateStore.get_many, PartitionStateStore.apply, PartitionStateStore.scan

        def spy_get_many(self: PartitionStateStore, keys: Sequence[str]) -> pa.Table:
            reads.append(len(keys))
            return get_many(self, keys)

        def spy_apply(self: PartitionStateStore, rows: pa.Table, source_offset: int) -> None:
            writes.append((rows.num_rows, source_offset))
            apply(self, rows, source_offset)

        def spy_scan(self: PartitionStateStore, *, rows_per_batch: int = 65_536) -> Iterator[pa.Table]:
            scans.append(1)
            return scan(self, rows_per_batch=rows_per_batch)

        monkeypatch.setattr(PartitionStateStore, "get_many", spy_get_many)
        monkeypatch.setattr(PartitionStateStore, "apply", spy_apply)
        monkeypatch.setattr(PartitionStateStore, "scan", spy_scan)

        # 120 events over 7 distinct keys: 3 the state already holds, 4 new.
        batch_keys = ["s00001", "s12345", "s49999", "new-1", "new-2", "new-3", "new-4"]
        source.append(0, events([batch_keys[i % 7] for i in range(120)]))
        wait_until(lambda: committed_offset(store) == 50_120, 30, "the small batch to be committed")
        wait_until(lambda: bool(writes), 10, "the commit to be applied locally")
        time.sleep(0.1)  # anything else the batch would do to the store happens now
        monkeypatch.undo()
        timings = node.workers[P0].last_batch

    assert reads == [7], f"multi-gets of the batch read {reads} keys; the batch touched 7 of 50,000"
    assert writes == [(7, 50_120)], f"local writes {writes}; expected the 7 touched keys at offset 50,120"
    assert scans == [], "a batch scanned the whole local store"
    m = current_manifest(store)
    assert m.deltas[-1].rows == 7 and (m.deltas[-1].start_offset, m.deltas[-1].end_offset) == (50_000, 50_120)
    state, offset = committed_state(store, 0)
    assert offset == 50_120 and state.num_rows == 50_004
    assert as_dict(state) == reference_state(store)
    # Where the batch's time went is kept and logged at debug level, for operators and the benchmarks.
    assert timings is not None and timings.events == 120
    assert min(dataclasses.astuple(timings)) >= 0
    assert any("committed [50000, 50120): 120 events: stage" in r.getMessage() for r in caplog.records)


def _committed_at(store: ObjectStore, offset: int) -> bool:
    return committed_offset(store) == offset


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

    def aggregate(self, events: BatchEvents, *, epoch: int, generation: int, job_group: str | None = None) -> pa.Table:
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

    assign(store, 0, 1)
    with running(ReadingNode(node_config(store, 1, tmp_path / "n1"), store=store)):
        for end in (40, 90, 150):
            source.append(0, events([f"k{i % 9}" for i in range(end - source.end_offset(0))]))
            wait_until(partial(_committed_at, store, end), 30, f"offset {end} to be committed")
    assert engine.read_before_done == [True, True, True]
    assert engine.reads == 3  # one multi-get per batch: the commit reads nothing more
    state, offset = committed_state(store, 0)
    assert offset == 150 and as_dict(state) == reference_state(store)


# --- 2. restore = snapshot + deltas, no replay --------------------------------------------------------


def test_takeover_restores_snapshot_and_deltas_without_replay(
    local_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = local_store
    lineage = build_lineage(store)
    committed = lineage.delta_ends[-1]
    fence_writer(store, lineage)
    # Events after the commit: the new owner must read these, and only these.
    SourceLog(store, partitions=1, segment_events=100).append(0, events(["shared", "d-new", "a3"] * 10))
    end = SourceLog(store).end_offset(0)
    calls = spy_data_plane(monkeypatch)
    assign(store, 0, 2)
    with running(ArrowNode(node_config(store, 2, tmp_path / "n2"), store=store)):
        wait_until(lambda: committed_offset(store) == end, 30, "node 2 to commit the events after the takeover")
    monkeypatch.undo()

    assert calls.catch_ups, "the node never restored the partition"
    stats, reads_before, segments_before, aggregates_before = calls.catch_ups[0]
    assert stats.full_restore and stats.deltas_applied == 2 and stats.source_offset == committed
    assert (reads_before, segments_before, aggregates_before) == (0, 0, 0), (
        "the restore read the source or ran an aggregate: "
        f"{reads_before} reads, {segments_before} segment loads, {aggregates_before} aggregates"
    )
    below = [o for o in calls.segments if o < committed]
    assert not below, f"source segments below the committed offset {committed} were read: {below}"
    assert calls.reads and min(calls.reads) == committed
    assert calls.aggregates >= 1
    assert as_dict(committed_state(store, 0)[0]) == reference_state(store)
    audit = audit_partition(store, P0)
    assert audit.ok, audit.issues


# --- 3. the processor contract (the README's running max) ---------------------------------------------

RUNNING_MAX_SCHEMA = pa.schema([("max", pa.float64())])


def _running_max_aggregate(batch: Any) -> Any:
    from pyspark.sql import functions as F

    return batch.groupBy("key").agg(F.max("value").alias("batch_max"))


def _running_max_merge(batch: pa.Table, previous: pa.Table) -> pa.Table:
    return pa.table({"max": pc.max_element_wise(previous["max"], batch["batch_max"], skip_nulls=True)})


def _readme_processor() -> KeyedProcessor:
    """The README's "Your own processor" example, executed as written (but its last line, which runs a node)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = readme.split("### Your own processor", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec("\n".join(line for line in code.splitlines() if not line.startswith("Node(")), namespace)
    processor = namespace["running_max"]
    assert isinstance(processor, KeyedProcessor)
    return processor


#: The processor the README documents; the Spark test below runs it on a real node.
running_max = _readme_processor()


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = build_spark_session("local[1]", "laminar-test-dataplane")
    yield session
    session.stop()


@pytest.mark.spark
def test_custom_processor_runs_on_a_spark_node(spark: Any, local_store: ObjectStore, tmp_path: Path) -> None:
    store = local_store
    Ledger(store).init_cluster(1)
    source = SourceLog(store, partitions=1)
    first = events(["x", "y", "x", "z"], [3.0, -1.0, 7.0, 0.5])
    second = events(["x", "y", "w"], [5.0, 2.0, -4.0])  # x keeps 7, y rises to 2, w is new
    source.append(0, first)
    assign(store, 0, 1)
    node = Node(node_config(store, 1, tmp_path / "n1"), store=store, processor=running_max, spark=spark)
    with running(node):
        wait_until(lambda: committed_offset(store) == 4, 90, "the Spark node to commit the first batch")
        source.append(0, second)
        wait_until(lambda: committed_offset(store) == 7, 60, "the Spark node to commit the second batch")
    state, offset = committed_state(store, 0, state_schema=running_max.state_schema)
    assert offset == 7
    assert state.column_names == ["key", "max"]
    assert as_dict(state, ["max"]) == {"w": (-4.0,), "x": (7.0,), "y": (2.0,), "z": (0.5,)}
    assert len(current_manifest(store).deltas) == 2


@pytest.mark.spark
def test_spark_scans_a_large_segment_with_several_tasks(spark: Any, local_store: ObjectStore, tmp_path: Path) -> None:
    """A segment holds row groups of `ROW_GROUP_EVENTS`, so Spark's file splits (here: two, as two
    cores would make) each read a share of the events; a segment of one row group is read by one."""
    n = 3 * ROW_GROUP_EVENTS
    SourceLog(local_store, segment_events=n).append(0, events([f"k{i % 11}" for i in range(n)]))
    batch = SourceLog(local_store).read(0, 0, n)
    assert batch is not None
    (path,) = batch.write_parquet(tmp_path / "batch")
    one_group = tmp_path / "one-group.parquet"
    pq.write_table(batch.to_table(), one_group, row_group_size=n)

    from pyspark.sql import functions as F

    def rows_per_task(file: Path) -> list[int]:
        frame = spark.read.parquet(str(file)).groupBy(F.spark_partition_id().alias("task")).count()
        return sorted(row["count"] for row in frame.collect())

    spark.conf.set("spark.sql.files.maxPartitionBytes", str(path.stat().st_size // 2 + 1))
    try:
        split = rows_per_task(path)
        whole = rows_per_task(one_group)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert len(split) == 2 and sum(split) == n and min(split) >= ROW_GROUP_EVENTS, split
    assert whole == [n]


@pytest.mark.spark
def test_spark_warm_up_gives_way_to_the_first_real_batch(spark: Any, tmp_path: Path) -> None:
    """The background warm-up stops once a real batch starts, and the real batch's result is exact."""
    engine = SparkBatchEngine(spark, workdir=str(tmp_path / "spark"))
    warming = engine.keep_warming(10_000)  # far more than the test waits for
    time.sleep(1.0)
    assert warming.is_alive()
    batch = events(["a", "b", "a"], [1.0, 2.0, 4.0])
    batch = batch.add_column(0, "offset", pa.array([10, 11, 12], pa.int64()))
    path = tmp_path / "batch.parquet"
    pq.write_table(batch, path)
    table = engine.aggregate([path], epoch=3, generation=1, job_group="real")
    warming.join(timeout=30)
    assert not warming.is_alive()
    rows = {r["key"]: (r["batch_count"], r["batch_sum"], r["batch_last"]) for r in table.to_pylist()}
    assert rows == {"a": (2, 5.0, 4.0), "b": (1, 2.0, 2.0)}


@pytest.mark.spark
def test_spark_aggregates_a_batch_alike_from_its_table_and_from_its_files(
    spark: Any, local_store: ObjectStore, tmp_path: Path
) -> None:
    """A small batch reaches Spark as one table, a large one as files: both give the same exact aggregate."""
    source = SourceLog(local_store, partitions=1)
    rng = np.random.default_rng(5)
    for _ in range(4):  # one segment each: the files are several, as a live batch's are
        keys = [f"k{int(i)}" for i in rng.integers(0, 40, 300)]
        source.append(0, events(keys, [float(v) for v in rng.integers(-50, 50, 300)]))
    batch = source.read(P0, 0, 10_000)
    assert batch is not None and len(batch.payloads) == 4
    engine = SparkBatchEngine(spark, workdir=str(tmp_path / "spark"))

    def rows(table: pa.Table) -> list[dict[str, Any]]:
        return sorted(table.select(sorted(table.column_names)).to_pylist(), key=lambda r: r["key"])

    from_table = engine.aggregate(batch.to_table(), epoch=2, generation=1)
    from_files = engine.aggregate(batch.write_parquet(tmp_path / "files"), epoch=2, generation=1)
    assert rows(from_table) == rows(from_files)
    expected = reference_batch_aggregate(batch.to_table())
    assert rows(from_table.select(expected.column_names)) == rows(expected)


def test_a_batch_of_few_events_or_many_small_segments_reaches_the_engine_as_one_table(
    local_store: ObjectStore, tmp_path: Path
) -> None:
    """Spark pays per file it opens and per event it takes from a table: a small batch, or one of many
    small segments, goes as a table; one of few large segments as its files."""
    seen: list[BatchEvents] = []

    class Recording(ArrowBatchEngine):
        def aggregate(
            self, events: BatchEvents, *, epoch: int, generation: int, job_group: str | None = None
        ) -> pa.Table:
            seen.append(events)
            return super().aggregate(events, epoch=epoch, generation=generation, job_group=job_group)

    def batch_of(partition: int, segments: int, segment_events: int) -> SourceBatch:
        for _ in range(segments):
            source.append(partition, events([f"k{i % 11}" for i in range(segment_events)]))
        read = source.read(PartitionId(partition), 0, 1_000_000)
        assert read is not None and len(read.payloads) == segments
        return read

    source = SourceLog(local_store, partitions=3)
    small = batch_of(0, 5, ARROW_INPUT_SMALL_EVENTS // 5)
    many_small_segments = batch_of(1, 30, 200)
    few_large_segments = batch_of(2, 2, 3_000)
    assert small.events == ARROW_INPUT_SMALL_EVENTS < many_small_segments.events == few_large_segments.events
    with ThreadPoolExecutor(1) as pool:
        results = [
            batches.start_aggregate(
                Recording(),
                pool,
                batch,
                tmp_path / str(i),
                epoch=1,
                generation=0,
                group=str(i),
                cluster_epoch=1,
                read_at=0,
            ).future.result(10)[0]
            for i, batch in enumerate((small, many_small_segments, few_large_segments))
        ]
    assert [isinstance(s, pa.Table) for s in seen] == [True, True, False]
    assert [s.num_rows for s in seen[:2] if isinstance(s, pa.Table)] == [ARROW_INPUT_SMALL_EVENTS, 6_000]
    assert not isinstance(seen[2], pa.Table) and [p.suffix for p in seen[2]] == [".parquet"] * 2
    assert [r["batch_count"] for r in results[2].to_pylist() if r["key"] == "k0"] == [2 * len(range(0, 3_000, 11))]


def test_spark_conf_runs_the_jvm_with_the_node_options(monkeypatch: pytest.MonkeyPatch) -> None:
    conf = spark_conf("local[2]")
    assert conf["spark.driver.extraJavaOptions"] == SPARK_JAVA_OPTIONS
    assert conf["spark.executor.extraJavaOptions"] == SPARK_JAVA_OPTIONS
    monkeypatch.setenv("LAMINAR_SPARK_JAVA_OPTIONS", "")
    assert spark_conf("local[2]")["spark.driver.extraJavaOptions"] == ""


def test_state_schema_with_a_string_column_is_rejected_at_construction() -> None:
    with pytest.raises(InvalidStateSchema) as info:
        KeyedProcessor(
            name="labels",
            state_schema=pa.schema([("max", pa.float64()), ("label", pa.string())]),
            aggregate=_running_max_aggregate,
            merge=_running_max_merge,
        )
    assert info.value.column == "label"
    assert "'label'" in str(info.value) and "string" in str(info.value)


def test_merge_returning_the_wrong_row_count_is_a_clear_error() -> None:
    def bad_merge(batch: pa.Table, previous: pa.Table) -> pa.Table:
        return pa.table({"max": pa.array([1.0], pa.float64())})

    bad = KeyedProcessor("bad_max", RUNNING_MAX_SCHEMA, _running_max_aggregate, bad_merge)
    aggregate = pa.table({"key": ["a", "b", "c"], "batch_max": [1.0, 2.0, 3.0]})
    previous = pa.table({"max": pa.array([None, None, None], pa.float64())})
    with pytest.raises(ValueError, match=r"'bad_max'.*merge must return 3 rows.*got 1 rows"):
        bad.fold(aggregate, previous, epoch=1, generation=1)
    # The contract itself: the right merge produces one delta row per touched key.
    fold = running_max.fold(aggregate, previous, epoch=1, generation=1)
    assert fold.delta.to_pylist() == [{"key": "a", "max": 1.0}, {"key": "b", "max": 2.0}, {"key": "c", "max": 3.0}]


# --- 4. corrupt or missing checkpoint objects ----------------------------------------------------------

CORRUPTIONS = ["flipped-delta-byte", "truncated-snapshot-file", "missing-delta"]


def corrupt(store: ObjectStore, m: PartitionManifest, how: str) -> str:
    """Damage one object `m` names; returns its key."""
    if how == "flipped-delta-byte":
        key = m.deltas[-1].ref.key
        rewrite(store, key, flip_byte)
    elif how == "truncated-snapshot-file":
        assert m.snapshot is not None
        key = max(m.snapshot.files, key=lambda f: f.ref.size).ref.key
        rewrite(store, key, lambda data: data[: len(data) // 2])
    else:
        key = m.deltas[0].ref.key
        store.delete_if_match(key, store.get(key).etag)
    return key


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_corrupt_checkpoint_is_named_by_catch_up_and_query(
    how: str, store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(store_url)
    lineage = build_lineage(store)
    key = corrupt(store, lineage.manifest, how)

    replica = StateReplica(tmp_path / "replica", 0, SCHEMA, ReadStore(store))
    with pytest.raises(CheckpointCorrupt) as info:
        replica.catch_up(lineage.manifest)
    replica.close()
    assert info.value.key == key and key in str(info.value)
    assert isinstance(info.value, CorruptDataError)

    capsys.readouterr()
    code = cli.main(["query", "--store", store_url, "--partition", "0"])
    out, err = capsys.readouterr()
    assert code == exit_code(CorruptDataError.error_kind) == 6
    lines = err.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], err
    assert out == ""


@pytest.mark.processes
def test_query_subprocess_exits_6_on_a_corrupt_delta(local_store: ObjectStore) -> None:
    store = local_store
    lineage = build_lineage(store)
    key = corrupt(store, lineage.manifest, "flipped-delta-byte")
    done = subprocess.run(
        [sys.executable, "-m", "laminar_orchestration.cli", "query", "--store", store.url, "--partition", "0"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=120,
    )
    assert done.returncode == 6, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and key in done.stderr


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_node_does_not_take_over_a_partition_with_a_corrupt_checkpoint(
    how: str, local_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = local_store
    lineage = build_lineage(store)
    key = corrupt(store, lineage.manifest, how)
    fence_writer(store, lineage)
    before = current_manifest(store)
    sink_before = sorted(store.list("sink/"))
    calls = spy_data_plane(monkeypatch)
    assign(store, 0, 3)
    with running(ArrowNode(node_config(store, 3, tmp_path / "n3"), store=store)) as node:

        def failed_visibly() -> bool:
            error = reported_error(store, 3)
            return error is not None and key in error

        wait_until(failed_visibly, 20, f"node 3 to report the corrupt object {key} in its progress")
        error = reported_error(store, 3)
        assert node.guards.get(P0) is None, "the node holds a guard for a partition it could not restore"
    monkeypatch.undo()

    assert error is not None and "CheckpointCorrupt" in error and key in error
    assert calls.aggregates == 0 and calls.reads == [], "a batch ran on a partition that was never restored"
    after = current_manifest(store)
    assert (after.source_offset, after.snapshot, after.deltas) == (before.source_offset, before.snapshot, before.deltas)
    # Nothing of the node's own in the chain: at most the seal its grant put there, no takeover, no commit.
    for version in ManifestReader(store).history(P0):
        mine = version.manifest
        if mine.seq <= before.seq:
            continue
        assert mine.is_seal and not mine.outputs, f"the node published seq {mine.seq} ({mine.note!r})"
    assert sorted(store.list("sink/")) == sink_before, "output was written"


# --- 5. the local store a crashed node left behind -----------------------------------------------------


def _leftover_rows(keys: Sequence[str]) -> pa.Table:
    n = len(keys)
    return pa.table(
        {
            "key": pa.array(list(keys), pa.string()),
            "count": pa.array([999] * n, pa.int64()),
            "sum": pa.array([-1.0] * n, pa.float64()),
            "min": pa.array([-1.0] * n, pa.float64()),
            "max": pa.array([-1.0] * n, pa.float64()),
            "last": pa.array([-1.0] * n, pa.float64()),
            "last_offset": pa.array([0] * n, pa.int64()),
        }
    )


LEFTOVERS = ["between-delta-boundaries", "ahead-of-the-commit", "other-partition", "garbage-files", "empty-dir"]


@pytest.mark.parametrize("leftover", LEFTOVERS)
def test_leftover_store_off_the_lineage_is_discarded(leftover: str, local_store: ObjectStore, tmp_path: Path) -> None:
    store = local_store
    lineage = build_lineage(store)
    m = lineage.manifest
    root = tmp_path / "replica"
    poison = ["a1", "shared", "zombie-key"]
    if leftover in ("between-delta-boundaries", "ahead-of-the-commit"):
        offset = m.deltas[0].start_offset + 3 if leftover == "between-delta-boundaries" else m.source_offset + 5
        assert offset not in lineage.boundaries
        first = StateReplica(root, 0, SCHEMA, ReadStore(store))
        first.catch_up(m)
        assert first.store is not None
        # A crashed writer's uncommitted batch: rows and marker at an offset the chain never committed.
        first.store.apply(_leftover_rows(poison), offset)
        first.close()
    elif leftover == "other-partition":
        # Its marker offset is on partition 0's lineage: only the partition tells it apart.
        with PartitionStateStore(root / "db-1-0", SCHEMA, partition=1) as other:
            other.apply(_leftover_rows(poison), lineage.snapshot_end)
    elif leftover == "garbage-files":
        junk = root / "db-1-0"
        junk.mkdir(parents=True)
        (junk / "CURRENT").write_bytes(b"MANIFEST-000009\n")
        (junk / "MANIFEST-000009").write_bytes(os.urandom(512))
        (junk / "000007.sst").write_bytes(os.urandom(4096))
    else:
        (root / "db-1-0").mkdir(parents=True)

    replica = StateReplica(root, 0, SCHEMA, ReadStore(store))
    stats = replica.catch_up(m)
    assert stats.full_restore, f"a leftover store ({leftover}) was reused"
    assert stats.deltas_applied == 2 and stats.source_offset == m.source_offset
    state = replica_state(replica)
    assert "zombie-key" not in state
    assert state == reference_state(store)
    replica.close()
    assert len([p for p in root.glob("db-*") if p.is_dir()]) == 1, "the discarded store directory is still there"


@pytest.mark.parametrize("at", ["snapshot", "first-delta"])
def test_leftover_store_on_the_lineage_is_reused(at: str, store: ObjectStore, tmp_path: Path) -> None:
    lineage = build_lineage(store)
    offset = lineage.snapshot_end if at == "snapshot" else lineage.delta_ends[0]
    older = next(v for v in lineage.versions if v.source_offset == offset and v.snapshot is not None)
    root = tmp_path / "replica"
    first = StateReplica(root, 0, SCHEMA, ReadStore(store))
    first.catch_up(older)
    assert first.source_offset == offset
    first.close()  # the process dies here; its directory stays

    replica = StateReplica(root, 0, SCHEMA, ReadStore(store))
    stats = replica.catch_up(lineage.manifest)
    missing = [d for d in lineage.manifest.deltas if d.start_offset >= offset]
    assert not stats.full_restore
    assert stats.deltas_applied == len(missing) == (2 if at == "snapshot" else 1)
    assert stats.bytes_downloaded == sum(d.ref.size for d in missing), "more than the missing deltas was downloaded"
    assert replica.source_offset == lineage.manifest.source_offset
    assert replica_state(replica) == reference_state(store)
    replica.close()


# --- 6. a local write fails (disk full) -----------------------------------------------------------------


def test_local_write_failure_loses_nothing_and_resumes(
    local_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = local_store
    Ledger(store).init_cluster(1)
    source = SourceLog(store, partitions=1, segment_events=100)  # one segment per append
    disk_full = threading.Event()
    seen_locally: list[tuple[int, dict[str, tuple[object, ...]]]] = []
    apply = PartitionStateStore.apply

    node_dir = tmp_path / "n1"

    def failing_apply(self: PartitionStateStore, rows: pa.Table, source_offset: int) -> None:
        # Only the node's disk is full (the test's own audits open stores elsewhere).
        if disk_full.is_set() and self.path.is_relative_to(node_dir):
            # What the store held when the write failed (read in the writer's thread: no second opener).
            seen_locally.append((self.source_offset, as_dict(self.to_table())))
            raise LocalStateWriteFailed(str(self.path), "IO error: No space left on device")
        apply(self, rows, source_offset)

    monkeypatch.setattr(PartitionStateStore, "apply", failing_apply)
    source.append(0, events([f"k{i % 13}" for i in range(100)]))
    assign(store, 0, 1)
    with running(ArrowNode(node_config(store, 1, node_dir), store=store)):
        wait_until(lambda: committed_offset(store) == 100, 30, "the first events to be committed")
        disk_full.set()
        source.append(0, events([f"k{i % 17}" for i in range(60)]))

        def reported() -> bool:
            error = reported_error(store, 1)
            return error is not None and "No space left on device" in error

        wait_until(reported, 20, "the local write failure in the node's progress report")
        time.sleep(0.5)  # restarts keep failing meanwhile

        # Nothing is committed beyond what the manifest names, and what it names is exactly-once.
        m = current_manifest(store)
        assert m.source_offset in (100, 160)
        during = audit_partition(store, P0)
        assert during.ok and during.orphan_outputs == 0, during.issues
        boundaries = {m.state_offset, *(d.end_offset for d in m.deltas)}
        assert seen_locally
        for offset, local in seen_locally:
            # The local store only ever holds committed state: a lineage point, never a half-applied batch.
            assert offset in boundaries and offset <= m.source_offset
            assert local == reference_state(store, below=offset)

        disk_full.clear()
        source.append(0, events([f"k{i % 5}" for i in range(40)]))
        wait_until(lambda: committed_offset(store) == 200, 30, "the partition to resume after the fault")
        wait_until(lambda: reported_error(store, 1) is None, 10, "the node to report the partition healthy")

    audits = audit_store(store)
    assert [(a.ok, a.losses, a.duplicates, a.committed_offset, a.events_in_source) for a in audits] == [
        (True, 0, 0, 200, 200)
    ], [a.issues for a in audits]
    assert as_dict(committed_state(store, 0)[0]) == reference_state(store)


# --- 7. laminar query --------------------------------------------------------------------------------


def _query(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> str:
    capsys.readouterr()
    code = cli.main(["query", "--store", url, "--partition", "0", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_query_answers_from_newest_delta_or_snapshot(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(store_url)
    lineage = build_lineage(store)
    committed = lineage.manifest.source_offset
    expected = reference_state(store)
    columns = ["count", "sum", "min", "max", "last", "last_offset"]

    for key in (lineage.snapshot_only, lineage.older_delta_only, lineage.newest_delta, "c-only"):
        want = dict(zip(columns, expected[key], strict=True))
        doc = json.loads(_query(capsys, store_url, "--key", key, "--json"))
        assert doc == {"partition": 0, "committed_offset": committed, "key": key, "values": want}, key
        text = _query(capsys, store_url, "--key", key)
        assert f"committed offset {committed}" in text and repr(key) in text and f"'count': {want['count']}" in text

    # The newest delta holding the key wins over older ones (count 3 + 4 + 5 over A, B and C).
    assert expected[lineage.newest_delta][0] == 12

    text = _query(capsys, store_url, "--key", "never-seen")
    assert text.strip() == f"partition 0: committed offset {committed}, key 'never-seen' not in the state"
    doc = json.loads(_query(capsys, store_url, "--key", "never-seen", "--json"))
    assert doc["values"] is None and doc["committed_offset"] == committed

    whole = json.loads(_query(capsys, store_url, "--json"))
    assert whole["committed_offset"] == committed
    got = {row["key"]: (row["count"], row["sum"], row["min"], row["max"], row["last"]) for row in whole["keys"]}
    assert got == {k: v[:5] for k, v in expected.items()}


def test_query_reads_the_snapshot_only_when_no_delta_holds_the_key(
    local_store: ObjectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    store = local_store
    lineage = build_lineage(store)
    # Damage the snapshot: a key the deltas hold is still answered (from the newest delta) ...
    corrupt(store, lineage.manifest, "truncated-snapshot-file")
    doc = json.loads(_query(capsys, store.url, "--key", lineage.newest_delta, "--json"))
    assert doc["values"]["count"] == reference_state(store)[lineage.newest_delta][0]
    # ... while one only the snapshot holds needs it, and the damage is named.
    capsys.readouterr()
    code = cli.main(["query", "--store", store.url, "--partition", "0", "--key", lineage.snapshot_only])
    assert code == 6
    assert "checkpoints/" in capsys.readouterr().err


# --- an abandoned batch -----------------------------------------------------------------------------


class _FirstBatchHangs(ArrowBatchEngine):
    """The first aggregate blocks until released (a Spark job a cancel did not reach); later ones run at once."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def aggregate(self, events: BatchEvents, *, epoch: int, generation: int, job_group: str | None = None) -> pa.Table:
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
    source.append(0, events([f"k{i % 7}" for i in range(50)]))
    assign(store, 0, 1)
    engine = _FirstBatchHangs()

    class HangingNode(ArrowNode):
        def start_spark(self) -> None:
            self.engine = engine

    node = HangingNode(node_config(store, 1, tmp_path / "n1"), store=store)
    with running(node):
        assert engine.entered.wait(30), "the first batch never started"
        worker = node.workers[P0]
        started = time.monotonic()
        worker.abandon_batch()  # what a drain or the kill-switch does
        # The worker does not wait for the hung job: it reads the same events again at once.
        wait_until(lambda: worker.batches.started >= 2, 5, "the worker to start the batch again")
        assert time.monotonic() - started < 1.0
        engine.release.set()  # the abandoned job ends now, while the retry waits behind it
        wait_until(lambda: committed_offset(store) == 50, 30, "the retried batch to commit")
        assert worker.progress().error is None and not worker.finished
    audit = audit_partition(store, P0)
    assert audit.ok and audit.duplicates == 0 and audit.losses == 0, audit.issues


class _FailsWhenReleased(ArrowBatchEngine):
    """Every aggregate blocks until released, then fails (a cancelled Spark job)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def aggregate(self, events: BatchEvents, *, epoch: int, generation: int, job_group: str | None = None) -> pa.Table:
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
    source.append(0, events([f"k{i % 7}" for i in range(50)]))
    batch = source.read(P0, 0, 1_000)
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
        wait_until(lambda: not (tmp_path / "cancelled").exists(), 10, "the cancelled batch's files to go")
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
        wait_until(lambda: not (tmp_path / "done").exists(), 1, "the committed batch's files to go at once")


def test_a_partition_store_is_safe_to_use_from_several_threads(tmp_path: Path) -> None:
    """The worker writes while the heartbeat reads the offset, a snapshot checkpoints and a query scans:
    none of them may fail (rocksdict itself refuses concurrent use of one database object)."""
    state = PartitionStateStore(tmp_path / "state", keyed_aggregation.state_schema, partition=0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def repeat(action: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                while not stop.is_set():
                    action()
            except BaseException as exc:
                errors.append(exc)

        return run

    def write() -> None:
        for offset in range(1, 150):
            rows = pa.table(
                {"key": [f"k{i}" for i in range(200)], **{f.name: pa.array([offset] * 200, f.type) for f in SCHEMA}}
            )
            state.apply(rows, offset)

    readers = [
        threading.Thread(target=repeat(lambda: state.source_offset)),
        threading.Thread(target=repeat(lambda: state.get_many(["k1", "k2", "absent"]))),
        threading.Thread(target=repeat(lambda: sum(t.num_rows for t in state.scan(rows_per_batch=50)))),
    ]
    for t in readers:
        t.start()
    try:
        write()
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert errors == [], errors[:3]
    assert state.get("k7") is not None
    # A released partition's store is closed (and replaced) while the heartbeat still reports its offset.
    stop.clear()
    offset_reader = threading.Thread(target=repeat(lambda: state.source_offset))
    offset_reader.start()
    state.close()
    time.sleep(0.1)
    stop.set()
    offset_reader.join()
    assert errors == [], errors[:3]
    assert state.source_offset == 149
