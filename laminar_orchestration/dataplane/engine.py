"""The Spark side of a batch: a node's SparkSession and the engine that runs a processor's
`batch_aggregate` over one batch (the processor contract is in `laminar_orchestration.processing`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypeAlias

import pyarrow as pa
import pyarrow.parquet as pq

from laminar_orchestration.dataplane.class_archive import ClassArchive, class_archive
from laminar_orchestration.processing.contract import EventTimeProgress, FoldContext, Processor
from laminar_orchestration.processing.keyed import keyed_aggregation
from laminar_orchestration.processing.schema import DEFAULT_STREAM_SCHEMA, StreamSchema


def table_to_parquet_bytes(table: pa.Table) -> bytes:
    import io

    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def parquet_bytes_to_table(data: bytes) -> pa.Table:
    return pq.read_table(pa.BufferReader(data))


# --- engines -------------------------------------------------------------------------

#: A batch's events as an engine takes them: one Arrow table (`EVENT_SCHEMA`) or the batch's Parquet files.
BatchEvents: TypeAlias = pa.Table | Sequence[Path]


class BatchEngine(Protocol):
    """Computes a batch's per-key aggregate (the data-plane half of a processor)."""

    @property
    def processor(self) -> Processor: ...

    @property
    def stream(self) -> StreamSchema: ...

    def warm_up(self) -> float: ...

    def aggregate(
        self,
        events: BatchEvents,
        *,
        epoch: int,
        generation: int,
        job_group: str | None = None,
        progress: EventTimeProgress | None = None,
    ) -> pa.Table: ...

    def cancel(self, job_group: str) -> None: ...


#: JVM options of a node's Spark (driver and executors). A node's batches are small and frequent,
#: so Spark's work is mostly query planning and short tasks: the C1 compiler alone reaches steady
#: speed within a few batches at about half the CPU per batch of the default tiered C2 compiler,
#: and the serial collector suits a driver heap of one or two GB. Measured by
#: ``python -m benchmarks.bench_spark_jvm``.
SPARK_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_conf(master: str = "local[*]", app_name: str = "laminar-node", *, ui: bool = False) -> dict[str, str]:
    """The Spark settings of a node's session, tuned for small, frequent batches.

    One definition for `laminar node run` and the Dagster ``pyspark`` resource.
    ``LAMINAR_SPARK_JAVA_OPTIONS`` replaces `SPARK_JAVA_OPTIONS` (an empty value: the JVM's defaults).
    """
    java_options = os.environ.get("LAMINAR_SPARK_JAVA_OPTIONS", SPARK_JAVA_OPTIONS)
    return {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.ui.enabled": "true" if ui else "false",
        "spark.sql.shuffle.partitions": os.environ.get("LAMINAR_SHUFFLE_PARTITIONS", "2"),
        # A batch aggregate is one shuffle: adaptive execution would split it into more jobs.
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": os.environ.get("LAMINAR_SPARK_DRIVER_MEMORY", "1g"),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.sources.parallelPartitionDiscovery.threshold": "1000000",
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
    }


