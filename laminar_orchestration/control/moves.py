"""Carrying moves out: migrations driven phase by phase, many at once within per-node limits.

Everything here drives `MigrationCoordinator`s; the `laminar` CLI, the Dagster jobs and sensors,
the demo and the chaos suite share it, so all of them honour the per-node concurrency limit and
record failures the same way. Nothing here imports Dagster. What to move is decided by `control.placement`
(pure), `control.operations` (a rebalance, a node's failover), `control.dead_owners` (dead owners' failovers)
and `control.failover` (whether one partition needs a failover, and to where).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.failover import stranded
from laminar_orchestration.control.placement import AssignmentError, Move, move_participants
from laminar_orchestration.errors import LaminarError
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol import migration_errors, tasks
from laminar_orchestration.protocol.desired_states import DesiredState
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.membership import NodeView
from laminar_orchestration.protocol.records import LedgerError, PartitionStatus
from laminar_orchestration.protocol.tasks import (
    MigrationPhase,
    MigrationTask,
    PhaseReport,
    deadline_passed,
    phase_sequence,
)
from laminar_orchestration.store import StoreError

R = TypeVar("R")
_RELEASED = PartitionStatus.RELEASED

__all__ = [
    "DeadlineDrive",
    "MoveOutcome",
    "MovePlan",
    "drive",
    "drive_with_deadline",
    "must_force",
    "plan_move",
    "record_failure",
    "reinstate_all",
    "run_migration",
    "run_moves",
]


#: The most moves one process drives at once: each is a thread that mostly waits on the store.
MAX_MOVE_THREADS = 64


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
    max_workers: int | None = None,
    on_done: Callable[[MoveOutcome[R]], None] | None = None,
) -> list[MoveOutcome[R]]:
    """Run `migrate(move)` for every move, concurrently, never with more than `max_per_node` moves at
    once on any node (old owner or new owner), nor more than `max_workers` in all (default: as many
    as the per-node limit allows, up to `MAX_MOVE_THREADS`).

    A move starts as soon as all its nodes have a free slot (no wave barrier); among the moves that
    could start, the earliest in `moves` goes first. A failing move does not stop the others: every
    outcome is returned, in the order of `moves`. `on_done` is called (in this thread) as each ends.
    """
    if max_per_node < 1:
        raise AssignmentError(f"max_per_node must be >= 1, got {max_per_node}")
    pending = list(enumerate(moves))
    if max_workers is None:
        nodes = {n for m in moves for n in move_participants(m, live_nodes)}
        max_workers = min(MAX_MOVE_THREADS, max_per_node * max(1, len(nodes)))
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
                nodes = move_participants(move, live_nodes)
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


def record_failure(
    coordinator: MigrationCoordinator, partition: int, migration_id: str, exc: BaseException, *, grant_back: bool = True
) -> None:
    """Mark migration `migration_id` Failed so nodes stop working on it and a retry starts afresh.

    Decided by migration id, not by error type: skipped when the partition's record belongs to another
    migration (an epoch conflict with someone else's move) or the migration already ended; a conflict on
    its own record fails it. `grant_back` as for `MigrationCoordinator.cancel`. Never raises.
    """
    try:
        current = coordinator.current(PartitionId(partition))
        if current is None or current.migration_id != migration_id or current.is_terminal:
            return
        coordinator.fail(PartitionId(partition), migration_id, f"{type(exc).__name__}: {exc}")
        if grant_back:  # a graceful move that failed after the release: the old owner gets it back
            coordinator.reinstate(PartitionId(partition))
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

    A phase already recorded is waited on, not repeated. On a migration error the task is recorded
    Failed (see `record_failure`) and the error re-raised.
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
    except tasks.MigrationError as exc:
        record_failure(coordinator, task.partition, task.migration_id, exc)
        raise
    final = coordinator.outcome(PartitionId(task.partition), task.migration_id)
    assert final is not None
    return final


@dataclass(frozen=True)
class DeadlineDrive:
    """How far `drive_with_deadline` got: the phases it ran, and what stopped it before the end."""

    task: MigrationTask
    reports: tuple[PhaseReport, ...] = ()
    #: The phase the deadline passed before (not started), if that is what stopped the drive.
    out_of_time_before: MigrationPhase | None = None
    #: The error that stopped the drive, if any.
    error: LaminarError | None = None

    @property
    def finished(self) -> bool:
        """True when every phase ran: the migration is complete."""
        return self.out_of_time_before is None and self.error is None


def drive_with_deadline(
    coordinator: MigrationCoordinator,
    task: MigrationTask,
    deadline: float,
    *,
    always: Collection[MigrationPhase] = (),
    grant_back: bool = True,
) -> DeadlineDrive:
    """`drive` `task` from its recorded phase on until it is complete or `deadline` (`time.monotonic()`) passes.

    For a driver with a budget (the failure sensor) that leaves what it did not finish to another (a
    run with the migration's own limits): each wait for a node lasts at most the time left, no phase
    starts after the deadline except those in `always` (phases that wait on no node, such as a forced
    move's fence), and errors are returned, not raised. A timeout leaves the record as it is, for the
    next driver to resume; any other migration error is recorded Failed (`record_failure`, with `grant_back`).
    """
    seq = phase_sequence(task.migration_kind)
    start = seq.index(task.phase) if task.phase in seq else 0
    reports: list[PhaseReport] = []
    limits = coordinator.config
    for phase in seq[start:]:
        left = deadline - time.monotonic()
        if left <= 0 and phase not in always:
            return DeadlineDrive(task, tuple(reports), out_of_time_before=phase)
        bounded = coordinator.with_config(
            limits.model_copy(
                update={
                    "release_wait_timeout_s": max(0.01, min(left, limits.release_wait_timeout_s)),
                    "checkpoint_transfer_timeout_s": max(0.01, min(left, limits.checkpoint_transfer_timeout_s)),
                }
            ),
        )
        try:
            reports.append(bounded.run_phase(PartitionId(task.partition), task.migration_id, phase))
        except migration_errors.MigrationTimeout as exc:
            return DeadlineDrive(task, tuple(reports), error=exc)
        except tasks.MigrationError as exc:
            record_failure(coordinator, task.partition, task.migration_id, exc, grant_back=grant_back)
            return DeadlineDrive(task, tuple(reports), error=exc)
        except LaminarError as exc:
            return DeadlineDrive(task, tuple(reports), error=exc)
    return DeadlineDrive(task, tuple(reports))


@dataclass(frozen=True)
class MovePlan:
    """What `plan_move` decided about moving a partition to a node."""

    #: The migration planned or resumed (phase Planned not yet run); None when nothing is to be done.
    task: MigrationTask | None
    #: Why nothing is to be done (or what was planned), for logs.
    reason: str
    #: An unfinished migration to another node, in the way: nothing was planned.
    blocked_by: MigrationTask | None = None
    #: A migration past its deadline that was recorded Failed on the way.
    expired: MigrationTask | None = None

    @property
    def resumed(self) -> bool:
        """True when the migration was already in flight (past Planned) and is resumed."""
        return self.task is not None and self.task.phase != MigrationPhase.PLANNED


def plan_move(coordinator: MigrationCoordinator, partition: int, to_node: int) -> MovePlan:
    """Plan the move of `partition` to `to_node`, or resume the one in flight to it.

    * A record past its deadline is recorded Failed first (`expired`).
    * Nothing is planned when no migration is in flight and the partition is already on `to_node`
      (not `stranded` there), nor when an unfinished migration to another node is in the way (`blocked_by`).
    * The move is forced when nobody can drain the partition (`must_force`).

    Raises what `MigrationCoordinator.plan_or_resume` raises (NoLiveNode, ...).
    """
    p = PartitionId(partition)
    # One read of each record for the whole decision: every write below is a compare-and-swap anyway.
    read = coordinator.desired.read(p)
    expired = coordinator.expire_overdue(p, read[0])
    if expired is not None:
        read = coordinator.desired.read(p)
    running = read[0].migration
    own = coordinator.ledger.ownership(p)
    idle = running is None or running.is_terminal
    if idle and own is not None and own.owner == to_node and not stranded(read[0], own):
        reason = f"partition {p} is already on node {to_node} (epoch {own.epoch}): nothing to do"
        return MovePlan(None, reason, expired=expired)
    if running is not None and not idle and running.to_node != to_node:
        reason = (
            f"migration {running.migration_id} to node {running.to_node} is in flight (phase {running.phase}); "
            "wait for it to end or cancel it"
        )
        return MovePlan(None, reason, blocked_by=running, expired=expired)
    if not idle:
        assert running is not None
        task = running  # the unfinished move to `to_node`: resumed whatever its kind
    else:
        forced = must_force(coordinator, partition, own=own, state=read[0])
        task = coordinator.plan(p, NodeId(to_node), forced=forced, read=read, own=own)
    verb = "resuming" if task.phase != MigrationPhase.PLANNED else "planned"
    reason = f"{verb} {task.migration_kind} migration {task.migration_id} to node {to_node}"
    return MovePlan(task, reason, expired=expired)


def reinstate_all(
    coordinator: MigrationCoordinator,
    partitions: Collection[PartitionId] | None = None,
    *,
    owners: Mapping[PartitionId, Ownership | None] | None = None,
    states: Mapping[PartitionId, DesiredState] | None = None,
) -> dict[int, int]:
    """Admit newly registered nodes, then grant every released (or unassigned) partition (of
    `partitions`; None: of the cluster) back to its live desired owner: partition -> epoch.

    The control plane's periodic step (the failure sensor, `laminar rebalance`): a node writes only its
    own records, so joining the member set is done here, and a node that shut down cleanly released its
    partitions, which only the control plane can grant again: this is how a restarted node gets them
    back. `owners`, `states`: those partitions' records as the caller just read them (else read here).
    """
    granted: dict[int, int] = {}
    ledger = coordinator.ledger
    # A node learns what is asked of it from its assignment record: each node gets one (empty) as
    # it joins, so an idle node reads one record per poll even before anything names it.
    for node in ledger.members.admit_nodes():
        coordinator.desired.ensure_assignment(node)
    looked_at = ledger.partitions() if partitions is None else sorted(partitions)
    owners = owners if owners is not None else ledger.ownerships(looked_at)
    # Held partitions have nothing to grant: only the others' desired states are read, all at once.
    waiting = [p for p in looked_at if (o := owners.get(p)) and (o.owner == UNASSIGNED or o.status == _RELEASED)]
    states = states if states is not None else {p: s for p, (s, _) in coordinator.desired.read_many(waiting).items()}
    for p in waiting:
        task, lagged = states[p].migration, bool((own := owners[p]) and own.head_lagged)
        idle = task is None or task.is_terminal or deadline_passed(task)  # `reinstate` fails an overdue move
        if not lagged and (states[p].owner == UNASSIGNED or not idle):
            continue  # never placed, or a move decides: no second read of both records, one partition at a time
        epoch = coordinator.reinstate(p)
        if epoch is not None:
            granted[int(p)] = epoch
    return granted


def must_force(
    coordinator: MigrationCoordinator,
    partition: int,
    *,
    live: Collection[int] | None = None,
    own: Ownership | None = None,
    state: DesiredState | None = None,
) -> bool:
    """True when moving `partition` cannot be graceful: nobody can drain and release it.

    That is when its owner is dead, has already released it (a graceful move that failed after the
    release), or is `stranded`. A forced move then fences the old epoch and restores from the last
    committed manifest. `own` and `state`: the ownership and desired state, if the caller just read them.
    """
    own = own or coordinator.ledger.ownership(PartitionId(partition))
    if own is None or own.owner == UNASSIGNED:
        return False  # unassigned: `plan` makes it forced by itself; unknown: `plan` names the error
    if live is not None:
        owner_alive = own.owner in set(live)
    else:  # only the owner's record: no look at every node
        record = coordinator.ledger.members.node(NodeId(own.owner))
        owner_alive = record is not None and NodeView.judge(record).alive
    return (
        not owner_alive
        or own.status == PartitionStatus.RELEASED
        or stranded(state or coordinator.desired.read(PartitionId(partition))[0], own)
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

    `forced=None` decides with `must_force`; an unfinished migration of the partition to `to_node` is
    resumed whatever its kind.
    """
    if forced is None:
        forced = must_force(coordinator, partition)
    task = coordinator.plan_or_resume(PartitionId(partition), NodeId(to_node), forced=forced)
    return drive(coordinator, task, on_phase)
