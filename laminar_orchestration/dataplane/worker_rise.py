"""The new owner's side of a partition worker: take a partition back after a restart (recover), or
take it over in a migration (rise): warm up, download, restore, adopt the granted epoch, seek."""

from __future__ import annotations

import contextlib
import logging
import time

from laminar_orchestration.dataplane.errors import HandoffMismatch, PhaseAborted
from laminar_orchestration.dataplane.handoff import (
    NewOwnerAction,
    new_owner_step,
    seal_at,
    take_over,
)
from laminar_orchestration.dataplane.restore import progress_of
from laminar_orchestration.dataplane.worker_core import WorkerCore
from laminar_orchestration.dataplane.worker_state import WorkerState
from laminar_orchestration.identity import UNASSIGNED
from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.fencing import (
    EpochError,
    FencingToken,
    NotOwned,
)
from laminar_orchestration.protocol.manifest import StaleFencingToken
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.protocol.tasks import MigrationKind, MigrationPhase, MigrationTask

log = logging.getLogger("laminar.node")


class WorkerRise(WorkerCore):
    """A worker's recovery and its new-owner side of a migration (one `handoff.new_owner_step` at a time)."""

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
