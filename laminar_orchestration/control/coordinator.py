"""The migration coordinator: drives one migration task phase by phase, recording each
phase before it takes effect (see `protocol.tasks`), and waits on the nodes' reports."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.desired_states import DesiredState, DesiredStates
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.group_commit import ASSIGNMENT_LINGER_S
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
    OldOwnerCrashed,
)
from laminar_orchestration.protocol.move_reports import MoveReports
from laminar_orchestration.protocol.records import (
    NodeRecord,
    PartitionProgress,
    PartitionStatus,
    now,
)
from laminar_orchestration.protocol.tasks import (
    InvalidTransition,
    MigrationConfig,
    MigrationKind,
    MigrationPhase,
    MigrationTask,
    PhaseReport,
    check_transition,
    deadline_passed,
    new_migration_id,
    phase_sequence,
    seconds_left,
)
from laminar_orchestration.sizes import human_size
from laminar_orchestration.store import PreconditionFailed


def _deadline_reason(task: MigrationTask) -> str:
    return f"deadline exceeded: not finished within {task.timeout_s:g}s of {task.started_at.isoformat()}"


def _grant_decided(task: MigrationTask) -> bool:
    """Whether `task`'s record reached the phase at which its grant is made (see `grant_phase`)."""
    return task.phase.reached(task.migration_kind.grant_phase)


class _GrantPhaseRecorded(Exception):
    """Raised inside an abort's CAS: the record reached its grant phase since the abort read it."""


#: Rounds of an abort racing a driver that records its grant phase (one is the norm, two the race).
_ABORT_ATTEMPTS = 4


def _took_epoch(task: MigrationTask, own: Ownership | None) -> bool:
    """True when the ledger shows `task`'s target holding the epoch `task` moves the partition to."""
    return own is not None and own.owner != UNASSIGNED and (own.owner, own.epoch) == (task.to_node, task.to_epoch)


# --- the coordinator ------------------------------------------------------------------

#: How often a wait re-reads the migration record and the old owner's liveness (not on every poll);
#: less often while this process drives many moves at once (`MoveReports.busy`).
_RECORD_CHECK_INTERVAL_S = 0.25
_BUSY_RECORD_CHECK_INTERVAL_S = 1.0
#: A wait for a node's report polls every `poll_interval_s` for its first `_FAST_POLL_S` (most phases
#: are done by then: the handoff's unavailability is made of these waits), then less often up to
#: `_MAX_REPORT_POLL_S`: a node that takes long to do a phase is not read a hundred times a second.
_FAST_POLL_S = 0.3
_MAX_REPORT_POLL_S = 0.05


#: A forced move's target reports Restoring to Active at once (the fence granted it the epoch):
#: these are recorded together, from that report, while Downloading is.
_FORCED_TAKEN_WITH_ACTIVE = (MigrationPhase.RESTORING, MigrationPhase.SEEKING, MigrationPhase.ACTIVE)


def _awaited(task: MigrationTask, phase: MigrationPhase) -> MigrationPhase:
    """The phase whose report ends the wait for `phase`: itself, or Active for a forced move's download."""
    if task.migration_kind == MigrationKind.FORCED and phase == MigrationPhase.DOWNLOADING:
        return MigrationPhase.ACTIVE
    return phase


def _recorded_with_report(task: MigrationTask, phase: MigrationPhase) -> bool:
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


