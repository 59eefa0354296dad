"""The failure sensor's operations in the library: detecting dead owners, planning and driving their failovers.

Nodes are ledger records only (registered with a heartbeat timeout, left to
lapse): no node process ever reports a phase, so a drive stops at the first
wait for the new owner.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from laminar_orchestration.control import operations
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.dead_owners import (
    PlannedFailover,
    drive_failovers,
    look_focus,
    plan_failovers,
    wait_for_suspects,
)
from laminar_orchestration.control.operations import NodeFailoverPlan, fail_over_node
from laminar_orchestration.control.snapshot import live_node_ids
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.chain_writes import ManifestUpdate
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import StaleFencingToken
from laminar_orchestration.protocol.records import NodeRecord, NodeStatus, PartitionProgress
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationPhase
from laminar_orchestration.store import ObjectStore
from laminar_orchestration.store.metering import RequestMeter
from tests.ledgers import fence_left_unsealed, make_alive, make_dead, new_ledger

P, N = PartitionId, NodeId


def test_plan_failovers_targets_each_dead_owners_partition_once(ledger: Ledger) -> None:
    make_alive(ledger, 2, 3)
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.acquire(P(1), N(1), expected_epoch=0)
    ledger.acquire(P(2), N(2), expected_epoch=0)  # a live owner; p3 stays unassigned
    plan = plan_failovers(ledger)
    # Least loaded first, counting what this plan assigned: node 3 holds nothing, then 2 and 3 tie.
    assert plan.failovers == (PlannedFailover(0, 1, 1, 3), PlannedFailover(1, 1, 1, 2))
    assert plan.handled == {(0, 1), (1, 1)} and plan.skipped == () and dict(plan.completed_grants) == {}
    # A failover already requested is not planned again (nor counted: its run picks its target), and stays handled.
    again = plan_failovers(ledger, {(0, 1)})
    assert again.failovers == (PlannedFailover(1, 1, 1, 3),) and again.handled == {(0, 1), (1, 1)}
    # A forced migration in flight to a live node needs no failover: it is left to finish.
    MigrationCoordinator(ledger).plan(P(0), N(2), forced=True)
    moving = plan_failovers(ledger)
    assert [f.partition for f in moving.failovers] == [1]
    assert (0, 1) in moving.handled and any("in flight" in note for note in moving.skipped)


def test_plan_failovers_leaves_a_leaving_nodes_final_drain_alone_until_its_heartbeat_lapses(ledger: Ledger) -> None:
    """A node stopping says "leaving" and drains what it could not move; fencing it then would only
    cut its clean release short. Once that heartbeat lapses (a drain that hangs), it is dead."""
    make_alive(ledger, 2)
    leaving = ledger.members.register_node(N(1), heartbeat_timeout_s=0.5)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    leaving.heartbeat(NodeStatus.LEAVING, partitions={})
    draining = plan_failovers(ledger)
    assert draining.failovers == () and draining.handled == frozenset(), draining
    assert live_node_ids(ledger) == {2}, "a leaving node takes no new partition"
    time.sleep(0.6)
    assert plan_failovers(ledger).failovers == (PlannedFailover(0, 1, 1, 2),)


def test_plan_failovers_leaves_a_partition_no_live_node_can_take_for_the_next_look(ledger: Ledger) -> None:
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    plan = plan_failovers(ledger)
    assert plan.failovers == () and plan.handled == frozenset()
    assert plan.skipped == ("p0: owner node 1 is dead and no live node can take it",)
    make_alive(ledger, 2)
    assert plan_failovers(ledger).failovers == (PlannedFailover(0, 1, 1, 2),)
    # The caller's heartbeat timeout judges liveness: under a strict one, node 2 is dead too.
    time.sleep(0.3)
    assert plan_failovers(ledger, heartbeat_timeout_s=0.2).failovers == ()


def test_plan_failovers_completes_a_grant_whose_granter_died_before_sealing(
    ledger: Ledger, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    token, old_owner = fence_left_unsealed(ledger, monkeypatch)
    own = ledger.ownership(P(0))
    assert own is not None and own.head_lagged

    plan = plan_failovers(ledger)
    assert dict(plan.completed_grants) == {0: 2}
    assert plan.failovers == ()  # unassigned: nothing to fail over, but the fence now holds
    own = ledger.ownership(P(0))
    assert own is not None and (own.epoch, own.owner, own.head_lagged) == (2, UNASSIGNED, False)
    sealed = ManifestReader(store).current(P(0))
    assert sealed is not None and sealed.manifest.is_seal and sealed.manifest.fencing_token == 2
    with pytest.raises(StaleFencingToken):
        old_owner.publish(token, ManifestUpdate(source_offset=20))
    assert dict(plan_failovers(ledger).completed_grants) == {}  # nothing lags any more


def test_wait_for_suspects_ends_within_a_moment_of_an_owners_lapse_reading_each_node_once_a_timeout(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch reads a node again only when its last heartbeat would lapse: a node that keeps
    beating costs about one read a timeout, and an owner that stopped is found dead within a
    moment of its timeout, whenever the watch began. A dead node that owns nothing never ends it."""
    make_alive(ledger, 1, 2)
    ledger.acquire(P(0), N(1), expected_epoch=0)  # node 2 owns nothing
    make_dead(ledger, 3)
    _place(ledger, 1, 3)  # node 3: dead, and its assignment names p1 (a death the caller already saw)
    beating = threading.Event()

    def beat() -> None:  # node 1 beats every 0.3 s until told to stop
        while not beating.wait(0.3):
            make_alive(ledger, 1)

    watcher = Ledger(ledger.store)  # the watch's own reads, counted apart from the beats'
    reads: list[int] = []
    real_node = watcher.members.node

    def counted(node: NodeId) -> NodeRecord | None:
        reads.append(int(node))
        return real_node(node)

    monkeypatch.setattr(watcher.members, "node", counted)
    beater = threading.Thread(target=beat)
    beater.start()
    try:
        # Under a 2 s timeout, 4.5 s of watching: node 1 is read about every 2 s, never found dead;
        # node 2 lapses after 2 s (nobody beats for it) but owns nothing, so the watch goes on.
        spent = wait_for_suspects(watcher, heartbeat_timeout_s=2.0, watch_s=4.5, known_dead={3})
        # It ends with the window (or once its next read would come after it), never at node 2's lapse.
        assert 2.5 < spent <= 5.0, spent
        # The first look at the nodes; then node 1 at each of its lapses, node 2 at most once (at its
        # lapse, unless that fell within a moment of a read of node 1), and node 3 never (known dead).
        later = Counter(reads[3:])
        assert sorted(reads[:3]) == [1, 2, 3] and later[1] in (1, 2) and later[2] <= 1 and not later[3], reads
        # A dead owner the caller did not know of is news: the watch ends at once.
        assert wait_for_suspects(watcher, heartbeat_timeout_s=2.0, watch_s=4.5) < 1.0
    finally:
        beating.set()
        beater.join()
    # Node 1 stops beating: found dead at its lapse (2 s), long before the end of the 10 s watch.
    make_alive(ledger, 1)
    spent = wait_for_suspects(ledger, heartbeat_timeout_s=2.0, watch_s=10.0, known_dead={3})
    assert 1.9 < spent < 5.0, spent
    assert next(v for v in ledger.members.nodes() if v.record.node == 1).heartbeat_age_s > 2.0


