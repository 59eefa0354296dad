"""A stream's schema read from its document, events checked against it, and state values of any Arrow
type through the codec: every type round-trips, nulls included, and bad input names what is wrong."""

from __future__ import annotations

import gc
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from laminar_orchestration.processing.codec import InvalidStateSchema, UndecodableStateValue, ValueCodec
from laminar_orchestration.processing.schema import (
    EventsDoNotMatchSchema,
    InvalidSchema,
    StreamSchema,
    conform,
    parse_type,
    type_spec,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SPECS = [
    "string",
    "binary",
    "bool",
    "int8",
    "uint64",
    "float32",
    "float64",
    "decimal(12, 2)",
    "date",
    "timestamp[ms]",
    "timestamp[us, UTC]",
    "timestamp[ms, Europe/Paris]",
    "list<string>",
    "map<string, int64>",
    "struct<sku: string, quantity: int32, tags: list<string>>",
    "list<struct<a: decimal(38, 9), b: map<int32, list<bool>>>>",
]


@pytest.mark.parametrize("spec", SPECS)
def test_every_type_spec_parses_and_writes_back(spec: str) -> None:
    parsed = parse_type(spec)
    assert parse_type(type_spec(parsed)) == parsed


@pytest.mark.parametrize(
    ("spec", "named"),
    [("list<", "ends early"), ("decimal(40, 2)", "precision"), ("map<list<int8>, int8>", "map keys"),
     ("struct<a: int8, a: int8>", "repeat"), ("timestamp[h]", "unit"), ("varchar", "unknown type")],
)  # fmt: skip
def test_a_malformed_type_names_the_problem(spec: str, named: str) -> None:
    with pytest.raises(InvalidSchema) as info:
        parse_type(spec)
    assert named in str(info.value) and spec in str(info.value)


def test_a_schema_document_is_checked_field_by_field(tmp_path: Path) -> None:
    clicks = StreamSchema.from_file(EXAMPLES / "clicks.yaml")
    assert clicks.key == "user" and clicks.event_time == "at"
    assert clicks.event_schema.names[0] == "offset"
    assert clicks.fingerprint == StreamSchema.from_file(EXAMPLES / "clicks.yaml").fingerprint
    bad = {
        "no_key.yaml": ("columns: {a: string}\nkey: b\nevent_time: a\n", "key column 'b'"),
        "time_type.yaml": ("columns: {a: string, t: string}\nkey: a\nevent_time: t\n", "event_time column 't'"),
        "reserved.yaml": ("columns: {offset: int64, t: int64}\nkey: offset\nevent_time: t\n", "reserved"),
        "not_yaml.yaml": ("columns: [\n", "not valid YAML"),
        "list.yaml": ("- a\n- b\n", "expected a mapping"),
    }
    for name, (text, named) in bad.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(InvalidSchema) as info:
            StreamSchema.from_file(path)
        assert named in str(info.value), (name, str(info.value))


def test_events_that_do_not_fit_name_the_column_and_the_row() -> None:
    schema = StreamSchema.from_file(EXAMPLES / "orders.yaml")
    good = {
        "customer": ["c1", "c2"],
        "order_id": ["o1", "o2"],
        "total": pa.array([Decimal("1.50"), None], pa.decimal128(12, 2)),
        "items": [[{"sku": "s", "quantity": 1}], None],
        "at": pa.array([0, 1], pa.timestamp("ms", "UTC")),
    }
    assert conform(schema, pa.table(good)).schema == schema.input_schema
    cases = [
        ({**good, "customer": ["c1", None]}, "customer", 1, "null"),
        ({**good, "total": ["1.5", "oops"]}, "total", 1, "oops"),
        ({**good, "colour": ["red", "blue"]}, "colour", None, "not a column"),
        ({**good, "offset": [1, 2]}, "offset", None, "assigned by the log"),
    ]
    for columns, column, row, reason in cases:
        with pytest.raises(EventsDoNotMatchSchema) as info:
            conform(schema, pa.table(columns))
        assert (info.value.column, info.value.row) == (column, row) and reason in str(info.value)


def test_state_values_of_any_type_round_trip_with_nulls() -> None:
    schema = pa.schema(
        [
            ("name", pa.string()),
            ("blob", pa.binary()),
            ("total", pa.decimal128(20, 4)),
            ("day", pa.date32()),
            ("at", pa.timestamp("us", "UTC")),
            ("pages", pa.list_(pa.string())),
            ("attrs", pa.map_(pa.string(), pa.int64())),
            ("item", pa.struct([("sku", pa.string()), ("n", pa.int32())])),
            ("score", pa.float64()),
        ]
    )
    rows = [
        {
            "name": "ü",
            "blob": b"\x00\xff",
            "total": Decimal("12345678901234.5678"),
            "day": date(2024, 2, 29),
            "at": datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=UTC),
            "pages": ["/", "/a"],
            "attrs": [("k", 1)],
            "item": {"sku": "s", "n": 3},
            "score": None,
        },
        dict.fromkeys(schema.names),
    ]
    table = pa.Table.from_pylist(rows, schema=schema)
    codec = ValueCodec(schema)
    assert not codec.fixed_width
    records = codec.encode(table)
    decoded = codec.decode([records[0], None, records[1]])
    assert decoded.to_pylist() == [rows[0], dict.fromkeys(schema.names), dict.fromkeys(schema.names)]


