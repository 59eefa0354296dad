"""The `laminar` command line as a user runs it (subprocesses), on both store backends."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from laminar_orchestration.dataplane.checkpoint import OutputWriter
from laminar_orchestration.dataplane.restore import StateReplica
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.processing.keyed import keyed_aggregation
from laminar_orchestration.protocol.capabilities import OutputCommitter, ReadStore
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.fencing import PartitionGuard
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import open_store
from tests.commits import commit_all, fold_output
from tests.processes import laminar

pytestmark = pytest.mark.processes


def test_produce_from_file_query_and_verify(store_url: str, tmp_path: Path) -> None:
    assert laminar("init", "--store", store_url, "--partitions", "2").returncode == 0
    lines = [json.dumps({"partition": i % 2, "key": f"k{i % 3}", "value": float(i)}) for i in range(30)]
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(lines) + "\n")
    produced = laminar("produce", "--store", store_url, "--from-file", str(events), "--json")
    assert produced.returncode == 0, produced.stderr
    assert json.loads(produced.stdout) == {"appended": {"0": 15, "1": 15}}

    store = open_store(store_url)
    ledger = Ledger(store)
    token = ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    commit_all(store, token)

    query = laminar("query", "--store", store_url, "--partition", "0", "--json")
    assert query.returncode == 0, query.stderr
    result = json.loads(query.stdout)
    assert result["committed_offset"] == 15
    by_key = {r["key"]: r for r in result["keys"]}
    # partition 0 holds the even i; key k{i % 3}
    expected = {k: [i for i in range(0, 30, 2) if f"k{i % 3}" == k] for k in ("k0", "k1", "k2")}
    for key, values in expected.items():
        row = by_key[key]
        assert (row["count"], row["sum"], row["min"], row["max"], row["last"]) == (
            len(values), float(sum(values)), float(min(values)), float(max(values)), float(values[-1]),
        )  # fmt: skip
    verify = laminar("verify", "--store", store_url, "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert json.loads(verify.stdout)["ok"] is True
    assert "k0" in laminar("query", "--store", store_url, "--partition", "0").stdout
    missing = laminar("query", "--store", store_url, "--partition", "7")
    assert missing.returncode == 2 and "partition 7 does not exist" in missing.stderr


def test_produce_bad_line_names_it_and_appends_nothing(store_url: str, tmp_path: Path) -> None:
    assert laminar("init", "--store", store_url, "--partitions", "2").returncode == 0
    events = tmp_path / "bad.jsonl"
    events.write_text(
        '{"partition": 0, "key": "a", "value": 1}\n'
        '{"partition": 1, "key": "b", "value": 2}\n'
        '{"partition": 0, "key": "c", "valeu": 3}\n'
    )
    result = laminar("produce", "--store", store_url, "--from-file", str(events))
    assert result.returncode == 2
    assert "line 3" in result.stderr and "bad.jsonl" in result.stderr
    from laminar_orchestration.protocol.source import SourceLog

    log = SourceLog(open_store(store_url))
    assert (log.end_offset(0), log.end_offset(1)) == (0, 0)  # lines 1 and 2 were not appended either
    good = laminar("produce", "--store", store_url, "--count", "10", "--json")
    assert sum(json.loads(good.stdout)["appended"].values()) == 10
    assert log.end_offset(0) + log.end_offset(1) == 10


def test_verify_reports_duplicates_and_losses_with_offsets(store_url: str) -> None:
    assert laminar("init", "--store", store_url, "--partitions", "1").returncode == 0
    assert laminar("produce", "--store", store_url, "--count", "300", "--keys", "5").returncode == 0
    store = open_store(store_url)
    ledger = Ledger(store)
    token = ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    _, offset, last = commit_all(store, token)
    assert offset == 300
    # A commit that applies events 100..300 a second time, as a broken fence would.
    from laminar_orchestration.protocol.source import SourceLog

    batch = pa.concat_tables([b.to_table() for b in SourceLog(store).iter_batches(0, 0, 1000)]).slice(100)
    with tempfile.TemporaryDirectory() as tmp:
        empty = StateReplica(Path(tmp), 0, keyed_aggregation.state_schema, ReadStore(store))
        empty.catch_up(None)
        output = fold_output(batch, empty, token.epoch)
        empty.close()
    ref = OutputWriter(OutputCommitter(store)).write(PartitionGuard(token), output, 100, 300)
    ManifestPublisher(OutputCommitter(store), store).publish(
        token,
        ManifestUpdate(
            source_offset=300, snapshot=last.manifest.snapshot if last else None, outputs=(ref,), events_applied=500
        ),
    )
    result = laminar("verify", "--store", store_url, "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    part = report["partitions"][0]
    assert part["duplicates"] == 200
    assert any(i["kind"] == "duplicate" and (i["start_offset"], i["end_offset"]) == (100, 300) for i in part["issues"])
    text = laminar("verify", "--store", store_url)
    assert "verify: FAILED" in text.stdout and "duplicate [100, 300)" in text.stdout


def test_output_to_a_reader_that_went_away_ends_the_command_quietly(store_url: str) -> None:
    """`laminar status | head -0`: the command ends with exit code 1 and no traceback, and a
    command's exit code is the one `main` returned (the process skips the interpreter's teardown)."""
    assert laminar("init", "--store", store_url, "--partitions", "4").returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "laminar_orchestration.cli", "status", "--store", store_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 1 and "Traceback" not in err, err
    assert laminar("status", "--store", store_url + "-typo").returncode == 7
