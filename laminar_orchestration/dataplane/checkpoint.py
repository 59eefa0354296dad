"""Fenced writes of state checkpoints (``checkpoints/``) and output files (``sink/``), and their reads.

A partition's checkpoint is a *snapshot* of its local store plus the *delta*
of every commit since: each batch's commit uploads its delta (the full new
values of the keys it touched) next to its output, and the manifest names
both. Snapshots are taken off the batch's critical path and upload only the
files the previous snapshot does not already hold.

Every object is create-only, under a name that carries the writer's
partition and epoch, with the guard's `ConditionalPut` identity and a sha256
in its metadata. Objects are invisible until a manifest published under the
same fencing token names them; a zombie's objects are never named and the
sweep removes them.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa

from laminar_orchestration.dataplane.engine import parquet_bytes_to_table, table_to_parquet_bytes
from laminar_orchestration.dataplane.errors import CheckpointCorrupt, SnapshotCancelled
from laminar_orchestration.protocol.capabilities import (
    CheckpointWriter,
    OutputCommitter,
    ReadStore,
    checkpoint_key,
    sink_key,
)
from laminar_orchestration.protocol.fencing import PartitionGuard
from laminar_orchestration.protocol.keys import delta_key, output_object_key, snapshot_file_key
from laminar_orchestration.protocol.manifest import SHA256_METADATA, ArtifactRef, DeltaRef, SnapshotFile, SnapshotRef
from laminar_orchestration.ulid import next_ulid

BATCH_START_METADATA = "x-laminar-batch-start"
BATCH_END_METADATA = "x-laminar-batch-end"


def next_checkpoint(
    snapshot: SnapshotRef | None, deltas: Sequence[DeltaRef], delta: DeltaRef | None = None
) -> tuple[SnapshotRef | None, list[DeltaRef]]:
    """The checkpoint the next manifest names: `snapshot`, the `deltas` it does not cover, then `delta`.

    A snapshot is taken at a commit's boundary, so it covers exactly the deltas
    that start below its offset; the rest still apply on top of it.
    """
    base = snapshot.source_offset if snapshot else 0
    kept = [d for d in deltas if d.start_offset >= base]
    return snapshot, kept + ([delta] if delta else [])


def _fenced_metadata(guard: PartitionGuard, sha256: str) -> dict[str, str]:
    meta = guard.conditional_put_precondition().as_metadata()
    meta[SHA256_METADATA] = sha256
    return meta


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class CheckpointStore:
    """Uploads deltas and snapshots. Holds only the `CheckpointWriter` capability."""

    def __init__(self, writer: CheckpointWriter, *, parallelism: int = 4) -> None:
        self._writer = writer
        self._parallelism = parallelism

    def _put(self, guard: PartitionGuard, key: str, data: bytes, extra: Mapping[str, str] | None = None) -> ArtifactRef:
        guard.check()
        sha = _sha256(data)
        meta = _fenced_metadata(guard, sha)
        meta.update(extra or {})
        self._writer.put_checkpoint(checkpoint_key(key), data, meta)
        return ArtifactRef(key=key, size=len(data), sha256=sha)

    def upload_delta(self, guard: PartitionGuard, delta: pa.Table, start: int, end: int) -> DeltaRef:
        """One commit's delta: the touched keys with their full new values."""
        key = delta_key(guard.partition_id, guard.node_id, guard.epoch, next_ulid())
        ref = self._put(
            guard,
            key,
            table_to_parquet_bytes(delta),
            {BATCH_START_METADATA: str(start), BATCH_END_METADATA: str(end)},
        )
        return DeltaRef(ref=ref, start_offset=start, end_offset=end, rows=delta.num_rows)

    def upload_snapshot(
        self,
        guard: PartitionGuard,
        files: Iterable[Path],
        source_offset: int,
        known: Mapping[str, SnapshotFile],
        cancelled: threading.Event | None = None,
    ) -> SnapshotRef:
        """Upload a local store checkpoint; a file in `known` with the same name and checksum is not sent again.

        `known` maps file names of this store's lineage (downloaded or uploaded
        before) to their objects. A name, size and SHA-256 match is the same
        content, whatever the file: table files never change, and the small
        files RocksDB writes again (CURRENT, OPTIONS) are often byte for byte
        the last snapshot's.
        """
        ulid = next_ulid()  # shared by the snapshot's files

        def one(path: Path) -> SnapshotFile:
            if cancelled is not None and cancelled.is_set():
                raise SnapshotCancelled(guard.partition_id)
            previous = known.get(path.name)
            if (
                previous is not None
                and path.stat().st_size == previous.ref.size
                and _file_sha256(path) == previous.ref.sha256
            ):
                return previous
            key = snapshot_file_key(guard.partition_id, guard.node_id, guard.epoch, ulid, path.name)
            return SnapshotFile(name=path.name, ref=self._put(guard, key, path.read_bytes()))

        paths = sorted(files)
        with ThreadPoolExecutor(self._parallelism, thread_name_prefix="snapshot-upload") as pool:
            uploaded = list(pool.map(one, paths))
        return SnapshotRef(source_offset=source_offset, files=uploaded)


