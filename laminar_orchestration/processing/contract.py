"""The processor contract: what a node asks of a processor for each batch, and what it gets back.

A batch runs in two halves. `Processor.batch_aggregate` runs on Spark over *the batch only*
and returns one row per touched state key (a ``key`` column plus the processor's
columns). `Processor.fold` runs on the node, vectorised over those keys: it gets their
previous values (null for a key the state does not hold), the stream's event-time
progress before the batch, and the state's timers (keys whose expiry time has come,
ordered by it), and returns the touched keys' new values (the delta), the keys it
removes, the output rows and the event-time progress after the batch. So a batch
costs O(batch + expired keys), never O(state).

Event time: the watermark an event is judged by is the largest event time seen up to
and including it (in log order) minus the processor's allowed lateness. An event
whose time is below it is *late*: counted, never applied. Because the rule follows
the log's order, not the batches', the result of a stream does not depend on how it
was batched, moved or failed over. The largest event time and the late count are
committed in the partition's manifest with the offset, so they move exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa

from laminar_orchestration.errors import InvalidInputError, OperationFailedError

if TYPE_CHECKING:
    from laminar_orchestration.processing.codec import ValueCodec
    from laminar_orchestration.processing.schema import StreamSchema

#: Event time before any event: below every int64 millisecond.
NO_EVENT_TIME = -(2**63)


@dataclass(frozen=True)
class EventTimeProgress:
    """How far a partition's event time has come, as committed with its offset."""

    #: The largest event time (epoch ms) of any event applied or found late; `NO_EVENT_TIME` before any.
    max_event_time: int = NO_EVENT_TIME
    #: Events found late (below the watermark) since the partition began.
    late_events: int = 0

    def watermark(self, lateness_ms: int) -> int:
        """The watermark after the events seen so far: windows ending at or before it are final."""
        if self.max_event_time == NO_EVENT_TIME:
            return NO_EVENT_TIME
        return self.max_event_time - lateness_ms

    def advanced_to(self, event_time: int | None, *, late: int = 0) -> EventTimeProgress:
        """The progress after a batch whose largest event time is `event_time` and which found `late` late events."""
        top = self.max_event_time if event_time is None else max(self.max_event_time, event_time)
        return EventTimeProgress(top, self.late_events + late)


class StateTimers(Protocol):
    """The state's expiry index, as a fold reads it."""

    def due(self, until: int, *, limit: int | None = None) -> pa.Table:
        """Key and value columns of every key whose expiry time is at or before `until`, oldest first."""
        ...


@dataclass(frozen=True)
class FoldContext:
    """What a fold knows besides the batch aggregate and the previous values."""

    epoch: int
    generation: int
    #: Committed before this batch.
    progress: EventTimeProgress
    timers: StateTimers
    #: The node's clock when the batch is folded (epoch ms), for processing-time expiry.
    processing_time_ms: int
    #: The batch's largest event time (epoch ms; from its files' statistics), None for an empty batch.
    batch_max_event_time: int | None = None

    @classmethod
    def at(cls, epoch: int, generation: int, timers: StateTimers | None = None) -> FoldContext:
        """A context for folding outside a node (tests, benchmarks, warm-up): no event time, no due keys."""
        return cls(epoch, generation, EventTimeProgress(), timers or NoTimers(), 0)


class NoTimers:
    """A state without due keys."""

    def due(self, until: int, *, limit: int | None = None) -> pa.Table:
        return pa.table({"key": pa.array([], pa.string())})


def _no_keys() -> pa.Array:
    return pa.array([], pa.string())


@dataclass(frozen=True)
class BatchFold:
    """One batch folded: the touched keys' full new values (the delta), removed keys, output rows."""

    delta: pa.Table
    output: pa.Table
    #: State keys removed by this batch (closed windows, expired keys), never also in `delta`.
    deleted: pa.Array = field(default_factory=_no_keys)
    #: Event-time progress after the batch (the same as before for a processor without event time).
    progress: EventTimeProgress = field(default_factory=EventTimeProgress)


#: A delta's marker column: true on a row that removes its key (its value columns are null).
DELETED_COLUMN = "_deleted"


