"""The partitioned input log: segments, the producers' CAS head, reads by offset, producers."""

from __future__ import annotations

import json
import multiprocessing as mp
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from laminar_dev.faults import FaultInjectingStore
from laminar_orchestration.protocol.keys import segment_key, source_head_key
from laminar_orchestration.protocol.producers import generate_events, produce_from_jsonl
from laminar_orchestration.protocol.segments import encode_segment
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.source_errors import (
    BadInputLine,
    CorruptSourceHead,
    InvalidEvents,
    OffsetNotAtSegmentBoundary,
    PartitionOutOfRange,
)
from laminar_orchestration.protocol.source_events import EVENT_SCHEMA, SourceEvent, normalize_events
from laminar_orchestration.store import LocalObjectStore, ObjectStore, PreconditionFailed, open_store
from laminar_orchestration.store.retry import RetryingStore, RetryPolicy
from tests.threads import run_together


def _events(n: int, prefix: str = "e", partition: int = 0) -> list[SourceEvent]:
    return [SourceEvent(partition=partition, key=f"{prefix}{i}", value=i, ts=i) for i in range(n)]


def _all_events(log: SourceLog, partition: int) -> pa.Table:
    tables = [b.to_table() for b in log.iter_batches(partition, 0, 1_000_000)]
    return pa.concat_tables(tables) if tables else EVENT_SCHEMA.empty_table()


def _assert_exactly_once(table: pa.Table, expected_keys: set[str]) -> None:
    """Offsets are 0..N-1 in order, and every expected event appears exactly once."""
    offsets = table.column("offset").to_numpy()
    assert np.array_equal(offsets, np.arange(len(expected_keys)))
    keys = table.column("key").to_pylist()
    assert len(keys) == len(set(keys)) and set(keys) == expected_keys


# --- events ---------------------------------------------------------------------


def _not_utf8(*values: bytes) -> pa.Array:
    """A string array holding `values` unchecked, as pyarrow builds one from a Parquet file's bytes."""
    return pa.array(values, pa.binary()).cast(pa.string(), safe=False)


def test_append_rejects_keys_that_are_not_utf8_and_appends_nothing(store: ObjectStore, tmp_path: Path) -> None:
    log = SourceLog(store)
    log.append(0, _events(2))
    objects = sorted(store.list("source/"))
    keys = _not_utf8(b"ok", b"fine", b"\xff\xfe", b"x")
    path = tmp_path / "events.parquet"
    pq.write_table(pa.table({"key": keys, "value": [1.0, 2.0, 3.0, 4.0]}), path)
    chunked = pa.chunked_array([pa.array(["a", "b"]), _not_utf8(b"c", b"\xc3")])
    for table, row in (
        (pa.table({"key": keys, "value": [1, 2, 3, 4]}), 2),
        (pq.read_table(path), 2),  # what a Parquet file written that way reads back as
        (pq.read_table(path, read_dictionary=["key"]), 2),
        (pa.table({"key": keys.cast(pa.large_string()), "value": [1, 2, 3, 4]}), 2),
        (pa.table({"key": chunked, "value": [1.0, 2.0, 3.0, 4.0]}), 3),
    ):
        with pytest.raises(InvalidEvents) as info:
            log.append(0, table)
        assert (info.value.partition, info.value.row, info.value.column) == (0, row, "key")
        assert f"column 'key', row {row}" in str(info.value) and "not valid UTF-8" in str(info.value)
    # Nothing of any of them was appended: no segment, the head unmoved.
    assert log.end_offset(0) == 2 and sorted(store.list("source/")) == objects
    assert log.read(0, 2, 10) is None


def test_a_lone_surrogate_key_is_invalid_input_not_a_unicode_error(local_store: LocalObjectStore) -> None:
    with pytest.raises(ValidationError, match="lone surrogate at index 1"):
        SourceEvent(partition=0, key="a\ud800", value=1)
    # An event built around validation still cannot reach the log.
    forged = SourceEvent.model_construct(partition=0, key="a\ud800", value=1.0, ts=None)
    log = SourceLog(local_store)
    with pytest.raises(InvalidEvents) as info:
        log.append(0, [*_events(2), forged])
    assert (info.value.partition, info.value.row, info.value.column) == (0, 2, "key")
    assert "lone surrogate" in str(info.value)
    assert log.end_offset(0) == 0 and list(local_store.list("source/")) == []


# --- append and read --------------------------------------------------------------


