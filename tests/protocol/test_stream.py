"""The stream record (ledger/stream.json): created once by init before the cluster record, kept by an
interrupted or repeated init of the same stream, a different stream refused naming both fingerprints,
a corrupt object named; on the local store and the S3 server. And any schema's events through the
source log: appended, framed, read back identical; a wrong event names its column and row and
appends nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from laminar_orchestration.errors import ErrorKind
from laminar_orchestration.processing.registry import ProcessorNotFound
from laminar_orchestration.processing.schema import DEFAULT_STREAM_SCHEMA, EventsDoNotMatchSchema, StreamSchema
from laminar_orchestration.protocol.keys import CLUSTER_KEY, STREAM_KEY
from laminar_orchestration.protocol.ledger import ClusterAlreadyInitialized, Ledger
from laminar_orchestration.protocol.segments import decode_segment
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.source_errors import CorruptSegment
from laminar_orchestration.protocol.source_events import route
from laminar_orchestration.protocol.stream import (
    CorruptStreamRecord,
    StreamAlreadyRecorded,
    StreamRecord,
    read_stream_record,
)
from laminar_orchestration.store import ObjectStore

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CLICKS = StreamSchema.from_file(EXAMPLES / "clicks.yaml")
WINDOWS = "examples.windowed_counts:processor"
SESSIONS = "examples.sessions:processor"


def test_init_records_the_stream_before_the_cluster_and_a_rerun_of_the_same_stream_resumes(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(store)
    # Interrupted right after the stream record: no cluster record yet.
    real_create = ledger._writer.create
    calls: list[str] = []

    def create_then_fail(key: str, data: bytes, metadata: object = None) -> str:
        calls.append(key)
        if key == STREAM_KEY:
            real_create(key, data)  # type: ignore[arg-type]
            raise KeyboardInterrupt
        return real_create(key, data)  # type: ignore[arg-type]

    monkeypatch.setattr(ledger._writer, "create", create_then_fail)
    with pytest.raises(KeyboardInterrupt):
        ledger.init_cluster(2, schema=CLICKS, processor=WINDOWS)
    assert calls == [STREAM_KEY] and store.get_or_none(CLUSTER_KEY) is None
    monkeypatch.undo()
    record = read_stream_record(store)
    assert record is not None and record.stream_schema == CLICKS and record.processor == WINDOWS
    first = store.get(STREAM_KEY).etag
    # The same command again completes the cluster and keeps the record.
    Ledger(store).init_cluster(2, schema=CLICKS, processor=WINDOWS)
    assert Ledger(store).cluster().partitions == 2 and store.get(STREAM_KEY).etag == first
    # And with --force later too.
    Ledger(store).init_cluster(3, force=True, schema=CLICKS, processor=WINDOWS)
    assert store.get(STREAM_KEY).etag == first


def test_another_stream_on_an_initialised_cluster_is_a_conflict_naming_both_fingerprints(store: ObjectStore) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(1, schema=CLICKS, processor=WINDOWS)
    recorded = read_stream_record(store)
    assert recorded is not None
    before = {k: store.get(k).etag for k in store.list("")}
    for force in (False, True):
        with pytest.raises(StreamAlreadyRecorded) as err:
            ledger.init_cluster(1, force=force, schema=CLICKS, processor=SESSIONS)
        assert err.value.error_kind is ErrorKind.CONFLICT
        assert err.value.recorded_fingerprint == recorded.processor_fingerprint
        assert recorded.processor_fingerprint[:12] in str(err.value) and err.value.fingerprint[:12] in str(err.value)
        assert WINDOWS in str(err.value) and SESSIONS in str(err.value)
    assert {k: store.get(k).etag for k in store.list("")} == before  # nothing written


def test_a_cluster_without_a_record_runs_the_default_and_takes_only_the_default(store: ObjectStore) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(1)
    assert read_stream_record(store) is None  # no flags: no record, nodes run the default
    with pytest.raises(StreamAlreadyRecorded, match="the default"):
        ledger.init_cluster(1, force=True, schema=CLICKS, processor=WINDOWS)
    assert read_stream_record(store) is None
    with pytest.raises(ClusterAlreadyInitialized):  # the default again, without --force: the usual refusal
        ledger.init_cluster(1, schema=DEFAULT_STREAM_SCHEMA)
    ledger.init_cluster(1, force=True, processor="keyed_aggregation")
    record = read_stream_record(store)
    assert record is not None and record.stream_schema == DEFAULT_STREAM_SCHEMA


def test_a_processor_that_cannot_load_or_run_on_the_schema_writes_nothing(store: ObjectStore) -> None:
    with pytest.raises(ProcessorNotFound):
        Ledger(store).init_cluster(1, schema=CLICKS, processor="examples.nope:processor")
    with pytest.raises(Exception) as err:  # the default processor reads a "value" column clicks lack
        Ledger(store).init_cluster(1, schema=CLICKS)
    assert getattr(err.value, "error_kind", None) is ErrorKind.INVALID_INPUT
    assert list(store.list("")) == []


@pytest.mark.parametrize(
    "data",
    [b"{not json", b'{"kind": "stream"}', b"[]"],
)
def test_a_corrupt_record_is_named(store: ObjectStore, data: bytes) -> None:
    store.put_if_absent(STREAM_KEY, data)
    with pytest.raises(CorruptStreamRecord) as err:
        read_stream_record(store)
    assert err.value.key == STREAM_KEY and err.value.error_kind is ErrorKind.CORRUPT_DATA


def test_a_record_whose_schema_no_longer_parses_is_corrupt_not_invalid_input(store: ObjectStore) -> None:
    Ledger(store).init_cluster(1, schema=CLICKS, processor=WINDOWS)
    data = store.get(STREAM_KEY)
    store.put_if_match(STREAM_KEY, data.data.replace(b"list<string>", b"list<strin>"), data.etag)
    with pytest.raises(CorruptStreamRecord, match="strin"):
        read_stream_record(store)


def test_the_record_round_trips_with_its_schema_under_schema() -> None:
    record = StreamRecord.model_validate(
        {"schema": CLICKS, "processor": WINDOWS, "processor_fingerprint": "a" * 64, "created_at": datetime.now(UTC)}
    )
    assert b'"schema":' in record.to_bytes()
    assert StreamRecord.model_validate_json(record.to_bytes()) == record


# --- any schema through the source log ---------------------------------------------------

ALL_TYPES = StreamSchema.from_document(
    {
        "columns": {
            "id": "int64",
            "name": "string",
            "price": "decimal(10, 3)",
            "at": "timestamp[us, Europe/Paris]",
            "day": "date",
            "secs": "timestamp[s]",
            "tags": "list<string>",
            "where": "struct<city: string, lat: float64>",
            "counts": "map<string, int32>",
            "ok": "bool",
            "blob": "binary",
            "small": "int8",
        },
        "key": "id",
        "event_time": "at",
    }
)


def _rows(n: int) -> pa.Table:
    paris = timezone(timedelta(hours=1))
    rows = [
        {
            "id": i,
            "name": None if i % 3 == 0 else f"n{i}é",
            "price": Decimal(f"{i}.125"),
            "at": datetime(2024, 1, 1, 12, 0, i % 60, 123456, tzinfo=paris),
            "day": datetime(2024, 1, 1 + i % 28).date(),
            "secs": datetime(2024, 1, 1, 0, 0, i % 60),
            "tags": None if i % 2 else ["a", f"t{i}"],
            "where": {"city": "Paris", "lat": 48.85 + i} if i % 4 else None,
            "counts": [("x", i), ("y", -i)] if i % 5 else None,
            "ok": i % 2 == 0,
            "blob": bytes([i % 256]),
            "small": i % 100,
        }
        for i in range(n)
    ]
    return pa.Table.from_pylist(rows, schema=ALL_TYPES.input_schema)


def test_any_schema_is_appended_framed_and_read_back_identical(store: ObjectStore) -> None:
    log = SourceLog(store, partitions=2, segment_events=7, frame_events=3, schema=ALL_TYPES)
    events = _rows(20)
    log.append(0, events)
    batch = log.read(0, 0, 100)
    assert batch is not None and batch.events == 20
    read = batch.to_table()
    assert read.schema.types == ALL_TYPES.event_schema.types
    assert read["offset"].to_pylist() == list(range(20))
    assert read.drop_columns(["offset"]).to_pylist() == events.to_pylist()
    assert sorted(batch.keys().to_pylist()) == sorted(str(i) for i in range(20))


def test_a_segment_of_another_schema_is_corrupt_for_this_one(store: ObjectStore) -> None:
    SourceLog(store, schema=ALL_TYPES).append(0, _rows(3))
    key = next(iter(store.list("source/00000/")))
    data = store.get(key).data
    with pytest.raises(CorruptSegment, match="columns"):
        decode_segment(key, data, partition=0, start_offset=0)  # the default schema's columns
    retyped = pa.schema([f.with_type(pa.int32()) if f.name == "small" else f for f in ALL_TYPES.event_schema])
    with pytest.raises(CorruptSegment, match="'small' is int8, expected int32"):
        decode_segment(key, data, partition=0, start_offset=0, schema=retyped)


@pytest.mark.parametrize(
    ("column", "values", "row", "named"),
    [
        ("small", pa.array([1, 2, 300, 4], pa.int64()), 2, "300"),
        ("price", pa.array(["1.5", "2.25", "3", "1.0005"]), 3, "1.0005"),
        ("id", pa.array([1, None, 3, 4], pa.int64()), 1, "null"),
        ("at", pa.array(["2024-01-01T00:00:00Z", "soon", None, None]), 1, "soon"),
        ("ok", pa.array(["true", "false", "maybe", "true"]), 2, "maybe"),
    ],
)
def test_a_wrong_event_names_its_column_and_row_and_nothing_is_appended(
    local_store: ObjectStore, column: str, values: pa.Array, row: int, named: str
) -> None:
    log = SourceLog(local_store, partitions=2, schema=ALL_TYPES)
    table = _rows(4)
    bad = table.set_column(table.column_names.index(column), column, values)
    for append in (
        lambda: log.append(1, bad),
        lambda: log.append_many({0: table, 1: bad}),
        lambda: log.append_routed(bad),
    ):
        with pytest.raises(EventsDoNotMatchSchema) as err:
            append()
        assert (err.value.column, err.value.row) == (column, row) and named in str(err.value), err.value
    assert list(local_store.list("source/")) == []  # nothing appended, not even partition 0's good events


def test_routing_sends_one_key_to_one_partition_by_crc32_and_a_partition_column_overrides(
    local_store: ObjectStore,
) -> None:
    import zlib

    log = SourceLog(local_store, partitions=4, schema=ALL_TYPES)
    table = pa.concat_tables([_rows(12), _rows(12)])
    results = log.append_routed(table)
    expected = {p: [i for i in range(12) if zlib.crc32(str(i).encode()) % 4 == p] * 2 for p in range(4)}
    for p in range(4):
        batch = log.read(p, 0, 1000)
        ids = [] if batch is None else batch.to_table()["id"].to_pylist()
        assert sorted(ids) == sorted(expected[p]) and (results[p].events if p in results else 0) == len(ids)
    assert route(pa.array(["7", None]), 4).tolist() == [zlib.crc32(b"7") % 4, 0]
    assert route(pa.array([7]), 4).tolist() == route(pa.array(["7"]), 4).tolist()
    other = SourceLog(local_store, partitions=4, schema=ALL_TYPES)
    pinned = _rows(3).append_column("partition", pa.array([3, 3, 3]))
    before = other.end_offset(3)
    other.append_routed(pinned)
    assert other.end_offset(3) == before + 3
    with pytest.raises(EventsDoNotMatchSchema, match="partition"):
        other.append_routed(_rows(2).append_column("partition", pa.array([0, 9])))


def test_pandas_and_polars_frames_append_like_arrow(local_store: ObjectStore) -> None:
    pd = pytest.importorskip("pandas")
    schema = StreamSchema.from_document(
        {"columns": {"user": "string", "n": "int32", "at": "timestamp[ms, UTC]"}, "key": "user", "event_time": "at"}
    )
    log = SourceLog(local_store, partitions=1, schema=schema)
    frame = pd.DataFrame({"user": ["a", "b"], "n": [1, 2], "at": pd.to_datetime([0, 1000], unit="ms", utc=True)})
    log.append_routed(frame)
    pl = pytest.importorskip("polars")
    log.append_routed(pl.from_pandas(frame))
    batch = log.read(0, 0, 100)
    assert batch is not None
    assert batch.to_table()["user"].to_pylist() == ["a", "b"] * 2
    with pytest.raises(Exception, match="pyarrow Table or a pandas/polars DataFrame"):
        log.append_routed([{"user": "a"}])
