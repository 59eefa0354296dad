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
class RecordingTable:
    """Records the calls; `during_sync` runs inside a sync (a commit racing it), `fail` makes it raise."""

    synced: list[list[int]] = field(default_factory=list)
    remembered: list[int] = field(default_factory=list)
    fail: bool = False
    during_sync: list[object] = field(default_factory=list)

    def sync(self, partitions: Iterable[int]) -> object:
        self.synced.append(list(partitions))
        for action in self.during_sync:
            action()  # type: ignore[operator]
        self.during_sync.clear()
        if self.fail:
            raise OSError("store unavailable")
        return None

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


def test_a_batch_committed_by_a_worker_that_ended_is_still_synced() -> None:
    table = RecordingTable()
    feed = TableFeed(table)
    feed.committed(_version(3, 7), {})  # the worker's last commit; it is gone before the next look
    feed.note({})
    assert feed.flush() and table.synced == [[3]] and table.remembered == [7]
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
