"""Moves in the library: planning one move (`plan_move`) and driving one within a deadline (`drive_with_deadline`).

Nodes are ledger records only: no node process ever reports a phase, so a
drive stops at the first wait for a node.
"""

from __future__ import annotations

import time

import pytest

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import drive_with_deadline, plan_move
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.migration_errors import MigrationFailed, MigrationTimeout, NoLiveNode
from laminar_orchestration.protocol.records import PartitionProgress, PartitionStatus
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationKind, MigrationPhase, seconds_left
from tests.ledgers import make_alive, make_dead

P, N = PartitionId, NodeId
NO_WARMUP = MigrationConfig(warmup_timeout_s=0, drain_alignment_s=0)


# --- plan_move ------------------------------------------------------------------------------


def test_plan_move_plans_resumes_or_says_why_not(ledger: Ledger) -> None:
    make_alive(ledger, 1, 2, 3)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    coordinator = MigrationCoordinator(ledger, NO_WARMUP)
    # Already there: nothing to do, and nothing recorded.
    there = plan_move(coordinator, 0, 1)
    assert there.task is None and there.blocked_by is None
    assert there.reason == "partition 0 is already on node 1 (epoch 1): nothing to do"
    assert coordinator.current(P(0)) is None
    # From a live owner: graceful, phase Planned.
    planned = plan_move(coordinator, 0, 2)
    assert planned.task is not None and planned.task.migration_kind == MigrationKind.GRACEFUL
    assert planned.task.phase == MigrationPhase.PLANNED and not planned.resumed
    # Asked again: the same migration, resumed once past Planned.
    coordinator.run_phase(P(0), planned.task.migration_id, MigrationPhase.PLANNED)
    coordinator.begin_phase(P(0), planned.task.migration_id, MigrationPhase.DRAINING)
    again = plan_move(coordinator, 0, 2)
    assert again.task is not None and again.task.migration_id == planned.task.migration_id and again.resumed
    # Another target while it is in flight: the migration in the way is named, nothing planned.
    blocked = plan_move(coordinator, 0, 3)
    assert blocked.task is None and blocked.blocked_by is not None
    assert blocked.blocked_by.migration_id == planned.task.migration_id
    assert f"migration {planned.task.migration_id} to node 2 is in flight (phase draining)" in blocked.reason


def test_plan_move_forces_a_move_nobody_can_drain_and_fails_an_overdue_record(ledger: Ledger) -> None:
    make_alive(ledger, 2)
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    stale = MigrationCoordinator(ledger, MigrationConfig(migration_timeout_s=0.05)).plan(P(0), N(2), forced=True)
    time.sleep(0.1)  # its driver died without recording anything
    decision = plan_move(MigrationCoordinator(ledger), 0, 2)
    assert decision.expired is not None and decision.expired.migration_id == stale.migration_id
    assert decision.task is not None and decision.task.migration_id != stale.migration_id
    assert decision.task.migration_kind == MigrationKind.FORCED  # the owner is dead: nobody drains
    with pytest.raises(NoLiveNode):
        plan_move(MigrationCoordinator(ledger), 1, 9)


# --- drive_with_deadline ----------------------------------------------------------------------


def test_drive_with_deadline_starts_no_phase_after_the_deadline_but_those_it_must(ledger: Ledger) -> None:
    make_alive(ledger, 2)
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    coordinator = MigrationCoordinator(ledger)
    task = coordinator.plan(P(0), N(2), forced=True)
    past = time.monotonic() - 1
    # Nothing allowed past the deadline: nothing runs, the record is untouched.
    idle = drive_with_deadline(coordinator, task, past)
    assert idle.reports == () and idle.out_of_time_before == MigrationPhase.PLANNED and not idle.finished
    # The fence waits on no node: it runs whatever the deadline; the wait for the new owner does not start.
    fenced = drive_with_deadline(coordinator, task, past, always=(MigrationPhase.PLANNED, MigrationPhase.RELEASED))
    assert [r.phase for r in fenced.reports] == [MigrationPhase.PLANNED, MigrationPhase.RELEASED]
    assert fenced.out_of_time_before == MigrationPhase.DOWNLOADING and fenced.error is None
    own = ledger.ownership(P(0))
    assert own is not None and (own.owner, own.epoch) == (2, 2)


def test_drive_with_deadline_bounds_each_wait_by_the_time_left_and_leaves_a_timeout_to_resume(
    ledger: Ledger,
) -> None:
    make_alive(ledger, 2)
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    coordinator = MigrationCoordinator(ledger, MigrationConfig(checkpoint_transfer_timeout_s=60))
    task = coordinator.plan(P(0), N(2), forced=True)
    coordinator.run_phase(P(0), task.migration_id, MigrationPhase.PLANNED)
    fenced = coordinator.run_phase(P(0), task.migration_id, MigrationPhase.RELEASED)
    assert "epoch 1 fenced" in fenced.detail
    released = coordinator.current(P(0))
    assert released is not None and released.phase == MigrationPhase.RELEASED
    started = time.monotonic()
    driven = drive_with_deadline(coordinator, released, started + 0.3)
    assert time.monotonic() - started < 10, "the download wait is bounded by the deadline, not its 60 s limit"
    assert isinstance(driven.error, MigrationTimeout) and driven.out_of_time_before is None
    # From the recorded phase on: the fence is found done, then the download wait times out.
    assert [r.phase for r in driven.reports] == [MigrationPhase.RELEASED]
    current = coordinator.current(P(0))
    assert current is not None and current.migration_id == task.migration_id and not current.is_terminal
    # Resumed from its recorded phase by the next driver.
    resumed = drive_with_deadline(coordinator, current, time.monotonic() - 1)
    assert resumed.reports == () and resumed.out_of_time_before == MigrationPhase.DOWNLOADING


