"""The cluster-wide operations: rebalance the partitions, fail a node's partitions over, fail over
every dead owner's partitions.

Each is planned from the ledger by one function (`plan_rebalance`, `plan_node_failover`,
`plan_failovers`) and carried out by one (`run_rebalance`, `run_node_failover`, `drive_failovers`),
which the `laminar` CLI, the Dagster jobs and sensors, the demo and the chaos suite all call: the
caller decides when and prints what happened, these decide what moves where. The failure sensor's
look at the ledger is `wait_for_suspects` (is a late owner dead?), `plan_failovers` and
`drive_failovers` (within a budget; a run drives what is left). A move towards a node whose
heartbeat is late waits for it (`placing.through_late_heartbeat`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import (
    MoveOutcome,
    NoFailoverTarget,
    drive,
    drive_with_deadline,
    moves_on_without_old_owner,
    not_admitted_nodes,
    prepare_failover,
    run_migration,
    run_moves,
)
from laminar_orchestration.control.placement import AssignmentPlan, Move, failover_target, node_loads, plan_assignment
from laminar_orchestration.control.placing import through_late_heartbeat
from laminar_orchestration.control.snapshot import (
    is_alive,
    live_node_ids,
    migrations_in_flight,
    ownership_map,
    warm_copies,
)
from laminar_orchestration.errors import InvalidInputError, LaminarError
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.desired_states import DesiredState, DesiredStates
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.migration_errors import FenceLost, NoLiveNode
from laminar_orchestration.protocol.records import NodeRecord, now
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationPhase, MigrationTask, PhaseReport

__all__ = [
    "FULL_LOOK_S",
    "LAPSE_MARGIN_S",
    "CoordinatorFactory",
    "DrivenFailover",
    "FailoverPlan",
    "LookFocus",
    "NodeFailoverPlan",
    "NodeStillAlive",
    "PlannedFailover",
    "RebalancePlan",
    "assigned_partitions",
    "drive_failover",
    "drive_failovers",
    "fail_over_node",
    "failover_candidates",
    "failover_move",
    "look_focus",
    "plan_failovers",
    "plan_node_failover",
    "plan_rebalance",
    "rebalance_move",
    "run_node_failover",
    "run_rebalance",
    "wait_for_suspects",
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
        target = _take(loads, warm.get(p), to_node)
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


# --- every dead owner's partitions, as the control plane's periodic look fails them over ------------

#: How long after a heartbeat's lapse `wait_for_suspects` reads the node again (a heartbeat written
#: just before the lapse is visible by then).
LAPSE_MARGIN_S = 0.05


def wait_for_suspects(
    ledger: Ledger,
    *,
    heartbeat_timeout_s: float | None,
    watch_s: float,
    known_dead: Collection[int] = (),
    margin_s: float = LAPSE_MARGIN_S,
) -> float:
    """Watch the owning nodes for up to `watch_s`, until one's heartbeat timeout lapses; the seconds spent.

    Every node is read once; after that a node's record is read again only when its last heartbeat
    would lapse (its time plus the timeout: `heartbeat_timeout_s`, else the node's own). A node that
    beat since is watched on to its next lapse; one that did not is dead, and the watch ends at
    once (fail over now) - within `margin_s` of the timeout, whenever the watch began, for about one
    read a node per timeout. Only owning nodes end the watch: a node whose last heartbeat and
    assignment name no partition needs no failover, and one the caller already found dead
    (`known_dead`: its failovers are planned) is not news.
    """
    started = time.monotonic()
    records = {v.record.node: v.record for v in ledger.members.nodes()}
    owning: dict[int, bool] = {}
    desired = DesiredStates(ledger, nudge=False)

    def owns(record: NodeRecord) -> bool:
        if record.node not in owning:
            assignment, _ = desired.assignment(NodeId(record.node))
            owning[record.node] = bool(record.partitions) or bool(assignment and assignment.partitions)
        return owning[record.node]

    while True:
        at = now()
        lapses: list[tuple[float, int]] = []
        for node, record in records.items():
            if node in known_dead:  # never news, so never read again
                continue
            timeout = heartbeat_timeout_s if heartbeat_timeout_s is not None else record.heartbeat_timeout_s
            left = timeout - (at - record.heartbeat_at).total_seconds()
            if left >= 0:
                lapses.append((left, node))
            elif owns(record):
                return time.monotonic() - started
        if not lapses:
            return time.monotonic() - started
        left, node = min(lapses)
        wake = time.monotonic() + left + margin_s
        if wake > started + watch_s:
            return time.monotonic() - started
        time.sleep(max(0.0, wake - time.monotonic()))
        fresh = ledger.members.node(NodeId(node))
        if fresh is None:
            del records[node]
        else:
            records[node] = fresh


@dataclass(frozen=True)
class PlannedFailover:
    """A partition whose owner is dead, and the live node chosen to take it."""

    partition: int
    epoch: int
    failed_node: int
    to_node: int
    #: The ownership as the plan read it: the failover plans and fences from it (its grant's
    #: create-only write checks it) instead of reading it again.
    ownership: Ownership | None = field(default=None, compare=False, repr=False)
    #: The desired state and its ETag as the plan read them: the failover's record is written on
    #: them (a compare-and-swap: a write since makes it read again).
    state: tuple[DesiredState, str | None] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class FailoverPlan:
    """The failovers one look at the ledger found due: every dead owner's partitions, with a target each."""

    failovers: tuple[PlannedFailover, ...] = ()
    #: (partition, epoch) pairs whose failover is planned or under way (in this plan or before it).
    handled: frozenset[tuple[int, int]] = frozenset()
    #: Why partitions of dead owners were left alone, one line each.
    skipped: tuple[str, ...] = ()
    #: partition -> epoch of the grants completed on the way (their granter died before sealing).
    completed_grants: Mapping[int, int] = field(default_factory=dict)
    #: Partitions of dead owners that no live node could take: the next look tries them again.
    unplaced: frozenset[int] = frozenset()


#: The control plane's periodic look reads every partition's records this often (the repair of what no
#: node change points at: a grant its granter left unsealed, a grant that outlived its move); in
#: between, only the partitions of the nodes that joined, restarted or died since.
FULL_LOOK_S = 300.0


@dataclass(frozen=True)
class LookFocus:
    """Which partitions one periodic look of the control plane reads (the failure sensor's): None for
    every partition. Its request count follows the nodes that changed, not the partitions."""

    #: The partitions that may wait for a grant back (`reinstate_all`): those of nodes that joined or restarted.
    grant_back: frozenset[PartitionId] | None
    #: The partitions that may need a failover (`plan_failovers`): those of nodes that are not alive.
    fail_over: frozenset[PartitionId] | None
    #: Each node's generation as this look saw it, and the nodes it found not alive: the next look
    #: compares with them.
    generations: Mapping[int, int]
    dead: frozenset[int] = frozenset()
    #: A node died since the previous look: this one reads what its records name, the next one every
    #: partition (the ledger's owner is the truth; an assignment may lag behind its state).
    full_next: bool = False

    @property
    def full(self) -> bool:
        return self.grant_back is None


def look_focus(
    ledger: Ledger,
    seen: Mapping[int, int] | None,
    *,
    full: bool,
    heartbeat_timeout_s: float | None = None,
    seen_dead: Collection[int] = (),
    unplaced: Collection[int] = (),
) -> LookFocus:
    """What this look reads, given the previous look's node generations (`seen`; None at the first),
    the nodes it found dead (`seen_dead`) and the partitions it could not fail over (`unplaced`).

    Every partition at the first look and when `full` (every `FULL_LOOK_S`). Otherwise, for grants
    back, the partitions the assignment records of the nodes that joined or restarted since name (a
    node that left cleanly released its partitions); for failovers, those the dead nodes' assignments
    name or their last heartbeats report, and `unplaced`. When a node died since the previous look
    the next look reads every partition (`full_next`: the ledger's owner is the truth, not the
    assignment), after this one has failed over what the node's records name at once.
    """
    views = ledger.members.nodes()
    generations = {int(v.record.node): v.record.generation for v in views}
    # Judged from the records just read: no second read of every node.
    dead = frozenset(int(v.record.node) for v in views if not is_alive(v, heartbeat_timeout_s))
    if seen is None or full:
        return LookFocus(None, None, generations, dead)

    def named(nodes: Iterable[int]) -> frozenset[PartitionId]:
        return frozenset().union(*assigned_partitions(ledger, nodes).values())

    changed = [n for n, g in generations.items() if seen.get(n) != g]
    # A last heartbeat tells what a node held when it died; once that death was looked at, the
    # node's assignment (its moves away end there) and the full looks say the rest.
    newly_dead = dead - set(seen_dead)
    reported = {PartitionId(p) for v in views if int(v.record.node) in newly_dead for p in v.record.partitions}
    fail_over = named(dead) | reported | {PartitionId(p) for p in unplaced}
    return LookFocus(named(changed), frozenset(fail_over), generations, dead, full_next=bool(newly_dead))


def _take(loads: dict[int, int], warm: Mapping[int, int] | None, to_node: int | None = None) -> int | None:
    """One partition's failover target (`to_node`, else the warmest or least-loaded node), counted in `loads`.

    Counted as it is planned, so the partitions of one node spread over the others.
    """
    target = to_node if to_node is not None else failover_target(loads, warm=warm)
    if target is not None:
        loads[target] = loads.get(target, 0) + 1
    return target


def plan_failovers(
    ledger: Ledger,
    handled: Collection[tuple[int, int]] = (),
    *,
    heartbeat_timeout_s: float | None = None,
    partitions: Collection[PartitionId] | None = None,
) -> FailoverPlan:
    """Find the partitions whose owner is dead and pick a target for each new (partition, epoch).

    A partition is left alone when its owner is alive, unassigned or draining (a leaving node's final
    drain releases it), when a migration that no longer needs the old owner is in flight towards a
    live node (a forced one, or a graceful one past the release), or when its (partition, epoch) is
    in `handled` (a failover already requested). The target is a live node with a warm copy of the
    partition (a standby), else the least-loaded live node, counting the failovers planned here. A
    partition no live node can take is not marked handled: the next look plans it again. Liveness is
    judged with `heartbeat_timeout_s` (None: each node's own timeout).

    On the way, every grant the ownership head lags (`Ownership.head_lagged`) is completed
    (`Ledger.complete_grant`): its granter died before sealing the manifest chain, and nothing else
    would seal it. Only `partitions` are looked at (None: every partition; see `LookFocus`).
    """
    views = ledger.members.nodes()
    live = {view.record.node for view in views if is_alive(view, heartbeat_timeout_s)}
    draining = {view.record.node for view in views if view.draining(heartbeat_timeout_s)}
    owners = ledger.ownerships(ledger.partitions() if partitions is None else sorted(partitions))
    loads = node_loads({int(p): (int(o.owner) if o else UNASSIGNED) for p, o in owners.items()}, live)
    warm = warm_copies(views)
    # The records of the dead owners' partitions, read at once (not one after the other).
    orphaned = [p for p, o in owners.items() if o is not None and o.owner not in {UNASSIGNED, *live, *draining}]
    states = DesiredStates(ledger).read_many(sorted(orphaned))
    failovers: list[PlannedFailover] = []
    done: set[tuple[int, int]] = set()
    skipped: list[str] = []
    unplaced: set[int] = set()
    completed: dict[int, int] = {}
    for p, own in sorted(owners.items()):
        if own is not None and own.head_lagged:
            try:
                if ledger.complete_grant(p, own):
                    completed[int(p)] = own.epoch
            except LaminarError as exc:
                skipped.append(f"p{p}: the grant at epoch {own.epoch} is not sealed: {type(exc).__name__}: {exc}")
        if p not in states:
            continue  # its owner is alive, or nobody owns it
        assert own is not None
        key = (int(p), own.epoch)
        task = states[p][0].migration
        if task is not None and moves_on_without_old_owner(task, live):
            skipped.append(f"p{p}: migration {task.migration_id} to node {task.to_node} in flight")
            done.add(key)
            continue
        if key in handled:
            done.add(key)
            continue
        target = _take(loads, warm.get(int(p)))
        if target is None:
            skipped.append(f"p{p}: owner node {own.owner} is dead and no live node can take it")
            unplaced.add(int(p))
            continue
        done.add(key)
        failovers.append(PlannedFailover(int(p), own.epoch, int(own.owner), target, ownership=own, state=states[p]))
    return FailoverPlan(tuple(failovers), frozenset(done), tuple(skipped), completed, frozenset(unplaced))


@dataclass(frozen=True)
class DrivenFailover:
    """One planned failover as `drive_failovers` left it: its migration, the phases done, what stopped it."""

    planned: PlannedFailover
    migration_id: str | None = None
    from_epoch: int = 0
    to_epoch: int = 0
    to_node: int = 0
    reports: tuple[PhaseReport, ...] = ()
    #: Why the drive stopped before Active (budget spent, an error); None when it finished.
    left_to_run: str | None = None

    @property
    def done(self) -> bool:
        """True when the failover is complete (the new owner is active)."""
        return self.left_to_run is None


def drive_failover(
    ledger: Ledger, planned: PlannedFailover, deadline: float, limits: MigrationConfig, live: Collection[int] | None
) -> DrivenFailover:
    """Fence and drive one planned failover until Active or `deadline` (`time.monotonic()`).

    The fence never waits for a node, so it is done whatever the deadline: nothing the dead owner may
    still do is accepted; only the waits for the new owner are bounded (`drive_with_deadline`). The
    first phase's report counts the decision's ledger reads too. Errors are returned, not raised.
    """
    coordinator = MigrationCoordinator(ledger, limits)
    started = time.monotonic()
    try:
        decision = prepare_failover(
            coordinator, planned.partition, planned.to_node, live=live, own=planned.ownership, read=planned.state
        )
    except LaminarError as exc:
        return DrivenFailover(planned, left_to_run=f"{type(exc).__name__}: {exc}")
    task = decision.task
    if task is None:
        return DrivenFailover(planned, left_to_run=decision.reason)
    deciding_s = time.monotonic() - started
    driven = drive_with_deadline(coordinator, task, deadline, always=(MigrationPhase.PLANNED, MigrationPhase.RELEASED))
    reports = list(driven.reports)
    if reports and reports[0].phase == MigrationPhase.PLANNED:
        # The fence follows the decision at once: its ledger reads count in the first phase.
        first = reports[0]
        reports[0] = PhaseReport(first.phase, deciding_s + first.duration_s, first.bytes_moved, decision.reason)
    left: str | None = None
    if driven.error is not None:
        left = f"{type(driven.error).__name__}: {driven.error}"
    elif driven.out_of_time_before is not None:
        left = f"the budget ran out before {driven.out_of_time_before}"
    return DrivenFailover(
        planned, task.migration_id, task.from_epoch, task.to_epoch, task.to_node, tuple(reports), left
    )


def drive_failovers(
    ledger: Ledger,
    failovers: Iterable[PlannedFailover],
    *,
    budget_s: float,
    limits: MigrationConfig | None = None,
    heartbeat_timeout_s: float | None = None,
) -> list[DrivenFailover]:
    """Drive every failover at once (one thread each) for at most `budget_s`; one result per failover, in order.

    Liveness is judged with `heartbeat_timeout_s` (None: each node's own), as
    `plan_failovers` judged it. What is left undone is for a driver with the
    migration's full limits (a run) to resume from the record.
    """
    todo = list(failovers)
    if not todo:
        return []
    deadline = time.monotonic() + budget_s
    settings = limits or MigrationConfig()
    live = live_node_ids(ledger, heartbeat_timeout_s=heartbeat_timeout_s)
    with ThreadPoolExecutor(len(todo), thread_name_prefix="failover") as pool:
        return list(pool.map(lambda f: drive_failover(ledger, f, deadline, settings, live), todo))
