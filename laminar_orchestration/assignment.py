"""Deciding where partitions run, and carrying those decisions out.

Two layers, kept apart on purpose:

* **The planner** (`plan_assignment`, `least_loaded_node`, `schedule_waves`) is
  pure: plain mappings in, a plan out, no I/O, deterministic. It is sticky: a
  partition moves only when balance requires it. Partitions of dead or unknown
  nodes and unassigned ones are always placed; beyond that, partitions move
  from over-loaded to under-loaded nodes only until every live node holds
  between ``floor(quota)`` and ``ceil(quota)`` partitions, where a node's quota
  is its weighted share of all partitions. The number of moves is the minimum
  any balanced assignment needs.
* **Carrying plans out** (`run_moves`, `prepare_failover`, `drive`,
  `run_migration`) drives `MigrationCoordinator`s; the `laminar` CLI and the
  Dagster jobs share it, so both honour the per-node concurrency limit and
  record failures the same way. Nothing here imports Dagster.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Generic, TypeVar

from .errors import InvalidInputError, UnavailableError
from .identity import UNASSIGNED, NodeId, PartitionId
from .ledger import Ledger, LedgerError, NodeView
from .migration import (
    GRACEFUL_PHASES,
    MigrationCoordinator,
    MigrationEpochConflict,
    MigrationError,
    MigrationKind,
    MigrationNotOwned,
    MigrationPhase,
    MigrationTask,
    NoLiveNode,
    PhaseReport,
    phase_sequence,
)
from .records import NodeStatus, PartitionStatus
from .store import StoreError

R = TypeVar("R")

__all__ = [
    "AssignmentError",
    "AssignmentPlan",
    "FailoverDecision",
    "Move",
    "MoveOutcome",
    "NoFailoverTarget",
    "NodeBounds",
    "drive",
    "failover_target",
    "least_loaded_node",
    "live_node_ids",
    "must_force",
    "node_loads",
    "ownership_map",
    "plan_assignment",
    "prepare_failover",
    "record_failure",
    "run_migration",
    "run_moves",
    "schedule_waves",
    "stranded",
    "warm_copies",
    "weighted_bounds",
]


# --- the planner (pure) ---------------------------------------------------------


class AssignmentError(InvalidInputError, ValueError):
    """The inputs admit no assignment (no live node, bad weights)."""


@dataclass(frozen=True, order=True)
class Move:
    """Move `partition` from `from_node` (0: unassigned) to `to_node`."""

    partition: int
    from_node: int
    to_node: int

    def to_json(self) -> dict[str, int]:
        """The move as plain JSON (CLI output, Dagster metadata)."""
        return {"partition": self.partition, "from_node": self.from_node, "to_node": self.to_node}


@dataclass(frozen=True)
class NodeBounds:
    """A live node's weighted quota and the partition counts that count as balanced."""

    quota: float
    low: int
    high: int


@dataclass(frozen=True)
class AssignmentPlan:
    """The planner's answer: the owner of every partition afterwards, and the moves to get there."""

    target: dict[int, int]
    moves: list[Move]
    bounds: dict[int, NodeBounds]
    #: Partitions per live node before / after the moves.
    counts_before: dict[int, int]
    counts_after: dict[int, int]

    @property
    def balanced(self) -> bool:
        """True when the input needed no move at all."""
        return not self.moves

    def to_json(self) -> dict[str, Any]:
        """Moves, target and per-node counts as plain JSON (CLI output, Dagster metadata)."""
        return {
            "moves": [m.to_json() for m in self.moves],
            "target": {str(p): n for p, n in sorted(self.target.items())},
            "nodes": [
                {
                    "node": n,
                    "quota": round(b.quota, 3),
                    "low": b.low,
                    "high": b.high,
                    "before": self.counts_before.get(n, 0),
                    "after": self.counts_after.get(n, 0),
                }
                for n, b in sorted(self.bounds.items())
            ],
        }