def test_append_and_read_round_trip_across_segments(store: ObjectStore) -> None:
    log = SourceLog(store, segment_events=4, frame_events=3)
    result = log.append(2, _events(10, partition=2))
    assert (result.partition, result.first_offset, result.next_offset) == (2, 0, 10)
    assert [(s.start_offset, s.end_offset) for s in result.segments] == [(0, 4), (4, 8), (8, 10)]
    assert [s.key for s in result.segments] == [segment_key(2, o) for o in (0, 4, 8)]
    assert log.end_offset(2) == 10
    head = log.head(2)
    assert head is not None and (head.next_offset, head.segments) == (10, 3)

    batch = log.read(2, 0, 100)
    assert batch is not None
    assert (batch.start_offset, batch.end_offset, batch.events) == (0, 10, 10)
    assert batch.segment_keys == tuple(s.key for s in result.segments)
    assert len(batch.payloads) == 5  # 4 events in 3+1 frames, twice, then 2 in one frame
    table = batch.to_table()
    assert table.schema == EVENT_SCHEMA
    assert table.column("offset").to_pylist() == list(range(10))
    assert table.column("key").to_pylist() == [f"e{i}" for i in range(10)]
    assert table.column("value").to_pylist() == [float(i) for i in range(10)]

    # Whole segments only, at least one even if it alone exceeds max_events.
    first = log.read(2, 0, 1)
    assert first is not None and (first.start_offset, first.end_offset) == (0, 4)
    nxt = log.read(2, 4, 5)  # 4 + 2 > 5: the segment at 8 is left for the next read
    assert nxt is not None and (nxt.start_offset, nxt.end_offset) == (4, 8)
    last = log.read(2, 8, 5)
    assert last is not None and (last.start_offset, last.end_offset) == (8, 10)
    assert log.read(2, 10, 7) is None


def test_read_when_caught_up_returns_none(store: ObjectStore) -> None:
    log = SourceLog(store, segment_events=3)
    assert log.read(0, 0, 10) is None
    assert log.end_offset(0) == 0
    log.append(0, _events(5))
    assert log.read(0, 5, 10) is None
    log.append(0, _events(2, "f"))
    batch = log.read(0, 5, 10)
    assert batch is not None and batch.to_table().column("key").to_pylist() == ["f0", "f1"]


def test_read_off_a_segment_boundary_raises(store: ObjectStore) -> None:
    log = SourceLog(store, segment_events=4)
    log.append(0, _events(10))
    with pytest.raises(OffsetNotAtSegmentBoundary) as inside:
        log.read(0, 5, 10)
    assert (inside.value.partition, inside.value.offset, inside.value.log_end) == (0, 5, 10)
    assert "inside a segment" in str(inside.value)
    with pytest.raises(OffsetNotAtSegmentBoundary) as beyond:
        log.read(0, 11, 10)
    assert (beyond.value.offset, beyond.value.log_end) == (11, 10)
    assert "beyond the end" in str(beyond.value)


def test_append_of_nothing_writes_nothing(store: ObjectStore) -> None:
    log = SourceLog(store)
    log.append(0, _events(3))
    result = log.append(0, [])
    assert (result.first_offset, result.next_offset, result.segments) == (3, 3, ())
    assert log.head(0) is not None and log.head(0).segments == 1  # type: ignore[union-attr]


def test_partition_range_is_enforced(local_store: LocalObjectStore) -> None:
    log = SourceLog(local_store, partitions=2)
    with pytest.raises(PartitionOutOfRange):
        log.append(2, [])
    with pytest.raises(PartitionOutOfRange):
        log.read(-1, 0, 1)


# --- crashes, corruption, lost responses ------------------------------------------


def test_roll_forward_after_a_producer_died_before_moving_the_head(store: ObjectStore) -> None:
    # A producer created its segment at offset 0 and died before the head CAS.
    orphan = normalize_events(1, _events(3, "dead", partition=1))
    store.put_if_absent(segment_key(1, 0), encode_segment(1, 0, orphan))
    log = SourceLog(store, segment_events=2)
    assert log.end_offset(1) == 0  # the head lags...

    batch = log.read(1, 0, 100)  # ...but readers never need it to find segments
    assert batch is not None and (batch.start_offset, batch.end_offset) == (0, 3)
    assert log.read(1, 3, 100) is None  # at the true end despite the lagging head
    with pytest.raises(OffsetNotAtSegmentBoundary) as info:
        log.read(1, 2, 100)
    assert info.value.log_end == 3

    result = log.append(1, _events(3, "live", partition=1))
    assert (result.first_offset, result.next_offset) == (3, 6)
    assert log.end_offset(1) == 6
    _assert_exactly_once(_all_events(log, 1), {f"dead{i}" for i in range(3)} | {f"live{i}" for i in range(3)})


