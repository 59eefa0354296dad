"""`laminar init --schema --processor` and `laminar produce` of a stream of one's own: the schema and
processor recorded, files of every format read against the schema, and every bad input one clear
line with exit code 2 and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from laminar_orchestration import cli
from laminar_orchestration.processing.schema import StreamSchema
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.stream import read_stream_record
from laminar_orchestration.store import open_store
from tests.cli.conftest import run_error, snapshot

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CLICKS = str(EXAMPLES / "clicks.yaml")
PROCESSOR = "examples.windowed_counts:processor"


@pytest.fixture
def clicks(tmp_path: Path) -> str:
    url = (tmp_path / "store").as_uri()
    assert cli.main(["init", "--store", url, "--partitions", "2", "--schema", CLICKS, "--processor", PROCESSOR]) == 0
    return url


def _line(user: str, at: str, **extra: object) -> str:
    return json.dumps({"user": user, "page": "/a", "amount": "1.25", "tags": ["x"], "at": at, **extra})


def _ends(url: str) -> dict[int, int]:
    log = SourceLog(open_store(url), partitions=2, schema=StreamSchema.from_file(CLICKS))
    return {p: log.end_offset(p) for p in range(2)}


def test_init_records_the_schema_and_the_processor_and_a_second_init_with_another_is_refused(
    clicks: str, capsys: pytest.CaptureFixture[str]
) -> None:
    record = read_stream_record(open_store(clicks))
    assert record is not None
    assert record.processor == PROCESSOR and record.stream_schema == StreamSchema.from_file(CLICKS)
    before = snapshot(clicks)
    other = "examples.sessions:processor"
    argv = ["init", "--store", clicks, "--partitions", "2", "--force", "--schema", CLICKS, "--processor", other]
    code, line = run_error(capsys, *argv)
    assert code == 4 and other in line and PROCESSOR in line
    # The default processor cannot run on this schema (it reads a "value" column): refused before any write.
    code, line = run_error(capsys, "init", "--store", clicks, "--partitions", "2", "--force", "--schema", CLICKS)
    assert code == 2 and "'value'" in line
    assert snapshot(clicks) == before


def test_produce_reads_jsonl_csv_parquet_and_stdin_against_the_schema_routing_by_key(
    clicks: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jsonl = tmp_path / "events.jsonl"
    jsonl.write_text("\n".join(_line(f"u{i}", f"2024-01-01T00:0{i}:00Z") for i in range(6)) + "\n")
    assert cli.main(["produce", "--store", clicks, "--from-file", str(jsonl)]) == 0
    parquet = tmp_path / "events.parquet"
    schema = StreamSchema.from_file(CLICKS).input_schema
    rows = [{"user": "u1", "page": "/b", "amount": None, "tags": None, "at": None}]
    rows[0]["at"] = pa.scalar(1_704_067_200_000, pa.timestamp("ms", "UTC")).as_py()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), parquet)
    assert cli.main(["produce", "--store", clicks, "--from-file", str(parquet)]) == 0
    assert sum(_ends(clicks).values()) == 7
    log = SourceLog(open_store(clicks), partitions=2, schema=StreamSchema.from_file(CLICKS))
    users = {p: set() for p in range(2)}  # type: dict[int, set[str]]
    for p in range(2):
        batch = log.read(p, 0, 100)
        if batch is not None:
            users[p] = set(batch.to_table()["user"].to_pylist())
    assert not users[0] & users[1]  # one key, one partition
    assert users[0] | users[1] == {f"u{i}" for i in range(6)}


def test_bad_events_are_one_line_exit_2_and_nothing_appended(
    clicks: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong_type = tmp_path / "wrong.jsonl"
    wrong_type.write_text(
        _line("u1", "2024-01-01T00:00:00Z") + "\n" + _line("u2", "2024-01-01T00:01:00Z", tags=5) + "\n"
    )
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(_line("u1", "2024-01-01T00:00:00Z", colour="red") + "\n")
    missing_key = tmp_path / "missing.jsonl"
    missing_key.write_text(json.dumps({"page": "/a", "at": "2024-01-01T00:00:00Z"}) + "\n")
    nested_csv = tmp_path / "events.csv"
    nested_csv.write_text("user,page,amount,tags,at\nu1,/a,1.0,x,2024-01-01T00:00:00Z\n")
    before = snapshot(clicks)
    cases = [
        (wrong_type, "line 2"),
        (unknown, "'colour'"),
        (missing_key, "'user'"),
        (nested_csv, "'tags'"),
    ]
    for path, named in cases:
        code, line = run_error(capsys, "produce", "--store", clicks, "--from-file", str(path))
        assert code == 2 and str(path) in line and named in line, line
    assert snapshot(clicks) == before


def test_a_malformed_schema_or_an_unknown_processor_is_one_line_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = (tmp_path / "store").as_uri()
    bad = tmp_path / "bad.yaml"
    bad.write_text("columns:\n  - {name: user, type: 'list<'}\nkey: user\nevent_time: user\n")
    code, line = run_error(capsys, "init", "--store", url, "--partitions", "1", "--schema", str(bad))
    assert code == 2 and "list<" in line
    code, line = run_error(
        capsys, "init", "--store", url, "--partitions", "1", "--processor", "examples.nope:processor"
    )
    assert code == 2 and "examples.nope" in line
    assert not (tmp_path / "store").exists() or not list(open_store(url).list(""))
