"""The epoch ledger on both real backends: grants, roll-forward, releases, nodes, corruption."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import OutputCommitter
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.fencing import NotOwned, StaleEpoch, UnknownPartition
from laminar_orchestration.protocol.keys import grant_key, ownership_head_key
from laminar_orchestration.protocol.ledger import (
    ClusterAlreadyInitialized,
    ClusterNotInitialized,
    EpochConflict,
    Ledger,
    NodeIdentityConflict,
    NotReleased,
)
from laminar_orchestration.protocol.manifest import StaleFencingToken
from laminar_orchestration.protocol.records import CorruptLedgerObject, EpochGrant, GrantKind, PartitionStatus, now
from laminar_orchestration.store import ObjectStore
from tests.ledgers import fence_left_unsealed, new_ledger
from tests.stores import PausingStore

P, N = PartitionId, NodeId


def test_init_creates_unassigned_partitions(ledger: Ledger) -> None:
    assert ledger.cluster().partitions == 4
    for p in ledger.partitions():
        own = ledger.ownership(p)
        assert own is not None
        assert (own.epoch, own.owner, own.status) == (0, UNASSIGNED, PartitionStatus.UNASSIGNED)
    assert ledger.members.record().cluster_epoch == 1
    assert ledger.ownership(P(4)) is None


def test_reinit_refused_unless_forced_and_never_resets_epochs(ledger: Ledger) -> None:
    ledger.acquire(P(0), N(1), expected_epoch=0)
    with pytest.raises(ClusterAlreadyInitialized) as info:
        ledger.init_cluster(4)
    assert info.value.partitions == 4 and "--force" in str(info.value)
    ledger.init_cluster(6, force=True)
    assert ledger.cluster().partitions == 6
    own = ledger.ownership(P(0))
    assert own is not None and own.epoch == 1 and own.owner == 1
    assert ledger.ownership(P(5)) is not None
    with pytest.raises(ValueError, match="shrink"):
        ledger.init_cluster(2, force=True)


def test_uninitialized_store_is_named(store: ObjectStore) -> None:
    with pytest.raises(ClusterNotInitialized) as info:
        Ledger(store).cluster()
    assert store.url in str(info.value)


def test_acquire_release_acquire_moves_epoch_by_one(ledger: Ledger) -> None:
    t1 = ledger.acquire(P(1), N(1), expected_epoch=0)
    assert (t1.epoch, t1.node) == (1, 1)
    with pytest.raises(NotReleased):
        ledger.acquire(P(1), N(2), expected_epoch=1)
    rel = ledger.release(t1, commit_ulid=None, source_offset=10)
    assert rel.epoch == 1 and rel.source_offset == 10
    own = ledger.ownership(P(1))
    assert own is not None and own.status == PartitionStatus.RELEASED
    t2 = ledger.acquire(P(1), N(2), expected_epoch=1)
    assert (t2.epoch, t2.node) == (2, 2)
    grants = list(ledger.grants(P(1)))
    assert [(g.epoch, g.node, g.grant_kind) for g in grants] == [
        (1, 1, GrantKind.ACQUIRE),
        (2, 2, GrantKind.ACQUIRE),
    ]


def test_stale_owner_cannot_release(ledger: Ledger) -> None:
    t1 = ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.fence(P(0), N(2), expected_epoch=1, reason="node 1 died")
    with pytest.raises(StaleEpoch):
        ledger.release(t1, commit_ulid=None, source_offset=0)


def test_fence_to_unassigned_then_acquire_without_release(ledger: Ledger) -> None:
    ledger.acquire(P(2), N(1), expected_epoch=0)
    assert ledger.fence(P(2), UNASSIGNED, expected_epoch=1, reason="drain node 1") is None
    own = ledger.ownership(P(2))
    assert own is not None and (own.epoch, own.owner) == (2, UNASSIGNED)
    token = ledger.acquire(P(2), N(3), expected_epoch=2)
    assert token.epoch == 3


def test_a_fence_whose_granter_died_before_its_seal_is_sealed_by_complete_grant(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    token, _ = fence_left_unsealed(new_ledger(store, 1), monkeypatch)
    own = Ledger(store).ownership(P(0))
    assert own is not None and (own.epoch, own.owner, own.head_lagged) == (2, UNASSIGNED, True)
    # The hole: nobody adopts a grant to "unassigned", so the old owner still publishes under epoch 1.
    old_owner = ManifestPublisher(OutputCommitter(store), store)
    accepted = old_owner.publish(token, ManifestUpdate(source_offset=20))
    assert ManifestReader(store).current(P(0)) == accepted

    control_plane = Ledger(store)
    assert control_plane.complete_grant(P(0)) is True

    sealed = ManifestReader(store).current(P(0))
    assert sealed is not None and sealed.manifest.is_seal
    assert (sealed.manifest.fencing_token, sealed.manifest.node, sealed.manifest.source_offset) == (2, 0, 20)
    assert sealed.manifest.parent_hash == accepted.raw_hash
    own = control_plane.ownership(P(0))
    assert own is not None and (own.epoch, own.owner, own.head_lagged) == (2, UNASSIGNED, False)
    with pytest.raises(StaleFencingToken):
        old_owner.publish(token, ManifestUpdate(source_offset=30))
    # Idempotent: nothing lags any more, nothing is written.
    assert control_plane.complete_grant(P(0)) is False
    assert Ledger(store).complete_grant(P(0), control_plane.ownership(P(0))) is False
    assert ManifestReader(store).current(P(0)) == sealed


def test_complete_grant_beside_a_granter_still_finishing_seals_once(ledger: Ledger, store: ObjectStore) -> None:
    token = ledger.acquire(P(1), N(1), expected_epoch=0)
    ManifestPublisher(OutputCommitter(store), store).publish(token, ManifestUpdate(source_offset=5))
    granter = Ledger(store)
    seal = granter.sealer.seal
    completed: list[bool] = []

    def control_plane_first(*args: Any, **kwargs: Any) -> ManifestVersion:
        # The control plane looks between the grant and the granter's seal, and completes it.
        completed.append(Ledger(store).complete_grant(P(1)))
        return seal(*args, **kwargs)

    granter.sealer.seal = control_plane_first  # type: ignore[method-assign]
    assert granter.fence(P(1), N(2), expected_epoch=1, reason="failover") is not None

    assert completed == [True]
    entries = list(ManifestReader(store).history(P(1)))
    assert [(e.manifest.fencing_token, e.manifest.is_seal) for e in entries] == [(1, True), (1, False), (2, True)]
    own = ledger.ownership(P(1))
    assert own is not None and (own.epoch, own.owner, own.head_lagged) == (2, 2, False)
    # The grantee takes over at the control plane's seal: it is signed with its grant's key.
    assert ledger.adopt(P(1), N(2)).epoch == 2


def test_adopt_only_for_the_named_node(ledger: Ledger) -> None:
    ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.fence(P(0), N(2), expected_epoch=1, reason="failover")
    assert ledger.adopt(P(0), N(2)).epoch == 2
    with pytest.raises(NotOwned):
        ledger.adopt(P(0), N(1))
    with pytest.raises(UnknownPartition):
        ledger.adopt(P(99), N(1))


def test_conflicting_acquisitions_exactly_one_wins(ledger: Ledger) -> None:
    winners: list[int] = []
    conflicts: list[EpochConflict] = []
    barrier = threading.Barrier(8)

    def contend(node: int) -> None:
        barrier.wait()
        try:
            ledger.fence(P(3), N(node), expected_epoch=0, reason="race")
            winners.append(node)
        except EpochConflict as exc:
            conflicts.append(exc)

    threads = [threading.Thread(target=contend, args=(n,)) for n in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert len(conflicts) == 7 and all(c.actual == 1 for c in conflicts)
    own = ledger.ownership(P(3))
    assert own is not None and own.owner == winners[0] and own.epoch == 1


def test_readers_roll_forward_when_head_lags(ledger: Ledger, store: ObjectStore) -> None:
    ledger.acquire(P(0), N(1), expected_epoch=0)
    # A grantee that died between creating its grant and moving the head.
    orphan = EpochGrant(
        partition=0,
        epoch=2,
        node=3,
        grant_kind=GrantKind.FENCE,
        previous_epoch=1,
        previous_owner=1,
        reason="test",
        granted_at=now(),
    )
    store.put_if_absent(grant_key(0, 2), orphan.model_dump_json().encode())
    own = ledger.ownership(P(0))
    assert own is not None and (own.epoch, own.owner, own.head_lagged) == (2, 3, True)
    # The next contender must build on epoch 2, not re-grant it.
    with pytest.raises(EpochConflict):
        ledger.fence(P(0), N(4), expected_epoch=1, reason="stale view")
    assert ledger.fence(P(0), N(4), expected_epoch=2, reason="ok") is not None
    head = ledger.ownership(P(0))
    assert head is not None and (head.epoch, head.owner, head.head_lagged) == (3, 4, False)


def test_stalled_contender_late_grant_write_fails(ledger: Ledger, store: ObjectStore) -> None:
    """A contender paused across many transfers cannot claim the epoch it read."""
    paused = PausingStore(store, grant_key(1, 1))
    stalled = Ledger(paused)
    outcome: list[BaseException | int] = []

    def contend() -> None:
        try:
            outcome.append(stalled.fence(P(1), N(9), expected_epoch=0, reason="late").epoch)  # type: ignore[union-attr]
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=contend)
    t.start()
    assert paused.reached.wait(10)
    for epoch in range(0, 5):  # the world moves on while it sleeps
        ledger.fence(P(1), N(epoch % 3 + 1), expected_epoch=epoch, reason="progress")
    paused.resume.set()
    t.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], EpochConflict)
    assert outcome[0].actual == 5
    assert [g.node for g in ledger.grants(P(1))] == [1, 2, 3, 1, 2]


def test_corrupt_head_is_named_and_never_overwritten(ledger: Ledger, store: ObjectStore) -> None:
    key = ownership_head_key(2)
    current = store.get(key)
    store.put_if_match(key, b'{"kind": "partition-head", "partition": 2, "epoch": "x', current.etag)
    before = store.get(key)
    with pytest.raises(CorruptLedgerObject) as info:
        ledger.ownership(P(2))
    assert info.value.key == key
    with pytest.raises(CorruptLedgerObject):
        ledger.acquire(P(2), N(1), expected_epoch=0)
    with pytest.raises(CorruptLedgerObject):
        ledger.init_cluster(4, force=True)
    assert store.get(key).data == before.data


def test_grant_with_unknown_field_is_corrupt(ledger: Ledger, store: ObjectStore) -> None:
    store.put_if_absent(grant_key(0, 1), b'{"kind": "epoch-grant", "partition": 0, "epoch": 1, "nodee": 3}')
    with pytest.raises(CorruptLedgerObject) as info:
        ledger.ownership(P(0))
    assert info.value.key == grant_key(0, 1)


def test_nodes_register_heartbeat_and_liveness(ledger: Ledger) -> None:
    h1 = ledger.members.register_node(N(1), heartbeat_timeout_s=5)
    ledger.members.register_node(N(2), heartbeat_timeout_s=5)
    assert ledger.members.record().members == []  # a node writes only its own record
    assert ledger.members.admit_nodes() == [1, 2]  # the control plane admits both: one new membership generation
    epoch_after_joins = ledger.members.record().cluster_epoch
    assert epoch_after_joins == 2 and ledger.members.record().members == [1, 2]
    first = h1.record.heartbeat_at
    assert h1.heartbeat().heartbeat_at >= first
    views = {v.record.node: v for v in ledger.members.nodes()}
    assert set(views) == {1, 2} and all(v.alive for v in views.values())
    later = {v.record.node: v for v in ledger.members.nodes(at=now() + timedelta(seconds=60))}
    assert not any(v.alive for v in later.values())
    again = ledger.members.register_node(N(1), heartbeat_timeout_s=5)
    assert again.generation == 2 and ledger.members.admit_nodes() == []
    with pytest.raises(NodeIdentityConflict):
        h1.heartbeat()  # the old process of node 1 learns it was replaced
    again.leave()
    assert not {v.record.node: v for v in ledger.members.nodes()}[1].alive
    assert ledger.members.record().cluster_epoch == epoch_after_joins  # re-join is not a change
    assert ledger.members.bump_cluster_epoch("rebalance") == epoch_after_joins + 1


def test_a_fence_from_a_stale_read_of_the_ownership_grants_nothing(ledger: Ledger) -> None:
    """The failover plans from its own earlier read (`current=`): the create-only grant is what
    checks it, so a grant made since wins and the stale fence raises EpochConflict."""
    ledger.acquire(P(0), N(1), expected_epoch=0)
    stale = ledger.ownership(P(0))
    assert stale is not None and stale.epoch == 1
    ledger.fence(P(0), N(3), expected_epoch=1, reason="another driver fenced first")
    with pytest.raises(EpochConflict):
        ledger.fence(P(0), N(2), expected_epoch=1, reason="planned from the stale read", current=stale)
    own = ledger.ownership(P(0))
    assert own is not None and (own.epoch, own.owner) == (2, 3)
    assert [g.node for g in ledger.grants(P(0))] == [1, 3]


def test_a_fence_seals_on_top_of_a_commit_that_landed_after_its_first_read_of_the_chain(
    ledger: Ledger, store: ObjectStore
) -> None:
    """The grant seals from the chain it read before creating the grant; an old owner's commit in
    between takes that sequence number, and the seal goes on top of it, carrying its offset."""
    token = ledger.acquire(P(1), N(1), expected_epoch=0)
    old_owner = ManifestPublisher(OutputCommitter(store), store)
    old_owner.publish(token, ManifestUpdate(source_offset=5))
    read_chain = ledger.sealer.read_chain
    late: list[ManifestVersion] = []

    def commit_after_the_read(partition: int, **kwargs: Any) -> Any:
        read = read_chain(partition, **kwargs)
        if not late:  # the grant's first read only: the seal's second read sees the commit
            late.append(old_owner.publish(token, ManifestUpdate(source_offset=9)))
        return read

    ledger.sealer.read_chain = commit_after_the_read  # type: ignore[method-assign]
    ledger.fence(P(1), N(2), expected_epoch=1, reason="failover")
    sealed = ManifestReader(store).current(P(1))
    assert sealed is not None and sealed.manifest.is_seal and sealed.manifest.fencing_token == 2
    assert sealed.manifest.parent_hash == late[0].raw_hash and sealed.manifest.source_offset == 9
    with pytest.raises(StaleFencingToken):
        old_owner.publish(token, ManifestUpdate(source_offset=12))


def test_adopt_by_epoch_reads_the_grant_and_refuses_another_nodes_or_a_superseded_one(ledger: Ledger) -> None:
    ledger.acquire(P(2), N(1), expected_epoch=0)
    ledger.fence(P(2), N(2), expected_epoch=1, reason="failover")
    assert ledger.adopt(P(2), N(2), epoch=2).epoch == 2
    with pytest.raises(NotOwned):
        ledger.adopt(P(2), N(1), epoch=2)  # the grant at 2 names node 2
    ledger.fence(P(2), N(3), expected_epoch=2, reason="failover again")
    with pytest.raises(NotOwned):
        ledger.adopt(P(2), N(2), epoch=2)  # superseded: the current grant is node 3's
    assert ledger.adopt(P(2), N(3), epoch=3).epoch == 3