def build_spark_session(
    master: str = "local[*]",
    app_name: str = "laminar-node",
    *,
    ui: bool = False,
    archive: ClassArchive | Literal["machine"] | None = "machine",
) -> Any:
    """A SparkSession with `spark_conf`, bound to loopback unless ``SPARK_LOCAL_IP`` says otherwise.

    A driver JVM started here maps `archive` or records it: by default this machine's class archive
    (`class_archive.class_archive`); None: none.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf = spark_conf(master, app_name, ui=ui)
    # Only a JVM started by this call takes the archive's options (a running one keeps its own).
    if SparkContext._gateway is not None:
        archive = None
    elif archive == "machine":
        archive = class_archive()
    if archive is not None:
        driver = conf["spark.driver.extraJavaOptions"]
        conf["spark.driver.extraJavaOptions"] = f"{driver} {archive.java_options()}".strip()
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


#: Job group of the warm-up batches (cancelled when a real batch starts).
WARM_UP_JOB_GROUP = "laminar-warm-up"
#: A batch whose event files are at most this size is aggregated in one task (~200k events);
#: larger ones are shuffled so that their aggregate uses every core.
SINGLE_TASK_BYTES = 4 * 1024 * 1024
#: Up to this many events, a batch always reaches Spark as one table (`spark_takes_table`) ...
ARROW_INPUT_SMALL_EVENTS = 5_000
#: ... and up to this many, while its files average at most `ARROW_INPUT_EVENTS_PER_FILE` events.
ARROW_INPUT_MAX_EVENTS = 100_000
ARROW_INPUT_EVENTS_PER_FILE = 400


def spark_takes_table(events: int, files: int) -> bool:
    """Whether a batch of `events` in `files` Parquet files (one per source frame) goes to Spark as one
    Arrow table from the node rather than as its files.

    Spark pays about 3 ms per file it opens, and about 12 us per event it takes from a table
    (one thread turns the table into rows): many small segments - a producer appending often -
    are cheaper as a table, few large ones as files. ``python -m benchmarks.bench_runtime --only 6``.
    """
    if events <= ARROW_INPUT_SMALL_EVENTS:
        return True
    return events <= ARROW_INPUT_MAX_EVENTS and events <= ARROW_INPUT_EVENTS_PER_FILE * files


#: Of the synthetic batches a node runs at start (`config.WARM_UP_BATCHES`, `SparkBatchEngine.keep_warming`),
#: this many back to back, the rest with a pause as long as each batch.
WARM_UP_BURST = 30
#: Events per synthetic warm-up batch: the size of a typical micro-batch under steady load.
WARM_UP_EVENTS = 4_000

log = logging.getLogger(__name__)


def _spark_event_schema(stream: StreamSchema) -> Any:
    """The stream's stored events as a Spark schema: given, so Spark infers nothing."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(stream.event_schema)


def synthetic_events(stream: StreamSchema, n: int) -> pa.Table:
    """`n` events of `stream`'s schema for warming Spark up: a key per four events, nulls where allowed."""
    keys = max(1, n // 4)
    columns: list[pa.Array] = [pa.array(range(n), pa.int64())]
    for f in stream.input_schema:
        if f.name == stream.key:
            raw = [f"warm-{i % keys}" for i in range(n)] if pa.types.is_string(f.type) else [i % keys for i in range(n)]
            columns.append(pa.array(raw).cast(f.type))
        elif f.name == stream.event_time:
            columns.append(pa.array(range(n), pa.int64()).cast(f.type))
        elif pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type):
            # Small numbers: an int8 fits any numeric column, a decimal's precision included.
            columns.append(pa.array([i % 97 for i in range(n)], pa.int8()).cast(f.type))
        elif pa.types.is_string(f.type):
            columns.append(pa.array([f"v{i % 97}" for i in range(n)], pa.string()))
        elif f.nullable:
            columns.append(pa.nulls(n, f.type))
        else:
            columns.append(
                pa.array([None] * n, f.type).fill_null(pa.scalar(False))
                if pa.types.is_boolean(f.type)
                else pa.nulls(n, f.type)
            )
    return pa.Table.from_arrays(columns, schema=stream.event_schema)


class _NoTimers:
    def due(self, until: int, *, limit: int | None = None) -> pa.Table:
        return pa.table({"key": pa.array([], pa.string())})


