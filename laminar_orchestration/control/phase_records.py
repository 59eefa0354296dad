"""A migration's record in the desired state, written phase by phase: each transition checked, each
write a compare-and-swap (see `protocol.tasks`).

`PhaseRecords` is the migration coordinator's pen: the coordinator decides which phase to record and
when; this writes it, on top of the record it last wrote when nobody wrote since, and says when the
record ended behind the driver's back.
"""

from __future__ import annotations

from laminar_orchestration.errors import ConflictError
from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.protocol.desired_states import DesiredState, DesiredStates
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.group_commit import ASSIGNMENT_LINGER_S
from laminar_orchestration.protocol.migration_errors import MigrationEpochConflict, MigrationFailed
from laminar_orchestration.protocol.move_reports import MoveReports
from laminar_orchestration.protocol.records import now
from laminar_orchestration.protocol.tasks import (
    InvalidTransition,
    MigrationError,
    MigrationKind,
    MigrationPhase,
    MigrationTask,
    check_transition,
    deadline_passed,
    phase_sequence,
)
from laminar_orchestration.store import PreconditionFailed

__all__ = ["GrantPhaseRecorded", "PhaseRecords", "grant_decided", "recorded_with_report"]


def grant_decided(task: MigrationTask) -> bool:
    """Whether `task`'s record reached the phase at which its grant is made (see `grant_phase`)."""
    return task.phase.reached(task.migration_kind.grant_phase)


class GrantPhaseRecorded(MigrationError, ConflictError):
    """Raised inside an abort's CAS: the record reached its grant phase since the abort read it (the
    abort completes the grant and tries again; it never leaves the coordinator)."""

    partition: PartitionId
    migration_id: str
    message = "migration {migration_id} of partition {partition} reached its grant phase since it was read"


def _took_epoch(task: MigrationTask, own: Ownership | None) -> bool:
    """True when the ledger shows `task`'s target holding the epoch `task` moves the partition to."""
    return own is not None and own.owner != UNASSIGNED and (own.owner, own.epoch) == (task.to_node, task.to_epoch)


#: A forced move's target reports Restoring to Active at once (the fence granted it the epoch):
#: these are recorded together, from that report, while Downloading is.
_FORCED_TAKEN_WITH_ACTIVE = (MigrationPhase.RESTORING, MigrationPhase.SEEKING, MigrationPhase.ACTIVE)


def recorded_with_report(task: MigrationTask, phase: MigrationPhase) -> bool:
    """Whether `phase` of `task` was recorded together with a later one, on its node's report (nothing
    is left to record or to wait for)."""
    return (
        task.migration_kind == MigrationKind.FORCED
        and phase in _FORCED_TAKEN_WITH_ACTIVE
        and not task.phase.is_aborted
        and task.phase.reached(phase)
    )


def _steps(task: MigrationTask, target: MigrationPhase) -> tuple[MigrationPhase, ...]:
    """The phases of `task`'s sequence after its recorded one, up to `target` (just `target` if not ahead)."""
    seq = phase_sequence(task.migration_kind)
    if task.phase in seq and target in seq and seq.index(target) > seq.index(task.phase):
        return seq[seq.index(task.phase) + 1 : seq.index(target) + 1]
    return (target,)


