"""Restore is snapshot + deltas (no replay, no Spark): a node taking over a partition reads no source
event below the committed offset and runs no aggregate to restore. A crashed node's local store is
reused only when it sits on the committed lineage, and then only the missing deltas are downloaded.

Nodes run in-process (`laminar_dev.chaos.ArrowNode`: the real runtime, batches aggregated without Spark).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest

from laminar_dev.chaos import ArrowNode
from laminar_orchestration.dataplane.restore import StateReplica, committed_state
from laminar_orchestration.dataplane.statestore import PartitionStateStore
from laminar_orchestration.ops.verify import audit_partition
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore
from tests.dataplane import plane


def test_takeover_restores_snapshot_and_deltas_without_replay(
    local_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = local_store
    lineage = plane.build_lineage(store)
    committed = lineage.delta_ends[-1]
    plane.fence_writer(store, lineage)
    # Events after the commit: the new owner must read these, and only these.
    SourceLog(store, partitions=1, segment_events=100).append(0, plane.events(["shared", "d-new", "a3"] * 10))
    end = SourceLog(store).end_offset(0)
    calls = plane.spy_data_plane(monkeypatch)
    plane.assign(store, 0, 2)
    with plane.running(ArrowNode(plane.node_config(store, 2, tmp_path / "n2"), store=store)):
        plane.wait_until(
            lambda: plane.committed_offset(store) == end, 30, "node 2 to commit the events after the takeover"
        )
    monkeypatch.undo()

    assert calls.catch_ups, "the node never restored the partition"
    stats, reads_before, segments_before, aggregates_before = calls.catch_ups[0]
    assert stats.full_restore and stats.deltas_applied == 2 and stats.source_offset == committed
    assert (reads_before, segments_before, aggregates_before) == (0, 0, 0), (
        "the restore read the source or ran an aggregate: "
        f"{reads_before} reads, {segments_before} segment loads, {aggregates_before} aggregates"
    )
    below = [o for o in calls.segments if o < committed]
    assert not below, f"source segments below the committed offset {committed} were read: {below}"
    assert calls.reads and min(calls.reads) == committed
    assert calls.aggregates >= 1
    assert plane.as_dict(committed_state(store, 0)[0]) == plane.reference_state(store)
    audit = audit_partition(store, plane.P0)
    assert audit.ok, audit.issues


def _leftover_rows(keys: Sequence[str]) -> pa.Table:
    n = len(keys)
    return pa.table(
        {
            "key": pa.array(list(keys), pa.string()),
            "count": pa.array([999] * n, pa.int64()),
            "sum": pa.array([-1.0] * n, pa.float64()),
            "min": pa.array([-1.0] * n, pa.float64()),
            "max": pa.array([-1.0] * n, pa.float64()),
            "last": pa.array([-1.0] * n, pa.float64()),
            "last_offset": pa.array([0] * n, pa.int64()),
        }
    )


LEFTOVERS = ["between-delta-boundaries", "ahead-of-the-commit", "other-partition", "garbage-files", "empty-dir"]


@pytest.mark.parametrize("leftover", LEFTOVERS)
def test_leftover_store_off_the_lineage_is_discarded(leftover: str, local_store: ObjectStore, tmp_path: Path) -> None:
    store = local_store
    lineage = plane.build_lineage(store)
    m = lineage.manifest
    root = tmp_path / "replica"
    poison = ["a1", "shared", "zombie-key"]
    if leftover in ("between-delta-boundaries", "ahead-of-the-commit"):
        offset = m.deltas[0].start_offset + 3 if leftover == "between-delta-boundaries" else m.source_offset + 5
        assert offset not in lineage.boundaries
        first = StateReplica(root, 0, plane.SCHEMA, ReadStore(store))
        first.catch_up(m)
        assert first.store is not None
        # A crashed writer's uncommitted batch: rows and marker at an offset the chain never committed.
        first.store.apply(_leftover_rows(poison), offset)
        first.close()
    elif leftover == "other-partition":
        # Its marker offset is on partition 0's lineage: only the partition tells it apart.
        with PartitionStateStore(root / "db-1-0", plane.SCHEMA, partition=1) as other:
            other.apply(_leftover_rows(poison), lineage.snapshot_end)
    elif leftover == "garbage-files":
        junk = root / "db-1-0"
        junk.mkdir(parents=True)
        (junk / "CURRENT").write_bytes(b"MANIFEST-000009\n")
        (junk / "MANIFEST-000009").write_bytes(os.urandom(512))
        (junk / "000007.sst").write_bytes(os.urandom(4096))
    else:
        (root / "db-1-0").mkdir(parents=True)

    replica = StateReplica(root, 0, plane.SCHEMA, ReadStore(store))
    stats = replica.catch_up(m)
    assert stats.full_restore, f"a leftover store ({leftover}) was reused"
    assert stats.deltas_applied == 2 and stats.source_offset == m.source_offset
    state = plane.replica_state(replica)
    assert "zombie-key" not in state
    assert state == plane.reference_state(store)
    replica.close()
    assert len([p for p in root.glob("db-*") if p.is_dir()]) == 1, "the discarded store directory is still there"


@pytest.mark.parametrize("at", ["snapshot", "first-delta"])
def test_leftover_store_on_the_lineage_is_reused(at: str, store: ObjectStore, tmp_path: Path) -> None:
    lineage = plane.build_lineage(store)
    offset = lineage.snapshot_end if at == "snapshot" else lineage.delta_ends[0]
    older = next(v for v in lineage.versions if v.source_offset == offset and v.snapshot is not None)
    root = tmp_path / "replica"
    first = StateReplica(root, 0, plane.SCHEMA, ReadStore(store))
    first.catch_up(older)
    assert first.source_offset == offset
    first.close()  # the process dies here; its directory stays

    replica = StateReplica(root, 0, plane.SCHEMA, ReadStore(store))
    stats = replica.catch_up(lineage.manifest)
    missing = [d for d in lineage.manifest.deltas if d.start_offset >= offset]
    assert not stats.full_restore
    assert stats.deltas_applied == len(missing) == (2 if at == "snapshot" else 1)
    assert stats.bytes_downloaded == sum(d.ref.size for d in missing), "more than the missing deltas was downloaded"
    assert replica.source_offset == lineage.manifest.source_offset
    assert plane.replica_state(replica) == plane.reference_state(store)
    replica.close()