class SparkBatchEngine:
    """Runs a processor's `aggregate` on Spark over one batch's Parquet files; the result comes back as Arrow.

    The schema is given, so Spark infers nothing: one job per batch.
    """

    def __init__(
        self,
        spark: Any,
        processor: Processor | None = None,
        workdir: str | None = None,
        *,
        stream: StreamSchema = DEFAULT_STREAM_SCHEMA,
    ) -> None:
        self.spark = spark
        self.stream = stream
        self.processor = (processor or keyed_aggregation).bind(stream)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="laminar-spark-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._schema = _spark_event_schema(stream)
        #: Set by the first real batch, or by `stop_warming`: the warm-up ends.
        self._warming_over = threading.Event()
        self._warming: threading.Thread | None = None

    def warm_up(self) -> float:
        """Run two tiny batches, Spark's half and the node's, so the node's first real batch does
        not pay for starting Spark, nor for the first use of the Arrow/NumPy conversions (their
        first call imports pandas: ~0.3 s) and the Parquet writer; one from a table, one from a file."""
        started = time.monotonic()
        for events in self._warm_up_events(1):
            aggregate = self.aggregate(events, epoch=1, generation=0, job_group=WARM_UP_JOB_GROUP)
        previous = self.processor.codec.decode([None] * aggregate.num_rows)
        context = FoldContext(
            epoch=1, generation=0, progress=EventTimeProgress(), timers=_NoTimers(), processing_time_ms=0
        )
        fold = self.processor.fold(aggregate, previous, context)
        self.processor.codec.encode(fold.delta)
        table_to_parquet_bytes(fold.output)
        return time.monotonic() - started

    def keep_warming(self, batches: int) -> threading.Thread:
        """Run up to `batches` synthetic batches of a typical size on a background thread.

        The JIT compiles Spark's batch path over the first couple of hundred batches (a
        small batch takes about 40% less time after 200 than after 30): a node that owns
        nothing yet (a standby, a migration's target) would otherwise pay that for its
        first real ones, which is exactly when a handoff waits for it. The first
        `WARM_UP_BURST` batches run back to back, the rest at most half of one core's
        time, so a warming node leaves room for busy ones. Stops as soon as a real batch
        starts (real batches warm it from then on); its running job is cancelled then.
        """
        inputs = self._warm_up_events(WARM_UP_EVENTS)

        def run() -> None:
            started, done = time.monotonic(), 0
            for _ in range(batches):
                if self._warming_over.is_set():
                    break
                began = time.monotonic()
                try:
                    # Both inputs, in turn: a node's batches come as either (`spark_takes_table`).
                    events = inputs[done % len(inputs)]
                    self.aggregate(events, epoch=1, generation=0, job_group=WARM_UP_JOB_GROUP)
                except Exception:  # cancelled by a real batch, or Spark is stopping
                    break
                done += 1
                if done >= WARM_UP_BURST and self._warming_over.wait(time.monotonic() - began):
                    break
            log.info("spark warm-up: %d batches in %.1fs", done, time.monotonic() - started)

        thread = threading.Thread(target=run, name="spark-warm-up", daemon=True)
        self._warming = thread
        thread.start()
        return thread

    def stop_warming(self, timeout_s: float = 10.0) -> None:
        """End the warm-up and wait for its thread: a thread still inside a Spark call when the
        process exits makes the interpreter abort during finalization."""
        self._warming_over.set()
        thread = self._warming
        if thread is None or not thread.is_alive():
            return
        with contextlib.suppress(Exception):  # Spark already stopping: the job goes with it
            self.spark.sparkContext.cancelJobGroup(WARM_UP_JOB_GROUP)
        thread.join(timeout_s)

    def _warm_up_events(self, n: int) -> tuple[pa.Table, list[Path]]:
        """`n` synthetic events, as a table and as a file."""
        events = synthetic_events(self.stream, n)
        path = self.workdir / f"warm-up-events-{n}.parquet"
        pq.write_table(events, path)
        return events, [path]

    def aggregate(
        self,
        events: BatchEvents,
        *,
        epoch: int,
        generation: int,
        job_group: str | None = None,
        progress: EventTimeProgress | None = None,
    ) -> pa.Table:
        """The processor's per-key aggregate of one batch, given the event-time progress before it.
        Jobs run in `job_group` so `cancel` can abandon them."""
        if job_group != WARM_UP_JOB_GROUP and not self._warming_over.is_set():
            self._warming_over.set()
            self.spark.sparkContext.cancelJobGroup(WARM_UP_JOB_GROUP)
        if job_group is not None:
            # Thread-local in PySpark's pinned-thread mode: only this batch's jobs join the group.
            self.spark.sparkContext.setJobGroup(job_group, "laminar batch", True)
        if isinstance(events, pa.Table):
            frame = self.spark.createDataFrame(events, schema=self._schema)
            single_task = True
        else:
            frame = self.spark.read.schema(self._schema).parquet(*[str(p) for p in events])
            single_task = sum(p.stat().st_size for p in events) <= SINGLE_TASK_BYTES
        # One call with SQL expressions: each Column built in Python is a round trip to the JVM.
        batch = frame.selectExpr(
            "*", f"CAST({int(epoch)} AS BIGINT) AS epoch", f"CAST({int(generation)} AS BIGINT) AS generation"
        )
        if single_task:
            # One partition is already clustered by any key: the aggregate runs as one task with no
            # shuffle, which costs a small batch a fifth less time and CPU than two stages.
            batch = batch.coalesce(1)
        table: pa.Table = self.processor.batch_aggregate(batch, progress or EventTimeProgress()).toArrow()
        return table

    def cancel(self, job_group: str) -> None:
        """Abandon the running jobs of a batch (it has no side effect before its commit)."""
        self.spark.sparkContext.cancelJobGroup(job_group)
