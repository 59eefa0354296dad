"""`TableLog`: the output table's version and each partition's transaction version, kept current from
the log without listing it or replaying it.

A committer reads the log once (from the checkpoint `_last_checkpoint` names, then the entries after
it), follows its own commits without reading them back, and reads only the log entries another
committer added (one GET each), skipping what that committer landed; delta-rs's per-partition replay
(`DeltaTable.transaction_version`) is never asked. Every `delta.checkpointInterval` versions the
committer of that version writes a checkpoint. The commits are plain Delta: `deltalake` reads their
rows, transaction versions and history. It stays exact when the table is rebuilt under a running
committer, and a committer whose log was deleted stops instead of writing a lone entry.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from laminar_orchestration.store import ObjectStore
from laminar_orchestration.table import TableCommitter, TableLogCorrupt, app_id, rebuild_table, table_location
from laminar_orchestration.table import delta_commit as delta_commit_module
from laminar_orchestration.table.location import remove_table
from laminar_orchestration.table.objects import TableObjects
from laminar_orchestration.table.txns import log_entry_txns
from tests.table.cluster import Cluster, assert_exactly_once, table_counts


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


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the table's objects every committer GETs, in order."""
    names: list[str] = []
    real = TableObjects.get

    def recorded(self: TableObjects, name: str) -> bytes | None:
        names.append(name)
        return real(self, name)

    monkeypatch.setattr(TableObjects, "get", recorded)
    return names


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
    assert node.log.entries_read == 0  # its own commits: nothing to read back

    # Another committer (`laminar table sync`) lands partition 0's next batches, then the node syncs.
    cluster.commit_batches(token, max_batches=2, remember=node.remember)
    rival = TableCommitter(local_store)
    landed = rival.sync([0, 1])
    assert landed.commits == 1 and landed.batches == 2
    cluster.commit_batches(token, max_batches=1, remember=node.remember)
    result = node.sync([0])
    assert (result.commits, result.batches) == (1, 1)  # only the batch the rival had not landed
    assert node.log.entries_read == 1  # the rival's one log entry
    assert sum(replays.values()) == 0  # no committer asked delta-rs to replay the log
    assert_exactly_once(cluster)


def test_a_checkpoint_every_interval_and_a_new_committer_starts_from_it(
    local_store: ObjectStore, monkeypatch: pytest.MonkeyPatch, reads: list[str]
) -> None:
    monkeypatch.setattr(delta_commit_module, "CHECKPOINT_INTERVAL", 3)
    cluster = Cluster(local_store, partitions=1)
    cluster.produce(800)
    token = cluster.acquire(0, 1)
    node = TableCommitter(local_store)
    for _ in range(7):  # versions 0 (created) to 7
        cluster.commit_batches(token, max_batches=1, remember=node.remember)
        node.sync([0])
    log_dir = Path(table_location(local_store).uri) / "_delta_log"
    assert sorted(p.name for p in log_dir.glob("*.checkpoint.parquet")) == [
        f"{v:020d}.checkpoint.parquet" for v in (3, 6)
    ]
    assert json.loads((log_dir / "_last_checkpoint").read_text())["version"] == 6

    # A restarted node reads the checkpoint and the one entry after it: no listing, no older entry.
    cluster.commit_batches(token, max_batches=1)
    reads.clear()
    restarted = TableCommitter(local_store)
    result = restarted.sync([0])
    assert result.commits == 1 and result.version == 8
    entries = [n for n in reads if n.endswith(".json")]
    assert entries == [f"_delta_log/{v:020d}.json" for v in (7, 8)], reads  # 8: absent, the next version
    assert "_delta_log/00000000000000000000.json" not in reads
    assert_exactly_once(cluster)


def test_the_commits_are_plain_delta_with_their_transactions_in_the_history(local_store: ObjectStore) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(300)
    tokens = [cluster.acquire(p, 1) for p in (0, 1)]
    node = TableCommitter(local_store)
    for _ in range(2):
        for token in tokens:
            cluster.commit_batches(token, max_batches=1, remember=node.remember)
        node.sync([0, 1])
    table = DeltaTable(table_location(local_store).uri)
    history = [c for c in table.history() if c.get("operation") == "WRITE"]
    assert len(history) == 2
    for commit in history:
        txns = json.loads(commit["laminar.transactions"])
        batches = json.loads(commit["laminar.batches"])
        assert txns == {app_id(int(p)): max(seqs) for p, seqs in batches.items()}
    newest = json.loads(history[0]["laminar.transactions"])
    assert {app_id(p): table.transaction_version(app_id(p)) for p in (0, 1)} == newest
    # A node's data files sit under its own folder, where its storage policy lets it write.
    assert all(Path(uri).parent.name == "n-00001" for uri in table.file_uris())
    rows = table.to_pandas()
    for p in (0, 1):
        assert table_counts(table.to_pyarrow_table(), p) == cluster.source_counts(p)
        assert (rows["partition"] == p).any()
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
    # node's: only log entry 0 tells the node its seqs are of another table.
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
        node.sync([0])  # it would have committed version 3 into an empty log
    assert not log_dir.exists()
    rebuild_table(local_store)
    node.sync([0])
    assert_exactly_once(cluster)


