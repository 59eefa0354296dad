"""Maintenance of the output table (`maintenance`): compacting its small files, checkpointing its log
and vacuuming keep every batch once and each partition's transaction version, and the nodes' appends
go on after it from the same versions. Vacuum removes only table files no version names, never a
batch's own output, which a committed manifest names."""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable

from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.store import LocalObjectStore
from laminar_orchestration.table import (
    TableCommitter,
    app_id,
    audit_table,
    compact_and_checkpoint,
    table_location,
)
from tests.table.cluster import Cluster, table_counts


def test_compaction_checkpoint_and_vacuum_keep_every_batch_once(local_store: LocalObjectStore) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(200)
    tokens = [cluster.acquire(p, 1) for p in (0, 1)]
    committer = TableCommitter(local_store)
    for _ in range(4):  # several small commits: several small files
        for token in tokens:
            cluster.commit_batches(token, max_batches=1)
        committer.sync([0, 1])
    location = table_location(local_store)
    before = DeltaTable(location.uri)
    versions = {p: before.transaction_version(app_id(p)) for p in (0, 1)}
    report = compact_and_checkpoint(location, retention_hours=0)
    assert report.files_removed > report.files_added >= 1 and report.vacuumed == report.files_removed
    after = DeltaTable(location.uri)
    assert {p: after.transaction_version(app_id(p)) for p in (0, 1)} == versions
    assert list((Path(location.uri) / "_delta_log").glob("*.checkpoint.parquet"))
    data = after.to_pyarrow_table()
    for p in (0, 1):
        cluster.commit_batches(tokens[p])
    committer.sync([0, 1])  # appends go on after maintenance, from the same transaction versions
    data = DeltaTable(location.uri).to_pyarrow_table()
    for p in (0, 1):
        assert table_counts(data, p) == cluster.source_counts(p)
    assert audit_table(local_store).ok


def test_vacuum_removes_compacted_table_files_never_a_file_a_committed_manifest_names(
    local_store: LocalObjectStore,
) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(200)
    tokens = [cluster.acquire(p, 1) for p in (0, 1)]
    node = TableCommitter(local_store)  # a node's committer: its data files go to its own folder
    for _ in range(3):
        for token in tokens:
            cluster.commit_batches(token, max_batches=1, remember=node.remember)
        node.sync([0, 1])
    location = table_location(local_store)
    named = {
        ref.key
        for p in (0, 1)
        for v in ManifestReader(local_store).history(PartitionId(p))
        for ref in v.manifest.outputs
    }
    assert named and all(local_store.head(key) is not None for key in named)
    report = compact_and_checkpoint(location, retention_hours=0)
    assert report.vacuumed >= 1  # the compacted files, which no version names any more
    # The batches' own output (the manifests' files) is outside the table: vacuum never reaches it.
    assert all(local_store.head(key) is not None for key in named)
    table = DeltaTable(location.uri)
    assert all(Path(uri).exists() for uri in table.file_uris())  # every file the table names is there
    for p in (0, 1):
        assert table_counts(table.to_pyarrow_table(), p) == cluster.source_counts(p)
    assert audit_table(local_store).ok
