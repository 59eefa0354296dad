"""The anti-entropy sweep removes output no manifest names and none ever can, and nothing else."""

from __future__ import annotations

import pyarrow as pa

from laminar_orchestration.antientropy import sweep
from laminar_orchestration.capabilities import CheckpointWriter, OutputCommitter
from laminar_orchestration.checkpoint import CheckpointStore, OutputWriter
from laminar_orchestration.fencing import PartitionGuard
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ledger import Ledger
from laminar_orchestration.manifest import ManifestPublisher, ManifestUpdate
from laminar_orchestration.source import SourceLog, generate_events
from laminar_orchestration.store import ObjectStore
from laminar_orchestration.verify import audit_store

from .commits import commit_all


def test_sweep_deletes_only_unreachable_objects(store: ObjectStore) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(1)
    SourceLog(store, segment_events=100).append(0, generate_events(200, 4, 3, 1)[0])
    old = ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    state, _, _ = commit_all(store, old)
    # The old owner is fenced out; its late output and checkpoint are orphans forever.
    zombie = PartitionGuard(old)
    late_output = OutputWriter(OutputCommitter(store)).write(zombie, pa.table({"key": ["x"]}), 200, 300)
    late_ckpt = CheckpointStore(CheckpointWriter(store)).upload_delta(zombie, state, 200, 300).ref
    new = ledger.fence(PartitionId(0), NodeId(2), expected_epoch=1, reason="node 1 died")
    assert new is not None
    publisher = ManifestPublisher(OutputCommitter(store), store)
    committed = publisher.current(PartitionId(0))
    assert committed is not None
    publisher.publish(new, ManifestUpdate(source_offset=200, snapshot=committed.manifest.snapshot, note="takeover"))
    # The current owner's upload in flight (not yet in a manifest) must survive.
    in_flight = OutputWriter(OutputCommitter(store)).write(PartitionGuard(new), pa.table({"key": ["y"]}), 200, 250)

    dry = sweep(store, grace_s=3600, dry_run=True)
    assert sorted(dry.deleted) == sorted([late_output.key, late_ckpt.key])
    assert store.head(late_output.key) is not None

    report = sweep(store, grace_s=3600)
    assert sorted(report.deleted) == sorted([late_output.key, late_ckpt.key])
    assert report.kept_in_grace == [in_flight.key]
    assert store.head(late_output.key) is None and store.head(late_ckpt.key) is None
    assert store.head(in_flight.key) is not None
    assert all(a.ok for a in audit_store(store))  # everything a manifest names is still there
    # Past the grace period an unpublished object of the current epoch goes too.
    assert sweep(store, grace_s=-1).deleted == [in_flight.key]
