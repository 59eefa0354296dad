"""The two sides of a migration on the nodes: the decision tables shared by the worker and the simulator.

The worker and the simulator both carry out these decisions, so each rule here
is a promise the whole handoff relies on: nothing is released, taken over or
run before the coordinator recorded the phase that allows it.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from laminar_orchestration.handoff import (
    NewOwnerAction,
    NewOwnerStep,
    OldOwnerAction,
    OldOwnerStep,
    asks_old_owner,
    new_owner_step,
    old_owner_step,
)
from laminar_orchestration.identity import NodeId
from laminar_orchestration.migration import FORCED_PHASES, GRACEFUL_PHASES, MigrationKind, MigrationPhase, MigrationTask

OLD, NEW = NodeId(1), NodeId(2)
EPOCH = 4
MID = "p0-e4-1"


def task(phase: MigrationPhase, kind: MigrationKind = MigrationKind.GRACEFUL, *, mid: str = MID) -> MigrationTask:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return MigrationTask(
        migration_id=mid,
        partition=0,
        migration_kind=kind,
        from_node=OLD,
        to_node=NEW,
        from_epoch=EPOCH,
        to_epoch=EPOCH + 1,
        phase=phase,
        started_at=at,
        updated_at=at,
        timeout_s=60,
    )


def old_step(t: MigrationTask | None, reported: MigrationPhase | None = None, *, epoch: int = EPOCH) -> OldOwnerStep:
    return old_owner_step(t, node=OLD, epoch=epoch, reported=reported, reported_for=MID)


def new_step(
    t: MigrationTask | None,
    reported: MigrationPhase | None = None,
    *,
    restored: bool = False,
    took_over: bool = False,
) -> NewOwnerStep:
    return new_owner_step(t, migration_id=MID, reported=reported, restored=restored, took_over=took_over)


# --- the old owner -------------------------------------------------------------------------------


def test_the_old_owner_reports_each_phase_it_carries_out_once_and_releases_only_at_released() -> None:
    """Walking a graceful move: each of drain, checkpoint and upload is reported once, then the
    owner waits; it releases only once Released is recorded, and then never again."""
    reported: MigrationPhase | None = None
    actions = []
    for phase in (MigrationPhase.DRAINING, MigrationPhase.CHECKPOINTING, MigrationPhase.UPLOADING):
        step = old_step(task(phase), reported)
        assert step == OldOwnerStep(OldOwnerAction.REPORT, phase)
        reported = phase
        assert old_step(task(phase), reported).action == OldOwnerAction.WAIT
        actions.append(step.action)
    assert old_step(task(MigrationPhase.RELEASED), reported).action == OldOwnerAction.RELEASE
    assert old_step(task(MigrationPhase.RELEASED), MigrationPhase.RELEASED).action == OldOwnerAction.WAIT
    assert actions == [OldOwnerAction.REPORT] * 3


@pytest.mark.parametrize(
    "phase",
    [MigrationPhase.PLANNED, MigrationPhase.DOWNLOADING, MigrationPhase.ACTIVE, MigrationPhase.FAILED],
)
def test_the_owner_runs_at_every_phase_that_asks_nothing_of_it(phase: MigrationPhase) -> None:
    """Planned (the target warms up), the new owner's phases and an ended move leave the owner
    processing: a drain aborted after it began resumes the batches."""
    assert old_step(task(phase)).action == OldOwnerAction.RUN
    assert old_step(None).action == OldOwnerAction.RUN


@pytest.mark.parametrize("phase", FORCED_PHASES)
def test_a_forced_move_never_asks_the_old_owner_anything(phase: MigrationPhase) -> None:
    """A forced move fences the old owner instead: it is never asked to drain or to release."""
    t = task(phase, MigrationKind.FORCED)
    assert not asks_old_owner(t, node=OLD, epoch=EPOCH)
    assert old_step(t).action == OldOwnerAction.RUN


def test_only_the_owner_at_the_moves_epoch_is_asked() -> None:
    """A move planned from epoch 4 asks nothing of the same node at another epoch, nor of another node."""
    t = task(MigrationPhase.RELEASED)
    assert old_step(t, epoch=EPOCH + 1).action == OldOwnerAction.RUN
    assert old_owner_step(t, node=NEW, epoch=EPOCH, reported=None, reported_for=None).action == OldOwnerAction.RUN


def test_a_report_for_an_earlier_move_counts_for_nothing_in_this_one() -> None:
    """An owner that reported Checkpointing for an aborted move reports it again for the next one;
    without that, the coordinator would wait on a report that never comes."""
    t = task(MigrationPhase.CHECKPOINTING, mid="p0-e4-2")
    step = old_owner_step(t, node=OLD, epoch=EPOCH, reported=MigrationPhase.CHECKPOINTING, reported_for=MID)
    assert step == OldOwnerStep(OldOwnerAction.REPORT, MigrationPhase.CHECKPOINTING)


# --- the new owner -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(MigrationKind))
def test_the_new_owner_walks_every_phase_in_order_and_runs_only_once_active_is_recorded(
    kind: MigrationKind,
) -> None:
    """Driving the target's machine along the recorded phases: it warms up until Downloading,
    restores, reports each of its phases once, takes over only at Seeking and runs only at Active."""
    phases = GRACEFUL_PHASES if kind == MigrationKind.GRACEFUL else FORCED_PHASES
    reported: MigrationPhase | None = None
    restored = took_over = False
    done: list[tuple[MigrationPhase, NewOwnerAction]] = []
    for phase in phases:
        t = task(phase, kind)
        while True:
            step = new_step(t, reported, restored=restored, took_over=took_over)
            if step.action in (NewOwnerAction.WAIT, NewOwnerAction.WARM, NewOwnerAction.RUN):
                done.append((phase, step.action))
                break
            done.append((phase, step.action))
            if step.action == NewOwnerAction.RESTORE:
                restored, reported = True, MigrationPhase.DOWNLOADING
            elif step.action == NewOwnerAction.TAKE_OVER:
                took_over, reported = True, MigrationPhase.SEEKING
            elif step.action == NewOwnerAction.REPORT:
                assert step.phase == phase, f"reported {step.phase} while {phase} is recorded"
                reported = step.phase
            else:
                pytest.fail(f"unexpected {step} at {phase}")
    acting = [(p, a) for p, a in done if a not in (NewOwnerAction.WAIT, NewOwnerAction.WARM)]
    assert acting == [
        (MigrationPhase.DOWNLOADING, NewOwnerAction.RESTORE),
        (MigrationPhase.RESTORING, NewOwnerAction.REPORT),
        (MigrationPhase.SEEKING, NewOwnerAction.TAKE_OVER),
        (MigrationPhase.ACTIVE, NewOwnerAction.REPORT),
        (MigrationPhase.ACTIVE, NewOwnerAction.RUN),
    ]
    before_download = [a for p, a in done if not p.reached(MigrationPhase.DOWNLOADING)]
    assert set(before_download) == {NewOwnerAction.WARM}


@pytest.mark.parametrize("phase", GRACEFUL_PHASES)
def test_the_new_owner_never_takes_over_or_runs_before_seeking_is_recorded(phase: MigrationPhase) -> None:
    """Whatever it already did, the target takes the epoch only once Seeking (where the control
    plane grants it) is recorded, and processes only once Active is."""
    for restored in (False, True):
        for took_over in (False, True):
            for reported in (None, *GRACEFUL_PHASES):
                action = new_step(task(phase), reported, restored=restored, took_over=took_over).action
                if action == NewOwnerAction.TAKE_OVER:
                    assert phase.reached(MigrationPhase.SEEKING)
                if action == NewOwnerAction.RUN:
                    assert phase == MigrationPhase.ACTIVE and took_over


@pytest.mark.parametrize("phase", [MigrationPhase.FAILED, MigrationPhase.CANCELLED])
def test_an_aborted_move_or_another_move_drops_the_targets_copy(phase: MigrationPhase) -> None:
    """The target of a move that ended without it, or was replaced by another, drops what it restored."""
    assert new_step(task(phase), restored=True).action == NewOwnerAction.DROP
    assert new_step(task(MigrationPhase.SEEKING, mid="p0-e4-9"), restored=True).action == NewOwnerAction.DROP
    assert new_step(None, restored=True).action == NewOwnerAction.DROP


def test_a_target_that_finds_its_move_past_downloading_restores_first() -> None:
    """A target restarted mid-move (nothing restored) restores before anything else, at any later phase."""
    for phase in (MigrationPhase.RESTORING, MigrationPhase.SEEKING, MigrationPhase.ACTIVE):
        assert new_step(task(phase)).action == NewOwnerAction.RESTORE
