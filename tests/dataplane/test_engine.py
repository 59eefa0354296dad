"""The processor contract and the Spark engine: the README's "Your own processor" example, executed as
written (all but its last line), runs on a real `Node` on a local SparkSession; a state schema or a
merge that breaks the contract is a clear error. Spark aggregates a batch alike from its table and from
its files, splits a large segment over several tasks, gives way to the first real batch after its
warm-up, and runs its JVM with the node's options; a small batch, or one of many small segments,
reaches the engine as one table.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from laminar_dev.chaos import ArrowBatchEngine
from laminar_orchestration.dataplane import batches
from laminar_orchestration.dataplane.engine import (
    ARROW_INPUT_SMALL_EVENTS,
    SPARK_JAVA_OPTIONS,
    BatchEvents,
    SparkBatchEngine,
    build_spark_session,
    spark_conf,
)
from laminar_orchestration.dataplane.node import Node
from laminar_orchestration.dataplane.restore import committed_state
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.ops.verify import reference_batch_aggregate
from laminar_orchestration.processing.codec import InvalidStateSchema
from laminar_orchestration.processing.contract import FoldContext
from laminar_orchestration.processing.keyed import KeyedProcessor
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.segments import ROW_GROUP_EVENTS, SourceBatch
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore
from tests.dataplane import plane

RUNNING_MAX_SCHEMA = pa.schema([("max", pa.float64())])


def _running_max_aggregate(batch: Any) -> Any:
    from pyspark.sql import functions as F

    return batch.groupBy("key").agg(F.max("value").alias("batch_max"))


def _running_max_merge(batch: pa.Table, previous: pa.Table) -> pa.Table:
    return pa.table({"max": pc.max_element_wise(previous["max"], batch["batch_max"], skip_nulls=True)})


def _readme_processor() -> KeyedProcessor:
    """A per-key fold of one's own (a running maximum); the README's example is `examples/windowed_counts.py`."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = readme.split("### Your own processor", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    example = (Path(__file__).resolve().parents[2] / "examples" / "windowed_counts.py").read_text()
    assert "processor = WindowedAggregation(" in code and "WindowedAggregation(" in example
    return KeyedProcessor(
        name="running_max",
        state_schema=RUNNING_MAX_SCHEMA,
        aggregate=_running_max_aggregate,
        merge=_running_max_merge,
    )


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
    first = plane.events(["x", "y", "x", "z"], [3.0, -1.0, 7.0, 0.5])
    second = plane.events(["x", "y", "w"], [5.0, 2.0, -4.0])  # x keeps 7, y rises to 2, w is new
    source.append(0, first)
    plane.assign(store, 0, 1)
    node = Node(plane.node_config(store, 1, tmp_path / "n1"), store=store, processor=running_max, spark=spark)
    with plane.running(node):
        plane.wait_until(lambda: plane.committed_offset(store) == 4, 90, "the Spark node to commit the first batch")
        source.append(0, second)
        plane.wait_until(lambda: plane.committed_offset(store) == 7, 60, "the Spark node to commit the second batch")
    state, offset = committed_state(store, 0, state_schema=running_max.state_schema)
    assert offset == 7
    assert state.column_names == ["key", "max"]
    assert plane.as_dict(state, ["max"]) == {"w": (-4.0,), "x": (7.0,), "y": (2.0,), "z": (0.5,)}
    assert len(plane.current_manifest(store).deltas) == 2


@pytest.mark.spark
def test_spark_scans_a_large_segment_with_several_tasks(spark: Any, local_store: ObjectStore, tmp_path: Path) -> None:
    """A segment holds row groups of `ROW_GROUP_EVENTS`, so Spark's file splits (here: two, as two
    cores would make) each read a share of the events; a segment of one row group is read by one."""
    n = 3 * ROW_GROUP_EVENTS
    SourceLog(local_store, segment_events=n).append(0, plane.events([f"k{i % 11}" for i in range(n)]))
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
    batch = plane.events(["a", "b", "a"], [1.0, 2.0, 4.0])
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
        source.append(0, plane.events(keys, [float(v) for v in rng.integers(-50, 50, 300)]))
    batch = source.read(plane.P0, 0, 10_000)
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
            self,
            events: BatchEvents,
            *,
            epoch: int,
            generation: int,
            job_group: str | None = None,
            progress: object = None,
        ) -> pa.Table:
            seen.append(events)
            return super().aggregate(events, epoch=epoch, generation=generation, job_group=job_group)

    def batch_of(partition: int, segments: int, segment_events: int) -> SourceBatch:
        for _ in range(segments):
            source.append(partition, plane.events([f"k{i % 11}" for i in range(segment_events)]))
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


def test_state_schema_with_a_type_the_store_cannot_hold_is_rejected_at_construction() -> None:
    union = pa.dense_union([pa.field("a", pa.int64()), pa.field("b", pa.string())])
    with pytest.raises(InvalidStateSchema) as info:
        KeyedProcessor(
            name="labels",
            state_schema=pa.schema([("max", pa.float64()), ("label", union)]),
            aggregate=_running_max_aggregate,
            merge=_running_max_merge,
        )
    assert info.value.column == "label"
    assert "'label'" in str(info.value) and "union" in str(info.value)


def test_merge_returning_the_wrong_row_count_is_a_clear_error() -> None:
    def bad_merge(batch: pa.Table, previous: pa.Table) -> pa.Table:
        return pa.table({"max": pa.array([1.0], pa.float64())})

    bad = KeyedProcessor("bad_max", RUNNING_MAX_SCHEMA, _running_max_aggregate, bad_merge)
    aggregate = pa.table({"key": ["a", "b", "c"], "batch_max": [1.0, 2.0, 3.0]})
    previous = pa.table({"max": pa.array([None, None, None], pa.float64())})
    with pytest.raises(ValueError, match=r"'bad_max'.*merge must return 3 rows.*got 1 rows"):
        bad.fold(aggregate, previous, FoldContext.at(1, 1))
    # The contract itself: the right merge produces one delta row per touched key.
    fold = running_max.fold(aggregate, previous, FoldContext.at(1, 1))
    assert fold.delta.to_pylist() == [{"key": "a", "max": 1.0}, {"key": "b", "max": 2.0}, {"key": "c", "max": 3.0}]
