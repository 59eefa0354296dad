"""The two sides of a migration on the nodes, as state machines stepped by whoever drives them.

A graceful move asks the old owner to drain, checkpoint, upload and release,
and the new owner to download, restore, seek and go active; a forced move only
asks the new owner. The coordinator records each phase before a node acts on
it. What a node does next depends only on the recorded task and on what the
node has already done, so it is decided here, by pure functions, once:

* `old_owner_step` - the owner of the partition (what `PartitionWorker` runs
  between its batches);
* `new_owner_step` - a migration's target (what `PartitionWorker` runs before
  its first batch);
* `partition_duty` - what a node starts for a partition it runs nothing for:
  rise as a migration's target, recover its own grant, or nothing;
* `seal_at` and `take_over` - how a new owner (a target, or a restarted node
  recovering its grant) holds the chain at its epoch before its first batch,
  and whether what it restored is still the state to run from.

The production worker is a threaded loop around these functions (it blocks on
the task record between steps); the simulator steps them one decision at a
time under a seeded scheduler. Both carry out the same decisions.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from laminar_orchestration.dataplane.errors import HandoffMismatch
from laminar_orchestration.identity import NodeId
from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestPublisher
from laminar_orchestration.protocol.desired_states import DesiredState
from laminar_orchestration.protocol.fencing import FencingToken, Ownership
from laminar_orchestration.protocol.manifest import StaleFencingToken
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.protocol.tasks import MigrationKind, MigrationPhase, MigrationTask


class OldOwnerAction(enum.StrEnum):
    """What the owner of a partition does next about a migration."""

    #: No move asks anything of this owner: process batches (again, if a drain was aborted).
    RUN = "run"
    #: Report `phase` done: Uploading, for drain, checkpoint and upload at once. The drain is the
    #: end of the batch loop, and every commit already holds its delta, so the checkpoint and the
    #: upload have no work left: one report spares the move two rounds of record and report.
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
    #: report `phase` (Restoring: the restore is done with the download; none for a forced move,
    #: whose take-over follows at once and reports for both).
    RESTORE = "restore"
    #: Report `phase` done.
    REPORT = "report"
    #: Adopt the epoch the control plane granted this node, seal the chain at it, report `phase`
    #: (Seeking; Active for a forced move, which then runs at once).
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
    #: The phase to report (REPORT, TAKE_OVER, and RESTORE once it is done).
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
    (a report for an earlier move counts for nothing in this one).

    It reports once for Draining, Checkpointing and Uploading (as Uploading: all three are done
    when the batch loop has stopped), releases only once Released is recorded, and then waits.
    """
    if task is None or not asks_old_owner(task, node=node, epoch=epoch):
        return OldOwnerStep(OldOwnerAction.RUN)
    if reported_for != task.migration_id:
        reported = None
    if reported is not None and reported.reached(task.phase):
        return OldOwnerStep(OldOwnerAction.WAIT)
    if task.phase == MigrationPhase.RELEASED:
        return OldOwnerStep(OldOwnerAction.RELEASE)
    return OldOwnerStep(OldOwnerAction.REPORT, MigrationPhase.UPLOADING)


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
    if task.migration_kind == MigrationKind.FORCED:
        # The fence granted the epoch before Downloading was recorded, and nobody else may write
        # the partition at it: the target restores, takes the epoch, reports Active (the
        # coordinator records Restoring to Active at once from that report) and processes.
        if not restored:
            return NewOwnerStep(NewOwnerAction.RESTORE)
        if not took_over:
            return NewOwnerStep(NewOwnerAction.TAKE_OVER, MigrationPhase.ACTIVE)
        if reported != MigrationPhase.ACTIVE:
            return NewOwnerStep(NewOwnerAction.REPORT, MigrationPhase.ACTIVE)
        return NewOwnerStep(NewOwnerAction.RUN)
    if not restored:
        return NewOwnerStep(NewOwnerAction.RESTORE, MigrationPhase.RESTORING)
    if not task.phase.reached(MigrationPhase.SEEKING):
        if reported is None or not reported.reached(MigrationPhase.RESTORING):
            return NewOwnerStep(NewOwnerAction.REPORT, MigrationPhase.RESTORING)
        return NewOwnerStep(NewOwnerAction.WAIT)
    if not took_over:
        # Seeking: the control plane grants the epoch when it records Seeking.
        return NewOwnerStep(NewOwnerAction.TAKE_OVER, MigrationPhase.SEEKING)
    if task.phase == MigrationPhase.SEEKING:
        if reported != MigrationPhase.SEEKING:
            return NewOwnerStep(NewOwnerAction.REPORT, MigrationPhase.SEEKING)
        return NewOwnerStep(NewOwnerAction.WAIT)
    if reported != MigrationPhase.ACTIVE:
        return NewOwnerStep(NewOwnerAction.REPORT, MigrationPhase.ACTIVE)
    return NewOwnerStep(NewOwnerAction.RUN)


