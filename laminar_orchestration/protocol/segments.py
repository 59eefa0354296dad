"""Source events and segments: validation and normalisation of appended events, and the
segment encoding the source log stores (`protocol.source`)."""

from __future__ import annotations

import bisect
import functools
import math
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator

from laminar_orchestration.errors import CorruptDataError, InvalidInputError, LaminarError
from laminar_orchestration.identity import MAX_PARTITIONS
from laminar_orchestration.protocol.framing import FLAG_PUBLISHED, HEADER_SIZE, FrameHeader, iter_frames
from laminar_orchestration.protocol.keys import segment_key

#: Columns of every Parquet payload, in this order.
EVENT_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("ts", pa.int64(), nullable=False),
    ]
)
_INPUT_SCHEMA = pa.schema([f for f in EVENT_SCHEMA if f.name != "offset"])
_WRITE_ID_META = b"laminar.write_id"
#: The epoch field of source frames: the input log is not owned by a partition epoch,
#: and epoch 0 is the reserved "no ownership" value.
SOURCE_FRAME_EPOCH = 0


#: Range of the int64 columns (``offset``, ``ts``): a larger number cannot be stored.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Longest event key, in UTF-8 bytes: keys are state-store keys, not payloads.
MAX_KEY_BYTES = 1024
#: Longest JSONL input line, in bytes (newline excluded); lines are read with this bound.
MAX_LINE_BYTES = 1024 * 1024
#: Events per Parquet row group of a segment. Spark splits a file only between row groups: a
#: large segment in several groups is scanned by every core, not by one task.
ROW_GROUP_EVENTS = 131_072
#: Columns a segment dictionary-encodes: keys and timestamps repeat, offsets and values rarely do.
SEGMENT_DICTIONARY_COLUMNS = ["key", "ts"]


# --- errors -------------------------------------------------------------------


class SourceError(LaminarError):
    """Base of source-log errors."""


class SourceNotWritable(SourceError, InvalidInputError):
    """An append through a log opened without the `SourceAppender` capability (a node's reading log)."""

    partition: int

    message = "cannot append to partition {partition}: this source log reads only (no SourceAppender)"


class OffsetNotAtSegmentBoundary(SourceError, InvalidInputError):
    """`offset` is neither the start of a segment nor the end of the log (`log_end`)."""

    partition: int
    offset: int
    log_end: int

    def _message(self) -> str:
        where = "beyond the end of" if self.offset > self.log_end else "inside a segment of"
        return (
            f"source offset {self.offset} is {where} partition {self.partition} "
            f"(log end {self.log_end}); committed offsets must be segment boundaries"
        )


class CorruptSegment(SourceError, CorruptDataError):
    """A segment object that does not decode into the expected frames and events."""

    key: str
    reason: str

    message = "corrupt source segment {key!r}: {reason}"


class CorruptSourceHead(SourceError, CorruptDataError):
    """A head pointer that does not parse (or moved backwards). Nothing overwrites it."""

    key: str
    reason: str

    message = "corrupt source head {key!r}: {reason}"


class InvalidEvents(SourceError, InvalidInputError):
    """Events handed to `SourceLog.append` that do not fit the event schema.

    `row` (0-based, in the events handed in) and `column` name the offending value when one does.
    """

    partition: int
    reason: str
    row: int | None = None
    column: str | None = None

    message = "invalid events for partition {partition}: {reason}"


class UndecodableSegment(SourceError, CorruptDataError):
    """A segment whose events cannot be decoded: a key that is not valid UTF-8, or unreadable column data.

    `append` never writes one (it validates every key); it comes from a segment written before that
    check, or by a writer that bypassed `append`. It is permanent: reading the segment again fails
    the same way, so a node does not restart the partition (`Node`), and nothing of it is skipped.
    `key` is the segment's object key, `start_offset` its first offset, `offset` the offending event's.
    """

    partition: int
    key: str
    start_offset: int
    offset: int
    reason: str

    message = (
        "undecodable source segment {key!r} (partition {partition}, segment at offset "
        "{start_offset}): event at offset {offset}: {reason}; every read of it fails the same way"
    )


