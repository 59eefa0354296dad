"""Event-time windows: tumbling and sliding (hopping) windows per key, emitted once when final.

A window ``[start, end)`` of a key is final once the watermark reaches its end: the
largest event time seen minus the allowed lateness. It is then emitted as one row (key,
window start and end, the aggregates) and removed from the state in the same commit.
An event below the watermark that precedes it (in log order) is late: counted in the
partition's progress, never applied - so no emitted window ever changes, and the result
does not depend on how the stream was batched, moved or failed over::

    WindowedAggregation(
        name="clicks_per_5_min",
        window=Tumbling(timedelta(minutes=5)),
        lateness=timedelta(minutes=1),
        aggregates=(Agg.count("clicks"), Agg("revenue", "sum", "amount")),
    )

The state holds one row per open window (key ``"<start>|<key>"``), indexed by its end,
so a batch reads only its touched windows and the windows its watermark closes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from laminar_orchestration.processing.aggregates import Agg, merge_partials
from laminar_orchestration.processing.codec import ValueCodec
from laminar_orchestration.processing.contract import (
    NO_EVENT_TIME,
    BatchFold,
    EventTimeProgress,
    FoldContext,
)
from laminar_orchestration.processing.keyed import millis
from laminar_orchestration.processing.schema import InvalidSchema, StreamSchema

#: Event times are clamped here before the lateness is taken off (no int64 overflow before any event).
_FLOOR = -(2**62)
WINDOW_END = "_expires_at"


@dataclass(frozen=True)
class Tumbling:
    """Back-to-back windows of `size`, aligned to the epoch."""

    size: timedelta


@dataclass(frozen=True)
class Sliding:
    """Windows of `size` starting every `slide` (a multiple of it): each event is in size/slide windows."""

    size: timedelta
    slide: timedelta


def event_time_sql(stream: StreamSchema) -> str:
    """SQL of the event time as epoch milliseconds."""
    column = stream.input_schema.field(stream.event_time)
    if pa.types.is_timestamp(column.type):
        return f"unix_millis(`{stream.event_time}`)"
    return f"CAST(`{stream.event_time}` AS BIGINT)"


def with_watermark(batch: Any, stream: StreamSchema, progress: EventTimeProgress, lateness_ms: int) -> Any:
    """`batch` with ``_t`` (event time, ms), ``_wm`` (the watermark at the event) and ``_late``
    (its time is below that watermark).

    The watermark before an event is the largest event time up to it (committed or earlier in
    the batch, in offset order) minus the lateness: one ordered window over the batch.
    """
    base = max(progress.max_event_time, _FLOOR)
    timed = batch.selectExpr("*", f"{event_time_sql(stream)} AS _t")
    return timed.selectExpr(
        "*",
        f"greatest(max(_t) OVER (ORDER BY offset ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW), "
        f"CAST({base} AS BIGINT)) - {lateness_ms} AS _wm",
    ).selectExpr("*", "_t < _wm AS _late")


def progress_after(aggregate: pa.Table, before: EventTimeProgress) -> EventTimeProgress:
    """The progress after a watermarked batch: its ``_max_t`` (every event's time) and ``_late_events``."""
    if not aggregate.num_rows:
        return before
    late = int(pc.sum(aggregate["_late_events"]).as_py() or 0)
    return before.advanced_to(pc.max(aggregate["_max_t"]).as_py(), late=late)


def unbound_state(processor: object) -> None:
    """No state columns yet: a window processor's depend on the stream it is bound to."""
    object.__setattr__(processor, "state_schema", pa.schema([]))
    object.__setattr__(processor, "codec", ValueCodec(pa.schema([])))


def state_key(start: int, key: Any) -> str:
    return f"{start}|{key}"


class StreamBound:
    """An event-time processor's stream: None until `bind` (its state columns depend on the stream's
    types), read through `_stream`, which names the processor that was never bound."""

    name: str
    stream: StreamSchema | None

    @property
    def _stream(self) -> StreamSchema:
        if self.stream is None:
            raise InvalidSchema(f"processor {self.name!r}", "not bound to a stream yet (`bind`)")
        return self.stream


@dataclass(frozen=True)
class WindowedAggregation(StreamBound):
    """Per key and event-time window, the `aggregates` of its events; one final row per window."""

    name: str
    window: Tumbling | Sliding
    aggregates: tuple[Agg, ...]
    lateness: timedelta = timedelta(0)
    version: str = "1"
    #: The stream it runs on; None until `bind` (its state columns depend on the stream's types).
    stream: StreamSchema | None = None
    watermarked: bool = field(default=True, init=False)
    expiry_column: str | None = field(default=WINDOW_END, init=False)
    state_schema: pa.Schema = field(init=False, compare=False)
    codec: ValueCodec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        size = millis(self.window.size)
        slide = millis(self.window.slide) if isinstance(self.window, Sliding) else size
        if size <= 0 or slide <= 0 or size % slide:
            raise InvalidSchema(f"processor {self.name!r}", "window size must be a positive multiple of its slide")
        if millis(self.lateness) < 0:
            raise InvalidSchema(f"processor {self.name!r}", "lateness must not be negative")
        names = [a.name for a in self.aggregates]
        if not names or len(set(names)) != len(names):
            raise InvalidSchema(f"processor {self.name!r}", f"aggregates need distinct names, got {names}")
        unbound_state(self)
        if self.stream is None:
            return
        key_type = self._stream.input_schema.field(self._stream.key).type
        fields = [
            pa.field("window_key", key_type),
            pa.field("window_start", pa.int64(), nullable=False),
            pa.field(WINDOW_END, pa.int64(), nullable=False),
        ]
        for agg in self.aggregates:
            fields += agg.state_fields(self._stream)
        schema = pa.schema(fields)
        object.__setattr__(self, "state_schema", schema)
        object.__setattr__(self, "codec", ValueCodec(schema))

    @property
    def size_ms(self) -> int:
        return millis(self.window.size)

    @property
    def slide_ms(self) -> int:
        return millis(self.window.slide) if isinstance(self.window, Sliding) else self.size_ms

    def bind(self, schema: StreamSchema) -> WindowedAggregation:
        return replace(self, stream=schema)

    def output_schema(self) -> pa.Schema | None:
        return None

    # -- the Spark half -------------------------------------------------------------------

    def batch_aggregate(self, batch: Any, progress: EventTimeProgress) -> Any:
        size, slide = self.size_ms, self.slide_ms
        marked = with_watermark(batch, self._stream, progress, millis(self.lateness))
        # The k-th window back from the latest one holding the event (k = 0 counts its lateness once).
        exploded = marked.selectExpr("*", f"explode(sequence(0, {size // slide - 1})) AS _k").selectExpr(
            "*", f"(_t - pmod(_t, {slide})) - _k * {slide} AS _start"
        )
        exploded = exploded.selectExpr("*", f"`{self._stream.key}` AS _wkey")
        columns = [
            "count(1) FILTER (WHERE NOT _late) AS _n",
            "count(1) FILTER (WHERE _late AND _k = 0) AS _late_events",
            "max(_t) AS _max_t",
        ]
        for agg in self.aggregates:
            columns += agg.spark_exprs("NOT _late")
        grouped = exploded.groupBy("_wkey", "_start").agg(*[_expr(c) for c in columns])
        return grouped.selectExpr(
            "concat(CAST(_start AS STRING), '|', CAST(_wkey AS STRING)) AS key", "_wkey AS window_key", "*"
        ).drop("_wkey")

    # -- the node half ---------------------------------------------------------------------

    def fold(self, aggregate: pa.Table, previous: pa.Table, context: FoldContext) -> BatchFold:
        progress = progress_after(aggregate, context.progress)
        watermark = progress.watermark(millis(self.lateness))
        names = [f.name for f in self.state_schema]
        rows: dict[str, dict[str, Any]] = {}
        batch_rows = aggregate.to_pylist()
        old_rows = previous.to_pylist()
        for new, old in zip(batch_rows, old_rows, strict=True):
            if not new["_n"]:
                continue  # only late events touched it
            start = new["_start"]
            fresh = {
                "window_key": new["window_key"],
                "window_start": start,
                WINDOW_END: start + self.size_ms,
                **{n: new.get(n) for n in names if n not in ("window_key", "window_start", WINDOW_END)},
            }
            if old.get("window_start") is not None:
                fresh.update(merge_partials(self.aggregates, old, fresh))
            rows[new["key"]] = fresh
        closed: dict[str, dict[str, Any]] = {}
        if watermark != NO_EVENT_TIME:
            for key, row in list(rows.items()):
                if row[WINDOW_END] <= watermark:
                    closed[key] = rows.pop(key)
            for row in context.timers.due(watermark).to_pylist():
                if row["key"] not in closed:
                    closed[row.pop("key")] = row
        delta = pa.Table.from_pylist(
            [{"key": k, **v} for k, v in rows.items()],
            schema=pa.schema([pa.field("key", pa.string()), *self.state_schema]),
        )
        return BatchFold(
            delta=delta,
            output=self._output(list(closed.values()), context),
            deleted=pa.array(list(closed), pa.string()),
            progress=progress,
        )

    def _output(self, windows: list[dict[str, Any]], context: FoldContext) -> pa.Table:
        windows.sort(key=lambda w: (w["window_start"], str(w["window_key"])))
        key_type = self.state_schema.field("window_key").type
        columns: dict[str, pa.Array] = {
            "key": pa.array([w["window_key"] for w in windows], key_type),
            "window_start": pa.array([w["window_start"] for w in windows], pa.int64()).cast(pa.timestamp("ms", "UTC")),
            "window_end": pa.array([w[WINDOW_END] for w in windows], pa.int64()).cast(pa.timestamp("ms", "UTC")),
        }
        for agg in self.aggregates:
            field = self.state_schema.field(agg.name)
            columns[agg.name] = pa.array([agg.finish(w) for w in windows], field.type)
        n = len(windows)
        columns["epoch"] = pa.array([context.epoch] * n, pa.int64())
        columns["generation"] = pa.array([context.generation] * n, pa.int64())
        return pa.table(columns)


def _expr(sql: str) -> Any:
    from pyspark.sql import functions as F

    return F.expr(sql)
