"""The data plane, staged for its tests: input events, a partition committed as snapshot + deltas by a
test writer, the reference state to compare a node's with, damaged checkpoint objects, and nodes run
in-process (`laminar_dev.chaos.ArrowNode`: the real runtime, batches aggregated without Spark) with spies
on what they read and run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from laminar_dev.chaos import ArrowBatchEngine
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.dataplane.engine import BatchEvents
from laminar_orchestration.dataplane.node import Node
from laminar_orchestration.dataplane.restore import CatchUp, StateReplica
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.ops.verify import reference_fold
from laminar_orchestration.processing.keyed import keyed_aggregation
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.desired_states import DesiredState, DesiredStates
from laminar_orchestration.protocol.fencing import FencingToken
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import PartitionManifest
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore
from tests.commits import commit_all
from tests.spies import spy_source_reads

P0 = PartitionId(0)
#: The test writer that builds checkpoints through `commit_all` (never a running node).
WRITER = NodeId(9)
SCHEMA = keyed_aggregation.state_schema
STATE_COLUMNS = ("count", "sum", "min", "max", "last", "last_offset")
TS0 = 1_700_000_000_000


def events(keys: Sequence[str], values: Sequence[float] | None = None) -> pa.Table:
    """Input rows for `SourceLog.append`; integer-valued floats so sums are exact."""
    vals = values if values is not None else [float((i * 7) % 101) for i in range(len(keys))]
    return pa.table(
        {
            "key": pa.array(list(keys), pa.string()),
            "value": pa.array(list(vals), pa.float64()),
            "ts": pa.array(range(TS0, TS0 + len(keys)), pa.int64()),
        }
    )


def source_events(store: ObjectStore, partition: int = 0, below: int | None = None) -> pa.Table:
    """Every event of the partition's source log (with offsets), optionally only below `below`."""
    parts = [b.to_table() for b in SourceLog(store).iter_batches(partition, 0, 10_000_000)]
    table = pa.concat_tables(parts)
    if below is not None:
        table = table.filter(pc.less(table["offset"], below))
    return table


def as_dict(table: pa.Table, columns: Sequence[str] = STATE_COLUMNS) -> dict[str, tuple[object, ...]]:
    cols = [table[c].to_pylist() for c in columns]
    return {k: tuple(row) for k, *row in zip(table["key"].to_pylist(), *cols, strict=True)}


def reference_state(store: ObjectStore, partition: int = 0, below: int | None = None) -> dict[str, tuple[object, ...]]:
    """The reference fold (verify.reference_fold) of the partition's events."""
    return as_dict(reference_fold(source_events(store, partition, below)))


def current_manifest(store: ObjectStore, partition: int = 0) -> PartitionManifest:
    current = ManifestReader(store).current(PartitionId(partition))
    assert current is not None
    return current.manifest


def committed_offset(store: ObjectStore, partition: int = 0) -> int:
    current = ManifestReader(store).current(PartitionId(partition))
    return current.manifest.source_offset if current else 0


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


def assign(store: ObjectStore, partition: int, node: int) -> None:
    """What placement does: record `node` as the partition's desired owner and grant it the next epoch
    (the control plane grants; the node adopts). A node not yet joined will join as generation 1."""

    def change(d: DesiredState) -> DesiredState:
        return d.model_copy(update={"owner": node})

    ledger = Ledger(store)
    DesiredStates(ledger).update(PartitionId(partition), change)
    own = ledger.ownership(PartitionId(partition))
    assert own is not None
    record = ledger.members.node(NodeId(node))
    generation = record.generation if record is not None else 1
    ledger.acquire(
        PartitionId(partition), NodeId(node), expected_epoch=own.epoch, reason="place", generation=generation
    )


def reported_error(store: ObjectStore, node: int, partition: int = 0) -> str | None:
    """The partition's `PartitionProgress.error` in the node's last heartbeat (what the control plane sees)."""
    record = Ledger(store).members.node(NodeId(node))
    if record is None:
        return None
    progress = record.partitions.get(partition)
    return progress.error if progress else None


def node_config(store: ObjectStore, node: int, workdir: Path, **overrides: Any) -> NodeConfig:
    settings: dict[str, Any] = {
        "store_url": store.url,
        "node_id": node,
        "workdir": str(workdir),
        "heartbeat_interval_s": 0.1,
        "reconcile_interval_s": 0.02,
        "idle_poll_s": 0.02,
        "refresh_interval_s": 0.5,
        "restart_backoff_initial_s": 0.05,
        "restart_backoff_max_s": 0.2,
        # No snapshot unless a test asks for one: snapshots read the whole store.
        "checkpoint_every_batches": 1_000,
        "checkpoint_every_s": 3_600.0,
    }
    settings.update(overrides)
    return NodeConfig(**settings)


@contextlib.contextmanager
def running(node: Node) -> Iterator[Node]:
    """Run `node` in a thread of this process; stop and join it on exit."""
    thread = threading.Thread(target=node.run, kwargs={"install_signals": False}, name=f"node-{node.id}", daemon=True)
    thread.start()
    try:
        yield node
    finally:
        node.stop()
        thread.join(timeout=60)
        assert not thread.is_alive(), f"node {node.id} did not stop"


