"""The operations an operator asks of the cluster: rebalance the partitions, fail a node's partitions
over.

Each is planned from the ledger by one function (`plan_rebalance`, `plan_node_failover`) and carried
out by one (`run_rebalance`, `run_node_failover`; `fail_over_node` plans and carries out a node's
whole failover), which the `laminar` CLI, the Dagster jobs and assets, the demo and the chaos suite
all call: the caller decides when and prints what happened, these decide what moves where. A move
towards a node whose heartbeat is late waits for it (`placing.through_late_heartbeat`). The control
plane's own failovers, of every dead owner's partitions, are `dead_owners`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.failover import NoFailoverTarget, not_admitted_nodes, prepare_failover
from laminar_orchestration.control.moves import MoveOutcome, drive, run_migration, run_moves
from laminar_orchestration.control.placement import AssignmentPlan, Move, failover_target, node_loads, plan_assignment
from laminar_orchestration.control.placing import through_late_heartbeat
from laminar_orchestration.control.snapshot import (
    live_node_ids,
    migrations_in_flight,
    ownership_map,
    warm_copies,
)
from laminar_orchestration.errors import InvalidInputError
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.migration_errors import FenceLost, NoLiveNode
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationTask, PhaseReport

__all__ = [
    "CoordinatorFactory",
    "NodeFailoverPlan",
    "NodeStillAlive",
    "RebalancePlan",
    "assigned_partitions",
    "fail_over_node",
    "failover_candidates",
    "failover_move",
    "plan_node_failover",
    "plan_rebalance",
    "rebalance_move",
    "run_node_failover",
    "run_rebalance",
    "take_failover_target",
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
    ledger: Ledger,
    weights: Mapping[int, float] | None = None,
    *,
    live: Collection[int] | None = None,
    owners: Mapping[int, int] | None = None,
    moving: Collection[int] | None = None,
) -> RebalancePlan:
    """Plan the fewest moves that leave every partition on a live node, balanced by weight.

    A partition whose migration is in flight is left to it: the plan's move
    for it is reported as skipped, not carried out. `live` defaults to the
    nodes the ledger shows alive; `owners` (partition -> owner) and `moving` (the partitions
    in a move) to what the ledger shows, read here (every partition's records) when not given.
    """
    live_set = frozenset(live if live is not None else live_node_ids(ledger))
    assignment = plan_assignment(dict(owners) if owners is not None else ownership_map(ledger), live_set, weights)
    moving = set(moving) if moving is not None else set(migrations_in_flight(ledger))
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
    ledger.members.bump_cluster_epoch(reason)
    make = coordinator or (lambda: MigrationCoordinator(ledger, config))

    def one(move: Move) -> PhaseReports:
        reports: PhaseReports = []
        move_it = partial(rebalance_move, make(), move, plan.live_nodes, reports.append)
        through_late_heartbeat(ledger, move.to_node, move_it)
        return reports

    return run_moves(todo, one, config.max_concurrent_migrations, live_nodes=plan.live_nodes, on_done=on_done)


# --- a node's failover ----------------------------------------------------------------------------


class NodeStillAlive(InvalidInputError):
    """A failover of a node that still heartbeats was asked for without forcing it."""

    node: int

    message = "node {node} is alive: move its partitions gracefully, or force the failover to fence it anyway"


@dataclass(frozen=True)
class NodeFailoverPlan:
    """The forced moves that take every partition of `node` to live nodes."""

    node: int
    #: The nodes alive when the plan was made (`node` among them when it is forced out while heartbeating).
    live_nodes: frozenset[int]
    moves: tuple[Move, ...]
    #: True when the node still heartbeats and is fenced anyway (an operator's decision).
    force: bool
    #: The ownership of each partition as the plan read it: each move plans from it, not from a
    #: read of its own (a grant made since fails its fence, and the move then looks again).
    ownerships: Mapping[int, Ownership] = field(default_factory=dict, compare=False, repr=False)

    @property
    def takers(self) -> frozenset[int]:
        """The live nodes that may take the partitions: every live node but `node`."""
        return self.live_nodes - {self.node}

    def to_json(self) -> dict[str, Any]:
        """The node, whether it is forced out, and the moves."""
        return {"node": self.node, "force": self.force, "moves": [m.to_json() for m in self.moves]}


def assigned_partitions(ledger: Ledger, nodes: Iterable[int]) -> dict[int, frozenset[PartitionId]]:
    """Each of `nodes` -> the partitions whose desired state names it, from its assignment (one read a node)."""
    desired = DesiredStates(ledger, nudge=False)
    out = {}
    for n in nodes:
        assignment, _ = desired.assignment(NodeId(n))
        out[n] = frozenset(PartitionId(p) for p in (assignment.partitions if assignment is not None else {}))
    return out


def failover_candidates(ledger: Ledger, node: int) -> frozenset[PartitionId]:
    """The partitions `node` may own, from two of its small records instead of every partition's:
    its assignment (the desired states that name it: every grant follows such a state) and its last
    heartbeat (what it was running)."""
    record = ledger.members.node(NodeId(node))
    reported = {PartitionId(int(p)) for p in record.partitions} if record is not None else set()
    return assigned_partitions(ledger, [node])[node] | reported


def take_failover_target(
    loads: dict[int, int], warm: Mapping[int, int] | None, to_node: int | None = None
) -> int | None:
    """One partition's failover target (`to_node`, else the warmest or least-loaded node), counted in `loads`.

    Counted as it is planned, so the partitions of one node spread over the others.
    """
    target = to_node if to_node is not None else failover_target(loads, warm=warm)
    if target is not None:
        loads[target] = loads.get(target, 0) + 1
    return target


def plan_node_failover(
    ledger: Ledger,
    node: int,
    *,
    to_node: int | None = None,
    force: bool = False,
    live: Collection[int] | None = None,
    partitions: Collection[PartitionId] | None = None,
    exclude: Collection[int] = (),
) -> NodeFailoverPlan:
    """Plan the failover of every partition `node` owns: each to `to_node`, else to the warmest or least-loaded node.

    `partitions`: look only at these (`failover_candidates`), the live nodes' loads taken from
    their assignments; None: read every partition's owner. Partitions in `exclude` are left out.
    Raises `NodeStillAlive` when `node` heartbeats and not `force`, `NoLiveNode` when `to_node` is not
    alive, `NoFailoverTarget` (naming the first partition left without a target, and the registered
    nodes not admitted yet) when no live node other than `node` is left.
    """
    live_set = set(live if live is not None else live_node_ids(ledger))
    if node in live_set and not force:
        raise NodeStillAlive(node)
    if to_node is not None and to_node not in live_set:
        raise NoLiveNode(NodeId(to_node))
    read: dict[int, Ownership] = {}
    if partitions is None:
        current = ownership_map(ledger)
        loads = node_loads(current, live_set - {node})
    else:
        owners = ledger.ownerships(sorted(partitions))
        read = {int(p): own for p, own in owners.items() if own is not None}
        current = {int(p): int(own.owner) if own is not None else UNASSIGNED for p, own in owners.items()}
        assigned = assigned_partitions(ledger, live_set - {node})
        loads = {n: len(named) for n, named in assigned.items()}
        for pid, own in read.items():  # what the ledger alone shows a live node holds counts too
            if int(own.owner) in loads and PartitionId(pid) not in assigned[int(own.owner)]:
                loads[int(own.owner)] += 1
    warm = warm_copies(ledger.members.nodes())
    moves = []
    for p in sorted(p for p, owner in current.items() if owner == node and p not in exclude):
        target = take_failover_target(loads, warm.get(p), to_node)
        if target is None:  # no live node but `node`: the target is what is missing, not `node`
            raise NoFailoverTarget(p, node, not_admitted_nodes(ledger, exclude={node}))
        moves.append(Move(p, node, target))
    return NodeFailoverPlan(
        node=node,
        live_nodes=frozenset(live_set),
        moves=tuple(moves),
        force=force,
        ownerships={m.partition: read[m.partition] for m in moves if m.partition in read},
    )


def failover_move(
    coordinator: MigrationCoordinator,
    move: Move,
    live: Collection[int],
    *,
    allow_live_owner: bool = False,
    on_phase: Callable[[PhaseReport], None] | None = None,
    own: Ownership | None = None,
) -> MigrationTask | None:
    """Carry out one move of a failover: fence and restore on the target (None when nothing needed doing).

    `own`: the partition's ownership as the failover's plan read it. If someone granted an epoch
    since, the fence fails (the move is recorded Failed) and the move is decided again from a read.
    """
    decision = prepare_failover(
        coordinator, move.partition, move.to_node, live=live, allow_live_owner=allow_live_owner, own=own
    )
    if decision.task is None:
        return None
    try:
        return drive(coordinator, decision.task, on_phase)
    except FenceLost:
        if own is None:
            raise
    return failover_move(coordinator, move, live, allow_live_owner=allow_live_owner, on_phase=on_phase)


def run_node_failover(
    ledger: Ledger,
    plan: NodeFailoverPlan,
    config: MigrationConfig,
    *,
    coordinator: CoordinatorFactory | None = None,
    on_done: Callable[[MoveOutcome[PhaseReports]], None] | None = None,
) -> list[MoveOutcome[PhaseReports]]:
    """Carry out `plan`, concurrently within `config.max_concurrent_failovers` per node; every outcome returned."""
    make = coordinator or (lambda: MigrationCoordinator(ledger, config))

    def one(move: Move) -> PhaseReports:
        reports: PhaseReports = []
        own = plan.ownerships.get(move.partition)
        go = partial(failover_move, make(), move, plan.live_nodes, allow_live_owner=plan.force, on_phase=reports.append)
        through_late_heartbeat(ledger, move.to_node, partial(go, own=own))
        return reports

    return run_moves(plan.moves, one, config.max_concurrent_failovers, live_nodes=plan.takers, on_done=on_done)


def fail_over_node(
    ledger: Ledger,
    node: int,
    config: MigrationConfig,
    *,
    to_node: int | None = None,
    force: bool = False,
    on_planned: Callable[[NodeFailoverPlan], None] | None = None,
    on_done: Callable[[MoveOutcome[PhaseReports]], None] | None = None,
) -> tuple[NodeFailoverPlan, list[MoveOutcome[PhaseReports]]]:
    """Fail over every partition `node` owns; the plan carried out (both passes) and every outcome.

    First the partitions its assignment and last heartbeat name (`failover_candidates`: two
    reads, not one per partition), at once; then the owner of every partition no other node's
    assignment names is read (none when every partition is placed), and any of those `node` still
    owns (an assignment left behind its state by a writer that died) is failed over too. Raises what
    `plan_node_failover` raises."""
    plan = plan_node_failover(ledger, node, to_node=to_node, force=force, partitions=failover_candidates(ledger, node))
    if on_planned is not None:
        on_planned(plan)
    outcomes = run_node_failover(ledger, plan, config, on_done=on_done)
    moved = {m.partition for m in plan.moves}
    others = [int(v.record.node) for v in ledger.members.nodes() if v.record.node != node]
    listed = {int(p) for named in assigned_partitions(ledger, others).values() for p in named}
    unlisted = [p for p in ledger.partitions() if int(p) not in listed and int(p) not in moved]
    if not unlisted:  # every partition is placed where an assignment says: nothing more to look at
        return plan, outcomes
    rest = plan_node_failover(
        ledger, node, to_node=to_node, force=force, live=plan.live_nodes, partitions=unlisted, exclude=moved
    )
    if rest.moves and on_planned is not None:
        on_planned(rest)
    outcomes += run_node_failover(ledger, rest, config, on_done=on_done) if rest.moves else []
    both = NodeFailoverPlan(node=node, live_nodes=plan.live_nodes, moves=plan.moves + rest.moves, force=force)
    return both, outcomes
