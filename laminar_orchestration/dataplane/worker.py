"""The partition worker: one thread per owned partition, running its fenced batch loop and the old
owner's side of a migration (drain, release), after recovering or rising (`worker_rise.WorkerRise`).
See `dataplane.node` for the process that hosts the workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Any

from laminar_orchestration.dataplane.batches import poison_check, remove_after_grace
from laminar_orchestration.dataplane.errors import Fenced, PhaseAborted
from laminar_orchestration.dataplane.folding import fold_batch, fold_context
from laminar_orchestration.dataplane.handoff import (
    OldOwnerAction,
    old_owner_step,
)
from laminar_orchestration.dataplane.restore import progress_of, progress_record
from laminar_orchestration.dataplane.tracking import BatchSteps, BatchTimings, elapsed_ms
from laminar_orchestration.dataplane.worker_rise import WorkerRise
from laminar_orchestration.dataplane.worker_state import WorkerState
from laminar_orchestration.processing.contract import BatchFold, delta_with_removals
from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestUpdate
from laminar_orchestration.protocol.cluster_epoch import StaleClusterEpoch
from laminar_orchestration.protocol.commit import commit
from laminar_orchestration.protocol.fencing import (
    EpochError,
    StaleEpoch,
)
from laminar_orchestration.protocol.records import now
from laminar_orchestration.protocol.tasks import MigrationPhase
from laminar_orchestration.store import StoreError

log = logging.getLogger("laminar.node")


class PartitionWorker(WorkerRise):
    """Runs one partition on this node: recover or rise, process, and set (release)."""

    def run(self) -> None:
        try:
            if self.node.cluster_epoch == 0:  # a node driven without `Node.run` (benchmarks)
                self.node.observe_cluster_epoch(self.node.ledger.members.record().cluster_epoch)
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
