"""Session windows: a key's events closer than `gap` to each other in event time form one session,
emitted once when the watermark passes its last event plus the gap.

The state holds each key's open sessions (usually one; more while out-of-order events may
still bridge them), indexed by the earliest time one of them closes. A batch's events are
grouped into sessions on Spark, merged with the stored ones on the node (two sessions
closer than the gap become one, their aggregates merged), and the sessions the watermark
closes are emitted and removed. Late events - below the watermark that precedes them - are
counted and never applied, so an emitted session never changes::

    SessionWindows(
        name="sessions",
        gap=timedelta(minutes=30),
        lateness=timedelta(minutes=1),
        aggregates=(Agg.count("clicks"), Agg("pages", "collect_set", "page"), Agg("entry", "first", "page")),
    )
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import pyarrow as pa

from laminar_orchestration.processing.aggregates import Agg, merge_partials
from laminar_orchestration.processing.codec import ValueCodec
from laminar_orchestration.processing.contract import NO_EVENT_TIME, BatchFold, EventTimeProgress, FoldContext
from laminar_orchestration.processing.keyed import millis
from laminar_orchestration.processing.schema import InvalidSchema, StreamSchema
from laminar_orchestration.processing.windows import (
    WINDOW_END,
    StreamBound,
    progress_after,
    unbound_state,
    with_watermark,
)


@dataclass(frozen=True)
class SessionWindows(StreamBound):
    """Per key, sessions of events less than `gap` apart; one final row per session."""

    name: str
    gap: timedelta
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
        if millis(self.gap) <= 0 or millis(self.lateness) < 0:
            raise InvalidSchema(f"processor {self.name!r}", "gap must be positive and lateness not negative")
        names = [a.name for a in self.aggregates]
        if not names or len(set(names)) != len(names):
            raise InvalidSchema(f"processor {self.name!r}", f"aggregates need distinct names, got {names}")
        unbound_state(self)
        if self.stream is None:
            return
        session_fields = [pa.field("start", pa.int64()), pa.field("last", pa.int64())]
        for agg in self.aggregates:
            session_fields += agg.state_fields(self._stream)
        schema = pa.schema(
            [
                pa.field("session_key", self._stream.input_schema.field(self._stream.key).type),
                pa.field("sessions", pa.list_(pa.struct(session_fields))),
                pa.field(WINDOW_END, pa.int64(), nullable=False),
            ]
        )
        object.__setattr__(self, "state_schema", schema)
        object.__setattr__(self, "codec", ValueCodec(schema))

    def bind(self, schema: StreamSchema) -> SessionWindows:
        return replace(self, stream=schema)

    def output_schema(self) -> pa.Schema | None:
        return None

    # -- the Spark half: the batch's own sessions per key ------------------------------------

    def batch_aggregate(self, batch: Any, progress: EventTimeProgress) -> Any:
        from pyspark.sql import functions as F

        gap = millis(self.gap)
        marked = with_watermark(batch, self._stream, progress, millis(self.lateness)).selectExpr(
            "*", f"`{self._stream.key}` AS _skey"
        )
        key = "_skey"
        timely = marked.where("NOT _late").selectExpr(
            "*",
            f"CASE WHEN _t - lag(_t) OVER (PARTITION BY {key} ORDER BY _t, offset) < {gap} THEN 0 ELSE 1 END AS _new",
        )
        numbered = timely.selectExpr(
            "*", f"sum(_new) OVER (PARTITION BY {key} ORDER BY _t, offset ROWS UNBOUNDED PRECEDING) AS _sid"
        )
        columns = ["min(_t) AS start", "max(_t) AS last"]
        for agg in self.aggregates:
            columns += agg.spark_exprs("TRUE")
        sessions = numbered.groupBy(key, "_sid").agg(*[F.expr(c) for c in columns])
        names = ["start", "last", *(f.name for a in self.aggregates for f in a.state_fields(self._stream))]
        per_key = sessions.groupBy(key).agg(
            F.expr(f"array_sort(collect_list(struct({', '.join(f'`{n}`' for n in names)}))) AS _sessions")
        )
        # Keys with late events only still report them; their session list is empty.
        counts = marked.groupBy(key).agg(
            F.expr("count(1) FILTER (WHERE _late) AS _late_events"), F.expr("max(_t) AS _max_t")
        )
        joined = counts.join(per_key, on=key, how="left")
        return joined.selectExpr(
            "CAST(_skey AS STRING) AS key", "_skey AS session_key", "_late_events", "_max_t", "_sessions"
        )

    # -- the node half ------------------------------------------------------------------------

    def fold(self, aggregate: pa.Table, previous: pa.Table, context: FoldContext) -> BatchFold:
        progress = progress_after(aggregate, context.progress)
        watermark = progress.watermark(millis(self.lateness))
        gap = millis(self.gap)
        rows: dict[str, dict[str, Any]] = {}
        for new, old in zip(aggregate.to_pylist(), previous.to_pylist(), strict=True):
            batch_sessions = new.get("_sessions") or []
            if not batch_sessions:
                continue
            stored = old.get("sessions") or []
            rows[new["key"]] = {
                "session_key": new["session_key"],
                "sessions": self._merge(stored + batch_sessions, gap),
            }
        closed: list[tuple[Any, dict[str, Any]]] = []
        if watermark != NO_EVENT_TIME:
            due = {row["key"]: row for row in context.timers.due(watermark).to_pylist()}
            for key, row in due.items():
                rows.setdefault(key, {"session_key": row["session_key"], "sessions": row["sessions"]})
            for row in rows.values():
                keep = []
                for s in row["sessions"]:
                    (closed.append((row["session_key"], s)) if s["last"] + gap <= watermark else keep.append(s))
                row["sessions"] = keep
        upserts = {k: v for k, v in rows.items() if v["sessions"]}
        for row in upserts.values():
            row[WINDOW_END] = min(s["last"] for s in row["sessions"]) + gap
        deleted = [k for k, v in rows.items() if not v["sessions"]]
        delta = pa.Table.from_pylist(
            [{"key": k, **v} for k, v in upserts.items()],
            schema=pa.schema([pa.field("key", pa.string()), *self.state_schema]),
        )
        return BatchFold(
            delta=delta,
            output=self._output(closed, gap, context),
            deleted=pa.array(deleted, pa.string()),
            progress=progress,
        )

    def _merge(self, sessions: list[dict[str, Any]], gap: int) -> list[dict[str, Any]]:
        """Sessions closer than `gap` merged into one, in start order."""
        merged: list[dict[str, Any]] = []
        for s in sorted(sessions, key=lambda s: (s["start"], s["last"])):
            if merged and s["start"] - merged[-1]["last"] < gap:
                a = merged[-1]
                merged[-1] = {
                    "start": min(a["start"], s["start"]),
                    "last": max(a["last"], s["last"]),
                    **merge_partials(self.aggregates, a, s),
                }
            else:
                merged.append(dict(s))
        return merged

    def _output(self, closed: list[tuple[Any, dict[str, Any]]], gap: int, context: FoldContext) -> pa.Table:
        closed.sort(key=lambda c: (c[1]["start"], str(c[0])))
        key_type = self.state_schema.field("session_key").type
        session_type = self.state_schema.field("sessions").type.value_type
        columns: dict[str, pa.Array] = {
            "key": pa.array([k for k, _ in closed], key_type),
            "session_start": pa.array([s["start"] for _, s in closed], pa.int64()).cast(pa.timestamp("ms", "UTC")),
            "session_end": pa.array([s["last"] + gap for _, s in closed], pa.int64()).cast(pa.timestamp("ms", "UTC")),
        }
        for agg in self.aggregates:
            columns[agg.name] = pa.array([agg.finish(s) for _, s in closed], session_type.field(agg.name).type)
        n = len(closed)
        columns["epoch"] = pa.array([context.epoch] * n, pa.int64())
        columns["generation"] = pa.array([context.generation] * n, pa.int64())
        return pa.table(columns)
