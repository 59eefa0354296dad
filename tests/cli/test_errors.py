"""Every CLI error is one line naming what is wrong, a non-zero exit code by kind, and an unchanged store.

These call `cli.main` in-process (a traceback would fail the test as an uncaught
exception) on a local store; `test_main.py` runs the CLI as a subprocess on both backends.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from laminar_orchestration import cli
from laminar_orchestration.identity import MAX_PARTITIONS, NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.keys import segment_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.segments import MAX_KEY_BYTES, MAX_LINE_BYTES
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import LocalObjectStore, open_store
from tests.commits import commit_all


def snapshot(url: str) -> dict[str, str]:
    """Every key of the store with its ETag: equal snapshots mean nothing was written."""
    store = open_store(url)
    heads = {key: store.head(key) for key in store.list("")}
    return {key: meta.etag for key, meta in heads.items() if meta is not None}


def run_error(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Run the CLI expecting an error: return the exit code and the one error line."""
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    assert code != 0
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("laminar: error: "), err
    return code, lines[0]


@pytest.fixture
def cluster(tmp_path: Path) -> str:
    url = (tmp_path / "store").as_uri()
    assert cli.main(["init", "--store", url, "--partitions", "2"]) == 0
    return url


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


def test_init_on_a_regular_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("not a store")
    code, line = run_error(capsys, "init", "--store", target.as_uri(), "--partitions", "2")
    assert code == 2 and str(target) in line and "is a file" in line
    assert target.read_text() == "not a store"


@pytest.mark.parametrize(
    ("tail", "named"),
    [
        # Python refuses a NUL before the OS sees it (it was a traceback: ValueError: embedded null byte).
        pytest.param("x%00y", "NUL", id="nul"),
        pytest.param("nul%00/deeper/store", "NUL", id="nul-in-a-parent"),
        pytest.param("a" * 300 + "/store", "refuses the name", id="name-too-long"),  # ENAMETOOLONG
        pytest.param("%FF%FE", "not UTF-8", id="not-utf8"),  # was decoded lossily into another name
    ],
)
@pytest.mark.parametrize("command", ["init", "status"])
def test_a_store_url_the_os_refuses_is_invalid_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tail: str, named: str, command: str
) -> None:
    url = f"{tmp_path.as_uri()}/{tail}"
    argv = ["init", "--partitions", "2"] if command == "init" else [command]
    code, line = run_error(capsys, *argv, "--store", url)
    assert code == 2 and f"invalid store URL {url!r}" in line and named in line
    assert list(tmp_path.iterdir()) == []  # nothing created


@pytest.mark.parametrize("partitions", ["0", "-3", str(MAX_PARTITIONS + 1), "100000000"])
def test_init_partition_count_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str], partitions: str) -> None:
    target = tmp_path / "store"
    code, line = run_error(capsys, "init", "--store", target.as_uri(), "--partitions", partitions)
    assert code == 2 and "--partitions" in line and str(MAX_PARTITIONS) in line
    assert not target.exists()


def test_interrupted_init_says_how_to_complete_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self: Ledger, partitions: int, *, force: bool = False) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Ledger, "init_cluster", interrupted)
    assert cli.main(["init", "--store", (tmp_path / "s").as_uri(), "--partitions", "2"]) == 130
    assert "run the same `laminar init` again" in capsys.readouterr().err


def test_init_twice_is_a_conflict(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(cluster)
    code, line = run_error(capsys, "init", "--store", cluster, "--partitions", "2")
    assert code == 4 and "already exists" in line and "--force" in line
    assert snapshot(cluster) == before


def test_commands_on_an_uninitialized_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, line = run_error(capsys, "status", "--store", empty.as_uri())
    assert code == 7 and "laminar init" in line
    code, line = run_error(capsys, "status", "--store", (tmp_path / "typo").as_uri())
    assert code == 7 and "no local store" in line and not (tmp_path / "typo").exists()


# -- control plane arguments -----------------------------------------------------------------------


def test_migrate_names_a_missing_partition_before_anything_else(
    cluster: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(cluster)
    code, line = run_error(capsys, "migrate", "--store", cluster, "--partition", "99999", "--to", "1")
    assert code == 2 and "partition 99999 does not exist" in line and "0..1" in line
    code, line = run_error(capsys, "migrate", "--store", cluster, "--partition", "-1", "--to", "1")
    assert code == 2 and "partition -1 does not exist" in line
    code, line = run_error(capsys, "migrate", "--store", cluster, "--partition", "0", "--to", "0")
    assert code == 2 and "--to" in line and "sentinel" in line
    assert snapshot(cluster) == before


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--node", "0"], "node 0 is the 'unassigned' sentinel"),
        (["--node", "-1"], "-1 is not a node id"),
        (["--node", "3", "--to", "0"], "--to"),
        (["--node", "3", "--to", "3"], "is the node being failed over"),
        (["--node", "3", "--max-concurrent", "0"], "--max-concurrent"),
    ],
)
def test_failover_rejects_node_ids_that_are_no_nodes(
    cluster: str, capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    before = snapshot(cluster)
    code, line = run_error(capsys, "failover", "--store", cluster, *argv)
    assert code == 2 and named in line
    assert "receive" not in line
    assert snapshot(cluster) == before


def _dead_owner_of_both(url: str) -> Ledger:
    """Node 1, an admitted member, owns both partitions and has stopped heartbeating."""
    ledger = Ledger(open_store(url))
    ledger.register_node(NodeId(1), heartbeat_timeout_s=0.05)
    ledger.admit_nodes()
    for p in (0, 1):
        ledger.acquire(PartitionId(p), NodeId(1), expected_epoch=0)
    time.sleep(0.1)
    return ledger


def test_failover_with_no_node_to_receive_names_the_missing_target(
    cluster: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _dead_owner_of_both(cluster)
    before = snapshot(cluster)
    code, line = run_error(capsys, "failover", "--store", cluster, "--node", "1")
    assert code == 3  # unavailable: once a node runs, the same command works
    assert "no live node other than node 1 can receive partition 0" in line and "laminar node run" in line
    assert "is not a live member" not in line
    assert snapshot(cluster) == before


def test_failover_admits_a_node_registered_since_the_last_reconcile(
    cluster: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = _dead_owner_of_both(cluster)
    ledger.register_node(NodeId(2), heartbeat_timeout_s=60)  # registered moments ago: not a member yet
    assert ledger.membership().members == [1]
    argv = ["failover", "--store", cluster, "--node", "1", "--migration-timeout", "0.5", "--json"]
    # No node process runs the restores, so each move fences and then times out: exit 1.
    assert cli.main(argv) == 1
    failovers = json.loads(capsys.readouterr().out)["failovers"]
    assert {(f["partition"], f["to_node"]) for f in failovers} == {(0, 2), (1, 2)}
    assert ledger.membership().members == [1, 2]  # admitted as the reconcile admits it
    assert all((o.owner, o.epoch) == (2, 2) for o in ledger.ownerships([PartitionId(0), PartitionId(1)]).values() if o)


def test_rebalance_bad_weight_is_invalid_input(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = run_error(capsys, "rebalance", "--store", cluster, "--weight", "three", "--dry-run")
    assert code == 2 and "--weight" in line and "NODE=WEIGHT" in line


def test_json_output_still_works(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--store", cluster, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["partitions"]) == 2
