"""The two sides of a migration on the nodes, as state machines stepped by whoever drives them.

A graceful move asks the old owner to drain, checkpoint, upload and release,
and the new owner to download, restore, seek and go active; a forced move only
asks the new owner. The coordinator records each phase before a node acts on
it. What a node does next depends only on the recorded task and on what the
node has already done, so it is decided here, by pure functions, once:

* `old_owner_step` - the owner of the partition (what `PartitionWorker` runs
  between its batches);
* `new_owner_step` - a migration's target (what `PartitionWorker` runs before
  its first batch).

The production worker is a threaded loop around these functions (it blocks on
the task record between steps); the simulator steps them one decision at a
time under a seeded scheduler. Both carry out the same decisions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .identity import NodeId
from .migration import MigrationKind, MigrationPhase, MigrationTask


class OldOwnerAction(enum.StrEnum):
    """What the owner of a partition does next about a migration."""

    #: No move asks anything of this owner: process batches (again, if a drain was aborted).
    RUN = "run"
    #: Report `phase` done. Drain, checkpoint and upload have no work left by then: every
    #: commit already holds its delta, and the drain is the end of the batch loop.
    REPORT = "report"
    #: Release the epoch at the last commit, then report Released.
    RELEASE = "release"
    #: The phase is reported: wait for the coordinator to record the next one.
    WAIT = "wait"


class NewOwnerAction(enum.StrEnum):
    """What a migration's target does next."""

    #: Before Downloading: follow the chain like a standby and report how far behind it is.
    WARM = "warm"
    #: Download and restore from the chain (a graceful move: up to the released commit), then
    #: report Downloading.
    RESTORE = "restore"
    #: Report `phase` done.
    REPORT = "report"
    #: Adopt the epoch the control plane granted this node, seal the chain at it, report Seeking.
    TAKE_OVER = "take_over"
    #: The phase is reported: wait for the coordinator to record the next one.
    WAIT = "wait"
    #: The move is Active and reported: process batches as the owner.
    RUN = "run"
    #: The move ended without this node, or another move replaced it: drop what was restored.
    DROP = "drop"


@dataclass(frozen=True)
class OldOwnerStep:
    action: OldOwnerAction
    #: The phase to report (REPORT only).
    phase: MigrationPhase | None = None


@dataclass(frozen=True)
class NewOwnerStep:
    action: NewOwnerAction
    #: The phase to report (REPORT only).
    phase: MigrationPhase | None = None


def asks_old_owner(task: MigrationTask | None, *, node: NodeId, epoch: int) -> bool:
    """Whether `task` is a graceful move of the partition away from `node` at `epoch`, at a phase the
    old owner carries out (Draining to Released). A forced move never asks the old owner anything:
    it is fenced instead."""
    return (
        task is not None
        and task.migration_kind == MigrationKind.GRACEFUL
        and task.phase.needs_old_owner
        and task.from_node == node
        and task.from_epoch == epoch
    )


def old_owner_step(
    task: MigrationTask | None,
    *,
    node: NodeId,
    epoch: int,
    reported: MigrationPhase | None,
    reported_for: str | None,
) -> OldOwnerStep:
    """The owner's next step. `reported` is the last phase it reported, for migration `reported_for`
    (a report for an earlier move counts for nothing in this one)."""
    if task is None or not asks_old_owner(task, node=node, epoch=epoch):
        return OldOwnerStep(OldOwnerAction.RUN)
    if reported_for != task.migration_id:
        reported = None
    if task.phase == MigrationPhase.RELEASED:
        if reported == MigrationPhase.RELEASED:
            return OldOwnerStep(OldOwnerAction.WAIT)
        return OldOwnerStep(OldOwnerAction.RELEASE)
    if reported != task.phase:
        return OldOwnerStep(OldOwnerAction.REPORT, task.phase)
    return OldOwnerStep(OldOwnerAction.WAIT)


def new_owner_step(
    task: MigrationTask | None,
    *,
    migration_id: str,
    reported: MigrationPhase | None,
    restored: bool,
    took_over: bool,
) -> NewOwnerStep:
    """The target's next step in migration `migration_id`.

    `reported` is the last phase it reported for it, `restored` whether it restored the partition
    for it (Downloading done), `took_over` whether it holds the granted epoch and sealed the chain.
    """
    if task is None or task.migration_id != migration_id or task.phase.is_aborted:
        return NewOwnerStep(NewOwnerAction.DROP)
    if not task.phase.reached(MigrationPhase.DOWNLOADING):
        return NewOwnerStep(NewOwnerAction.WARM)
    if not restored:
        return NewOwnerStep(NewOwnerAction.RESTORE)
    if task.phase == MigrationPhase.DOWNLOADING:
        return NewOwnerStep(NewOwnerAction.WAIT)
    if task.phase == MigrationPhase.RESTORING:
        if reported != MigrationPhase.RESTORING:
            return NewOwnerStep(NewOwnerAction.REPORT, MigrationPhase.RESTORING)
        return NewOwnerStep(NewOwnerAction.WAIT)
    if not took_over:
        # Seeking: the control plane grants the epoch when it records Seeking.
        return NewOwnerStep(NewOwnerAction.TAKE_OVER)
    if task.phase == MigrationPhase.SEEKING:
        if reported != MigrationPhase.SEEKING:
            return NewOwnerStep(NewOwnerAction.REPORT, MigrationPhase.SEEKING)
        return NewOwnerStep(NewOwnerAction.WAIT)
    if reported != MigrationPhase.ACTIVE:
        return NewOwnerStep(NewOwnerAction.REPORT, MigrationPhase.ACTIVE)
    return NewOwnerStep(NewOwnerAction.RUN)