def _fraction(value: float, what: str) -> Fraction:
    if not math.isfinite(value) or value < 0:
        raise AssignmentError(f"{what} must be a finite number >= 0, got {value!r}")
    # limit_denominator: 0.1 + 0.2 behaves like 3/10, so quotas land on integers when they should.
    return Fraction(value).limit_denominator(1_000_000)


def weighted_bounds(
    partitions: int, live_nodes: Iterable[int], weights: Mapping[int, float] | None = None
) -> dict[int, NodeBounds]:
    """Quota and balanced range of each live node: ``floor(quota) <= count <= ceil(quota)``.

    A node missing from `weights` has weight 1; weight 0 means "hold nothing".
    """
    nodes = sorted(set(live_nodes))
    if not nodes:
        raise AssignmentError("no live node to assign partitions to")
    if any(n <= UNASSIGNED for n in nodes):
        raise AssignmentError(f"node ids must be >= 1, got {[n for n in nodes if n <= UNASSIGNED]}")
    w = {n: _fraction(float((weights or {}).get(n, 1.0)), f"weight of node {n}") for n in nodes}
    total = sum(w.values(), Fraction(0))
    if total == 0:
        raise AssignmentError("the live nodes' weights are all 0: nobody can hold a partition")
    bounds = {}
    for n in nodes:
        quota = partitions * w[n] / total
        bounds[n] = NodeBounds(float(quota), math.floor(quota), math.ceil(quota))
    return bounds


def plan_assignment(
    current: Mapping[int, int],
    live_nodes: Iterable[int],
    weights: Mapping[int, float] | None = None,
) -> AssignmentPlan:
    """Plan the fewest moves that leave every partition on a live node, balanced by weight.

    `current` maps each partition to its owner (0: unassigned). Partitions on
    nodes outside `live_nodes` (dead, unknown) and unassigned ones are placed;
    partitions on live nodes stay unless their node holds more than
    ``ceil(quota)`` or another node needs them to reach ``floor(quota)``. The
    result does not depend on the iteration order of the inputs.
    """
    bounds = weighted_bounds(len(current), live_nodes, weights)
    owned: dict[int, list[int]] = {n: [] for n in bounds}
    orphans: list[int] = []
    for p in sorted(current):
        owner = current[p]
        if owner in owned:
            owned[owner].append(p)
        else:
            orphans.append(p)
    counts = {n: len(ps) for n, ps in owned.items()}

    # Target counts: as close to today's as the bounds allow (each partition a
    # node keeps is a move saved), then fixed up to sum to the partition count.
    # Clamping only ever raises nodes that will *receive* partitions to their
    # floor and lowers nodes that must *shed* to their ceiling, so a surplus can
    # only be cut from nodes keeping partitions (one unavoidable move each: cut
    # the fullest relative to quota), and a shortfall only given to receivers
    # (free: give it to the emptiest relative to quota).
    target = {n: min(max(counts[n], b.low), b.high) for n, b in bounds.items()}
    surplus = sum(target.values()) - len(current)
    while surplus > 0:
        n = min(
            (n for n in bounds if target[n] > bounds[n].low),
            key=lambda n: (-target[n] / bounds[n].quota, n),
        )
        target[n] -= 1
        surplus -= 1
    while surplus < 0:
        n = min(
            (n for n in bounds if target[n] < bounds[n].high),
            key=lambda n: (target[n] / bounds[n].quota, n),
        )
        target[n] += 1
        surplus += 1

    # Nodes above their target shed their highest-numbered partitions, so the
    # low-numbered ones stay put across repeated plans.
    pool = list(orphans)
    keep: dict[int, list[int]] = {}
    for n, ps in owned.items():
        keep[n] = ps[: target[n]]
        pool.extend(ps[target[n] :])
    pool.sort()
    deficit = {n: target[n] - len(keep[n]) for n in bounds}
    assignment = {p: n for n, ps in keep.items() for p in ps}
    moves = []
    for p in pool:
        # Fill the largest remaining gap first (ties: lowest node id) to spread the moves.
        n = min((n for n in bounds if deficit[n] > 0), key=lambda n: (-deficit[n], n))
        deficit[n] -= 1
        assignment[p] = n
        moves.append(Move(p, current[p], n))
    after = Counter(assignment.values())
    return AssignmentPlan(
        target=dict(sorted(assignment.items())),
        moves=moves,
        bounds=bounds,
        counts_before=counts,
        counts_after={n: after.get(n, 0) for n in bounds},
    )