@pytest.mark.parametrize("grant_back", [True, False])
def test_a_graceful_move_that_fails_after_the_release_is_granted_back_unless_its_driver_says_not(
    ledger: Ledger, grant_back: bool
) -> None:
    """Granted back, the old owner resumes its partition; a leaving node's driver says not (the node
    stops next and would never take the grant up): the partition stays released for a new owner."""
    old = ledger.members.register_node(N(1), heartbeat_timeout_s=60)
    new = ledger.members.register_node(N(2), heartbeat_timeout_s=60)
    DesiredStates(ledger).update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    token = ledger.acquire(P(0), N(1), expected_epoch=0)
    coordinator = MigrationCoordinator(ledger, NO_WARMUP)
    task = coordinator.plan(P(0), N(2))
    # The old owner drained, checkpointed and released; the new owner's download fails.
    ledger.release(token, commit_ulid=None, source_offset=0)
    old.heartbeat(
        partitions={
            0: PartitionProgress(
                partition=0,
                epoch=1,
                state="released",
                migration_id=task.migration_id,
                phase_done=MigrationPhase.RELEASED.value,
            )
        }
    )
    new.heartbeat(
        partitions={
            0: PartitionProgress(
                partition=0, epoch=0, state="failed", migration_id=task.migration_id, error="disk full"
            )
        }
    )
    driven = drive_with_deadline(coordinator, task, time.monotonic() + 20, grant_back=grant_back)
    assert isinstance(driven.error, MigrationFailed) and "disk full" in str(driven.error), driven
    failed = coordinator.current(P(0))
    assert failed is not None and failed.phase == MigrationPhase.FAILED
    own = ledger.ownership(P(0))
    assert own is not None
    if grant_back:
        assert (own.owner, own.epoch, own.status) == (1, 2, PartitionStatus.ACTIVE), own
    else:
        assert (own.owner, own.epoch, own.status) == (1, 1, PartitionStatus.RELEASED), own


def test_a_released_partition_whose_move_lost_its_driver_is_granted_back_once_the_move_is_overdue(
    ledger: Ledger,
) -> None:
    """A leaving node drove its own moves; it exits with one cut short after its release (a slow store
    ate the time to cancel it). Once that record is past its deadline, the next grant-back (the node's
    rejoin, the failure sensor's look) fails it and grants the partition to its desired owner."""
    ledger.members.register_node(N(1), heartbeat_timeout_s=60)
    ledger.members.register_node(N(2), heartbeat_timeout_s=60)
    DesiredStates(ledger).update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    token = ledger.acquire(P(0), N(1), expected_epoch=0)
    # A deadline a loaded S3-protocol server cannot outrun between the plan and the first grant-back.
    task = MigrationCoordinator(ledger, MigrationConfig(migration_timeout_s=3.0, warmup_timeout_s=0)).plan(P(0), N(2))
    ledger.release(token, commit_ulid=None, source_offset=0)  # the leaving node's stop
    coordinator = MigrationCoordinator(ledger)
    assert coordinator.reinstate(P(0)) is None, "a move in flight decides, until its deadline"
    time.sleep(max(0.0, seconds_left(task)) + 0.1)
    assert coordinator.reinstate(P(0)) == 2
    failed = coordinator.current(P(0))
    assert failed is not None and failed.migration_id == task.migration_id and failed.phase == MigrationPhase.FAILED
    own = ledger.ownership(P(0))
    assert own is not None and (own.owner, own.epoch, own.status) == (1, 2, PartitionStatus.ACTIVE), own


def test_a_grant_back_lists_the_partition_in_its_owners_assignment_a_dead_writer_left_out(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node takes a grant up from its assignment. The writer of the partition's desired state died
    before the owner's assignment write; the partition, released, is granted back to that owner, whose
    assignment must then list it, or the owner never runs it."""
    ledger.members.register_node(N(1), heartbeat_timeout_s=60)
    desired = DesiredStates(ledger)
    with monkeypatch.context() as died:
        died.setattr(DesiredStates, "_assign", lambda *_args, **_kw: None)
        desired.update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    left_out, _ = desired.assignment(N(1))
    assert left_out is None or 0 not in left_out.partitions
    token = ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.release(token, commit_ulid=None, source_offset=0)
    assert MigrationCoordinator(ledger).reinstate(P(0)) == 2
    listed, _ = DesiredStates(ledger).assignment(N(1))
    state, _ = desired.read(P(0))
    assert listed is not None and listed.partitions.get(0) == state.revision
