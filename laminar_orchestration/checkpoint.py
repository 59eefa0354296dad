"""Fenced writes of state snapshots (``checkpoints/``) and output files (``sink/``).

Both are create-only objects under names that carry the writer's epoch, with
the guard's `ConditionalPut` identity and a sha256 in their metadata. They are
invisible until a manifest published under the same fencing token names them;
a zombie's files are never named by a manifest and are removed by the sweep.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pyarrow as pa

from .capabilities import CheckpointWriter, OutputCommitter, ReadStore, checkpoint_key, sink_key
from .errors import CorruptDataError
from .fencing import PartitionGuard
from .manifest import SHA256_METADATA, ArtifactRef, next_ulid
from .processing import parquet_bytes_to_table, table_to_parquet_bytes

BATCH_START_METADATA = "x-laminar-batch-start"
BATCH_END_METADATA = "x-laminar-batch-end"


@dataclass
class CheckpointCorrupt(CorruptDataError):
    """A checkpoint or output object whose bytes do not match its manifest entry."""

    key: str
    reason: str

    def __str__(self) -> str:
        return f"checkpoint object {self.key!r} is unusable: {self.reason}"


def checkpoint_object_key(partition: int, epoch: int) -> str:
    return f"checkpoints/{partition:05d}/{epoch:010d}-{next_ulid()}.parquet"


def output_object_key(partition: int, epoch: int, start: int, end: int) -> str:
    return f"sink/{partition:05d}/{epoch:010d}-{start:020d}-{end:020d}-{next_ulid()}.parquet"


def _fenced_metadata(guard: PartitionGuard, data: bytes) -> dict[str, str]:
    meta = guard.conditional_put_precondition().as_metadata()
    meta[SHA256_METADATA] = hashlib.sha256(data).hexdigest()
    return meta


class CheckpointStore:
    """Uploads and downloads state snapshots. Holds only the `CheckpointWriter` capability."""

    def __init__(self, writer: CheckpointWriter) -> None:
        self._writer = writer

    def upload(self, guard: PartitionGuard, state: pa.Table) -> ArtifactRef:
        return self.upload_bytes(guard, table_to_parquet_bytes(state))

    def upload_bytes(self, guard: PartitionGuard, data: bytes) -> ArtifactRef:
        guard.check()
        key = checkpoint_object_key(guard.partition_id, guard.epoch)
        self._writer.put_checkpoint(checkpoint_key(key), data, _fenced_metadata(guard, data))
        return ArtifactRef(key=key, size=len(data), sha256=hashlib.sha256(data).hexdigest())


def download_bytes(reader: ReadStore, ref: ArtifactRef) -> bytes:
    """Fetch an artifact and check it against its manifest entry."""
    obj = reader.get(ref.key)
    if obj is None:
        raise CheckpointCorrupt(ref.key, "missing from the store")
    if len(obj.data) != ref.size:
        raise CheckpointCorrupt(ref.key, f"size {len(obj.data)} != {ref.size}")
    if hashlib.sha256(obj.data).hexdigest() != ref.sha256:
        raise CheckpointCorrupt(ref.key, "sha256 mismatch")
    return obj.data


def download_table(reader: ReadStore, ref: ArtifactRef) -> pa.Table:
    return parquet_bytes_to_table(download_bytes(reader, ref))


class OutputWriter:
    """Writes a batch's output file. Holds only the `OutputCommitter` capability."""

    def __init__(self, committer: OutputCommitter) -> None:
        self._committer = committer

    def write(self, guard: PartitionGuard, output: pa.Table, start: int, end: int) -> ArtifactRef:
        guard.check()
        data = table_to_parquet_bytes(output)
        key = output_object_key(guard.partition_id, guard.epoch, start, end)
        meta = _fenced_metadata(guard, data)
        meta[BATCH_START_METADATA] = str(start)
        meta[BATCH_END_METADATA] = str(end)
        self._committer.put_output(sink_key(key), data, meta)
        return ArtifactRef(key=key, size=len(data), sha256=meta[SHA256_METADATA])