@dataclass
class Lineage:
    """A partition committed as snapshot + two deltas by a writer at epoch 1 (`WRITER`)."""

    token: FencingToken
    snapshot_end: int
    delta_ends: list[int]
    manifest: PartitionManifest
    #: Keys by where their newest committed values live.
    snapshot_only: str = "a5"
    older_delta_only: str = "b-only"
    newest_delta: str = "shared"
    versions: list[PartitionManifest] = field(default_factory=list)

    @property
    def boundaries(self) -> set[int]:
        return {self.snapshot_end, *self.delta_ends}


def build_lineage(store: ObjectStore, *, partitions: int = 1) -> Lineage:
    """Chunk A committed and snapshotted, then chunks B and C committed as deltas."""
    ledger = Ledger(store)
    ledger.init_cluster(partitions)
    source = SourceLog(store, partitions=partitions, segment_events=100)
    token = ledger.acquire(P0, WRITER, expected_epoch=0, reason="test writer")
    chunk_a = [f"a{i}" for i in range(40)] * 5 + ["shared"] * 3
    chunk_b = ["shared"] * 4 + ["b-only"] * 2 + ["a1"] * 2
    chunk_c = ["shared"] * 5 + ["c-only"]
    source.append(0, events(chunk_a))
    commit_all(store, token, snapshot_every=1)
    source.append(0, events(chunk_b, [float(v) for v in range(10, 18)]))
    commit_all(store, token, snapshot_every=None)
    source.append(0, events(chunk_c, [float(v) for v in range(50, 56)]))
    commit_all(store, token, snapshot_every=None)
    m = current_manifest(store)
    assert m.snapshot is not None and len(m.deltas) == 2, "setup: snapshot + two deltas"
    a_end = len(chunk_a)
    assert m.snapshot.source_offset == a_end
    assert [d.end_offset for d in m.deltas] == [a_end + len(chunk_b), a_end + len(chunk_b) + len(chunk_c)]
    versions = [v.manifest for v in ManifestReader(store).history(P0)]
    return Lineage(token, a_end, [d.end_offset for d in m.deltas], m, versions=versions)


def fence_writer(store: ObjectStore, lineage: Lineage) -> None:
    """The test writer is gone: fence it to "unassigned" (as a failover does), so a placed node may acquire it."""
    Ledger(store).fence(P0, UNASSIGNED, expected_epoch=lineage.token.epoch, reason="test writer gone")


def replica_state(replica: StateReplica) -> dict[str, tuple[object, ...]]:
    assert replica.store is not None
    return as_dict(replica.store.to_table())


def rewrite(store: ObjectStore, key: str, change: Callable[[bytes], bytes]) -> None:
    """Replace an object's bytes in place (what a bit flip or a truncating copy on the bucket does)."""
    obj = store.get(key)
    store.put_if_match(key, change(obj.data), obj.etag, obj.metadata)


def flip_byte(data: bytes) -> bytes:
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]


@dataclass
class Calls:
    """What spies saw, in order."""

    reads: list[int] = field(default_factory=list)  # SourceLog.read from_offset
    segments: list[int] = field(default_factory=list)  # SourceLog._load start offset (a segment GET)
    aggregates: int = 0
    catch_ups: list[tuple[CatchUp, int, int, int]] = field(default_factory=list)  # stats, reads, segments, aggs


def spy_data_plane(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Record source reads, segment loads, batch aggregates and restores (every node of this process)."""
    calls = Calls(reads=spy_source_reads(monkeypatch))
    load, aggregate, catch_up = SourceLog._load, ArrowBatchEngine.aggregate, StateReplica.catch_up

    def spy_load(self: SourceLog, partition: int, start: int) -> Any:
        calls.segments.append(start)
        return load(self, partition, start)

    def spy_aggregate(self: ArrowBatchEngine, events: BatchEvents, **kwargs: Any) -> pa.Table:
        calls.aggregates += 1
        return aggregate(self, events, **kwargs)

    def spy_catch_up(self: StateReplica, manifest: PartitionManifest | None) -> CatchUp:
        stats = catch_up(self, manifest)
        calls.catch_ups.append((stats, len(calls.reads), len(calls.segments), calls.aggregates))
        return stats

    monkeypatch.setattr(SourceLog, "_load", spy_load)
    monkeypatch.setattr(ArrowBatchEngine, "aggregate", spy_aggregate)
    monkeypatch.setattr(StateReplica, "catch_up", spy_catch_up)
    return calls


CORRUPTIONS = ["flipped-delta-byte", "truncated-snapshot-file", "missing-delta"]


def corrupt(store: ObjectStore, m: PartitionManifest, how: str) -> str:
    """Damage one object `m` names; returns its key."""
    if how == "flipped-delta-byte":
        key = m.deltas[-1].ref.key
        rewrite(store, key, flip_byte)
    elif how == "truncated-snapshot-file":
        assert m.snapshot is not None
        key = max(m.snapshot.files, key=lambda f: f.ref.size).ref.key
        rewrite(store, key, lambda data: data[: len(data) // 2])
    else:
        key = m.deltas[0].ref.key
        store.delete_if_match(key, store.get(key).etag)
    return key