def test_drive_failovers_fences_at_once_and_leaves_the_new_owners_wait_to_another_driver(ledger: Ledger) -> None:
    make_alive(ledger, 2)
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.acquire(P(1), N(1), expected_epoch=0)
    plan = plan_failovers(ledger)
    assert drive_failovers(ledger, [], budget_s=1.0) == []
    first, second = drive_failovers(ledger, plan.failovers, budget_s=1.0)
    for driven, p in ((first, 0), (second, 1)):
        assert driven.planned.partition == p and not driven.done
        assert (driven.from_epoch, driven.to_epoch, driven.to_node) == (1, 2, 2)
        assert [r.phase for r in driven.reports] == [MigrationPhase.PLANNED, MigrationPhase.RELEASED]
        assert driven.reports[0].detail.startswith("forced migration") and "epoch 1 fenced" in driven.reports[1].detail
        # No node reports the download within the budget (the wait times out, or on a slow store the
        # fence spent the budget): the record is left for another driver to resume.
        left = driven.left_to_run or ""
        assert left.startswith("MigrationTimeout") or left == "the budget ran out before downloading", left
        task = MigrationCoordinator(ledger).current(P(p))
        assert task is not None and task.migration_id == driven.migration_id and not task.is_terminal
        own = ledger.ownership(P(p))
        assert own is not None and (own.owner, own.epoch) == (2, 2)