class PartitionDuty(enum.StrEnum):
    """What a node starts for a partition it runs no worker for."""

    #: Nothing: the partition is someone else's, or waits for the control plane to grant it.
    NONE = "none"
    #: The target of the migration in flight: restore, take over at the granted epoch, go active.
    RISE = "rise"
    #: Its own grant (a restart, or a grant back): adopt it, seal the chain at this process's
    #: generation, restore, run.
    RECOVER = "recover"


def partition_duty(
    state: DesiredState,
    *,
    node: NodeId,
    finished_migration: str | None,
    ownership: Callable[[], Ownership | None],
) -> PartitionDuty:
    """Decide what `node` starts for a partition it runs nothing for, from the desired state.

    `finished_migration` is the migration its last worker for the partition ended in (a node
    does not rise again for a move it already gave up). `ownership` reads the ledger's owner;
    it is called only when the answer depends on it. A node never grants itself anything: a
    released or unassigned partition waits for the control plane (`MigrationCoordinator.reinstate`).
    """
    task = state.migration
    if task is not None and not task.is_terminal:
        if task.to_node == node and finished_migration != task.migration_id:
            return PartitionDuty.RISE
        return PartitionDuty.NONE
    if state.owner != node:
        return PartitionDuty.NONE
    own = ownership()
    if own is not None and own.owner == node and own.status != PartitionStatus.RELEASED:
        return PartitionDuty.RECOVER
    return PartitionDuty.NONE


def seal_at(publisher: ManifestPublisher, token: FencingToken, *, generation: int) -> ManifestVersion:
    """The chain sealed at `token.epoch` by this process (`generation`): sealed here if the granter
    died before it could, sealed again if an earlier incarnation of this node sealed it.

    Writes nothing when it already is. StaleFencingToken when a newer epoch sealed it: the
    token's holder was superseded.
    """
    version = publisher.seal(token.partition, token.epoch, node=token.node, generation=generation, reason="grantee")
    if version.manifest.fencing_token > token.epoch:
        raise StaleFencingToken(token.partition, token.epoch, version.manifest.fencing_token)
    return version


@dataclass(frozen=True)
class Takeover:
    """The chain held at the new owner's epoch, and whether its restore must be redone from it."""

    sealed: ManifestVersion
    #: The chain moved past what was restored before the seal (a forced move: the old owner's
    #: last commit landed after the read). The seal carries that commit's offset and state.
    restore_again: bool


def take_over(
    publisher: ManifestPublisher,
    token: FencingToken,
    *,
    generation: int,
    restored: ManifestVersion | None,
    released: str | None = None,
) -> Takeover:
    """Hold the chain at `token.epoch` before the first batch: its seal is the takeover entry.

    `restored` is what the new owner restored from (None: the chain was empty). `released` is
    the commit a graceful handoff released: the entry below the seal must be it
    (HandoffMismatch otherwise). StaleFencingToken when a newer epoch sealed the chain.
    """
    held = (
        restored is not None
        and restored.manifest.is_seal
        and (restored.manifest.fencing_token, restored.manifest.node) == (token.epoch, token.node)
        and restored.manifest.generation == generation
    )
    # Restored from this very grant's seal (the granter sealed for this process): the chain is held
    # already. A newer epoch sealed since is found by the first commit, which it fences.
    sealed = restored if held and restored is not None else seal_at(publisher, token, generation=generation)
    m = sealed.manifest
    if released is not None:
        # The entry the seal follows by parent hash: forged entries may stand between the two.
        below = publisher.parent(sealed) if m.is_seal else sealed
        found = below.manifest.commit_ulid if below is not None else None
        if found != released:
            raise HandoffMismatch(token.partition, released, found)
    same = restored is not None and restored.raw_hash in (sealed.raw_hash, m.parent_hash if m.is_seal else None)
    empty = restored is None and m.is_seal and m.parent_hash is None
    return Takeover(sealed, restore_again=not (same or empty))
