"""The library's operations: the cluster ownership snapshot, a rebalance plan, a node's failover plan."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ledger import Ledger
from laminar_orchestration.migration import MigrationConfig, MigrationCoordinator, NoLiveNode
from laminar_orchestration.ownership import snapshot_cluster
from laminar_orchestration.planner import Move
from laminar_orchestration.planning import NodeStillAlive, plan_node_failover, plan_rebalance, run_node_failover
from laminar_orchestration.source import SourceLog, generate_events
from laminar_orchestration.store import LocalObjectStore

P, N = PartitionId, NodeId


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = Ledger(LocalObjectStore(tmp_path / "store"))
    led.init_cluster(4)
    return led


def make_dead(ledger: Ledger, node: int) -> None:
    """Register `node` with a tiny heartbeat timeout and let it lapse (a node record, no process)."""
    ledger.register_node(N(node), heartbeat_timeout_s=0.05)
    time.sleep(0.1)


def test_snapshot_marks_a_dead_owners_partitions_failover_pending_until_a_migration_moves_them(
    ledger: Ledger,
) -> None:
    make_dead(ledger, 1)
    ledger.register_node(N(2), heartbeat_timeout_s=60)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.acquire(P(1), N(2), expected_epoch=0)
    SourceLog(ledger.store, partitions=4).append(0, generate_events(30, 3, 0, 1)[0])
    snap = snapshot_cluster(ledger)
    p0, p1, p2 = snap.partitions[:3]
    assert (p0.owner, p0.owner_alive, p0.failover_pending) == (1, False, True)
    assert p0.phase_text() == "failover pending (node 1 dead)"
    assert (p0.committed_offset, p0.log_end, p0.lag) == (0, 30, 30)
    assert (p1.owner, p1.owner_alive, p1.failover_pending, p1.phase_text()) == (2, True, False, "active")
    assert (p2.owner, p2.failover_pending) == (0, False)  # unassigned: nobody to fail over from
    assert [(n.node, n.alive) for n in snap.nodes] == [(1, False), (2, True)]
    assert snap.owned_by(1) == [0]
    # Without offsets: what an observer fingerprints does not change with every commit.
    light = snapshot_cluster(ledger, offsets=False).partitions[0]
    assert (light.committed_offset, light.log_end, light.lag, light.failover_pending) == (None, None, None, True)

    # Once a failover's migration runs, the partition shows it instead of "pending".
    coordinator = MigrationCoordinator(ledger, MigrationConfig())
    coordinator.plan(P(0), N(2), forced=True)
    moving = snapshot_cluster(ledger).partitions[0]
    assert moving.migration is not None and not moving.failover_pending
    assert moving.phase_text().startswith("forced 1→2 (")
    assert snapshot_cluster(ledger).to_json()["partitions"][0]["migration"] == moving.migration.migration_id


def test_rebalance_plan_leaves_a_partition_in_flight_to_its_migration(ledger: Ledger) -> None:
    for n in (1, 2):
        ledger.register_node(N(n), heartbeat_timeout_s=60)
    for p in range(4):
        ledger.acquire(P(p), N(1), expected_epoch=0)
    plan = plan_rebalance(ledger)
    assert plan.moves == (Move(2, 1, 2), Move(3, 1, 2)) and plan.skipped_in_flight == ()
    MigrationCoordinator(ledger, MigrationConfig()).plan(P(3), N(2))
    plan = plan_rebalance(ledger)
    assert plan.moves == (Move(2, 1, 2),) and plan.skipped_in_flight == (Move(3, 1, 2),)
    assert plan.to_json()["skipped_in_flight"] == [3]
    # Weights go to the planner: node 2 weighing nothing, nothing moves to it.
    assert plan_rebalance(ledger, {2: 0.0}).assignment.moves == []


def test_node_failover_plan_spreads_a_dead_nodes_partitions(ledger: Ledger) -> None:
    make_dead(ledger, 1)
    for n in (2, 3):
        ledger.register_node(N(n), heartbeat_timeout_s=60)
    for p in range(3):
        ledger.acquire(P(p), N(1), expected_epoch=0)
    ledger.acquire(P(3), N(2), expected_epoch=0)
    plan = plan_node_failover(ledger, 1)
    # Least loaded first, counted as planned: node 3 had nothing, node 2 had p3.
    assert plan.moves == (Move(0, 1, 3), Move(1, 1, 2), Move(2, 1, 3))
    assert plan.takers == {2, 3} and not plan.force
    assert plan_node_failover(ledger, 1, to_node=2).moves == (Move(0, 1, 2), Move(1, 1, 2), Move(2, 1, 2))
    with pytest.raises(NodeStillAlive) as alive:
        plan_node_failover(ledger, 2)
    assert alive.value.node == 2
    with pytest.raises(NoLiveNode):
        plan_node_failover(ledger, 1, to_node=9)
    # No node process reports the download: each move fences, then times out, and every outcome comes back.
    outcomes = run_node_failover(ledger, plan, MigrationConfig(checkpoint_transfer_timeout_s=0.1))
    assert [o.move for o in outcomes] == list(plan.moves) and not any(o.ok for o in outcomes)
    assert [ledger.ownership(P(p)).owner for p in range(3)] == [3, 2, 3]  # type: ignore[union-attr]
