"""When a partition worker snapshots its local store (`SnapshotSchedule`), off the batch's critical path.

A partition's committed checkpoint is its newest published snapshot and every
delta after it (`dataplane.checkpoint`). A snapshot is due once enough deltas
follow it, or they weigh enough next to it, or enough time passed
(`NodeConfig.checkpoint_*`). It is taken at a commit's boundary and uploaded
on the node's snapshot pool while batches go on; once uploaded it is *ready*,
and the next manifest the worker publishes (a batch's commit, or one of its
own while the partition is idle) names it in place of the deltas it covers.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from laminar_orchestration.dataplane.checkpoint import next_checkpoint
from laminar_orchestration.dataplane.errors import Fenced
from laminar_orchestration.dataplane.host import WorkerHost
from laminar_orchestration.dataplane.restore import StateReplica
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.fencing import EpochError, PartitionGuard
from laminar_orchestration.protocol.manifest import DeltaRef, PartitionManifest, SnapshotRef

log = logging.getLogger("laminar.node")


class SnapshotSchedule:
    """One partition's committed checkpoint and the snapshot being taken of its local store.

    The worker reports every manifest it commits (`committed`) or restores (`restored`), asks
    for the checkpoint its next manifest names (`next_checkpoint`), and calls `step` after each
    batch and while idle; `abandon` drops an upload when the partition stops or moves.
    """

    def __init__(self, host: WorkerHost, partition: PartitionId, replica: StateReplica) -> None:
        self._host = host
        self._partition = partition
        self._replica = replica
        #: The committed checkpoint: the newest published snapshot and every delta after it.
        self.snapshot: SnapshotRef | None = None
        self.deltas: list[DeltaRef] = []
        #: A snapshot uploaded but not yet published.
        self.ready: SnapshotRef | None = None
        #: A snapshot being uploaded in the background, how to stop it, and the local copy it reads.
        self._upload: Future[SnapshotRef] | None = None
        self._cancel = threading.Event()
        self._dir: Path | None = None
        self._last_snapshot_at = time.monotonic()

    @property
    def uploaded(self) -> bool:
        """Whether an upload has finished (for better or worse) and is not yet collected by `step`."""
        return self._upload is not None and self._upload.done()

    @property
    def settled(self) -> bool:
        """Whether no snapshot is uploading or waiting to be published."""
        return self._upload is None and self.ready is None

    def next_checkpoint(self, delta: DeltaRef | None = None) -> tuple[SnapshotRef | None, list[DeltaRef]]:
        """The checkpoint the next manifest names: a ready snapshot replaces the deltas it covers."""
        return next_checkpoint(self.ready or self.snapshot, self.deltas, delta)

    def committed(self, manifest: PartitionManifest) -> None:
        """`manifest` was published: its checkpoint is the committed one (with the ready snapshot, if it names it)."""
        if self.ready is not None and manifest.snapshot == self.ready:
            self._replica.adopt_snapshot(self.ready)
            self.ready = None
        self.snapshot, self.deltas = manifest.snapshot, list(manifest.deltas)

    def restored(self, manifest: PartitionManifest | None) -> None:
        """The local store was restored to `manifest`: its checkpoint is the committed one, nothing is ready."""
        self.snapshot = manifest.snapshot if manifest else None
        self.deltas = list(manifest.deltas) if manifest else []
        self.ready = None

    def step(self, guard: PartitionGuard | None, *, idle: bool) -> bool:
        """Collect a finished upload, and start a snapshot when one is due. True when a ready snapshot
        should be published now: the worker is `idle`, so no batch's commit names it soon."""
        upload = self._upload
        if upload is not None and upload.done():
            self._upload = None
            self._remove_dir()
            try:
                self.ready = upload.result()
            except (Fenced, EpochError):
                raise
            except Exception as exc:  # the deltas keep the state committed; try again later
                log.warning("node %s: partition %s: snapshot upload failed: %s", self._host.id, self._partition, exc)
                self._last_snapshot_at = time.monotonic()
        if idle and self.ready is not None and guard is not None:
            return True
        if guard is not None and self.settled and self._due():
            self._start(guard)
        return False

    def _due(self) -> bool:
        if not self.deltas:
            return False
        cfg = self._host.config
        delta_bytes = sum(d.ref.size for d in self.deltas)
        snapshot_bytes = self.snapshot.size if self.snapshot else 0
        return (
            len(self.deltas) >= cfg.checkpoint_every_batches
            or (
                snapshot_bytes > 0
                and delta_bytes >= max(cfg.checkpoint_delta_fraction * snapshot_bytes, cfg.checkpoint_min_delta_bytes)
            )
            or time.monotonic() - self._last_snapshot_at >= cfg.checkpoint_every_s
        )

    def _start(self, guard: PartitionGuard) -> None:
        files, offset, directory = self._replica.snapshot_files()
        self._dir = directory
        self._last_snapshot_at = time.monotonic()
        known = self._replica.lineage_files
        self._cancel = cancel = threading.Event()
        self._upload = self._host.snapshot_pool.submit(
            self._host.checkpoints.upload_snapshot, guard, files, offset, known, cancel
        )

    def _remove_dir(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def abandon(self) -> None:
        """Stop the upload under way, if any, and remove its local copy (a snapshot ready stays ready)."""
        upload, self._upload = self._upload, None
        if upload is not None:
            self._cancel.set()
            upload.cancel()
            with contextlib.suppress(Exception):
                # At most the file in flight: its source is the directory removed below.
                upload.result(timeout=30)
        self._remove_dir()
