"""The partition worker: one thread per owned partition, running its fenced batch loop and its
side of a migration (see `dataplane.node` for the process that hosts the workers)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from laminar_orchestration.dataplane.batches import poison_check, remove_after_grace
from laminar_orchestration.dataplane.folding import fold_batch, fold_context
from laminar_orchestration.dataplane.handoff import (
    HandoffMismatch,
    NewOwnerAction,
    OldOwnerAction,
    asks_old_owner,
    new_owner_step,
    old_owner_step,
    seal_at,
    take_over,
)
from laminar_orchestration.dataplane.host import WorkerHost
from laminar_orchestration.dataplane.log_watch import LogWatch
from laminar_orchestration.dataplane.pipeline import BatchPipeline
from laminar_orchestration.dataplane.restore import CatchUp, progress_of, progress_record
from laminar_orchestration.dataplane.snapshots import SnapshotSchedule
from laminar_orchestration.dataplane.tracking import BatchSteps, BatchTimings, Fenced, PhaseAborted, Tracker, elapsed_ms
from laminar_orchestration.dataplane.worker_state import WorkerState as WorkerState
from laminar_orchestration.dataplane.worker_state import check_transition
from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.processing.contract import BatchFold, EventTimeProgress, delta_with_removals
from laminar_orchestration.protocol.chain import ManifestUpdate, ManifestVersion
from laminar_orchestration.protocol.cluster_epoch import StaleClusterEpoch
from laminar_orchestration.protocol.commit import commit
from laminar_orchestration.protocol.fencing import (
    EpochError,
    FencingToken,
    NotOwned,
    PartitionGuard,
    StaleEpoch,
)
from laminar_orchestration.protocol.manifest import StaleFencingToken
from laminar_orchestration.protocol.records import PartitionProgress, PartitionStatus, now
from laminar_orchestration.protocol.tasks import (
    MigrationKind,
    MigrationPhase,
    MigrationTask,
)
from laminar_orchestration.store import StoreError

log = logging.getLogger("laminar.node")


class PartitionWorker(threading.Thread):
    """Runs one partition on this node: recover or rise, process, and set (release)."""

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

    # -- control (called from the reconcile loop) --------------------------------

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

    # -- the thread --------------------------------------------------------------

    def run(self) -> None:
        try:
            if self.node.cluster_epoch == 0:  # a node driven without `Node.run` (benchmarks)
                self.node.observe_cluster_epoch(self.node.ledger.membership().cluster_epoch)
            if self._rising:
                try:
                    self._rise()
                except PhaseAborted:
                    self.state_name = WorkerState.STOPPED
                    return
            else:
                self._recover()
            while True:
                self._process()
                if self._stop_requested.is_set():
                    self._shutdown()
                    return
                try:
                    self._set()
                    return
                except PhaseAborted:
                    log.info("node %s: partition %s migration aborted, resuming", self.node.id, self.partition)
                    self._phase_done, self._done_for = None, None
                    self.state_name = WorkerState.RUNNING
        except (Fenced, EpochError) as exc:
            self._revoked(str(exc) if not isinstance(exc, Fenced) else (self.tracker.reason or "fenced"))
        except Exception as exc:
            # One line per failure, with the restart delay, is logged by the node's reconcile loop.
            log.debug("node %s: partition %s failed", self.node.id, self.partition, exc_info=True)
            self.failure = exc
            self._error = f"{type(exc).__name__}: {exc}"
            self.state_name = WorkerState.FAILED
            self.node.report_now()
        finally:
            self._drop_guard()
            self.batches.close()  # the local store is closed or handed on next: no read may be inside it
            self.snapshots.abandon()
            if self.state_name in (WorkerState.REVOKED, WorkerState.RELEASED):
                # Another node owns the partition now. It holds only committed state, so a standby
                # of this node goes on from it instead of downloading the partition again.
                if not self.node.follow_as_standby(self.replica):
                    self.replica.destroy()
            else:
                self.replica.close()  # a restart here checks it against the manifest before use
            # A batch abandoned by the drain or the fence may still have Spark tasks reading its files.
            remove_after_grace(self._workdir)

    def _drop_guard(self) -> None:
        if self.guard is not None:
            current = self.node.guards.get(self.partition)
            if current is self.guard:
                self.node.guards.remove(self.partition)

    def _revoked(self, reason: str) -> None:
        # Everything local is discarded (in `run`): the new owner restores from the store.
        self.state_name = WorkerState.REVOKED
        self._error = None
        log.error(
            "node %s: partition %s REVOKED at epoch %s: %s; local state discarded",
            self.node.id,
            self.partition,
            self.epoch,
            reason,
        )
        self.node.report_now()

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

    def _warm_up(self) -> MigrationTask:
        """Until the task allows Downloading, follow the chain like a standby and report the lag.

        The coordinator lets the old owner drain once the lag is small, so the
        handoff itself only applies the old owner's last few deltas. Once the old
        owner is asked to drain, it commits at most the batch it has in flight:
        the first batch's Spark work starts then from the chain's offset (again
        if that batch does commit), while the handoff is recorded.
        """
        self.state_name = WorkerState.WARMING
        self._done_for = self._task.migration_id if self._task else None
        # A forced move's old owner commits nothing more once fenced: one look at the chain starts the
        # download early, and polling it again until Downloading would only cost requests.
        forced = self._task is not None and self._task.migration_kind == MigrationKind.FORCED
        looked = False
        final: MigrationTask | None = None
        while True:
            poll = self.node.config.standby_poll_s
            if forced and looked:
                downloading = self._wait_phase(MigrationPhase.DOWNLOADING)
                assert downloading is not None  # no timeout: the phase, or PhaseAborted
                return downloading
            looked = True
            if final is None:
                final = self._wait_phase(MigrationPhase.DRAINING, timeout_s=poll)
            else:
                task = self._wait_phase(MigrationPhase.DOWNLOADING, timeout_s=poll)
                if task is not None:
                    return task
            current = self.node.publisher.current(self.partition)
            if final is not None:
                # The batch needs the events, not the state: its Spark work overlaps the download.
                m = current.manifest if current else None
                self._prefetch(final.to_epoch, m.source_offset if m else 0, progress_of(m))
            if current is not None:
                stats = self.replica.catch_up(current.manifest)
                # The target counts every byte it downloads for this move, warm-up and handoff alike;
                # the coordinator splits the count into the plan's share and the download's.
                self._bytes_moved += stats.bytes_downloaded
                if stats.bytes_downloaded:
                    self.node.report_now()
                self._committed_offset, self._progress = self.replica.source_offset, progress_of(current.manifest)
                if stats.full_restore or stats.deltas_applied:
                    self._log_catch_up("warmed up", stats)
                lag = max(0, current.manifest.source_offset - self.replica.source_offset)
                if lag != self._warm_lag:
                    self._warm_lag = lag
                    self.node.report_now()

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

    # -- recovering and rising ----------------------------------------------------

    def _recover(self) -> None:
        """Take back a partition the control plane granted to this node (a restart, or a grant
        that put it back here).

        The node only adopts: grants are made by the control plane. A restarted
        process re-adopts its node's epoch and seals the chain at its newer
        generation, so its earlier incarnation (maybe a zombie) can publish
        nothing more (`StaleGeneration`).
        """
        ledger = self.node.ledger
        own = ledger.ownership(self.partition)
        if own is None:
            raise EpochError.UnknownPartition(self.partition)
        if own.owner != self.node.id or own.status == PartitionStatus.RELEASED:
            raise NotOwned(self.partition)
        token = ledger.adopt(self.partition, self.node.id)
        how = "adopted"
        self.state_name = WorkerState.RESTORING
        # Sealed at our epoch before we read it: nothing of an older owner lands after what we restore.
        manifest = self._sealed(token)
        self._restore(manifest)
        self._install(token)
        self._takeover(manifest)
        log.info(
            "node %s: partition %s %s at epoch %s (offset %s)",
            self.node.id,
            self.partition,
            how,
            token.epoch,
            self._committed_offset,
        )

    def _rise(self) -> None:
        """The new owner's side of a migration, one `handoff.new_owner_step` at a time: warm up, then
        download → restore → seek → active."""
        first = self._task
        assert first is not None
        mid = first.migration_id
        restored: ManifestVersion | None = None
        released: str | None = None
        downloaded = False
        #: Seconds spent per step (e.g. "wait", "restore restoring"): where this node's share of a handoff went.
        spent: dict[str, float] = {}
        while True:
            task = self._task
            step = new_owner_step(
                task,
                migration_id=mid,
                reported=self._phase_done if self._done_for == mid else None,
                restored=downloaded,
                took_over=self.token is not None,
            )
            label = step.action.value if step.phase is None else f"{step.action.value} {step.phase.value}"
            began = time.monotonic()
            match step.action:
                case NewOwnerAction.DROP:
                    raise PhaseAborted()
                case NewOwnerAction.WARM:
                    self._warm_up()  # returns once Downloading is recorded
                case NewOwnerAction.RESTORE:
                    assert task is not None
                    restored, released = self._download(task, step.phase)
                    downloaded = True
                case NewOwnerAction.REPORT:
                    assert step.phase is not None
                    self._report(step.phase)
                case NewOwnerAction.TAKE_OVER:
                    assert task is not None
                    # The control plane grants the new epoch once Seeking is recorded (after the old
                    # owner's release, or with the fence of a forced move); this node only adopts it.
                    token = self._await_grant(task)
                    spent["grant"] = time.monotonic() - began
                    self._install(token)
                    self._takeover(restored, released=released)
                    assert step.phase is not None
                    self._report(step.phase)
                    self._prefetch(token.epoch, self._committed_offset, self._progress)
                case NewOwnerAction.WAIT:
                    self.batches.read_ahead_of(self.batches.prefetched, self.replica.source_offset)
                    self._await_task_change(task)
                case NewOwnerAction.RUN:
                    assert task is not None
                    log.info(
                        "node %s: partition %s acquired at epoch %s (%s %s, offset %s)",
                        self.node.id,
                        self.partition,
                        self.epoch,
                        "placement" if task.from_node == UNASSIGNED else f"{task.migration_kind} migration",
                        mid,
                        self._committed_offset,
                    )
                    log.debug(
                        "node %s: partition %s: migration %s on this node: %s",
                        self.node.id,
                        self.partition,
                        mid,
                        ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in spent.items()),
                    )
                    return
            spent[label] = spent.get(label, 0.0) + time.monotonic() - began

    def _download(self, task: MigrationTask, done: MigrationPhase | None) -> tuple[ManifestVersion | None, str | None]:
        """Restore from the chain (a graceful move: it must end at the released commit), report `done`
        (None: the bytes wait for the next report), start the first batch; what was restored, and released."""
        manifest = self.node.publisher.current(self.partition)
        released: str | None = None
        if task.migration_kind == MigrationKind.GRACEFUL:
            release = self.node.ledger.release_record(self.partition, task.from_epoch)
            if release is None:
                raise RuntimeError(f"epoch {task.from_epoch} of partition {self.partition} was not released")
            released = release.commit_ulid
            if released and (manifest is None or manifest.manifest.commit_ulid != released):
                raise HandoffMismatch(self.partition, released, manifest.manifest.commit_ulid if manifest else None)
        self.state_name = WorkerState.RESTORING
        # The batch needs the events, not the state: its Spark work overlaps the download.
        m = manifest.manifest if manifest else None
        self._prefetch(task.to_epoch, m.source_offset if m else 0, progress_of(m))
        # Snapshot (files this node does not hold yet) + deltas: the restore is done with the download.
        stats = self._restore(manifest)
        self._bytes_moved += stats.bytes_downloaded
        if done is not None:
            self._report(done)
        self._prefetch(task.to_epoch, self._committed_offset, self._progress)
        return manifest, released

    def _await_grant(self, task: MigrationTask) -> FencingToken:
        """Adopt the epoch the control plane grants this node for `task`; PhaseAborted if the task ends first."""
        ledger = self.node.ledger
        while True:
            with contextlib.suppress(NotOwned):  # usually made by now (a forced move's: checked by the restore)
                known = self.node.publisher.grant_keys.known(self.partition, task.to_epoch)
                token = ledger.adopt(self.partition, self.node.id, epoch=task.to_epoch, grant=known)
                if token.epoch >= task.to_epoch:
                    return token
            own = ledger.ownership(self.partition)
            if own is not None and own.epoch >= task.to_epoch:
                # Adopting a grant made to another node (or a later one) raises NotOwned: we lost the move.
                return ledger.adopt(self.partition, self.node.id)
            # Returns at once while Seeking stays allowed; raises once the task is aborted or replaced.
            self._wait_phase(MigrationPhase.SEEKING)
            current = self._task
            if current is None or current.migration_id != task.migration_id:
                raise PhaseAborted()
            time.sleep(self.node.config.migration_poll_s)

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

    def _sealed(self, token: FencingToken) -> ManifestVersion:
        """The chain sealed at `token.epoch` (`handoff.seal_at`); a newer epoch's seal fences the guard."""
        try:
            return seal_at(self.node.publisher, token, generation=self.node.generation)
        except StaleFencingToken as exc:
            if self.guard is not None:
                self.guard.observe_epoch(exc.actual_epoch)
            raise

    def _takeover(self, restored: ManifestVersion | None, *, released: str | None = None) -> None:
        """Hold the chain at our epoch before the first batch (`handoff.take_over`), and restore again
        from its seal if the chain moved past what was restored."""
        assert self.token is not None
        try:
            takeover = take_over(
                self.node.publisher, self.token, generation=self.node.generation, restored=restored, released=released
            )
        except StaleFencingToken as exc:
            if self.guard is not None:
                self.guard.observe_epoch(exc.actual_epoch)
            raise
        if takeover.restore_again:
            self.batches.collect_read_ahead()
            log.warning(
                "node %s: partition %s: the chain moved past what was restored (seq %s); re-restoring",
                self.node.id,
                self.partition,
                restored.manifest.seq if restored else 0,
            )
            self._restore(takeover.sealed)
        self._manifest = takeover.sealed

    def _update(self, **changes: Any) -> ManifestUpdate:
        """The manifest of the committed state as it stands, with `changes`."""
        current = ManifestUpdate(
            source_offset=self._committed_offset,
            snapshot=self.snapshots.snapshot,
            deltas=tuple(self.snapshots.deltas),
            events_applied=self._events_applied,
            cluster_epoch=self.node.cluster_epoch,
            generation=self.node.generation,
            event_time=progress_record(self._progress),
        )
        return dataclasses.replace(current, **changes)

    # -- processing ---------------------------------------------------------------

    def _process(self) -> None:
        self.state_name = WorkerState.RUNNING
        self.node.report_now()
        cfg = self.node.config
        idle_wait = cfg.idle_poll_s
        while not self._stop_requested.is_set() and not self._draining_requested():
            self._check()
            # A batch started ahead for a handoff that went differently (another offset or epoch) is dropped.
            inflight = self.batches.take_prefetched(self._committed_offset, self.epoch, self._progress)
            if inflight is None:
                if self._caught_up_until() is not None:
                    self._snapshot_step(idle=True)
                    with self._task_changed:
                        # Re-checked under the lock: a ring, offer or stop just before the wait is not lost.
                        due = self._caught_up_until()
                        if due is not None and not self._stop_requested.is_set() and not self._draining_requested():
                            self._task_changed.wait(due - time.monotonic())
                    continue
                read_at = time.monotonic()
                # Up to the log end a producer recorded (no probe past it), or until the log ends.
                limit = self.log_watch.read_limit(self._committed_offset)
                batch = self.node.source.read(
                    self.partition, self._committed_offset, cfg.batch_max_events, at_boundary=True, known_end=limit
                )
                self.log_watch.after_read(limit, batch.end_offset if batch else None)
                if batch is None:
                    self._snapshot_step(idle=True)
                    with self._task_changed:
                        # Re-checked under the lock: an offer/stop just before the wait is not lost.
                        if (
                            self._caught_up_until() is None
                            and not self._stop_requested.is_set()
                            and not self._draining_requested()
                        ):
                            self._task_changed.wait(idle_wait)
                    # An idle partition polls ever less often (each poll is a billed GET), up to
                    # `idle_poll_max_s`; the first batch after a pause brings it back to `idle_poll_s`.
                    idle_wait = min(idle_wait * 2, max(cfg.idle_poll_s, cfg.idle_poll_max_s))
                    continue
                idle_wait = cfg.idle_poll_s
                inflight = self.batches.start(batch, read_at=read_at, epoch=self.epoch, progress=self._progress)
            # The touched keys' values are read while Spark aggregates the batch.
            self.batches.read_ahead_of(inflight, self._committed_offset)
            waited_from = time.monotonic()
            # A batch that fails on an event it cannot decode fails the same way every time: it fails
            # the partition with `UndecodableSegment`, which the node does not restart.
            with poison_check(inflight.batch, self.node.engine.processor.name):
                done = self.batches.await_batch(inflight, self._asked_to_leave)
                if done is None:
                    # Nothing of the batch is written: dropping it is safe, and a drain (or a kill-switch)
                    # takes milliseconds instead of a batch's duration. Whoever runs next reads it again.
                    log.info("node %s: partition %s: in-flight batch abandoned", self.node.id, self.partition)
                    continue  # the loop condition (drain, stop) or the check below decides what next
                # A fenced tracker drops the in-flight batch before any external write.
                self._check()
                aggregate, spark_done_at = done
                merging_at = time.monotonic()
                engine = self.node.engine
                previous = self.batches.values_read_ahead(inflight, self._committed_offset, aggregate["key"])
                if previous is None and self.replica.store is not None:
                    previous = self.replica.store.get_many(aggregate["key"].to_pylist())
                assert previous is not None, "restored before processing"
                state_read_at = time.monotonic()
                assert self.replica.store is not None
                context = fold_context(self.epoch, self.node.generation, self._progress, self.replica.store)
                fold = fold_batch(engine, inflight.batch, aggregate, previous, context)
            start, end, cluster_epoch = inflight.batch.start_offset, inflight.batch.end_offset, inflight.cluster_epoch
            steps = BatchSteps(
                events=end - start,
                stage_ms=elapsed_ms(inflight.read_at, inflight.staged_at),
                spark_ms=elapsed_ms(inflight.staged_at, spark_done_at),
                wait_ms=elapsed_ms(waited_from, merging_at),
                read_ms=elapsed_ms(merging_at, state_read_at),
                merge_ms=elapsed_ms(merging_at, time.monotonic()),
            )
            try:
                with self.node.epoch_window.fence(cluster_epoch):
                    self._commit(fold, start, end, cluster_epoch, steps)
                self.node.epoch_window.mark_applied(cluster_epoch)
            except StaleClusterEpoch as exc:
                # Two membership changes overtook this batch: drop it, redo it under the new epoch.
                log.warning("node %s: partition %s: %s; batch dropped and retried", self.node.id, self.partition, exc)
                continue
            self._snapshot_step(idle=False)
        self.state_name = WorkerState.DRAINING if not self._stop_requested.is_set() else self.state_name

    def _commit(self, fold: BatchFold, start: int, end: int, cluster_epoch: int, steps: BatchSteps) -> None:
        """Output and delta uploaded, then one manifest names them with the offset; then the local store."""
        assert self.guard is not None and self.token is not None
        t0 = time.monotonic()
        out_ref = self.node.outputs.write(self.guard, fold.output, start, end)
        t1 = time.monotonic()
        delta = self.node.checkpoints.upload_delta(self.guard, delta_with_removals(fold), start, end)
        t2 = time.monotonic()
        snapshot, deltas = self.snapshots.next_checkpoint(delta)
        self._check()
        update = self._update(
            source_offset=end,
            snapshot=snapshot,
            deltas=tuple(deltas),
            outputs=(out_ref,),
            events_applied=self._events_applied + (end - start),
            cluster_epoch=cluster_epoch,
            event_time=progress_record(fold.progress),
        )
        version = self._publish(update)
        self.node.note_committed(version, {out_ref.key: fold.output})
        t3 = time.monotonic()
        # The local store only ever holds committed state: it is written after the publish.
        self.replica.apply(fold.delta, end, deleted=fold.deleted)
        t4 = time.monotonic()
        self.last_batch = BatchTimings(
            **dataclasses.asdict(steps),
            output_ms=elapsed_ms(t0, t1),
            delta_ms=elapsed_ms(t1, t2),
            publish_ms=elapsed_ms(t2, t3),
            apply_ms=elapsed_ms(t3, t4),
        )
        self.node.metrics.observe_batch(self.partition, self.last_batch)
        log.debug(
            "node %s: partition %s committed [%s, %s): %s", self.node.id, self.partition, start, end, self.last_batch
        )
        self._committed(version)
        self._events_applied += end - start
        self._commits += 1
        self._last_commit_at = now()

    def _committed(self, version: ManifestVersion) -> None:
        m = version.manifest
        self._manifest = version
        self._committed_offset, self._progress = m.source_offset, progress_of(m)
        self.snapshots.committed(m)

    def _snapshot_step(self, *, idle: bool) -> None:
        """Start a snapshot when one is due (`SnapshotSchedule`); publish one that finished uploading when idle."""
        if self.snapshots.step(self.guard, idle=idle):
            self._check()
            snapshot, deltas = self.snapshots.next_checkpoint()
            version = self._publish(self._update(snapshot=snapshot, deltas=tuple(deltas), note="snapshot"))
            self.node.note_committed(version, {})  # the output table's walk passes it without a GET
            self._committed(version)

    def _publish(self, update: ManifestUpdate) -> ManifestVersion:
        """The fenced commit (`commit.commit`); a refused one fences this worker's tracker."""
        assert self.token is not None and self.guard is not None
        # The successor probe is an early exit, not the fence: looked for once per kill-switch period.
        look = time.monotonic() >= self._next_successor_look
        if look:
            self._next_successor_look = time.monotonic() + self.node.config.refresh_interval_s
        try:
            return commit(self.node.ledger, self.node.publisher, self.token, update, look_for_successor=look)
        except EpochError as exc:
            if isinstance(exc, StaleEpoch):
                self.guard.observe_epoch(exc.current_epoch)
            # Every failed commit checks the guard: the partition is gone, fence it.
            self.tracker.fence(str(exc))
            raise

    # -- setting (the old owner's side of a migration) -------------------------------

    def _set(self) -> None:
        """drain → checkpoint → upload → release, one `handoff.old_owner_step` at a time, each only
        once the task record allows it. PhaseAborted when the move ends without the release.

        Every commit already holds its delta, so the checkpoint the new owner needs
        (snapshot + deltas) is committed the moment the last batch is: the old owner
        only publishes a snapshot that finished uploading, never takes a new one.
        """
        assert self.token is not None
        while True:
            task = self._task
            step = old_owner_step(
                task, node=self.node.id, epoch=self.epoch, reported=self._phase_done, reported_for=self._done_for
            )
            match step.action:
                case OldOwnerAction.RUN:
                    raise PhaseAborted()  # the move that asked for the drain ended: run again
                case OldOwnerAction.REPORT:
                    assert step.phase is not None
                    # The one report of the drain covers the upload: publish a snapshot that finished.
                    self._report(step.phase, self._finish_upload())
                case OldOwnerAction.RELEASE:
                    assert task is not None
                    self._release()
                    log.info(
                        "node %s: partition %s released at epoch %s (migration %s, offset %s)",
                        self.node.id,
                        self.partition,
                        self.epoch,
                        task.migration_id,
                        self._committed_offset,
                    )
                    self._report(MigrationPhase.RELEASED)
                    return
                case OldOwnerAction.WAIT:
                    self._await_task_change(task)

    def _finish_upload(self) -> int:
        """Publish the snapshot whose upload has finished (its bytes), drop one still uploading."""
        uploaded = 0
        if self.snapshots.uploaded:
            self._snapshot_step(idle=True)
            uploaded = self.snapshots.snapshot.size if self.snapshots.snapshot else 0
        self.snapshots.abandon()
        return uploaded

    def _release(self) -> None:
        assert self.token is not None
        commit = self._manifest.manifest.commit_ulid if self._manifest else None
        with contextlib.suppress(StoreError):
            self.node.publisher.flush_pointer(self.partition)  # the next owner reads from there
        self.node.ledger.release(self.token, commit_ulid=commit, source_offset=self._committed_offset)
        self._drop_guard()
        self.state_name = WorkerState.RELEASED

    def _shutdown(self) -> None:
        """Clean stop: release after the last commit, so a restart (or another node) takes over gracefully."""
        if self.token is None or self.guard is None:
            self.state_name = WorkerState.STOPPED
            return
        self.snapshots.abandon()
        self._release()
        log.info(
            "node %s: partition %s released at epoch %s (shutdown, offset %s)",
            self.node.id,
            self.partition,
            self.token.epoch,
            self._committed_offset,
        )
        self.state_name = WorkerState.STOPPED
