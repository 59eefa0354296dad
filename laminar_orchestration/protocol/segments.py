"""Segments: how the source log stores events (frames of Parquet files, checked on read) and what its
appends and reads hand back (`SegmentRef`, `AppendResult`, `SourceBatch`).

The log itself, which creates and finds segments, is `protocol.source`.
"""

from __future__ import annotations

import bisect
import functools
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from laminar_orchestration.protocol.framing import FLAG_PUBLISHED, HEADER_SIZE, FrameHeader, iter_frames
from laminar_orchestration.protocol.keys import segment_key
from laminar_orchestration.protocol.source_errors import CorruptSegment, UndecodableSegment
from laminar_orchestration.protocol.source_events import EVENT_SCHEMA, invalid_utf8_row

_WRITE_ID_META = b"laminar.write_id"
#: The epoch field of source frames: the input log is not owned by a partition epoch,
#: and epoch 0 is the reserved "no ownership" value.
SOURCE_FRAME_EPOCH = 0
#: Events per Parquet row group of a segment. Spark splits a file only between row groups: a
#: large segment in several groups is scanned by every core, not by one task.
ROW_GROUP_EVENTS = 131_072
#: Columns a segment dictionary-encodes: keys and timestamps repeat, offsets and values rarely do.
SEGMENT_DICTIONARY_COLUMNS = ["key", "ts"]


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


# --- encoding and decoding ----------------------------------------------------


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
