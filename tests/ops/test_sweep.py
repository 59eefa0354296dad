"""The anti-entropy sweep removes output no manifest names and none ever can, and nothing else."""

from __future__ import annotations

import io
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from laminar_orchestration import cli
from laminar_orchestration.cli.output import ConsoleOutput
from laminar_orchestration.clock import SYSTEM_CLOCK, use_clock
from laminar_orchestration.dataplane.checkpoint import CheckpointStore, OutputWriter
from laminar_orchestration.dataplane.restore import StateReplica, committed_state
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ops.errors import InvalidGracePeriod
from laminar_orchestration.ops.sweep import sweep
from laminar_orchestration.ops.verify import audit_store, reference_batch_aggregate
from laminar_orchestration.processing.contract import FoldContext
from laminar_orchestration.processing.keyed import keyed_aggregation
from laminar_orchestration.protocol.capabilities import CheckpointWriter, OutputCommitter, ReadStore
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.fencing import PartitionGuard
from laminar_orchestration.protocol.keys import (
    UnparseableObjectKey,
    checkpoint_partition_prefix,
    delta_key,
    manifest_prefix,
    output_object_key,
    parse_fenced_object_key,
    sink_partition_prefix,
    source_partition_prefix,
)
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore
from laminar_orchestration.ulid import next_ulid
from tests.commits import commit_all

TWO_DAYS_S = 2 * 24 * 3600.0


class _ClockBehind:
    """The system clock, `behind_s` seconds late (the owner's clock is skewed)."""

    def __init__(self, behind_s: float) -> None:
        self.behind = timedelta(seconds=behind_s)

    def now(self) -> datetime:
        return SYSTEM_CLOCK.now() - self.behind

    def random_bytes(self, n: int) -> bytes:
        return SYSTEM_CLOCK.random_bytes(n)

    def monotonic(self) -> float:
        return SYSTEM_CLOCK.monotonic()


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

    dry = sweep(store, grace_s=0, dry_run=True)
    assert sorted(dry.deleted) == sorted([late_output.key, late_ckpt.key])
    assert store.head(late_output.key) is not None

    report = sweep(store, grace_s=0)
    assert sorted(report.deleted) == sorted([late_output.key, late_ckpt.key])
    assert report.kept_unsealed == [in_flight.key]
    assert store.head(late_output.key) is None and store.head(late_ckpt.key) is None
    assert store.head(in_flight.key) is not None
    assert all(a.ok for a in audit_store(store))  # everything a manifest names is still there
    # Age never deletes an unpublished object of the current epoch: its owner may still publish it.
    assert sweep(store, grace_s=0).deleted == []
    assert store.head(in_flight.key) is not None


@pytest.mark.parametrize("clock_behind_s", [0.0, TWO_DAYS_S], ids=["writer-clock-ok", "writer-clock-2-days-behind"])
def test_sweep_never_deletes_what_a_stalled_owner_is_about_to_publish(
    store: ObjectStore, clock_behind_s: float
) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(1)
    source = SourceLog(store, segment_events=100)
    source.append(0, generate_events(100, 4, 3, 1)[0])
    token = ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    _, offset, last = commit_all(store, token, snapshot_every=None)
    assert last is not None
    source.append(0, generate_events(100, 4, 4, 1)[0])
    batch = next(source.iter_batches(token.partition, offset, 50_000))
    with tempfile.TemporaryDirectory() as tmp:
        replica = StateReplica(Path(tmp), 0, keyed_aggregation.state_schema, ReadStore(store))
        replica.catch_up(last.manifest)
        assert replica.store is not None
        aggregate = reference_batch_aggregate(batch.to_table())
        fold = keyed_aggregation.fold(
            aggregate, replica.store.get_many(aggregate["key"].to_pylist()), FoldContext.at(token.epoch, 1)
        )
        replica.apply(fold.delta, batch.end_offset)
        files, at, _ = replica.snapshot_files()
        # The owner's clock is behind: the ULIDs in its object names say they are old.
        with use_clock(_ClockBehind(clock_behind_s)):
            guard = PartitionGuard(token)
            out_ref = OutputWriter(OutputCommitter(store)).write(
                guard, fold.output, batch.start_offset, batch.end_offset
            )
            checkpoints = CheckpointStore(CheckpointWriter(store))
            delta = checkpoints.upload_delta(guard, fold.delta, batch.start_offset, batch.end_offset)
            snapshot = checkpoints.upload_snapshot(guard, files, at, {})
        replica.close()
    assert parse_fenced_object_key(out_ref.key).created_ms <= (time.time() - clock_behind_s + 1) * 1000
    unpublished = sorted([out_ref.key, delta.ref.key, *(f.ref.key for f in snapshot.files)])

    # The owner stalls between upload and publish; sweeps run with any grace period.
    for grace in (0.0, 60.0, 3600.0):
        report = sweep(store, grace_s=grace)
        assert report.deleted == []
        assert sorted(report.kept_unsealed) == unpublished

    ManifestPublisher(OutputCommitter(store), store).publish(
        token,
        ManifestUpdate(
            source_offset=batch.end_offset,
            snapshot=snapshot,
            outputs=(out_ref,),
            events_applied=batch.end_offset,
        ),
    )
    # Restore from the published manifest finds everything it names.
    current = ManifestReader(store).current(PartitionId(0))
    assert current is not None and current.manifest.snapshot == snapshot
    restored, committed = committed_state(store, PartitionId(0))
    assert committed == 200 and restored.num_rows == 4
    assert all(a.ok for a in audit_store(store))


