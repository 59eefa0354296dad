"""A partition worker's state and the surface the node drives it through: the task it is offered,
the log ends it is told of, its progress report, and the steps both sides of a move share (waiting
for a phase, reporting one, installing a token, restoring the local store).

`worker_rise.WorkerRise` adds the new owner's side (recover, rise), `worker.PartitionWorker` the batch
loop and the old owner's side (drain, release); the thread is the last.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from laminar_orchestration.dataplane.errors import Fenced, PhaseAborted
from laminar_orchestration.dataplane.handoff import (
    asks_old_owner,
)
from laminar_orchestration.dataplane.host import WorkerHost
from laminar_orchestration.dataplane.log_watch import LogWatch
from laminar_orchestration.dataplane.pipeline import BatchPipeline
from laminar_orchestration.dataplane.restore import CatchUp, progress_of
from laminar_orchestration.dataplane.snapshots import SnapshotSchedule
from laminar_orchestration.dataplane.tracking import BatchTimings, Tracker
from laminar_orchestration.dataplane.worker_state import WorkerState, check_transition
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.processing.contract import EventTimeProgress
from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.fencing import (
    FencingToken,
    PartitionGuard,
)
from laminar_orchestration.protocol.records import PartitionProgress
from laminar_orchestration.protocol.tasks import MigrationPhase, MigrationTask

log = logging.getLogger("laminar.node")


class WorkerCore(threading.Thread):
    """One partition's worker state, its control surface (called from the node's loops) and the steps
    shared by both sides of a migration."""

    def __init__(self, node: WorkerHost, partition: PartitionId, *, rising: MigrationTask | None = None) -> None:
        super().__init__(name=f"partition-{partition}", daemon=True)
        self.node = node
        self.partition = partition
        self.tracker = Tracker(partition)
        self._state = WorkerState.STARTING
        self.guard: PartitionGuard | None = None
        self.token: FencingToken | None = None
        self._task: MigrationTask | None = rising
        self._task_changed = threading.Condition()
        self._rising = rising is not None
        self._stop_requested = threading.Event()
        self.replica, speculative, ahead = node.take_over_copy(partition)
        self._committed_offset = 0
        self._events_applied = 0
        #: The event-time progress committed with `_committed_offset`.
        self._progress = EventTimeProgress()
        self._manifest: ManifestVersion | None = None
        #: The committed checkpoint, and when the local store is snapshotted.
        self.snapshots = SnapshotSchedule(node, partition, self.replica)
        self.last_catch_up: CatchUp | None = None
        #: Where the last committed batch's time went.
        self.last_batch: BatchTimings | None = None
        self._warm_lag: int | None = None
        self._commits = 0
        self._last_commit_at: Any = None
        # The last phase this worker completed, and the migration it belongs to.
        self._phase_done: MigrationPhase | None = None
        self._done_for: str | None = None
        self._bytes_moved = 0
        self._error: str | None = None
        self._workdir = Path(tempfile.mkdtemp(prefix=f"p{partition}-", dir=node.scratch))
        #: The batches on their way to a commit (a standby's takeover batch among them).
        self.batches = BatchPipeline(
            node, partition, self.replica, self._workdir, self._task_changed, prefetched=speculative, ahead=ahead
        )
        #: Why the thread ended in FAILED (the node logs it with the restart delay).
        self.failure: BaseException | None = None
        #: When the commit path next looks for a successor's grant (an early exit, not the fence).
        self._next_successor_look = 0.0
        #: What this worker knows of its log's end, and when it reads the log next.
        self.log_watch = LogWatch(fallback_s=node.config.source_fallback_poll_s)

    def offer(self, task: MigrationTask | None) -> None:
        """Hand the worker the partition's current migration task (or None)."""
        with self._task_changed:
            self._task = task
            self._task_changed.notify_all()
        if self._draining_requested():
            self.abandon_batch()

    def source_advanced(self, end_offset: int, *, from_log_ends: bool = False, read_at: float | None = None) -> None:
        """The partition's log reaches `end_offset`: from the recorded log ends (`from_log_ends`,
        which the node reads on a schedule) or a producer's doorbell. Both are hints: the worker
        reads the segments themselves."""
        with self._task_changed:
            if self.log_watch.advanced(end_offset, from_log_ends=from_log_ends, read_at=read_at):
                self._task_changed.notify_all()

    def _prefetch(self, epoch: int, offset: int, progress: EventTimeProgress) -> None:
        with self._task_changed:
            empty = self.log_watch.shows_an_empty_log()
        self.batches.prefetch(epoch, offset, log_is_empty_past=empty, progress=progress)

    def _caught_up_until(self) -> float | None:
        return self.log_watch.idle_until(self._committed_offset)

    def request_stop(self) -> None:
        self._stop_requested.set()
        with self._task_changed:
            self._task_changed.notify_all()
        self.abandon_batch()

    def abandon_batch(self) -> None:
        """Drop the in-flight Spark batch at once (`BatchPipeline.abandon`)."""
        self.batches.abandon()

    @property
    def epoch(self) -> int:
        return self.token.epoch if self.token else 0

    @property
    def migrating(self) -> bool:
        """Whether a migration of this partition is under way (this worker's next step may depend on it)."""
        task = self._task
        return task is not None and not task.is_terminal and not self.finished

    @property
    def commits(self) -> int:
        """Batches this worker committed (a restart's backoff is reset by the first one)."""
        return self._commits

    @property
    def state_name(self) -> WorkerState:
        return self._state

    @state_name.setter
    def state_name(self, new: WorkerState) -> None:
        # Every change of state is checked against the one transition table.
        self._state = check_transition(self._state, new)

    @property
    def finished(self) -> bool:
        return self.state_name.is_finished

    def progress(self) -> PartitionProgress:
        return PartitionProgress(
            partition=self.partition,
            epoch=self.epoch,
            state=self.state_name.value,
            migration_id=self._done_for,
            phase_done=self._phase_done.value if self._phase_done else None,
            bytes_moved=self._bytes_moved,
            source_offset=self._committed_offset,
            events_committed=self._events_applied,
            commits=self._commits,
            last_commit_at=self._last_commit_at,
            error=self._error,
            lag=self._warm_lag if self.state_name == WorkerState.WARMING else None,
        )

    def _drop_guard(self) -> None:
        if self.guard is not None:
            current = self.node.guards.get(self.partition)
            if current is self.guard:
                self.node.guards.remove(self.partition)

    def _check(self) -> None:
        if self.tracker.is_fenced:
            raise Fenced(self.tracker.reason or "fenced")
        if self.guard is not None:
            self.guard.check()

    def _report(self, phase: MigrationPhase, bytes_moved: int | None = None) -> None:
        """Record `phase` done (and the bytes it moved; a target's count is cumulative, so kept)."""
        task = self._task
        self._done_for = task.migration_id if task else None
        self._phase_done = phase
        if bytes_moved is not None:
            self._bytes_moved = bytes_moved
        self.node.report_now()

    def _wait_phase(self, phase: MigrationPhase, *, timeout_s: float | None = None) -> MigrationTask | None:
        """Block until the recorded task allows `phase` (None after `timeout_s`); PhaseAborted if abandoned."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._task_changed:
            while True:
                task = self._task
                if self._stop_requested.is_set():
                    raise PhaseAborted()
                if self.tracker.is_fenced:
                    raise Fenced(self.tracker.reason or "fenced")
                if task is None or task.phase.is_aborted:
                    raise PhaseAborted()
                if task.phase.reached(phase):
                    return task
                left = 0.5 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    return None
                self._task_changed.wait(min(left, 0.5))

    def _asked_to_leave(self) -> bool:
        return self._stop_requested.is_set() or self._draining_requested()

    def _draining_requested(self) -> bool:
        # A forced move never asks the old owner for anything: it is fenced, and revoked by the fence.
        return asks_old_owner(self._task, node=self.node.id, epoch=self.epoch)

    def _await_task_change(self, seen: MigrationTask | None) -> None:
        """Block until the control plane hands over a task record other than `seen` (at most 0.5 s).

        PhaseAborted when the worker is asked to stop; Fenced when the partition is lost.
        """
        with self._task_changed:
            if self._stop_requested.is_set():
                raise PhaseAborted()
            if self.tracker.is_fenced:
                raise Fenced(self.tracker.reason or "fenced")
            if self._task is seen:
                self._task_changed.wait(0.5)

    def _install(self, token: FencingToken) -> None:
        self.token = token
        self.guard = PartitionGuard(token)
        self.node.guards.insert(self.guard)

    def _restore(self, manifest: ManifestVersion | None) -> CatchUp:
        """Bring the local store to `manifest`: snapshot + deltas, no replay of source events."""
        stats = self.replica.catch_up(manifest.manifest if manifest else None)
        self.last_catch_up = stats
        self._manifest = manifest
        m = manifest.manifest if manifest else None
        self._committed_offset, self._events_applied = (m.source_offset, m.events_applied) if m else (0, 0)
        self._progress = progress_of(m)
        self.log_watch.started_at(m.committed_at if m and not m.is_seal else None)  # a seal is no batch
        self.snapshots.restored(m)
        self._log_catch_up("restored", stats)
        return stats

    def _log_catch_up(self, what: str, stats: CatchUp) -> None:
        log.info("node %s: partition %s %s to offset %s", self.node.id, self.partition, what, stats.describe())
