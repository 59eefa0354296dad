"""The migration coordinator: drives one migration task phase by phase, recording each
phase before it takes effect (see `protocol.tasks`), and waits on the nodes' reports.

`MigrationCoordinator` plans a move, decides each phase, ends moves (failed, cancelled) and grants
the new epoch in step with the record. What it records is written by `phase_records.PhaseRecords`;
what it waits for between phases (the nodes' reports, the target's warm copy, the old owner's next
commit) by `phase_waits.PhaseWaits`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable

from laminar_orchestration.control.phase_records import (
    GrantPhaseRecorded,
    PhaseRecords,
    grant_decided,
    recorded_with_report,
)
from laminar_orchestration.control.phase_waits import (
    PartitionProgressView,
    PhaseWaits,
    awaited,
    phase_detail,
    responsible,
)
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.desired_states import DesiredState, DesiredStates
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.ledger import EpochConflict, Ledger, NotReleased
from laminar_orchestration.protocol.membership import NodeView
from laminar_orchestration.protocol.migration_errors import (
    CancelRefused,
    FenceLost,
    MigrationEpochConflict,
    MigrationFailed,
    MigrationNotOwned,
    MigrationTimeout,
    NoLiveNode,
    NothingToCancel,
)
from laminar_orchestration.protocol.move_reports import MoveReports
from laminar_orchestration.protocol.records import NodeRecord, PartitionStatus, now
from laminar_orchestration.protocol.tasks import (
    InvalidTransition,
    MigrationConfig,
    MigrationKind,
    MigrationPhase,
    MigrationTask,
    PhaseReport,
    deadline_passed,
    new_migration_id,
    phase_sequence,
)


def _deadline_reason(task: MigrationTask) -> str:
    return f"deadline exceeded: not finished within {task.timeout_s:g}s of {task.started_at.isoformat()}"


#: Rounds of an abort racing a driver that records its grant phase (one is the norm, two the race).
_ABORT_ATTEMPTS = 4


class MigrationCoordinator:
    """Plans migrations and drives them phase by phase (used by the Dagster ops and the CLI).

    Each `run_phase` persists the phase in the desired-state record first, then
    performs the coordinator's own part (the forced fence), then waits for the
    responsible node to report the phase done.
    """

    def __init__(self, ledger: Ledger, config: MigrationConfig | None = None, *, poll_interval_s: float = 0.01) -> None:
        self.ledger = ledger
        self.desired = DesiredStates(ledger)
        self.config = config or MigrationConfig()
        self.poll_interval_s = poll_interval_s
        #: The nodes' move reports, shared by every driver in this process that uses `ledger`.
        self.reports = MoveReports.of(ledger)
        #: What `plan` read for each migration it recorded (the ownership, the target's record): the
        #: forced fence grants from it without reading both again (its create-only write checks them).
        self._planned: dict[str, tuple[Ownership, NodeRecord]] = {}
        #: Writes the migration records; waits on the nodes between phases.
        self.records = PhaseRecords(self.desired, self.reports)
        self.waits = PhaseWaits(ledger, self.records, self.reports, self.config, poll_interval_s)

    def with_config(self, config: MigrationConfig) -> MigrationCoordinator:
        """This coordinator with other limits, sharing what it wrote and read (its last writes of the
        records, what its plans read): a phase driven under a deadline reads nothing again."""
        other = MigrationCoordinator(self.ledger, config, poll_interval_s=self.poll_interval_s)
        other.desired, other.records, other._planned = self.desired, self.records, self._planned
        other.waits = dataclasses.replace(self.waits, config=config)
        return other

    # -- planning ---------------------------------------------------------------

    def current(self, partition: PartitionId) -> MigrationTask | None:
        return self.records.current(partition)

    def outcome(self, partition: PartitionId, migration_id: str) -> MigrationTask | None:
        """The record of a migration this coordinator drove to its end: as it last wrote it when that
        ended it (no read), else as read."""
        guess = self.desired.last_written(partition)
        task = guess[0].migration if guess is not None else None
        if task is not None and task.migration_id == migration_id and task.is_terminal:
            return task
        return self.current(partition)

    def plan(
        self,
        partition: PartitionId,
        to_node: NodeId,
        *,
        forced: bool = False,
        read: tuple[DesiredState, str | None] | None = None,
        own: Ownership | None = None,
    ) -> MigrationTask:
        """Record a new migration of `partition` to `to_node` (phase Planned).

        Raises MigrationEpochConflict if an unfinished one is in flight. A caller that has just read
        the desired state (`read`, its record and ETag, with any overdue migration failed) and the
        ownership (`own`) passes them: the record's compare-and-swap checks them anyway.
        """
        if read is None:
            self.expire_overdue(partition)
        target = self.ledger.members.node(to_node)
        if target is None or not NodeView.judge(target).alive:
            raise NoLiveNode(to_node)
        own = own or self.ledger.ownership(partition)
        if own is None:
            raise MigrationNotOwned(partition, UNASSIGNED)
        if own.owner == to_node and not forced:
            raise MigrationNotOwned(partition, own.owner)  # nothing to move
        kind = MigrationKind.FORCED if forced or own.owner == UNASSIGNED else MigrationKind.GRACEFUL
        ts = now()
        task = MigrationTask(
            migration_id=new_migration_id(partition, own.epoch),
            partition=partition,
            migration_kind=kind,
            from_node=own.owner,
            to_node=to_node,
            from_epoch=own.epoch,
            to_epoch=own.epoch + 1,
            phase=MigrationPhase.PLANNED,
            started_at=ts,
            updated_at=ts,
            timeout_s=self.config.migration_timeout_s,
        )

        def claim(state: DesiredState) -> DesiredState:
            running = state.migration
            if running is not None and not running.is_terminal:
                raise MigrationEpochConflict(partition, own.epoch, running.from_epoch, running.migration_id)
            return state.model_copy(update={"migration": task})

        self.desired.update(partition, claim, read=read)
        if len(self._planned) >= 10_000:
            self._planned.clear()  # moves planned and never granted (they failed first): forget them
        self._planned[task.migration_id] = (own, target)
        return task

    def plan_or_resume(self, partition: PartitionId, to_node: NodeId, *, forced: bool = False) -> MigrationTask:
        """`plan`, or the unfinished migration to `to_node` (a record past its deadline is failed first)."""
        read = self.read_state(partition)
        running = read[0].migration
        if running is not None and not running.is_terminal:
            if running.to_node == to_node:
                return running
            raise MigrationEpochConflict(partition, running.from_epoch, running.from_epoch, running.migration_id)
        return self.plan(partition, to_node, forced=forced, read=read)

    def expire_overdue(self, partition: PartitionId, state: DesiredState | None = None) -> MigrationTask | None:
        """Record Failed the partition's unfinished migration if its deadline passed; returns it then.

        Whoever finds such a record fails it (planning, resuming, the retry
        sensor), so a migration whose driver died never blocks the partition.
        `state` is the desired state if the caller just read it.
        """
        task = (state or self.desired.read(partition)[0]).migration
        if task is None or task.is_terminal or not deadline_passed(task):
            return None
        return self._fail_if_current(partition, task.migration_id, _deadline_reason(task))

    def read_state(self, partition: PartitionId) -> tuple[DesiredState, str | None]:
        """The desired state and its ETag, with a migration past its deadline recorded Failed first."""
        read = self.desired.read(partition)
        if self.expire_overdue(partition, read[0]) is not None:
            read = self.desired.read(partition)
        return read

    # -- phase changes ------------------------------------------------------------

    def _transition(
        self, partition: PartitionId, migration_id: str, target: MigrationPhase, **fields: object
    ) -> MigrationTask:
        if target.is_aborted:
            return self._abort(partition, migration_id, target, **fields)
        return self.records.record(partition, migration_id, target, fields)

    def _abort(
        self, partition: PartitionId, migration_id: str, target: MigrationPhase, **fields: object
    ) -> MigrationTask:
        """Record a move Failed or Cancelled. At or after its grant phase the grant is completed first
        (the driver may be about to make it), so no grant can land after the outcome is recorded."""
        for _ in range(_ABORT_ATTEMPTS):
            task = self.current(partition)
            granting = task is not None and task.migration_id == migration_id and grant_decided(task)
            if task is not None and granting:
                self._complete_grant(task)
            # A move that ends unfinished after its target took the epoch leaves that target the
            # owner: it becomes the desired owner too, so its node takes the partition up.
            own = self.ledger.ownership(partition)
            try:
                return self.records.record(partition, migration_id, target, fields, own=own, granted=granting)
            except GrantPhaseRecorded:
                continue  # the driver recorded the grant phase meanwhile: complete the grant, then retry
        raise MigrationEpochConflict(partition, -1, -1, migration_id)

    def _complete_grant(self, task: MigrationTask) -> None:
        """Make the grant `task` decided, as its driver would; nothing if the epoch moved otherwise."""
        reason = f"migration {task.migration_id} ended after its grant was decided: grant completed"
        # Refused when made already (by the driver), or someone else moved the epoch: their grant stands.
        with contextlib.suppress(EpochConflict, NotReleased):
            self._grant_to_target(task, reason, fence=task.migration_kind == MigrationKind.FORCED)

    def fail(self, partition: PartitionId, migration_id: str, error: str) -> MigrationTask:
        """Record migration `migration_id` Failed with `error` (and the phase it failed in)."""
        return self._transition(partition, migration_id, MigrationPhase.FAILED, error=error)

    def cancel(self, partition: PartitionId, migration_id: str, *, grant_back: bool = True) -> MigrationTask:
        """Record migration `migration_id` Cancelled; InvalidTransition once that is no longer safe.
        Cancelled after the release, the partition is granted back to the old owner unless not
        `grant_back` (a leaving node about to stop would never take that grant up)."""
        cancelled = self._transition(partition, migration_id, MigrationPhase.CANCELLED, error="cancelled")
        if grant_back:
            self.reinstate(partition)
        return cancelled

    def cancel_current(self, partition: PartitionId, *, grant_back: bool = True) -> MigrationTask:
        """Cancel whatever migration of `partition` is in flight; returns the Cancelled record.

        Raises NothingToCancel when none is, CancelRefused when it reached Seeking
        (the new owner may hold the epoch: cancelling then would strand it). `grant_back` as for `cancel`.
        """
        task = self.current(partition)
        if task is None or task.is_terminal:
            raise NothingToCancel(partition, task.migration_id if task else None, task.phase if task else None)
        own = self.ledger.ownership(partition)
        if own is not None and own.epoch >= task.to_epoch and own.owner == task.to_node:
            # Granted to the new owner just before Seeking is recorded: cancelling would strand it.
            raise CancelRefused(partition, task.migration_id, MigrationPhase.SEEKING)
        try:
            return self.cancel(partition, task.migration_id, grant_back=grant_back)
        except InvalidTransition:
            latest = self.current(partition)
            if latest is None or latest.migration_id != task.migration_id or latest.is_terminal:
                raise NothingToCancel(
                    partition, latest.migration_id if latest else None, latest.phase if latest else None
                ) from None
            raise CancelRefused(partition, task.migration_id, latest.phase) from None

    def begin_phase(self, partition: PartitionId, migration_id: str, phase: MigrationPhase) -> MigrationTask:
        """The non-blocking start of `run_phase`: check the record, persist `phase`, do the coordinator's part.

        The coordinator's own part is the forced fence (Released of a forced
        move); every other phase is then awaited with `phase_reported`. A phase
        not in the migration's kind is left alone (the task is returned as is).
        Raises MigrationFailed if the record ended, MigrationTimeout (recording
        it Failed) past its deadline, FenceLost if the fence found the epoch moved.
        """
        task = self.records.record_from_last_write(partition, migration_id, phase)
        if task is None:
            read = self.desired.read(partition)
            task = read[0].migration
            if task is None or task.migration_id != migration_id:
                raise MigrationEpochConflict(partition, -1, -1)
            if phase not in phase_sequence(task.migration_kind):
                return task
            if task.phase.is_aborted:
                raise MigrationFailed(partition, task.failed_phase or task.phase, task.error or str(task.phase))
            if not task.is_terminal and deadline_passed(task):
                raise self._expire(task)
            if not task.phase.reached(phase):
                # The record just read is the compare-and-swap's first guess: one read per phase, not two.
                task = self.records.record(partition, migration_id, phase, {}, read=read)
        # The grant follows the record of its phase: a move that ends from then on completes it.
        if task.migration_kind == MigrationKind.GRACEFUL and phase == MigrationPhase.SEEKING:
            self._grant_target(task)
        if task.migration_kind == MigrationKind.FORCED and phase == MigrationPhase.RELEASED:
            self._fence_old_owner(task)
        return task

    def run_phase(self, partition: PartitionId, migration_id: str, phase: MigrationPhase) -> PhaseReport:
        """Persist `phase`, do the coordinator's part of it, wait until the node reports it done."""
        started = time.monotonic()
        task = self.begin_phase(partition, migration_id, phase)
        if phase not in phase_sequence(task.migration_kind):
            return PhaseReport(phase, 0.0, 0, f"not part of a {task.migration_kind} migration")
        if recorded_with_report(task, phase):
            recorded = f"node {task.to_node} reported it done with {task.phase}, recorded at once"
            return PhaseReport(phase, time.monotonic() - started, 0, recorded)
        if task.migration_kind == MigrationKind.FORCED and phase == MigrationPhase.RELEASED:
            fenced = f"epoch {task.from_epoch} fenced: node {task.to_node} granted epoch {task.to_epoch}"
            return PhaseReport(phase, time.monotonic() - started, 0, fenced)
        if phase == MigrationPhase.PLANNED:
            if task.migration_kind != MigrationKind.GRACEFUL:
                planned = (
                    f"planned node {task.from_node} -> node {task.to_node}, epoch {task.from_epoch} -> {task.to_epoch}"
                )
                return PhaseReport(phase, time.monotonic() - started, 0, planned)
            reader = ManifestReader(self.ledger.store)
            last = reader.current(PartitionId(task.partition))
            committed = last.manifest.source_offset if last else 0
            detail = self.waits.warm(task, committed)
            if committed:
                last = reader.current(PartitionId(task.partition))  # the warm-up took its time: read it again
            aligned = self.waits.align_drain(task, last)
            # The bytes the target downloaded before the drain: the download's share is the rest.
            progress = self.waits.target_progress(task)
            warmed = progress.bytes_moved if progress is not None else 0
            self.records.record_warm_bytes(task, warmed)
            return PhaseReport(phase, time.monotonic() - started, warmed, f"{detail}; {aligned}")
        # Each look is `phase_reported`: it records what the node reported through, and ends an overdue move.
        view = self.waits.for_node(task, phase, self.phase_reported)
        moved = view.bytes_moved if view else 0
        if phase == MigrationPhase.DOWNLOADING:
            # The target's count covers the whole move: the plan's share was reported with the plan.
            moved = max(0, moved - task.warm_bytes)
        elif phase != MigrationPhase.UPLOADING:
            moved = 0  # only the transfer phases move bytes
        offset = view.source_offset if view else 0
        detail = phase_detail(task, phase, responsible(task, phase), moved, offset)
        return PhaseReport(phase, time.monotonic() - started, moved, detail)

    def _fence_old_owner(self, task: MigrationTask) -> None:
        """Grant a forced move's new epoch to its target, fencing the old owner. Its phase is recorded:
        the grant is decided, a move that ends now completes it (`_abort`), so it is made whatever
        happened to the record since; a grant made already (a driver before a crash) is found by its
        epoch conflict."""
        p = PartitionId(task.partition)
        if task.from_node == UNASSIGNED:
            reason = f"migration {task.migration_id}: place on node {task.to_node}"
        else:
            reason = f"migration {task.migration_id}: fence node {task.from_node}"
        try:
            self._grant_to_target(task, reason, fence=True)
        except EpochConflict as exc:
            if self._granted_as_planned(task):
                return  # another driver of this same migration fenced first
            # This migration's own record: it can never fence now, so end it (terminally,
            # before raising) instead of leaving it to block every later migration.
            lost = FenceLost(p, task.migration_id, exc.expected, exc.actual)
            self._fail_if_current(p, task.migration_id, str(lost))
            raise lost from None

    def _grant_to_target(self, task: MigrationTask, reason: str, *, fence: bool) -> None:
        """Grant `task`'s new epoch to its target at the target's current generation: by fencing the old
        owner, or by acquiring the epoch it released."""
        p, to_node = PartitionId(task.partition), NodeId(task.to_node)
        planned = self._planned.pop(task.migration_id, None)
        if fence and planned is not None and planned[0].epoch == task.from_epoch:
            own, target = planned
            self.ledger.fence(
                p, to_node, expected_epoch=task.from_epoch, reason=reason, generation=target.generation, current=own
            )
            return
        record = self.ledger.members.node(to_node)
        grant = self.ledger.fence if fence else self.ledger.acquire
        generation = record.generation if record else None
        grant(p, to_node, expected_epoch=task.from_epoch, reason=reason, generation=generation)

    def _granted_as_planned(self, task: MigrationTask) -> bool:
        """Whether the ledger holds exactly the grant `task` was to make (its epoch, to its target)."""
        own = self.ledger.ownership(PartitionId(task.partition))
        return own is not None and own.epoch == task.to_epoch and own.owner == task.to_node

    def _grant_target(self, task: MigrationTask) -> None:
        """Grant a graceful move's new epoch to its target, after the old owner released it (decided
        once Seeking is recorded, as `_fence_old_owner`'s grant)."""
        p = PartitionId(task.partition)
        try:
            self._grant_to_target(task, f"migration {task.migration_id}: hand over to node {task.to_node}", fence=False)
        except EpochConflict as exc:
            if self._granted_as_planned(task):
                return  # another driver of this same migration granted it first
            lost = FenceLost(p, task.migration_id, exc.expected, exc.actual)
            self._fail_if_current(p, task.migration_id, str(lost))
            raise lost from None
        except NotReleased as exc:
            raise MigrationFailed(p, MigrationPhase.SEEKING, str(exc)) from None

    def reinstate(self, partition: PartitionId) -> int | None:
        """Grant a released (or unassigned) partition back to its desired owner; returns the epoch.

        After a clean shutdown, or a graceful move that ended after the release, the partition waits
        for a grant. Nothing happens while a migration is in flight (one past its deadline is failed
        first: its driver died, as a leaving node's does when it exits), when the desired owner is
        not alive, or when someone else moved the epoch first.

        First, a grant whose granter died before sealing the chain is completed
        (`Ledger.complete_grant`): a fence to "unassigned" has no grantee to seal it.
        """
        own = self.ledger.ownership(partition)
        self.ledger.complete_grant(partition, own)
        state, _ = self.read_state(partition)
        if state.owner == UNASSIGNED or (state.migration is not None and not state.migration.is_terminal):
            return None
        if own is None or not (own.owner == UNASSIGNED or own.status == PartitionStatus.RELEASED):
            return None
        target = self.ledger.members.node(NodeId(state.owner))
        if target is None or not NodeView.judge(target).alive:
            return None
        try:
            token = self.ledger.acquire(
                partition,
                NodeId(state.owner),
                expected_epoch=own.epoch,
                reason=f"reinstate on desired owner node {state.owner}",
                generation=target.generation,
            )
        except (EpochConflict, NotReleased):
            return None  # someone else moved it: their grant stands
        # The owner takes a grant up from its assignment: one its last writer left out would strand it.
        self.desired.list_for_owner(partition, state)
        return token.epoch

    def _expire(self, task: MigrationTask) -> MigrationTimeout:
        """Record `task` Failed for its overall deadline; returns the error to raise."""
        p = PartitionId(task.partition)
        elapsed = (now() - task.started_at).total_seconds()
        self._fail_if_current(p, task.migration_id, _deadline_reason(task))
        return MigrationTimeout(p, task.phase, elapsed)

    def _fail_if_current(self, partition: PartitionId, migration_id: str, error: str) -> MigrationTask | None:
        """`fail`, or None when the migration already ended or another replaced it meanwhile."""
        try:
            return self.fail(partition, migration_id, error)
        except (InvalidTransition, MigrationEpochConflict):
            return None

    def phase_reported(
        self, task: MigrationTask, phase: MigrationPhase, *, max_age_s: float = 0.0, judge_liveness: bool = True
    ) -> PartitionProgressView | None:
        """One look at whether the node responsible for `phase` reported it done (non-blocking).

        Reads the node's move report (a read up to `max_age_s` old, shared with the other moves
        waiting on that node). None while it has not. Raises MigrationFailed when that node
        reported an error, OldOwnerCrashed when the old owner a phase needs is no longer alive
        (its node record is read for that unless not `judge_liveness`), MigrationTimeout
        (recording the migration Failed) once the record's own deadline passed, whoever planned
        it and with which config.
        """
        view = self.waits.report(task, phase, max_age_s=max_age_s, judge_liveness=judge_liveness)
        if view is not None:
            if awaited(task, phase) != phase:
                self.records.record_through(task, awaited(task, phase), phase)
            return view
        if deadline_passed(task):
            raise self._expire(task)
        return None

    def run(
        self,
        partition: PartitionId,
        to_node: NodeId,
        *,
        forced: bool = False,
        on_phase: Callable[[PhaseReport], None] | None = None,
    ) -> MigrationTask:
        """Plan (or resume) and drive a whole migration; what the CLI does."""
        task = self.plan_or_resume(partition, to_node, forced=forced)
        for phase in phase_sequence(task.migration_kind):
            report = self.run_phase(partition, task.migration_id, phase)
            if on_phase is not None:
                on_phase(report)
        final = self.current(partition)
        assert final is not None
        return final
