"""`laminar init --schema --processor` and `laminar produce` of a stream of one's own: the schema and
processor recorded, files of every format read against the schema, and every bad input one clear
line with exit code 2 and nothing written."""

from __future__ import annotations

import io
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


def test_init_and_status_show_the_stream(clicks: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert cli.main(["status", "--store", clicks]) == 0
    text = capsys.readouterr().out
    assert f"stream: processor {PROCESSOR}" in text and "user string (key)" in text and "(event time)" in text
    assert cli.main(["status", "--store", clicks, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["stream"]
    record = read_stream_record(open_store(clicks))
    assert record is not None
    assert shown["processor"] == PROCESSOR and shown["processor_fingerprint"] == record.processor_fingerprint
    assert StreamSchema.model_validate(shown["schema"]) == record.stream_schema
    url = (tmp_path / "plain").as_uri()
    assert cli.main(["init", "--store", url, "--partitions", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stream"]["processor_fingerprint"] is None  # the default stream


FLAT = {
    "columns": {"user": "string", "n": "int32", "price": "decimal(8, 2)", "at": "timestamp[ms, UTC]"},
    "key": "user",
    "event_time": "at",
}


@pytest.fixture
def flat(tmp_path: Path) -> str:
    """A cluster of 3 partitions whose stream has only flat columns (CSV can hold it)."""
    from laminar_orchestration.protocol.keys import STREAM_KEY
    from laminar_orchestration.protocol.stream import StreamRecord

    url = (tmp_path / "flat").as_uri()
    assert cli.main(["init", "--store", url, "--partitions", "3"]) == 0
    record = StreamRecord.model_validate(
        {
            "schema": StreamSchema.from_document(FLAT),
            "processor": "tests:flat",
            "processor_fingerprint": "0" * 64,
            "created_at": "2024-01-01T00:00:00Z",
        }
    )
    open_store(url).put_if_absent(STREAM_KEY, record.to_bytes())
    return url


def _read_all(url: str, partitions: int = 3) -> list[dict[str, object]]:
    log = SourceLog(open_store(url), partitions=partitions, schema=StreamSchema.from_document(FLAT))
    rows: list[dict[str, object]] = []
    for p in range(partitions):
        batch = log.read(p, 0, 1000)
        if batch is not None:
            rows += batch.to_table().drop_columns(["offset"]).to_pylist()
    return sorted(rows, key=lambda r: (str(r["user"]), str(r["at"])))


def test_produce_csv_jsonl_and_parquet_of_one_schema_agree(
    flat: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    csv = tmp_path / "e.csv"
    csv.write_text("user,n,price,at\na,1,1.50,2024-01-01T00:00:00Z\nb,,2,1704067260000\n")
    assert cli.main(["produce", "--store", flat, "--from-file", str(csv)]) == 0
    once = _read_all(flat)
    assert [(r["user"], r["n"], str(r["price"])) for r in once] == [("a", 1, "1.50"), ("b", None, "2.00")]
    # The same events as JSON lines (epoch ms and ISO, a decimal as a number) through stdin, and as Parquet.
    lines = '{"user": "a", "n": 1, "price": 1.5, "at": 1704067200000}\n'
    lines += '{"user": "b", "n": null, "price": "2", "at": "2024-01-01T00:01:00+00:00"}\n'
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(lines.encode())))
    assert cli.main(["produce", "--store", flat, "--from-file", "-", "--format", "jsonl"]) == 0
    parquet = tmp_path / "e.bin"
    pq.write_table(pa.Table.from_pylist(once, schema=StreamSchema.from_document(FLAT).input_schema), parquet)
    assert cli.main(["produce", "--store", flat, "--from-file", str(parquet), "--format", "parquet"]) == 0
    assert _read_all(flat) == sorted(once * 3, key=lambda r: (str(r["user"]), str(r["at"])))


@pytest.mark.parametrize(
    ("name", "content", "named"),
    [
        ("bad.csv", "user,n,price,at\na,1,1.50,2024-01-01T00:00:00Z\nb,x,2,2024-01-01T00:00:00Z\n", "data row 2"),
        ("scale.csv", "user,n,price,at\na,1,1.505,2024-01-01T00:00:00Z\n", "column 'price'"),
        (
            "big.jsonl",
            '{"user": "a", "n": 1, "price": 1, "at": 0}\n\n{"user": "a", "n": 3000000000, "price": 1, "at": 0}\n',
            "line 3",
        ),
        ("when.jsonl", '{"user": "a", "n": 1, "price": 1, "at": "later"}\n', "column 'at'"),
        ("nokey.jsonl", '{"n": 1, "price": 1, "at": 0}\n', "column 'user'"),
        ("notjson.jsonl", '{"user": "a", "n": 1, "price": 1, "at": 0}\n{"user"\n', "line 2"),
        ("where.jsonl", '{"user": "a", "n": 1, "price": 1, "at": 0, "partition": 7}\n', "'partition'"),
        ("wrong.parquet", None, "column 'n'"),
        ("noformat.txt", "user\n", "--format"),
    ],
)
def test_a_bad_events_file_is_one_line_exit_2_and_the_log_ends_do_not_move(
    flat: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: str | None, named: str
) -> None:
    path = tmp_path / name
    if content is None:
        pq.write_table(pa.table({"user": ["a"], "n": ["one"], "price": [1.0], "at": [0]}), path)
    else:
        path.write_text(content)
    before = snapshot(flat)
    code, line = run_error(capsys, "produce", "--store", flat, "--from-file", str(path))
    assert code == 2 and str(path) in line and named in line, line
    assert snapshot(flat) == before


def test_the_default_stream_reads_csv_and_stdin_too(
    cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from laminar_orchestration.protocol.source import SourceLog as Log

    csv = tmp_path / "e.csv"
    csv.write_text("partition,key,value,ts\n0,k1,2.5,1\n1,k2,1,2\n")
    assert cli.main(["produce", "--store", cluster, "--from-file", str(csv)]) == 0
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'{"partition": 0, "key": "k3", "value": 1}\n')))
    assert cli.main(["produce", "--store", cluster, "--from-file", "-"]) == 0
    log = Log(open_store(cluster), partitions=2)
    assert (log.end_offset(0), log.end_offset(1)) == (2, 1)
