"""Events of a stream's own schema read from files: JSON lines, CSV or Parquet (`laminar produce`).

Every file is read and checked whole before anything is appended: a value that does not fit its
column raises `EventFileError` naming the file, the line (or row) and the column.
"""

from __future__ import annotations

import io
import json
import sys
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

from laminar_orchestration.errors import InvalidInputError
from laminar_orchestration.processing.schema import EventsDoNotMatchSchema, StreamSchema, conform

Format = Literal["jsonl", "csv", "parquet"]
FORMATS: dict[str, Format] = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
}


class EventFileError(InvalidInputError):
    """An events file that cannot be read against the stream's schema; nothing of it is appended."""

    path: str
    where: str
    reason: str

    message = "{path}: {where}: {reason}"


def file_format(path: str, given: str | None) -> Format:
    """The format `given`, else the one the file's suffix names."""
    if given is not None:
        if given not in ("jsonl", "csv", "parquet"):
            raise EventFileError(path, "--format", f"{given!r} is not one of jsonl, csv, parquet")
        return given  # type: ignore[return-value]
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise EventFileError(path, "format", f"cannot tell from {suffix or 'no suffix'!r}: give --format")
    return FORMATS[suffix]


def read_events(path: str, schema: StreamSchema, fmt: Format) -> pa.Table:
    """The file's events as a table of the stream's input columns (plus ``partition`` if the file has one).

    JSON lines: one object per line with the stream's columns (timestamps as ISO-8601 strings or
    epoch milliseconds, decimals as strings or numbers, lists, structs and maps as JSON arrays and
    objects), errors naming the line. CSV: a header line, then one event per line; flat columns
    only; an empty unquoted field is null; errors name the data row (1 = the line after the
    header). Parquet: errors name the row (1 = the first).
    """
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise EventFileError(path, "file", exc.strerror or str(exc)) from None
    name = "stdin" if path == "-" else path
    if fmt == "jsonl":
        return _read_jsonl(name, data, schema)
    if fmt == "parquet":
        try:
            table = pq.read_table(pa.BufferReader(data))
        except (pa.ArrowException, OSError) as exc:
            raise EventFileError(name, "Parquet", str(exc)) from None
    else:
        table = _read_csv(name, data, schema)
    try:
        return _conformed(schema, table)
    except EventsDoNotMatchSchema as exc:
        at = f"{'data row' if fmt == 'csv' else 'row'} {exc.row + 1}, " if exc.row is not None else ""
        raise EventFileError(name, f"{at}column {exc.column!r}", exc.reason) from None


