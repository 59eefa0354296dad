"""A node's graceful leave and its return: planned moves instead of a failure timeout.

Asked to stop (SIGTERM: a Kubernetes pod's preStop, a rolling restart), a node
moves every partition it owns to the live nodes as ordinary graceful
migrations - drain → ... → active elsewhere, each recorded as a migration by a
`MigrationCoordinator`, as `laminar migrate` would - and only then stops. Its
partitions never wait for a heartbeat to lapse. What the drain could not move
by the deadline (`LeaveSettings.deadline_s`) or a second signal is cancelled
where that is still safe and released by the node's own stop, as a node with
no live peer releases everything: released, never lost.

Back up, a node takes its share again (`rejoin`): the partitions released to
it are granted back, then the rebalance plan's moves towards it - sticky and
bounded: only what balance needs, from live owners - are carried out.

The moves are control-plane writes (desired states, grants): the node's process
needs the control plane's store permissions for them (see docs/deploy.md); a
node without them logs the refusal and falls back to releasing. Nothing here
imports the data plane: the node is reached through `LeavingNode`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import drive_with_deadline, plan_move, reinstate_all
from laminar_orchestration.control.operations import (
    assigned_partitions,
    failover_candidates,
    plan_rebalance,
    run_rebalance,
)
from laminar_orchestration.control.placement import Move, failover_target
from laminar_orchestration.control.snapshot import live_node_ids, warm_copies
from laminar_orchestration.errors import LaminarError
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.membership import NodeHandle
from laminar_orchestration.protocol.migration_errors import CancelRefused
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.protocol.tasks import MigrationConfig, seconds_left
from laminar_orchestration.store import StoreError

__all__ = [
    "DEFAULT_LEAVE_DEADLINE_S",
    "GracefulLeave",
    "LeaveOutcome",
    "LeaveSettings",
    "LeavingNode",
    "RejoinOutcome",
    "attach",
    "leave_pace",
    "plan_leave",
    "rejoin",
    "rejoin_when_registered",
]

log = logging.getLogger("laminar.leave")

#: Below Kubernetes' default 30 s grace period: the release, the last table sync and the exit fit after it.
DEFAULT_LEAVE_DEADLINE_S = 20.0


class LeaveSettings(BaseModel):
    """How a node leaves and comes back (`laminar node run --leave-deadline`, `--no-rejoin`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Seconds from the first signal after which the drain ends: what is not moved by then is released.
    deadline_s: float = Field(default=DEFAULT_LEAVE_DEADLINE_S, gt=0)
    #: At most this many moves away from the leaving node at once; fewer while the deadline allows
    #: them one after another (`leave_pace`).
    max_concurrent: int = Field(default=4, ge=1)
    #: Take this node's share back when it starts (`rejoin`).
    rejoin: bool = True
    #: The moves' timeouts; their waits are also cut to the deadline. A leaving node is on a clock: a
    #: move waits at most 2 s for its target's warm copy before the drain (a cold target restores more).
    migration: MigrationConfig = Field(default_factory=lambda: MigrationConfig(warmup_timeout_s=2.0))
    #: The moves of a node's return: not on a clock, so each waits for the returning node's warm copy
    #: as any planned move does (a cold copy would restore while the partition waits).
    rejoin_migration: MigrationConfig = Field(default_factory=MigrationConfig)


class LeavingNode(Protocol):
    """What a leave reads and sets on a node (`dataplane.node.Node`)."""

    ledger: Ledger
    leaving: threading.Event
    on_leave: Callable[[], None] | None
    handle: NodeHandle | None

    @property
    def id(self) -> NodeId: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class LeaveOutcome:
    """How a leave went: the moves planned, which ended Active elsewhere, and why the drain ended."""

    node: int
    moves: tuple[Move, ...]
    moved: tuple[int, ...]
    #: partition -> why it was not moved (it is released by the node's stop, or its move finishes alone).
    left_behind: dict[int, str] = field(default_factory=dict)
    #: "moved", "no live peer", "deadline", "second signal", "not registered".
    ended_by: str = "moved"
    duration_s: float = 0.0


@dataclass(frozen=True)
class RejoinOutcome:
    """What a returning node took back: partitions granted back to it, and the moves towards it."""

    node: int
    granted_back: dict[int, int]
    moves: tuple[Move, ...]
    failed: dict[int, str] = field(default_factory=dict)


def plan_leave(ledger: Ledger, node: int) -> tuple[Move, ...]:
    """One graceful move per partition `node` holds (not released), to the live nodes but `node`: the
    warmest copy, else the least-loaded node, counting the moves planned here. Empty when no other
    node is alive (the node then releases, as it always did)."""
    live = live_node_ids(ledger) - {node}
    if not live:
        return ()
    owners = ledger.ownerships(sorted(failover_candidates(ledger, node)))
    held = sorted(
        int(p)
        for p, own in owners.items()
        if own is not None and own.owner == node and own.status != PartitionStatus.RELEASED
    )
    loads = {n: len(named) for n, named in assigned_partitions(ledger, live).items()}
    warm = warm_copies(ledger.members.nodes())
    moves = []
    for p in held:
        target = failover_target(loads, warm=warm.get(p))
        if target is None:
            break
        loads[target] += 1
        moves.append(Move(p, node, target))
    return tuple(moves)


class GracefulLeave:
    """A node's leave: the first signal starts it, a second one (or the deadline) ends the drain.

    `install` makes the node call `request` at each SIGTERM/SIGINT instead of stopping at once.
    The leave runs on a thread of its own and stops the node when it ends; the node's stop then
    releases whatever it still holds. `outcome` is set once the drain ended.
    """

    def __init__(self, node: LeavingNode, settings: LeaveSettings | None = None) -> None:
        self.node = node
        self.settings = settings or LeaveSettings()
        self.outcome: LeaveOutcome | None = None
        self._signals = 0
        self._abort = threading.Event()
        self._thread: threading.Thread | None = None

    def install(self) -> None:
        """Route the node's stop signals here."""
        self.node.on_leave = self.request

    def request(self) -> None:
        """A stop signal: the first starts the leave, the next ends its drain now. Never blocks (a
        signal handler calls it)."""
        self._signals += 1
        if self._signals == 1:
            self._thread = threading.Thread(target=self._run, name="graceful-leave", daemon=True)
            self._thread.start()
        else:
            log.info("node %s: second stop signal: ending the drain now", self.node.id)
            self._abort.set()

    def _run(self) -> None:
        try:
            self.outcome = self.leave()
        except Exception:
            log.exception("node %s: graceful leave failed; releasing instead", self.node.id)
        finally:
            self.node.stop()

    def leave(self) -> LeaveOutcome:
        """Move every partition away (bounded by the deadline and a second signal), then return."""
        started = time.monotonic()
        deadline = started + self.settings.deadline_s
        node = int(self.node.id)
        self.node.leaving.set()
        if self.node.handle is None:
            return LeaveOutcome(node, (), (), ended_by="not registered")
        try:
            moves = plan_leave(self.node.ledger, node)
        except (LaminarError, StoreError) as exc:
            log.warning("node %s: could not plan its leave (%s): releasing its partitions", node, exc)
            return LeaveOutcome(node, (), (), ended_by=f"no plan: {exc}")
        if not moves:
            log.info("node %s: no live peer to take its partitions: releasing them", node)
            return LeaveOutcome(node, (), (), ended_by="no live peer", duration_s=time.monotonic() - started)
        log.info("node %s: leaving: %s", node, ", ".join(f"p{m.partition} -> node {m.to_node}" for m in moves))
        results: dict[int, str | None] = {}
        done = threading.Event()
        lock = threading.Lock()
        pending = list(moves)
        running: dict[int, float] = {}  # partition -> when its move started
        took: list[float] = []

        def one(move: Move) -> None:
            try:
                result = self._move(move, deadline)
            except Exception as exc:  # the stop releases the partition: never lost
                log.exception("node %s: the move of partition %s failed", node, move.partition)
                result = f"{type(exc).__name__}: {exc}"
            with lock:
                took.append(time.monotonic() - running.pop(move.partition))
                results[move.partition] = result
                if len(results) == len(moves):
                    done.set()

        while True:
            with lock:
                now = time.monotonic()
                # The pace from what the moves took so far (or are taking): a slow store slows it.
                move_s = max([sum(took) / len(took) if took else EXPECTED_MOVE_S] + [now - t for t in running.values()])
                allowed = leave_pace(len(pending) + len(running), move_s, deadline - now, self.settings.max_concurrent)
                while pending and len(running) < allowed:
                    move = pending.pop(0)
                    running[move.partition] = now
                    # Daemon threads: a second signal stops waiting for them, and the process may exit under them.
                    threading.Thread(target=one, args=(move,), name=f"leave-p{move.partition}", daemon=True).start()
            if done.wait(0.05) or self._abort.is_set() or time.monotonic() >= deadline:
                break
        ended_by = "moved" if done.is_set() else ("second signal" if self._abort.is_set() else "deadline")
        not_started = {m.partition for m in pending}
        left = {
            m.partition: results.get(m.partition) or ("not started" if m.partition in not_started else "still moving")
            for m in moves
        }
        left = {p: why for p, why in left.items() if why != _ACTIVE}
        # The cancels run at once and get at most CANCEL_BUDGET_S: on a slow store the grace period
        # must still hold the release (a move not cancelled is released all the same, or finishes).
        cancels = [threading.Thread(target=self._cancel, args=(p, left), daemon=True) for p in left]
        for thread in cancels:
            thread.start()
        budget_ends = time.monotonic() + CANCEL_BUDGET_S
        for thread in cancels:
            thread.join(max(0.0, budget_ends - time.monotonic()))
        moved = tuple(m.partition for m in moves if m.partition not in left)
        outcome = LeaveOutcome(node, moves, moved, left, ended_by, time.monotonic() - started)
        log.info(
            "node %s: leave ended (%s) after %.1fs: moved %s%s",
            node,
            ended_by,
            outcome.duration_s,
            list(moved),
            f", releasing {sorted(left)} ({'; '.join(f'p{p}: {w}' for p, w in sorted(left.items()))})" if left else "",
        )
        return outcome

    def _move(self, move: Move, deadline: float) -> str:
        """Drive one graceful move until Active or the deadline; `_ACTIVE`, or why it did not finish."""
        coordinator = MigrationCoordinator(self.node.ledger, self.settings.migration)
        try:
            planned = plan_move(coordinator, move.partition, move.to_node)
            if planned.task is None:
                return planned.reason
            # A move that fails is not granted back here: this node stops next (as for `_cancel`).
            driven = drive_with_deadline(coordinator, planned.task, deadline, grant_back=False)
        except (LaminarError, StoreError) as exc:
            return f"{type(exc).__name__}: {exc}"
        if driven.finished:
            return _ACTIVE
        if driven.error is not None:
            return f"{type(driven.error).__name__}: {driven.error}"
        return f"the deadline passed before {driven.out_of_time_before}"

    def _cancel(self, partition: int, left: dict[int, str]) -> None:
        """Cancel the partition's unfinished move where that is still safe (before its new owner
        seeks), so the node's stop releases it; a move past that point finishes on its own. Notes
        the result in `left`."""
        coordinator = MigrationCoordinator(self.node.ledger, self.settings.migration)
        try:
            # Not granted back to this node: it stops next, and its stop releases only what it runs.
            coordinator.cancel_current(PartitionId(partition), grant_back=False)
        except CancelRefused:
            # Past the point of no return, the new owner waits for its grant and nobody else drives the
            # move: finish it within the cancels' budget rather than leave the partition waiting.
            left[partition] += "; " + self._finish(coordinator, PartitionId(partition))
            return
        except (LaminarError, StoreError) as exc:
            left[partition] += f"; not cancelled ({type(exc).__name__})"
            return
        left[partition] += "; cancelled"

    def _finish(self, coordinator: MigrationCoordinator, partition: PartitionId) -> str:
        """Drive `partition`'s move, past its cancel point, to Active within `CANCEL_BUDGET_S`; what happened."""
        try:
            task = coordinator.current(partition)
            if task is None or task.is_terminal:
                return "finished elsewhere"
            driven = drive_with_deadline(coordinator, task, time.monotonic() + CANCEL_BUDGET_S, grant_back=False)
        except (LaminarError, StoreError) as exc:
            return f"not finished ({type(exc).__name__})"
        return "finished" if driven.finished else "not finished in time"


def leave_pace(remaining: int, move_s: float, time_left_s: float, max_concurrent: int) -> int:
    """How many of a leave's `remaining` moves to run at once, each expected to take `move_s`.

    One after another while they fit in a third of the time left: each partition then pauses only for
    its own move, not for the leaving node's drains and uploads of the others at the same time. More,
    up to `max_concurrent`, when one after another would not finish well before the deadline (a move
    cut there after its release waits for the next driver).
    """
    if remaining <= 0:
        return 0
    budget = max(time_left_s / 3, 1e-3)
    return max(1, min(max_concurrent, remaining, math.ceil(remaining * move_s / budget)))


#: What a leave's move is expected to take before one has finished: a planned move on a slow store.
EXPECTED_MOVE_S = 3.0
#: How long the end of a drain waits for the cancels of the moves it did not finish.
CANCEL_BUDGET_S = 2.0
#: What `GracefulLeave._move` returns for a move that ended Active.
_ACTIVE = "active"


def rejoin(ledger: Ledger, node: int, config: MigrationConfig | None = None) -> RejoinOutcome:
    """A node that just registered takes its share back.

    Admits registered nodes to the member set and grants back the released partitions whose desired
    owner is `node` (`reinstate_all`), then carries out the rebalance plan's moves towards `node`
    from live owners: sticky (only what balance needs) and bounded by the per-node limit. Partitions
    of dead owners are left to the failure sensor.
    """
    settings = config or MigrationConfig()
    coordinator = MigrationCoordinator(ledger, settings)
    mine = assigned_partitions(ledger, [node])[node]
    granted = reinstate_all(coordinator, mine)
    plan = plan_rebalance(ledger)
    moves = tuple(m for m in plan.moves if m.to_node == node and m.from_node in plan.live_nodes)
    outcomes = run_rebalance(ledger, plan, settings, reason=f"node {node} joined", moves=moves)
    failed = {o.move.partition: f"{type(o.error).__name__}: {o.error}" for o in outcomes if o.error is not None}
    return RejoinOutcome(node, granted, moves, failed)


def reinstate_after_cut_moves(ledger: Ledger, node: int, stop: threading.Event) -> dict[int, int]:
    """Grant back the partitions desired on `node` that wait on a move away from it still in flight:
    its previous process's leave drove that move and exited first (a slow store ate the time to cancel
    it). Waits until the latest such move is past its deadline (or `stop` is set), then grants back
    through `reinstate_all`, which fails those records first. Partition -> epoch granted."""
    coordinator = MigrationCoordinator(ledger)
    # The assignment carries a copy of each state in a move: one read, not one per partition.
    assignment, _ = coordinator.desired.assignment(NodeId(node))
    moving = [s.migration for s in (assignment.states.values() if assignment else ()) if s.migration is not None]
    cut = [t for t in moving if not t.is_terminal and t.from_node == node]
    if not cut or stop.wait(max(0.0, max(seconds_left(t) for t in cut)) + CUT_MOVE_SLACK_S):
        return {}
    return reinstate_all(coordinator, [PartitionId(t.partition) for t in cut])


#: After a cut move's deadline, the clocks of the nodes that wrote and read it may differ this much.
CUT_MOVE_SLACK_S = 1.0


def rejoin_when_registered(node: LeavingNode, settings: LeaveSettings, *, poll_s: float = 0.1) -> threading.Thread:
    """Start a thread that waits for `node` to register, then `rejoin`s it (unless it is leaving by then)."""

    def run() -> None:
        while node.handle is None:
            if node.leaving.wait(poll_s):
                return
        try:
            outcome = rejoin(node.ledger, int(node.id), settings.rejoin_migration)
        except (LaminarError, StoreError) as exc:
            log.warning("node %s: could not take its share back (%s): the next rebalance will", node.id, exc)
            return
        if outcome.granted_back or outcome.moves:
            log.info(
                "node %s: rejoined: granted back %s, moved here %s%s",
                node.id,
                sorted(outcome.granted_back),
                [m.partition for m in outcome.moves],
                f", failed {outcome.failed}" if outcome.failed else "",
            )
        try:
            late = reinstate_after_cut_moves(node.ledger, int(node.id), node.leaving)
        except (LaminarError, StoreError) as exc:
            log.warning("node %s: could not take back what its last leave left moving (%s)", node.id, exc)
            return
        if late:
            log.info("node %s: granted back %s once the moves its last leave left were overdue", node.id, sorted(late))

    thread = threading.Thread(target=run, name="rejoin", daemon=True)
    thread.start()
    return thread


def attach(node: LeavingNode, settings: LeaveSettings | None = None) -> GracefulLeave:
    """Give `node` a graceful leave at its stop signals and, with `settings.rejoin`, its share back
    once it registered. Call before `node.run()`."""
    settings = settings or LeaveSettings()
    leave = GracefulLeave(node, settings)
    leave.install()
    if settings.rejoin:
        rejoin_when_registered(node, settings)
    return leave
