"""Unit tests of the fencing core: PartitionGuard, PartitionGuardSet, EpochError.

The unit tests validate against a small in-memory ownership table; the
integration tests in test_fencing_integration.py use the real ledger and store.
"""

from __future__ import annotations

import pytest

from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol import fencing
from laminar_orchestration.protocol.fencing import (
    ConditionalPut,
    FencingToken,
    Ownership,
    PartitionGuard,
    PartitionGuardSet,
    _mint_token,
)
from laminar_orchestration.protocol.records import PartitionStatus

P = PartitionId
N = NodeId


class Table:
    """An in-memory stand-in for the ledger's ownership view (unit tests only)."""

    def __init__(self) -> None:
        self.rows: dict[PartitionId, Ownership] = {}
        self.batch_reads = 0

    def set(self, partition: int, epoch: int, owner: int) -> None:
        self.rows[P(partition)] = Ownership(P(partition), epoch, N(owner), PartitionStatus.ACTIVE)

    def ownership(self, partition: PartitionId) -> Ownership | None:
        return self.rows.get(partition)

    def ownerships(self, partitions: list[PartitionId]) -> dict[PartitionId, Ownership | None]:
        self.batch_reads += 1
        return {p: self.rows.get(p) for p in partitions}


def guard(partition: int, epoch: int, node: int) -> PartitionGuard:
    return PartitionGuard(_mint_token(P(partition), epoch, N(node)))


def test_guard_new_valid_epoch() -> None:
    g = guard(3, 7, 2)
    assert (g.partition_id, g.epoch, g.node_id, g.cached_current_epoch) == (3, 7, 2, 7)


def test_guard_new_epoch_zero_panics() -> None:
    with pytest.raises(ValueError, match="epoch 0 is reserved"):
        guard(1, 0, 1)


def test_guard_new_unassigned_node_rejected() -> None:
    with pytest.raises(ValueError, match="unassigned"):
        guard(1, 1, 0)


