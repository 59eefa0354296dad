"""The assignment planner, the per-node concurrency limit, the operations (snapshot, rebalance, failover), the CLI.

Planner properties are checked on hand-made cases and on seeded random ones
against a brute-force optimum; failover planning runs against a real ledger
in a local store, with nodes that only exist as ledger records.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from laminar_orchestration import cli
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.failover import NoFailoverTarget, prepare_failover
from laminar_orchestration.control.moves import drive, must_force, run_moves
from laminar_orchestration.control.operations import (
    NodeFailoverPlan,
    NodeStillAlive,
    fail_over_node,
    failover_candidates,
    failover_move,
    plan_node_failover,
    plan_rebalance,
    run_node_failover,
)
from laminar_orchestration.control.placement import (
    AssignmentError,
    Move,
    least_loaded_node,
    node_loads,
    plan_assignment,
    schedule_waves,
    weighted_bounds,
)
from laminar_orchestration.control.snapshot import snapshot_cluster
from laminar_orchestration.errors import ErrorKind
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.migration_errors import NoLiveNode
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationError, MigrationKind, MigrationPhase
from laminar_orchestration.store import LocalObjectStore
from tests.ledgers import make_alive, make_dead, new_ledger

P, N = PartitionId, NodeId


def counts(mapping: dict[int, int]) -> Counter[int]:
    return Counter(mapping.values())


def assert_balanced(plan_target: dict[int, int], live: list[int], weights: dict[int, float] | None = None) -> None:
    bounds = weighted_bounds(len(plan_target), live, weights)
    c = counts(plan_target)
    assert set(c) <= set(live), "every partition must end on a live node"
    for n, b in bounds.items():
        assert b.low <= c.get(n, 0) <= b.high, (n, c.get(n, 0), b)


def brute_force_min_moves(current: dict[int, int], live: list[int], weights: dict[int, float] | None) -> int:
    """The fewest moves of any balanced assignment: min over all feasible per-node counts."""
    bounds = weighted_bounds(len(current), live, weights)
    have = Counter(o for o in current.values() if o in bounds)
    orphans = sum(1 for o in current.values() if o not in bounds)
    best = None
    ranges = [range(bounds[n].low, bounds[n].high + 1) for n in sorted(bounds)]
    for combo in itertools.product(*ranges):
        if sum(combo) != len(current):
            continue
        cost = orphans + sum(max(0, have[n] - t) for n, t in zip(sorted(bounds), combo, strict=True))
        best = cost if best is None else min(best, cost)
    assert best is not None
    return best


# --- the planner ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "live"),
    [
        ({0: 1, 1: 2, 2: 3}, [1, 2, 3]),
        ({p: 1 + p % 3 for p in range(10)}, [1, 2, 3]),  # 4/3/3 is balanced for a quota of 3.33
        ({0: 1, 1: 1, 2: 2, 3: 2}, [1, 2]),
        ({0: 5}, [5, 6]),  # 1 partition, 2 nodes: 1/0 is within floor/ceil of 0.5
    ],
)
def test_balanced_input_needs_no_moves(current: dict[int, int], live: list[int]) -> None:
    plan = plan_assignment(current, live)
    assert plan.moves == []
    assert plan.balanced
    assert plan.target == current


def test_dead_nodes_partitions_are_placed_and_nothing_else_moves() -> None:
    # 9 partitions on 3 nodes; node 3 dies: its 3 partitions spread over 1 and 2 (quota 4.5 each).
    current = {p: 1 + p % 3 for p in range(9)}
    plan = plan_assignment(current, [1, 2])
    moved = {m.partition for m in plan.moves}
    assert moved == {p for p, o in current.items() if o == 3}
    assert all(m.from_node == 3 and m.to_node in (1, 2) for m in plan.moves)
    assert_balanced(plan.target, [1, 2])
    assert all(plan.target[p] == o for p, o in current.items() if o != 3), "survivors' partitions stay"


def test_unassigned_and_unknown_owners_are_placed() -> None:
    current = {0: 0, 1: 0, 2: 0, 3: 0, 4: 42}  # never assigned, and a node nobody knows
    plan = plan_assignment(current, [1, 2])
    assert sorted(m.partition for m in plan.moves) == [0, 1, 2, 3, 4]
    assert_balanced(plan.target, [1, 2])
    assert {m.from_node for m in plan.moves} == {0, 42}


def test_new_empty_node_receives_only_what_balance_requires() -> None:
    current = {p: 1 + p % 2 for p in range(8)}  # 4 + 4
    plan = plan_assignment(current, [1, 2, 3, 4])  # quota 2 each
    assert len(plan.moves) == 4
    assert all(m.to_node in (3, 4) for m in plan.moves)
    assert counts(plan.target) == {1: 2, 2: 2, 3: 2, 4: 2}


def test_weights_are_respected() -> None:
    current = {p: 1 for p in range(12)}
    weights = {1: 1.0, 2: 2.0, 3: 3.0}  # quotas 2, 4, 6
    plan = plan_assignment(current, [1, 2, 3], weights)
    assert counts(plan.target) == {1: 2, 2: 4, 3: 6}
    assert len(plan.moves) == 10
    # A weight-0 node is drained; unlisted nodes weigh 1.
    plan = plan_assignment({0: 1, 1: 1, 2: 2, 3: 2}, [1, 2], {1: 0.0})
    assert counts(plan.target) == {2: 4}
    plan = plan_assignment({p: 1 for p in range(6)}, [1, 2, 3], {3: 4.0})  # quotas 1, 1, 4
    assert counts(plan.target) == {1: 1, 2: 1, 3: 4}


def test_fractional_weights_land_on_integer_quotas() -> None:
    bounds = weighted_bounds(3, [1, 2], {1: 0.1, 2: 0.2})
    assert (bounds[1].low, bounds[1].high) == (1, 1)
    assert (bounds[2].low, bounds[2].high) == (2, 2)


def test_plan_is_deterministic_whatever_the_input_order() -> None:
    rng = random.Random(7)
    current = {p: rng.choice([0, 1, 2, 3, 9]) for p in range(40)}
    reference = plan_assignment(current, [1, 2, 3, 4], {2: 2.0})
    for _ in range(10):
        items = list(current.items())
        rng.shuffle(items)
        live = [1, 2, 3, 4]
        rng.shuffle(live)
        again = plan_assignment(dict(items), live, {2: 2.0})
        assert again.moves == reference.moves
        assert again.target == reference.target


def test_random_plans_are_balanced_sticky_and_minimal() -> None:
    rng = random.Random(20260216)
    for _ in range(300):
        nodes = rng.randint(1, 4)
        live = rng.sample(range(1, 7), nodes)
        partitions = rng.randint(0, 14)
        owners = [0, *range(1, 7)]
        current = {p: rng.choice(owners) for p in range(partitions)}
        weights = {n: rng.choice([0.5, 1.0, 2.0, 3.0]) for n in live} if rng.random() < 0.5 else None
        plan = plan_assignment(current, live, weights)
        assert_balanced(plan.target, live, weights)
        assert len(plan.moves) == brute_force_min_moves(current, live, weights), (current, live, weights)
        # Moves and target agree; only moved partitions change owner.
        moved = {m.partition: m for m in plan.moves}
        for p, owner in current.items():
            if p in moved:
                assert moved[p].from_node == owner and plan.target[p] == moved[p].to_node != owner
            else:
                assert plan.target[p] == owner
        # Sticky: planning again from the result moves nothing.
        assert plan_assignment(plan.target, live, weights).moves == []


def test_planner_rejects_impossible_inputs() -> None:
    with pytest.raises(AssignmentError, match="no live node"):
        plan_assignment({0: 1}, [])
    with pytest.raises(AssignmentError, match="all 0"):
        plan_assignment({0: 1}, [1, 2], {1: 0.0, 2: 0.0})
    with pytest.raises(AssignmentError, match="weight of node 2"):
        plan_assignment({0: 1}, [1, 2], {2: -1.0})
    with pytest.raises(AssignmentError, match=">= 1"):
        plan_assignment({0: 1}, [0, 1])


def test_least_loaded_node() -> None:
    assert least_loaded_node({1: 3, 2: 1, 3: 1}) == 2  # tie -> lowest id
    assert least_loaded_node({1: 3, 2: 1, 3: 1}, exclude={2}) == 3
    assert least_loaded_node({1: 4, 2: 3}, weights={1: 2.0}) == 1  # 4/2 < 3/1
    assert least_loaded_node({1: 0}, exclude={1}) is None
    assert node_loads({0: 1, 1: 1, 2: 7, 3: 0}, [1, 2]) == {1: 2, 2: 0}


# --- the per-node concurrency limit ------------------------------------------------------


def test_waves_never_put_a_node_in_more_than_max_moves() -> None:
    rng = random.Random(3)
    moves = [Move(p, rng.choice([0, 1, 2, 3]), rng.choice([4, 5, 6])) for p in range(30)]
    for limit in (1, 2, 3):
        waves = schedule_waves(moves, limit, live_nodes={1, 2, 4, 5, 6})
        assert sorted(m for w in waves for m in w) == sorted(moves)
        for wave in waves:
            use: Counter[int] = Counter()
            for m in wave:
                use[m.to_node] += 1
                if m.from_node in (1, 2):  # node 3 is dead, 0 is "unassigned": they do no work
                    use[m.from_node] += 1
            assert max(use.values()) <= limit
    assert schedule_waves(moves, 2) == schedule_waves(moves, 2)
    with pytest.raises(AssignmentError):
        schedule_waves(moves, 0)


def test_dead_old_owner_does_not_limit_a_failover_wave() -> None:
    moves = [Move(p, 9, 1 + p % 4) for p in range(8)]
    assert len(schedule_waves(moves, 2, live_nodes={1, 2, 3, 4})) == 1
    assert len(schedule_waves(moves, 2)) == 4  # without liveness, node 9 counts


def test_run_moves_honours_the_per_node_limit_and_runs_in_parallel() -> None:
    moves = [Move(p, 1 + p % 3, 4 + p % 2) for p in range(12)]
    active: Counter[int] = Counter()
    peak: Counter[int] = Counter()
    peak_total = 0
    lock = threading.Lock()

    def migrate(move: Move) -> int:
        nonlocal peak_total
        with lock:
            for n in (move.from_node, move.to_node):
                active[n] += 1
                peak[n] = max(peak[n], active[n])
            peak_total = max(peak_total, sum(active.values()) // 2)
        time.sleep(0.03)
        with lock:
            for n in (move.from_node, move.to_node):
                active[n] -= 1
        if move.partition == 5:
            raise RuntimeError("boom")
        return move.partition

    started = time.monotonic()
    outcomes = run_moves(moves, migrate, 2, max_workers=8)
    elapsed = time.monotonic() - started
    assert max(peak.values()) <= 2, peak
    assert peak_total >= 2, "moves on disjoint nodes should overlap"
    assert elapsed < 12 * 0.03, "not serialized"
    assert [o.move for o in outcomes] == moves
    assert [o.ok for o in outcomes].count(False) == 1
    failed = next(o for o in outcomes if not o.ok)
    assert failed.move.partition == 5 and isinstance(failed.error, RuntimeError)
    assert all(o.result == o.move.partition for o in outcomes if o.ok)


def test_run_moves_with_limit_one_serializes_a_shared_node() -> None:
    moves = [Move(p, 1, 2) for p in range(4)]
    active = 0
    peak = 0
    lock = threading.Lock()

    def migrate(move: Move) -> None:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.01)
        with lock:
            active -= 1

    run_moves(moves, migrate, 1)
    assert peak == 1


# --- failover planning against a real ledger ------------------------------------------------


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return new_ledger(LocalObjectStore(tmp_path / "store"))


def _dead_node_1_holds_p0_to_p2(ledger: Ledger) -> None:
    """Node 1 is dead holding p0, p1 and p2; nodes 2 and 3 are alive, node 2 holding p3."""
    make_dead(ledger, 1)
    make_alive(ledger, 2, 3)
    for p in range(3):
        ledger.acquire(P(p), N(1), expected_epoch=0)
    ledger.acquire(P(3), N(2), expected_epoch=0)


def test_a_node_failover_moves_what_its_assignment_names_first_then_what_only_the_ledger_shows(ledger: Ledger) -> None:
    """The first pass reads the dead node's assignment, not every partition's owner; the look at
    every owner afterwards finds a partition the assignment missed (its writer died before it)."""
    _dead_node_1_holds_p0_to_p2(ledger)
    desired = DesiredStates(ledger, nudge=False)
    for p in (0, 1):  # as the control plane placed them; p2's assignment write was lost
        desired.update(P(p), lambda s: s.model_copy(update={"owner": 1}))
    assert failover_candidates(ledger, 1) == {P(0), P(1)}
    planned: list[NodeFailoverPlan] = []
    plan, outcomes = fail_over_node(
        ledger, 1, MigrationConfig(checkpoint_transfer_timeout_s=0.1), on_planned=planned.append
    )
    assert [[m.partition for m in p.moves] for p in planned] == [[0, 1], [2]]
    assert [m.partition for m in plan.moves] == [0, 1, 2] and len(outcomes) == 3
    # Fenced towards live nodes (no node process restores them here: each move then times out).
    assert {ledger.ownership(P(p)).owner for p in range(3)} <= {2, 3}  # type: ignore[union-attr]


def test_a_failover_planned_from_a_read_another_driver_outdated_decides_again_and_fences_nothing(
    ledger: Ledger,
) -> None:
    """A failover's moves plan from the ownership its plan read: when another driver fenced the
    partition in between, the move's fence loses (recorded Failed), the move is decided again from
    a fresh read, and the other driver's grant stands."""
    _dead_node_1_holds_p0_to_p2(ledger)
    plan = plan_node_failover(ledger, 1, partitions=[P(0)])
    assert [m.partition for m in plan.moves] == [0] and plan.ownerships[0].epoch == 1
    other = ({2, 3} - {plan.moves[0].to_node}).pop()  # not the move's target: its grant is not the move's
    # Another driver's failover to a live node ran to its end meanwhile: the ledger and the desired
    # state name that node.
    ledger.fence(P(0), N(other), expected_epoch=1, reason="another driver")
    DesiredStates(ledger, nudge=False).update(P(0), lambda s: s.model_copy(update={"owner": other}))
    coordinator = MigrationCoordinator(ledger, MigrationConfig(checkpoint_transfer_timeout_s=0.1))
    move = plan.moves[0]
    assert failover_move(coordinator, move, plan.live_nodes, own=plan.ownerships[0]) is None
    own = ledger.ownership(P(0))
    assert own is not None and (own.epoch, own.owner) == (2, other)
    task = coordinator.current(P(0))
    assert task is not None and task.phase == MigrationPhase.FAILED and "fence" in (task.error or "").lower()