def node_loads(current: Mapping[int, int], live_nodes: Iterable[int]) -> dict[int, int]:
    """Partitions held by each live node (live nodes holding nothing count 0)."""
    loads = dict.fromkeys(live_nodes, 0)
    for owner in current.values():
        if owner in loads:
            loads[owner] += 1
    return loads


def least_loaded_node(
    loads: Mapping[int, int],
    *,
    exclude: Collection[int] = (),
    weights: Mapping[int, float] | None = None,
) -> int | None:
    """The node in `loads` with the fewest partitions per unit of weight (ties: lowest id).

    None when every node is excluded (or has weight 0).
    """
    best: tuple[float, int] | None = None
    for node, load in loads.items():
        weight = float((weights or {}).get(node, 1.0))
        if node in exclude or weight <= 0:
            continue
        key = (load / weight, node)
        if best is None or key < best:
            best = key
    return None if best is None else best[1]


#: Progress states in which a node holds a warm copy of a partition it does not own.
WARM_STATES = frozenset({"standby", "warming"})


def warm_copies(views: Iterable[NodeView]) -> dict[int, dict[int, int]]:
    """partition -> {node: lag in events} of the live nodes reporting a warm copy of it."""
    warm: dict[int, dict[int, int]] = {}
    for view in views:
        if not view.alive:
            continue
        for p, progress in view.record.partitions.items():
            if progress.state in WARM_STATES and progress.lag is not None and progress.error is None:
                warm.setdefault(int(p), {})[view.record.node] = progress.lag
    return warm


def failover_target(
    loads: Mapping[int, int], *, warm: Mapping[int, int] | None = None, exclude: Collection[int] = ()
) -> int | None:
    """Where a partition goes when its owner died: the live node with the warmest copy, else the least loaded.

    A warm standby takes over by applying only the deltas it lacks instead of
    downloading the whole state. `loads` holds the live candidates.
    """
    candidates = [n for n in (warm or {}) if n in loads and n not in exclude]
    if candidates:
        return min(candidates, key=lambda n: ((warm or {})[n], loads[n], n))
    return least_loaded_node(loads, exclude=exclude)


def _participants(move: Move, live_nodes: Collection[int] | None) -> set[int]:
    # A dead or unassigned old owner does no work in a (forced) move, so it
    # does not use up one of its slots.
    nodes = {move.to_node}
    if move.from_node != UNASSIGNED and (live_nodes is None or move.from_node in live_nodes):
        nodes.add(move.from_node)
    return nodes


def schedule_waves(
    moves: Sequence[Move], max_per_node: int, *, live_nodes: Collection[int] | None = None
) -> list[list[Move]]:
    """Group `moves` into waves in which no node takes part in more than `max_per_node` moves.

    Greedy first fit in the given order, so the result is deterministic. With
    `live_nodes`, an old owner outside it (dead) does not count.
    """
    if max_per_node < 1:
        raise AssignmentError(f"max_per_node must be >= 1, got {max_per_node}")
    waves: list[list[Move]] = []
    usage: list[Counter[int]] = []
    for move in moves:
        nodes = _participants(move, live_nodes)
        for wave, used in zip(waves, usage, strict=True):
            if all(used[n] < max_per_node for n in nodes):
                wave.append(move)
                used.update(nodes)
                break
        else:
            waves.append([move])
            usage.append(Counter(nodes))
    return waves


