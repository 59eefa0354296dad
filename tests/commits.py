"""Commit batches without Spark, through the library's real fenced write path (for CLI/audit tests).

The batch aggregate is pyarrow's; what is under test is everything around it:
the processor's merge, the local store, output/delta/snapshot objects,
manifest publish, query and the audit.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pyarrow as pa

from laminar_orchestration.dataplane.checkpoint import CheckpointStore, OutputWriter
from laminar_orchestration.dataplane.restore import StateReplica
from laminar_orchestration.ops.verify import reference_batch_aggregate
from laminar_orchestration.processing.contract import FoldContext
from laminar_orchestration.processing.keyed import keyed_aggregation
from laminar_orchestration.protocol.capabilities import CheckpointWriter, OutputCommitter, ReadStore
from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.fencing import FencingToken, PartitionGuard
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore


def fold_output(events: pa.Table, replica: StateReplica, epoch: int) -> pa.Table:
    """The output rows the default processor commits for `events` on top of `replica`'s state."""
    aggregate = reference_batch_aggregate(events)
    assert replica.store is not None
    previous = replica.store.get_many(aggregate["key"].to_pylist())
    return keyed_aggregation.fold(aggregate, previous, FoldContext.at(epoch, 1)).output


def commit_all(
    store: ObjectStore, token: FencingToken, *, snapshot_every: int | None = 1
) -> tuple[pa.Table, int, ManifestVersion | None]:
    """Commit every event of the partition after the current manifest, one batch per read.

    Takes a snapshot after every `snapshot_every` batches (None: deltas only).
    Returns the committed state, the committed offset and the last manifest.
    """
    guard = PartitionGuard(token)
    source = SourceLog(store)
    publisher = ManifestPublisher(OutputCommitter(store), store)
    outputs = OutputWriter(OutputCommitter(store))
    checkpoints = CheckpointStore(CheckpointWriter(store))
    version = publisher.current(token.partition)
    with tempfile.TemporaryDirectory() as tmp:
        replica = StateReplica(Path(tmp), token.partition, keyed_aggregation.state_schema, ReadStore(store))
        replica.catch_up(version.manifest if version else None)
        m = version.manifest if version else None
        snapshot, deltas = (m.snapshot, list(m.deltas)) if m else (None, [])
        offset = m.source_offset if m else 0
        for n, batch in enumerate(source.iter_batches(token.partition, offset, 50_000), start=1):
            aggregate = reference_batch_aggregate(batch.to_table())
            assert replica.store is not None
            previous = replica.store.get_many(aggregate["key"].to_pylist())
            fold = keyed_aggregation.fold(aggregate, previous, FoldContext.at(token.epoch, 1))
            ref = outputs.write(guard, fold.output, batch.start_offset, batch.end_offset)
            deltas.append(checkpoints.upload_delta(guard, fold.delta, batch.start_offset, batch.end_offset))
            version = publisher.publish(
                token,
                ManifestUpdate(
                    source_offset=batch.end_offset,
                    snapshot=snapshot,
                    deltas=tuple(deltas),
                    outputs=(ref,),
                    events_applied=batch.end_offset,
                ),
            )
            replica.apply(fold.delta, batch.end_offset)
            offset = batch.end_offset
            if snapshot_every is not None and n % snapshot_every == 0:
                files, at, directory = replica.snapshot_files()
                snapshot = checkpoints.upload_snapshot(guard, files, at, replica.lineage_files)
                shutil.rmtree(directory)
                replica.adopt_snapshot(snapshot)
                deltas = []
                version = publisher.publish(
                    token,
                    ManifestUpdate(source_offset=offset, snapshot=snapshot, events_applied=offset, note="snapshot"),
                )
        assert replica.store is not None
        state = replica.store.to_table()
        replica.close()
    return state, offset, version
