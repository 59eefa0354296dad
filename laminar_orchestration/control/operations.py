"""The two cluster-wide operations: rebalance the partitions, fail a node's partitions over.

Each is planned from the ledger by one function (`plan_rebalance`,
`plan_node_failover`) and carried out by one (`run_rebalance`,
`run_node_failover`), which the `laminar` CLI, the Dagster jobs, the demo and
the chaos suite all call: the caller decides when and prints what happened,
these decide what moves where.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import (
    MoveOutcome,
    NoFailoverTarget,
    drive,
    not_admitted_nodes,
    prepare_failover,
    run_migration,
    run_moves,
)
from laminar_orchestration.control.placement import AssignmentPlan, Move, failover_target, node_loads, plan_assignment
from laminar_orchestration.control.snapshot import live_node_ids, migrations_in_flight, ownership_map, warm_copies
from laminar_orchestration.errors import InvalidInputError
from laminar_orchestration.identity import NodeId
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationTask, NoLiveNode, PhaseReport

__all__ = [
    "CoordinatorFactory",
    "NodeFailoverPlan",
    "NodeStillAlive",
    "RebalancePlan",
    "failover_move",
    "plan_node_failover",
    "plan_rebalance",
    "rebalance_move",
    "run_node_failover",
    "run_rebalance",
]

#: Builds the coordinator a move runs with (one per move: coordinators are not shared between threads).
CoordinatorFactory = Callable[[], MigrationCoordinator]
#: What a move run by `run_rebalance` / `run_node_failover` returns: the phases it ran.
PhaseReports = list[PhaseReport]


# --- rebalance ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RebalancePlan:
    """A balanced assignment over the live nodes, minus the partitions a migration already moves."""

    live_nodes: frozenset[int]
    assignment: AssignmentPlan
    #: The moves to carry out.
    moves: tuple[Move, ...]
    #: Moves of the assignment left out because the partition's migration is in flight.
    skipped_in_flight: tuple[Move, ...]

    def to_json(self) -> dict[str, Any]:
        """Live nodes, the assignment (moves, target, per-node counts) and the skipped partitions."""
        return {
            "live_nodes": sorted(self.live_nodes),
            "plan": self.assignment.to_json(),
            "skipped_in_flight": [m.partition for m in self.skipped_in_flight],
        }


def plan_rebalance(
    ledger: Ledger, weights: Mapping[int, float] | None = None, *, live: Collection[int] | None = None
) -> RebalancePlan:
    """Plan the fewest moves that leave every partition on a live node, balanced by weight.

    A partition whose migration is in flight is left to it: the plan's move
    for it is reported as skipped, not carried out. `live` defaults to the
    nodes the ledger shows alive.
    """
    live_set = frozenset(live if live is not None else live_node_ids(ledger))
    assignment = plan_assignment(ownership_map(ledger), live_set, weights)
    moving = migrations_in_flight(ledger)
    return RebalancePlan(
        live_nodes=live_set,
        assignment=assignment,
        moves=tuple(m for m in assignment.moves if m.partition not in moving),
        skipped_in_flight=tuple(m for m in assignment.moves if m.partition in moving),
    )


def rebalance_move(
    coordinator: MigrationCoordinator,
    move: Move,
    live: Collection[int],
    on_phase: Callable[[PhaseReport], None] | None = None,
) -> MigrationTask:
    """Carry out one move of a rebalance: graceful from a live owner, forced from a dead or absent one."""
    forced = None if move.from_node in live else True
    return run_migration(coordinator, move.partition, move.to_node, forced=forced, on_phase=on_phase)


def run_rebalance(
    ledger: Ledger,
    plan: RebalancePlan,
    config: MigrationConfig,
    *,
    reason: str,
    moves: Sequence[Move] | None = None,
    coordinator: CoordinatorFactory | None = None,
    on_done: Callable[[MoveOutcome[PhaseReports]], None] | None = None,
) -> list[MoveOutcome[PhaseReports]]:
    """Carry out `plan` (or just `moves` of it), concurrently within `config.max_concurrent_migrations` per node.

    A rebalance is a new membership generation: the cluster epoch is bumped
    (with `reason`) before the first move; in-flight work of partitions that do
    not move stays valid within the cluster epoch's two-epoch window.
    """
    todo = plan.moves if moves is None else tuple(moves)
    if not todo:
        return []
    ledger.bump_cluster_epoch(reason)
    make = coordinator or (lambda: MigrationCoordinator(ledger, config))

    def one(move: Move) -> PhaseReports:
        reports: PhaseReports = []
        rebalance_move(make(), move, plan.live_nodes, reports.append)
        return reports

    return run_moves(todo, one, config.max_concurrent_migrations, live_nodes=plan.live_nodes, on_done=on_done)


# --- a node's failover ----------------------------------------------------------------------------


@dataclass
class NodeStillAlive(InvalidInputError):
    """A failover of a node that still heartbeats was asked for without forcing it."""

    node: int

    def __str__(self) -> str:
        return f"node {self.node} is alive: move its partitions gracefully, or force the failover to fence it anyway"


@dataclass(frozen=True)
class NodeFailoverPlan:
    """The forced moves that take every partition of `node` to live nodes."""

    node: int
    #: The nodes alive when the plan was made (`node` among them when it is forced out while heartbeating).
    live_nodes: frozenset[int]
    moves: tuple[Move, ...]
    #: True when the node still heartbeats and is fenced anyway (an operator's decision).
    force: bool

    @property
    def takers(self) -> frozenset[int]:
        """The live nodes that may take the partitions: every live node but `node`."""
        return self.live_nodes - {self.node}

    def to_json(self) -> dict[str, Any]:
        """The node, whether it is forced out, and the moves."""
        return {"node": self.node, "force": self.force, "moves": [m.to_json() for m in self.moves]}


def plan_node_failover(
    ledger: Ledger,
    node: int,
    *,
    to_node: int | None = None,
    force: bool = False,
    live: Collection[int] | None = None,
) -> NodeFailoverPlan:
    """Plan the failover of every partition `node` owns: each to `to_node`, else to the warmest or least-loaded node.

    Raises `NodeStillAlive` when `node` heartbeats and not `force`, `NoLiveNode`
    when `to_node` is not alive, `NoFailoverTarget` (naming the first partition
    left without a target, and the registered nodes not admitted yet) when no
    live node other than `node` is left.
    """
    live_set = set(live if live is not None else live_node_ids(ledger))
    if node in live_set and not force:
        raise NodeStillAlive(node)
    if to_node is not None and to_node not in live_set:
        raise NoLiveNode(NodeId(to_node))
    current = ownership_map(ledger)
    loads = node_loads(current, live_set - {node})
    warm = warm_copies(ledger.nodes())
    moves = []
    for p in sorted(p for p, owner in current.items() if owner == node):
        target = to_node if to_node is not None else failover_target(loads, warm=warm.get(p))
        if target is None:  # no live node but `node`: the target is what is missing, not `node`
            raise NoFailoverTarget(p, node, not_admitted_nodes(ledger, exclude={node}))
        # Counted as it is planned, so the partitions of one node spread over the others.
        loads[target] = loads.get(target, 0) + 1
        moves.append(Move(p, node, target))
    return NodeFailoverPlan(node=node, live_nodes=frozenset(live_set), moves=tuple(moves), force=force)


def failover_move(
    coordinator: MigrationCoordinator,
    move: Move,
    live: Collection[int],
    *,
    allow_live_owner: bool = False,
    on_phase: Callable[[PhaseReport], None] | None = None,
) -> MigrationTask | None:
    """Carry out one move of a failover: fence and restore on the target (None when nothing needed doing)."""
    decision = prepare_failover(coordinator, move.partition, move.to_node, live=live, allow_live_owner=allow_live_owner)
    if decision.task is None:
        return None
    return drive(coordinator, decision.task, on_phase)


def run_node_failover(
    ledger: Ledger,
    plan: NodeFailoverPlan,
    config: MigrationConfig,
    *,
    coordinator: CoordinatorFactory | None = None,
    on_done: Callable[[MoveOutcome[PhaseReports]], None] | None = None,
) -> list[MoveOutcome[PhaseReports]]:
    """Carry out `plan`, concurrently within `config.max_concurrent_migrations` per node; every outcome returned."""
    make = coordinator or (lambda: MigrationCoordinator(ledger, config))

    def one(move: Move) -> PhaseReports:
        reports: PhaseReports = []
        failover_move(make(), move, plan.live_nodes, allow_live_owner=plan.force, on_phase=reports.append)
        return reports

    return run_moves(plan.moves, one, config.max_concurrent_migrations, live_nodes=plan.takers, on_done=on_done)