def test_fixed_width_numbers_keep_the_packed_records_and_refuse_nulls() -> None:
    schema = pa.schema([pa.field("count", pa.int64(), nullable=False), pa.field("x", pa.float64(), nullable=False)])
    codec = ValueCodec(schema)
    assert codec.fixed_width and codec.width == 16
    table = pa.table({"count": [1, 2], "x": [0.5, 1.5]}, schema=schema)
    assert codec.decode(codec.encode(table)).to_pylist() == table.to_pylist()
    with pytest.raises(InvalidStateSchema) as info:
        codec.encode(pa.table({"count": [None], "x": [1.0]}))
    assert info.value.column == "count"


def test_a_union_column_is_refused_and_a_garbled_record_is_named() -> None:
    with pytest.raises(InvalidStateSchema):
        ValueCodec(pa.schema([("u", pa.dense_union([pa.field("a", pa.int8())]))]))
    codec = ValueCodec(pa.schema([("name", pa.string())]))
    with pytest.raises(UndecodableStateValue):
        codec.decode([b"\xc1"])


def test_one_column_decodes_alone_and_equals_the_full_decode() -> None:
    schema = pa.schema([("tags", pa.list_(pa.string())), ("expires", pa.int64()), ("amount", pa.decimal128(12, 2))])
    rich, fixed = ValueCodec(schema), ValueCodec(pa.schema([pa.field("expires", pa.int64(), nullable=False)]))
    values = pa.table({"tags": [["a"], None], "expires": [7, 9], "amount": [Decimal("1.50"), None]}, schema=schema)
    records = [*rich.encode(values), None]
    assert rich.decode_column(records, "expires").to_pylist() == [7, 9, None]
    assert rich.decode_column(records, "tags").to_pylist() == rich.decode(records)["tags"].to_pylist()
    packed = [*fixed.encode(values.select(["expires"])), None]
    assert fixed.decode_column(packed, "expires").to_pylist() == [7, 9, None]


def test_a_decode_leaves_the_cycle_collector_as_it_found_it() -> None:
    """Rich records decode with Python's cycle collector paused: it is back on afterwards, also when
    a record does not decode, and stays off for a caller that had turned it off."""
    codec = ValueCodec(pa.schema([("tags", pa.list_(pa.string())), ("n", pa.int64())]))
    records = codec.encode(pa.table({"tags": [["a"], ["b", "c"]], "n": [1, 2]}))
    assert gc.isenabled()
    assert codec.decode(records)["n"].to_pylist() == [1, 2]
    assert gc.isenabled()
    with pytest.raises(UndecodableStateValue):
        codec.decode([b"\xc1"])
    assert gc.isenabled()
    gc.disable()
    try:
        codec.decode(records)
        assert not gc.isenabled()
    finally:
        gc.enable()