def test_failover_of_a_dead_owner_fences_it_towards_the_least_loaded_node(ledger: Ledger) -> None:
    make_alive(ledger, 2, 3)
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.acquire(P(1), N(2), expected_epoch=0)
    coordinator = MigrationCoordinator(ledger, MigrationConfig(checkpoint_transfer_timeout_s=0.2))
    decision = prepare_failover(coordinator, 0)
    task = decision.task
    assert task is not None
    assert (task.migration_kind, task.from_node, task.to_node) == (MigrationKind.FORCED, 1, 3)
    coordinator.run_phase(P(0), task.migration_id, MigrationPhase.PLANNED)
    coordinator.run_phase(P(0), task.migration_id, MigrationPhase.RELEASED)
    own = ledger.ownership(P(0))
    assert own is not None and (own.epoch, own.owner) == (2, 3)
    # The same failover asked again resumes the migration in flight.
    again = prepare_failover(coordinator, 0)
    assert again.task is not None and again.task.migration_id == task.migration_id
    # A live owner needs no failover.
    assert prepare_failover(coordinator, 1).task is None
    with pytest.raises(NoLiveNode):
        prepare_failover(coordinator, 1, 1, allow_live_owner=True)


def test_failover_supersedes_a_graceful_move_from_the_dead_node(ledger: Ledger) -> None:
    ledger.members.register_node(N(1), heartbeat_timeout_s=0.3)
    ledger.members.register_node(N(2), heartbeat_timeout_s=60)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    coordinator = MigrationCoordinator(ledger)
    graceful = coordinator.plan(P(0), N(2))
    assert graceful.migration_kind == MigrationKind.GRACEFUL
    time.sleep(0.4)  # node 1's heartbeat lapses mid-migration
    assert must_force(coordinator, 0)
    decision = prepare_failover(coordinator, 0)
    assert decision.superseded == [graceful.migration_id]
    assert decision.task is not None and decision.task.migration_kind == MigrationKind.FORCED