def test_a_spent_budget_still_fences(ledger: Ledger) -> None:
    make_alive(ledger, 2)
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    (driven,) = drive_failovers(ledger, plan_failovers(ledger).failovers, budget_s=0.0)
    assert driven.left_to_run == "the budget ran out before downloading"
    assert [r.phase for r in driven.reports] == [MigrationPhase.PLANNED, MigrationPhase.RELEASED]
    own = ledger.ownership(P(0))
    assert own is not None and (own.owner, own.epoch) == (2, 2)
    # A failover whose owner came back needs nothing: the decision says why, nothing is driven.
    make_alive(ledger, 1)
    late = PlannedFailover(1, 0, 1, 2)
    ledger.acquire(P(1), N(1), expected_epoch=0)
    (nothing,) = drive_failovers(ledger, [late], budget_s=0.2, limits=MigrationConfig())
    assert nothing.migration_id is None and "alive" in (nothing.left_to_run or "")


def _place(ledger: Ledger, partition: int, node: int) -> None:
    DesiredStates(ledger, nudge=False).update(P(partition), lambda s: s.model_copy(update={"owner": node}))
    ledger.acquire(P(partition), N(node), expected_epoch=0)


def test_a_periodic_look_reads_only_the_partitions_of_nodes_that_changed(
    store: ObjectStore, meter: RequestMeter
) -> None:
    """The failure sensor's look: every partition at the first look and every `FULL_LOOK_S`; in between
    only those of nodes that joined or restarted (a grant back may be due) and of nodes not alive."""
    ledger = new_ledger(store, 30)
    make_alive(ledger, 1, 2, 3)
    for p in range(30):
        _place(ledger, p, 1 + p % 3)
    first = look_focus(ledger, None, full=False)
    assert first.full and first.fail_over is None
    quiet = look_focus(ledger, first.generations, full=False)
    assert (quiet.grant_back, quiet.fail_over) == (frozenset(), frozenset())
    before = meter.snapshot()
    assert plan_failovers(ledger, partitions=quiet.fail_over).failovers == ()
    read = sum(meter.snapshot().by_method.values()) - sum(before.by_method.values())
    assert read <= 2 * (2 + 3), read  # the member set and the node records (twice): no partition's
    # Node 2 restarts (a new generation) and node 3 dies: their partitions are looked at, no others.
    make_alive(ledger, 2)
    make_dead(ledger, 3)
    changed = look_focus(ledger, quiet.generations, full=False)
    assert changed.grant_back == frozenset(P(p) for p in range(30) if p % 3 in (1, 2))  # node 3 re-registered
    # A node died since the last look: what its assignment names now, every partition's owner next time.
    assert changed.fail_over == frozenset(P(p) for p in range(30) if p % 3 == 2) and changed.full_next
    settled = look_focus(ledger, changed.generations, full=False, seen_dead=changed.dead)
    assert not settled.full_next
    assert settled.fail_over == frozenset(P(p) for p in range(30) if p % 3 == 2)  # node 3's, by its assignment
    plan = plan_failovers(ledger, partitions=settled.fail_over)
    assert {f.partition for f in plan.failovers} == {p for p in range(30) if p % 3 == 2}
    assert look_focus(ledger, changed.generations, full=True).full


