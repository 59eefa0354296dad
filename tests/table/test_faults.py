"""Faults around a table commit: store faults while reading the chains, a lost Delta commit response,
a concurrent commit between the data files and the log entry, a corrupted or deleted log, a batch of
another schema, a location holding another table. Each: a clear error or a retried commit, never a
duplicate; `rebuild_table` restores exactly-once content from the manifest chains."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_dev.faults import FaultInjectingStore
from laminar_orchestration.errors import ErrorKind
from laminar_orchestration.store import ObjectStore, StoreError
from laminar_orchestration.table import (
    TableCommitter,
    TableLogCorrupt,
    TableMismatch,
    TableSchemaMismatch,
    audit_table,
    rebuild_table,
    table_location,
)
from tests.table.cluster import Cluster, batch_keys, table_counts


def _committed(store: ObjectStore, partitions: int = 2, events: int = 160) -> Cluster:
    cluster = Cluster(store, partitions=partitions)
    cluster.produce(events)
    for p in range(partitions):
        cluster.tokens[p] = cluster.acquire(p, 1)
        cluster.commit_batches(cluster.tokens[p])
    return cluster


def _assert_exactly_once(cluster: Cluster) -> None:
    location = table_location(cluster.store)
    data = DeltaTable(location.uri, storage_options=location.options()).to_pyarrow_table()
    assert max(batch_keys(data).values()) == 1
    for p in range(cluster.partitions):
        assert table_counts(data, p) == cluster.source_counts(p)
    audit = audit_table(cluster.store)
    assert audit.ok, audit.summary_lines()


def test_store_faults_while_reading_the_chains_fail_the_sync_and_a_retry_lands_everything_once(
    store: ObjectStore,
) -> None:
    cluster = _committed(store)
    faulty = FaultInjectingStore(store)
    faulty.random_faults(0.2, seed=7, ops=frozenset({"get", "head"}))
    committer = TableCommitter(faulty)
    failures = 0
    for _ in range(60):
        try:
            committer.sync([0, 1])
            break
        except StoreError:
            failures += 1
    else:
        pytest.fail("sync never succeeded")
    assert failures > 0 and faulty.injected_failures > 0
    _assert_exactly_once(cluster)


def test_a_commit_whose_response_was_lost_is_found_and_not_repeated(
    local_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = _committed(local_store)
    real = TableCommitter._append
    calls: list[int] = []

    def lost(self: TableCommitter, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            raise OSError("connection reset after the log entry was written")

    monkeypatch.setattr(TableCommitter, "_append", lost)
    result = TableCommitter(local_store, retry_backoff_s=0).sync([0, 1])
    assert len(calls) == 1 and result.retries == 1  # the retry re-read the table: nothing left to append
    _assert_exactly_once(cluster)


def test_a_commit_beaten_between_its_data_files_and_its_log_entry_is_retried_without_a_duplicate(
    local_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = _committed(local_store)
    TableCommitter(local_store).sync([0])  # the table exists, partition 1 is behind
    cluster.produce(60)
    cluster.commit_batches(cluster.tokens[0])  # partition 0 has new batches too
    real = TableCommitter._append
    rival = TableCommitter(local_store)
    raced: list[int] = []

    def beaten(self: TableCommitter, *args: Any, **kwargs: Any) -> None:
        if self is not rival and not raced:
            raced.append(1)
            rival.sync([1])  # lands partition 1 while this commit writes its data files on the old version
        real(self, *args, **kwargs)

    monkeypatch.setattr(TableCommitter, "_append", beaten)
    result = TableCommitter(local_store, retry_backoff_s=0).sync([0, 1])
    assert raced and result.retries == 1 and result.commits == 1
    location = table_location(local_store)
    files = {p.name for p in Path(location.uri).glob("*.parquet")}
    referenced = {Path(f).name for f in DeltaTable(location.uri).file_uris()}
    assert referenced < files  # the lost attempt's data files are orphans no version names
    _assert_exactly_once(cluster)


def test_a_corrupted_log_is_a_clear_error_and_rebuild_restores_the_table(local_store: ObjectStore) -> None:
    cluster = _committed(local_store)
    TableCommitter(local_store).sync([0])
    TableCommitter(local_store).sync([1])
    location = table_location(local_store)
    newest = sorted((Path(location.uri) / "_delta_log").glob("*.json"))[-1]
    newest.write_bytes(b'{"add": {"path": truncated')
    with pytest.raises(TableLogCorrupt) as err:
        TableCommitter(local_store).sync([0, 1])
    assert err.value.error_kind is ErrorKind.CORRUPT_DATA and location.uri in str(err.value)
    with pytest.raises(TableLogCorrupt):
        audit_table(local_store)
    removed, result = rebuild_table(local_store)
    assert removed > 0 and result.batches > 0
    _assert_exactly_once(cluster)


def test_a_deleted_log_is_a_clear_error_and_rebuild_restores_the_table(store: ObjectStore) -> None:
    cluster = _committed(store)
    TableCommitter(store).sync([0, 1])
    location = table_location(store)
    if location.is_local:
        shutil.rmtree(Path(location.uri) / "_delta_log")
    else:
        from laminar_orchestration.table.committer import _bucket_prefix, _s3_client

        bucket, prefix = _bucket_prefix(location)
        client = _s3_client(location)
        for obj in client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/_delta_log/")["Contents"]:
            client.delete_object(Bucket=bucket, Key=obj["Key"])
    with pytest.raises(TableLogCorrupt, match="no readable _delta_log"):
        TableCommitter(store).sync([0, 1])
    rebuild_table(store)
    _assert_exactly_once(cluster)


def test_the_log_is_written_before_any_data_file_and_a_staged_commit_is_not_a_lost_log(
    local_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However slow the store, a racing committer never sees data files without a log: the table's
    log entry 0 is written first, and a commit still being staged is not taken for a lost log."""
    cluster = _committed(local_store)
    location = table_location(local_store)
    root = Path(location.uri)
    (root / "_delta_log").mkdir(parents=True)
    (root / "_delta_log" / "_commit_0f3e.json.tmp").write_text("{}")  # another writer, mid-commit
    seen: list[list[str]] = []
    real = TableCommitter._append

    def look_first(self: TableCommitter, *args: Any, **kwargs: Any) -> None:
        seen.append(sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()))
        real(self, *args, **kwargs)

    monkeypatch.setattr(TableCommitter, "_append", look_first)
    TableCommitter(local_store).sync([0, 1])
    assert seen and "_delta_log/00000000000000000000.json" in seen[0]
    assert not [f for f in seen[0] if not f.startswith("_delta_log/")]  # no data file before the log
    _assert_exactly_once(cluster)


