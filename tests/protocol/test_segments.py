"""Source events and segments: strict events and normalised tables, the segment encoding (frames,
Parquet row groups, offsets that continue exactly), batches of whole segments, and every torn, corrupt
or undecodable segment named by a typed error."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from laminar_orchestration.protocol.framing import (
    FLAG_PUBLISHED,
    HEADER_SIZE,
    BadMagic,
    FrameHeader,
    FrameMismatch,
    TruncatedFrame,
    encode_frame,
)
from laminar_orchestration.protocol.keys import segment_key
from laminar_orchestration.protocol.segments import (
    ROW_GROUP_EVENTS,
    SOURCE_FRAME_EPOCH,
    SourceBatch,
    decode_segment,
    encode_segment,
)
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.source_errors import (
    BadInputLine,
    CorruptSegment,
    CorruptSourceHead,
    InvalidEvents,
    OffsetNotAtSegmentBoundary,
    PartitionOutOfRange,
    UndecodableSegment,
)
from laminar_orchestration.protocol.source_events import (
    EVENT_SCHEMA,
    MAX_KEY_BYTES,
    SourceEvent,
    invalid_utf8_row,
    normalize_events,
)
from laminar_orchestration.store import LocalObjectStore
from tests.protocol.test_source import _events, _not_utf8

# --- events ---------------------------------------------------------------------


def test_source_event_is_strict() -> None:
    assert SourceEvent(partition=0, key="k", value=3).value == 3.0  # ints are accepted
    for bad in (
        {"partition": 0, "key": "k", "value": 1, "extra": 1},
        {"partition": 0, "key": "k", "value": "1"},
        {"partition": -1, "key": "k", "value": 1},
        {"partition": 0, "key": 5, "value": 1},
        {"partition": 0, "key": "k", "value": True},
        {"partition": 0, "key": "k", "value": float("nan")},
    ):
        with pytest.raises(ValidationError):
            SourceEvent.model_validate(bad)


def test_append_validates_tables() -> None:
    ok = normalize_events(1, pa.table({"partition": [1, 1], "key": ["a", "b"], "value": [1, 2], "ts": [None, 5]}))
    assert ok.column("value").type == pa.float64()
    assert ok.column("ts")[1].as_py() == 5 and ok.column("ts")[0].as_py() > 1_600_000_000_000
    for table, reason in (
        (pa.table({"offset": [0], "key": ["a"], "value": [1.0]}), "assigned by the log"),
        (pa.table({"key": ["a"]}), "missing column"),
        (pa.table({"key": ["a", None], "value": [1.0, 2.0]}), "null"),
        (pa.table({"key": ["a"], "value": [float("inf")]}), "NaN or infinity"),
        (pa.table({"key": ["a"], "value": ["1"]}), "not a number"),
        (pa.table({"partition": [2], "key": ["a"], "value": [1.0]}), "other partitions"),
    ):
        with pytest.raises(InvalidEvents, match=reason) as info:
            normalize_events(1, table)
        assert info.value.partition == 1
    with pytest.raises(InvalidEvents, match="belongs to partition 0"):
        normalize_events(1, _events(1))


def test_a_key_is_limited_in_utf8_bytes_and_a_timestamp_to_int64() -> None:
    assert SourceEvent(partition=0, key="é" * (MAX_KEY_BYTES // 2), value=1).key  # 2 bytes a character
    with pytest.raises(ValidationError, match=f"{MAX_KEY_BYTES + 1} bytes long"):
        SourceEvent(partition=0, key="é" * (MAX_KEY_BYTES // 2) + "a", value=1)
    assert SourceEvent(partition=0, key="k", value=1, ts=2**63 - 1).ts == 2**63 - 1
    with pytest.raises(ValidationError, match="ts"):
        SourceEvent(partition=0, key="k", value=1, ts=2**63)


def test_a_table_with_dictionary_keys_integer_values_and_timestamps_is_normalised() -> None:
    at = pa.array([1_704_067_200] * 3, pa.timestamp("s", tz="UTC"))
    table = pa.table(
        {"key": pa.array(["a", "b", "a"]).dictionary_encode(), "value": pa.array([1, 2, 3], pa.int8()), "ts": at}
    )
    normalised = normalize_events(0, table)
    assert normalised.schema == pa.schema([f for f in EVENT_SCHEMA if f.name != "offset"])
    assert normalised.to_pylist() == [
        {"key": k, "value": v, "ts": 1_704_067_200_000} for k, v in (("a", 1.0), ("b", 2.0), ("a", 3.0))
    ]


def test_the_first_key_that_is_not_utf8_is_found_in_any_chunk() -> None:
    valid = pa.array([f"k{i}" for i in range(1000)])
    assert invalid_utf8_row(valid) is None
    assert invalid_utf8_row(pa.chunked_array([valid, valid])) is None
    values = [f"k{i}".encode() for i in range(1000)]
    values[637] = values[900] = b"\xc3"  # the first of two is named
    assert invalid_utf8_row(_not_utf8(*values)) == 637
    assert invalid_utf8_row(pa.chunked_array([valid, _not_utf8(*values)])) == 1637


# --- segment encoding ---------------------------------------------------------------


def test_a_segment_is_published_frames_whose_offsets_continue_from_its_start() -> None:
    table = normalize_events(4, _events(7, partition=4))
    data = encode_segment(4, 20, table, generation=3, frame_events=3)
    frames = decode_segment("seg", data, partition=4, start_offset=20)
    assert [rows for _, rows in frames] == [3, 3, 1]
    pos, offsets = 0, []
    for payload, _ in frames:
        header = FrameHeader.unpack(data, pos)
        assert (header.partition, header.generation, header.epoch) == (4, 3, SOURCE_FRAME_EPOCH)
        assert header.flags == FLAG_PUBLISHED and header.length == len(payload)
        offsets += pq.read_table(pa.BufferReader(bytes(payload))).column("offset").to_pylist()
        pos += HEADER_SIZE + len(payload)
    assert pos == len(data) and offsets == list(range(20, 27))


def test_equal_events_encode_to_different_bytes_unless_the_write_id_is_the_same() -> None:
    """A producer recognises its own create-only write by its bytes, never by another producer's."""
    table = normalize_events(0, _events(3))
    assert encode_segment(0, 0, table) != encode_segment(0, 0, table)
    assert encode_segment(0, 0, table, write_id="w1") == encode_segment(0, 0, table, write_id="w1")
    with pytest.raises(ValueError, match="at least one event"):
        encode_segment(0, 0, table.slice(0, 0))


