"""`laminar migrate`, `failover` and `rebalance`: a wrong partition or node id is named as such before anything
is read or written (exit 2, the store unchanged), a failover with no live node to receive says which node
to start (exit 3), and the move commands start without the data plane's libraries.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from laminar_orchestration import cli
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import open_store
from tests.cli.conftest import run_error, snapshot

#: Loaded by the commands that read or write data (`query`, `verify`, `node run`, `table`), never
#: needed to plan and drive a move.
HEAVY = ("pyarrow", "deltalake", "pyspark", "dagster", "boto3")


@pytest.mark.processes
def test_the_move_commands_start_without_the_data_planes_libraries() -> None:
    """Every `laminar migrate` or `failover` launch pays its imports before its first request."""
    probe = (
        "import sys\n"
        "from laminar_orchestration.cli import build_parser\n"
        "import laminar_orchestration.control.moves, laminar_orchestration.control.operations\n"
        "build_parser().parse_args(['migrate', '--partition', '0', '--to', '1'])\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "", f"imported at start: {done.stdout.strip()}"


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


def test_migrate_takes_a_target_or_cancel_not_both(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(cluster)
    code, line = run_error(capsys, "migrate", "--store", cluster, "--partition", "0", "--to", "1", "--cancel")
    assert code == 2 and "--cancel" in line and "not both" in line
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
    ledger.members.register_node(NodeId(1), heartbeat_timeout_s=0.05)
    ledger.members.admit_nodes()
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
    ledger.members.register_node(NodeId(2), heartbeat_timeout_s=60)  # registered moments ago: not a member yet
    assert ledger.members.record().members == [1]
    argv = ["failover", "--store", cluster, "--node", "1", "--migration-timeout", "0.5", "--json"]
    # No node process runs the restores, so each move fences and then times out: exit 1.
    assert cli.main(argv) == 1
    failovers = json.loads(capsys.readouterr().out)["failovers"]
    assert {(f["partition"], f["to_node"]) for f in failovers} == {(0, 2), (1, 2)}
    assert ledger.members.record().members == [1, 2]  # admitted as the reconcile admits it
    assert all((o.owner, o.epoch) == (2, 2) for o in ledger.ownerships([PartitionId(0), PartitionId(1)]).values() if o)


def test_rebalance_bad_weight_is_invalid_input(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, line = run_error(capsys, "rebalance", "--store", cluster, "--weight", "three", "--dry-run")
    assert code == 2 and "--weight" in line and "NODE=WEIGHT" in line
