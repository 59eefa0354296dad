"""A batch's fenced commit (`commit.commit`): the worker and the simulator both commit through it."""

from __future__ import annotations

import pytest

from laminar_dev.faults import FaultInjectingStore
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import OutputCommitter
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.commit import commit
from laminar_orchestration.protocol.fencing import FencingToken, StaleEpoch
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import ObjectStore, StoreError

P = PartitionId(0)


def _owner(store: ObjectStore) -> tuple[Ledger, FencingToken]:
    ledger = Ledger(store)
    ledger.init_cluster(1)
    return ledger, ledger.acquire(P, NodeId(1), expected_epoch=0)


def _publisher(store: ObjectStore) -> ManifestPublisher:
    return ManifestPublisher(OutputCommitter(store), store)


def test_a_commit_lands_on_the_chain_under_the_owners_epoch(store: ObjectStore) -> None:
    ledger, token = _owner(store)
    version = commit(ledger, _publisher(store), token, ManifestUpdate(source_offset=10))
    current = ManifestReader(store).current(P)
    assert current is not None and current.raw == version.raw
    assert (current.manifest.fencing_token, current.manifest.source_offset) == (1, 10)


def test_an_owner_that_sees_its_successors_grant_writes_nothing(store: ObjectStore) -> None:
    ledger, token = _owner(store)
    ledger.fence(P, NodeId(2), expected_epoch=1, reason="failover")
    sealed = ManifestReader(store).current(P)
    # StaleEpoch from the probe, before any write (the publish itself would meet the seal instead).
    with pytest.raises(StaleEpoch) as err:
        commit(ledger, _publisher(store), token, ManifestUpdate(source_offset=10))
    assert (err.value.local_epoch, err.value.current_epoch) == (1, 2)
    current = ManifestReader(store).current(P)
    assert sealed is not None and current is not None and current.raw == sealed.raw


def test_a_commit_whose_response_was_lost_counts_only_if_it_landed(store: ObjectStore) -> None:
    ledger, token = _owner(store)
    faulty = FaultInjectingStore(store)
    publisher = _publisher(faulty)

    faulty.lose_response_next(op="put_if_absent")
    landed = commit(ledger, publisher, token, ManifestUpdate(source_offset=10))
    assert landed.manifest.source_offset == 10

    faulty.fail_next(op="put_if_absent")
    with pytest.raises(StoreError):
        commit(ledger, publisher, token, ManifestUpdate(source_offset=20))
    current = ManifestReader(store).current(P)
    assert current is not None and current.manifest.source_offset == 10
