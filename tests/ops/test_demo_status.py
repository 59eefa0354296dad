"""What the demo prints: statuses that say what is true now, and a line per migration phase."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from laminar_orchestration.control.snapshot import PartitionSnapshot
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.ops.demo_status import PhaseWatch, partition_status
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import now
from laminar_orchestration.protocol.tasks import MigrationKind, MigrationPhase, MigrationTask
from laminar_orchestration.store import open_store


def snap(owner: int, status: str, *, alive: bool, migration: MigrationTask | None = None) -> PartitionSnapshot:
    return PartitionSnapshot(
        partition=0,
        epoch=1,
        owner=owner,
        status=status,
        head_lagged=False,
        owner_alive=alive,
        migration=migration,
        committed_offset=0,
        log_end=0,
    )


def task(phase: MigrationPhase, *, mid: str = "m1", from_node: int = 1) -> MigrationTask:
    started = now()
    return MigrationTask(
        migration_id=mid,
        partition=0,
        migration_kind=MigrationKind.GRACEFUL if from_node else MigrationKind.FORCED,
        from_node=from_node,
        to_node=2,
        from_epoch=1,
        to_epoch=2,
        phase=phase,
        started_at=started,
        updated_at=started + timedelta(seconds=2),
        completed_at=started + timedelta(seconds=2) if phase.is_terminal else None,
        timeout_s=30,
    )


def test_a_status_says_what_is_true_now() -> None:
    # A clean stop released the partition: released, not waiting for a failover.
    assert partition_status(snap(2, "released", alive=False), gone={2}) == "released by node 2"
    # Killed: dead at once, before the heartbeat timeout says so, until a failover moves it.
    assert partition_status(snap(1, "active", alive=True), gone={1}) == "owner dead: failover pending"
    assert partition_status(snap(1, "active", alive=False), gone=()) == "owner dead: failover pending"
    assert partition_status(snap(1, "active", alive=True), gone=()) == "active"
    moving = snap(1, "active", alive=True, migration=task(MigrationPhase.DRAINING))
    assert partition_status(moving, gone=()) == "graceful 1→2 (draining)"
    placing = snap(0, "unassigned", alive=False, migration=task(MigrationPhase.RELEASED, from_node=0))
    assert partition_status(placing, gone=()) == "placement on 2 (released)"


def test_a_line_per_phase_names_the_phases_passed_between_two_looks(tmp_path: Path) -> None:
    ledger = Ledger(open_store((tmp_path / "store").as_uri(), create=True))
    ledger.init_cluster(1)
    states = DesiredStates(ledger)

    def record(t: MigrationTask) -> None:
        states.update(PartitionId(0), lambda s: s.model_copy(update={"migration": t}))

    watch = PhaseWatch()
    record(task(MigrationPhase.DRAINING, mid="old"))
    assert watch.poll(ledger) == []  # under way before the demo looked: remembered only
    record(task(MigrationPhase.ACTIVE, mid="old"))
    assert watch.poll(ledger) == [
        "partition 0: graceful 1→2: checkpointing → uploading → released → downloading → restoring → seeking "
        "→ active in 2.0s"
    ]
    assert watch.poll(ledger) == []
    record(task(MigrationPhase.PLANNED, mid="new"))
    record(task(MigrationPhase.DRAINING, mid="new"))
    assert watch.poll(ledger) == ["partition 0: graceful 1→2: planned → draining"]
