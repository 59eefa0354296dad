"""A partition its owner released (a clean stop) reads as released, never as a dead owner's pending failover."""

from __future__ import annotations

from laminar_orchestration.control.ownership import check_live_owners, ownership_health, ownership_rows
from laminar_orchestration.control.snapshot import snapshot_cluster
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.ledger import Ledger
from tests.ledgers import make_dead


def test_a_released_partition_of_a_stopped_node_is_released_and_nobody_is_dead(ledger: Ledger) -> None:
    make_dead(ledger, 1)  # stopped (its heartbeat lapsed) after releasing partition 0...
    make_dead(ledger, 2)  # ...while node 2 died holding partition 1
    token = ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    ledger.release(token, commit_ulid=None, source_offset=0)
    ledger.acquire(PartitionId(1), NodeId(2), expected_epoch=0)
    released, died = snapshot_cluster(ledger).partitions[:2]
    assert (released.owner, released.status, released.owner_alive) == (1, "released", False)
    assert not released.failover_pending and released.phase_text() == "released by node 1"
    assert died.failover_pending and died.phase_text() == "failover pending (node 2 dead)"
    rows = ownership_rows(ledger)
    assert [ownership_health(r) for r in rows[:2]] == ["released by node 1", "owner dead: failover pending"]
    # Neither partition is on a live node: the check says so, without calling the released one's owner dead.
    check = check_live_owners(rows[:2])
    assert check.listing == "p0 (released by node 1), p1 (owner dead: failover pending)"
