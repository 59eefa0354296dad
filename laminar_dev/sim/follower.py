"""How a simulated node learns what the control plane asks of it: through its assignment record.

The runtime's reconcile loop (`dataplane.node.Node._states_to_read`) polls the node's assignment
and reads a partition's desired state only when the revision listed there moved, when the partition
left the record, while it waits on the partition (named, nothing to do yet), and when a move in
flight at the node has stopped moving there (`StalledMoves`: its writer died before the
assignment). `AssignmentFollower` takes the same decisions for a `NodeActor`, one partition per
step: a lost assignment write meets the node as it meets the runtime.
"""

from __future__ import annotations

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.desired_states import DesiredState, DesiredStates, NodeAssignment, StalledMoves

#: How often the node reads its assignment (simulated seconds): a runtime node while a move involves
#: it, or woken by a nudge at once (the simulated control plane nudges nobody).
ASSIGNMENT_POLL_S = 0.1


class AssignmentFollower:
    """One node process's view of its partitions' desired states, kept as the runtime keeps it."""

    def __init__(self, desired: DesiredStates, node: NodeId, partitions: int) -> None:
        self._desired = desired
        self._node = node
        self._partitions = partitions
        self._assignment: NodeAssignment | None = None
        self._read_at = -1e9
        #: The state of each partition as last taken, and the revision the assignment listed then.
        self._states: dict[int, DesiredState] = {}
        self._seen: dict[int, int | None] = {}
        #: Partitions the last poll found changed (or waited on, or stalled): taken again at their next step.
        self._dirty: set[int] = set(range(partitions))
        self._stalled: set[int] = set()
        #: Partitions whose state names the node while it can do nothing for them yet: read at every poll.
        self.pending: set[int] = set()
        self._stalls = StalledMoves()

    def state(self, partition: int, now: float) -> DesiredState:
        """`partition`'s desired state as the node knows it at simulated time `now` (store calls: the
        assignment at most every `ASSIGNMENT_POLL_S`, the state only when the assignment says so)."""
        if now - self._read_at >= ASSIGNMENT_POLL_S:
            self._poll(now)
        if partition in self._dirty or partition not in self._states:
            assignment = self._assignment
            copy = None
            if assignment is not None and partition not in self._stalled:
                copy = assignment.state(partition)
            state = copy or self._desired.read(PartitionId(partition))[0]
            self._states[partition] = state
            self._seen[partition] = assignment.partitions.get(partition) if assignment is not None else None
            self._dirty.discard(partition)
            self._stalled.discard(partition)
        return self._states[partition]

    def _poll(self, now: float) -> None:
        self._read_at = now
        assignment, _ = self._desired.assignment(self._node)
        self._assignment = assignment
        if assignment is None:
            # Before the control plane wrote this node's record: every state is read (the full pass).
            self._dirty = set(range(self._partitions))
            return
        listed = assignment.partitions
        self._dirty |= {p for p in range(self._partitions) if self._seen.get(p) != listed.get(p)}
        self._dirty |= self.pending & set(listed)
        in_flight = {
            PartitionId(p): (s.migration.migration_id, None)
            for p, s in self._states.items()
            if s.migration is not None
            and not s.migration.is_terminal
            and self._node in (s.migration.from_node, s.migration.to_node)
        }
        stalled = {int(p) for p in self._stalls.due(in_flight, listed, now)}
        self._stalled |= stalled
        self._dirty |= stalled
