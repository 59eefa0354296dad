"""The output table kept by nodes whose credentials read no output object (`laminar policies`: a node
writes its own output and reads none back; it appends its own batches from memory).

A committer that meets a batch whose output its credentials may not read stops that partition
before that batch and commits what it can of the others; the batch stays first in line, so the
committer that can read it (its writer, the partition's owner, or this one once allowed) appends it,
once; a committer whose view of the log is a guess reads to its end before it stops. A committer
told to sync a partition only through its own last batch (a node that released it) reads nothing
past it, and the output rows a node remembers are kept until they landed.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.keys import manifest_history_key
from laminar_orchestration.store import AccessDenied, ForwardingStore, ObjectMeta, ObjectStore, StoredObject
from laminar_orchestration.table import TableCommitFailed, TableCommitter, app_id
from laminar_orchestration.table.errors import TableStoreFault
from tests.table.cluster import Cluster, assert_exactly_once, output_table


class NodeCredentials(ForwardingStore):
    """The store as a node's keys see it: every read of an output object (``sink/``) is denied, as the
    S3 server answers a GET or HEAD outside the policy, until `allowed`; every key read is noted."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.allowed = False
        self.read: list[str] = []

    def _check(self, op: str, key: str) -> None:
        self.read.append(key)
        if key.startswith("sink/") and not self.allowed:
            raise AccessDenied(op, key, "refused it (AccessDenied): not in the node's policy")

    def get(self, key: str) -> StoredObject:
        self._check("get", key)
        return self.inner.get(key)

    def head(self, key: str) -> ObjectMeta | None:
        self._check("head", key)
        return self.inner.head(key)


def _landed(cluster: Cluster, partition: int) -> int:
    return output_table(cluster.store).transaction_version(app_id(partition)) or 0


def test_a_batch_whose_output_the_committer_may_not_read_stops_its_partition_there_and_lands_later_once(
    local_store: ObjectStore,
) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(600)
    a0, a1 = cluster.acquire(0, 1), cluster.acquire(1, 1)
    keys_a, keys_b = NodeCredentials(local_store), NodeCredentials(local_store)
    node_a, node_b = TableCommitter(keys_a, node=1), TableCommitter(keys_b, node=2)
    for token in (a0, a1):
        cluster.commit_batches(token, max_batches=2, remember=node_a.remember)
    assert node_a.sync([0, 1]).batches == 4
    # Node 1 commits one more batch of partition 0 and hands it over; node 2 commits two of its own.
    cluster.commit_batches(a0, max_batches=1, remember=node_a.remember)
    a_last = _landed(cluster, 0) + 1
    cluster.release(a0)
    b0 = cluster.acquire(0, 2)
    cluster.commit_batches(b0, max_batches=2, remember=node_b.remember)
    cluster.commit_batches(a1, max_batches=1, remember=node_a.remember)

    # Node 2 first: node 1's last batch of partition 0 is not its to read. Nothing of 0 lands.
    early = node_b.sync([0])
    assert (early.commits, early.batches, early.blocked) == (0, 0, {0: a_last}), early
    assert _landed(cluster, 0) == a_last - 1

    # Node 1 lands its own (from memory, its walk stops after them), and partition 1's batch.
    own = node_a.sync([0, 1])
    assert (own.commits, own.batches, own.blocked) == (1, 2, {}), own
    # Still syncing partition 0 (a sync owed it when the move came), node 1's walk now starts at its
    # last batch and reads on into node 2's: it stops before node 2's first; partition 1 lands.
    cluster.commit_batches(a1, max_batches=1, remember=node_a.remember)
    mixed = node_a.sync([0, 1])
    assert (mixed.commits, mixed.batches) == (1, 1), mixed
    assert set(mixed.blocked) == {0} and mixed.blocked[0] > a_last, mixed
    assert mixed.landed[0] == a_last == _landed(cluster, 0)
    again = node_a.sync([0])  # still stopped at the same batch, nothing appended
    assert (again.commits, again.blocked) == (0, mixed.blocked), again

    # Node 2 appends its own from memory, from the batch node 1 stopped before.
    rest = node_b.sync([0])
    assert (rest.commits, rest.batches, rest.blocked) == (1, 2, {}), rest
    after = node_a.sync([0, 1])
    assert (after.commits, after.blocked) == (0, {}), after
    assert_exactly_once(cluster)


