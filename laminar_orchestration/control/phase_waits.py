"""What a migration's driver waits for between recording a phase and the next: each node's report of
its phase, the target's warm copy before a graceful move's drain, the old owner's next commit.

`PhaseWaits` reads the nodes' move reports (`protocol.move_reports`), their node records for the old
owner's liveness and the manifest chain for the commits; every wait re-reads the migration record
now and then (`PhaseRecords.still_running`), so a cancel or a failure recorded by someone else ends it
at once. Recording what was reported is the coordinator's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from laminar_orchestration.control.phase_records import PhaseRecords
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.membership import NodeView
from laminar_orchestration.protocol.migration_errors import MigrationFailed, MigrationTimeout, OldOwnerCrashed
from laminar_orchestration.protocol.move_reports import MoveReports
from laminar_orchestration.protocol.records import PartitionProgress, now
from laminar_orchestration.protocol.tasks import (
    MigrationConfig,
    MigrationKind,
    MigrationPhase,
    MigrationTask,
    seconds_left,
)
from laminar_orchestration.sizes import human_size

__all__ = ["PartitionProgressView", "PhaseWaits", "ReportLook", "awaited", "phase_detail", "responsible"]

#: How often a wait re-reads the migration record and the old owner's liveness (not on every poll);
#: less often while this process drives many moves at once (`MoveReports.busy`).
_RECORD_CHECK_INTERVAL_S = 0.25
_BUSY_RECORD_CHECK_INTERVAL_S = 1.0
#: A wait for a node's report polls every `poll_interval_s` for its first `_FAST_POLL_S` (most phases
#: are done by then: the handoff's unavailability is made of these waits), then less often up to
#: `_MAX_REPORT_POLL_S`: a node that takes long to do a phase is not read a hundred times a second.
_FAST_POLL_S = 0.3
_MAX_REPORT_POLL_S = 0.05


def awaited(task: MigrationTask, phase: MigrationPhase) -> MigrationPhase:
    """The phase whose report ends the wait for `phase`: itself, or Active for a forced move's download."""
    if task.migration_kind == MigrationKind.FORCED and phase == MigrationPhase.DOWNLOADING:
        return MigrationPhase.ACTIVE
    return phase


def responsible(task: MigrationTask, phase: MigrationPhase) -> NodeId:
    """The node that does `phase` of `task`: the old owner, or the target."""
    return NodeId(task.from_node if phase.needs_old_owner else task.to_node)


def _next_poll(interval: float, waited_s: float) -> float:
    return interval if waited_s < _FAST_POLL_S else min(interval * 1.5, _MAX_REPORT_POLL_S)


@dataclass(frozen=True)
class PartitionProgressView:
    """What a node reported with a phase done: the bytes it moved, where its source stood."""

    bytes_moved: int
    #: The source offset the node reported with the phase (its committed position).
    source_offset: int = 0


def phase_detail(task: MigrationTask, phase: MigrationPhase, node: int, moved: int, offset: int) -> str:
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


class ReportLook(Protocol):
    """One non-blocking look at whether a phase was reported done (the coordinator's `phase_reported`)."""

    def __call__(
        self, task: MigrationTask, phase: MigrationPhase, *, max_age_s: float = ..., judge_liveness: bool = ...
    ) -> PartitionProgressView | None: ...


@dataclass(frozen=True)
class PhaseWaits:
    """The waits of the migrations one coordinator drives on `ledger`, within `config`'s limits,
    polling every `poll_interval_s` at first."""

    ledger: Ledger
    records: PhaseRecords
    reports: MoveReports
    config: MigrationConfig
    poll_interval_s: float

    def record_check_interval(self) -> float:
        """How long a wait goes between its reads of the migration record (longer while busy)."""
        return _BUSY_RECORD_CHECK_INTERVAL_S if self.reports.busy() else _RECORD_CHECK_INTERVAL_S

    def for_node(self, task: MigrationTask, phase: MigrationPhase, look: ReportLook) -> PartitionProgressView | None:
        """Wait until `look` finds `phase` reported done, within the phase's limit (MigrationTimeout)."""
        p = PartitionId(task.partition)
        limit = (
            self.config.release_wait_timeout_s if phase.needs_old_owner else self.config.checkpoint_transfer_timeout_s
        )
        start = time.monotonic()
        next_record_check = start + self.record_check_interval()
        interval = self.poll_interval_s
        while True:
            checking = time.monotonic() >= next_record_check
            view = look(task, phase, max_age_s=interval, judge_liveness=checking)
            if view is not None:
                return view
            elapsed = time.monotonic() - start
            if elapsed > limit:
                raise MigrationTimeout(p, phase, elapsed)
            if checking:
                # A cancel or a failure recorded by someone else ends the wait at once.
                self.records.still_running(task, phase)
                next_record_check = time.monotonic() + self.record_check_interval()
            time.sleep(interval)
            interval = _next_poll(interval, time.monotonic() - start)

    def report(
        self, task: MigrationTask, phase: MigrationPhase, *, max_age_s: float, judge_liveness: bool
    ) -> PartitionProgressView | None:
        """What the node responsible for `phase` reported of it, once it reported `awaited(task, phase)`
        done; None while it has not.

        Raises MigrationFailed when that node reported an error, OldOwnerCrashed when the old owner a
        phase needs is no longer alive (its node record is read for that unless not `judge_liveness`).
        """
        p = PartitionId(task.partition)
        node = responsible(task, phase)
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
            if done is not None and MigrationPhase(done).reached(awaited(task, phase)):
                return PartitionProgressView(progress.bytes_moved, progress.source_offset)
        if phase.needs_old_owner and judge_liveness:
            record = record or self.ledger.members.node(node)
            if record is not None and not NodeView.judge(record).alive:
                raise OldOwnerCrashed(p, task.from_epoch)
        return None

    def warm(self, task: MigrationTask, committed: int) -> str:
        """Wait (bounded) until the target reports a warm copy of the partition; never fails the move.

        A partition that never committed an event (`committed`, the chain's offset) has no state to
        warm: the target has nothing to download before the drain.
        """
        if committed == 0:
            return f"target node {task.to_node} needs no warm-up: nothing committed yet"
        limit = min(self.config.warmup_timeout_s, seconds_left(task))
        start = time.monotonic()
        interval = self.poll_interval_s
        next_record_check = start + self.record_check_interval()
        while True:
            progress = self.target_progress(task, max_age_s=interval)
            if progress is not None and progress.lag is not None and progress.lag <= self.config.warm_lag_events:
                return f"target node {task.to_node} warm: {progress.lag} committed events behind"
            if time.monotonic() - start >= limit:
                return f"target node {task.to_node} not warm after {limit:.1f}s: the handoff transfers the rest"
            if time.monotonic() >= next_record_check:
                self.records.still_running(task, MigrationPhase.PLANNED)
                next_record_check = time.monotonic() + self.record_check_interval()
            time.sleep(interval)
            interval = _next_poll(interval, time.monotonic() - start)

    def target_progress(self, task: MigrationTask, *, max_age_s: float = 0.0) -> PartitionProgress | None:
        """The target's report on this migration's partition, if it is about this migration."""
        progress = self.reports.progress(NodeId(task.to_node), task.partition, max_age_s=max_age_s)
        return progress if progress is not None and progress.migration_id == task.migration_id else None

    def align_drain(self, task: MigrationTask, last: ManifestVersion | None) -> str:
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
        self.records.still_running(task, MigrationPhase.PLANNED)
        return "drain asked at once (no commit due)"
