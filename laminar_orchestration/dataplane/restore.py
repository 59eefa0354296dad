"""A partition's local state kept equal to a committed manifest: the owner's, a standby's, a query's.

`StateReplica.catch_up(manifest)` brings the local store to exactly the state
the manifest commits: when the local store already reflects an offset of the
manifest's lineage (the snapshot's offset or the end of one of its deltas) it
applies only the missing deltas; otherwise it downloads the snapshot (reusing
files it already holds) and applies every delta. It never replays source
events and never runs Spark. A local directory left by an earlier process is
reused only when its applied marker sits on the manifest's lineage.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from laminar_orchestration.dataplane.checkpoint import download_snapshot, download_table
from laminar_orchestration.dataplane.errors import LocalStateUnusable, StateGap
from laminar_orchestration.dataplane.statestore import PartitionStateStore
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.processing.contract import DELETED_COLUMN, NO_EVENT_TIME, EventTimeProgress, split_delta
from laminar_orchestration.processing.keyed import keyed_aggregation
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.manifest import EventTimeRecord, PartitionManifest, SnapshotFile, SnapshotRef
from laminar_orchestration.store import ObjectStore


@dataclass
class CatchUp:
    """What one `catch_up` did (restore figures for the migration's metadata and benchmarks)."""

    full_restore: bool = False
    bytes_downloaded: int = 0
    deltas_applied: int = 0
    download_s: float = 0.0
    open_s: float = 0.0
    apply_s: float = 0.0
    source_offset: int = 0

    @property
    def total_s(self) -> float:
        return self.download_s + self.open_s + self.apply_s

    def describe(self) -> str:
        """The offset reached and how, for a log line."""
        how = "snapshot + deltas" if self.full_restore else "local store + deltas"
        return (
            f"{self.source_offset} ({how}, {self.bytes_downloaded} bytes, {self.deltas_applied} deltas, "
            f"{self.total_s * 1000:.0f} ms)"
        )


@dataclass
class _Lineage:
    snapshot: SnapshotRef | None = None
    #: Snapshot files this store descends from, by name (what a new snapshot need not upload again).
    files: dict[str, SnapshotFile] = field(default_factory=dict)


def progress_of(manifest: PartitionManifest | None) -> EventTimeProgress:
    """The event-time progress a manifest commits (none before any event time was committed)."""
    if manifest is None or manifest.event_time is None:
        return EventTimeProgress()
    return EventTimeProgress(manifest.event_time.max_event_time, manifest.event_time.late_events)


def progress_record(progress: EventTimeProgress) -> EventTimeRecord | None:
    """`progress` as a manifest holds it (None before any event time)."""
    if progress.max_event_time == NO_EVENT_TIME and not progress.late_events:
        return None
    return EventTimeRecord(max_event_time=progress.max_event_time, late_events=progress.late_events)


def check_lineage(manifest: PartitionManifest) -> None:
    """Raise StateGap unless snapshot + deltas cover exactly [0, source_offset)."""
    pos = manifest.state_offset
    for d in manifest.deltas:
        if d.start_offset != pos or d.end_offset < d.start_offset:
            raise StateGap(manifest.partition, manifest.seq, f"delta {d.ref.key} starts at {d.start_offset}, not {pos}")
        pos = d.end_offset
    if pos != manifest.source_offset:
        raise StateGap(
            manifest.partition, manifest.seq, f"checkpoint reaches offset {pos}, the commit {manifest.source_offset}"
        )


class StateReplica:
    """The local store of one partition under `root`, following the manifest chain."""

    def __init__(
        self,
        root: Path,
        partition: int,
        state_schema: pa.Schema,
        reader: ReadStore,
        *,
        expiry_column: str | None = None,
    ) -> None:
        self.root = root
        self.partition = partition
        #: The stored value columns (the processor codec's schema) and the expiry-indexed one.
        self.schema = state_schema
        self.expiry_column = expiry_column
        self._reader = reader
        self._generation = itertools.count()
        self.store: PartitionStateStore | None = None
        self._lineage = _Lineage()
        root.mkdir(parents=True, exist_ok=True)
        self._adopt_leftover()

    @property
    def _cache(self) -> Path:
        return self.root / "cache"

    @property
    def source_offset(self) -> int:
        return self.store.source_offset if self.store else 0

    @property
    def lineage_files(self) -> dict[str, SnapshotFile]:
        return dict(self._lineage.files)

    def _adopt_leftover(self) -> None:
        """Open the newest store directory an earlier process left here; it is checked on `catch_up`."""
        dirs = sorted((p for p in self.root.glob("db-*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
        for stale in dirs[:-1]:
            shutil.rmtree(stale, ignore_errors=True)
        if dirs:
            try:
                self.store = PartitionStateStore.open_existing(
                    dirs[-1], self.schema, partition=self.partition, expiry_column=self.expiry_column
                )
            except LocalStateUnusable:
                shutil.rmtree(dirs[-1], ignore_errors=True)

    def _new_dir(self) -> Path:
        while True:
            path = self.root / f"db-{time.time_ns()}-{next(self._generation)}"
            if not path.exists():
                return path

    def _drop_store(self) -> None:
        if self.store is not None:
            self.store.destroy()
            self.store = None

    def catch_up(self, manifest: PartitionManifest | None) -> CatchUp:
        """Make the local store reflect exactly `manifest` (empty state for None)."""
        stats = CatchUp()
        if manifest is None:
            if self.store is None or self.store.source_offset != 0:
                self._drop_store()
                self.store = self._open(self._new_dir())
                self._lineage = _Lineage()
            return stats
        check_lineage(manifest)
        local = self.store.source_offset if self.store is not None else None
        boundaries = {manifest.state_offset, *(d.end_offset for d in manifest.deltas)}
        if local is None or local not in boundaries or local > manifest.source_offset:
            self._full_restore(manifest, stats)
            local = manifest.state_offset
        started = time.monotonic()
        assert self.store is not None
        for delta in manifest.deltas:
            if delta.start_offset < local:
                continue
            rows, removed = split_delta(download_table(self._reader, delta.ref))
            self.store.apply(rows, delta.end_offset, deleted=removed)
            stats.deltas_applied += 1
            stats.bytes_downloaded += delta.ref.size
        stats.apply_s = time.monotonic() - started
        stats.source_offset = self.store.source_offset
        return stats

    def _full_restore(self, manifest: PartitionManifest, stats: CatchUp) -> None:
        stats.full_restore = True
        self._drop_store()
        path = self._new_dir()
        snapshot = manifest.snapshot
        if snapshot is None:
            self.store = self._open(path)
            self._lineage = _Lineage()
            return
        started = time.monotonic()
        stats.bytes_downloaded += download_snapshot(self._reader, snapshot, path, self._cache)
        stats.download_s = time.monotonic() - started
        started = time.monotonic()
        try:
            store = PartitionStateStore.open_existing(
                path, self.schema, partition=self.partition, expiry_column=self.expiry_column
            )
        except LocalStateUnusable as exc:
            shutil.rmtree(path, ignore_errors=True)
            raise StateGap(manifest.partition, manifest.seq, f"snapshot does not open: {exc.reason}") from exc
        if store.source_offset != snapshot.source_offset:
            store.destroy()
            raise StateGap(
                manifest.partition,
                manifest.seq,
                f"snapshot holds offset {store.source_offset}, the manifest says {snapshot.source_offset}",
            )
        stats.open_s = time.monotonic() - started
        self.store = store
        self._lineage = _Lineage(snapshot, {f.name: f for f in snapshot.files})
        keep = {f.ref.sha256 for f in snapshot.files}
        for cached in self._cache.iterdir():
            if cached.name not in keep:
                cached.unlink(missing_ok=True)

    def _open(self, path: Path) -> PartitionStateStore:
        return PartitionStateStore(path, self.schema, partition=self.partition, expiry_column=self.expiry_column)

    def apply(self, delta: pa.Table, source_offset: int, *, deleted: pa.Array | None = None) -> None:
        """Apply a commit this node just published (the owner's path): new values, removed keys."""
        assert self.store is not None, "catch_up first"
        self.store.apply(delta, source_offset, deleted=deleted)

    def snapshot_files(self) -> tuple[list[Path], int, Path]:
        """A consistent copy of the store for upload: (files, the offset they reflect, their directory)."""
        assert self.store is not None, "catch_up first"
        offset = self.store.source_offset
        dest = self.root / f"snap-{time.time_ns()}"
        return self.store.checkpoint(dest), offset, dest

    def adopt_snapshot(self, snapshot: SnapshotRef) -> None:
        """A snapshot of this store was published: later snapshots need not upload its files again."""
        self._lineage = _Lineage(snapshot, {f.name: f for f in snapshot.files})

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def destroy(self) -> None:
        """Close and remove everything local (a revoked or released partition)."""
        self.close()
        shutil.rmtree(self.root, ignore_errors=True)


# --- reading the committed state (queries, audits) ------------------------------------


def committed_state(
    store: ObjectStore, partition: int, *, state_schema: pa.Schema | None = None
) -> tuple[pa.Table, int]:
    """The whole committed state of a partition (key + value columns) and its committed source offset."""
    schema = state_schema if state_schema is not None else keyed_aggregation.state_schema
    current = ManifestReader(store).current(PartitionId(partition))
    if current is None:
        return _empty(schema), 0
    with tempfile.TemporaryDirectory(prefix="laminar-query-") as tmp:
        replica = StateReplica(Path(tmp), partition, schema, ReadStore(store))
        try:
            replica.catch_up(current.manifest)
            assert replica.store is not None
            table = replica.store.to_table()
        finally:
            replica.close()
    return table, current.manifest.source_offset


def lookup(
    store: ObjectStore, partition: int, key: str, *, state_schema: pa.Schema | None = None
) -> tuple[dict[str, object] | None, int]:
    """One key's committed values (None if the state does not hold it) and the committed offset.

    Reads the deltas newest first and opens the snapshot only when no delta holds the key.
    """
    schema = state_schema if state_schema is not None else keyed_aggregation.state_schema
    current = ManifestReader(store).current(PartitionId(partition))
    if current is None:
        return None, 0
    m = current.manifest
    check_lineage(m)
    reader = ReadStore(store)
    for delta in reversed(m.deltas):
        rows = download_table(reader, delta.ref)
        hit = rows.filter(pc.equal(rows["key"], key))
        if hit.num_rows:
            if DELETED_COLUMN in hit.column_names and hit[DELETED_COLUMN][hit.num_rows - 1].as_py():
                return None, m.source_offset  # removed (a closed window, an expired key)
            return {f.name: hit[f.name][hit.num_rows - 1].as_py() for f in schema}, m.source_offset
    if m.snapshot is None:
        return None, m.source_offset
    with tempfile.TemporaryDirectory(prefix="laminar-query-") as tmp:
        root = Path(tmp)
        download_snapshot(reader, m.snapshot, root / "db", root / "cache")
        with PartitionStateStore.open_existing(root / "db", schema, partition=partition) as local:
            return local.get(key), m.source_offset


def _empty(schema: pa.Schema) -> pa.Table:
    return pa.schema([pa.field("key", pa.string()), *schema]).empty_table()
