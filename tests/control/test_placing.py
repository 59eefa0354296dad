"""Placing many partitions at once: the rebalance's steps before its moves read each partition's records
once (in parallel), a move towards a node whose heartbeat is late waits for it instead of failing, and a
node reads the state of a move whose entry stands still a few times, not every two seconds."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from laminar_orchestration.control import placing
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import reinstate_all
from laminar_orchestration.control.operations import plan_rebalance, run_rebalance
from laminar_orchestration.control.placing import prepare_rebalance, through_late_heartbeat
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.desired_states import (
    STALLED_MOVE_READ_MAX_S,
    STALLED_MOVE_READ_S,
    DesiredStates,
    StalledMoves,
)
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.migration_errors import NoLiveNode
from laminar_orchestration.protocol.tasks import MigrationConfig
from laminar_orchestration.store import ObjectStore
from laminar_orchestration.store.metering import RequestMeter
from tests.ledgers import make_alive, new_ledger

P, N = PartitionId, NodeId
PARTITIONS = 24


def _reads(meter: RequestMeter, before: dict[tuple[str, str], int], family: str) -> int:
    return meter.snapshot().by_family.get(("GET", family), 0) - before.get(("GET", family), 0)


def test_reinstate_all_reads_each_unplaced_partition_once(store: ObjectStore, meter: RequestMeter) -> None:
    """A cluster nobody placed yet: every partition is unassigned and none has a desired owner, so there is
    nothing to grant back. The ownership and the desired state are read once each (all at once), not a
    second time by a grant back per partition, one after another (five round trips a partition, the
    rebalance's first minutes at 1,000 partitions on a loaded store). A released partition whose desired
    owner is alive is still granted back."""
    ledger = new_ledger(store, PARTITIONS)
    make_alive(ledger, 1, 2)
    # Partition 0: placed on node 1, which released it (a clean shutdown): it waits for its grant back.
    DesiredStates(ledger).update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    token = ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.release(token, commit_ulid=None, source_offset=0)
    coordinator = MigrationCoordinator(ledger)
    before = dict(meter.snapshot().by_family)
    granted = reinstate_all(coordinator)
    assert granted == {0: 2}
    # Partition 0's grant back reads its records again (that is the grant); the others' once.
    assert _reads(meter, before, "ledger/partitions/head.json") <= PARTITIONS + 2
    assert _reads(meter, before, "ledger/partitions/desired.json") <= PARTITIONS + 2


def test_prepare_rebalance_reads_each_record_once_and_plans_as_a_fresh_look(
    store: ObjectStore, meter: RequestMeter
) -> None:
    """`laminar rebalance`'s steps before it plans (assignments rebuilt, grants back) and the plan's own
    look share one read of each partition's desired state and ownership: the plan is the one a fresh
    look at the ledger makes."""
    ledger = new_ledger(store, PARTITIONS)
    make_alive(ledger, 1, 2, 3)
    coordinator = MigrationCoordinator(ledger)
    before = dict(meter.snapshot().by_family)
    reads = prepare_rebalance(coordinator)
    assert _reads(meter, before, "ledger/partitions/desired.json") == PARTITIONS
    assert _reads(meter, before, "ledger/partitions/head.json") == PARTITIONS
    assert reads.moving == frozenset() and reads.granted == {}
    planned = plan_rebalance(ledger, owners=reads.owners, moving=reads.moving)
    assert planned.moves == plan_rebalance(ledger).moves and len(planned.moves) == PARTITIONS


@pytest.fixture
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placing, "LATE_HEARTBEAT_POLL_S", 0.05)


@pytest.mark.usefixtures("fast_polls")
def test_a_placement_towards_a_node_whose_heartbeat_is_late_waits_for_it(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebalance's move towards a node whose heartbeat is a moment late is planned once the node beats
    again, not failed with NoLiveNode (a failed placement leaves its partition unplaced until the next
    rebalance)."""
    ledger = new_ledger(store, 1)
    handle = ledger.members.register_node(N(2), heartbeat_timeout_s=1.5)
    ledger.members.admit_nodes()
    plan = plan_rebalance(ledger)
    assert [m.to_node for m in plan.moves] == [2]
    time.sleep(2.0)  # the heartbeat lapses: the move's own look at the target finds it dead
    stop = threading.Event()

    def beats() -> None:  # the node is back, beating as a node does
        while not stop.wait(0.3):
            handle.heartbeat()

    beater = threading.Thread(target=beats)
    waits: list[int] = []
    beats_again = placing._beats_again

    def back_once_refused(led: Ledger, node: int) -> bool:
        # The node comes back only once a move was refused: the move's first look found it dead.
        if not waits:
            beater.start()
        waits.append(node)
        return beats_again(led, node)

    monkeypatch.setattr(placing, "_beats_again", back_once_refused)
    config = MigrationConfig(migration_timeout_s=1.0, checkpoint_transfer_timeout_s=0.3)
    try:
        (outcome,) = run_rebalance(ledger, plan, config, reason="test")
    finally:
        stop.set()
        if beater.is_alive():
            beater.join()
    assert waits and waits[0] == 2
    # No node process reports the restore: the move ends at its wait, after it was planned and fenced.
    assert not isinstance(outcome.error, NoLiveNode), outcome.error
    task = MigrationCoordinator(ledger).current(P(0))
    assert task is not None and task.to_node == 2


@pytest.mark.usefixtures("fast_polls")
def test_a_move_towards_a_node_that_stays_silent_fails_once_its_grace_is_out(store: ObjectStore) -> None:
    """A node that writes no heartbeat again is dead: the NoLiveNode stands after about
    `LATE_HEARTBEAT_GRACE` of its timeouts, and a NoLiveNode about another node is not waited on."""
    ledger = new_ledger(store, 1)
    ledger.members.register_node(N(2), heartbeat_timeout_s=0.2)
    time.sleep(0.3)  # its heartbeat lapses, and no other comes
    coordinator = MigrationCoordinator(ledger)
    started = time.monotonic()
    with pytest.raises(NoLiveNode):
        through_late_heartbeat(ledger, 2, lambda: coordinator.plan(P(0), N(2), forced=True))
    assert time.monotonic() - started < 0.2 * placing.LATE_HEARTBEAT_GRACE + 1.0
    calls = []

    def refused() -> None:
        calls.append(1)
        raise NoLiveNode(N(3))

    with pytest.raises(NoLiveNode):
        through_late_heartbeat(ledger, 2, refused)
    assert calls == [1]
    assert coordinator.current(P(0)) is None  # nothing was recorded


def test_a_move_whose_entry_stands_still_for_a_minute_is_read_a_few_times_not_every_two_seconds() -> None:
    """A placement's target restoring on a loaded store leaves its assignment entry still for as long as
    the restore takes: the node reads the move's desired state 2 s and 4 s after the entry last moved
    (a lost assignment write is found as soon as before), then twice as long after each read, not every
    2 s (at 1,000 partitions placed ten at a time per node, a GET a move every 2 s slowed every move)."""
    stalls = StalledMoves()
    moving = {P(0): ("m0", None)}
    reads = [at for at in (t / 10 for t in range(601)) if stalls.due(moving, {0: 3}, at=at)]
    assert reads[:2] == [STALLED_MOVE_READ_S, 2 * STALLED_MOVE_READ_S]
    assert len(reads) <= 7, reads
    assert all(b - a <= STALLED_MOVE_READ_MAX_S + 0.1 for a, b in itertools.pairwise(reads))
    # The entry moves: the next read waits the first interval again.
    assert stalls.due(moving, {0: 4}, at=61.0) == set()
    assert stalls.due(moving, {0: 4}, at=61.0 + STALLED_MOVE_READ_S) == {P(0)}
