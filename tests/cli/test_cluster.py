"""`laminar init` and `laminar status`: init creates the cluster record and N unassigned partitions, within
1..MAX_PARTITIONS, and refuses an existing cluster without ``--force`` (a conflict, exit 4); status shows
every partition's epoch, owner, offsets and status and every node's liveness, as text or as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laminar_orchestration import cli
from laminar_orchestration.identity import MAX_PARTITIONS, NodeId, PartitionId
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.records import PartitionProgress
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import open_store
from tests.cli.conftest import run_error, snapshot
from tests.processes import laminar


@pytest.mark.processes
def test_init_status_and_reinit(store_url: str) -> None:
    first = laminar("init", "--store", store_url, "--partitions", "3")
    assert first.returncode == 0, first.stderr
    again = laminar("init", "--store", store_url, "--partitions", "3")
    assert again.returncode == 4 and "already exists" in again.stderr and "--force" in again.stderr
    status = laminar("status", "--store", store_url, "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["cluster_epoch"] == 1
    assert [(p["partition"], p["epoch"], p["owner"], p["status"]) for p in report["partitions"]] == [
        (0, 0, 0, "unassigned"),
        (1, 0, 0, "unassigned"),
        (2, 0, 0, "unassigned"),
    ]
    forced = laminar("init", "--store", store_url, "--partitions", "5", "--force")
    assert forced.returncode == 0, forced.stderr
    assert len(json.loads(laminar("status", "--store", store_url, "--json").stdout)["partitions"]) == 5
    text = laminar("status", "--store", store_url)
    assert "PARTITION" in text.stdout and "unassigned" in text.stdout


def test_init_on_a_regular_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("not a store")
    code, line = run_error(capsys, "init", "--store", target.as_uri(), "--partitions", "2")
    assert code == 2 and str(target) in line and "is a file" in line
    assert target.read_text() == "not a store"


@pytest.mark.parametrize("partitions", ["0", "-3", str(MAX_PARTITIONS + 1), "100000000"])
def test_init_partition_count_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str], partitions: str) -> None:
    target = tmp_path / "store"
    code, line = run_error(capsys, "init", "--store", target.as_uri(), "--partitions", partitions)
    assert code == 2 and "--partitions" in line and str(MAX_PARTITIONS) in line
    assert not target.exists()


def test_init_twice_is_a_conflict(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(cluster)
    code, line = run_error(capsys, "init", "--store", cluster, "--partitions", "2")
    assert code == 4 and "already exists" in line and "--force" in line
    assert snapshot(cluster) == before


def test_json_output_still_works(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--store", cluster, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["partitions"]) == 2


def test_status_reads_owners_offsets_and_liveness_from_the_store(
    cluster: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = Ledger(open_store(cluster))
    ledger.members.register_node(NodeId(1), heartbeat_timeout_s=60)
    ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    SourceLog(ledger.store, partitions=2).append(0, generate_events(7, 3, 1, 1)[0])  # appended, none committed
    assert cli.main(["status", "--store", cluster, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = [(p["partition"], p["epoch"], p["owner"], p["status"], p["owner_alive"]) for p in report["partitions"]]
    assert rows == [(0, 1, 1, "active", True), (1, 0, 0, "unassigned", False)]
    assert [(p["committed_offset"], p["log_end"], p["lag"]) for p in report["partitions"]] == [(0, 7, 7), (0, 0, 0)]
    assert [(n["node"], n["alive"]) for n in report["nodes"]] == [(1, True)]


def test_status_summarizes_beyond_its_detail_limit_and_details_on_request(
    cluster: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = Ledger(open_store(cluster))
    handle = ledger.members.register_node(NodeId(1), heartbeat_timeout_s=60)
    ledger.members.admit_nodes()
    DesiredStates(ledger, nudge=False).update(PartitionId(0), lambda s: s.model_copy(update={"owner": 1}))
    ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    handle.heartbeat(partitions={0: PartitionProgress(partition=0, epoch=1, state="running", source_offset=5)})
    assert cli.main(["status", "--store", cluster, "--json", "--summary"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["detail"] is False
    assert [
        (p["partition"], p["epoch"], p["owner"], p["status"], p["committed_offset"]) for p in summary["partitions"]
    ] == [
        (0, 1, 1, "active", 5),
        (1, 0, 0, "unassigned", None),
    ]
    assert cli.main(["status", "--store", cluster, "--json", "--partition", "1"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["detail"] is True and [p["partition"] for p in one["partitions"]] == [1]
    assert cli.main(["status", "--store", cluster]) == 0  # two partitions: the detail by default
    assert "--detail" not in capsys.readouterr().out
