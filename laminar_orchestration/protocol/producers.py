"""Ready-made producers for the source log: the events of a JSONL file, and deterministic generated
load."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
from pydantic import ValidationError

from laminar_orchestration.protocol.segments import AppendResult
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.source_errors import BadInputLine, InputFileError
from laminar_orchestration.protocol.source_events import _INPUT_SCHEMA, SourceEvent

#: Longest JSONL input line, in bytes (newline excluded); lines are read with this bound.
MAX_LINE_BYTES = 1024 * 1024


def produce_from_jsonl(path: str | os.PathLike[str], log: SourceLog) -> dict[int, AppendResult]:
    """Append the events of a JSONL file (one `SourceEvent` object per line).

    Every line is validated before anything is appended: a bad line raises
    `BadInputLine` naming the file and the 1-based line number, and nothing of
    the file is appended; a file that cannot be read raises `InputFileError`.
    Lines longer than `MAX_LINE_BYTES` are rejected without reading them
    whole (``/dev/zero`` fails fast). Blank lines are skipped. Returns one
    result per partition that received events. (A store failure midway can
    still leave earlier partitions appended; each partition's append is
    all-or-nothing per segment.)
    """
    keys: dict[int, list[str]] = {}
    values: dict[int, list[float]] = {}
    stamps: dict[int, list[int | None]] = {}
    name = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            line_number = 0
            while raw := fh.readline(MAX_LINE_BYTES + 2):  # the line, its newline (maybe CRLF), one more
                line_number += 1
                if len(raw.rstrip(b"\r\n")) > MAX_LINE_BYTES:
                    raise BadInputLine(name, line_number, f"line is longer than {MAX_LINE_BYTES} bytes")
                if not raw.strip():
                    continue
                ev = _parse_line(name, line_number, raw, log.partitions)
                keys.setdefault(ev.partition, []).append(ev.key)
                values.setdefault(ev.partition, []).append(ev.value)
                stamps.setdefault(ev.partition, []).append(ev.ts)
    except FileNotFoundError:
        raise InputFileError(name, "no such file") from None
    except IsADirectoryError:
        raise InputFileError(name, "it is a directory, not a file") from None
    except OSError as exc:
        raise InputFileError(name, exc.strerror or str(exc)) from None
    tables = {
        partition: pa.table(
            {
                "key": pa.array(keys[partition], pa.string()),
                "value": pa.array(values[partition], pa.float64()),
                "ts": pa.array(stamps[partition], pa.int64()),
            }
        )
        for partition in sorted(keys)
    }
    return log.append_many(tables)


def _parse_line(path: str, line_number: int, raw: bytes, partitions: int | None) -> SourceEvent:
    try:
        ev = SourceEvent.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        reason = f"{where}: {first['msg']}" if where else str(first["msg"])
        raise BadInputLine(path, line_number, reason) from None
    if partitions is not None and ev.partition >= partitions:
        raise BadInputLine(path, line_number, f"partition: {ev.partition} out of range 0..{partitions - 1}")
    return ev


#: First timestamp of `generate_events` (2023-11-14T22:13:20Z), fixed for determinism.
GENERATOR_START_TS = 1_700_000_000_000


def generate_events(
    count: int,
    keys: int,
    seed: int,
    partitions: int,
    *,
    integer_values: bool = False,
    start_ts: int = GENERATOR_START_TS,
) -> dict[int, pa.Table]:
    """Deterministic load: `count` events over keys "k0".."k{keys-1}", split by partition.

    Key ``k{i}`` always goes to partition ``i % partitions`` (keyed state stays in
    one partition). Values are uniform floats in [0, 100), or integers in [0, 100]
    (exact sums for exactly-once checks) with `integer_values`. ``ts`` increases by
    1 ms per event from `start_ts` in global event order. Every partition gets a
    table (possibly empty) with columns key, value, ts, ready for `SourceLog.append`.
    """
    if count < 0 or keys < 1 or partitions < 1:
        raise ValueError("need count >= 0, keys >= 1, partitions >= 1")
    rng = np.random.default_rng(seed)
    key_idx = rng.integers(0, keys, size=count, dtype=np.int64)
    if integer_values:
        vals = rng.integers(0, 101, size=count).astype(np.float64)
    else:
        vals = rng.random(count) * 100.0
    ts = np.arange(start_ts, start_ts + count, dtype=np.int64)
    names = pa.array([f"k{i}" for i in range(keys)], pa.string())
    table = pa.Table.from_arrays([names.take(pa.array(key_idx)), pa.array(vals), pa.array(ts)], schema=_INPUT_SCHEMA)
    part_of = key_idx % partitions
    return {p: table.filter(pa.array(part_of == p)) for p in range(partitions)}
