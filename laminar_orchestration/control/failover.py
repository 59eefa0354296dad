"""The failover decision for one partition: whether it needs taking away from its owner (a dead or
stranded owner), and the forced move that does it.

An owner is `stranded` when it holds an epoch nobody will run there; a move in flight that no longer
needs the old owner is left to finish (`moves_on_without_old_owner`). `prepare_failover` plans (or
resumes) the forced move; carrying it out is `control.moves`'s. Callers: `control.operations` (a
node's failover), `control.dead_owners` (the control plane's periodic look) and `control.retry`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.placement import failover_target, node_loads
from laminar_orchestration.control.snapshot import live_node_ids, ownership_map, warm_copies
from laminar_orchestration.errors import UnavailableError
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol import migration_errors, tasks
from laminar_orchestration.protocol.desired_states import DesiredState
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.protocol.tasks import MigrationKind, MigrationPhase, MigrationTask

__all__ = [
    "FailoverDecision",
    "NoFailoverTarget",
    "moves_on_without_old_owner",
    "not_admitted_nodes",
    "prepare_failover",
    "stranded",
]


def moves_on_without_old_owner(task: MigrationTask | None, live: Collection[int]) -> bool:
    """True when `task` is a move in flight that needs nothing more from the old owner, towards a
    live node: a forced move, or a graceful one past the release. A failover leaves it to finish."""
    if task is None or task.is_terminal or task.to_node not in live:
        return False
    return task.migration_kind == MigrationKind.FORCED or task.phase.reached(MigrationPhase.DOWNLOADING)


def stranded(state: DesiredState, own: Ownership) -> bool:
    """True when the ledger's owner holds its epoch but nobody will run the partition there.

    * The last migration ended without becoming active and its target holds the epoch it was to
      mint: a forced migration fences (grants the new epoch to its target) before the target restores.
    * No migration is in flight and the owner is not the desired owner: a node runs only the
      partitions desired for it, so nothing else ever moves it. That follows a grant that outlived its
      migration (a driver that fenced after the move was ended, found by later moves or not),
      whichever moves ended since.

    Such a partition still needs a failover. A released partition is not stranded: the
    control plane grants it back (`MigrationCoordinator.reinstate`).
    """
    task = state.migration
    if own.owner == UNASSIGNED or own.status == PartitionStatus.RELEASED:
        return False
    if task is None or not task.is_terminal:
        # No move ever recorded (nothing says where it should run), or one in flight that decides.
        return False
    if task.phase.is_aborted and (task.to_node, task.to_epoch) == (own.owner, own.epoch):
        return True
    return state.owner != own.owner


class NoFailoverTarget(tasks.MigrationError, UnavailableError):
    """No live node other than the current owner can receive the partition: what is missing is a
    target, not the owner (which is usually dead, the reason for the failover)."""

    partition: int
    owner: int
    #: Nodes that registered but are not members yet (the control plane has not admitted them).
    not_admitted: tuple[int, ...] = ()

    def _message(self) -> str:
        missing = f"no live node other than node {self.owner} can receive partition {self.partition}"
        if self.not_admitted:
            waiting = ", ".join(map(str, self.not_admitted))
            return (
                f"{missing}: node(s) {waiting} registered but are not admitted to the membership yet; "
                f"wait for the control plane's reconcile to admit them (or run `laminar rebalance`, which "
                f"admits them), then fail node {self.owner} over again"
            )
        return (
            f"{missing}: no other node is alive; start one (`laminar node run --node-id N`) and fail "
            f"node {self.owner} over again once it heartbeats"
        )


def not_admitted_nodes(ledger: Ledger, *, exclude: Collection[int] = ()) -> tuple[int, ...]:
    """Nodes with a record in the ledger that the membership does not list yet (sorted), minus `exclude`."""
    members = set(ledger.members.record().members)
    return tuple(
        sorted(n for n in (v.record.node for v in ledger.members.nodes()) if n not in members and n not in exclude)
    )


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
    own: Ownership | None = None,
    read: tuple[DesiredState, str | None] | None = None,
) -> FailoverDecision:
    """Plan (or resume) the forced migration that takes `partition` away from a dead owner.

    * An in-flight forced migration to a live node, or a graceful one already in its rising phases
      towards a live node, is resumed: it needs no help.
    * An in-flight migration that depends on a dead node is recorded Failed ("superseded") and replaced.
    * When the current owner is alive there is nothing to fail over: the decision carries no task,
      unless `allow_live_owner` (an operator fencing a stalled but heartbeating node) or the owner is
      `stranded` (it got its epoch from a forced migration that failed before it became active).
    * The target is `to_node`, else the least-loaded live node.

    `own` and `read`: the ownership and the desired state (with its ETag) as the caller just read
    them (else they are read here).

    Raises NoLiveNode when `to_node` is not alive, NoFailoverTarget when no live node other than the owner is left.
    """
    p = PartitionId(partition)
    ledger = coordinator.ledger
    live_set = set(live) if live is not None else live_node_ids(ledger)
    if own is None or own.partition != p:
        own = ledger.ownership(p)
    if own is None:
        raise migration_errors.MigrationNotOwned(p, UNASSIGNED)
    superseded = []
    # A record past its deadline never blocks a failover.
    if read is None or coordinator.expire_overdue(p, read[0]) is not None:
        read = coordinator.read_state(p)
    running = read[0].migration
    if running is not None and not running.is_terminal:
        if moves_on_without_old_owner(running, live_set):
            if to_node is None or to_node == running.to_node:
                return FailoverDecision(running, f"resuming migration {running.migration_id} to node {running.to_node}")
            raise migration_errors.MigrationEpochConflict(p, own.epoch, running.from_epoch, running.migration_id)
        if running.from_node in live_set and running.to_node in live_set:
            # A healthy graceful move still needing its (live) old owner: leave it alone.
            if allow_live_owner:
                raise migration_errors.MigrationEpochConflict(p, own.epoch, running.from_epoch, running.migration_id)
            return FailoverDecision(None, f"graceful migration {running.migration_id} between live nodes is in flight")
        dead = sorted({running.from_node, running.to_node} - live_set - {UNASSIGNED})
        coordinator.fail(p, running.migration_id, f"superseded by a failover: node(s) {dead} not alive")
        superseded.append(running.migration_id)
        # Failing it may have completed a grant it decided: both records are read again.
        read = coordinator.desired.read(p)
        own = ledger.ownership(p)
        if own is None:
            raise migration_errors.MigrationNotOwned(p, UNASSIGNED)
    is_stranded = stranded(read[0], own)
    if own.owner in live_set and not allow_live_owner and not is_stranded:
        return FailoverDecision(None, f"owner node {own.owner} is alive: nothing to fail over", superseded)
    target = to_node
    if target is None:
        candidates = dict(loads) if loads is not None else node_loads(ownership_map(ledger), live_set)
        candidates = {n: c for n, c in candidates.items() if n in live_set}
        warm = warm_copies(ledger.members.nodes()).get(int(p))
        target = failover_target(candidates, warm=warm, exclude={own.owner})
        if target is None and is_stranded and own.owner in live_set:
            target = own.owner  # the only live node: grant it a fresh epoch and let it restore again
        if target is None:
            raise NoFailoverTarget(partition, own.owner, not_admitted_nodes(ledger, exclude={own.owner}))
    if target == own.owner and not is_stranded:
        raise NoFailoverTarget(partition, own.owner)
    if target not in live_set:
        raise migration_errors.NoLiveNode(NodeId(target))
    task = coordinator.plan(p, NodeId(target), forced=True, read=read, own=own)
    reason = f"forced migration {task.migration_id}: node {own.owner} -> {target}"
    return FailoverDecision(task, reason, superseded)