def test_a_planned_failover_records_its_move_on_the_desired_state_the_plan_read(
    ledger: Ledger, meter: RequestMeter
) -> None:
    """The plan reads each dead owner's partition's desired state once (all at once), and the move is
    recorded on that read: planning and fencing read no desired state again. The record is a
    compare-and-swap, so a write since the plan's read (another driver's move, here) is found, not
    overwritten: the failover is decided again from a fresh read and no second move is recorded."""
    make_alive(ledger, 2, 3)
    make_dead(ledger, 1)
    for p in (0, 1):
        ledger.acquire(P(p), N(1), expected_epoch=0)
    plan = plan_failovers(ledger)
    assert all(f.state is not None for f in plan.failovers)
    desired_reads = ("GET", "ledger/partitions/desired.json")
    before = meter.snapshot().by_family.get(desired_reads, 0)
    first = drive_failovers(ledger, plan.failovers[:1], budget_s=0.0)[0]
    assert meter.snapshot().by_family.get(desired_reads, 0) == before
    assert first.migration_id is not None
    # p1: another driver records a forced move after the plan's read; the planned failover finds it.
    rival = MigrationCoordinator(ledger).plan(P(1), N(3), forced=True)
    (second,) = drive_failovers(ledger, plan.failovers[1:], budget_s=0.0)
    task = MigrationCoordinator(ledger).current(P(1))
    assert task is not None and task.migration_id == rival.migration_id
    assert second.migration_id in (None, rival.migration_id)


def test_a_dead_nodes_last_heartbeat_is_read_at_the_look_that_finds_it_dead_not_at_every_look(
    store: ObjectStore,
) -> None:
    """A node's last heartbeat says what it held when it died: the look that finds it dead fails
    those partitions over. Later looks go by its assignment (its moves away end there), so a node
    that stays dead does not make every look read its old partitions again."""
    ledger = new_ledger(store, 4)
    make_alive(ledger, 1)
    handle = ledger.members.register_node(N(2), heartbeat_timeout_s=0.3)
    first = look_focus(ledger, None, full=False)
    handle.heartbeat(partitions={3: PartitionProgress(partition=3, epoch=1, state="running")})
    time.sleep(0.4)
    dying = look_focus(ledger, first.generations, full=False)
    assert 2 in dying.dead and dying.fail_over == frozenset({P(3)}) and dying.full_next
    later = look_focus(ledger, dying.generations, full=False, seen_dead=dying.dead)
    assert later.fail_over == frozenset() and not later.full_next


def test_a_node_failover_whose_partitions_every_assignment_lists_plans_once(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the assignments name every partition, the look after the moves finds nothing to read an
    owner of, and the command ends there: no second plan (its reads of every node's records and
    assignments are the command's tail)."""
    make_dead(ledger, 1)
    make_alive(ledger, 2, 3)
    desired = DesiredStates(ledger, nudge=False)
    for p, owner in ((0, 1), (1, 1), (2, 1), (3, 2)):
        desired.update(P(p), lambda s, n=owner: s.model_copy(update={"owner": n}))  # type: ignore[misc]
        ledger.acquire(P(p), N(owner), expected_epoch=0)
    plans: list[NodeFailoverPlan] = []
    planner = operations.plan_node_failover

    def spy(*args: Any, **kwargs: Any) -> NodeFailoverPlan:
        plans.append(planner(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(operations, "plan_node_failover", spy)
    plan, outcomes = fail_over_node(ledger, 1, MigrationConfig(checkpoint_transfer_timeout_s=0.1))
    assert sorted(m.partition for m in plan.moves) == [0, 1, 2] and len(outcomes) == 3
    assert len(plans) == 1
