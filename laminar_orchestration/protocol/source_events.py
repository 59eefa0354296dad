"""Events handed to the source log: the `SourceEvent` record, the checks every appended event
passes, and the partition each one goes to."""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, field_validator

from laminar_orchestration.identity import MAX_PARTITIONS
from laminar_orchestration.processing.schema import EventsDoNotMatchSchema
from laminar_orchestration.protocol.source_errors import InvalidEvents

#: Columns of every Parquet payload, in this order.
EVENT_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("ts", pa.int64(), nullable=False),
    ]
)
#: The columns of events handed in, once checked: the stored ones but the offset, which the log assigns.
_INPUT_SCHEMA = pa.schema([f for f in EVENT_SCHEMA if f.name != "offset"])

#: Range of the int64 columns (``offset``, ``ts``): a larger number cannot be stored.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Longest event key, in UTF-8 bytes: keys are state-store keys, not payloads.
MAX_KEY_BYTES = 1024


# --- the event ----------------------------------------------------------------


class SourceEvent(BaseModel):
    """One input event. Strict: no string-to-number coercion, no bools, no extra fields.

    Every field is range-checked so that a valid event always fits the event
    schema: `partition` below `MAX_PARTITIONS`, `key` at most `MAX_KEY_BYTES`
    UTF-8 bytes, `value` finite (ints are stored as float64), `ts` epoch millis
    within int64; None means "stamp with the append time".
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    partition: int = Field(ge=0, lt=MAX_PARTITIONS)
    key: str
    value: float = Field(allow_inf_nan=False)
    ts: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)

    @field_validator("key")
    @classmethod
    def _key_fits(cls, key: str) -> str:
        try:
            size = len(key.encode("utf-8"))
        except UnicodeEncodeError as exc:
            # A lone surrogate ("a\ud800") is a Python str but no UTF-8 string: the log could not store it.
            raise ValueError(f"key is not valid Unicode: lone surrogate at index {exc.start}") from None
        if size > MAX_KEY_BYTES:
            raise ValueError(f"key is {size} bytes long, at most {MAX_KEY_BYTES} are allowed")
        return key

    @field_validator("value")
    @classmethod
    def _value_is_finite(cls, value: float) -> float:
        # An int literal beyond float range becomes inf on conversion, past allow_inf_nan.
        if not math.isfinite(value):
            raise ValueError("value must be a finite number")
        return value


# --- checks -------------------------------------------------------------------


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def invalid_utf8_row(values: pa.Array | pa.ChunkedArray) -> int | None:
    """Index of the first value of string array `values` that is not valid UTF-8; None when all are.

    pyarrow builds string arrays from bytes without checking them (a Parquet file's string column, a
    cast with ``safe=False``). One vectorised validation of the whole array; only when it fails, a
    bisection over slices (each validated the same way) finds the row.
    """
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    base = 0
    for chunk in chunks:
        try:
            chunk.validate(full=True)
        except pa.ArrowInvalid:
            lo, hi = 0, len(chunk)  # the first invalid value is in [lo, hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                try:
                    chunk.slice(lo, mid - lo).validate(full=True)
                    lo = mid
                except pa.ArrowInvalid:
                    hi = mid
            return base + lo
        base += len(chunk)
    return None


def normalize_events(partition: int, events: Sequence[SourceEvent] | pa.Table) -> pa.Table:
    """Validate and convert events into a table with columns key, value, ts (no offsets).

    A table needs columns ``key`` (string, valid UTF-8) and ``value`` (integer or float); ``ts``
    (integer millis or timestamp) is optional and nulls in it are stamped with the
    current time; a ``partition`` column, if present, must equal `partition`. An
    ``offset`` column is rejected: offsets are assigned by the log. A key that is not valid UTF-8
    (Arrow strings are unchecked bytes) or holds a lone surrogate raises `InvalidEvents` naming its row.
    """
    if isinstance(events, pa.Table):
        return _normalize_table(partition, events)
    for i, ev in enumerate(events):
        if not isinstance(ev, SourceEvent):
            raise InvalidEvents(partition, f"event {i} is {type(ev).__name__}, not SourceEvent")
        if ev.partition != partition:
            raise InvalidEvents(partition, f"event {i} belongs to partition {ev.partition}")
    # One pass per column; SourceEvent was validated on construction (unless built by `model_construct`).
    try:
        keys = pa.array([ev.key for ev in events], pa.string())
    except UnicodeEncodeError:
        row = next(i for i, ev in enumerate(events) if not _encodes(ev.key))
        raise InvalidEvents(
            partition, f"key of event {row} is not valid Unicode (lone surrogate)", row, "key"
        ) from None
    table = pa.table(
        {
            "key": keys,
            "value": pa.array([ev.value for ev in events], pa.float64()),
            "ts": pa.array([ev.ts for ev in events], pa.int64()),
        }
    )
    return _normalize_table(partition, table)


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _normalize_table(partition: int, table: pa.Table) -> pa.Table:
    names = set(table.column_names)
    unknown = names - {"key", "value", "ts", "partition"}
    if unknown:
        hint = "; offsets are assigned by the log" if "offset" in unknown else ""
        raise InvalidEvents(partition, f"unexpected column(s) {sorted(unknown)}{hint}")
    missing = {"key", "value"} - names
    if missing:
        raise InvalidEvents(partition, f"missing column(s) {sorted(missing)}")
    n = table.num_rows

    if "partition" in names:
        col = table.column("partition")
        if not pa.types.is_integer(col.type):
            raise InvalidEvents(partition, f"column 'partition' has type {col.type}, not integer")
        if col.null_count or (n and not pc.all(pc.equal(col, partition)).as_py()):
            raise InvalidEvents(partition, "column 'partition' holds other partitions or nulls")

    key = table.column("key")
    stringy = pa.types.is_string(key.type) or pa.types.is_large_string(key.type)
    if not stringy and not (pa.types.is_dictionary(key.type) and pa.types.is_string(key.type.value_type)):
        raise InvalidEvents(partition, f"column 'key' has type {key.type}, not string")
    key = key if key.type == pa.string() else pc.cast(key, pa.string())  # a cast to its own type does nothing
    if key.null_count:
        raise InvalidEvents(partition, f"column 'key' has {key.null_count} null(s)")
    # Arrow strings are bytes nobody checked (a Parquet file's, a cast's): a key that is not UTF-8 would
    # enter the immutable log, and every batch reading it would fail.
    bad = invalid_utf8_row(key)
    if bad is not None:
        raw = pc.cast(key, pa.binary())[bad].as_py()
        raise InvalidEvents(partition, f"column 'key', row {bad}: {raw[:64]!r} is not valid UTF-8", bad, "key")

    value = table.column("value")
    if not (pa.types.is_integer(value.type) or pa.types.is_floating(value.type)):
        raise InvalidEvents(partition, f"column 'value' has type {value.type}, not a number")
    try:
        value = value if value.type == pa.float64() else pc.cast(value, pa.float64())
    except pa.ArrowInvalid as exc:
        raise InvalidEvents(partition, f"column 'value': {exc}") from exc
    if value.null_count:
        raise InvalidEvents(partition, f"column 'value' has {value.null_count} null(s)")
    if n and not pc.all(pc.is_finite(value)).as_py():
        raise InvalidEvents(partition, "column 'value' holds NaN or infinity")

    if "ts" in names:
        ts = table.column("ts")
        if pa.types.is_timestamp(ts.type):
            ts = pc.cast(pc.cast(ts, pa.timestamp("ms")), pa.int64())
        elif pa.types.is_integer(ts.type) or pa.types.is_null(ts.type):
            try:
                ts = ts if ts.type == pa.int64() else pc.cast(ts, pa.int64())
            except pa.ArrowInvalid as exc:
                raise InvalidEvents(partition, f"column 'ts': {exc}") from exc
        else:
            raise InvalidEvents(partition, f"column 'ts' has type {ts.type}, not integer millis")
        if ts.null_count:
            ts = pc.fill_null(ts, _now_ms())
    else:
        ts = pa.array(np.full(n, _now_ms(), dtype=np.int64))

    return pa.Table.from_arrays([key, value, ts], schema=_INPUT_SCHEMA)


# --- tables and partitions -----------------------------------------------------


def route(keys: pa.Array | pa.ChunkedArray, partitions: int) -> np.ndarray:
    """Each key's partition: ``zlib.crc32`` of its UTF-8 text (an integer key: its decimal text, so
    ``7`` and ``"7"`` agree) modulo `partitions`. A key's events always land in one partition, so its
    state stays there; the same key routes the same way in every producer and every version. A null
    key (no stream allows one) routes to partition 0."""
    text = pc.cast(keys, pa.string())
    encoded = pc.dictionary_encode(text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text)
    # One CRC per distinct key: streams repeat their keys.
    each = np.array(
        [zlib.crc32(k.encode()) % partitions for k in encoded.dictionary.to_pylist()] or [0], dtype=np.int64
    )
    indices = pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)
    routed: np.ndarray = np.where(pc.is_valid(encoded).to_numpy(zero_copy_only=False), each[indices], 0)
    return routed


def partition_numbers(column: pa.Array | pa.ChunkedArray, partitions: int) -> np.ndarray:
    """A ``partition`` column's values, each an integer within 0..`partitions` - 1, or
    `EventsDoNotMatchSchema` naming the first row that is not."""
    if not pa.types.is_integer(column.type):
        raise EventsDoNotMatchSchema("partition", None, f"has type {column.type}, not an integer")
    values = column.to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(~pc.is_valid(column).to_numpy(zero_copy_only=False))
    if not bad.size:
        bad = np.flatnonzero((values < 0) | (values >= partitions))
    if bad.size:
        row = int(bad[0])
        raise EventsDoNotMatchSchema("partition", row, f"{column[row].as_py()} is not within 0..{partitions - 1}")
    numbers: np.ndarray = values.astype(np.int64)
    return numbers


def as_table(partition: int, events: object) -> pa.Table:
    """Events as a pyarrow Table: a Table as it is, a pandas DataFrame or a polars DataFrame converted."""
    if isinstance(events, pa.Table):
        return events
    to_arrow = getattr(events, "to_arrow", None)
    if callable(to_arrow):  # polars
        converted = to_arrow()
        if isinstance(converted, pa.Table):
            return converted
    if type(events).__module__.startswith("pandas"):
        return pa.Table.from_pandas(events, preserve_index=False)
    raise InvalidEvents(
        partition, f"events are {type(events).__name__}; give a pyarrow Table or a pandas/polars DataFrame"
    )
