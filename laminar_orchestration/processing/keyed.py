"""`KeyedProcessor`: a per-key fold, with optional state TTL; and the default, `keyed_aggregation`.

* ``aggregate(batch) -> DataFrame`` runs on Spark over the batch only and returns one row
  per touched key: a ``key`` column plus the processor's batch-aggregate columns;
* ``merge(aggregate, previous) -> pyarrow.Table`` runs on the node over the touched keys:
  ``previous`` holds the state's value columns for those keys (null for a key seen for the
  first time), row-aligned with ``aggregate``; the result holds the new value columns.

The output row of a key is its aggregate, its new values and the writer's epoch and
generation. With a `ttl`, a key no batch touched for that long is removed from the state
at a commit (the removal is part of the commit's delta, so restores and standbys agree):
in event time, once the partition's largest event time passes the key's last batch's by
`ttl`; in processing time, once the node's clock does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from laminar_orchestration.processing.codec import ValueCodec
from laminar_orchestration.processing.contract import (
    NO_EVENT_TIME,
    BatchFold,
    EventTimeProgress,
    FoldContext,
    MergeResultInvalid,
)
from laminar_orchestration.processing.schema import DEFAULT_STREAM_SCHEMA, InvalidSchema, StreamSchema

Aggregate = Callable[[Any], Any]
Merge = Callable[[pa.Table, pa.Table], pa.Table]

#: The hidden value column holding a key's expiry time when the processor has a TTL.
EXPIRES_AT = "_expires_at"


def millis(span: timedelta | int | float) -> int:
    """A span as whole milliseconds (an int or float is taken as seconds)."""
    if isinstance(span, timedelta):
        return int(span.total_seconds() * 1000)
    return int(span * 1000)


@dataclass(frozen=True)
class KeyedProcessor:
    """A per-key fold: Spark aggregates the batch, the node merges touched keys with their old values."""

    name: str
    #: The state's value columns (without ``key``): any Arrow types.
    state_schema: pa.Schema
    aggregate: Aggregate
    merge: Merge
    version: str = "1"
    #: Remove keys untouched for this long (None: state is kept forever).
    ttl: timedelta | None = None
    ttl_clock: Literal["event_time", "processing_time"] = "event_time"
    #: The batch's columns the processor reads; `bind` checks the stream has them.
    reads: tuple[str, ...] = ()
    stream: StreamSchema = DEFAULT_STREAM_SCHEMA
    watermarked: bool = field(default=False, init=False)
    codec: ValueCodec = field(init=False, repr=False, compare=False)
    expiry_column: str | None = field(init=False, compare=False)

    def __post_init__(self) -> None:
        stored = self.state_schema
        if self.ttl is not None:
            if millis(self.ttl) <= 0:
                raise InvalidSchema(f"processor {self.name!r}", "ttl must be positive")
            stored = stored.append(pa.field(EXPIRES_AT, pa.int64(), nullable=False))
        # Fails at construction, not at the first batch, for a schema the store cannot hold.
        object.__setattr__(self, "codec", ValueCodec(stored))
        object.__setattr__(self, "expiry_column", EXPIRES_AT if self.ttl is not None else None)

    @property
    def full_state_schema(self) -> pa.Schema:
        """``key`` plus the stored value columns: the schema of deltas and of `laminar query`."""
        return pa.schema([pa.field("key", pa.string()), *self.codec.schema])

    def bind(self, schema: StreamSchema) -> KeyedProcessor:
        missing = [c for c in self.reads if c not in schema.input_schema.names]
        if missing:
            raise InvalidSchema(f"processor {self.name!r}", f"reads column(s) {missing} the stream does not have")
        return replace(self, stream=schema)

    def batch_aggregate(self, batch: Any, progress: EventTimeProgress) -> Any:
        return self.aggregate(batch)

    def output_schema(self) -> pa.Schema | None:
        return None

    def fold(self, aggregate: pa.Table, previous: pa.Table, context: FoldContext) -> BatchFold:
        """New values and output for the touched keys; with a TTL, the removal of expired ones."""
        values = self.merge(aggregate, previous)
        missing = [f.name for f in self.state_schema if f.name not in values.column_names]
        if missing or values.num_rows != aggregate.num_rows:
            raise MergeResultInvalid(self.name, aggregate.num_rows, values.num_rows, self.state_schema.names, missing)
        keys = aggregate["key"]
        n = aggregate.num_rows
        columns = [keys, *(values[f.name].cast(f.type) for f in self.state_schema)]
        progress = context.progress.advanced_to(context.batch_max_event_time)
        deleted = pa.array([], pa.string())
        if self.ttl is not None:
            now = self._clock(progress, context)
            columns.append(pa.array([now + millis(self.ttl)] * n, pa.int64()))
            if now != NO_EVENT_TIME:
                due = context.timers.due(now)["key"]
                touched = pc.is_in(due, value_set=keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys)
                deleted = pc.filter(due, pc.invert(touched)).combine_chunks()
        delta = pa.table(columns, schema=self.full_state_schema)
        output_columns = {name: aggregate[name] for name in aggregate.column_names}
        for f in self.state_schema:
            output_columns[f.name] = delta[f.name]
        output_columns["epoch"] = pa.array(pa.repeat(pa.scalar(context.epoch, pa.int64()), n))
        output_columns["generation"] = pa.array(pa.repeat(pa.scalar(context.generation, pa.int64()), n))
        return BatchFold(delta=delta, output=pa.table(output_columns), deleted=deleted, progress=progress)

    def _clock(self, progress: EventTimeProgress, context: FoldContext) -> int:
        if self.ttl_clock == "processing_time":
            return context.processing_time_ms
        return progress.max_event_time


# --- the default processor ------------------------------------------------------------

STATE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string()),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("sum", pa.float64(), nullable=False),
        pa.field("min", pa.float64(), nullable=False),
        pa.field("max", pa.float64(), nullable=False),
        pa.field("last", pa.float64(), nullable=False),
        pa.field("last_offset", pa.int64(), nullable=False),
    ]
)


def _aggregate_counts(batch: Any) -> Any:
    from pyspark.sql import functions as F

    # SQL text: one call into the JVM per column, where building each Column in Python takes
    # three (about a fifth of a small batch's time goes into such calls).
    return batch.groupBy("key").agg(
        F.expr("count(1) AS batch_count"),
        F.expr("sum(value) AS batch_sum"),
        F.expr("min(value) AS batch_min"),
        F.expr("max(value) AS batch_max"),
        F.expr("max_by(value, offset) AS batch_last"),
        F.expr("max(offset) AS batch_last_offset"),
    )


def _merge_counts(batch: pa.Table, previous: pa.Table) -> pa.Table:
    zero_i, zero_f = pa.scalar(0, pa.int64()), pa.scalar(0.0, pa.float64())
    return pa.table(
        {
            "count": pc.add(pc.fill_null(previous["count"], zero_i), batch["batch_count"].cast(pa.int64())),
            "sum": pc.add(pc.fill_null(previous["sum"], zero_f), batch["batch_sum"]),
            "min": pc.min_element_wise(previous["min"], batch["batch_min"], skip_nulls=True),
            "max": pc.max_element_wise(previous["max"], batch["batch_max"], skip_nulls=True),
            "last": batch["batch_last"],
            "last_offset": batch["batch_last_offset"],
        }
    )


#: Per key: count, sum, min, max and last value (by offset) of ``value``.
keyed_aggregation = KeyedProcessor(
    name="keyed_aggregation",
    state_schema=pa.schema([f for f in STATE_SCHEMA if f.name != "key"]),
    aggregate=_aggregate_counts,
    merge=_merge_counts,
    reads=("key", "value"),
)


def empty_state() -> pa.Table:
    return STATE_SCHEMA.empty_table()