def test_roll_forward_without_appending(local_store: LocalObjectStore) -> None:
    log = SourceLog(local_store)
    log.append(0, _events(2))
    orphan = normalize_events(0, _events(5, "o"))
    local_store.put_if_absent(segment_key(0, 2), encode_segment(0, 2, orphan))
    assert log.end_offset(0) == 2
    assert log.roll_forward(0) == 7
    assert log.end_offset(0) == 7


def test_append_is_exactly_once_despite_lost_responses(local_store: LocalObjectStore) -> None:
    faults = FaultInjectingStore(local_store)
    store = RetryingStore(faults, RetryPolicy(base_delay_s=0.0), seed=1)
    log = SourceLog(store, segment_events=2)
    faults.lose_response_next(1, op="put_if_absent")  # the first segment lands, its answer is lost
    faults.lose_response_next(1, op="put_if_match")  # a head move lands, its answer is lost
    log.append(0, _events(6))
    assert faults.lost_responses == 2
    assert log.end_offset(0) == 6
    _assert_exactly_once(_all_events(log, 0), {f"e{i}" for i in range(6)})


class _BlindRetryStore(LocalObjectStore):
    """Applies the first segment create and the first head CAS, then reports them as lost races.

    As a retry layer without read-back would: its blind retry of an applied write fails.
    """

    def __init__(self, root: Path) -> None:
        super().__init__(root, fsync=False)
        self.tricked: set[str] = set()

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        etag = super().put_if_absent(key, data, metadata)
        if key.endswith(".seg") and "create" not in self.tricked:
            self.tricked.add("create")
            raise PreconditionFailed(key, None)
        return etag

    def put_if_match(self, key: str, data: bytes, etag: str, metadata: Mapping[str, str] | None = None) -> str:
        new = super().put_if_match(key, data, etag, metadata)
        if "cas" not in self.tricked:
            self.tricked.add("cas")
            raise PreconditionFailed(key, etag)
        return new


def test_append_recognises_its_own_writes_reported_as_conflicts(tmp_path: Path) -> None:
    store = _BlindRetryStore(tmp_path / "store")
    log = SourceLog(store, segment_events=2)
    result = log.append(0, _events(6))
    assert store.tricked == {"create", "cas"}
    assert [(s.start_offset, s.end_offset) for s in result.segments] == [(0, 2), (2, 4), (4, 6)]
    assert log.end_offset(0) == 6
    _assert_exactly_once(_all_events(log, 0), {f"e{i}" for i in range(6)})


def test_corrupt_head_is_reported_by_name(local_store: LocalObjectStore) -> None:
    local_store.put_if_absent(source_head_key(0), b'{"next_offset": "x"}')
    with pytest.raises(CorruptSourceHead) as info:
        SourceLog(local_store).append(0, _events(1))
    assert info.value.key == source_head_key(0) and "next_offset" in str(info.value)


# --- concurrent producers -----------------------------------------------------------


def test_concurrent_producer_threads_never_lose_or_duplicate(store: ObjectStore) -> None:
    workers, appends, per_append = 4, 4, 3
    log = SourceLog(store, segment_events=2)

    def produce(w: int) -> None:
        for a in range(appends):
            log.append(0, _events(per_append, f"w{w}-a{a}-"))

    assert not run_together(produce, workers, 60)
    expected = {f"w{w}-a{a}-{i}" for w in range(workers) for a in range(appends) for i in range(per_append)}
    assert log.end_offset(0) == len(expected)
    _assert_exactly_once(_all_events(log, 0), expected)


