"""The Spark side of a batch: a processor folds a batch of events into the partition's state.

A processor is a function of the current state and the batch, both Spark
DataFrames, returning the new state and the output::

    def my_processor(state: DataFrame, batch: DataFrame) -> ProcessorResult:
        ...
        return ProcessorResult(state=new_state, output=output)

`batch` has the columns of `EVENT_COLUMNS` (offset, key, value, ts) plus the
`epoch` and `generation` stamped on every record read by the node. The state
must be a deterministic fold of the events (it is rebuilt by replaying the
source after a restore), and its schema must not depend on the batch.

The default, `keyed_aggregation`, keeps per key count, sum, min, max and the
last value (by offset), and outputs the keys the batch touched.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

STATE_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("count", pa.int64()),
        ("sum", pa.float64()),
        ("min", pa.float64()),
        ("max", pa.float64()),
        ("last", pa.float64()),
        ("last_offset", pa.int64()),
    ]
)

#: What every output row carries besides the processor's own columns.
OUTPUT_LINEAGE = ("epoch", "generation", "batch_start", "batch_end")


@dataclass(frozen=True)
class ProcessorResult:
    """New state and output of one batch (Spark DataFrames)."""

    state: Any
    output: Any


Processor = Callable[[Any, Any], ProcessorResult]


def keyed_aggregation(state: Any, batch: Any) -> ProcessorResult:
    """Per key: count, sum, min, max and last value of `value`; output = touched keys."""
    from pyspark.sql import functions as F

    agg = batch.groupBy("key").agg(
        F.count(F.lit(1)).alias("b_count"),
        F.sum("value").alias("b_sum"),
        F.min("value").alias("b_min"),
        F.max("value").alias("b_max"),
        F.max_by("value", "offset").alias("b_last"),
        F.max("offset").alias("b_last_offset"),
        F.first("epoch").alias("epoch"),
        F.first("generation").alias("generation"),
    )
    joined = state.join(agg, on="key", how="full_outer")
    touched = F.col("b_count").isNotNull()
    new_state = joined.select(
        "key",
        (F.coalesce("count", F.lit(0)) + F.coalesce("b_count", F.lit(0))).cast("long").alias("count"),
        (F.coalesce("sum", F.lit(0.0)) + F.coalesce("b_sum", F.lit(0.0))).alias("sum"),
        F.least("min", "b_min").alias("min"),
        F.greatest("max", "b_max").alias("max"),
        F.when(touched, F.col("b_last")).otherwise(F.col("last")).alias("last"),
        F.when(touched, F.col("b_last_offset")).otherwise(F.col("last_offset")).alias("last_offset"),
    )
    output = joined.where(touched).select(
        "key",
        F.col("b_count").cast("long").alias("batch_count"),
        F.col("b_sum").alias("batch_sum"),
        (F.coalesce("count", F.lit(0)) + F.col("b_count")).cast("long").alias("count"),
        (F.coalesce("sum", F.lit(0.0)) + F.col("b_sum")).alias("sum"),
        F.least("min", "b_min").alias("min"),
        F.greatest("max", "b_max").alias("max"),
        F.col("b_last").alias("last"),
        F.col("epoch").cast("long").alias("epoch"),
        F.col("generation").cast("long").alias("generation"),
    )
    return ProcessorResult(state=new_state, output=output)


def table_to_parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def parquet_bytes_to_table(data: bytes) -> pa.Table:
    return pq.read_table(pa.BufferReader(data))


def empty_state() -> pa.Table:
    return STATE_SCHEMA.empty_table()


@dataclass(frozen=True)
class BatchResult:
    state: pa.Table
    output: pa.Table
    spark_s: float


def build_spark_session(master: str = "local[*]", app_name: str = "laminar-node", *, ui: bool = False) -> Any:
    """A SparkSession tuned for small, frequent batches on one machine."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.sql.shuffle.partitions", os.environ.get("LAMINAR_SHUFFLE_PARTITIONS", "2"))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", os.environ.get("LAMINAR_SPARK_DRIVER_MEMORY", "1g"))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "1000000")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class SparkBatchRunner:
    """Runs a processor over one batch: local parquet in, Arrow tables out.

    State lives in versioned local parquet files; a path Spark is reading is
    never overwritten (each batch writes a new version).
    """

    def __init__(self, spark: Any, processor: Processor | None = None, workdir: str | None = None) -> None:
        self.spark = spark
        self.processor: Processor = processor or keyed_aggregation
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="laminar-spark-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._state_schema: Any = None

    def warm_up(self) -> float:
        """Run one tiny batch so the first real batch does not pay for JIT and planning."""
        started = time.monotonic()
        events = pa.table(
            {
                "offset": pa.array([0], pa.int64()),
                "key": pa.array(["warm"], pa.string()),
                "value": pa.array([1.0], pa.float64()),
                "ts": pa.array([0], pa.int64()),
            }
        )
        path = self.workdir / "warmup-events.parquet"
        pq.write_table(events, path)
        self.run(empty_state(), [path], epoch=1, generation=0)
        return time.monotonic() - started

    def _state_frame(self, state: pa.Table, version_dir: Path) -> Any:
        path = version_dir / "state.parquet"
        pq.write_table(state, path)
        return self.spark.read.parquet(str(path))

    def run(
        self,
        state: pa.Table,
        event_files: Sequence[Path],
        *,
        epoch: int,
        generation: int,
        job_group: str | None = None,
    ) -> BatchResult:
        """Fold one batch into `state`. Jobs run in `job_group` so `cancel` can abandon them."""
        from pyspark.sql import functions as F

        started = time.monotonic()
        if job_group is not None:
            # Thread-local in PySpark's pinned-thread mode: only this batch's jobs join the group.
            self.spark.sparkContext.setJobGroup(job_group, "laminar batch", True)
        version_dir = Path(tempfile.mkdtemp(prefix="v-", dir=self.workdir))
        try:
            state_df = self._state_frame(state, version_dir)
            batch_df = (
                self.spark.read.parquet(*[str(p) for p in event_files])
                .withColumn("epoch", F.lit(epoch).cast("long"))
                .withColumn("generation", F.lit(generation).cast("long"))
            )
            result = self.processor(state_df, batch_df)
            new_state = result.state.toArrow()
            output = result.output.toArrow()
        finally:
            _rmtree(version_dir)
        return BatchResult(new_state, output, time.monotonic() - started)

    def cancel(self, job_group: str) -> None:
        """Abandon the running jobs of a batch (it has no side effect before its commit)."""
        self.spark.sparkContext.cancelJobGroup(job_group)


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
