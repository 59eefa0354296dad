"""Commit batches without Spark, through the library's real fenced write path (for CLI/audit tests).

The fold is pyarrow's; what is under test is everything around it: output and
checkpoint objects, manifest publish, query and the audit.
"""

from __future__ import annotations

import pyarrow as pa

from laminar_orchestration.capabilities import CheckpointWriter, OutputCommitter
from laminar_orchestration.checkpoint import CheckpointStore, OutputWriter
from laminar_orchestration.fencing import FencingToken, PartitionGuard
from laminar_orchestration.manifest import ManifestPublisher, ManifestUpdate, ManifestVersion
from laminar_orchestration.source import SourceLog
from laminar_orchestration.store import ObjectStore
from laminar_orchestration.verify import _fold


def fold_output(events: pa.Table, previous: pa.Table, epoch: int) -> tuple[pa.Table, pa.Table]:
    """New state and output of the default processor, computed with pyarrow."""
    batch = _fold(events)
    prev = {r["key"]: r for r in previous.to_pylist()}
    state_rows = dict(prev)
    out_rows = []
    for r in batch.to_pylist():
        p = prev.get(r["key"])
        merged = dict(r) if p is None else {
            "key": r["key"], "count": p["count"] + r["count"], "sum": p["sum"] + r["sum"],
            "min": min(p["min"], r["min"]), "max": max(p["max"], r["max"]), "last": r["last"],
            "last_offset": r["last_offset"],
        }  # fmt: skip
        state_rows[r["key"]] = merged
        out_rows.append(
            {
                **{k: merged[k] for k in ("key", "count", "sum", "min", "max", "last")},
                "batch_count": r["count"],
                "batch_sum": r["sum"],
                "epoch": epoch,
                "generation": 1,
            }
        )
    state = pa.Table.from_pylist(list(state_rows.values()), schema=previous.schema)
    return state, pa.Table.from_pylist(out_rows)


def commit_all(
    store: ObjectStore, token: FencingToken, state: pa.Table, offset: int, *, checkpoint: bool = True
) -> tuple[pa.Table, int, ManifestVersion | None]:
    """Commit every event of the partition from `offset`, one batch per read; returns state and offset."""
    guard = PartitionGuard(token)
    source = SourceLog(store)
    publisher = ManifestPublisher(OutputCommitter(store), store)
    outputs = OutputWriter(OutputCommitter(store))
    checkpoints = CheckpointStore(CheckpointWriter(store))
    version = None
    for batch in source.iter_batches(token.partition, offset, 50_000):
        state, output = fold_output(batch.to_table(), state, token.epoch)
        ref = outputs.write(guard, output, batch.start_offset, batch.end_offset)
        ckpt = checkpoints.upload(guard, state) if checkpoint else None
        version = publisher.publish(
            token,
            ManifestUpdate(
                source_offset=batch.end_offset,
                state=ckpt,
                state_offset=batch.end_offset if ckpt else 0,
                outputs=(ref,),
                events_applied=batch.end_offset,
            ),
        )
        offset = batch.end_offset
    return state, offset, version