# --- carrying moves out ----------------------------------------------------------


@dataclass(frozen=True)
class MoveOutcome(Generic[R]):
    """How one move went: its result, or the error that stopped it."""

    move: Move
    result: R | None
    error: BaseException | None
    duration_s: float

    @property
    def ok(self) -> bool:
        """True when the move finished without an error."""
        return self.error is None


def run_moves(
    moves: Sequence[Move],
    migrate: Callable[[Move], R],
    max_per_node: int,
    *,
    live_nodes: Collection[int] | None = None,
    max_workers: int = 8,
    on_done: Callable[[MoveOutcome[R]], None] | None = None,
) -> list[MoveOutcome[R]]:
    """Run `migrate(move)` for every move, concurrently, never with more than
    `max_per_node` moves at once on any node (old owner or new owner).

    A move starts as soon as all its nodes have a free slot (no wave barrier);
    among the moves that could start, the earliest in `moves` goes first. A
    failing move does not stop the others: every outcome is returned, in the
    order of `moves`. `on_done` is called (in this thread) as each move ends.
    """
    if max_per_node < 1:
        raise AssignmentError(f"max_per_node must be >= 1, got {max_per_node}")
    pending = list(enumerate(moves))
    busy: Counter[int] = Counter()
    outcomes: dict[int, MoveOutcome[R]] = {}

    def timed(move: Move) -> tuple[R, float]:
        started = time.monotonic()
        return migrate(move), started

    with ThreadPoolExecutor(max(1, max_workers), thread_name_prefix="laminar-move") as pool:
        running: dict[Future[tuple[R, float]], tuple[int, Move, set[int], float]] = {}
        while pending or running:
            for item in list(pending):
                if len(running) >= max_workers:
                    break
                i, move = item
                nodes = _participants(move, live_nodes)
                if all(busy[n] < max_per_node for n in nodes):
                    busy.update(nodes)
                    running[pool.submit(timed, move)] = (i, move, nodes, time.monotonic())
                    pending.remove(item)
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                i, move, nodes, submitted = running.pop(fut)
                busy.subtract(nodes)
                exc = fut.exception()
                if exc is None:
                    result, started = fut.result()
                    outcome = MoveOutcome(move, result, None, time.monotonic() - started)
                else:
                    outcome = MoveOutcome[R](move, None, exc, time.monotonic() - submitted)
                outcomes[i] = outcome
                if on_done is not None:
                    on_done(outcome)
    return [outcomes[i] for i in range(len(moves))]


# --- reading the ledger for the planner --------------------------------------------


def live_node_ids(ledger: Ledger, *, heartbeat_timeout_s: float | None = None) -> set[int]:
    """Member nodes that are alive: status alive and a heartbeat younger than the timeout.

    `heartbeat_timeout_s` overrides each node's own timeout (the failure sensor's setting).
    """
    live = set()
    for view in ledger.nodes():
        if heartbeat_timeout_s is None:
            alive = view.alive
        else:
            alive = view.record.status == NodeStatus.ALIVE and view.heartbeat_age_s <= heartbeat_timeout_s
        if alive:
            live.add(view.record.node)
    return live


def ownership_map(ledger: Ledger) -> dict[int, int]:
    """Partition -> current owner (0: unassigned) for every partition of the cluster."""
    return {
        int(p): (int(own.owner) if own is not None else UNASSIGNED)
        for p, own in ledger.ownerships(ledger.partitions()).items()
    }


# --- driving migrations (shared by the CLI and the Dagster ops) -----------------------


