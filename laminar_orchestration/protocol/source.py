"""The partitioned, append-only input log in the object store.

Layout, per partition ``p`` (spelled in `keys`; a `versioned.VersionedObject`)::

    source/{p:05d}/{start_offset:020d}.seg   immutable segments (create-only)
    source/{p:05d}/head.json                 CAS pointer for producers (`SourceHead`)

A segment is a sequence of frames (`laminar_orchestration.protocol.framing`) whose
payloads are Parquet files with the columns of `EVENT_SCHEMA`; the ``offset``
column is absolute and contiguous from the segment's start offset, so segment
``s`` starting at ``o`` with ``n`` events is followed by the segment at ``o + n``.

Appending is lock-free: a producer reads the head, creates the segment at the
head's ``next_offset`` with a create-only put (exactly one producer can win an
offset), then moves the head by compare-and-swap. A producer that dies between
those two steps leaves a segment beyond the head; the next producer finds the
offset taken and rolls the head forward past it. The head is therefore a hint
that may lag, never a claim that runs ahead: every offset below it is covered
by a segment.

Reading never lists and needs no head in the common case: a consumer knows the
offset it committed (always a segment boundary) and fetches the segment named
by it, then the next, and so on. The head is consulted only to tell "caught
up" from "not a segment boundary".
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
from pydantic import ValidationError

from laminar_orchestration.processing.schema import (
    DEFAULT_STREAM_SCHEMA,
    EventsDoNotMatchSchema,
    StreamSchema,
    conform,
)
from laminar_orchestration.protocol.capabilities import ReadStore, SourceAppender, SourceKey, source_key
from laminar_orchestration.protocol.keys import LOG_ENDS_KEY, segment_key, source_head_key
from laminar_orchestration.protocol.log_ends import RecordedEnds, SourceHead, parse_log_ends
from laminar_orchestration.protocol.nudge import SourceDoorbell
from laminar_orchestration.protocol.segments import (
    SEGMENT_DICTIONARY_COLUMNS,
    AppendResult,
    SegmentRef,
    SourceBatch,
    _Segment,
    decode_segment,
    encode_segment,
)
from laminar_orchestration.protocol.source_errors import (
    CorruptSourceHead,
    OffsetNotAtSegmentBoundary,
    PartitionOutOfRange,
    SourceNotWritable,
)
from laminar_orchestration.protocol.source_events import (
    EVENT_SCHEMA,
    SourceEvent,
    as_table,
    normalize_events,
    partition_numbers,
    route,
)
from laminar_orchestration.protocol.versioned import VersionedObject
from laminar_orchestration.store import ConcurrentModification, ObjectStore, PreconditionFailed, StoreError

log = logging.getLogger(__name__)

# --- the log --------------------------------------------------------------------


class SourceLog:
    """Append to and read from the partitioned input log. Thread-safe; safe across processes.

    `segment_events` caps events per segment, `frame_events` per frame (default:
    one frame per segment). `generation` is stamped into every frame header.
    With `partitions` set, partition ids outside 0..partitions-1 are rejected.
    """

    def __init__(
        self,
        store: ObjectStore | ReadStore,
        *,
        segment_events: int = 100_000,
        frame_events: int | None = None,
        generation: int = 0,
        partitions: int | None = None,
        doorbell: SourceDoorbell | None = None,
        schema: StreamSchema = DEFAULT_STREAM_SCHEMA,
    ) -> None:
        if segment_events < 1:
            raise ValueError("segment_events must be >= 1")
        if frame_events is not None and frame_events < 1:
            raise ValueError("frame_events must be >= 1")
        self.segment_events = segment_events
        self.frame_events = frame_events
        self.generation = generation
        self.partitions = partitions
        #: The stream's schema: appends are checked against it, segments hold its columns.
        self.schema = schema
        self._default = schema == DEFAULT_STREAM_SCHEMA
        self._event_schema = schema.event_schema if not self._default else EVENT_SCHEMA
        # A segment fetched by `read` that did not fit max_events; the next read of
        # that partition almost always starts there. Segments are immutable, so
        # caching one is always correct.
        self._lookahead: dict[int, _Segment] = {}
        self._lock = threading.Lock()
        #: The head as this producer last wrote it, per partition: the next append starts there without
        #: reading it (its create-only segment write is the check; a conflict reads the head again).
        self._heads: dict[int, tuple[int, int, str]] = {}
        #: Told each partition's new log end after an append (advisory: its owner reads it at once).
        self.doorbell = doorbell
        # Appending takes the `SourceAppender` capability: a log opened on a `ReadStore` (a node's) reads only.
        self._appender: SourceAppender | None = None
        self._reads: ReadStore
        if isinstance(store, ObjectStore):
            self._appender = self._reads = SourceAppender(store)
        else:
            self._reads = store
        #: The log ends the nodes watch, as this producer last wrote them: the next merge starts there.
        self._ends = RecordedEnds(self._reads)

    def _append_capability(self, partition: int) -> SourceAppender:
        if self._appender is None:
            raise SourceNotWritable(partition)
        return self._appender

    def _log(self, partition: int) -> VersionedObject[_Segment, SourceKey]:
        """A partition's log as a versioned object: segments by start offset, the source head as pointer."""

        def create(key: SourceKey, data: bytes, metadata: Mapping[str, str] | None) -> str:
            return self._append_capability(partition).create_source(key, data, metadata)

        def swap(key: SourceKey, data: bytes, etag: str) -> str:
            return self._append_capability(partition).swap_source(key, data, etag)

        return VersionedObject(
            self._reads,
            entry_key=lambda start: source_key(segment_key(partition, start)),
            pointer_key=source_key(source_head_key(partition)),
            decode=lambda start, obj: self._parse(partition, start, obj.data),
            create=create,
            swap=swap,
            successor=lambda start, segment: start + segment.rows,
        )

    def _check_partition(self, partition: int) -> None:
        if partition < 0 or (self.partitions is not None and partition >= self.partitions):
            raise PartitionOutOfRange(partition, self.partitions)

    # -- head --------------------------------------------------------------

    def head(self, partition: int) -> SourceHead | None:
        """The producers' head pointer of `partition`, or None if nothing was ever appended."""
        got = self._read_head(partition)
        return got[0] if got else None

    def _read_head(self, partition: int) -> tuple[SourceHead, str] | None:
        obj = self._log(partition).pointer()
        if obj is None:
            return None
        try:
            return SourceHead.model_validate_json(obj.data), obj.etag
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "<root>"
            raise CorruptSourceHead(obj.key, f"{where}: {first.get('msg')}") from exc

    def _head_state(self, partition: int, *, cached: bool = False) -> tuple[int, int, str | None]:
        """(next_offset, segments, etag) of the head; (0, 0, None) if there is none.

        `cached`: as this producer last wrote it, if it did (no read)."""
        with self._lock:
            mine = self._heads.pop(partition, None) if cached else None
        if mine is not None:
            return mine
        got = self._read_head(partition)
        return (got[0].next_offset, got[0].segments, got[1]) if got else (0, 0, None)

    def _write_head(self, partition: int, etag: str | None, next_offset: int, segments: int) -> None:
        """One conditional write of the head; raises PreconditionFailed/ConcurrentModification."""
        record = SourceHead(next_offset=next_offset, segments=segments, updated_at=datetime.now(UTC))
        written = self._log(partition).move_pointer(record.model_dump_json().encode(), etag)
        with self._lock:
            self._heads[partition] = (next_offset, segments, written)

    def end_offset(self, partition: int) -> int:
        """The head's next offset (0 if none). May lag behind segments of a dead producer."""
        self._check_partition(partition)
        got = self._read_head(partition)
        return got[0].next_offset if got else 0

    def roll_forward(self, partition: int) -> int:
        """Move the head past segments a dead producer left beyond it; return the log end."""
        self._check_partition(partition)
        while True:
            end, count, etag = self._head_state(partition)
            seg = self._load(partition, end)
            if seg is None:
                return end
            # A lost race means someone else moved it: re-read either way.
            with contextlib.suppress(PreconditionFailed, ConcurrentModification):
                self._write_head(partition, etag, end + seg.rows, count + 1)

    # -- append ------------------------------------------------------------

    def append(self, partition: int, events: Sequence[SourceEvent] | pa.Table) -> AppendResult:
        """Append events to `partition` in segments of at most `segment_events`.

        Each segment lands atomically at the current log end; concurrent producers
        (threads or processes) never lose, duplicate or interleave events within a
        segment, and offsets stay contiguous. The new log end is then recorded for
        the nodes (`record_ends`).
        """
        result = self._append(partition, events)
        if result.segments:
            self.record_ends({partition: result.next_offset})
        return result

    def append_routed(self, events: object) -> dict[int, AppendResult]:
        """Append events of the stream's schema, each to the partition of its key (`route`), unless a
        ``partition`` column names each event's partition.

        `events`: a pyarrow Table, a pandas DataFrame or a polars DataFrame. All of them are checked
        against the schema before the first segment is written: events that do not fit raise
        `EventsDoNotMatchSchema` (the column and the first bad row) and nothing is appended. Within a
        partition, events keep their order.
        """
        if self.partitions is None:
            raise ValueError("routing needs the number of partitions (SourceLog(partitions=...))")
        table = as_table(0, events)
        parts = None
        if "partition" in table.column_names:
            parts = partition_numbers(table["partition"], self.partitions)
            table = table.drop_columns(["partition"])
        if self.schema.key not in table.column_names:
            raise EventsDoNotMatchSchema(self.schema.key, None, "missing: it is the stream's key")
        if not self._default:  # checked whole once; the default's checks run per partition below
            table = conform(self.schema, table)
        if parts is None:
            parts = route(table[self.schema.key], self.partitions)
        order = np.argsort(parts, kind="stable")
        ordered, starts = table.take(pa.array(order)), np.flatnonzero(np.diff(parts[order], prepend=-1))
        bounds = [*starts.tolist(), table.num_rows]
        groups = {int(parts[order[lo]]): ordered.slice(lo, hi - lo) for lo, hi in itertools.pairwise(bounds)}
        prepared = {p: self._prepare(p, t) if self._default else t for p, t in groups.items()}
        return self._append_prepared(prepared)

    def append_many(self, events: Mapping[int, Sequence[SourceEvent] | pa.Table]) -> dict[int, AppendResult]:
        """`append` to several partitions, recording their new log ends with one write.

        Every partition's events are checked before the first segment is written: one that does
        not fit appends nothing anywhere.
        """
        return self._append_prepared({p: self._prepare(p, batch) for p, batch in events.items()})

    def _append_prepared(self, tables: Mapping[int, pa.Table]) -> dict[int, AppendResult]:
        results = {p: self._append_table(p, table) for p, table in tables.items()}
        ends = {p: r.next_offset for p, r in results.items() if r.segments}
        if ends:
            self.record_ends(ends)
        return results

    def record_ends(self, ends: Mapping[int, int]) -> None:
        """Merge `ends` into the log ends the nodes watch (`keys.LOG_ENDS_KEY`), then ring the doorbell.

        A hint: written by compare-and-swap after the segments, and never fatal to the append
        that came before (a failure is logged; the nodes' slow poll of each log finds the data).
        A corrupt object is replaced.
        """
        try:
            self._merge_ends(ends)
        except (StoreError, CorruptSourceHead) as exc:
            log.warning("could not record the log ends %s (the nodes will find them at their slow poll): %s", ends, exc)
        if self.doorbell is not None:
            self.doorbell.ring(ends)

    def _merge_ends(self, ends: Mapping[int, int]) -> None:
        self._ends.merge(self._append_capability(min(ends)), ends)

    def log_ends(self) -> dict[int, int] | None:
        """Each partition's log end as producers recorded it (a hint that may lag); None before any."""
        obj = self._reads.get(LOG_ENDS_KEY)
        return None if obj is None else parse_log_ends(obj.data)

    def _prepare(self, partition: int, events: Sequence[SourceEvent] | pa.Table) -> pa.Table:
        """`events` checked and in the columns the log stores (without offsets)."""
        self._check_partition(partition)
        self._append_capability(partition)
        if self._default:
            return normalize_events(partition, events)
        table = as_table(partition, events)
        if "partition" in table.column_names:  # the stream has no such column: it may only confirm `partition`
            if partition_numbers(table["partition"], partition + 1).min(initial=partition) != partition:
                raise EventsDoNotMatchSchema("partition", None, f"holds other partitions than {partition}")
            table = table.drop_columns(["partition"])
        return conform(self.schema, table)

    def _append(self, partition: int, events: Sequence[SourceEvent] | pa.Table) -> AppendResult:
        return self._append_table(partition, self._prepare(partition, events))

    def _append_table(self, partition: int, table: pa.Table) -> AppendResult:
        refs = [
            self._append_segment(partition, table.slice(lo, self.segment_events))
            for lo in range(0, table.num_rows, self.segment_events)
        ]
        if not refs:
            end = self.end_offset(partition)
            return AppendResult(partition, end, end, ())
        return AppendResult(partition, refs[0].start_offset, refs[-1].end_offset, tuple(refs))

    def _append_segment(self, partition: int, chunk: pa.Table) -> SegmentRef:
        n = chunk.num_rows
        write_id = secrets.token_hex(8)
        built: tuple[int, bytes] | None = None
        cached = True
        while True:
            start, count, etag = self._head_state(partition, cached=cached)
            cached = False  # after a conflict, the head as stored
            key = segment_key(partition, start)
            if built is None or built[0] != start:
                # Offsets are absolute, so the bytes depend on where the segment lands.
                built = (
                    start,
                    encode_segment(
                        partition,
                        start,
                        chunk,
                        generation=self.generation,
                        frame_events=self.frame_events,
                        write_id=write_id,
                        event_schema=self._event_schema,
                        dictionary_columns=SEGMENT_DICTIONARY_COLUMNS if self._default else [self.schema.key],
                    ),
                )
            data = built[1]
            try:
                self._log(partition).create(
                    start, data, metadata={"events": str(n), "start-offset": str(start), "write-id": write_id}
                )
            except (PreconditionFailed, ConcurrentModification):
                # Decide by what is stored, not by the error: a retried request may
                # report a conflict with its own earlier, applied attempt.
                existing = self._reads.get(key)
                if existing is None:
                    continue  # a 409 with no winner yet
                if existing.data != data:
                    # Another producer owns this offset; if its head move is missing
                    # (it died, or is just slow), do it for it, then try the next offset.
                    rows = self._parse(partition, start, existing.data).rows
                    with contextlib.suppress(PreconditionFailed, ConcurrentModification):
                        self._write_head(partition, etag, start + rows, count + 1)
                    continue
                # Our own earlier attempt landed and only its response was lost.
            self._advance_head(partition, etag, start, start + n, count + 1)
            return SegmentRef(key, partition, start, start + n)

    def _advance_head(self, partition: int, etag: str | None, start: int, end: int, segments: int) -> None:
        """Move the head from `start` to `end` after creating the segment at `start`."""
        while True:
            try:
                self._write_head(partition, etag, end, segments)
                return
            except (PreconditionFailed, ConcurrentModification):
                got = self._read_head(partition)
                current = got[0].next_offset if got else 0
                if current >= end:
                    # Rolled forward past our segment by another producer (or our lost write).
                    return
                if current != start:
                    raise CorruptSourceHead(
                        source_head_key(partition),
                        f"head at {current} while the segment at {start} was being published",
                    ) from None
                assert got is not None
                etag, segments = got[1], got[0].segments + 1

    # -- read ----------------------------------------------------------------

    def _parse(self, partition: int, start: int, data: bytes) -> _Segment:
        key = segment_key(partition, start)
        frames = decode_segment(key, data, partition=partition, start_offset=start, schema=self._event_schema)
        return _Segment(
            key=key,
            start_offset=start,
            payloads=tuple(bytes(p) for p, _ in frames),
            rows=sum(r for _, r in frames),
        )

    def _load(self, partition: int, start: int) -> _Segment | None:
        with self._lock:
            cached = self._lookahead.get(partition)
            if cached is not None and cached.start_offset == start:
                del self._lookahead[partition]
                return cached
        entry = self._log(partition).entry(start)
        return None if entry is None else entry.value

    def read(
        self,
        partition: int,
        from_offset: int,
        max_events: int,
        *,
        at_boundary: bool = False,
        known_end: int | None = None,
    ) -> SourceBatch | None:
        """Read whole segments starting exactly at `from_offset`, up to `max_events` events.

        Always returns at least one segment if one starts at `from_offset`, even
        if it alone exceeds `max_events`. Returns None when caught up (no segment
        at `from_offset`, which is the log end). Raises `OffsetNotAtSegmentBoundary`
        if `from_offset` is neither a segment start nor the log end.

        `at_boundary`: the caller knows `from_offset` is a segment boundary (a committed
        offset always is), so a missing segment there means caught up: one GET, no head read.
        `known_end`: a log end recorded after its segments (`log_ends`): the read stops there
        instead of probing for a segment beyond it.
        """
        self._check_partition(partition)
        if max_events < 1:
            raise ValueError("max_events must be >= 1")
        if from_offset < 0:
            raise OffsetNotAtSegmentBoundary(partition, from_offset, self.end_offset(partition))
        for _attempt in range(2):
            segments: list[_Segment] = []
            offset = from_offset
            while offset - from_offset < max_events and (known_end is None or offset < known_end):
                seg = self._load(partition, offset)
                if seg is None:
                    break
                if segments and offset - from_offset + seg.rows > max_events:
                    with self._lock:
                        self._lookahead[partition] = seg
                    break
                segments.append(seg)
                offset += seg.rows
            if segments:
                return SourceBatch(
                    partition=partition,
                    start_offset=from_offset,
                    end_offset=offset,
                    segment_keys=tuple(s.key for s in segments),
                    payloads=tuple(p for s in segments for p in s.payloads),
                    segment_starts=tuple(s.start_offset for s in segments),
                    key_column=self.schema.key,
                    event_schema=self._event_schema,
                )
            if at_boundary or self._at_log_end(partition, from_offset):
                return None
            # A producer created the segment after our probe: read again.
        raise AssertionError("unreachable: a segment that appeared cannot disappear")

    def _at_log_end(self, partition: int, offset: int) -> bool:
        """After finding no segment at `offset`: True if it is the log end.

        False if a segment appeared at `offset` meanwhile; raises
        `OffsetNotAtSegmentBoundary` otherwise.
        """
        end = self.end_offset(partition)
        if offset < end:
            # Below the head every boundary has a segment; re-probe for a racing producer.
            if self._reads.head(segment_key(partition, offset)) is not None:
                return False
            raise OffsetNotAtSegmentBoundary(partition, offset, self._walk_to_end(partition, end))
        # At or beyond the head: the head may lag behind segments of a dead producer.
        pos = end
        while pos < offset:
            seg = self._load(partition, pos)
            if seg is None:
                raise OffsetNotAtSegmentBoundary(partition, offset, pos)
            pos += seg.rows
        if pos == offset:
            return True
        raise OffsetNotAtSegmentBoundary(partition, offset, self._walk_to_end(partition, pos))

    def _walk_to_end(self, partition: int, pos: int) -> int:
        """Follow segments from boundary `pos` to the true log end (error paths only)."""
        log = self._log(partition)
        for entry in log.roll_forward(pos):
            pos = log.next_position(entry)
        return pos

    def iter_batches(self, partition: int, from_offset: int, max_events: int) -> Iterator[SourceBatch]:
        """Batches from `from_offset` until caught up."""
        offset = from_offset
        while (batch := self.read(partition, offset, max_events)) is not None:
            yield batch
            offset = batch.end_offset