class PhaseRecords:
    """Reads and writes of the migration records of one ledger's desired states (`desired`).

    `reports` is the process's board of move reports: while it is busy (many moves at once), the
    phases' assignment writes wait a moment to go out together.
    """

    def __init__(self, desired: DesiredStates, reports: MoveReports) -> None:
        self.desired = desired
        self.reports = reports

    def current(self, partition: PartitionId) -> MigrationTask | None:
        """The migration `partition`'s record holds (read)."""
        return self.desired.read(partition)[0].migration

    def record(
        self,
        partition: PartitionId,
        migration_id: str,
        target: MigrationPhase,
        fields: dict[str, object],
        *,
        own: Ownership | None = None,
        granted: bool = False,
        read: tuple[DesiredState, str | None] | None = None,
        retry: bool = True,
        through: bool = False,
    ) -> MigrationTask:
        """CAS `target` (with `fields`) onto the record (`read`: the record as just read, if it was; with
        `retry=False` a conflict raises PreconditionFailed). An abort passes `own`, the ledger read
        after it completed any grant (`granted`). With `through`, the phases between the recorded one
        and `target` are taken in the same write, each transition checked in turn."""

        def change(state: DesiredState) -> DesiredState | None:
            task = state.migration
            if task is None or task.migration_id != migration_id:
                raise MigrationEpochConflict(partition, -1, -1, task.migration_id if task else None)
            if task.phase == target:
                return None  # already recorded (a resumed orchestrator)
            at = task.phase
            for step in _steps(task, target) if through else (target,):
                check_transition(task.migration_kind, at, step)
                at = step
            if target.is_aborted and grant_decided(task) and not granted:
                raise GrantPhaseRecorded(partition, migration_id)
            update: dict[str, object] = {"phase": target, "updated_at": now(), **fields}
            owner = state.owner
            if target == MigrationPhase.ACTIVE:
                update["completed_at"] = now()
                owner = task.to_node
            if target == MigrationPhase.FAILED:
                update["completed_at"] = now()
            if target.is_aborted:
                update["failed_phase"] = task.phase  # the phase the record was at when it ended
                if _took_epoch(task, own):
                    owner = task.to_node
            return state.model_copy(update={"migration": task.model_copy(update=update), "owner": owner})

        # Many moves at once: their phases' assignment writes wait a moment to go out together.
        linger = ASSIGNMENT_LINGER_S if self.reports.busy() else 0.0
        state = self.desired.update(partition, change, read=read, retry=retry, linger_s=linger)
        assert state.migration is not None
        return state.migration

    def record_from_last_write(
        self, partition: PartitionId, migration_id: str, phase: MigrationPhase
    ) -> MigrationTask | None:
        """Record `phase` on top of the record this coordinator wrote last, without reading it first.

        Only when that record would pass `begin_phase`'s checks; the compare-and-swap proves nobody
        wrote since. A phase that record holds already (the plan's own) is returned as is: the next
        phase's swap checks it. None: no such record, or it was stale (the caller reads the record
        and checks it).
        """
        guess = self.desired.last_written(partition)
        task = guess[0].migration if guess is not None else None
        if guess is None or task is None or task.migration_id != migration_id:
            return None
        if phase in phase_sequence(task.migration_kind) and recorded_with_report(task, phase):
            return task  # taken with a later phase, on the node's report of it
        if phase not in phase_sequence(task.migration_kind) or task.is_terminal or deadline_passed(task):
            return None
        if task.phase.reached(phase):
            return task if task.phase == phase else None
        try:
            return self.record(partition, migration_id, phase, {}, read=guess, retry=False)
        except PreconditionFailed:
            return None

    def record_through(self, task: MigrationTask, target: MigrationPhase, phase: MigrationPhase) -> None:
        """Record `task` at `target`, which its node reported done while `phase` was recorded: the
        phases between are done too, and all are taken in one write."""
        p = PartitionId(task.partition)
        guess = self.desired.last_written(p)
        last = guess[0].migration if guess is not None else None
        read = guess if last is not None and last.migration_id == task.migration_id else None
        try:
            self.record(p, task.migration_id, target, {}, read=read, through=True)
        except InvalidTransition:
            self.still_running(task, phase)  # ended (cancelled, failed) meanwhile: say so
            raise

    def record_warm_bytes(self, task: MigrationTask, warmed: int) -> None:
        """Keep `warmed`, the bytes the target downloaded before the drain, in the task for the download's
        share (when more than the task holds)."""
        if warmed > task.warm_bytes:

            def change(state: DesiredState) -> DesiredState | None:
                current = state.migration
                if current is None or current.migration_id != task.migration_id or current.warm_bytes >= warmed:
                    return None
                return state.model_copy(update={"migration": current.model_copy(update={"warm_bytes": warmed})})

            self.desired.update(PartitionId(task.partition), change)

    def still_running(self, task: MigrationTask, phase: MigrationPhase) -> None:
        """Raise MigrationFailed if `task`'s record ended (or was replaced) behind the driver's back."""
        p = PartitionId(task.partition)
        current = self.current(p)
        if current is None or current.migration_id != task.migration_id:
            raise MigrationFailed(p, phase, "the migration record was replaced by another migration")
        if current.phase.is_aborted:
            raise MigrationFailed(p, current.failed_phase or phase, current.error or str(current.phase))