def record_failure(coordinator: MigrationCoordinator, partition: int, migration_id: str, error: BaseException) -> None:
    """Mark migration `migration_id` Failed so nodes stop working on it and a retry starts afresh.

    Decided by migration id, not by error type: skipped when the partition's
    record belongs to another migration (an epoch conflict with someone else's
    move) or the migration already ended; a conflict on its own record fails
    it. Never raises.
    """
    try:
        current = coordinator.current(PartitionId(partition))
        if current is None or current.migration_id != migration_id or current.is_terminal:
            return
        coordinator.fail(PartitionId(partition), migration_id, f"{type(error).__name__}: {error}")
    except (LedgerError, StoreError, OSError):
        pass  # best effort: the original error is what the caller reports


def drive(
    coordinator: MigrationCoordinator,
    task: MigrationTask,
    on_phase: Callable[[PhaseReport], None] | None = None,
    *,
    phases: Sequence[MigrationPhase] | None = None,
) -> MigrationTask:
    """Run the phases of `task` from its recorded phase on (or just `phases`).

    A phase already recorded is waited on, not repeated. On a migration error
    the task is recorded Failed (see `record_failure`) and the error re-raised.
    """
    seq = phase_sequence(task.migration_kind)
    if phases is None:
        start = seq.index(task.phase) if task.phase in seq else 0
        phases = seq[start:]
    try:
        for phase in phases:
            report = coordinator.run_phase(PartitionId(task.partition), task.migration_id, phase)
            if on_phase is not None:
                on_phase(report)
    except MigrationError as exc:
        record_failure(coordinator, task.partition, task.migration_id, exc)
        raise
    final = coordinator.current(PartitionId(task.partition))
    assert final is not None
    return final


def must_force(coordinator: MigrationCoordinator, partition: int, *, live: Collection[int] | None = None) -> bool:
    """True when moving `partition` cannot be graceful: nobody can drain and release it.

    That is when its owner is dead, has already released it (a graceful move
    that failed after the release), or is `stranded`. A forced move then fences
    the old epoch and restores from the last committed manifest.
    """
    own = coordinator.ledger.ownership(PartitionId(partition))
    if own is None or own.owner == UNASSIGNED:
        return False  # unassigned: `plan` makes it forced by itself; unknown: `plan` names the error
    live_set = set(live) if live is not None else live_node_ids(coordinator.ledger)
    return (
        own.owner not in live_set
        or own.status == PartitionStatus.RELEASED
        or stranded(coordinator.current(PartitionId(partition)), own.epoch, own.owner)
    )


def run_migration(
    coordinator: MigrationCoordinator,
    partition: int,
    to_node: int,
    *,
    forced: bool | None = None,
    on_phase: Callable[[PhaseReport], None] | None = None,
) -> MigrationTask:
    """`MigrationCoordinator.run` that also records a failed migration as Failed.

    `forced=None` decides with `must_force`; an unfinished migration of the
    partition to `to_node` is resumed whatever its kind.
    """
    if forced is None:
        forced = must_force(coordinator, partition)
    task = coordinator.plan_or_resume(PartitionId(partition), NodeId(to_node), forced=forced)
    return drive(coordinator, task, on_phase)


def stranded(task: MigrationTask | None, epoch: int, owner: int) -> bool:
    """True when `owner` holds `epoch` only through a migration that then failed or was cancelled.

    A forced migration fences (grants the new epoch to its target) before the
    target restores; if it ends without becoming active after that, the ledger
    names a live owner that never started. Such a partition still needs a failover.
    """
    return (
        task is not None
        and task.phase in (MigrationPhase.FAILED, MigrationPhase.CANCELLED)
        and task.to_node == owner
        and task.to_epoch == epoch
        and owner != UNASSIGNED
    )


@dataclass
class NoFailoverTarget(MigrationError, UnavailableError):
    """No live node other than the current owner can take the partition."""

    partition: int
    owner: int

    def __str__(self) -> str:
        return f"no live node other than node {self.owner} can take partition {self.partition}"


