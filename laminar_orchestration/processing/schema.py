"""A stream's record schema: the user's columns, which one is the key and which the event time.

A schema is written as a small JSON or YAML document::

    columns:
      - {name: user_id, type: string}
      - {name: amount, type: "decimal(12, 2)"}
      - {name: at, type: "timestamp[ms, UTC]"}
      - {name: tags, type: "list<string>"}
      - {name: page, type: "struct<path: string, referrer: string>"}
      - {name: attrs, type: "map<string, int64>"}
    key: user_id
    event_time: at

Types: ``string``, ``binary``, ``bool``, ``int8``..``int64``, ``uint8``..``uint64``,
``float32``/``float64`` (``float``, ``double``), ``decimal(p, s)``, ``date``,
``timestamp[unit]`` or ``timestamp[unit, tz]``, ``list<T>``, ``struct<name: T, ...>`` and
``map<K, V>``. The key column is a string or an integer; the event time a timestamp or
int64 epoch milliseconds. A column may hold nulls unless it is the key or the event time,
or is listed under ``required``. The source log prepends its own ``offset`` column.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from laminar_orchestration.errors import InvalidInputError

#: The log's own column, first in every stored event.
OFFSET_COLUMN = "offset"
#: Names a user column may not take: the log's offset and what a node stamps on every record.
RESERVED_COLUMNS = frozenset({OFFSET_COLUMN, "epoch", "generation", "partition"})


class InvalidSchema(InvalidInputError):
    """A schema document that cannot describe a stream; `where` names the field or column."""

    where: str
    reason: str

    message = "stream schema: {where}: {reason}"


class EventsDoNotMatchSchema(InvalidInputError):
    """Events whose columns or values do not fit the stream's schema; nothing of them is appended."""

    column: str
    row: int | None
    reason: str

    def _message(self) -> str:
        at = f", row {self.row}" if self.row is not None else ""
        return f"column {self.column!r}{at}: {self.reason}"


# --- type specs ---------------------------------------------------------------------------

_PRIMITIVES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "utf8": pa.string(),
    "binary": pa.binary(),
    "bool": pa.bool_(),
    "boolean": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float32": pa.float32(),
    "float": pa.float32(),
    "float64": pa.float64(),
    "double": pa.float64(),
    "date": pa.date32(),
    "date32": pa.date32(),
}
_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:\[\]]|\S)")


