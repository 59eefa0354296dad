"""The committed batches a partition's manifest chain names (`batches`), and their rows in the table.

The follower walks a chain forward, in chain order, from its first entry or from a known one: each
batch with the source range its output was made from, ranges following each other; it passes over a
forged entry and a zombie's entry after its fence, whose output is never named. Entries this process
published and remembered are taken without reading them back, until forgotten. An output object is
read only if it matches its manifest entry (size and sha256) and is Parquet. A batch's rows lead
with its lineage columns, stamped with the manifest's epoch and generation over the output's own.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.keys import manifest_history_key
from laminar_orchestration.protocol.manifest import ArtifactRef
from laminar_orchestration.store import ForwardingStore, LocalObjectStore, ObjectStore, StoredObject
from laminar_orchestration.table.batches import (
    LINEAGE_COLUMNS,
    ChainFollower,
    CommittedBatch,
    OutputUnreadable,
    batch_rows,
    read_output,
)
from tests.table.cluster import Cluster

#: Partition 3, manifest seq 7, epoch 5, node 2, generation 4, source offsets [100, 140).
BATCH = CommittedBatch(3, 7, 5, 2, 4, 100, 140, datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC), ())


def _ranges_follow_each_other(batches: list[CommittedBatch], start: int, end: int) -> bool:
    """Whether the batches' source ranges tile [start, end) in order, none empty."""
    edges = [start]
    for batch in batches:
        if batch.start_offset != edges[-1] or batch.end_offset <= batch.start_offset:
            return False
        edges.append(batch.end_offset)
    return edges[-1] == end


def test_the_walk_names_every_committed_batch_in_chain_order_from_where_it_starts(
    local_store: LocalObjectStore,
) -> None:
    cluster = Cluster(local_store, partitions=1)
    cluster.produce(200)
    made = cluster.commit_batches(cluster.acquire(0, 1))
    follower = ChainFollower(local_store)
    walk = follower.walk(0, None)
    assert len(walk.batches) == made >= 3
    assert [b.seq for b in walk.batches] == sorted(b.seq for b in walk.batches)
    assert _ranges_follow_each_other(walk.batches, 0, cluster.committed_offset(0))
    assert {(b.partition, b.epoch, b.node) for b in walk.batches} == {(0, 1, 1)}
    assert all(len(b.outputs) == 1 for b in walk.batches)
    assert walk.newest is not None and walk.newest.manifest.seq == walk.batches[-1].seq

    second = follower.entry(0, walk.batches[1].seq)
    assert follower.walk(0, second).batches == walk.batches[2:]
    at_the_end = follower.walk(0, walk.newest)
    assert at_the_end.batches == [] and at_the_end.newest == walk.newest


def test_the_walk_passes_over_a_zombies_entry_after_its_fence_and_a_forged_one(local_store: LocalObjectStore) -> None:
    cluster = Cluster(local_store, partitions=1)
    cluster.produce(200)
    old = cluster.acquire(0, 1)
    cluster.commit_batches(old, max_batches=2)
    new = cluster.fence(0, 2)
    zombie_key = cluster.zombie_commit(old)  # genuinely signed, but after the seal: void
    seq = 1
    while local_store.head(manifest_history_key(0, seq)) is not None:
        seq += 1
    local_store.put_if_absent(manifest_history_key(0, seq), b"forged: signed by no grant")
    after = cluster.commit_batches(new)  # the new owner's publisher moves past both
    walk = ChainFollower(local_store).walk(0, None)
    assert [b.epoch for b in walk.batches] == [1, 1] + [2] * after and after > 0
    assert zombie_key not in {ref.key for b in walk.batches for ref in b.outputs}
    assert _ranges_follow_each_other(walk.batches, 0, cluster.committed_offset(0))
    assert walk.newest is not None and walk.newest.manifest.seq > seq


class _CountingGets(ForwardingStore):
    """The store, recording the key of every GET."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.gets: list[str] = []

    def get(self, key: str) -> StoredObject:
        self.gets.append(key)
        return self.inner.get(key)


def test_remembered_entries_are_not_read_back_until_forgotten(local_store: LocalObjectStore) -> None:
    cluster = Cluster(local_store, partitions=1)
    cluster.produce(160)
    counting = _CountingGets(local_store)
    follower = ChainFollower(counting)
    token = cluster.acquire(0, 1)
    made = cluster.commit_batches(token, remember=lambda version, _outputs: follower.remember(version))
    walk = follower.walk(0, None)
    assert len(walk.batches) == made >= 2
    remembered = {manifest_history_key(0, b.seq) for b in walk.batches}
    assert not remembered & set(counting.gets)

    follower.forget(0, walk.batches[-1].seq)
    counting.gets.clear()
    assert follower.walk(0, None).batches == walk.batches
    assert remembered <= set(counting.gets)


def _stored(store: LocalObjectStore, key: str, data: bytes) -> ArtifactRef:
    store.put_if_absent(key, data)
    return ArtifactRef(key=key, size=len(data), sha256=hashlib.sha256(data).hexdigest())


def _parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return bytes(sink.getvalue().to_pybytes())


def test_an_output_object_is_read_only_as_its_manifest_entry_names_it(local_store: LocalObjectStore) -> None:
    reads = ReadStore(local_store)
    table = pa.table({"key": ["a", "b"], "batch_count": [2, 3]})
    good = _stored(local_store, "sink/0/good.parquet", _parquet(table))
    assert read_output(reads, good).equals(table)

    with pytest.raises(OutputUnreadable, match="missing from the store"):
        read_output(reads, good.model_copy(update={"key": "sink/0/absent.parquet"}))
    other = _parquet(pa.table({"key": ["z"], "batch_count": [9]}))
    altered = _stored(local_store, "sink/0/altered.parquet", other)
    with pytest.raises(OutputUnreadable, match="size or sha256 differs"):
        read_output(reads, altered.model_copy(update={"sha256": good.sha256}))
    with pytest.raises(OutputUnreadable, match="not a readable Parquet file"):
        read_output(reads, _stored(local_store, "sink/0/text.parquet", b"plain text, not Parquet"))


def test_a_batchs_rows_lead_with_its_lineage_stamped_by_the_manifest() -> None:
    first = pa.table({"key": ["a", "b"], "batch_count": [2, 3], "epoch": [1, 1], "generation": [1, 1]})
    second = pa.table({"key": ["c"], "batch_count": [1], "epoch": [1], "generation": [1]})
    rows = batch_rows(BATCH, [first, second])
    assert rows is not None
    assert rows.column_names == [*LINEAGE_COLUMNS, "key", "batch_count"]
    lineage = rows.select(list(LINEAGE_COLUMNS)).to_pylist()
    stamp = {
        "partition": 3,
        "batch_seq": 7,
        "epoch": 5,
        "generation": 4,
        "start_offset": 100,
        "end_offset": 140,
        "committed_at": BATCH.committed_at,
    }
    assert lineage == [stamp] * 3
    assert rows["key"].to_pylist() == ["a", "b", "c"] and rows["batch_count"].to_pylist() == [2, 3, 1]


def test_a_batch_without_output_rows_has_no_table_rows() -> None:
    empty = pa.table({"key": pa.array([], pa.string()), "batch_count": pa.array([], pa.int64())})
    assert batch_rows(BATCH, []) is None
    assert batch_rows(BATCH, [empty, empty]) is None
