"""Events of a stream's own schema read from files: JSON lines, CSV or Parquet (`laminar produce`).

Every file is read and checked whole before anything is appended: a value that does not fit its
column raises `EventFileError` naming the file, the line (or row) and the column.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Literal

import pyarrow as pa
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
    """The file's events as a table of the stream's input columns (plus ``partition`` if the file has one)."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise EventFileError(path, "file", exc.strerror or str(exc)) from None
    name = "stdin" if path == "-" else path
    if fmt == "parquet":
        try:
            table = pq.read_table(pa.BufferReader(data))
        except (pa.ArrowException, OSError) as exc:
            raise EventFileError(name, "Parquet", str(exc)) from None
        where = "row"
    elif fmt == "csv":
        nested = [f.name for f in schema.input_schema if pa.types.is_nested(f.type)]
        if nested:
            raise EventFileError(name, f"column {nested[0]!r}", "lists, structs and maps need JSON lines or Parquet")
        types = {f.name: f.type for f in schema.input_schema}
        try:
            table = pcsv.read_csv(io.BytesIO(data), convert_options=pcsv.ConvertOptions(column_types=types))
        except pa.ArrowInvalid as exc:
            raise EventFileError(name, "CSV", str(exc)) from None
        where = "data row"
    else:
        return _read_jsonl(name, data, schema)
    try:
        return _conformed(schema, table)
    except EventsDoNotMatchSchema as exc:
        at = f"{where} {exc.row + 1}, " if exc.row is not None else ""
        raise EventFileError(name, f"{at}column {exc.column!r}", exc.reason) from None


def _conformed(schema: StreamSchema, table: pa.Table) -> pa.Table:
    if "partition" in table.column_names and table["partition"].null_count == table.num_rows:
        table = table.drop_columns(["partition"])
    events = conform(schema, table)
    if "partition" in table.column_names:
        events = events.append_column("partition", table["partition"])
    return events


def _read_jsonl(name: str, data: bytes, schema: StreamSchema) -> pa.Table:
    """JSON lines with the schema given (no guessing); a bad line is found and named by its number."""
    fields = list(schema.input_schema)
    # An optional "partition" picks the partition; without it, the key routes the event.
    explicit = pa.schema([*(pa.field(f.name, f.type) for f in fields), pa.field("partition", pa.int64())])
    try:
        table = pjson.read_json(
            io.BytesIO(data),
            parse_options=pjson.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="error"),
        )
        return _conformed(schema, table)
    except (pa.ArrowInvalid, EventsDoNotMatchSchema):
        pass
    # Slow path, only to say which line is wrong: each line on its own.
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
        try:
            one = pjson.read_json(io.BytesIO(line), parse_options=pjson.ParseOptions(explicit_schema=explicit))
            conform(schema, one)
        except pa.ArrowInvalid as exc:
            raise EventFileError(name, f"line {number}", str(exc).splitlines()[0]) from None
        except EventsDoNotMatchSchema as exc:
            raise EventFileError(name, f"line {number}, column {exc.column!r}", exc.reason) from None
    raise EventFileError(name, "file", "its lines are valid one by one but not together")
