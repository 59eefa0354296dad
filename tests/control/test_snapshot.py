"""What the Dagster assets show, computed by the library: ownership rows and health, the live-owner check,
the committed manifests and whether the stream keeps up."""

from __future__ import annotations

import functools
import time
from typing import Any

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.ownership import (
    OwnershipRows,
    check_live_owners,
    ownership_health,
    ownership_rows,
    report_ownership,
)
from laminar_orchestration.control.progress import CheckpointRows, checkpoint_rows, checkpoints_version, stream_progress
from laminar_orchestration.control.snapshot import fingerprint
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.desired_states import DesiredState, DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.records import PartitionProgress
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import MigrationConfig
from laminar_orchestration.store.metering import RequestMeter
from tests.commits import commit_all
from tests.ledgers import make_alive, make_dead

P, N = PartitionId, NodeId


def row(partition: int, owner: int, alive: bool, migration: str = "", epoch: int = 1) -> dict[str, Any]:
    status = "active" if owner else "unassigned"
    return {
        "partition": partition,
        "epoch": epoch,
        "owner": owner,
        "status": status,
        "owner_alive": alive,
        "migration": migration,
        "failure": "",
    }


def test_health_and_the_live_owner_check_are_pure() -> None:
    rows = [row(0, 1, True), row(1, 1, True, "m1 (draining)"), row(2, 2, False), row(3, 2, False, "m2")]
    rows.append(row(4, 0, False))
    assert [ownership_health(r) for r in rows] == [
        "ok",
        "moving",
        "owner dead: failover pending",
        "failover in flight",
        "unassigned",
    ]
    check = check_live_owners(rows)
    assert not check.passed and check.partitions == 5
    assert check.listing == "p2 (owner dead: failover pending), p3 (failover in flight), p4 (unassigned)"
    assert check.description == f"3 of 5 partitions not on a live node: {check.listing}"
    fine = check_live_owners(rows[:2])
    assert fine.passed and fine.listing == "-" and fine.description == "all 2 partitions on live nodes"
    # A data version: stable, whatever the key order; a change of value is a new version.
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1}) != fingerprint({"a": 2})
    assert len(fingerprint(rows)) == 16
    assert checkpoints_version([]) == fingerprint([])


def test_the_ownership_report_counts_what_an_operator_looks_at_first(ledger: Ledger) -> None:
    ledger.members.register_node(N(1), heartbeat_timeout_s=0.05)
    ledger.members.register_node(N(2), heartbeat_timeout_s=60)
    time.sleep(0.1)  # node 1 is dead
    ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.acquire(P(1), N(2), expected_epoch=0)
    report = report_ownership(ledger)
    assert [r["health"] for r in report.rows] == ["owner dead: failover pending", "ok", "unassigned", "unassigned"]
    assert (report.on_dead_nodes, report.migrations_in_flight, report.unassigned) == (1, 0, 2)
    assert report.live_nodes == (2,) and report.cluster_epoch == ledger.members.record().cluster_epoch
    assert report.store == ledger.store.url
    # Rows read a moment ago are reported as they are; liveness makes no new data version.
    revived = [{**r, "owner_alive": True} for r in ownership_rows(ledger)]
    assert report_ownership(ledger, revived).version == report.version
    task = MigrationCoordinator(ledger, MigrationConfig()).plan(P(0), N(2), forced=True)
    moving = report_ownership(ledger)
    assert moving.rows[0]["migration"] == f"{task.migration_id} (planned)"
    assert moving.rows[0]["health"] == "failover in flight" and moving.migrations_in_flight == 1


def test_the_manifests_and_the_streams_progress(ledger: Ledger) -> None:
    manifests = ManifestReader(ledger.store)
    source = SourceLog(ledger.store)
    assert checkpoint_rows(ledger, manifests) == []
    idle = stream_progress(ledger, [], {})
    assert idle.keeping_up and idle.uncommitted_events == 0 and idle.behind_listing() == "-"
    events = generate_events(20, 5, 1, 4)[0]
    source.append(0, events)
    behind = stream_progress(ledger, [], {})
    assert behind.behind == [0] and behind.lags[0] == events.num_rows
    assert behind.behind_listing() == f"p0 ({events.num_rows} events)"
    token = ledger.acquire(P(0), N(1), expected_epoch=0)
    commit_all(ledger.store, token)
    rows = checkpoint_rows(ledger, manifests)
    assert [r["partition"] for r in rows] == [0] and rows[0]["fencing_token"] == 1
    assert rows[0]["source_offset"] == events.num_rows and rows[0]["seq"] > 1
    progress = stream_progress(ledger, rows, {})
    assert progress.keeping_up and progress.seqs == {0: rows[0]["seq"]}
    # More events and no commit since the last report: behind again.
    source.append(0, generate_events(20, 5, 2, 4)[0])
    assert stream_progress(ledger, rows, progress.seqs).behind == [0]
    assert checkpoints_version(rows) != checkpoints_version([])