def test_concurrent_threads_under_random_store_faults(local_store: LocalObjectStore) -> None:
    faults = FaultInjectingStore(local_store)
    faults.random_faults(0.15, seed=7)
    store = RetryingStore(faults, RetryPolicy(max_attempts=20, base_delay_s=0.0), seed=3)
    log = SourceLog(store, segment_events=2)
    threads = [threading.Thread(target=lambda w=w: log.append(0, _events(6, f"w{w}-"))) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    faults.clear()
    assert faults.injected_failures + faults.lost_responses > 0
    _assert_exactly_once(_all_events(log, 0), {f"w{w}-{i}" for w in range(3) for i in range(6)})


def _produce_in_process(store_url: str, start: threading.Barrier, worker: int, appends: int, per_append: int) -> None:
    log = SourceLog(open_store(store_url), segment_events=2)
    start.wait(60)  # all interpreters are up: the appends really race
    for a in range(appends):
        log.append(3, _events(per_append, f"p{worker}-a{a}-", partition=3))


def test_concurrent_producer_processes_never_lose_or_duplicate(store_url: str) -> None:
    procs, appends, per_append = 3, 4, 3
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(procs)
    workers = [
        ctx.Process(target=_produce_in_process, args=(store_url, start, w, appends, per_append)) for w in range(procs)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0] * procs
    log = SourceLog(open_store(store_url))
    expected = {f"p{w}-a{a}-{i}" for w in range(procs) for a in range(appends) for i in range(per_append)}
    assert log.end_offset(3) == len(expected)
    _assert_exactly_once(_all_events(log, 3), expected)


# --- producers ----------------------------------------------------------------------


def test_produce_from_jsonl(local_store: LocalObjectStore, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = [
        {"partition": 1, "key": "a", "value": 1},
        {"partition": 0, "key": "b", "value": 2.5, "ts": 1000},
        {"partition": 1, "key": "c", "value": -3.0},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    log = SourceLog(local_store, partitions=2)
    results = produce_from_jsonl(path, log)
    assert {p: (r.first_offset, r.next_offset) for p, r in results.items()} == {
        0: (0, 1),
        1: (0, 2),
    }
    one = log.read(1, 0, 10)
    assert one is not None
    assert one.to_table().select(["offset", "key", "value"]).to_pylist() == [
        {"offset": 0, "key": "a", "value": 1.0},
        {"offset": 1, "key": "c", "value": -3.0},
    ]
    zero = log.read(0, 0, 10)
    assert zero is not None and zero.to_table().column("ts").to_pylist() == [1000]


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        ("{not json", "JSON"),
        ('{"partition": 0, "key": "k", "value": 1, "colour": "red"}', "colour"),
        ('{"partition": 0, "key": "k", "value": "1"}', "value"),
        ('{"partition": 0, "value": 1}', "key"),
        ('{"partition": -1, "key": "k", "value": 1}', "partition"),
        ('{"partition": 2, "key": "k", "value": 1}', "out of range"),
        ("[1, 2]", "object"),
    ],
)
def test_bad_jsonl_line_names_the_line_and_appends_nothing(
    local_store: LocalObjectStore, tmp_path: Path, bad_line: str, reason: str
) -> None:
    path = tmp_path / "events.jsonl"
    good = [json.dumps({"partition": p, "key": "k", "value": 1}) for p in (0, 1, 0)]
    path.write_text("\n".join([*good, "", bad_line, good[0]]) + "\n")
    log = SourceLog(local_store, partitions=2)
    with pytest.raises(BadInputLine) as info:
        produce_from_jsonl(path, log)
    assert (info.value.path, info.value.line_number) == (str(path), 5)
    assert reason in info.value.reason
    assert f"{path}, line 5" in str(info.value)
    assert list(local_store.list("source/")) == []


def test_generate_events_is_deterministic() -> None:
    a = generate_events(5000, keys=50, seed=42, partitions=4)
    b = generate_events(5000, keys=50, seed=42, partitions=4)
    c = generate_events(5000, keys=50, seed=43, partitions=4)
    assert sorted(a) == [0, 1, 2, 3]
    assert all(a[p].equals(b[p]) for p in a)
    assert not all(a[p].equals(c[p]) for p in a)
    assert sum(t.num_rows for t in a.values()) == 5000
    for p, table in a.items():
        keys = {int(k[1:]) for k in table.column("key").to_pylist()}
        assert all(k % 4 == p for k in keys)  # a key always lives in one partition
        ts = table.column("ts").to_numpy()
        assert np.all(np.diff(ts) > 0)
    ints = generate_events(1000, keys=10, seed=1, partitions=1, integer_values=True)[0]
    values = ints.column("value").to_numpy()
    assert np.array_equal(values, np.round(values))


def test_generated_events_append_and_read_back(local_store: LocalObjectStore) -> None:
    tables = generate_events(20_000, keys=100, seed=5, partitions=2)
    log = SourceLog(local_store, segment_events=3000)
    for p, table in tables.items():
        log.append(p, table)
        back = _all_events(log, p)
        assert back.column("offset").to_pylist() == list(range(table.num_rows))
        assert back.drop_columns(["offset"]).equals(table)
