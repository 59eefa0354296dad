"""When a node asks its output table to catch up: every committed batch makes its partition owed a
sync until a sync that started after it succeeds, even if the worker is gone by then."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from laminar_orchestration.dataplane.table_feed import TableFeed
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.manifest import ArtifactRef, PartitionManifest
from laminar_orchestration.protocol.records import now


@dataclass
class Outcome:
    blocked: dict[int, int] = field(default_factory=dict)


@dataclass
class RecordingTable:
    """Records the calls; `during_sync` runs inside a sync (a commit racing it), `fail` makes it raise,
    `blocked` is what a sync reports it stopped before (a batch it may not read)."""

    synced: list[list[int]] = field(default_factory=list)
    bounds: list[dict[int, int]] = field(default_factory=list)
    remembered: list[int] = field(default_factory=list)
    fail: bool = False
    during_sync: list[object] = field(default_factory=list)
    blocked: dict[int, int] = field(default_factory=dict)

    def sync(self, partitions: Iterable[int], through: Mapping[int, int] | None = None) -> Outcome:
        self.synced.append(list(partitions))
        self.bounds.append(dict(through or {}))
        for action in self.during_sync:
            action()  # type: ignore[operator]
        self.during_sync.clear()
        if self.fail:
            raise OSError("store unavailable")
        return Outcome(dict(self.blocked))

    def remember(self, version: ManifestVersion, outputs: Mapping[str, pa.Table]) -> None:
        self.remembered.append(version.manifest.seq)


def _version(partition: int, seq: int, *, output: bool = True) -> ManifestVersion:
    """A chain entry: a batch's (naming an output object), or a snapshot's (`output=False`)."""
    outputs = [ArtifactRef(key=f"sink/{partition}/out-{seq}.parquet", size=1, sha256="0" * 64)] if output else []
    m = PartitionManifest(
        partition=partition, seq=seq, fencing_token=1, node=1, generation=0, commit_ulid="01" + "0" * 24,
        parent_hash=None, cluster_epoch=0, source_offset=seq, outputs=outputs, events_applied=seq, note="",
        committed_at=now(),
    )  # fmt: skip
    return ManifestVersion(m, m.model_dump_json().encode())


@dataclass
class Worker:
    commits: int = 0
    finished: bool = False


def test_a_batch_committed_by_a_worker_that_ended_is_still_synced() -> None:
    table = RecordingTable()
    feed = TableFeed(table)
    feed.committed(_version(3, 7), {})  # the worker's last commit; it is gone before the next look
    feed.note({})
    assert feed.flush() and table.synced == [[3]] and table.remembered == [7]
    assert table.bounds == [{3: 7}]  # no worker of it left: only what this node committed
    assert feed.owed == set() and feed.flush() and table.synced == [[3]]  # nothing more to do


def test_a_commit_during_a_sync_keeps_its_partition_owed() -> None:
    table = RecordingTable()
    feed = TableFeed(table)
    feed.committed(_version(0, 1), {})
    table.during_sync.append(lambda: feed.committed(_version(0, 2), {}))
    assert feed.flush()
    assert feed.owed == {PartitionId(0)}  # seq 2 may have come after the sync's walk
    assert feed.flush() and table.synced == [[0], [0]] and feed.owed == set()


def test_a_failed_sync_is_retried_and_a_new_worker_is_owed_one() -> None:
    table = RecordingTable(fail=True)
    feed = TableFeed(table)
    first = Worker()  # kept alive: a new worker is told apart by identity, which a freed one could pass on
    feed.note({PartitionId(5): first})  # a takeover: the old owner's last batches may be missing
    assert not feed.flush() and feed.owed == {PartitionId(5)}
    table.fail = False
    assert feed.flush() and feed.owed == set()
    worker = Worker()
    feed.note({PartitionId(5): worker})  # another worker object: owed again
    assert feed.owed == {PartitionId(5)}


def test_a_snapshot_entry_is_handed_over_but_owes_no_sync() -> None:
    table = RecordingTable()
    feed = TableFeed(table)
    feed.committed(_version(2, 4), {})
    assert feed.flush() and table.synced == [[2]]
    feed.committed(_version(2, 5, output=False), {})  # the snapshot after the batch: nothing for the table
    assert table.remembered == [4, 5] and feed.owed == set()
    assert feed.flush() and table.synced == [[2]]  # no sync for it


def test_a_released_partition_is_synced_only_through_this_nodes_own_last_batch() -> None:
    """After a move, the node owes the table its own last batches and nothing past them: the new
    owner's batches are the new owner's to append (this node's keys may not read their output)."""
    table = RecordingTable()
    feed = TableFeed(table)
    worker = Worker()
    feed.note({PartitionId(0): worker, PartitionId(1): worker})
    feed.committed(_version(0, 4), {})
    feed.committed(_version(0, 5, output=False), {})  # the release's snapshot: no batch
    feed.committed(_version(1, 9), {})
    table.blocked = {1: 10}  # the sync stops partition 1 before a batch its keys may not read
    assert feed.flush()
    assert table.synced == [[0, 1]] and table.bounds == [{}]  # both owned: synced to the chain's end
    assert feed.owed == {PartitionId(1)}  # stopped before a batch: owed until a later sync gets past it
    feed.committed(_version(0, 6), {})
    table.blocked = {}
    feed.note({PartitionId(1): worker})  # partition 0 moved away after its batch 6
    assert feed.flush() and table.synced[-1] == [0, 1] and table.bounds[-1] == {0: 6}
    assert feed.owed == set()


def test_a_partition_taken_over_and_moved_away_before_committing_here_is_not_synced() -> None:
    table = RecordingTable()
    feed = TableFeed(table)
    feed.note({PartitionId(2): Worker()})  # taken over: owed (the old owner's last batches)
    feed.note({})  # gone again before a batch of its own
    assert feed.flush() and table.synced == [] and feed.owed == set()


def test_a_partition_whose_worker_lost_it_is_synced_only_through_its_own_batches_at_once() -> None:
    """A revoked or released worker stays listed until the node's next reconcile: it owns nothing."""
    table = RecordingTable()
    feed = TableFeed(table)
    worker = Worker(commits=1)
    feed.committed(_version(4, 3), {})
    feed.note({PartitionId(4): worker})
    worker.finished = True  # fenced: a successor owns the partition now
    feed.committed(_version(4, 5), {})  # its last batch before it noticed
    feed.note({PartitionId(4): worker})
    assert feed.flush() and table.bounds == [{4: 5}]
