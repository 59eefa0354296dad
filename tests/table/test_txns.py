"""`LandedSeqs`: each partition's transaction version in the output table, kept current from the log.

A Delta log entry's transaction versions are read per partition. A committer asks delta-rs once per
partition, then follows its own commits without reading them back and reads only the log entries
another committer added (one GET each, no replay of the log), skipping what that committer landed.
It stays exact when the table is rebuilt under a running committer, and a committer whose log was
deleted stops instead of writing a lone entry.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from laminar_orchestration.store import ObjectStore
from laminar_orchestration.table import TableCommitter, TableLogCorrupt, rebuild_table, table_location
from laminar_orchestration.table.txns import log_entry_txns
from tests.table.cluster import Cluster, assert_exactly_once


@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of `DeltaTable.transaction_version` (each replays the log from its checkpoint), by app id."""
    calls: Counter[str] = Counter()
    real = DeltaTable.transaction_version

    def counted(self: DeltaTable, app_id: str) -> Any:
        calls[app_id] += 1
        return real(self, app_id)

    monkeypatch.setattr(DeltaTable, "transaction_version", counted)
    return calls


def test_a_sync_reads_the_entries_another_committer_added_and_skips_what_it_landed(
    local_store: ObjectStore, replays: Counter[str]
) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(600)
    token = cluster.acquire(0, 1)
    node = TableCommitter(local_store)
    cluster.commit_batches(token, max_batches=2, remember=node.remember)
    node.sync([0])  # creates the table
    for _ in range(3):
        cluster.commit_batches(token, max_batches=1, remember=node.remember)
        node.sync([0])
    assert replays["laminar/partition-0"] == 0  # it created the table, then followed its own commits
    read_before = node._landed.entries_read
    assert read_before == 0  # its own commits: nothing to read back

    # Another committer (`laminar table sync`) lands partition 0's next batches, then the node syncs.
    cluster.commit_batches(token, max_batches=2, remember=node.remember)
    rival = TableCommitter(local_store)
    landed = rival.sync([0, 1])
    assert landed.commits == 1 and landed.batches == 2
    cluster.commit_batches(token, max_batches=1, remember=node.remember)
    result = node.sync([0])
    assert (result.commits, result.batches) == (1, 1)  # only the batch the rival had not landed
    assert node._landed.entries_read == read_before + 1  # the rival's one log entry
    assert replays["laminar/partition-0"] == 1  # the rival's own first look, not the node's
    assert_exactly_once(cluster)


def test_a_table_rebuilt_under_a_running_committer_is_read_afresh(local_store: ObjectStore) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(800)
    tokens = [cluster.acquire(p, 1) for p in (0, 1)]
    node = TableCommitter(local_store)
    for _ in range(3):
        cluster.commit_batches(tokens[0], max_batches=1, remember=node.remember)
        node.sync([0])
    # The operator rebuilds the table; other partitions' commits then move its versions past the
    # node's: only the table's id tells the node its seqs are of another table.
    cluster.commit_batches(tokens[0], max_batches=2)
    rebuild_table(local_store)
    other = TableCommitter(local_store)
    for _ in range(4):
        cluster.commit_batches(tokens[1], max_batches=1)
        other.sync([1])
    cluster.commit_batches(tokens[0], max_batches=1, remember=node.remember)
    node.sync([0])
    cluster.commit_batches(tokens[1])
    other.sync([1])
    assert_exactly_once(cluster)


def test_a_log_entrys_transaction_versions_are_read_per_partition() -> None:
    raw = (
        b'{"commitInfo":{"timestamp":1,"operation":"WRITE"}}\n'
        b'{"add":{"path":"part-0.parquet","size":1,"partitionValues":{},"modificationTime":1,"dataChange":true}}\n'
        b'{"txn":{"appId":"laminar/partition-3","version":17}}\n'
        b'{"txn":{"appId":"laminar/partition-12","version":4,"lastUpdated":5}}\n'
        b'{"txn":{"appId":"someone-else","version":99}}\n'
    )
    assert log_entry_txns(raw) == {3: 17, 12: 4}


def test_a_running_committer_whose_log_is_deleted_stops_instead_of_writing_a_lone_entry(
    local_store: ObjectStore,
) -> None:
    cluster = Cluster(local_store, partitions=1)
    cluster.produce(300)
    token = cluster.acquire(0, 1)
    node = TableCommitter(local_store)
    for _ in range(3):
        cluster.commit_batches(token, max_batches=1, remember=node.remember)
        node.sync([0])
    log_dir = Path(table_location(local_store).uri) / "_delta_log"
    shutil.rmtree(log_dir)
    cluster.commit_batches(token, max_batches=1, remember=node.remember)
    with pytest.raises(TableLogCorrupt):
        node.sync([0])  # its handle would have committed version 3 into an empty log
    assert not log_dir.exists()
    rebuild_table(local_store)
    node.sync([0])
    assert_exactly_once(cluster)