def _next_poll(interval: float, waited_s: float) -> float:
    return interval if waited_s < _FAST_POLL_S else min(interval * 1.5, _MAX_REPORT_POLL_S)


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

    def with_config(self, config: MigrationConfig) -> MigrationCoordinator:
        """This coordinator with other limits, sharing what it wrote and read (its last writes of the
        records, what its plans read): a phase driven under a deadline reads nothing again."""
        other = MigrationCoordinator(self.ledger, config, poll_interval_s=self.poll_interval_s)
        other.desired, other._planned = self.desired, self._planned
        return other

    # -- planning ---------------------------------------------------------------

    def current(self, partition: PartitionId) -> MigrationTask | None:
        return self.desired.read(partition)[0].migration

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
        return self._record(partition, migration_id, target, fields)

    def _abort(
        self, partition: PartitionId, migration_id: str, target: MigrationPhase, **fields: object
    ) -> MigrationTask:
        """Record a move Failed or Cancelled. At or after its grant phase the grant is completed first
        (the driver may be about to make it), so no grant can land after the outcome is recorded."""
        for _ in range(_ABORT_ATTEMPTS):
            task = self.current(partition)
            granting = task is not None and task.migration_id == migration_id and _grant_decided(task)
            if task is not None and granting:
                self._complete_grant(task)
            # A move that ends unfinished after its target took the epoch leaves that target the
            # owner: it becomes the desired owner too, so its node takes the partition up.
            own = self.ledger.ownership(partition)
            try:
                return self._record(partition, migration_id, target, fields, own=own, granted=granting)
            except _GrantPhaseRecorded:
                continue  # the driver recorded the grant phase meanwhile: complete the grant, then retry
        raise MigrationEpochConflict(partition, -1, -1, migration_id)

    def _record(
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
            if target.is_aborted and _grant_decided(task) and not granted:
                raise _GrantPhaseRecorded()
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
        task = self._record_from_last_write(partition, migration_id, phase)
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
                task = self._record(partition, migration_id, phase, {}, read=read)
        # The grant follows the record of its phase: a move that ends from then on completes it.
        if task.migration_kind == MigrationKind.GRACEFUL and phase == MigrationPhase.SEEKING:
            self._grant_target(task)
        if task.migration_kind == MigrationKind.FORCED and phase == MigrationPhase.RELEASED:
            self._fence_old_owner(task)
        return task

    def _record_from_last_write(
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
        if phase in phase_sequence(task.migration_kind) and _recorded_with_report(task, phase):
            return task  # taken with a later phase, on the node's report of it
        if phase not in phase_sequence(task.migration_kind) or task.is_terminal or deadline_passed(task):
            return None
        if task.phase.reached(phase):
            return task if task.phase == phase else None
        try:
            return self._record(partition, migration_id, phase, {}, read=guess, retry=False)
        except PreconditionFailed:
            return None

    def run_phase(self, partition: PartitionId, migration_id: str, phase: MigrationPhase) -> PhaseReport:
        """Persist `phase`, do the coordinator's part of it, wait until the node reports it done."""
        started = time.monotonic()
        task = self.begin_phase(partition, migration_id, phase)
        if phase not in phase_sequence(task.migration_kind):
            return PhaseReport(phase, 0.0, 0, f"not part of a {task.migration_kind} migration")
        if _recorded_with_report(task, phase):
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
            detail = self._wait_warm(task, committed)
            if committed:
                last = reader.current(PartitionId(task.partition))  # the warm-up took its time: read it again
            aligned = self._align_drain(task, last)
            warmed = self._record_warm_bytes(task)
            return PhaseReport(phase, time.monotonic() - started, warmed, f"{detail}; {aligned}")
        progress = self._wait_for_node(task, phase)
        moved = progress.bytes_moved if progress else 0
        if phase == MigrationPhase.DOWNLOADING:
            # The target's count covers the whole move: the plan's share was reported with the plan.
            moved = max(0, moved - task.warm_bytes)
        elif phase != MigrationPhase.UPLOADING:
            moved = 0  # only the transfer phases move bytes
        offset = progress.source_offset if progress else 0
        detail = _phase_detail(task, phase, self._responsible(task, phase), moved, offset)
        return PhaseReport(phase, time.monotonic() - started, moved, detail)

    def _wait_warm(self, task: MigrationTask, committed: int) -> str:
        """Wait (bounded) until the target reports a warm copy of the partition; never fails the move.

        A partition that never committed an event (`committed`, the chain's offset) has no state to
        warm: the target has nothing to download before the drain.
        """
        if committed == 0:
            return f"target node {task.to_node} needs no warm-up: nothing committed yet"
        limit = min(self.config.warmup_timeout_s, seconds_left(task))
        start = time.monotonic()
        interval = self.poll_interval_s
        next_record_check = start + self._record_check_interval()
        while True:
            progress = self._target_progress(task, max_age_s=interval)
            if progress is not None and progress.lag is not None and progress.lag <= self.config.warm_lag_events:
                return f"target node {task.to_node} warm: {progress.lag} committed events behind"
            if time.monotonic() - start >= limit:
                return f"target node {task.to_node} not warm after {limit:.1f}s: the handoff transfers the rest"
            if time.monotonic() >= next_record_check:
                self._still_running(task, MigrationPhase.PLANNED)
                next_record_check = time.monotonic() + self._record_check_interval()
            time.sleep(interval)
            interval = _next_poll(interval, time.monotonic() - start)

    def _target_progress(self, task: MigrationTask, *, max_age_s: float = 0.0) -> PartitionProgress | None:
        """The target's report on this migration's partition, if it is about this migration."""
        progress = self.reports.progress(NodeId(task.to_node), task.partition, max_age_s=max_age_s)
        return progress if progress is not None and progress.migration_id == task.migration_id else None

    def _record_warm_bytes(self, task: MigrationTask) -> int:
        """The bytes the target downloaded before the drain, kept in the task for the download's share."""
        progress = self._target_progress(task)
        warmed = progress.bytes_moved if progress is not None else 0
        if warmed > task.warm_bytes:

            def change(state: DesiredState) -> DesiredState | None:
                current = state.migration
                if current is None or current.migration_id != task.migration_id or current.warm_bytes >= warmed:
                    return None
                return state.model_copy(update={"migration": current.model_copy(update={"warm_bytes": warmed})})

            self.desired.update(PartitionId(task.partition), change)
        return warmed

    def _align_drain(self, task: MigrationTask, last: ManifestVersion | None) -> str:
        """Wait for the old owner's next data commit, so the drain follows it at once.

        Bounded by `drain_alignment_s` from now and by three times the interval between its last
        two commits after the last one: a partition that stopped committing (no traffic), or whose
        next commit is not expected within the limit, drains at once.
        """
        p = PartitionId(task.partition)
        reader = ManifestReader(self.ledger.store)
        limit = min(self.config.drain_alignment_s, seconds_left(task))
        if limit <= 0 or last is None:
            return "drain asked at once"
        if last.manifest.source_offset == 0:
            return "drain asked at once (nothing committed)"  # no data commit to wait for, none to walk back to
        # The last two data commits (seals and snapshot-only entries carry no output) give the cadence.
        commits = [last.manifest] if last.manifest.outputs else []
        seq = last.manifest.seq
        while len(commits) < 2 and seq > 1 and last.manifest.seq - seq < 8:
            seq -= 1
            entry = reader.entry(p, seq)
            if entry is not None and entry.manifest.outputs:
                commits.append(entry.manifest)
            if entry is not None and entry.manifest.source_offset == 0:
                break  # before the first data commit
        if len(commits) < 2:
            return "drain asked at once (no recent commits)"
        interval = (commits[0].committed_at - commits[1].committed_at).total_seconds()
        if commits[0].committed_at + timedelta(seconds=interval) > now() + timedelta(seconds=limit):
            return f"drain asked at once (next commit not expected within {limit:.1f}s)"
        # Three intervals after the last commit: a commit later than that is not coming soon. The wait
        # itself is bounded from now: a last commit older than `limit` still gets its successor waited for.
        due = commits[0].committed_at + timedelta(seconds=max(3 * interval, 0.25))
        stop = time.monotonic() + limit  # the commit times come from the node's clock: bounded here too
        while now() < due and time.monotonic() < stop:
            current = reader.current(p)
            if current is not None and current.manifest.seq > last.manifest.seq and current.manifest.outputs:
                return f"drain asked right after the old owner's commit at offset {current.manifest.source_offset}"
            time.sleep(self.poll_interval_s)
        self._still_running(task, MigrationPhase.PLANNED)
        return "drain asked at once (no commit due)"

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

    def _record_check_interval(self) -> float:
        return _BUSY_RECORD_CHECK_INTERVAL_S if self.reports.busy() else _RECORD_CHECK_INTERVAL_S

    @staticmethod
    def _responsible(task: MigrationTask, phase: MigrationPhase) -> NodeId:
        return NodeId(task.from_node if phase.needs_old_owner else task.to_node)

    def _wait_for_node(self, task: MigrationTask, phase: MigrationPhase) -> PartitionProgressView | None:
        p = PartitionId(task.partition)
        limit = (
            self.config.release_wait_timeout_s if phase.needs_old_owner else self.config.checkpoint_transfer_timeout_s
        )
        start = time.monotonic()
        next_record_check = start + self._record_check_interval()
        interval = self.poll_interval_s
        while True:
            checking = time.monotonic() >= next_record_check
            view = self.phase_reported(task, phase, max_age_s=interval, judge_liveness=checking)
            if view is not None:
                return view
            elapsed = time.monotonic() - start
            if elapsed > limit:
                raise MigrationTimeout(p, phase, elapsed)
            if checking:
                # A cancel or a failure recorded by someone else ends the wait at once.
                self._still_running(task, phase)
                next_record_check = time.monotonic() + self._record_check_interval()
            time.sleep(interval)
            interval = _next_poll(interval, time.monotonic() - start)

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
        p = PartitionId(task.partition)
        node = self._responsible(task, phase)
        progress = self.reports.progress(node, task.partition, max_age_s=max_age_s)
        record = None
        if judge_liveness and (progress is None or progress.migration_id != task.migration_id):
            # A move that ended a while ago has left the move report (a driver resumed late): the
            # node's heartbeat still carries its partitions' last reports.
            record = self.ledger.members.node(node)
            progress = record.partitions.get(task.partition) if record else None
        if progress is not None and progress.migration_id == task.migration_id:
            if progress.error:
                raise MigrationFailed(p, phase, progress.error)
            done = progress.phase_done
            awaited = _awaited(task, phase)
            if done is not None and MigrationPhase(done).reached(awaited):
                if awaited != phase:
                    self._record_through(task, awaited, phase)
                return PartitionProgressView(progress.bytes_moved, progress.source_offset)
        if phase.needs_old_owner and judge_liveness:
            record = record or self.ledger.members.node(node)
            if record is not None and not NodeView.judge(record).alive:
                raise OldOwnerCrashed(p, task.from_epoch)
        if deadline_passed(task):
            raise self._expire(task)
        return None

    def _record_through(self, task: MigrationTask, target: MigrationPhase, phase: MigrationPhase) -> None:
        """Record `task` at `target`, which its node reported done while `phase` was recorded: the
        phases between are done too, and all are taken in one write."""
        p = PartitionId(task.partition)
        guess = self.desired.last_written(p)
        last = guess[0].migration if guess is not None else None
        read = guess if last is not None and last.migration_id == task.migration_id else None
        try:
            self._record(p, task.migration_id, target, {}, read=read, through=True)
        except InvalidTransition:
            self._still_running(task, phase)  # ended (cancelled, failed) meanwhile: say so
            raise

    def _still_running(self, task: MigrationTask, phase: MigrationPhase) -> None:
        """Raise MigrationFailed if `task`'s record ended (or was replaced) behind the driver's back."""
        p = PartitionId(task.partition)
        current = self.current(p)
        if current is None or current.migration_id != task.migration_id:
            raise MigrationFailed(p, phase, "the migration record was replaced by another migration")
        if current.phase.is_aborted:
            raise MigrationFailed(p, current.failed_phase or phase, current.error or str(current.phase))

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


@dataclass(frozen=True)
class PartitionProgressView:
    bytes_moved: int
    #: The source offset the node reported with the phase (its committed position).
    source_offset: int = 0


def _phase_detail(task: MigrationTask, phase: MigrationPhase, node: int, moved: int, offset: int) -> str:
    """What a node-reported phase did, in words: who, how many bytes, which offset, which epoch."""
    at = f"offset {offset:,}"
    what = {
        MigrationPhase.DRAINING: f"stopped taking batches of epoch {task.from_epoch} at {at}",
        MigrationPhase.CHECKPOINTING: f"wrote its final checkpoint of epoch {task.from_epoch} at {at}",
        MigrationPhase.UPLOADING: f"uploaded {human_size(moved)} of state for the handoff",
        MigrationPhase.RELEASED: f"released epoch {task.from_epoch} at {at}",
        MigrationPhase.DOWNLOADING: f"downloaded {human_size(moved)} of state",
        MigrationPhase.RESTORING: f"restored the state committed up to {at}",
        MigrationPhase.SEEKING: f"positioned the source at {at} for epoch {task.to_epoch}",
        MigrationPhase.ACTIVE: f"processing from {at} at epoch {task.to_epoch}",
    }.get(phase, f"reported {phase}")
    return f"node {node} {what}"