def test_kept_checkpoint_rows_read_a_manifest_again_only_when_a_node_reports_a_commit(
    ledger: Ledger, meter: RequestMeter
) -> None:
    """The observation's look at the manifests: an idle cluster's reads no manifest; a partition its
    owner reports another commit of is read again, the others are not; everything now and then."""
    handle = ledger.members.register_node(N(1), heartbeat_timeout_s=60)
    token = ledger.acquire(P(0), N(1), expected_epoch=0)
    SourceLog(ledger.store).append(0, generate_events(20, 5, 1, 4)[0])
    commit_all(ledger.store, token)
    handle.heartbeat(partitions={0: PartitionProgress(partition=0, epoch=1, state="running", commits=1)})
    manifests, kept = ManifestReader(ledger.store), CheckpointRows(full_every_s=3600)
    first = kept.rows(ledger, manifests)
    assert first == checkpoint_rows(ledger, manifests)

    def manifest_reads() -> int:
        return sum(n for (m, fam), n in meter.snapshot().by_family.items() if fam.startswith("manifests/"))

    before = manifest_reads()
    assert kept.rows(ledger, manifests) == first
    assert manifest_reads() == before  # nothing reported since: no manifest read
    SourceLog(ledger.store).append(0, generate_events(20, 5, 2, 4)[0])
    commit_all(ledger.store, token)
    handle.heartbeat(partitions={0: PartitionProgress(partition=0, epoch=1, state="running", commits=2)})
    again = kept.rows(ledger, manifests)
    assert again == checkpoint_rows(ledger, manifests) and again[0]["seq"] > first[0]["seq"]
    kept.full_every_s = 0.0  # the periodic full look reads every partition's
    before = manifest_reads()
    kept.rows(ledger, manifests)
    assert manifest_reads() > before


def _owned_by(state: DesiredState, *, node: int) -> DesiredState:
    return state.model_copy(update={"owner": node})


def test_kept_ownership_rows_read_only_the_partitions_whose_assignment_or_node_moved(
    ledger: Ledger, meter: RequestMeter
) -> None:
    """The observation's look at the ownership during moves: the rows of the partitions a node's
    assignment lists at another revision are read again, and those of a node that died; the rest
    are kept. The rows are always what a full read shows."""
    desired = DesiredStates(ledger, nudge=False)
    make_alive(ledger, 1, 2)
    for p in range(4):
        owner = 1 + p % 2
        desired.update(P(p), functools.partial(_owned_by, node=owner))
        ledger.acquire(P(p), N(owner), expected_epoch=0)
    kept = OwnershipRows()
    first = kept.rows(ledger)
    assert first == ownership_rows(ledger)

    def partition_reads() -> int:
        return sum(n for (_m, fam), n in meter.snapshot().by_family.items() if fam.startswith("ledger/partitions/"))

    before = partition_reads()
    assert kept.rows(ledger) == first
    assert partition_reads() == before, "nothing moved: no partition's records read"
    # p2 moves to node 2: its state moves both nodes' assignments; only p2 is read again.
    desired.update(P(2), lambda s: s.model_copy(update={"owner": 2}))
    ledger.fence(P(2), N(2), expected_epoch=1, reason="moved")
    before = partition_reads()
    moved = kept.rows(ledger)
    assert 0 < partition_reads() - before <= 4, "only p2's ownership and desired state"
    assert moved == ownership_rows(ledger) and moved[2]["owner"] == 2
    # Node 1 dies: its partition (p0) shows on a dead owner, as a full read shows it.
    make_dead(ledger, 1)
    dead = kept.rows(ledger)
    assert dead == ownership_rows(ledger) and dead[0]["owner_alive"] is False and dead[1]["owner_alive"] is True


def test_a_full_read_past_its_deadline_goes_on_at_the_next_look(ledger: Ledger) -> None:
    """The first look at a large cluster takes longer than a sensor tick: each look reads until its
    deadline, reports nothing until every partition was read, and the next goes on from there."""
    make_alive(ledger, 1)
    token = ledger.acquire(P(0), N(1), expected_epoch=0)
    SourceLog(ledger.store).append(0, generate_events(20, 5, 1, 4)[0])
    commit_all(ledger.store, token)
    manifests = ManifestReader(ledger.store)
    kept, checkpoints = OwnershipRows(), CheckpointRows()
    assert kept.rows(ledger, deadline=time.monotonic()) is None  # out of time before the first chunk
    assert checkpoints.rows(ledger, manifests, deadline=time.monotonic()) is None
    assert kept.rows(ledger) == ownership_rows(ledger)
    assert checkpoints.rows(ledger, manifests) == checkpoint_rows(ledger, manifests)