class _TypeParser:
    """Recursive descent over a type spec such as ``map<string, list<struct<a: int64>>>``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = [t for t in _TOKEN.findall(text) if t]
        self.pos = 0

    def fail(self, reason: str) -> InvalidSchema:
        return InvalidSchema(f"type {self.text!r}", reason)

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None:
            raise self.fail(f"ends early{f', expected {expected!r}' if expected else ''}")
        if expected is not None and token != expected:
            raise self.fail(f"expected {expected!r} at {token!r}")
        self.pos += 1
        return token

    def parse(self) -> pa.DataType:
        result = self.type()
        if self.peek() is not None:
            raise self.fail(f"unexpected {self.peek()!r} after the type")
        return result

    def type(self) -> pa.DataType:
        name = self.take().lower()
        if name in _PRIMITIVES:
            return _PRIMITIVES[name]
        if name == "decimal":
            self.take("(")
            precision = int(self.number())
            self.take(",")
            scale = int(self.number())
            self.take(")")
            if not 1 <= precision <= 38 or not 0 <= scale <= precision:
                raise self.fail(f"decimal({precision}, {scale}) needs 1 <= precision <= 38 and 0 <= scale <= precision")
            return pa.decimal128(precision, scale)
        if name == "timestamp":
            unit, tz = "ms", None
            if self.peek() == "[":
                self.take("[")
                unit = self.take()
                if self.peek() == ",":
                    self.take(",")
                    tz = self.timezone()
                self.take("]")
            if unit not in ("s", "ms", "us", "ns"):
                raise self.fail(f"timestamp unit {unit!r} is not one of s, ms, us, ns")
            return pa.timestamp(unit, tz=tz)
        if name == "list":
            self.take("<")
            item = self.type()
            self.take(">")
            return pa.list_(item)
        if name == "map":
            self.take("<")
            key = self.type()
            self.take(",")
            value = self.type()
            self.take(">")
            if not (pa.types.is_string(key) or pa.types.is_integer(key)):
                raise self.fail(f"map keys must be strings or integers, not {key}")
            return pa.map_(key, value)
        if name == "struct":
            self.take("<")
            fields: list[pa.Field] = []
            while True:
                field_name = self.take()
                self.take(":")
                fields.append(pa.field(field_name, self.type()))
                if self.peek() == ",":
                    self.take(",")
                    continue
                self.take(">")
                break
            names = [f.name for f in fields]
            if len(set(names)) != len(names):
                raise self.fail(f"struct field names repeat: {names}")
            return pa.struct(fields)
        raise self.fail(f"unknown type {name!r}")

    def number(self) -> str:
        token = self.take()
        if not token.isdigit():
            raise self.fail(f"expected a number at {token!r}")
        return token

    def timezone(self) -> str:
        # A zone name may hold '/', '+', '-' and ':' ("Europe/Paris", "+01:00"): take up to ']'.
        parts: list[str] = []
        while self.peek() not in ("]", None):
            parts.append(self.take())
        if not parts:
            raise self.fail("empty time zone")
        return "".join(parts)


def parse_type(spec: str) -> pa.DataType:
    """The Arrow type a type spec names (`InvalidSchema` naming what is wrong otherwise)."""
    return _TypeParser(spec).parse()


#: The spec each primitive type is written back as (the first of its names above).
_SPEC_OF: dict[pa.DataType, str] = {}
for _name, _type in _PRIMITIVES.items():
    _SPEC_OF.setdefault(_type, _name)


def type_spec(data_type: pa.DataType) -> str:
    """The spec of an Arrow type, such that ``parse_type(type_spec(t)) == t``."""
    if data_type in _SPEC_OF:
        return _SPEC_OF[data_type]
    if pa.types.is_decimal(data_type):
        return f"decimal({data_type.precision}, {data_type.scale})"
    if pa.types.is_timestamp(data_type):
        return f"timestamp[{data_type.unit}{', ' + data_type.tz if data_type.tz else ''}]"
    if pa.types.is_list(data_type):
        return f"list<{type_spec(data_type.value_type)}>"
    if pa.types.is_map(data_type):
        return f"map<{type_spec(data_type.key_type)}, {type_spec(data_type.item_type)}>"
    if pa.types.is_struct(data_type):
        inner = ", ".join(f"{f.name}: {type_spec(f.type)}" for f in data_type)
        return f"struct<{inner}>"
    raise InvalidSchema("type", f"{data_type} has no spec")


# --- the schema -------------------------------------------------------------------------


class ColumnSpec(BaseModel):
    """One column of a stream: its name and type spec."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    type: str = Field(min_length=1, max_length=1024)

    @property
    def arrow_type(self) -> pa.DataType:
        return parse_type(self.type)