def test_a_failed_forced_move_leaves_a_stranded_owner_that_is_failed_over_again(ledger: Ledger) -> None:
    make_dead(ledger, 1)
    ledger.members.register_node(N(2), heartbeat_timeout_s=60)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    coordinator = MigrationCoordinator(ledger, MigrationConfig(checkpoint_transfer_timeout_s=0.1))
    decision = prepare_failover(coordinator, 0)
    assert decision.task is not None
    from laminar_orchestration.protocol.migration_errors import MigrationTimeout

    with pytest.raises(MigrationTimeout):
        drive(coordinator, decision.task)  # node 2 never reports the download: it is only a record
    failed = coordinator.current(P(0))
    assert failed is not None and failed.phase == MigrationPhase.FAILED
    assert failed.failed_phase == MigrationPhase.DOWNLOADING
    own = ledger.ownership(P(0))
    assert own is not None and (own.owner, own.epoch) == (2, 2)  # fenced to node 2, never active
    retry = prepare_failover(coordinator, 0)
    assert retry.task is not None and (retry.task.to_node, retry.task.to_epoch) == (2, 3)


# --- the CLI ------------------------------------------------------------------------------------


def test_cli_rebalance_dry_run_prints_the_plan(ledger: Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    for n in (1, 2):
        ledger.members.register_node(N(n), heartbeat_timeout_s=60)
    for p in range(4):
        ledger.acquire(P(p), N(1), expected_epoch=0)
    assert cli.main(["rebalance", "--store", ledger.store.url, "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dry_run"] is True and out["results"] == []
    assert [(m["partition"], m["to_node"]) for m in out["plan"]["moves"]] == [(2, 2), (3, 2)]
    assert cli.main(["rebalance", "--store", ledger.store.url, "--dry-run"]) == 0
    assert "move partition 2: node 1 -> 2" in capsys.readouterr().out
    assert ledger.ownership(P(2)) is not None and ledger.ownership(P(2)).owner == 1  # type: ignore[union-attr]
    assert cli.main(["rebalance", "--store", ledger.store.url, "--dry-run", "--weight", "x"]) == 2
    assert "NODE=WEIGHT" in capsys.readouterr().err


def test_cli_failover_fences_every_partition_of_the_dead_node(
    ledger: Ledger, capsys: pytest.CaptureFixture[str]
) -> None:
    _dead_node_1_holds_p0_to_p2(ledger)
    # No node process reports the download: every failover times out after its fence.
    argv = ["failover", "--store", ledger.store.url, "--node", "1", "--transfer-timeout", "0.1", "--json"]
    rc = cli.main(argv)
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    targets = {f["partition"]: f["to_node"] for f in out["failovers"]}
    assert targets == {0: 3, 1: 2, 2: 3}  # least loaded first: node 3 had nothing, node 2 had p3
    assert all("MigrationTimeout" in f["error"] for f in out["failovers"])
    for p, target in targets.items():
        own = ledger.ownership(P(p))
        assert own is not None and (own.owner, own.epoch) == (target, 2)
    # A live node is refused without --force.
    assert cli.main(["failover", "--store", ledger.store.url, "--node", "2"]) == 2
    assert "--force" in capsys.readouterr().err


def test_cli_migrate_names_a_dead_target(ledger: Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    ledger.members.register_node(N(1), heartbeat_timeout_s=60)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    assert cli.main(["migrate", "--store", ledger.store.url, "--partition", "0", "--to", "7"]) == 3  # unavailable
    assert "node 7 is not a live member" in capsys.readouterr().err


@pytest.mark.processes
def test_cli_does_not_import_dagster() -> None:
    code = (
        "import sys, laminar_orchestration.cli, laminar_orchestration.control.placement, "
        "laminar_orchestration.control.snapshot, laminar_orchestration.control.moves, "
        "laminar_orchestration.control.operations; "
        "sys.exit(1 if any(m.split('.')[0] == 'dagster' for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- the operations: the ownership snapshot, a rebalance plan, a node's failover plan ---------------


def test_snapshot_marks_a_dead_owners_partitions_failover_pending_until_a_migration_moves_them(
    ledger: Ledger,
) -> None:
    make_dead(ledger, 1)
    ledger.members.register_node(N(2), heartbeat_timeout_s=60)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.acquire(P(1), N(2), expected_epoch=0)
    SourceLog(ledger.store, partitions=4).append(0, generate_events(30, 3, 0, 1)[0])
    snap = snapshot_cluster(ledger)
    p0, p1, p2 = snap.partitions[:3]
    assert (p0.owner, p0.owner_alive, p0.failover_pending) == (1, False, True)
    assert p0.phase_text() == "failover pending (node 1 dead)"
    assert (p0.committed_offset, p0.log_end, p0.lag) == (0, 30, 30)
    assert (p1.owner, p1.owner_alive, p1.failover_pending, p1.phase_text()) == (2, True, False, "active")
    assert (p2.owner, p2.failover_pending) == (0, False)  # unassigned: nobody to fail over from
    assert [(n.node, n.alive) for n in snap.nodes] == [(1, False), (2, True)]
    assert snap.owned_by(1) == [0]
    # Without offsets: what an observer fingerprints does not change with every commit.
    light = snapshot_cluster(ledger, offsets=False).partitions[0]
    assert (light.committed_offset, light.log_end, light.lag, light.failover_pending) == (None, None, None, True)

    # Once a failover's migration runs, the partition shows it instead of "pending".
    coordinator = MigrationCoordinator(ledger, MigrationConfig())
    coordinator.plan(P(0), N(2), forced=True)
    moving = snapshot_cluster(ledger).partitions[0]
    assert moving.migration is not None and not moving.failover_pending
    assert moving.phase_text().startswith("forced 1→2 (")
    assert snapshot_cluster(ledger).to_json()["partitions"][0]["migration"] == moving.migration.migration_id


def test_rebalance_plan_leaves_a_partition_in_flight_to_its_migration(ledger: Ledger) -> None:
    for n in (1, 2):
        ledger.members.register_node(N(n), heartbeat_timeout_s=60)
    for p in range(4):
        ledger.acquire(P(p), N(1), expected_epoch=0)
    plan = plan_rebalance(ledger)
    assert plan.moves == (Move(2, 1, 2), Move(3, 1, 2)) and plan.skipped_in_flight == ()
    MigrationCoordinator(ledger, MigrationConfig()).plan(P(3), N(2))
    plan = plan_rebalance(ledger)
    assert plan.moves == (Move(2, 1, 2),) and plan.skipped_in_flight == (Move(3, 1, 2),)
    assert plan.to_json()["skipped_in_flight"] == [3]
    # Weights go to the planner: node 2 weighing nothing, nothing moves to it.
    assert plan_rebalance(ledger, {2: 0.0}).assignment.moves == []


def test_a_failover_with_no_node_to_receive_names_the_missing_target(ledger: Ledger) -> None:
    """Not the dead node ("node 1 is not a live member"): no live node can receive its partitions,
    and the registered nodes the membership has not admitted yet are named with what to do."""
    make_dead(ledger, 1)
    ledger.members.admit_nodes()
    for p in (1, 2):
        ledger.acquire(P(p), N(1), expected_epoch=0)
    with pytest.raises(NoFailoverTarget) as none:
        plan_node_failover(ledger, 1)
    assert (none.value.partition, none.value.owner, none.value.not_admitted) == (1, 1, ())
    assert str(none.value).startswith("no live node other than node 1 can receive partition 1: ")
    assert "laminar node run" in str(none.value)
    # A node registered since (dead too, or left out of `live` as the chaos suite does): named, not admitted.
    make_dead(ledger, 3)
    ledger.members.register_node(N(2), heartbeat_timeout_s=60)
    with pytest.raises(NoFailoverTarget) as waiting:
        plan_node_failover(ledger, 1, live=set())
    assert waiting.value.not_admitted == (2, 3)
    assert "node(s) 2, 3 registered but are not admitted" in str(waiting.value)
    assert "laminar rebalance" in str(waiting.value)
    assert waiting.value.error_kind == ErrorKind.UNAVAILABLE and isinstance(waiting.value, MigrationError)
    # Admitted (as the reconcile does), the live one receives both partitions.
    ledger.members.admit_nodes()
    assert plan_node_failover(ledger, 1).moves == (Move(1, 1, 2), Move(2, 1, 2))


def test_node_failover_plan_spreads_a_dead_nodes_partitions(ledger: Ledger) -> None:
    _dead_node_1_holds_p0_to_p2(ledger)
    plan = plan_node_failover(ledger, 1)
    # Least loaded first, counted as planned: node 3 had nothing, node 2 had p3.
    assert plan.moves == (Move(0, 1, 3), Move(1, 1, 2), Move(2, 1, 3))
    assert plan.takers == {2, 3} and not plan.force
    assert plan_node_failover(ledger, 1, to_node=2).moves == (Move(0, 1, 2), Move(1, 1, 2), Move(2, 1, 2))
    with pytest.raises(NodeStillAlive) as alive:
        plan_node_failover(ledger, 2)
    assert alive.value.node == 2
    with pytest.raises(NoLiveNode):
        plan_node_failover(ledger, 1, to_node=9)
    # No node process reports the download: each move fences, then times out, and every outcome comes back.
    outcomes = run_node_failover(ledger, plan, MigrationConfig(checkpoint_transfer_timeout_s=0.1))
    assert [o.move for o in outcomes] == list(plan.moves) and not any(o.ok for o in outcomes)
    assert [ledger.ownership(P(p)).owner for p in range(3)] == [3, 2, 3]  # type: ignore[union-attr]


def test_a_node_failover_reads_no_owner_of_a_partition_another_node_is_assigned(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its moves, the failover looks only at partitions no other node's assignment names: placed
    partitions cost a read a node, not one each."""
    _dead_node_1_holds_p0_to_p2(ledger)
    desired = DesiredStates(ledger, nudge=False)
    for p, owner in ((0, 1), (1, 1), (3, 2)):
        desired.update(P(p), lambda s, n=owner: s.model_copy(update={"owner": n}))  # type: ignore[misc]
    asked: list[int] = []
    ownerships = Ledger.ownerships

    def spy(self: Ledger, partitions: list[PartitionId]) -> dict[PartitionId, object]:
        asked.extend(int(p) for p in partitions)
        return ownerships(self, partitions)  # type: ignore[return-value]

    monkeypatch.setattr(Ledger, "ownerships", spy)
    plan, _ = fail_over_node(ledger, 1, MigrationConfig(checkpoint_transfer_timeout_s=0.1))
    assert sorted(m.partition for m in plan.moves) == [0, 1, 2]  # p2: only the ledger named it
    assert 3 not in asked  # node 2's assignment names p3: its owner is never read