def test_sweep_keeps_objects_whose_key_and_metadata_disagree(store: ObjectStore) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(1)
    old = ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    ref = OutputWriter(OutputCommitter(store)).write(PartitionGuard(old), pa.table({"key": ["x"]}), 0, 1)
    new = ledger.fence(PartitionId(0), NodeId(2), expected_epoch=1, reason="node 1 died")
    assert new is not None
    ManifestPublisher(OutputCommitter(store), store).publish(new, ManifestUpdate(source_offset=0))
    # Same bytes and metadata under a name claiming another epoch, and a name without an epoch.
    obj = store.get(ref.key)
    lying = ref.key.replace("/0000000001-", "/0000000000-")
    store.put_if_absent(lying, obj.data, obj.metadata)
    foreign = "sink/00000/not-ours.parquet"
    store.put_if_absent(foreign, b"x", {})
    report = sweep(store, grace_s=0)
    # The genuine superseded orphan goes, and so does the name no writer builds (an orphan by name).
    assert sorted(report.deleted) == sorted([ref.key, foreign])
    assert set(report.kept_unverified) == {lying} and set(report.unparseable) == {foreign}
    assert "disagrees with the key" in report.kept_unverified[lying]
    assert store.head(lying) is not None and store.head(foreign) is None


def test_sweep_deletes_unparseable_data_objects_by_age_and_nothing_else(store: ObjectStore) -> None:
    """Keys under ``checkpoints/`` and ``sink/`` that do not parse (what a node's keys could plant,
    e.g. a run from one partition segment into another node's prefix) are orphans: deleted once
    old enough by the store's clock and reported by key; the ledger, manifests, source and grant
    keys are never touched, and a current owner's unpublished upload is still kept."""
    ledger = Ledger(store)
    ledger.init_cluster(2)
    token = ledger.acquire(PartitionId(1), NodeId(1), expected_epoch=0)
    in_flight = OutputWriter(OutputCommitter(store)).write(PartitionGuard(token), pa.table({"key": ["y"]}), 0, 1)
    ulid = next_ulid()
    planted = [
        f"{checkpoint_partition_prefix(1)}n-00002/x/n-00001/y",
        f"{sink_partition_prefix(1)}n-00002/x/n-00001/y",
        f"{delta_key(1, 2, 3, ulid)}/{delta_key(1, 1, 3, ulid)}",
        f"{output_object_key(1, 1, 1, 0, 1, ulid)}/junk",
        "checkpoints/junk",
        "sink/00001/n-00001/not-an-epoch.parquet",
    ]
    others = ["ledger/junk/x", f"{manifest_prefix(1)}/junk", f"{source_partition_prefix(1)}/junk", "grant-keys/junk"]
    for key in (*planted, *others):
        store.put_if_absent(key, b"junk", {})

    young = sweep(store, grace_s=3600)
    assert young.deleted == [] and sorted(young.kept_in_grace) == sorted(planted)
    assert set(young.unparseable) == set(planted) and all(young.unparseable.values())
    assert young.kept_unsealed == [in_flight.key]
    # Two hours on, by the clock in effect, the same grace period has passed.
    with use_clock(_ClockBehind(-2 * 3600.0)):
        dry = sweep(store, grace_s=3600, dry_run=True)
    assert sorted(dry.deleted) == sorted(planted) and dry.kept_in_grace == []
    assert all(store.head(k) is not None for k in planted)

    # `laminar sweep --dry-run` names each of them.
    printed = io.StringIO()
    ConsoleOutput(printed).swept(dry, dry_run=True)
    text = printed.getvalue()
    assert f"{len(planted)} with a name that does not parse" in text
    assert all(f"would delete {k}: " in text for k in planted)

    report = sweep(store, grace_s=0)
    assert sorted(report.deleted) == sorted(planted) and set(report.unparseable) == set(planted)
    assert all(store.head(k) is None for k in planted)
    assert all(store.head(k) is not None for k in others)
    assert store.head(in_flight.key) is not None and report.kept_unsealed == [in_flight.key]
    assert sweep(store, grace_s=0).deleted == []


def test_parse_object_key_reads_partition_node_epoch_and_ulid() -> None:
    name = parse_fenced_object_key("checkpoints/00003/n-00004/0000000007-01J0000000000000000000000A.parquet")
    assert (name.partition, name.node, name.epoch) == (3, 4, 7)
    sink = parse_fenced_object_key(
        f"sink/00001/n-00002/0000000002-{0:020d}-{5:020d}-01J0000000000000000000000A.parquet"
    )
    assert (sink.partition, sink.node, sink.epoch, sink.created_ms) == (1, 2, 2, name.created_ms)
    for bad in (
        "sink/00001/n-00001/2-01J0000000000000000000000A.parquet",
        "checkpoints/00001/n-00001/0000000002-nothing.parquet",
        "checkpoints/00001/0000000002-01J0000000000000000000000A.parquet",
    ):
        with pytest.raises(UnparseableObjectKey):
            parse_fenced_object_key(bad)


@pytest.mark.parametrize("grace", [-1.0, -0.001, float("nan")])
def test_sweep_rejects_a_negative_grace_period(store: ObjectStore, grace: float) -> None:
    Ledger(store).init_cluster(1)
    with pytest.raises(InvalidGracePeriod):
        sweep(store, grace_s=grace)


def test_cli_sweep_rejects_a_negative_grace_period(store: ObjectStore, capsys: pytest.CaptureFixture[str]) -> None:
    Ledger(store).init_cluster(1)
    assert cli.main(["sweep", "--store", store.url, "--grace-s", "-5"]) == 2
    assert "grace period must be a number of seconds >= 0, got -5.0" in capsys.readouterr().err