def download_bytes(reader: ReadStore, ref: ArtifactRef) -> bytes:
    """Fetch an artifact and check it against its manifest entry."""
    obj = reader.get(ref.key)
    if obj is None:
        raise CheckpointCorrupt(ref.key, "missing from the store")
    if len(obj.data) != ref.size:
        raise CheckpointCorrupt(ref.key, f"size {len(obj.data)} != {ref.size} (truncated or replaced)")
    if _sha256(obj.data) != ref.sha256:
        raise CheckpointCorrupt(ref.key, "sha256 mismatch")
    return obj.data


def download_table(reader: ReadStore, ref: ArtifactRef) -> pa.Table:
    data = download_bytes(reader, ref)
    try:
        return parquet_bytes_to_table(data)
    except (pa.ArrowException, OSError) as exc:
        raise CheckpointCorrupt(ref.key, f"not a readable Parquet file: {exc}") from exc


def download_snapshot(
    reader: ReadStore, snapshot: SnapshotRef, destination: Path, cache: Path, *, parallelism: int = 4
) -> int:
    """Materialise `snapshot` as a store directory; returns the bytes fetched from the store.

    Files are kept in `cache` by checksum, so a file this node already holds
    (an earlier snapshot of the same lineage, a standby's copy) is linked, not
    downloaded again.
    """
    destination.mkdir(parents=True, exist_ok=False)
    cache.mkdir(parents=True, exist_ok=True)

    def one(f: SnapshotFile) -> int:
        cached = cache / f.ref.sha256
        fetched = 0
        if not (cached.exists() and cached.stat().st_size == f.ref.size):
            data = download_bytes(reader, f.ref)
            tmp = cache / f".{f.ref.sha256}.{secrets.token_hex(4)}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, cached)
            fetched = len(data)
        # Only table files are immutable; RocksDB rewrites the others, so they get a private copy.
        if f.name.endswith(".sst"):
            os.link(cached, destination / f.name)
        else:
            (destination / f.name).write_bytes(cached.read_bytes())
        return fetched

    with ThreadPoolExecutor(parallelism, thread_name_prefix="snapshot-download") as pool:
        return sum(pool.map(one, snapshot.files))


class OutputWriter:
    """Writes a batch's output file. Holds only the `OutputCommitter` capability."""

    def __init__(self, committer: OutputCommitter) -> None:
        self._committer = committer

    def write(self, guard: PartitionGuard, output: pa.Table, start: int, end: int) -> ArtifactRef:
        guard.check()
        data = table_to_parquet_bytes(output)
        key = output_object_key(guard.partition_id, guard.node_id, guard.epoch, start, end, next_ulid())
        meta = _fenced_metadata(guard, _sha256(data))
        meta[BATCH_START_METADATA] = str(start)
        meta[BATCH_END_METADATA] = str(end)
        self._committer.put_output(sink_key(key), data, meta)
        return ArtifactRef(key=key, size=len(data), sha256=meta[SHA256_METADATA])