class PartitionOutOfRange(SourceError, InvalidInputError):
    """A partition id below 0 or not below the configured partition count."""

    partition: int
    partitions: int | None

    def _message(self) -> str:
        limit = f"0..{self.partitions - 1}" if self.partitions is not None else ">= 0"
        return f"partition {self.partition} out of range (expected {limit})"


class BadInputLine(SourceError, InvalidInputError):
    """A JSONL input line that is not a valid `SourceEvent`; nothing of the file was appended."""

    path: str
    line_number: int
    reason: str

    message = "{path}, line {line_number}: {reason} (nothing from this file was appended)"


class InputFileError(SourceError, InvalidInputError):
    """An input file that cannot be read (missing, a directory, no permission); nothing was appended."""

    path: str
    reason: str

    message = "cannot read input file {path}: {reason} (nothing was appended)"


# --- records and values ---------------------------------------------------------


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


class SourceHead(BaseModel):
    """The producers' CAS pointer: offsets below `next_offset` are all covered by segments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    next_offset: int = Field(ge=0)
    segments: int = Field(ge=0)
    updated_at: datetime
    #: Makes every head write's bytes unique, so a retry layer's read-back can tell
    #: our write from an equal-looking one (and S3 ETags, MD5s, never repeat).
    write_id: str = Field(default_factory=lambda: secrets.token_hex(8))


class LogEnds(BaseModel):
    """Each partition's log end as producers recorded it after their appends (`keys.LOG_ENDS_KEY`).

    A hint merged by compare-and-swap, never ahead of the segments: a producer records an end
    only after the segments below it exist. It may lag (a producer that died before recording),
    so a node that waits on it still polls each log now and then.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    ends: dict[int, int]
    updated_at: datetime
    write_id: str = Field(default_factory=lambda: secrets.token_hex(8))


@dataclass(frozen=True)
class SegmentRef:
    """One segment: events [start_offset, end_offset) of `partition`, stored under `key`."""

    key: str
    partition: int
    start_offset: int
    end_offset: int

    @property
    def events(self) -> int:
        """Number of events in the segment."""
        return self.end_offset - self.start_offset


@dataclass(frozen=True)
class AppendResult:
    """What one `append` wrote.

    `segments` are exactly the segments this call created. With concurrent
    producers other producers' segments may lie between them, so
    [first_offset, next_offset) can hold more than this call's events.
    For an empty append both offsets are the log end and `segments` is empty.
    """

    partition: int
    first_offset: int
    next_offset: int
    segments: tuple[SegmentRef, ...]

    @property
    def events(self) -> int:
        """Number of events this call appended."""
        return sum(s.events for s in self.segments)


def _read_payload(payload: bytes, columns: list[str] | None = None) -> pa.Table:
    # ParquetFile reads an in-memory file in a third of the time `pq.read_table` takes (it sets up a dataset
    # per call): a batch holds a payload per segment, and a small batch has many.
    return pq.ParquetFile(pa.BufferReader(payload)).read(columns=columns)


