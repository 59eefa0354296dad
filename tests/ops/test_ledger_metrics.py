"""The control plane's /metrics, read from the ledger at each scrape: each move that ended counted once by kind
(graceful, forced, placement) and outcome, each epoch granted without a release counted once as a fence by
kind (placement, failover), and each partition's owner and whether it heartbeats.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.metrics import ControlPlaneMetrics
from laminar_orchestration.ops.ledger_metrics import control_plane_metrics
from laminar_orchestration.protocol.desired_states import DesiredState, DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.tasks import MigrationPhase, MigrationTask
from laminar_orchestration.store import LocalObjectStore, open_store
from tests.ledgers import make_alive, new_ledger
from tests.ops.test_demo_status import task
from tests.processes import Samples, samples


def _scrape(metrics: ControlPlaneMetrics) -> Samples:
    return samples(generate_latest(metrics.registry).decode())


def test_the_control_plane_counts_each_fence_once_by_kind(tmp_path: Any) -> None:
    ledger = Ledger(open_store((tmp_path / "store").as_uri(), create=True))
    ledger.init_cluster(2)
    metrics = control_plane_metrics(lambda: ledger, lambda: {})
    ledger.fence(PartitionId(0), NodeId(1), expected_epoch=0, reason="placement")
    scrape = samples(generate_latest(metrics.registry).decode())
    assert scrape[("laminar_fences_total", (("kind", "placement"),))] == 1
    assert scrape[("laminar_partition_owner_node", (("partition", "0"),))] == 1
    ledger.fence(PartitionId(0), NodeId(2), expected_epoch=1, reason="failover")
    for _ in range(2):  # a second scrape counts nothing again
        scrape = samples(generate_latest(metrics.registry).decode())
    assert scrape[("laminar_fences_total", (("kind", "placement"),))] == 1
    assert scrape[("laminar_fences_total", (("kind", "failover"),))] == 1
    assert scrape[("laminar_partition_owner_alive", (("partition", "0"),))] == 0


def test_a_move_that_ended_is_counted_once_by_kind_and_outcome(tmp_path: Path) -> None:
    ledger = new_ledger(LocalObjectStore(tmp_path / "store"), partitions=3)
    moves: list[MigrationTask] = [
        task(MigrationPhase.ACTIVE),  # graceful 1 -> 2, two seconds
        task(MigrationPhase.FAILED, mid="m2", from_node=0).model_copy(update={"partition": 1}),  # a first owner
        task(MigrationPhase.DRAINING, mid="m3").model_copy(update={"partition": 2}),  # still moving
    ]
    desired = DesiredStates(ledger)
    for move in moves:

        def with_move(state: DesiredState, move: MigrationTask = move) -> DesiredState:
            return state.model_copy(update={"migration": move})

        desired.update(PartitionId(move.partition), with_move)
    metrics = control_plane_metrics(lambda: ledger, lambda: {})
    for _ in range(2):  # a later scrape counts nothing again
        scrape = _scrape(metrics)
    graceful, placement = (("kind", "graceful"), ("outcome", "active")), (("kind", "placement"), ("outcome", "failed"))
    assert scrape[("laminar_migrations_total", graceful)] == 1
    assert scrape[("laminar_migration_duration_seconds_sum", graceful)] == 2.0
    assert scrape[("laminar_migrations_total", placement)] == 1
    assert sum(v for (name, _), v in scrape.items() if name == "laminar_migrations_total") == 2  # not the one moving


def test_a_graceful_grant_is_no_fence_and_an_owner_that_heartbeats_is_alive(tmp_path: Path) -> None:
    ledger = new_ledger(LocalObjectStore(tmp_path / "store"), partitions=1)
    make_alive(ledger, 1, 2)
    placed = ledger.fence(PartitionId(0), NodeId(1), expected_epoch=0, reason="placement")
    assert placed is not None
    ledger.release(placed, commit_ulid=None, source_offset=0)
    ledger.acquire(PartitionId(0), NodeId(2), expected_epoch=1, reason="migration 1 -> 2")
    # Grants made before the first scrape are counted by it.
    scrape = _scrape(control_plane_metrics(lambda: ledger, lambda: {}))
    fences = {labels: v for (name, labels), v in scrape.items() if name == "laminar_fences_total"}
    assert fences == {(("kind", "placement"),): 1}
    assert scrape[("laminar_partition_owner_node", (("partition", "0"),))] == 2
    assert scrape[("laminar_partition_owner_alive", (("partition", "0"),))] == 1
