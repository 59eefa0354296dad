"""Every CLI error is one line naming what is wrong, a non-zero exit code by kind, and an unchanged store.

These call `cli.main` in-process (a traceback would fail the test as an uncaught
exception) on a local store; `test_main.py` runs the CLI as a subprocess on both backends.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from laminar_orchestration import cli
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.keys import segment_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import MAX_LINE_BYTES
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.source_events import MAX_KEY_BYTES
from laminar_orchestration.store import LocalObjectStore, open_store
from tests.cli.conftest import run_error, snapshot
from tests.commits import commit_all

# -- produce: every line validated before anything is appended ---------------------------


@pytest.mark.parametrize(
    ("bad_line", "named"),
    [
        ('{"partition": 1, "key": "b", "value": 2, "ts": 9223372036854775808}', "ts"),
        ('{"partition": 1, "key": "b", "value": 2, "ts": -9223372036854775809}', "ts"),
        ('{"partition": 1, "key": "b", "value": NaN}', "value"),
        ('{"partition": 1, "key": "b", "value": Infinity}', "value"),
        ('{"partition": 1, "key": "b", "value": 1' + "0" * 400 + "}", "value"),
        ('{"partition": 1, "key": "' + "k" * (MAX_KEY_BYTES + 1) + '", "value": 1}', "key"),
        ('{"partition": 1, "key": "' + "é" * (MAX_KEY_BYTES // 2 + 1) + '", "value": 1}', "bytes"),
        ('{"partition": 2, "key": "b", "value": 1}', "partition"),
        ('{"partition": 99999999, "key": "b", "value": 1}', "partition"),
        ('{"partition": 1, "key": "b", "value": 1, "offset": 5}', "offset"),
    ],
)
def test_produce_rejects_out_of_range_fields_before_appending(
    cluster: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], bad_line: str, named: str
) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text('{"partition": 0, "key": "a", "value": 1}\n' + bad_line + "\n")
    before = snapshot(cluster)
    code, line = run_error(capsys, "produce", "--store", cluster, "--from-file", str(events))
    assert code == 2
    assert "line 2" in line and named in line and str(events) in line
    assert snapshot(cluster) == before
    assert SourceLog(open_store(cluster)).end_offset(0) == 0


def test_produce_accepts_the_int64_bounds(cluster: str, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text(
        '{"partition": 0, "key": "a", "value": 1, "ts": 9223372036854775807}\n'
        '{"partition": 1, "key": "' + "k" * MAX_KEY_BYTES + '", "value": 2, "ts": -9223372036854775808}\n'
    )
    assert cli.main(["produce", "--store", cluster, "--from-file", str(events)]) == 0
    log = SourceLog(open_store(cluster))
    assert (log.end_offset(0), log.end_offset(1)) == (1, 1)


def test_produce_rejects_an_overlong_line_without_reading_it_whole(
    cluster: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "long.jsonl"
    events.write_bytes(b'{"partition": 0, "key": "a", "value": 1}\n' + b" " * (MAX_LINE_BYTES + 1) + b"\n")
    before = snapshot(cluster)
    code, line = run_error(capsys, "produce", "--store", cluster, "--from-file", str(events))
    assert code == 2 and "line 2" in line and f"longer than {MAX_LINE_BYTES} bytes" in line
    assert snapshot(cluster) == before


def test_produce_from_dev_zero_fails_fast(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(cluster)
    started = time.monotonic()
    code, line = run_error(capsys, "produce", "--store", cluster, "--from-file", "/dev/zero")
    assert time.monotonic() - started < 10
    assert code == 2 and "line 1" in line and "longer than" in line
    assert snapshot(cluster) == before


@pytest.mark.parametrize(("make", "reason"), [("missing", "no such file"), ("directory", "directory")])
def test_produce_from_a_missing_file_or_a_directory(
    cluster: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], make: str, reason: str
) -> None:
    target = tmp_path / "input"
    if make == "directory":
        target.mkdir()
    before = snapshot(cluster)
    code, line = run_error(capsys, "produce", "--store", cluster, "--from-file", str(target))
    assert code == 2 and str(target) in line and reason in line
    assert snapshot(cluster) == before


def test_produce_without_input_or_with_negative_count(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_error(capsys, "produce", "--store", cluster)[0] == 2
    code, line = run_error(capsys, "produce", "--store", cluster, "--count", "-5")
    assert code == 2 and "--count" in line


# -- query / verify on damaged data -----------------------------------------------------------


def _committed(url: str) -> LocalObjectStore:
    assert cli.main(["produce", "--store", url, "--count", "40", "--keys", "4"]) == 0
    store = open_store(url)
    assert isinstance(store, LocalObjectStore)
    token = Ledger(store).acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    commit_all(store, token)
    return store


def test_query_with_a_missing_checkpoint_names_it(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = _committed(cluster)
    current = ManifestReader(store).current(PartitionId(0))
    assert current is not None and current.manifest.snapshot is not None
    checkpoint = current.manifest.snapshot.files[0].ref.key
    store.object_path(checkpoint).unlink()  # lost by an operator or a broken bucket policy
    before = snapshot(cluster)
    code, line = run_error(capsys, "query", "--store", cluster, "--partition", "0")
    assert code == 6 and checkpoint in line and "missing" in line
    assert snapshot(cluster) == before


def test_verify_with_a_torn_source_segment_names_the_frame(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = _committed(cluster)
    key = segment_key(0, 0)
    path = store.object_path(key)
    obj = store.get(key)
    store.put_if_match(key, b"\x00" * 64 + obj.data[64:], obj.etag)
    assert path.exists()
    before = snapshot(cluster)
    code, line = run_error(capsys, "verify", "--store", cluster)
    assert code == 6 and key in line
    assert snapshot(cluster) == before


# -- init ----------------------------------------------------------------------------------------


def test_interrupted_init_says_how_to_complete_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self: Ledger, partitions: int, *, force: bool = False, **stream: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Ledger, "init_cluster", interrupted)
    assert cli.main(["init", "--store", (tmp_path / "s").as_uri(), "--partitions", "2"]) == 130
    assert "run the same `laminar init` again" in capsys.readouterr().err


def test_commands_on_an_uninitialized_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, line = run_error(capsys, "status", "--store", empty.as_uri())
    assert code == 7 and "laminar init" in line
    code, line = run_error(capsys, "status", "--store", (tmp_path / "typo").as_uri())
    assert code == 7 and "no local store" in line and not (tmp_path / "typo").exists()


def test_a_missing_store_is_named_as_not_found_and_a_url_typo_as_what_was_understood(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, line = run_error(capsys, "status", "--store", (tmp_path / "missing").as_uri())
    # Its words agree with its exit code (not found, 7): not "store unavailable".
    assert code == 7 and "not found" in line and "unavailable" not in line
    monkeypatch.chdir(tmp_path)
    for typo, meant in (("s3//bucket/x", "s3://bucket/x"), ("file//tmp/x", "file:///tmp/x")):
        code, line = run_error(capsys, "init", "--store", typo, "--partitions", "1")
        assert code == 2 and repr(typo) in line and meant in line and f"./{typo}" in line
        assert not (tmp_path / typo.split("/")[0]).exists()  # no local directory made of the typo


def test_migration_timeouts_that_contradict_each_other_are_refused_naming_both_flags(
    cluster: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("migrate", "--store", cluster, "--partition", "0", "--to", "1")
    code, line = run_error(capsys, *argv, "--migration-timeout", "10", "--transfer-timeout", "60")
    assert code == 2 and "--migration-timeout (10 s" in line and "--transfer-timeout (60 s" in line