class StreamSchema(BaseModel):
    """The columns of a stream's events, its key column and its event-time column (persisted)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    columns: list[ColumnSpec] = Field(min_length=1, max_length=1000)
    key: str
    event_time: str
    #: Columns besides the key and the event time that must never be null.
    required: list[str] = Field(default_factory=list)

    @field_validator("columns")
    @classmethod
    def _types_parse(cls, columns: list[ColumnSpec]) -> list[ColumnSpec]:
        names = [c.name for c in columns]
        for c in columns:
            if c.name in RESERVED_COLUMNS:
                raise ValueError(f"column name {c.name!r} is reserved ({', '.join(sorted(RESERVED_COLUMNS))})")
            c.arrow_type  # noqa: B018 - parses, raising InvalidSchema naming the type
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"column names repeat: {repeated}")
        return columns

    @model_validator(mode="after")
    def _roles_exist(self) -> StreamSchema:
        types = {c.name: c.arrow_type for c in self.columns}
        if self.key not in types:
            raise ValueError(f"key column {self.key!r} is not among the columns {list(types)}")
        if self.event_time not in types:
            raise ValueError(f"event_time column {self.event_time!r} is not among the columns {list(types)}")
        key_type, time_type = types[self.key], types[self.event_time]
        if not (pa.types.is_string(key_type) or pa.types.is_integer(key_type)):
            raise ValueError(f"key column {self.key!r} has type {key_type}; a key is a string or an integer")
        if not (pa.types.is_timestamp(time_type) or time_type == pa.int64()):
            raise ValueError(
                f"event_time column {self.event_time!r} has type {time_type}; "
                "event time is a timestamp or int64 epoch milliseconds"
            )
        unknown = [r for r in self.required if r not in types]
        if unknown:
            raise ValueError(f"required column(s) {unknown} are not among the columns")
        return self

    # -- Arrow views -------------------------------------------------------------------

    @property
    def input_schema(self) -> pa.Schema:
        """The columns a producer appends (no offset)."""
        not_null = {self.key, self.event_time, *self.required}
        return pa.schema([pa.field(c.name, c.arrow_type, nullable=c.name not in not_null) for c in self.columns])

    @property
    def event_schema(self) -> pa.Schema:
        """The columns of every stored event: the log's ``offset``, then the input columns."""
        return pa.schema([pa.field(OFFSET_COLUMN, pa.int64(), nullable=False), *self.input_schema])

    @property
    def fingerprint(self) -> str:
        """A digest of what the schema means (names, types, roles), for the cluster's record."""
        canonical = json.dumps(
            {
                "columns": [[c.name, type_spec(c.arrow_type)] for c in self.columns],
                "key": self.key,
                "event_time": self.event_time,
                "required": sorted(self.required),
            },
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()

    def event_time_millis(self, events: pa.Table) -> pa.Array | pa.ChunkedArray:
        """The event-time column of `events` as int64 epoch milliseconds."""
        column = events[self.event_time]
        if pa.types.is_timestamp(column.type):
            return pc.cast(pc.cast(column, pa.timestamp("ms", tz=column.type.tz)), pa.int64())
        return column

    # -- reading a schema document ---------------------------------------------------------

    @classmethod
    def from_document(cls, document: Any, *, source: str = "schema") -> StreamSchema:
        """A schema from a parsed JSON/YAML document; `InvalidSchema` naming the first problem."""
        if not isinstance(document, dict):
            raise InvalidSchema(source, f"expected a mapping with 'columns', 'key' and 'event_time', got {document!r}")
        columns = document.get("columns")
        if isinstance(columns, dict):  # the short form: {name: type, ...}
            document = {**document, "columns": [{"name": k, "type": v} for k, v in columns.items()]}
        try:
            return cls.model_validate(document)
        except InvalidSchema:
            raise
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            cause = first.get("ctx", {}).get("error")
            if isinstance(cause, InvalidSchema):
                raise cause from None
            raise InvalidSchema(f"{source}: {where}" if where else source, str(first.get("msg"))) from None

    @classmethod
    def from_file(cls, path: str | Path) -> StreamSchema:
        """Read a schema file: JSON (``.json``) or YAML (anything else)."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise InvalidSchema(str(p), f"cannot read: {exc.strerror or exc}") from None
        try:
            if p.suffix.lower() == ".json":
                document = json.loads(text)
            else:
                import yaml

                document = yaml.safe_load(text)
        except (ValueError, ImportError) as exc:
            raise InvalidSchema(
                str(p), f"not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'}: {exc}"
            ) from None
        except Exception as exc:  # yaml.YAMLError and its kin
            raise InvalidSchema(str(p), f"not valid YAML: {exc}") from None
        return cls.from_document(document, source=str(p))


#: The schema of a cluster initialised without ``--schema``: the demo's events.
DEFAULT_STREAM_SCHEMA = StreamSchema(
    columns=[
        ColumnSpec(name="key", type="string"),
        ColumnSpec(name="value", type="float64"),
        ColumnSpec(name="ts", type="int64"),
    ],
    key="key",
    event_time="ts",
    required=["value"],
)


# --- events against the schema ------------------------------------------------------------


def _first_bad_row(column: pa.ChunkedArray | pa.Array, ok: Callable[[pa.Array], bool]) -> int:
    """The first row of `column` for which `ok` fails on its own (bisection over slices)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    lo, hi = 0, len(array)  # the first bad row is in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(array.slice(lo, mid - lo)):
            lo = mid
        else:
            hi = mid
    return lo


def conform(schema: StreamSchema, events: pa.Table) -> pa.Table:
    """`events` with exactly the schema's input columns and types, or `EventsDoNotMatchSchema` naming
    the column and the first row (0-based) that does not fit.

    Every column of the schema must be there and no other (``offset`` is the log's; a ``partition``
    column is left to the caller, which routes by it). Values are cast only where none changes
    (`pc.cast(..., safe=True)`: no overflow, truncation or lost decimal places); the key, the event
    time and the required columns hold no nulls; strings, at any depth, are valid UTF-8.
    """
    target = schema.input_schema
    names = set(events.column_names)
    if OFFSET_COLUMN in names:
        raise EventsDoNotMatchSchema(OFFSET_COLUMN, None, "offsets are assigned by the log")
    unknown = sorted(names - set(target.names) - {"partition"})
    if unknown:
        raise EventsDoNotMatchSchema(unknown[0], None, f"not a column of the stream (its columns: {target.names})")
    columns: list[pa.ChunkedArray | pa.Array] = []
    for f in target:
        if f.name not in names:
            raise EventsDoNotMatchSchema(f.name, None, "missing (a column without values: give it as nulls)")
        column = events[f.name]
        if column.type != f.type:
            try:
                column = pc.cast(column, f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                if isinstance(exc, pa.ArrowNotImplementedError) or not len(column):
                    raise EventsDoNotMatchSchema(f.name, None, f"has type {column.type}, not {f.type}") from None

                def casts(part: pa.Array, to: pa.DataType = f.type) -> bool:
                    try:
                        pc.cast(part, to, safe=True)
                    except (pa.ArrowInvalid, pa.ArrowTypeError):
                        return False
                    return True

                row = _first_bad_row(column, casts)
                value = column[row].as_py()
                raise EventsDoNotMatchSchema(f.name, row, f"{value!r} is not a {f.type}") from None
            if pa.types.is_decimal(f.type) and pa.types.is_floating(events[f.name].type):
                _check_exact(f.name, f.type, events[f.name], column)
        if not f.nullable and column.null_count:
            row = _first_bad_row(column, lambda part: part.null_count == 0)
            raise EventsDoNotMatchSchema(f.name, row, "is null, and it may not be")
        if _holds_strings(f.type):  # Arrow strings are unchecked bytes, at any depth
            try:
                (column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column).validate(full=True)
            except pa.ArrowInvalid:
                row = _first_bad_row(column, _valid)
                raise EventsDoNotMatchSchema(f.name, row, "is not valid UTF-8") from None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=target)


def _holds_strings(data_type: pa.DataType) -> bool:
    if pa.types.is_string(data_type):
        return True
    if pa.types.is_map(data_type):
        return _holds_strings(data_type.key_type) or _holds_strings(data_type.item_type)
    if pa.types.is_list(data_type):
        return _holds_strings(data_type.value_type)
    if pa.types.is_struct(data_type):
        return any(_holds_strings(f.type) for f in data_type)
    return False


def _check_exact(
    name: str, to: pa.DataType, floats: pa.ChunkedArray | pa.Array, cast: pa.ChunkedArray | pa.Array
) -> None:
    """A float cast to a decimal rounds silently (1.255 to decimal(12, 2) is 1.25): refuse a value
    the decimal does not hold exactly as written."""
    back = pc.cast(cast, floats.type)
    same = pc.fill_null(pc.equal(back, floats), True)
    if not pc.all(same).as_py():
        row = _first_bad_row(same, lambda part: bool(pc.all(part).as_py()))
        raise EventsDoNotMatchSchema(name, row, f"{floats[row].as_py()!r} has more decimal places than {to} holds")


def _valid(part: pa.Array) -> bool:
    try:
        # A slice of a nested array keeps all its children: a copy holds only the slice's values.
        pa.concat_arrays([part]).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True