def _read_csv(name: str, data: bytes, schema: StreamSchema) -> pa.Table:
    nested = [f.name for f in schema.input_schema if pa.types.is_nested(f.type)]
    if nested:
        raise EventFileError(name, f"column {nested[0]!r}", "lists, structs and maps need JSON lines or Parquet")
    # Read as text and cast column by column (`conform`): a value that does not fit is named by its row.
    text = {f.name: pa.string() for f in schema.input_schema}
    try:
        table = pcsv.read_csv(
            io.BytesIO(data),
            convert_options=pcsv.ConvertOptions(
                column_types={**text, "partition": pa.int64()},
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )
    except pa.ArrowInvalid as exc:
        raise EventFileError(name, "CSV", str(exc).splitlines()[0]) from None
    for i, f in enumerate(table.schema):
        target = schema.input_schema.field(f.name).type if f.name in text else None
        if target is not None and pa.types.is_timestamp(target):
            table = table.set_column(i, f.name, _timestamps(table[f.name], target))
    return table


def _timestamps(column: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    """A CSV column of ISO-8601 text or epoch milliseconds (as in JSON lines) as `target`; left as text
    when a value is neither, for `conform` to name its row."""
    millis = pc.fill_null(pc.match_substring_regex(column, r"^-?\d+$"), False)
    if not pc.any(millis).as_py():
        return column
    try:
        from_millis = pc.cast(pc.cast(pc.if_else(millis, column, None), pa.int64()), pa.timestamp("ms", tz=target.tz))
        from_text = pc.cast(pc.if_else(millis, None, column), target)
        return pc.if_else(millis, pc.cast(from_millis, target), from_text)
    except pa.ArrowException:
        return column


def _conformed(schema: StreamSchema, table: pa.Table) -> pa.Table:
    if "partition" in table.column_names and table["partition"].null_count == table.num_rows:
        table = table.drop_columns(["partition"])
    events = conform(schema, table)
    if "partition" in table.column_names:
        events = events.append_column("partition", table["partition"])
    return events


def _read_jsonl(name: str, data: bytes, schema: StreamSchema) -> pa.Table:
    """JSON lines with the schema given (no guessing): Arrow's reader where it takes every value, else
    each line converted on its own, so a bad one is named by its number."""
    fields = list(schema.input_schema)
    # An optional "partition" picks the partition; without it, the key routes the event.
    explicit = pa.schema([*(pa.field(f.name, f.type) for f in fields), pa.field("partition", pa.int64())])
    if not any(_needs_python(f.type) for f in fields):
        try:
            table = pjson.read_json(
                io.BytesIO(data),
                parse_options=pjson.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="error"),
            )
            return _conformed(schema, table)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, EventsDoNotMatchSchema):
            pass
    lines: list[int] = []
    columns: dict[str, list[Any]] = {f.name: [] for f in explicit}
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise EventFileError(name, f"line {number}", f"not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise EventFileError(name, f"line {number}", "not a JSON object")
        unknown = sorted(set(obj) - set(explicit.names))
        if unknown:
            raise EventFileError(name, f"line {number}, column {unknown[0]!r}", "not a column of the stream")
        for f in explicit:
            try:
                columns[f.name].append(_value(f.type, obj.get(f.name)))
            except (TypeError, ValueError, ArithmeticError) as exc:
                raise EventFileError(name, f"line {number}, column {f.name!r}", str(exc)) from None
        lines.append(number)
    arrays = []
    for f in explicit:
        try:
            arrays.append(pa.array(columns[f.name], f.type))
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            row = _first_unconvertible(columns[f.name], f.type)
            raise EventFileError(
                name, f"line {lines[row]}, column {f.name!r}", f"{columns[f.name][row]!r} is not a {f.type}"
            ) from None
    table = pa.Table.from_arrays(arrays, schema=explicit)
    try:
        return _conformed(schema, table)
    except EventsDoNotMatchSchema as exc:
        at = f"line {lines[exc.row]}, " if exc.row is not None and exc.row < len(lines) else ""
        raise EventFileError(name, f"{at}column {exc.column!r}", exc.reason) from None


def _first_unconvertible(values: list[Any], data_type: pa.DataType) -> int:
    for row, value in enumerate(values):
        try:
            pa.array([value], data_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            return row
    return 0


def _needs_python(data_type: pa.DataType) -> bool:
    """Types Arrow's JSON reader cannot read (maps, dates) or reads only from strings (timestamps)."""
    if pa.types.is_map(data_type) or pa.types.is_date(data_type) or pa.types.is_timestamp(data_type):
        return True
    if pa.types.is_list(data_type):
        return _needs_python(data_type.value_type)
    if pa.types.is_struct(data_type):
        return any(_needs_python(f.type) for f in data_type)
    return False


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _value(data_type: pa.DataType, value: Any) -> Any:
    """One JSON value as the Python value Arrow builds `data_type` from (checked types, no guessing)."""
    if value is None:
        return None
    if pa.types.is_timestamp(data_type):
        per_second = _PER_SECOND[data_type.unit]
        if isinstance(value, int) and not isinstance(value, bool):  # epoch milliseconds
            scaled, lost = divmod(value * per_second, 1_000)
            if lost:
                raise ValueError(f"{value} ms is not a whole number of {data_type.unit}")
            return scaled
        if not isinstance(value, str):
            raise TypeError(f"{value!r} is not a timestamp (an ISO-8601 string or epoch milliseconds)")
        at = datetime.fromisoformat(value)
        delta = (at if at.tzinfo is not None else at.replace(tzinfo=UTC)) - _EPOCH
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return micros * per_second // 1_000_000
    if pa.types.is_date(data_type):
        if not isinstance(value, str):
            raise TypeError(f"{value!r} is not a date (an ISO-8601 string)")
        return date.fromisoformat(value)
    if pa.types.is_decimal(data_type):
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise TypeError(f"{value!r} is not a decimal (a string or a number)")
        number = Decimal(str(value))
        exponent = number.as_tuple().exponent
        if not number.is_finite() or (isinstance(exponent, int) and -exponent > data_type.scale):
            raise ValueError(f"{value!r} has more decimal places than {data_type} holds")
        return number
    if pa.types.is_list(data_type):
        if not isinstance(value, list):
            raise TypeError(f"{value!r} is not a list (a JSON array)")
        return [_value(data_type.value_type, v) for v in value]
    if pa.types.is_map(data_type):
        if not isinstance(value, dict):
            raise TypeError(f"{value!r} is not a map (a JSON object)")
        key_type = data_type.key_type
        return [
            (int(k) if pa.types.is_integer(key_type) else k, _value(data_type.item_type, v)) for k, v in value.items()
        ]
    if pa.types.is_struct(data_type):
        if not isinstance(value, dict):
            raise TypeError(f"{value!r} is not a struct (a JSON object)")
        unknown = sorted(set(value) - {f.name for f in data_type})
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not a field of {data_type}")
        return {f.name: _value(f.type, value.get(f.name)) for f in data_type}
    if pa.types.is_integer(data_type) and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{value!r} is not an integer")
    if pa.types.is_floating(data_type) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise TypeError(f"{value!r} is not a number")
    if pa.types.is_boolean(data_type) and not isinstance(value, bool):
        raise TypeError(f"{value!r} is not true or false")
    if (pa.types.is_string(data_type) or pa.types.is_binary(data_type)) and not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value.encode() if pa.types.is_binary(data_type) else value