@dataclass(frozen=True)
class SourceBatch:
    """Whole consecutive segments [start_offset, end_offset) of one partition.

    `payloads` are the Parquet files (one per frame, in offset order).
    """

    partition: int
    start_offset: int
    end_offset: int
    segment_keys: tuple[str, ...]
    payloads: tuple[bytes, ...]
    #: The first offset of each segment of `segment_keys` (empty if the batch was built without them).
    segment_starts: tuple[int, ...] = ()
    #: The stream's key column, and the columns of its stored events.
    key_column: str = "key"
    event_schema: pa.Schema = EVENT_SCHEMA

    @property
    def events(self) -> int:
        """Number of events in the batch."""
        return self.end_offset - self.start_offset

    def undecodable(self) -> UndecodableSegment | None:
        """The batch's first event that cannot be decoded, as the error it fails with; None if all decode.

        An event does not decode when its key is not valid UTF-8 or its Parquet column data is
        unreadable. Decodes every payload: meant for a batch that failed, to tell a poison segment
        (it fails every time) from a failure a retry may get past.
        """
        offset = self.start_offset
        for payload in self.payloads:
            try:
                file = pq.ParquetFile(pa.BufferReader(payload))
                rows = file.metadata.num_rows
                keys = file.read().column(self.key_column)
            except (pa.ArrowException, OSError, KeyError) as exc:
                return self._undecodable(offset, f"unreadable events: {exc}")
            row = invalid_utf8_row(keys) if pa.types.is_string(keys.type) else None
            if row is not None:
                raw = keys.cast(pa.binary())[row].as_py()
                return self._undecodable(offset + row, f"key {raw[:64]!r} is not valid UTF-8")
            offset += rows
        return None

    def _undecodable(self, offset: int, reason: str) -> UndecodableSegment:
        # The segment holding `offset`: the last one starting at or before it.
        i = max(0, bisect.bisect_right(self.segment_starts, offset) - 1)
        starts = self.segment_starts or (self.start_offset,)
        key = self.segment_keys[i] if i < len(self.segment_keys) else segment_key(self.partition, starts[i])
        return UndecodableSegment(self.partition, key, starts[i], offset, reason)

    def write_parquet(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Write each payload as a Parquet file into `directory` (created if needed).

        Files are named by partition, batch start and index, so batches can share a
        directory. Each is written under a dot-name and renamed, so Spark (which
        ignores dot-files) never reads a half-written file.
        """
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        paths: list[Path] = []
        for i, payload in enumerate(self.payloads):
            final = out / f"part-{self.partition:05d}-{self.start_offset:020d}-{i:04d}.parquet"
            tmp = out / f".{final.name}.{secrets.token_hex(4)}.tmp"
            tmp.write_bytes(payload)
            os.replace(tmp, final)
            paths.append(final)
        return paths

    def keys(self) -> pa.Array:
        """The distinct keys of the batch's events (only the ``key`` column is decoded)."""
        k = self.key_column
        columns = [pc.cast(_read_payload(p, columns=[k])[k], pa.string()) for p in self.payloads]
        if not columns:
            return pa.array([], pa.string())
        return pc.unique(pa.chunked_array([c for column in columns for c in column.chunks], pa.string()))

    def to_table(self) -> pa.Table:
        """All events of the batch as one pyarrow Table with the stream's `event_schema`."""
        tables = [_read_payload(p).replace_schema_metadata(None) for p in self.payloads]
        if not tables:
            return self.event_schema.empty_table()
        table = pa.concat_tables(tables)
        # Parquet keeps second timestamps as milliseconds: back to the stream's own types (exact).
        if table.schema.types != self.event_schema.types:
            table = table.cast(self.event_schema)
        return table


# --- event normalization and segment encoding ----------------------------------


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


def encode_segment(
    partition: int,
    start_offset: int,
    table: pa.Table,
    *,
    generation: int = 0,
    frame_events: int | None = None,
    write_id: str | None = None,
    event_schema: pa.Schema = EVENT_SCHEMA,
    dictionary_columns: Sequence[str] = SEGMENT_DICTIONARY_COLUMNS,
) -> bytes:
    """Encode normalized events (see `normalize_events`) as a segment at `start_offset`.

    One frame per `frame_events` events (all in one frame if None). `write_id`
    goes into the Parquet metadata so that two producers' segments never have
    equal bytes: a producer recognises its own create-only write by its bytes.
    """
    n = table.num_rows
    if n == 0:
        raise ValueError("a segment holds at least one event")
    step = frame_events or n
    offsets = pa.array(np.arange(start_offset, start_offset + n, dtype=np.int64))
    full = pa.Table.from_arrays([offsets, *table.columns], schema=event_schema)
    meta = {_WRITE_ID_META: (write_id or secrets.token_hex(8)).encode()}
    parts: list[bytes | pa.Buffer] = []
    for lo in range(0, n, step):
        sink = pa.BufferOutputStream()
        pq.write_table(
            full.slice(lo, step).replace_schema_metadata(meta),
            sink,
            row_group_size=ROW_GROUP_EVENTS,
            # A dictionary tried on every column in every row group triples a large segment's encoding.
            use_dictionary=list(dictionary_columns),
        )
        payload = sink.getvalue()
        header = FrameHeader(
            length=payload.size,
            epoch=SOURCE_FRAME_EPOCH,
            generation=generation,
            partition=partition,
            flags=FLAG_PUBLISHED,
        )
        parts += [header.pack(), payload]
    return b"".join(parts)  # one copy: join takes the pyarrow buffers directly


@dataclass(frozen=True)
class _Segment:
    key: str
    start_offset: int
    payloads: tuple[bytes, ...]
    rows: int


@functools.lru_cache(maxsize=16)
def stored_types(schema: pa.Schema) -> tuple[pa.DataType, ...]:
    """The column types a Parquet footer shows for events of `schema` (Parquet has no second
    timestamps: they are stored as milliseconds), found by writing an empty file once."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    return tuple(pq.read_metadata(pa.BufferReader(sink.getvalue())).schema.to_arrow_schema().types)


def decode_segment(
    key: str, data: bytes, *, partition: int, start_offset: int, schema: pa.Schema = EVENT_SCHEMA
) -> list[tuple[memoryview, int]]:
    """Check a segment's frames and Parquet footers; return `(payload, rows)` per frame.

    Every frame must hold the columns of `schema` (the stream's `event_schema`: the log's
    ``offset``, then the stream's columns) with their types. Decodes no column data: only the
    footer's schema, row counts and the ``offset`` column's min/max statistics, which must
    continue exactly from `start_offset`. Raises `FrameError` (torn/corrupt frame) or `CorruptSegment`.
    """
    frames: list[tuple[memoryview, int]] = []
    expected = start_offset
    pos = 0
    names, types = schema.names, stored_types(schema)
    for _header, payload in iter_frames(data, source=key, expected_partition=partition):
        try:
            md = pq.read_metadata(pa.BufferReader(pa.py_buffer(payload)))
            stored = md.schema.to_arrow_schema()
        except (pa.ArrowException, OSError) as exc:
            raise CorruptSegment(key, f"frame at offset {pos}: unreadable Parquet: {exc}") from exc
        if stored.names != names:
            raise CorruptSegment(key, f"frame at offset {pos}: columns {stored.names}, expected {names}")
        if tuple(stored.types) != types:
            wrong = next(i for i, t in enumerate(stored.types) if t != types[i])
            raise CorruptSegment(
                key, f"frame at offset {pos}: column {names[wrong]!r} is {stored.types[wrong]}, expected {types[wrong]}"
            )
        rows = md.num_rows
        if rows <= 0:
            raise CorruptSegment(key, f"frame at offset {pos}: no events")
        lo = expected
        for rg in range(md.num_row_groups):
            group = md.row_group(rg)
            stats = group.column(0).statistics
            if (
                stats is not None
                and stats.has_min_max
                and group.num_rows
                and (stats.min != lo or stats.max != lo + group.num_rows - 1)
            ):
                raise CorruptSegment(
                    key,
                    f"frame at offset {pos}: offsets {stats.min}..{stats.max}, "
                    f"expected {lo}..{lo + group.num_rows - 1}",
                )
            lo += group.num_rows
        frames.append((payload, rows))
        expected += rows
        pos += HEADER_SIZE + len(payload)
    if not frames:
        raise CorruptSegment(key, "segment holds no frames")
    return frames