def test_fencing_token_unforgeable() -> None:
    with pytest.raises(TypeError):
        FencingToken()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        FencingToken(_seal=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        PartitionGuard((1, 5, 1))  # type: ignore[arg-type]
    token = _mint_token(P(1), 5, N(1))
    with pytest.raises(AttributeError):
        token.epoch = 9


def test_guard_check_valid_returns_ok() -> None:
    guard(1, 4, 1).check()


def test_guard_check_stale_returns_error() -> None:
    g = guard(1, 4, 1)
    g.observe_epoch(6)
    with pytest.raises(fencing.StaleEpoch) as info:
        g.check()
    assert info.value == fencing.StaleEpoch(P(1), 4, 6)


def test_guard_cache_never_moves_back() -> None:
    g = guard(1, 4, 1)
    g.observe_epoch(6)
    g.observe_epoch(3)
    assert g.cached_current_epoch == 6


def test_guard_validate_against_metadata_ok() -> None:
    table = Table()
    table.set(1, 4, 2)
    guard(1, 4, 2).validate(table)


def test_guard_validate_stale_updates_cache() -> None:
    table = Table()
    table.set(1, 9, 3)
    g = guard(1, 4, 2)
    with pytest.raises(fencing.StaleEpoch) as info:
        g.validate(table)
    assert (info.value.local_epoch, info.value.current_epoch) == (4, 9)
    assert g.cached_current_epoch == 9
    with pytest.raises(fencing.StaleEpoch):
        g.check()  # the hot path now rejects too


def test_guard_validate_unknown_partition() -> None:
    with pytest.raises(fencing.UnknownPartition) as info:
        guard(5, 1, 1).validate(Table())
    assert info.value.partition == 5


def test_guard_validate_wrong_node_returns_not_owned() -> None:
    table = Table()
    table.set(1, 4, 3)  # same epoch, another node (C5)
    with pytest.raises(fencing.NotOwned):
        guard(1, 4, 2).validate(table)


def test_guard_validate_unassigned_sentinel_returns_not_owned() -> None:
    table = Table()
    table.set(1, 4, UNASSIGNED)  # C6
    with pytest.raises(fencing.NotOwned):
        guard(1, 4, 2).validate(table)


def test_guard_refresh_still_owner() -> None:
    table = Table()
    table.set(1, 4, 2)
    assert guard(1, 4, 2).refresh(table) is True


def test_guard_refresh_revoked() -> None:
    table = Table()
    table.set(1, 5, 3)
    g = guard(1, 4, 2)
    assert g.refresh(table) is False
    assert g.cached_current_epoch == 5


def test_guard_refresh_unknown_partition_is_revoked() -> None:
    assert guard(1, 4, 2).refresh(Table()) is False


def test_guard_conditional_put_metadata() -> None:
    put = guard(7, 12, 3).conditional_put_precondition()
    assert put == ConditionalPut(P(7), 12, N(3))
    assert put.as_metadata() == {
        "x-laminar-partition": "7",
        "x-laminar-epoch": "12",
        "x-laminar-node": "3",
    }
    assert put.s3_condition() == "epoch-12-partition-7"


def test_guard_set_insert_and_check() -> None:
    s = PartitionGuardSet(N(2))
    s.insert(guard(1, 4, 2))
    s.check(P(1))
    assert len(s) == 1 and not s.is_empty()
    with pytest.raises(ValueError, match="node 3"):
        s.insert(guard(2, 1, 3))


def test_guard_set_check_not_owned() -> None:
    with pytest.raises(fencing.NotOwned):
        PartitionGuardSet(N(2)).check(P(9))


def test_guard_set_check_stale() -> None:
    s = PartitionGuardSet(N(2))
    g = guard(1, 4, 2)
    s.insert(g)
    g.observe_epoch(5)
    with pytest.raises(fencing.StaleEpoch):
        s.check(P(1))


def test_guard_set_remove() -> None:
    s = PartitionGuardSet(N(2))
    s.insert(guard(1, 4, 2))
    removed = s.remove(P(1))
    assert removed is not None and removed.epoch == 4
    with pytest.raises(fencing.NotOwned):
        s.check(P(1))
    assert s.remove(P(1)) is None
    assert s.is_empty()


def test_guard_set_validate_all_mixed() -> None:
    table = Table()
    table.set(1, 4, 2)  # still ours
    table.set(2, 8, 5)  # taken over
    table.set(3, 1, 9)  # other owner at our epoch
    s = PartitionGuardSet(N(2))
    for p, e in ((1, 4), (2, 7), (3, 1), (4, 1)):  # 4 is unknown
        s.insert(guard(p, e, 2))
    failures = dict(s.validate_all(table))
    assert set(failures) == {P(2), P(3), P(4)}
    assert isinstance(failures[P(2)], fencing.StaleEpoch)
    assert isinstance(failures[P(3)], fencing.NotOwned)
    assert isinstance(failures[P(4)], fencing.UnknownPartition)
    assert table.batch_reads == 1  # one batched read, not one per guard


def test_guard_set_refresh_all_returns_revoked() -> None:
    table = Table()
    table.set(1, 4, 2)
    table.set(2, 9, 7)
    s = PartitionGuardSet(N(2))
    s.insert(guard(1, 4, 2))
    s.insert(guard(2, 8, 2))
    assert s.refresh_all(table) == [P(2)]
    s.check(P(1))
    with pytest.raises(fencing.StaleEpoch):
        s.check(P(2))
    assert sorted(s.partition_ids()) == [1, 2]


def test_epoch_error_display() -> None:
    errors: list[fencing.EpochError] = [
        fencing.EpochError.StaleEpoch(P(1), 2, 3),
        fencing.EpochError.UnknownPartition(P(4)),
        fencing.EpochError.NotOwned(P(5)),
        fencing.EpochError.ConditionalPutFailed(P(6), 7, 8),
    ]
    assert [str(e) for e in errors] == [
        "stale epoch for partition 1: local=2, current=3",
        "unknown partition: 4",
        "partition 5 not owned by this node",
        "conditional PUT failed for partition 6: expected epoch=7, actual=8",
    ]
    assert all(isinstance(e, fencing.EpochError) for e in errors)
    assert isinstance(errors[0], fencing.StaleEpoch) and isinstance(errors[3], fencing.ConditionalPutFailed)


def test_guard_set_refresh_ignores_guards_inserted_during_the_read() -> None:
    """A guard installed while the batched ledger read is in flight must not be judged revoked."""
    s = PartitionGuardSet(N(2))
    s.insert(guard(1, 4, 2))

    class SlowTable(Table):
        def ownerships(self, partitions: list[PartitionId]) -> dict[PartitionId, Ownership | None]:
            snapshot = super().ownerships(partitions)
            s.insert(guard(5, 1, 2))  # acquired by another thread meanwhile
            return snapshot

    table = SlowTable()
    table.set(1, 4, 2)
    table.set(5, 1, 2)
    assert s.refresh_all(table) == []
    s.check(P(5))
    assert s.validate_all(table) == []
