"""A stream's schema document: every type parses (nested too) and writes back, a malformed document or
type is refused naming the field, the fingerprint depends on what the schema means only, and `conform`
refuses events that do not fit, naming the column and the first bad row."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from laminar_orchestration.processing.schema import (
    DEFAULT_STREAM_SCHEMA,
    EventsDoNotMatchSchema,
    InvalidSchema,
    StreamSchema,
    conform,
    parse_type,
    type_spec,
)

TYPES = {
    "string": pa.string(),
    "binary": pa.binary(),
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint16": pa.uint16(),
    "float32": pa.float32(),
    "double": pa.float64(),
    "decimal(12, 2)": pa.decimal128(12, 2),
    "date": pa.date32(),
    "timestamp[ms]": pa.timestamp("ms"),
    "timestamp[us, UTC]": pa.timestamp("us", tz="UTC"),
    "timestamp[s, Europe/Paris]": pa.timestamp("s", tz="Europe/Paris"),
    "timestamp[ns, +01:00]": pa.timestamp("ns", tz="+01:00"),
    "list<string>": pa.list_(pa.string()),
    "struct<path: string, n: int32>": pa.struct([("path", pa.string()), ("n", pa.int32())]),
    "map<string, int64>": pa.map_(pa.string(), pa.int64()),
    "map<int32, list<struct<a: decimal(5, 1)>>>": pa.map_(
        pa.int32(), pa.list_(pa.struct([("a", pa.decimal128(5, 1))]))
    ),
}


@pytest.mark.parametrize("spec", list(TYPES))
def test_every_type_parses_and_writes_back(spec: str) -> None:
    assert parse_type(spec) == TYPES[spec]
    assert parse_type(type_spec(TYPES[spec])) == TYPES[spec]


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("list<", "ends early"),
        ("decimal(40, 2)", "precision <= 38"),
        ("decimal(5, 6)", "scale <= precision"),
        ("timestamp[h]", "unit 'h'"),
        ("map<float64, string>", "map keys"),
        ("struct<a: int8, a: int16>", "repeat"),
        ("varchar", "unknown type 'varchar'"),
        ("list<int64> x", "unexpected 'x'"),
    ],
)
def test_a_malformed_type_is_refused_naming_it(spec: str, named: str) -> None:
    with pytest.raises(InvalidSchema) as err:
        parse_type(spec)
    assert err.value.where == f"type {spec!r}" and named in err.value.reason


COLUMNS: list[dict[str, str]] = [
    {"name": "user", "type": "string"},
    {"name": "amount", "type": "decimal(12, 2)"},
    {"name": "at", "type": "timestamp[ms, UTC]"},
    {"name": "tags", "type": "list<string>"},
    {"name": "page", "type": "struct<path: string, referrer: string>"},
    {"name": "attrs", "type": "map<string, int64>"},
]
CLICKS: dict[str, Any] = {
    "columns": COLUMNS,
    "key": "user",
    "event_time": "at",
    "required": ["amount"],
}


def test_a_yaml_and_a_json_file_give_the_same_schema_and_its_arrow_views(tmp_path: Path) -> None:
    yaml_file = tmp_path / "s.yaml"
    yaml_file.write_text(
        "columns:\n"
        + "".join(f'  - {{name: {c["name"]}, type: "{c["type"]}"}}\n' for c in COLUMNS)
        + "key: user\nevent_time: at\nrequired: [amount]\n"
    )
    json_file = tmp_path / "s.json"
    json_file.write_text(json.dumps(CLICKS))
    schema = StreamSchema.from_file(yaml_file)
    assert schema == StreamSchema.from_file(json_file)
    assert schema.event_schema.names == ["offset", "user", "amount", "at", "tags", "page", "attrs"]
    nullable = {f.name: f.nullable for f in schema.input_schema}
    assert nullable == {"user": False, "amount": False, "at": False, "tags": True, "page": True, "attrs": True}
    # The short form: columns as a mapping of name to type.
    short = StreamSchema.from_document({"columns": {"k": "int64", "t": "int64"}, "key": "k", "event_time": "t"})
    assert [c.type for c in short.columns] == ["int64", "int64"]


@pytest.mark.parametrize(
    ("change", "where", "named"),
    [
        ({"key": "nope"}, "schema", "key column 'nope'"),
        ({"event_time": "user"}, "schema", "event_time column 'user' has type string"),
        ({"key": "tags"}, "schema", "a key is a string or an integer"),
        ({"required": ["ghost"]}, "schema", "ghost"),
        ({"columns": [{"name": "offset", "type": "int64"}]}, "columns", "reserved"),
        ({"columns": [{"name": "a b", "type": "int64"}]}, "columns.0.name", "pattern"),
        ({"columns": [{"name": "user", "type": "string", "size": 3}]}, "columns.0.size", "Extra inputs"),
        ({"colour": "red"}, "colour", "Extra inputs"),
        ({"columns": []}, "columns", "at least 1"),
    ],
)
def test_a_malformed_document_is_refused_naming_the_field(change: dict[str, object], where: str, named: str) -> None:
    with pytest.raises(InvalidSchema) as err:
        StreamSchema.from_document({**CLICKS, **change}, source="s.yaml")
    assert err.value.where == ("s.yaml" if where == "schema" else f"s.yaml: {where}"), err.value
    assert named in err.value.reason, err.value


def test_a_bad_type_inside_a_document_names_the_type() -> None:
    with pytest.raises(InvalidSchema) as err:
        StreamSchema.from_document({**CLICKS, "columns": [{"name": "user", "type": "list<strin>"}]})
    assert err.value.where == "type 'list<strin>'" and "unknown type 'strin'" in err.value.reason


@pytest.mark.parametrize(
    ("text", "named"),
    [("{not json", "not valid JSON"), ("[1, 2]", "expected a mapping")],
)
def test_a_file_that_is_not_a_schema_document_is_one_error(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(InvalidSchema) as err:
        StreamSchema.from_file(path)
    assert err.value.where == str(path) and named in err.value.reason
    yaml_file = tmp_path / "s.yaml"
    yaml_file.write_text("columns: [unclosed\n")
    with pytest.raises(InvalidSchema, match="not valid YAML"):
        StreamSchema.from_file(yaml_file)
    with pytest.raises(InvalidSchema, match="cannot read"):
        StreamSchema.from_file(tmp_path / "missing.yaml")


def test_the_fingerprint_is_what_the_schema_means() -> None:
    schema = StreamSchema.from_document(CLICKS)
    # Stable across processes and versions: a digest of a canonical form, pinned here.
    assert schema.fingerprint == StreamSchema.from_document(json.loads(json.dumps(CLICKS))).fingerprint
    assert len(schema.fingerprint) == 64
    spelled = {**CLICKS, "columns": [{**c, "type": c["type"].replace("string", "utf8")} for c in COLUMNS]}
    assert StreamSchema.from_document(spelled).fingerprint == schema.fingerprint  # same types, other spelling
    assert StreamSchema.from_document({**CLICKS, "required": []}).fingerprint != schema.fingerprint
    retyped = [{**c, "type": "decimal(12, 3)"} if c["name"] == "amount" else c for c in COLUMNS]
    assert StreamSchema.from_document({**CLICKS, "columns": retyped}).fingerprint != schema.fingerprint
    # The digest of the canonical text, computed here independently: a change of the encoding shows.
    canonical = (
        '{"columns":[["key","string"],["value","float64"],["ts","int64"]],'
        '"key":"key","event_time":"ts","required":["value"]}'
    )
    assert DEFAULT_STREAM_SCHEMA.fingerprint == hashlib.sha256(canonical.encode()).hexdigest()


SCHEMA = StreamSchema.from_document(CLICKS)
ROW = {
    "user": "u1",
    "amount": Decimal("1.25"),
    "at": datetime(2024, 1, 1, tzinfo=UTC),
    "tags": ["a"],
    "page": {"path": "/", "referrer": None},
    "attrs": [("x", 1)],
}


def test_conform_keeps_fitting_events_and_casts_only_where_no_value_changes() -> None:
    table = pa.Table.from_pylist([ROW, {**ROW, "tags": None, "page": None, "attrs": None}], schema=SCHEMA.input_schema)
    assert conform(SCHEMA, table).equals(table)
    loose = table.set_column(1, "amount", pa.array([1.25, 2.5], pa.float64()))
    loose = loose.set_column(2, "at", pa.array([1_704_067_200_000, 0], pa.int64()))
    fitted = conform(SCHEMA, loose)
    assert fitted.schema == SCHEMA.input_schema
    assert fitted["amount"].to_pylist() == [Decimal("1.25"), Decimal("2.50")]
    assert fitted["at"][0].as_py() == datetime(2024, 1, 1, tzinfo=UTC)


def _bad(**column: pa.Array) -> EventsDoNotMatchSchema:
    table = pa.Table.from_pylist([ROW] * 3, schema=SCHEMA.input_schema)
    for name, values in column.items():
        table = table.set_column(table.column_names.index(name), name, values)
    with pytest.raises(EventsDoNotMatchSchema) as err:
        conform(SCHEMA, table)
    return err.value


@pytest.mark.parametrize(
    ("column", "row", "named"),
    [
        ({"user": pa.array(["a", None, "c"])}, 1, "null"),
        ({"amount": pa.array([1.0, 2.0, 1.255])}, 2, "decimal places"),
        ({"amount": pa.array(["1.5", "x", "2"])}, 1, "'x'"),
        ({"amount": pa.array([Decimal("1.5"), Decimal("1.555"), None], pa.decimal128(12, 3))}, 1, "1.555"),
        ({"at": pa.array(["2024-01-01T00:00:00Z", "2024-01-01T00:00:00Z", "yesterday"])}, 2, "yesterday"),
        ({"tags": pa.array([["a"], [b"\xff".decode("latin-1")], None])}, None, None),  # valid UTF-8: fits
    ],
)
def test_conform_names_the_column_and_the_first_bad_row(
    column: dict[str, pa.Array], row: int | None, named: str | None
) -> None:
    if named is None:
        table = pa.Table.from_pylist([ROW] * 3, schema=SCHEMA.input_schema)
        name, values = next(iter(column.items()))
        conform(SCHEMA, table.set_column(table.column_names.index(name), name, values))
        return
    err = _bad(**column)
    assert (err.column, err.row) == (next(iter(column)), row) and named in err.reason, err


def test_conform_refuses_invalid_utf8_at_any_depth_and_missing_unknown_or_offset_columns() -> None:
    # Arrow strings are unchecked bytes: a list of strings built from raw bytes.
    raw = pa.array([["a"], [b"\xff"], ["c"]], pa.list_(pa.binary()))
    broken = pa.ListArray.from_arrays(raw.offsets, raw.values.view(pa.string()))
    assert _bad(tags=broken).row == 1 and "UTF-8" in _bad(tags=broken).reason
    table = pa.Table.from_pylist([ROW], schema=SCHEMA.input_schema)
    for events, column in [
        (table.drop_columns(["tags"]), "tags"),
        (table.append_column("colour", pa.array(["red"])), "colour"),
        (table.append_column("offset", pa.array([0])), "offset"),
    ]:
        with pytest.raises(EventsDoNotMatchSchema) as err:
            conform(SCHEMA, events)
        assert err.value.column == column and err.value.row is None


def test_an_int_overflowing_its_column_is_named() -> None:
    schema = StreamSchema.from_document({"columns": {"k": "int32", "t": "int64"}, "key": "k", "event_time": "t"})
    table = pa.table({"k": pa.array([1, 2**31], pa.int64()), "t": pa.array([0, 0], pa.int64())})
    with pytest.raises(EventsDoNotMatchSchema) as err:
        conform(schema, table)
    assert (err.value.column, err.value.row) == ("k", 1)
