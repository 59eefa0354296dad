"""Deduplication by an event id within a time-to-live: the first event of each id is emitted, later
ones are dropped until the id expires.

An id is remembered until the watermark passes its first emitted event's time plus `ttl`;
an event whose id is remembered at its own watermark is a duplicate. The rule follows the
log's order, event by event, so the result does not depend on batching, moves or failovers.
Late events (below the watermark that precedes them) are counted and dropped. Expired ids
leave the state at the commit that passes them, the removal in the commit's delta::

    Deduplicate(name="unique_orders", id_column="order_id", ttl=timedelta(hours=24))
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import pyarrow as pa

from laminar_orchestration.processing.codec import ValueCodec
from laminar_orchestration.processing.contract import NO_EVENT_TIME, BatchFold, EventTimeProgress, FoldContext
from laminar_orchestration.processing.keyed import millis
from laminar_orchestration.processing.schema import InvalidSchema, StreamSchema
from laminar_orchestration.processing.windows import WINDOW_END, StreamBound, progress_after, with_watermark


@dataclass(frozen=True)
class Deduplicate(StreamBound):
    """Emit each event whose `id_column` value was not emitted within `ttl` before it (in event time)."""

    name: str
    id_column: str
    ttl: timedelta
    lateness: timedelta = timedelta(0)
    version: str = "1"
    #: The stream it runs on; None until `bind` (its state columns depend on the stream's types).
    stream: StreamSchema | None = None
    watermarked: bool = field(default=True, init=False)
    expiry_column: str | None = field(default=WINDOW_END, init=False)
    state_schema: pa.Schema = field(init=False, compare=False)
    codec: ValueCodec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if millis(self.ttl) <= 0 or millis(self.lateness) < 0:
            raise InvalidSchema(f"processor {self.name!r}", "ttl must be positive and lateness not negative")
        schema = pa.schema([pa.field("first_seen", pa.int64()), pa.field(WINDOW_END, pa.int64(), nullable=False)])
        object.__setattr__(self, "state_schema", schema)
        object.__setattr__(self, "codec", ValueCodec(schema))

    def bind(self, schema: StreamSchema) -> Deduplicate:
        if self.id_column not in schema.input_schema.names:
            raise InvalidSchema(f"processor {self.name!r}", f"the stream has no id column {self.id_column!r}")
        return replace(self, stream=schema)

    def output_schema(self) -> pa.Schema | None:
        return None

    def batch_aggregate(self, batch: Any, progress: EventTimeProgress) -> Any:
        from pyspark.sql import functions as F

        marked = with_watermark(batch, self._stream, progress, millis(self.lateness))
        columns = ", ".join(f"`{f.name}`" for f in self._stream.input_schema)
        return marked.groupBy(F.expr(f"CAST(`{self.id_column}` AS STRING) AS key")).agg(
            F.expr("count(1) FILTER (WHERE _late) AS _late_events"),
            F.expr("max(_t) AS _max_t"),
            F.expr(
                f"array_sort(collect_list(struct(offset, _t, _wm, struct({columns}) AS event)) "
                "FILTER (WHERE NOT _late)) AS _events"
            ),
        )

    def fold(self, aggregate: pa.Table, previous: pa.Table, context: FoldContext) -> BatchFold:
        progress = progress_after(aggregate, context.progress)
        watermark = progress.watermark(millis(self.lateness))
        ttl = millis(self.ttl)
        emitted: list[tuple[int, dict[str, Any]]] = []
        remembered: dict[str, dict[str, int]] = {}
        for row, old in zip(aggregate.to_pylist(), previous.to_pylist(), strict=True):
            until = old.get(WINDOW_END)
            first = old.get("first_seen")
            changed = False
            for occurrence in row.get("_events") or []:
                if until is not None and until > occurrence["_wm"]:
                    continue  # a duplicate: the id is remembered at this event's watermark
                first, until, changed = occurrence["_t"], occurrence["_t"] + ttl, True
                emitted.append((occurrence["offset"], occurrence["event"]))
            if changed:
                assert first is not None and until is not None
                remembered[row["key"]] = {"first_seen": first, WINDOW_END: until}
        gone: list[str] = []
        if watermark != NO_EVENT_TIME:
            gone = [k for k in context.timers.due(watermark)["key"].to_pylist() if k not in remembered]
            for key in [k for k, v in remembered.items() if v[WINDOW_END] <= watermark]:
                remembered.pop(key)
                gone.append(key)
        delta = pa.Table.from_pylist(
            [{"key": k, **v} for k, v in remembered.items()],
            schema=pa.schema([pa.field("key", pa.string()), *self.state_schema]),
        )
        emitted.sort(key=lambda e: e[0])
        output = pa.Table.from_pylist([e for _, e in emitted], schema=self._stream.input_schema)
        n = output.num_rows
        output = output.append_column("offset", pa.array([o for o, _ in emitted], pa.int64()))
        output = output.append_column("epoch", pa.array([context.epoch] * n, pa.int64()))
        output = output.append_column("generation", pa.array([context.generation] * n, pa.int64()))
        return BatchFold(delta=delta, output=output, deleted=pa.array(gone, pa.string()), progress=progress)