def test_a_segment_read_at_another_offset_or_with_other_columns_is_corrupt() -> None:
    data = encode_segment(0, 5, normalize_events(0, _events(3)))
    with pytest.raises(CorruptSegment) as shifted:
        decode_segment("seg", data, partition=0, start_offset=0)
    assert shifted.value.key == "seg" and "offsets 5..7, expected 0..2" in shifted.value.reason
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"key": ["a"], "value": [1.0]}), sink)
    with pytest.raises(CorruptSegment, match="columns"):
        decode_segment("seg", encode_frame(sink.getvalue().to_pybytes(), 0, 0, 0), partition=0, start_offset=0)


def test_every_row_group_of_a_frame_must_continue_the_offsets() -> None:
    # Four events in the first group, then a group that skips offset 4: only the second group is wrong.
    events = pa.table(
        {"offset": [0, 1, 2, 3, 5, 6], "key": list("abcdef"), "value": [1.0] * 6, "ts": [0] * 6}, schema=EVENT_SCHEMA
    )
    sink = pa.BufferOutputStream()
    pq.write_table(events, sink, row_group_size=4)
    with pytest.raises(CorruptSegment, match=r"offsets 5\.\.6, expected 4\.\.5"):
        decode_segment("seg", encode_frame(sink.getvalue().to_pybytes(), 0, 0, 0), partition=0, start_offset=0)


def test_a_large_segment_is_split_into_row_groups_and_still_checked(local_store: LocalObjectStore) -> None:
    """Spark splits a file only between row groups: a large segment holds several, so a large batch is
    scanned by every core; the read still checks each group's offsets and returns every event once."""
    n = 2 * ROW_GROUP_EVENTS + 10
    log = SourceLog(local_store, segment_events=n)
    keys = [f"k{i % 7}" for i in range(n)]
    log.append(0, pa.table({"key": keys, "value": [float(i) for i in range(n)]}))
    batch = log.read(0, 0, n)
    assert batch is not None and len(batch.payloads) == 1
    assert pq.ParquetFile(pa.BufferReader(batch.payloads[0])).metadata.num_row_groups == 3
    assert batch.to_table().column("offset").to_pylist() == list(range(n))
    assert sorted(batch.keys().to_pylist()) == [f"k{i}" for i in range(7)]


# --- batches ------------------------------------------------------------------------


def test_batch_writes_parquet_files_for_spark(local_store: LocalObjectStore, tmp_path: Path) -> None:
    log = SourceLog(local_store, segment_events=4, frame_events=2)
    log.append(0, _events(10))
    batch = log.read(0, 0, 100)
    assert batch is not None
    paths = batch.write_parquet(tmp_path / "batch")
    assert len(paths) == len(batch.payloads) == 5
    assert sorted(p.name for p in (tmp_path / "batch").iterdir()) == sorted(p.name for p in paths)
    from_disk = pq.read_table(tmp_path / "batch").sort_by("offset")
    assert from_disk.column("offset").to_pylist() == list(range(10))
    assert from_disk.column("key").to_pylist() == batch.to_table().column("key").to_pylist()