def test_a_committer_allowed_to_read_later_appends_the_batch_it_stopped_before_once(
    local_store: ObjectStore,
) -> None:
    """The stopped batch stays first in line for this committer too: once its keys may read the
    output, its next sync appends it (a remembered walk past it would leave it out for good)."""
    cluster = Cluster(local_store, partitions=1)
    cluster.produce(400)
    a0 = cluster.acquire(0, 1)
    keys_a = NodeCredentials(local_store)
    node_a = TableCommitter(keys_a, node=1)
    cluster.commit_batches(a0, max_batches=2, remember=node_a.remember)
    cluster.release(a0)
    b0 = cluster.acquire(0, 2)
    cluster.commit_batches(b0, max_batches=2)  # node 2's batches: node 1 does not remember them
    first = node_a.sync([0])
    assert (first.batches, set(first.blocked)) == (2, {0}) and first.blocked[0] > 2, first
    second = node_a.sync([0])
    assert (second.commits, second.blocked) == (0, first.blocked), second
    keys_a.allowed = True
    third = node_a.sync([0])
    assert (third.commits, third.batches, third.blocked) == (1, 2, {}), third
    assert_exactly_once(cluster)


def test_a_sync_through_its_own_last_batch_reads_nothing_past_it(local_store: ObjectStore) -> None:
    cluster = Cluster(local_store, partitions=1)
    cluster.produce(400)
    a0 = cluster.acquire(0, 1)
    keys_a = NodeCredentials(local_store)
    node_a = TableCommitter(keys_a, node=1)
    seqs: list[int] = []

    def remember(version: ManifestVersion, outputs: dict[str, pa.Table]) -> None:
        seqs.append(version.manifest.seq)
        node_a.remember(version, outputs)

    cluster.commit_batches(a0, max_batches=2, remember=remember)
    cluster.release(a0)
    b0 = cluster.acquire(0, 2)
    cluster.commit_batches(b0, max_batches=2)
    keys_a.read.clear()
    own = {0: seqs[-1]}
    result = node_a.sync([0], through=own)
    assert (result.commits, result.batches, result.blocked, result.landed) == (1, 2, {}, own), result
    # Its own entries from memory (the chain's first, the grant's, read to check them), no output,
    # and nothing of node 2's, not even a probe past its own last entry.
    last = manifest_history_key(0, own[0])
    past = [k for k in keys_a.read if k.startswith("sink/") or (k.startswith(last[:-25]) and k > last)]
    assert not past, keys_a.read
    keys_a.read.clear()
    done = node_a.sync([0], through=own)
    assert (done.commits, done.blocked, keys_a.read) == (0, {}, []), done
    TableCommitter(local_store).sync([0])
    assert_exactly_once(cluster)


def test_a_node_whose_commit_kept_failing_still_appends_its_own_batches_from_memory(
    local_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The output rows a node remembers are dropped only once they landed: its keys cannot read them back."""
    cluster = Cluster(local_store, partitions=1)
    cluster.produce(200)
    a0 = cluster.acquire(0, 1)
    keys_a = NodeCredentials(local_store)
    node_a = TableCommitter(keys_a, node=1, max_attempts=2, retry_backoff_s=0.0)
    cluster.commit_batches(a0, max_batches=2, remember=node_a.remember)
    node_a.sync([0])
    cluster.commit_batches(a0, max_batches=2, remember=node_a.remember)

    def unavailable(*_args: object, **_kwargs: object) -> None:
        raise TableStoreFault(node_a.location.uri, "_delta_log/next.json", "the store is down")

    monkeypatch.setattr(node_a, "_append", unavailable)
    with pytest.raises(TableCommitFailed):
        node_a.sync([0])
    monkeypatch.undo()
    result = node_a.sync([0])
    assert (result.commits, result.batches, result.blocked) == (1, 2, {}), result
    assert not [k for k in keys_a.read if k.startswith("sink/")]
    assert_exactly_once(cluster)
