"""The `TableCommitter` appends every committed batch to the output table exactly once.

After the fence: only entries on the manifest chain reach the table, so a zombie's batch after its
fence never does. At most once: each commit carries each partition's transaction version, so a
graceful move, committers racing for the same partitions, two commits on one table version, a commit
whose response was lost and one beaten between its data files and its log entry each land every
batch once. The batches a node remembers are not read back, and a steady sync of them reads no
manifest and commits in three requests (nodes syncing in turn: a GET of each other node's entry, no
HEAD, no probe, no listing). Faults around a commit (store faults while reading the chains, a corrupted or
deleted log, a batch of another schema, a location holding another table) are a clear error or a
retried commit, never a duplicate; `rebuild_table` restores exactly-once content from the manifest
chains. Read back with `deltalake` alone, on the local store and on the S3-protocol server.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_dev.faults import FaultInjectingStore
from laminar_orchestration.errors import ErrorKind
from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.store import ObjectStore, StoreError
from laminar_orchestration.store.metering import RequestCounts, RequestMeter
from laminar_orchestration.table import (
    SyncResult,
    TableCommitter,
    TableLogCorrupt,
    TableMismatch,
    TableSchemaMismatch,
    app_id,
    audit_table,
    rebuild_table,
    table_location,
    table_status,
)
from laminar_orchestration.table import location as location_module
from tests.table.cluster import Cluster, assert_exactly_once, committed, output_table, table_counts

# --- exactly once: moves, zombies, racing committers -------------------------------------------


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
    table = output_table(store)
    epochs = set(pc.unique(table.to_pyarrow_table(columns=["epoch"])["epoch"]).to_pylist())
    assert epochs == {1, 2}
    assert table.transaction_version(app_id(0)) == second.landed[0]
    assert_exactly_once(cluster)


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
    data = output_table(store).to_pyarrow_table()
    after_fence = data.filter(pc.greater(data["start_offset"], 0))
    assert set(after_fence.filter(pc.equal(after_fence["epoch"], 1))["end_offset"].to_pylist()) <= {40, 80}
    assert zombie_key not in str(data.to_pydict())
    assert_exactly_once(cluster)


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
    assert_exactly_once(cluster)


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
    assert output_table(store).version() == 2
    assert_exactly_once(cluster)


# --- what a sync reads ----------------------------------------------------------------------------


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
    assert table_counts(output_table(store).to_pyarrow_table(), 0) == cluster.source_counts(0)

    # A remembered entry that its grant's key did not sign is not taken: the chain's own is read.
    cluster.produce(120)
    real: list[ManifestVersion] = []
    cluster.commit_batches(token, remember=lambda v, _outputs: real.append(v))
    assert len(real) >= 2  # the entry after the forged one names the genuine one as its parent
    forged = real[0].manifest.model_copy(update={"note": "not what was signed"})
    committer.remember(ManifestVersion(forged, forged.model_dump_json().encode()), {})
    committer.sync([0])
    assert_exactly_once(cluster)


def _table_requests(meter: RequestMeter, since: RequestCounts) -> dict[str, int]:
    """The table's requests a meter counted since `since`, as "METHOD kind"."""
    now = meter.snapshot().by_family
    return {
        f"{m} {fam}": n - since.by_family.get((m, fam), 0)
        for (m, fam), n in now.items()
        if n != since.by_family.get((m, fam), 0)
    }


def test_a_steady_sync_of_remembered_batches_reads_nothing_back_and_commits_in_three_requests(
    store: ObjectStore, meter: RequestMeter
) -> None:
    cluster = Cluster(store, partitions=2)
    cluster.produce(400)
    tokens = [cluster.acquire(p, 1) for p in (0, 1)]
    table_meter = RequestMeter()
    node = TableCommitter(store, meter=table_meter)
    for token in tokens:
        cluster.commit_batches(token, max_batches=1, remember=node.remember)
    node.sync([0, 1])
    for token in tokens:
        cluster.commit_batches(token, max_batches=2, remember=node.remember)
    before, table_before = meter.snapshot(), table_meter.snapshot()
    result = node.sync([0, 1])
    after = meter.snapshot()
    used = {k: n - before.by_family.get(k, 0) for k, n in after.by_family.items() if n != before.by_family.get(k, 0)}
    assert (result.batches, result.commits, result.retries) == (4, 1, 0)
    # Every entry it walked is one its node published: no manifest read, not even a probe past the end.
    assert used == {}, used
    # The commit: the data file and the log entry, after one HEAD of log entry 0 (no other committer's
    # entry vouches for the table); no probe of the next name, no listing.
    assert _table_requests(table_meter, table_before) == {
        "HEAD tables/log-entry": 1,
        "PUT tables/data-file": 1,
        "PUT tables/log-entry": 1,
    }
    assert_exactly_once(cluster)