def test_an_undecodable_segment_is_named_by_a_failed_batch(local_store: LocalObjectStore) -> None:
    log = SourceLog(local_store)
    log.append(0, _events(3))
    poison = pa.table({"key": _not_utf8(b"d", b"\xff"), "value": [4.0, 5.0], "ts": pa.array([4, 5], pa.int64())})
    # A writer bypassing `append`: the segment at the log end, then the head rolled past it.
    local_store.put_if_absent(segment_key(0, 3), encode_segment(0, 3, poison, frame_events=1))
    assert log.roll_forward(0) == 5
    batch = log.read(0, 0, 10)
    assert batch is not None and batch.segment_starts == (0, 3)
    first = log.read(0, 0, 3)
    assert first is not None and first.undecodable() is None  # a batch that decodes names nothing
    error = batch.undecodable()
    assert isinstance(error, UndecodableSegment)
    assert (error.partition, error.key, error.start_offset, error.offset) == (0, segment_key(0, 3), 3, 4)
    assert "b'\\xff' is not valid UTF-8" in str(error) and error.error_kind.value == "corrupt data"


def test_a_batch_reads_its_keys_and_events_and_an_empty_one_reads_as_nothing() -> None:
    payloads = tuple(
        bytes(p)
        for p, _ in decode_segment(
            "seg", encode_segment(0, 0, normalize_events(0, _events(4)), frame_events=2), partition=0, start_offset=0
        )
    )
    batch = SourceBatch(0, 0, 4, (segment_key(0, 0),), payloads, (0,))
    assert batch.events == 4 and sorted(batch.keys().to_pylist()) == ["e0", "e1", "e2", "e3"]
    assert batch.to_table().column("offset").to_pylist() == [0, 1, 2, 3]
    empty = SourceBatch(0, 4, 4, (), ())
    assert empty.events == 0 and empty.keys().to_pylist() == [] and empty.to_table().equals(EVENT_SCHEMA.empty_table())


# --- corruption and errors ----------------------------------------------------------


def test_corrupt_segment_is_reported_by_name(local_store: LocalObjectStore) -> None:
    log = SourceLog(local_store)
    local_store.put_if_absent(segment_key(0, 0), b"\x00" * 40)
    with pytest.raises(BadMagic) as info:
        log.read(0, 0, 10)
    assert info.value.source == segment_key(0, 0) and info.value.offset == 0
    # A segment of partition 5 stored under partition 1 is caught by the frame header.
    wrong = encode_segment(5, 0, normalize_events(5, _events(1, partition=5)))
    local_store.put_if_absent(segment_key(1, 0), wrong)
    with pytest.raises(FrameMismatch) as mismatch:
        log.read(1, 0, 10)
    assert (mismatch.value.field, mismatch.value.expected, mismatch.value.actual) == (
        "partition",
        1,
        5,
    )
    local_store.put_if_absent(segment_key(2, 0), encode_frame(b"not parquet", 0, 0, 2))
    with pytest.raises(Exception, match="unreadable Parquet") as bad:
        log.read(2, 0, 10)
    assert segment_key(2, 0) in str(bad.value)


def test_a_torn_or_empty_segment_is_named_by_a_typed_error() -> None:
    data = encode_segment(0, 0, normalize_events(0, _events(3)))
    with pytest.raises(TruncatedFrame) as torn:
        decode_segment("source/00000/seg", data[:-10], partition=0, start_offset=0)
    assert torn.value.source == "source/00000/seg" and torn.value.offset == 0
    with pytest.raises(TruncatedFrame):
        decode_segment("source/00000/seg", data[: HEADER_SIZE - 1], partition=0, start_offset=0)
    with pytest.raises(CorruptSegment, match="holds no frames") as empty:
        decode_segment("source/00000/seg", b"", partition=0, start_offset=0)
    assert empty.value.key == "source/00000/seg" and empty.value.error_kind.value == "corrupt data"


def test_source_errors_pickle_with_their_fields() -> None:
    for err in (
        OffsetNotAtSegmentBoundary(1, 5, 10),
        BadInputLine("x.jsonl", 3, "value: bad"),
        CorruptSourceHead("source/00000/head.json", "bad"),
        InvalidEvents(2, "bad"),
        InvalidEvents(2, "bad", 5, "key"),
        UndecodableSegment(0, segment_key(0, 3), 3, 4, "bad"),
        PartitionOutOfRange(7, 4),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and vars(back) == vars(err) and str(back) == str(err)
