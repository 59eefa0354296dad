"""Checkpoint objects: a snapshot replaces exactly the deltas below its offset (`next_checkpoint`), and a
corrupt or missing checkpoint object is named and refused (`CheckpointCorrupt`): by a catch-up, by
`laminar query`, and by a node, which does not take over the partition and writes nothing.

Nodes run in-process (`laminar_dev.chaos.ArrowNode`: the real runtime, batches aggregated without Spark).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from laminar_dev.chaos import ArrowNode
from laminar_orchestration import cli
from laminar_orchestration.dataplane.checkpoint import next_checkpoint
from laminar_orchestration.dataplane.errors import CheckpointCorrupt
from laminar_orchestration.dataplane.restore import StateReplica
from laminar_orchestration.errors import CorruptDataError, exit_code
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.manifest import ArtifactRef, DeltaRef, SnapshotRef
from laminar_orchestration.store import ObjectStore, open_store
from laminar_orchestration.store.metering import RequestMeter
from tests.dataplane import plane


def _delta(start: int, end: int) -> DeltaRef:
    ref = ArtifactRef(key=f"checkpoints/00000/d-{start}-{end}", size=1, sha256="0" * 64)
    return DeltaRef(ref=ref, start_offset=start, end_offset=end, rows=1)


def test_a_snapshot_replaces_exactly_the_deltas_below_its_offset() -> None:
    deltas = [_delta(0, 10), _delta(10, 20), _delta(20, 30)]
    new = _delta(30, 40)
    snapshot = SnapshotRef(source_offset=20, files=[])
    assert next_checkpoint(snapshot, deltas, new) == (snapshot, [deltas[2], new])
    # No snapshot: every delta stays; no new delta (a snapshot's own manifest): nothing is added.
    assert next_checkpoint(None, deltas, new) == (None, [*deltas, new])
    assert next_checkpoint(snapshot, deltas) == (snapshot, [deltas[2]])
    # A snapshot at the newest commit covers every delta.
    assert next_checkpoint(SnapshotRef(source_offset=30, files=[]), deltas)[1] == []


@pytest.mark.parametrize("how", plane.CORRUPTIONS)
def test_corrupt_checkpoint_is_named_by_catch_up_and_query(
    how: str, store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(store_url)
    lineage = plane.build_lineage(store)
    key = plane.corrupt(store, lineage.manifest, how)

    replica = StateReplica(tmp_path / "replica", 0, plane.SCHEMA, ReadStore(store))
    with pytest.raises(CheckpointCorrupt) as info:
        replica.catch_up(lineage.manifest)
    replica.close()
    assert info.value.key == key and key in str(info.value)
    assert isinstance(info.value, CorruptDataError)

    capsys.readouterr()
    code = cli.main(["query", "--store", store_url, "--partition", "0"])
    out, err = capsys.readouterr()
    assert code == exit_code(CorruptDataError.error_kind) == 6
    lines = err.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], err
    assert out == ""


@pytest.mark.parametrize("how", plane.CORRUPTIONS)
def test_node_does_not_take_over_a_partition_with_a_corrupt_checkpoint(
    how: str, local_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = local_store
    lineage = plane.build_lineage(store)
    key = plane.corrupt(store, lineage.manifest, how)
    plane.fence_writer(store, lineage)
    before = plane.current_manifest(store)
    sink_before = sorted(store.list("sink/"))
    calls = plane.spy_data_plane(monkeypatch)
    plane.assign(store, 0, 3)
    with plane.running(ArrowNode(plane.node_config(store, 3, tmp_path / "n3"), store=store)) as node:

        def failed_visibly() -> bool:
            error = plane.reported_error(store, 3)
            return error is not None and key in error

        plane.wait_until(failed_visibly, 20, f"node 3 to report the corrupt object {key} in its progress")
        error = plane.reported_error(store, 3)
        assert node.guards.get(plane.P0) is None, "the node holds a guard for a partition it could not restore"
    monkeypatch.undo()

    assert error is not None and "CheckpointCorrupt" in error and key in error
    assert calls.aggregates == 0 and calls.reads == [], "a batch ran on a partition that was never restored"
    after = plane.current_manifest(store)
    assert (after.source_offset, after.snapshot, after.deltas) == (before.source_offset, before.snapshot, before.deltas)
    # Nothing of the node's own in the chain: at most the seal its grant put there, no takeover, no commit.
    for version in ManifestReader(store).history(plane.P0):
        mine = version.manifest
        if mine.seq <= before.seq:
            continue
        assert mine.is_seal and not mine.outputs, f"the node published seq {mine.seq} ({mine.note!r})"
    assert sorted(store.list("sink/")) == sink_before, "output was written"


def test_a_snapshot_after_the_first_sends_only_the_files_that_changed(
    store: ObjectStore, meter: RequestMeter, tmp_path: Path
) -> None:
    """Files this node uploaded are named again from memory when their name, size and checksum match:
    no HEAD, no PUT. RocksDB's checkpoint rewrites its MANIFEST; its table files, CURRENT, OPTIONS
    and empty log come out byte for byte the same, so only the MANIFEST goes again."""
    from laminar_orchestration.dataplane.checkpoint import CheckpointStore
    from laminar_orchestration.protocol.capabilities import CheckpointWriter
    from laminar_orchestration.protocol.fencing import PartitionGuard, _mint_token

    guard = PartitionGuard(_mint_token(PartitionId(0), 1, NodeId(1)))
    names = ("000004.log", "000007.sst", "000008.sst", "MANIFEST-000009", "CURRENT", "OPTIONS-000005")
    files = {name: tmp_path / name for name in names}
    for i, path in enumerate(files.values()):
        path.write_bytes(bytes([i]) * (100 + i) if not path.name.endswith(".log") else b"")
    checkpoints = CheckpointStore(CheckpointWriter(store))
    first = checkpoints.upload_snapshot(guard, files.values(), 10, {})
    files["MANIFEST-000009"].write_bytes(bytes([200]) * 103)  # rewritten: same name and size, other bytes
    before = meter.snapshot()
    second = checkpoints.upload_snapshot(guard, files.values(), 20, {f.name: f for f in first.files})
    after = meter.snapshot()
    sent = {m: n - before.by_method.get(m, 0) for m, n in after.by_method.items()}
    assert sent.get("HEAD", 0) == 0 and sent.get("GET", 0) == 0 and sent.get("PUT", 0) == 1
    refs = {f.name: f.ref for f in first.files}
    assert {f.name: f.ref for f in second.files if f.name != "MANIFEST-000009"} == {
        n: r for n, r in refs.items() if n != "MANIFEST-000009"
    }
    (changed,) = [f for f in second.files if f.name == "MANIFEST-000009"]
    assert changed.ref != refs["MANIFEST-000009"]
    assert changed.ref.sha256 == hashlib.sha256(files["MANIFEST-000009"].read_bytes()).hexdigest()