def test_nodes_syncing_in_turn_each_read_only_the_others_entries_and_write_two_objects(
    store: ObjectStore, meter: RequestMeter
) -> None:
    """The demo's shape: three nodes, a partition each, one sync per interval each, in turn. At the
    steady state a sync is a GET of each entry the other two added, the data file and the log entry:
    no HEAD of log entry 0, no GET of the absent next name, no listing, no manifest read."""
    nodes = 3
    cluster = Cluster(store, partitions=nodes)
    cluster.produce(900)
    tokens = [cluster.acquire(p, p + 1) for p in range(nodes)]
    meters = [RequestMeter() for _ in range(nodes)]
    committers = [TableCommitter(store, node=p + 1, meter=meters[p]) for p in range(nodes)]
    steady: list[dict[str, int]] = []
    for turn in range(6):
        for p in range(nodes):
            cluster.commit_batches(tokens[p], max_batches=1, remember=committers[p].remember)
            before, table_before = meter.snapshot(), meters[p].snapshot()
            result = committers[p].sync([p])
            assert (result.commits, result.batches, result.retries) == (1, 1, 0), (turn, p, result)
            if turn >= 4:  # each node has seen the others' pace for two of its commits
                assert meter.snapshot().by_family == before.by_family, "a manifest read"
                steady.append(_table_requests(meters[p], table_before))
    expected = {"GET tables/log-entry": nodes - 1, "PUT tables/data-file": 1, "PUT tables/log-entry": 1}
    assert steady == [expected] * (2 * nodes), steady
    assert_exactly_once(cluster)


# --- faults around a commit -----------------------------------------------------------------------


def test_store_faults_while_reading_the_chains_fail_the_sync_and_a_retry_lands_everything_once(
    store: ObjectStore,
) -> None:
    cluster = committed(store)
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
    assert_exactly_once(cluster)


def test_a_commit_whose_response_was_lost_is_found_and_not_repeated(
    local_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = committed(local_store)
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
    assert_exactly_once(cluster)


def test_a_commit_beaten_between_its_data_files_and_its_log_entry_is_retried_without_a_duplicate(
    local_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = committed(local_store)
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
    assert_exactly_once(cluster)


def test_a_corrupted_log_is_a_clear_error_and_rebuild_restores_the_table(local_store: ObjectStore) -> None:
    cluster = committed(local_store)
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
    assert_exactly_once(cluster)


def test_a_deleted_log_is_a_clear_error_and_rebuild_restores_the_table(store: ObjectStore) -> None:
    cluster = committed(store)
    TableCommitter(store).sync([0, 1])
    location = table_location(store)
    if location.is_local:
        shutil.rmtree(Path(location.uri) / "_delta_log")
    else:
        from laminar_orchestration.table.location import _bucket_prefix, _s3_client

        bucket, prefix = _bucket_prefix(location)
        client = _s3_client(location)
        for obj in client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/_delta_log/")["Contents"]:
            client.delete_object(Bucket=bucket, Key=obj["Key"])
    with pytest.raises(TableLogCorrupt, match="no readable _delta_log"):
        TableCommitter(store).sync([0, 1])
    rebuild_table(store)
    assert_exactly_once(cluster)


def test_the_log_is_written_before_any_data_file_and_a_staged_commit_is_not_a_lost_log(
    local_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However slow the store, a racing committer never sees data files without a log: the table's
    log entry 0 is written first, and a commit still being staged is not taken for a lost log."""
    cluster = committed(local_store)
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
    assert_exactly_once(cluster)


def test_a_table_created_while_a_committer_looked_for_files_is_not_a_lost_log(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committer finds no table, and while it lists the location (slowly, past the grace) another
    committer creates the table and appends every batch: the files it then sees came with a log, so
    it opens the table again instead of calling the log lost."""
    monkeypatch.setattr(location_module, "CREATION_GRACE_S", 0.2)
    cluster = committed(store)
    real = location_module._holds_files
    raced: list[SyncResult] = []
    listings: list[Any] = []

    def slow_listing(location: Any) -> bool:
        listings.append(location)
        if len(listings) == 1:
            raced.append(TableCommitter(store).sync([0, 1]))  # the other committer, mid-listing
            time.sleep(location_module.CREATION_GRACE_S * 2)
        return bool(real(location))

    monkeypatch.setattr(location_module, "_holds_files", slow_listing)
    result = TableCommitter(store).sync([0, 1])
    assert raced and raced[0].batches > 0 and result.batches == 0
    assert_exactly_once(cluster)


def test_a_batch_of_another_schema_is_refused_and_nothing_is_written(
    local_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = committed(local_store, partitions=1)
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
    committed(local_store, partitions=1)
    location = table_location(local_store)
    write_deltalake(location.uri, pa.table({"x": [1, 2]}), name="someone-else")
    with pytest.raises(TableMismatch, match="someone-else"):
        TableCommitter(local_store).sync([0])
    with pytest.raises(TableMismatch):
        rebuild_table(local_store)
    assert DeltaTable(location.uri).to_pyarrow_table().num_rows == 2  # left alone
    rebuild_table(local_store, force=True)
    assert audit_table(local_store).ok
