"""`rebuild_table` against a live sync: a commit in flight across the rebuild lands where no reader looks.

A node's committer is paused at the racy point (its view of the table read, its log entry not yet
written) while the rebuild runs; it then writes its commit, as a slow node does. The table must stay
readable, hold every committed batch once, and the paused committer's next sync must start over from
the rebuilt table, appending nothing twice. On the local store and the S3 protocol.
"""

from __future__ import annotations

import threading

import pytest

from laminar_orchestration.store import ObjectStore
from laminar_orchestration.table import TableCommitter, rebuild_table
from laminar_orchestration.table.objects import TableObjects
from tests.table.cluster import Cluster, assert_exactly_once, committed


class _PausedCommitter:
    """A committer whose first log entry write waits until released (its data file already written)."""

    def __init__(self, committer: TableCommitter) -> None:
        self.committer = committer
        self.paused = threading.Event()
        self.release = threading.Event()
        self.wrote: list[tuple[str, bool]] = []
        #: Set by the test once the committer has its view of the table: only then is it paused.
        self.armed = False
        objects: TableObjects = committer.objects
        create = objects.create

        def paused_create(name: str, data: bytes) -> bool:
            if self.armed and name.startswith("_delta_log/") and not self.paused.is_set():
                self.paused.set()
                assert self.release.wait(30), "never released"
            landed = create(name, data)
            self.wrote.append((name, landed))
            return landed

        objects.create = paused_create  # type: ignore[method-assign]


def _more_batches(cluster: Cluster) -> None:
    cluster.produce(80)
    for p in range(cluster.partitions):
        assert cluster.commit_batches(cluster.tokens[p]) > 0


@pytest.mark.slow(seconds=20)
def test_a_commit_in_flight_across_a_rebuild_is_never_read_and_the_committer_starts_over(store: ObjectStore) -> None:
    cluster = committed(store)
    TableCommitter(store).sync([0, 1])
    live = _PausedCommitter(TableCommitter(store))
    live.committer.sync([0, 1])  # its view of the table, as a running node has it
    _more_batches(cluster)
    live.armed = True
    errors: list[BaseException] = []

    def run() -> None:
        try:
            live.committer.sync([0, 1])
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert live.paused.wait(30), "the live sync never reached its commit"
    rebuild_table(store)
    live.release.set()
    thread.join(30)
    assert not thread.is_alive() and not errors, errors
    assert live.wrote, "the paused commit was never written"
    assert_exactly_once(cluster)  # the stale commit is not part of the rebuilt table

    _more_batches(cluster)
    live.committer.sync([0, 1])  # the paused committer goes on from the rebuilt table
    assert_exactly_once(cluster)
    TableCommitter(store).sync([0, 1])
    assert_exactly_once(cluster)


@pytest.mark.slow(seconds=15)
def test_a_rebuild_under_a_sync_that_lands_in_the_emptied_place_leaves_a_readable_table(store: ObjectStore) -> None:
    """The stale commit lands while the rebuild is under way (after the old table's objects are
    read), not after it: the rebuild still ends with a readable table holding every batch once."""
    cluster = committed(store)
    live = _PausedCommitter(TableCommitter(store))
    live.committer.sync([0])
    _more_batches(cluster)
    live.armed = True
    thread = threading.Thread(target=live.committer.sync, args=([0, 1],), daemon=True)
    thread.start()
    assert live.paused.wait(30)
    rebuilt = TableCommitter.sync

    def sync_then_release(self: TableCommitter, partitions: list[int]) -> object:
        result = rebuilt(self, partitions)
        live.release.set()  # the stale commit lands while the rebuild goes on
        thread.join(30)
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TableCommitter, "sync", sync_then_release)
        rebuild_table(store)
    assert not thread.is_alive() and live.wrote
    assert_exactly_once(cluster)
    live.committer.sync([0, 1])
    assert_exactly_once(cluster)


@pytest.mark.slow(seconds=30)
def test_rebuilds_under_nodes_syncing_in_a_loop_keep_every_batch_once(store: ObjectStore) -> None:
    """No pause this time: two nodes' committers sync back to back while batches keep committing
    and the table is rebuilt twice; every sync that fails is retried as a node's next interval would."""
    cluster = committed(store)
    TableCommitter(store).sync([0, 1])
    stop = threading.Event()
    failures: list[BaseException] = []
    synced = [0, 0]

    def node(index: int) -> None:
        committer = TableCommitter(store, node=index + 1)
        while not stop.is_set():
            try:
                committer.sync([0, 1])
                synced[index] += 1
            except Exception as exc:  # a node logs it and syncs again at its next interval
                failures.append(exc)

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in (0, 1)]
    for t in threads:
        t.start()
    for _ in range(2):
        _more_batches(cluster)
        rebuild_table(store)
    _more_batches(cluster)
    stop.set()
    for t in threads:
        t.join(60)
    assert all(n > 0 for n in synced) and not failures, failures[:3]
    TableCommitter(store).sync([0, 1])
    assert_exactly_once(cluster)
