"""In-process nodes without Spark: the real node runtime with batches aggregated by pyarrow."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from laminar_orchestration.dataplane.engine import BatchEvents
from laminar_orchestration.dataplane.node import Node
from laminar_orchestration.ops.verify import reference_batch_aggregate
from laminar_orchestration.processing.keyed import keyed_aggregation
from laminar_orchestration.processing.schema import DEFAULT_STREAM_SCHEMA


class ArrowBatchEngine:
    """The default keyed aggregation of a batch, computed in plain Python: the real node runtime without Spark.

    Used for in-process nodes (store-fault scenarios and tests, where what is
    under test is everything around the aggregate: merge, local store, deltas,
    commits). The aggregate is the audit's reference fold of the batch alone;
    the audit still checks what matters here: the state merged over many
    batches, handoffs and restores against one fold of every committed event.
    """

    processor = keyed_aggregation
    stream = DEFAULT_STREAM_SCHEMA

    def warm_up(self) -> float:
        """Nothing to warm up: no JVM."""
        return 0.0

    def before_batch(self, epoch: int, job_group: str | None) -> None:
        """Runs before each aggregate: nothing here; a test's engine holds, slows or records the batch."""

    def aggregate(
        self, events: BatchEvents, *, epoch: int, generation: int, job_group: str | None = None, progress: object = None
    ) -> pa.Table:
        """The batch aggregate of `events` (the audit's reference fold of the batch)."""
        self.before_batch(epoch, job_group)
        table = events if isinstance(events, pa.Table) else pa.concat_tables([pq.read_table(f) for f in events])
        return reference_batch_aggregate(table)

    def cancel(self, job_group: str) -> None:
        """Nothing to cancel: an aggregate takes milliseconds; the runtime drops an abandoned batch's result."""


class ArrowNode(Node):
    """A node whose batches are aggregated by `ArrowBatchEngine` instead of a SparkSession."""

    def start_spark(self) -> None:
        self.engine = ArrowBatchEngine()
