"""The output table holds every committed batch exactly once: moves, zombies and racing committers.

Read back with `deltalake` alone; per partition and key the batches' event counts add up to exactly
the events committed, on the local store and on the S3-protocol server.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.store import ObjectStore
from laminar_orchestration.store.metering import RequestMeter
from laminar_orchestration.table import SyncResult, TableCommitter, app_id, audit_table, table_location, table_status
from tests.table.cluster import Cluster, batch_keys, table_counts


def _read(store: ObjectStore) -> DeltaTable:
    location = table_location(store)
    return DeltaTable(location.uri, storage_options=location.options())


def _assert_exactly_once(cluster: Cluster) -> None:
    data = _read(cluster.store).to_pyarrow_table()
    assert max(batch_keys(data).values(), default=1) == 1, "a row appears twice"
    for p in range(cluster.partitions):
        assert table_counts(data, p) == cluster.source_counts(p), f"partition {p}"
    audit = audit_table(cluster.store)
    assert audit.ok, audit.summary_lines()
    assert all(part.lag_batches == 0 for part in audit.partitions)


def test_a_graceful_move_lands_both_owners_batches_once(store: ObjectStore) -> None:
    cluster = Cluster(store)
    cluster.produce(200)
    a0, a1 = cluster.acquire(0, 1), cluster.acquire(1, 1)
    cluster.commit_batches(a0, max_batches=2)
    cluster.commit_batches(a1)
    committer = TableCommitter(store)
    first = committer.sync([0, 1])
    assert first.commits == 1 and first.batches > 2  # one Delta commit for both partitions
    status = table_status(store)
    assert [p.lag_batches for p in status.partitions] == [0, 0]

    cluster.commit_batches(a0)  # the rest of A's batches, then the hand-over
    cluster.release(a0)
    b0 = cluster.acquire(0, 2)
    cluster.produce(100)
    cluster.commit_batches(b0)
    cluster.commit_batches(a1)
    assert table_status(store).lag_batches > 0
    second = committer.sync([0, 1])
    assert second.commits == 1
    again = committer.sync([0, 1])
    assert (again.commits, again.batches) == (0, 0)
    table = _read(store)
    epochs = set(pc.unique(table.to_pyarrow_table(columns=["epoch"])["epoch"]).to_pylist())
    assert epochs == {1, 2}
    assert table.transaction_version(app_id(0)) == second.landed[0]
    _assert_exactly_once(cluster)


def test_a_zombies_batch_after_its_fence_never_reaches_the_table(store: ObjectStore) -> None:
    cluster = Cluster(store, partitions=1)
    cluster.produce(150)
    old = cluster.acquire(0, 1)
    cluster.commit_batches(old, max_batches=2)
    TableCommitter(store).sync([0])
    new = cluster.fence(0, 2)
    zombie_key = cluster.zombie_commit(old)  # a genuinely signed entry after the seal: void
    cluster.commit_batches(new)
    TableCommitter(store).sync([0])
    data = _read(store).to_pyarrow_table()
    after_fence = data.filter(pc.greater(data["start_offset"], 0))
    assert set(after_fence.filter(pc.equal(after_fence["epoch"], 1))["end_offset"].to_pylist()) <= {40, 80}
    assert zombie_key not in str(data.to_pydict())
    _assert_exactly_once(cluster)


def test_committers_racing_for_the_same_partitions_land_each_batch_once(store: ObjectStore) -> None:
    cluster = Cluster(store, partitions=2)
    cluster.produce(400)
    tokens = [cluster.acquire(0, 1), cluster.acquire(1, 1)]
    committers = [TableCommitter(store, retry_backoff_s=0.01, max_attempts=20) for _ in range(4)]
    errors: list[BaseException] = []
    results: list[SyncResult] = []
    stop = threading.Event()

    def race(committer: TableCommitter) -> None:
        try:
            while not stop.is_set():
                results.append(committer.sync([0, 1]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(c,)) for c in committers]
    for t in threads:
        t.start()
    try:
        for token in tokens:  # batches keep arriving while the committers race
            cluster.commit_batches(token, batch_events=25)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    TableCommitter(store).sync([0, 1])
    _assert_exactly_once(cluster)


def test_two_commits_of_the_same_batches_on_one_table_version_land_once(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both committers read the table at the same version and commit the same batches at the same
    moment: the Delta log refuses one; it re-reads the table and finds nothing left to append."""
    cluster = Cluster(store, partitions=2)
    cluster.produce(120)
    tokens = [cluster.acquire(p, 1) for p in (0, 1)]
    for token in tokens:
        cluster.commit_batches(token, max_batches=1)
    TableCommitter(store).sync([0, 1])  # the table exists (0: created, 1: appended): both commit on top of 1
    for token in tokens:
        cluster.commit_batches(token)
    barrier = threading.Barrier(2, timeout=30)
    real = TableCommitter._append

    def in_step(self: TableCommitter, *args: Any, **kwargs: Any) -> None:
        if barrier.n_waiting < 2 and not getattr(self, "_raced", False):
            self._raced = True  # type: ignore[attr-defined]
            barrier.wait()
        real(self, *args, **kwargs)

    monkeypatch.setattr(TableCommitter, "_append", in_step)
    results: list[SyncResult] = []
    committers = [TableCommitter(store, retry_backoff_s=0.01) for _ in range(2)]
    threads = [threading.Thread(target=lambda c=c: results.append(c.sync([0, 1]))) for c in committers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 2
    assert sorted(r.commits for r in results) == [0, 1]
    assert sorted(r.retries for r in results) == [0, 1]
    assert _read(store).version() == 2
    _assert_exactly_once(cluster)


def test_batches_their_node_remembers_are_not_read_back_and_a_forged_one_is(
    store: ObjectStore, meter: RequestMeter
) -> None:
    cluster = Cluster(store, partitions=1)
    cluster.produce(120)
    token = cluster.acquire(0, 1)
    committer = TableCommitter(store)
    made = cluster.commit_batches(token, remember=committer.remember)
    before = meter.snapshot()
    committer.sync([0])
    after = meter.snapshot()
    gets = {f: n - before.by_family.get((m, f), 0) for (m, f), n in after.by_family.items() if m == "GET"}
    assert made >= 3 and gets.get("sink", 0) == 0  # no output read back
    assert gets.get("manifests/history", 0) <= 2  # probes past the chain's end, none per batch
    assert table_counts(_read(store).to_pyarrow_table(), 0) == cluster.source_counts(0)

    # A remembered entry that its grant's key did not sign is not taken: the chain's own is read.
    cluster.produce(120)
    real: list[ManifestVersion] = []
    cluster.commit_batches(token, remember=lambda v, _outputs: real.append(v))
    assert len(real) >= 2  # the entry after the forged one names the genuine one as its parent
    forged = real[0].manifest.model_copy(update={"note": "not what was signed"})
    committer.remember(ManifestVersion(forged, forged.model_dump_json().encode()), {})
    committer.sync([0])
    _assert_exactly_once(cluster)