def test_a_batch_of_another_schema_is_refused_and_nothing_is_written(
    local_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = _committed(local_store, partitions=1)
    TableCommitter(local_store).sync([0])
    location = table_location(local_store)
    version = DeltaTable(location.uri).version()
    cluster.produce(60)
    plain = Cluster.output

    def wider(events: pa.Table, epoch: int, generation: int = 1) -> pa.Table:
        out = plain(events, epoch, generation)
        return out.append_column("extra", pa.array(["x"] * out.num_rows))

    monkeypatch.setattr(Cluster, "output", staticmethod(wider))
    cluster.commit_batches(cluster.tokens[0], max_batches=1)
    with pytest.raises(TableSchemaMismatch) as err:
        TableCommitter(local_store).sync([0])
    assert err.value.partition == 0 and "extra" in err.value.actual and "extra" not in err.value.expected
    assert err.value.error_kind is ErrorKind.INVALID_INPUT
    assert DeltaTable(location.uri).version() == version


def test_a_location_holding_another_table_is_refused(local_store: ObjectStore) -> None:
    _committed(local_store, partitions=1)
    location = table_location(local_store)
    write_deltalake(location.uri, pa.table({"x": [1, 2]}), name="someone-else")
    with pytest.raises(TableMismatch, match="someone-else"):
        TableCommitter(local_store).sync([0])
    with pytest.raises(TableMismatch):
        rebuild_table(local_store)
    assert DeltaTable(location.uri).to_pyarrow_table().num_rows == 2  # left alone
    rebuild_table(local_store, force=True)
    assert audit_table(local_store).ok
