"""A node learns what the control plane asks of it from one record about itself: its assignment.

Every desired-state write moves the assignment of each node the old or the new state names,
so a node that polls only its assignment never misses a change, and a repair pass rebuilds
assignments a crashed writer left behind.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import LedgerWriter, ledger_key
from laminar_orchestration.protocol.keys import desired_state_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.tasks import (
    DesiredState,
    DesiredStates,
    MigrationKind,
    MigrationPhase,
    MigrationTask,
)
from laminar_orchestration.store import ObjectStore

P, N = PartitionId, NodeId
AT = datetime(2026, 1, 1, tzinfo=UTC)


def _move(state: DesiredState, to: int) -> DesiredState:
    task = MigrationTask(
        migration_id="m1",
        partition=state.partition,
        migration_kind=MigrationKind.GRACEFUL,
        from_node=state.owner,
        to_node=to,
        from_epoch=1,
        to_epoch=2,
        phase=MigrationPhase.PLANNED,
        started_at=AT,
        updated_at=AT,
        timeout_s=60,
    )
    return state.model_copy(update={"migration": task})


def _desired(store: ObjectStore, partitions: int = 2) -> DesiredStates:
    ledger = Ledger(store)
    ledger.init_cluster(partitions)
    return DesiredStates(ledger, nudge=False)


def _partitions(desired: DesiredStates, node: int) -> dict[int, int] | None:
    assignment, _ = desired.assignment(N(node))
    return None if assignment is None else assignment.partitions


def test_each_write_moves_the_assignment_of_every_node_it_names(store: ObjectStore) -> None:
    desired = _desired(store)
    placed = desired.update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    assert placed.revision == 1 and _partitions(desired, 1) == {0: 1} and _partitions(desired, 2) is None

    moving = desired.update(P(0), lambda s: _move(s, to=2))  # a move names both its ends
    assert _partitions(desired, 1) == {0: moving.revision} and _partitions(desired, 2) == {0: moving.revision}

    done = desired.update(P(0), lambda s: s.model_copy(update={"owner": 2, "migration": None}))
    assert _partitions(desired, 1) == {} and _partitions(desired, 2) == {0: done.revision}
    first, _ = desired.assignment(N(1))
    assert first is not None and first.version == 3  # one version per change


def test_a_write_that_changes_nothing_writes_no_assignment(store: ObjectStore) -> None:
    desired = _desired(store)
    desired.update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    before, etag = desired.assignment(N(1))
    assert desired.update(P(0), lambda s: None).revision == 1  # `change` declined: nothing written
    after, again = desired.assignment(N(1))
    assert before == after and etag == again


def test_the_repair_pass_rebuilds_what_a_crashed_writer_left_behind(store: ObjectStore) -> None:
    desired = _desired(store)
    desired.update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    Ledger(store).register_node(N(3))
    # A writer that died after the state's compare-and-swap, before the assignments.
    state, etag = desired.read(P(0))
    moved = state.model_copy(update={"owner": 2, "revision": state.revision + 1})
    assert etag is not None
    LedgerWriter(store).swap(ledger_key(desired_state_key(0)), moved.model_dump_json().encode(), etag)
    assert _partitions(desired, 1) == {0: 1} and _partitions(desired, 2) is None

    changed = desired.sync_assignments()

    assert set(changed) == {1, 2, 3}
    assert _partitions(desired, 1) == {} and _partitions(desired, 2) == {0: 2}
    assert _partitions(desired, 3) == {}  # a registered node without partitions gets its (empty) record
    assert desired.sync_assignments() == []  # nothing left to repair


def test_writers_of_different_partitions_never_lose_each_others_assignment(store: ObjectStore) -> None:
    desired = _desired(store, partitions=2)
    rounds = 15
    start = threading.Barrier(2)

    def writer(p: int) -> None:
        start.wait()
        for i in range(rounds):
            owner = 1 if i % 2 == 0 else 0  # named, then not, then named again...

            def change(state: DesiredState, owner: int = owner) -> DesiredState:
                return state.model_copy(update={"owner": owner})

            desired.update(P(p), change)

    threads = [threading.Thread(target=writer, args=(p,)) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # The last write of each names node 1 (rounds is odd): both are in its assignment, at their last revision.
    assert _partitions(desired, 1) == {0: rounds, 1: rounds}