def _in_turn(cluster: Cluster, nodes: list[TableCommitter], turns: int, order: tuple[int, ...] = (0, 1)) -> None:
    """Each node commits a batch of its partition (its index) and syncs it, in turn (`order`)."""
    for _ in range(turns):
        for p in order:
            cluster.commit_batches(cluster.tokens[p], max_batches=1, remember=nodes[p].remember)
            nodes[p].sync([p])


def test_a_remembered_view_whose_guessed_next_name_is_taken_reads_on_and_lands_each_batch_once(
    local_store: ObjectStore,
) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(800)
    cluster.tokens = {p: cluster.acquire(p, p + 1) for p in (0, 1)}
    nodes = [TableCommitter(local_store, node=p + 1) for p in (0, 1)]
    _in_turn(cluster, nodes, 3)
    assert nodes[0].log.expected == 1  # the other node's pace: one entry between two of its commits
    # `laminar table sync` lands three commits meanwhile, node 1's partition among them.
    rival = TableCommitter(local_store)
    for _ in range(3):
        cluster.commit_batches(cluster.tokens[0], max_batches=1, remember=nodes[0].remember)
        cluster.commit_batches(cluster.tokens[1], max_batches=1)
        rival.sync([0, 1])
    cluster.commit_batches(cluster.tokens[0], max_batches=1, remember=nodes[0].remember)
    before = nodes[0].log.state.version if nodes[0].log.state else -1
    result = nodes[0].sync([0])
    # Its guess (one entry) named a taken version: it read on to the end and appended the new batch only.
    assert (result.commits, result.batches, result.retries) == (1, 1, 0), result
    assert result.version == before + 4 + 1
    assert nodes[0].log.expected == 4  # the rival's three entries and the other node's one
    _in_turn(cluster, nodes, 1)
    assert_exactly_once(cluster)


def test_a_remembered_view_of_a_table_removed_and_created_again_is_read_afresh(local_store: ObjectStore) -> None:
    """Another writer replaces the table and its log passes the node's version: the entries the node
    then reads name another table id, so they vouch for nothing; log entry 0 tells it to read afresh."""
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(800)
    cluster.tokens = {p: cluster.acquire(p, p + 1) for p in (0, 1)}
    nodes = [TableCommitter(local_store, node=p + 1) for p in (0, 1)]
    _in_turn(cluster, nodes, 3)
    stale = nodes[0].log.state
    assert stale is not None and nodes[0].log.expected == 1
    remove_table(table_location(local_store))
    # A new table holding partition 1 only, its log past node 1's version.
    other = TableCommitter(local_store, node=2)
    while (other.log.state.version if other.log.state else -1) <= stale.version + 1:
        cluster.commit_batches(cluster.tokens[1], max_batches=1)
        other.sync([1])
    cluster.commit_batches(cluster.tokens[0], max_batches=1, remember=nodes[0].remember)
    nodes[0].sync([0])  # every batch of partition 0, the ones of the removed table too
    _in_turn(cluster, nodes, 1)
    assert_exactly_once(cluster)


def test_a_table_rebuilt_under_nodes_syncing_in_turn_is_read_afresh(local_store: ObjectStore) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(800)
    cluster.tokens = {p: cluster.acquire(p, p + 1) for p in (0, 1)}
    nodes = [TableCommitter(local_store, node=p + 1) for p in (0, 1)]
    _in_turn(cluster, nodes, 3)
    cluster.commit_batches(cluster.tokens[0], max_batches=1, remember=nodes[0].remember)
    rebuild_table(local_store)
    # Node 2 first: its commit on the rebuilt table is the entry node 1 then reads.
    _in_turn(cluster, nodes, 2, order=(1, 0))
    assert_exactly_once(cluster)
    rebuilt = str(DeltaTable(table_location(local_store).uri).metadata().id)
    assert [n.log.state.table_id if n.log.state else None for n in nodes] == [rebuilt, rebuilt]
