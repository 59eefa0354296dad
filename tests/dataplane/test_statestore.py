"""The local state store (`PartitionStateStore`): a failed local write (a full disk) loses nothing, the
store only ever holds committed state meanwhile and the partition resumes once writes succeed again;
one store is safe to use from several threads at once; `apply` moves expiry entries from the times
read since the last write, never from older reads; a store written with Snappy blocks still reads.

The node runs in-process (`laminar_dev.chaos.ArrowNode`: the real runtime, batches aggregated without Spark).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from laminar_dev.chaos import ArrowNode
from laminar_orchestration.dataplane.errors import LocalStateWriteFailed
from laminar_orchestration.dataplane.restore import committed_state
from laminar_orchestration.dataplane.statestore import PartitionStateStore
from laminar_orchestration.ops.verify import audit_partition, audit_store
from laminar_orchestration.processing.keyed import keyed_aggregation
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore
from tests.dataplane import plane


def test_local_write_failure_loses_nothing_and_resumes(
    local_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = local_store
    Ledger(store).init_cluster(1)
    source = SourceLog(store, partitions=1, segment_events=100)  # one segment per append
    disk_full = threading.Event()
    seen_locally: list[tuple[int, dict[str, tuple[object, ...]]]] = []
    apply = PartitionStateStore.apply

    node_dir = tmp_path / "n1"

    def failing_apply(
        self: PartitionStateStore, rows: pa.Table, source_offset: int, *, deleted: pa.Array | None = None
    ) -> None:
        # Only the node's disk is full (the test's own audits open stores elsewhere).
        if disk_full.is_set() and self.path.is_relative_to(node_dir):
            # What the store held when the write failed (read in the writer's thread: no second opener).
            seen_locally.append((self.source_offset, plane.as_dict(self.to_table())))
            raise LocalStateWriteFailed(str(self.path), "IO error: No space left on device")
        apply(self, rows, source_offset, deleted=deleted)

    monkeypatch.setattr(PartitionStateStore, "apply", failing_apply)
    source.append(0, plane.events([f"k{i % 13}" for i in range(100)]))
    plane.assign(store, 0, 1)
    with plane.running(ArrowNode(plane.node_config(store, 1, node_dir), store=store)):
        plane.wait_until(lambda: plane.committed_offset(store) == 100, 30, "the first events to be committed")
        disk_full.set()
        source.append(0, plane.events([f"k{i % 17}" for i in range(60)]))

        def reported() -> bool:
            error = plane.reported_error(store, 1)
            return error is not None and "No space left on device" in error

        plane.wait_until(reported, 20, "the local write failure in the node's progress report")
        time.sleep(0.5)  # restarts keep failing meanwhile

        # Nothing is committed beyond what the manifest names, and what it names is exactly-once.
        m = plane.current_manifest(store)
        assert m.source_offset in (100, 160)
        during = audit_partition(store, plane.P0)
        assert during.ok and during.orphan_outputs == 0, during.issues
        boundaries = {m.state_offset, *(d.end_offset for d in m.deltas)}
        assert seen_locally
        for offset, local in seen_locally:
            # The local store only ever holds committed state: a lineage point, never a half-applied batch.
            assert offset in boundaries and offset <= m.source_offset
            assert local == plane.reference_state(store, below=offset)

        disk_full.clear()
        source.append(0, plane.events([f"k{i % 5}" for i in range(40)]))
        plane.wait_until(lambda: plane.committed_offset(store) == 200, 30, "the partition to resume after the fault")
        plane.wait_until(lambda: plane.reported_error(store, 1) is None, 10, "the node to report the partition healthy")

    audits = audit_store(store)
    assert [(a.ok, a.losses, a.duplicates, a.committed_offset, a.events_in_source) for a in audits] == [
        (True, 0, 0, 200, 200)
    ], [a.issues for a in audits]
    assert plane.as_dict(committed_state(store, 0)[0]) == plane.reference_state(store)


def test_a_partition_store_is_safe_to_use_from_several_threads(tmp_path: Path) -> None:
    """The worker writes while the heartbeat reads the offset, a snapshot checkpoints and a query scans:
    none of them may fail (rocksdict itself refuses concurrent use of one database object)."""
    state = PartitionStateStore(tmp_path / "state", keyed_aggregation.state_schema, partition=0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def repeat(action: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                while not stop.is_set():
                    action()
            except BaseException as exc:
                errors.append(exc)

        return run

    def write() -> None:
        for offset in range(1, 150):
            rows = pa.table(
                {
                    "key": [f"k{i}" for i in range(200)],
                    **{f.name: pa.array([offset] * 200, f.type) for f in plane.SCHEMA},
                }
            )
            state.apply(rows, offset)

    readers = [
        threading.Thread(target=repeat(lambda: state.source_offset)),
        threading.Thread(target=repeat(lambda: state.get_many(["k1", "k2", "absent"]))),
        threading.Thread(target=repeat(lambda: sum(t.num_rows for t in state.scan(rows_per_batch=50)))),
    ]
    for t in readers:
        t.start()
    try:
        write()
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert errors == [], errors[:3]
    assert state.get("k7") is not None
    # A released partition's store is closed (and replaced) while the heartbeat still reports its offset.
    stop.clear()
    offset_reader = threading.Thread(target=repeat(lambda: state.source_offset))
    offset_reader.start()
    state.close()
    time.sleep(0.1)
    stop.set()
    offset_reader.join()
    assert errors == [], errors[:3]
    assert state.source_offset == 149


def test_the_expiry_index_follows_values_read_before_the_last_write(tmp_path: Path) -> None:
    """`apply` moves a key's expiry entry from the time the batch's read saw, unless a write came
    after that read: then from the stored time (a stale read would leave the old entry behind)."""
    schema = pa.schema([("n", pa.int64()), ("expires", pa.int64())])
    state = PartitionStateStore(tmp_path / "state", schema, partition=0, expiry_column="expires")

    def put(key: str, expires: int, offset: int) -> None:
        state.apply(pa.table({"key": [key], "n": [offset], "expires": [expires]}), offset)

    put("a", 10, 1)
    state.get_many(["a", "b"])  # sees a at 10, b absent
    put("a", 20, 2)
    put("b", 5, 3)
    put("a", 30, 4)  # no read since the writes: a's entry at 20 must go, not the one at 10
    assert state.due(100)["key"].to_pylist() == ["b", "a"]
    state.get_many(["a", "b"])
    state.apply(pa.table({"key": ["a"], "n": [5], "expires": [40]}), 5, deleted=pa.array(["b"]))
    due = state.due(100)
    assert due["key"].to_pylist() == ["a"] and due["expires"].to_pylist() == [40]
    state.close()


def test_a_store_written_with_compressed_blocks_still_opens_and_reads(tmp_path: Path) -> None:
    """Compression and mmap are per-file read settings: a store (or a restored snapshot) written
    with Snappy blocks, as earlier versions did, reads the same under the current options."""
    from rocksdict import BlockBasedOptions, DBCompressionType, Options, Rdict, WriteOptions

    schema = keyed_aggregation.state_schema
    state = PartitionStateStore(tmp_path / "state", schema, partition=0)
    rows = pa.table({"key": [f"k{i}" for i in range(2000)], **{f.name: pa.array(range(2000), f.type) for f in schema}})
    state.apply(rows, 1)
    records = state._db.get([b"k" + k.encode() for k in rows["key"].to_pylist()])
    marker = state._db.get(b"m:applied")
    assert records is not None
    state.destroy()
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(DBCompressionType.snappy())
    opts.set_block_based_table_factory(BlockBasedOptions())
    old = Rdict(str(tmp_path / "old"), opts)
    write = WriteOptions()
    write.disable_wal = True  # type: ignore[method-assign,assignment]
    old.set_write_options(write)
    for key, record in zip(rows["key"].to_pylist(), records, strict=True):
        old[b"k" + key.encode()] = record
    old[b"m:applied"] = marker
    old.flush()
    old.close()
    reopened = PartitionStateStore.open_existing(tmp_path / "old", schema, partition=0)
    assert reopened.source_offset == 1
    assert reopened.to_table().to_pylist() == sorted(rows.to_pylist(), key=lambda r: r["key"])
    # Point reads too: with no block cache, each one decompresses its block.
    keys = ["k1999", "missing", "k0", "k1000"]
    read = reopened.get_many(keys)
    assert read.to_pylist() == [
        {f.name: int(k[1:]) for f in schema} if k != "missing" else dict.fromkeys(schema.names) for k in keys
    ]
    reopened.close()


def test_a_store_keeps_no_block_cache_beside_its_mapped_files(tmp_path: Path) -> None:
    """Reads are served in place from the memory-mapped files: a partition's store holds no block
    cache of copies (RocksDB's default would take up to 32 MB per store)."""
    state = PartitionStateStore(tmp_path / "state", keyed_aggregation.state_schema, partition=0)
    assert state._db.property_value("rocksdb.block-cache-capacity") is None
    state.close()