@dataclass(frozen=True)
class FailoverDecision:
    """What `prepare_failover` decided, for logs and op metadata."""

    task: MigrationTask | None
    reason: str
    superseded: list[str] = field(default_factory=list)


def prepare_failover(
    coordinator: MigrationCoordinator,
    partition: int,
    to_node: int | None = None,
    *,
    live: Collection[int] | None = None,
    loads: Mapping[int, int] | None = None,
    allow_live_owner: bool = False,
) -> FailoverDecision:
    """Plan (or resume) the forced migration that takes `partition` away from a dead owner.

    * An in-flight forced migration to a live node, or a graceful one already
      in its rising phases towards a live node, is resumed: it needs no help.
    * An in-flight migration that depends on a dead node is recorded Failed
      ("superseded") and replaced.
    * When the current owner is alive there is nothing to fail over: the
      decision carries no task, unless `allow_live_owner` (an operator fencing
      a stalled but heartbeating node) or the owner is `stranded` (it got its
      epoch from a forced migration that failed before it became active).
    * The target is `to_node`, else the least-loaded live node.

    Raises NoLiveNode when `to_node` is not alive, NoFailoverTarget when no
    live node other than the owner is left.
    """
    p = PartitionId(partition)
    ledger = coordinator.ledger
    live_set = set(live) if live is not None else live_node_ids(ledger)
    own = ledger.ownership(p)
    if own is None:
        raise MigrationNotOwned(p, UNASSIGNED)
    superseded = []
    coordinator.expire_overdue(p)  # a record past its deadline never blocks a failover
    running = coordinator.current(p)
    if running is not None and not running.is_terminal:
        rising = GRACEFUL_PHASES.index(running.phase) >= GRACEFUL_PHASES.index(MigrationPhase.DOWNLOADING)
        # Needs no old owner any more: a forced move, or a graceful one past the release.
        resumable = running.to_node in live_set and (running.migration_kind == MigrationKind.FORCED or rising)
        if resumable:
            if to_node is None or to_node == running.to_node:
                return FailoverDecision(running, f"resuming migration {running.migration_id} to node {running.to_node}")
            raise MigrationEpochConflict(p, own.epoch, running.from_epoch, running.migration_id)
        if running.from_node in live_set and running.to_node in live_set:
            # A healthy graceful move still needing its (live) old owner: leave it alone.
            if allow_live_owner:
                raise MigrationEpochConflict(p, own.epoch, running.from_epoch, running.migration_id)
            return FailoverDecision(None, f"graceful migration {running.migration_id} between live nodes is in flight")
        dead = sorted({running.from_node, running.to_node} - live_set - {UNASSIGNED})
        coordinator.fail(p, running.migration_id, f"superseded by a failover: node(s) {dead} not alive")
        superseded.append(running.migration_id)
    latest = coordinator.current(p)
    is_stranded = stranded(latest, own.epoch, own.owner)
    if own.owner in live_set and not allow_live_owner and not is_stranded:
        return FailoverDecision(None, f"owner node {own.owner} is alive: nothing to fail over", superseded)
    target = to_node
    if target is None:
        candidates = dict(loads) if loads is not None else node_loads(ownership_map(ledger), live_set)
        candidates = {n: c for n, c in candidates.items() if n in live_set}
        warm = warm_copies(ledger.nodes()).get(int(p))
        target = failover_target(candidates, warm=warm, exclude={own.owner})
        if target is None and is_stranded and own.owner in live_set:
            target = own.owner  # the only live node: grant it a fresh epoch and let it restore again
        if target is None:
            raise NoFailoverTarget(partition, own.owner)
    if target == own.owner and not is_stranded:
        raise NoFailoverTarget(partition, own.owner)
    if target not in live_set:
        raise NoLiveNode(NodeId(target))
    task = coordinator.plan(p, NodeId(target), forced=True)
    reason = f"forced migration {task.migration_id}: node {own.owner} -> {target}"
    return FailoverDecision(task, reason, superseded)
