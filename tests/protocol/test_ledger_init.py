"""`Ledger.init_cluster`: bounded partition count, and an interrupted init that a re-run completes."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from laminar_orchestration.errors import ErrorKind, InvalidArgument
from laminar_orchestration.identity import MAX_PARTITIONS, PartitionId
from laminar_orchestration.protocol.keys import CLUSTER_KEY, ownership_head_key
from laminar_orchestration.protocol.ledger import ClusterAlreadyInitialized, ClusterNotInitialized, Ledger
from laminar_orchestration.store import ObjectStore
from tests.stores import ForwardingStore


class InterruptingStore(ForwardingStore):
    """Raises KeyboardInterrupt (Ctrl-C) instead of the `after`-th create: an init killed midway."""

    def __init__(self, inner: ObjectStore, after: int) -> None:
        super().__init__(inner)
        self.left = after

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        if self.left == 0:
            raise KeyboardInterrupt
        self.left -= 1
        return self.inner.put_if_absent(key, data, metadata)


@pytest.mark.parametrize("partitions", [0, -1, MAX_PARTITIONS + 1, 100_000_000])
def test_partition_count_out_of_bounds_writes_nothing(local_store: ObjectStore, partitions: int) -> None:
    with pytest.raises(InvalidArgument) as info:
        Ledger(local_store).init_cluster(partitions)
    assert info.value.error_kind is ErrorKind.INVALID_INPUT
    assert str(partitions) in str(info.value) and str(MAX_PARTITIONS) in str(info.value)
    assert list(local_store.list("")) == []


def test_interrupted_init_leaves_no_cluster_and_a_rerun_completes_it(store: ObjectStore) -> None:
    with pytest.raises(KeyboardInterrupt):
        Ledger(InterruptingStore(store, after=3)).init_cluster(6)
    # No cluster record that names partitions without heads: readers see "not initialized".
    with pytest.raises(ClusterNotInitialized):
        Ledger(store).cluster()
    assert store.head(CLUSTER_KEY) is None
    record = Ledger(store).init_cluster(6)  # the same command again, no --force needed
    ledger = Ledger(store)
    assert ledger.cluster() == record and record.partitions == 6
    assert all(ledger.ownership(PartitionId(p)) is not None for p in range(6))
    with pytest.raises(ClusterAlreadyInitialized):
        ledger.init_cluster(6)


def test_interrupted_forced_grow_keeps_the_old_cluster_until_rerun(store: ObjectStore) -> None:
    Ledger(store).init_cluster(2)
    with pytest.raises(KeyboardInterrupt):
        Ledger(InterruptingStore(store, after=3)).init_cluster(5, force=True)  # heads 0, 1 exist; 2 made
    assert Ledger(store).cluster().partitions == 2
    assert store.head(ownership_head_key(2)) is not None and store.head(ownership_head_key(3)) is None
    assert Ledger(store).init_cluster(5, force=True).partitions == 5
    assert all(store.head(ownership_head_key(p)) is not None for p in range(5))