def delta_with_removals(fold: BatchFold) -> pa.Table:
    """The delta a commit uploads: the new values, then one row per removed key marked `DELETED_COLUMN`."""
    if not len(fold.deleted):
        return fold.delta
    # A removal's value columns are null: every column of a delta with removals may be.
    nullable = pa.schema([pa.field(f.name, f.type, nullable=True) for f in fold.delta.schema])
    kept = fold.delta.cast(nullable).append_column(DELETED_COLUMN, pa.array([False] * fold.delta.num_rows, pa.bool_()))
    n = len(fold.deleted)
    removed = pa.table(
        [
            fold.deleted.cast(pa.string()),
            *(pa.nulls(n, f.type) for f in fold.delta.schema if f.name != "key"),
            pa.array([True] * n, pa.bool_()),
        ],
        schema=kept.schema,
    )
    return pa.concat_tables([kept, removed])


def split_delta(delta: pa.Table) -> tuple[pa.Table, pa.Array]:
    """A stored delta as (the keys' new values, the removed keys)."""
    if DELETED_COLUMN not in delta.column_names:
        return delta, pa.array([], pa.string())
    import pyarrow.compute as pc

    marks = delta[DELETED_COLUMN]
    upserts = delta.filter(pc.invert(marks)).drop_columns([DELETED_COLUMN])
    removed = delta.filter(marks)["key"].combine_chunks()
    return upserts, removed


class ProcessorFailed(OperationFailedError):
    """The processor's own code raised on a batch: nothing of the batch is committed, and the
    partition stays failed (the same events would fail the same way) until it is moved or its node
    restarts with a fixed processor."""

    processor: str
    offset: int
    error: str

    message = "processor {processor!r} raised on the batch at offset {offset}: {error}"


#: Spark's errors of a query's own making (a wrong column, the user's Python raising): deterministic.
SPARK_PROCESSOR_ERRORS = frozenset({"AnalysisException", "PythonException", "ArithmeticException"})


def processor_error(exc: BaseException) -> bool:
    """Whether `exc`, raised by a processor's Spark half, is the processor's doing (not a lost executor)."""
    return any(c.__name__ in SPARK_PROCESSOR_ERRORS for c in type(exc).__mro__)


class MergeResultInvalid(InvalidInputError, ValueError):
    """A processor's merge broke the contract: one row per touched key, every state column."""

    processor: str
    expected_rows: int
    rows: int
    columns: list[str]
    missing: list[str]

    message = (
        "processor {processor!r}: merge must return {expected_rows} rows with columns "
        "{columns}; got {rows} rows, missing {missing}"
    )


@runtime_checkable
class Processor(Protocol):
    """A stream's logic, as a node runs it. `KeyedProcessor` and the window processors implement it."""

    # Read-only members: processors are frozen values.
    @property
    def name(self) -> str:
        """Names the logic in the cluster's record, logs and errors."""
        ...

    @property
    def version(self) -> str:
        """Changes when the logic changes meaning; part of the processor's fingerprint."""
        ...

    @property
    def state_schema(self) -> pa.Schema:
        """The state's value columns (without ``key``): any Arrow types."""
        ...

    @property
    def expiry_column(self) -> str | None:
        """The int64 value column (epoch ms) the state indexes as each key's expiry time, or None."""
        ...

    @property
    def watermarked(self) -> bool:
        """Whether `batch_aggregate` judges lateness by the progress it is given (a batch started with
        another progress than the committed one is then started again)."""
        ...

    @property
    def codec(self) -> ValueCodec:
        """Encodes the stored value columns (`state_schema`, plus any hidden ones)."""
        ...

    def bind(self, schema: StreamSchema) -> Processor:
        """This processor for a stream of `schema`; raises `InvalidInputError` when it cannot run on it."""
        ...

    def batch_aggregate(self, batch: Any, progress: EventTimeProgress) -> Any:
        """Spark half: the batch's per-state-key aggregate (a DataFrame with a ``key`` column)."""
        ...

    def fold(self, aggregate: pa.Table, previous: pa.Table, context: FoldContext) -> BatchFold:
        """Node half: new values, removals, output and progress for the touched keys."""
        ...

    def output_schema(self) -> pa.Schema | None:
        """The output rows' schema when the processor knows it before the first batch (None: it doesn't)."""
        ...
