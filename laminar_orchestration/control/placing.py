"""What placing many partitions at once needs beyond a single move: one read of every partition's
records for all the steps of a rebalance before its moves, and moves that outlast a late heartbeat.

On a remote store each record read is a round trip, and a loaded store answers slowly: the steps a
rebalance takes before it plans (`sync_assignments`, `reinstate_all`, the plan's look at every
owner and every move in flight) share one parallel read of each record instead of reading them in
turn, and a move whose target's heartbeat is a moment late waits for the next one instead of failing
(a failed placement leaves its partition unplaced until the next rebalance).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import reinstate_all
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.migration_errors import NoLiveNode
from laminar_orchestration.protocol.records import NodeStatus, PartitionStatus
from laminar_orchestration.protocol.tasks import deadline_passed

__all__ = [
    "LATE_HEARTBEAT_GRACE",
    "LATE_HEARTBEAT_POLL_S",
    "MAX_LATE_HEARTBEAT_WAITS",
    "RebalanceReads",
    "prepare_rebalance",
    "through_late_heartbeat",
]

R = TypeVar("R")

#: How often a move whose target looked dead reads the target's record while it waits for its next
#: heartbeat: heartbeats come every few seconds, and many moves may be waiting on a loaded store.
LATE_HEARTBEAT_POLL_S = 1.0
#: How many times one move waits for a late heartbeat of its target before its NoLiveNode stands.
MAX_LATE_HEARTBEAT_WAITS = 3
#: How long, in heartbeat timeouts, a move waits for its target's next heartbeat before it is dead.
LATE_HEARTBEAT_GRACE = 2.0


@dataclass(frozen=True)
class RebalanceReads:
    """What `prepare_rebalance` read and did: the inputs of `plan_rebalance` (`owners`, `moving`)."""

    #: partition -> its owner (0: unassigned), the grants back made here included.
    owners: dict[int, int]
    #: The partitions whose migration is in flight.
    moving: frozenset[int]
    #: partition -> epoch of the grants back made (`reinstate_all`).
    granted: dict[int, int]


def prepare_rebalance(coordinator: MigrationCoordinator) -> RebalanceReads:
    """`laminar rebalance`'s steps before it plans, from one (parallel) read of each partition's desired
    state and ownership: every node's assignment rebuilt from the desired states (a repair:
    `DesiredStates.sync_assignments`), then every released or unassigned partition granted back to
    its live desired owner (`reinstate_all`, which admits newly registered nodes first)."""
    ledger = coordinator.ledger
    partitions = ledger.partitions()
    states = coordinator.desired.all()
    coordinator.desired.sync_assignments(states)
    ownerships = ledger.ownerships(partitions)
    granted = reinstate_all(coordinator, partitions, owners=ownerships, states=states)
    owners = {int(p): int(own.owner) if own is not None else UNASSIGNED for p, own in ownerships.items()}
    owners |= {p: int(states[PartitionId(p)].owner) for p in granted}

    def in_flight(p: PartitionId) -> bool:
        task, own = states[p].migration, ownerships.get(p)
        if task is None or task.is_terminal:
            return False
        # `reinstate_all` failed the overdue moves of the partitions waiting for a grant back.
        waiting = own is not None and (own.owner == UNASSIGNED or own.status == PartitionStatus.RELEASED)
        return not (waiting and deadline_passed(task))

    return RebalanceReads(owners, frozenset(int(p) for p in states if in_flight(p)), granted)


def through_late_heartbeat(ledger: Ledger, node: int, attempt: Callable[[], R]) -> R:
    """`attempt()` (a move towards `node`), tried again if it failed with NoLiveNode for `node` and the node
    heartbeats again: a node whose heartbeat is late on a loaded machine or store is not dead, and a
    move refused at its plan recorded nothing.

    At most `MAX_LATE_HEARTBEAT_WAITS` waits; the NoLiveNode stands when the node left, stopped, or
    wrote no heartbeat newer than the one judged too old within `LATE_HEARTBEAT_GRACE` of its timeouts.
    """
    waits = 0
    while True:
        try:
            return attempt()
        except NoLiveNode as exc:
            if int(exc.node) != node or waits >= MAX_LATE_HEARTBEAT_WAITS or not _beats_again(ledger, node):
                raise
            waits += 1


def _beats_again(ledger: Ledger, node: int) -> bool:
    """Whether `node` writes a heartbeat newer than its record's now, within `LATE_HEARTBEAT_GRACE` timeouts."""
    record = ledger.members.node(NodeId(node))
    if record is None or record.status != NodeStatus.ALIVE:
        return False
    seen, give_up = record.heartbeat_at, time.monotonic() + LATE_HEARTBEAT_GRACE * record.heartbeat_timeout_s
    while time.monotonic() < give_up:
        time.sleep(LATE_HEARTBEAT_POLL_S)
        fresh = ledger.members.node(NodeId(node))
        if fresh is None or fresh.status != NodeStatus.ALIVE:
            return False
        if fresh.heartbeat_at > seen:
            return True
    return False
