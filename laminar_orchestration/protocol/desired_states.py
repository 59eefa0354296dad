"""Desired states: what the control plane wants of each partition, and how each node learns it.

A partition's `DesiredState` (``ledger/partitions/p/desired.json``) names its owner and any
move in flight (`tasks.MigrationTask`); the control plane writes it by compare-and-swap
(`DesiredStates`). Each write also moves the `NodeAssignment` of every node it asks something
of (`concerned_nodes`): a node polls only its own assignment and reads a state when its
revision there moved, or when a move in flight at it has stopped moving there (`StalledMoves`).
An assignment never lists an older revision than it did.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import LedgerWriter, ledger_key
from laminar_orchestration.protocol.group_commit import GroupCommit
from laminar_orchestration.protocol.keys import (
    ASSIGNMENTS_PREFIX,
    assignment_key,
    desired_state_key,
    parse_assignment_key,
)
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.nudge import NudgeAddresses, nudge_in_background
from laminar_orchestration.protocol.records import (
    NodeRecord,
    Record,
    new_write_id,
    now,
    parse_record,
)
from laminar_orchestration.protocol.tasks import (
    MigrationKind,
    MigrationPhase,
    MigrationTask,
)
from laminar_orchestration.store import PreconditionFailed


class DesiredState(Record):
    """What the control plane wants for one partition: who runs it, and any move in flight."""

    kind: Literal["desired-state"] = "desired-state"
    partition: int = Field(ge=0)
    #: The node that should run the partition (0: nobody yet).
    owner: int = Field(ge=0)
    migration: MigrationTask | None = None
    #: Bumped by every write: a node's assignment names the revision it last saw written.
    revision: int = Field(default=0, ge=0)
    updated_at: datetime
    write_id: str = Field(default_factory=new_write_id)

    def named_nodes(self) -> set[int]:
        """The nodes this state asks something of: the owner and both ends of a move in flight."""
        named = {self.owner}
        if self.migration is not None and not self.migration.is_terminal:
            named |= {self.migration.from_node, self.migration.to_node}
        return named - {UNASSIGNED}


#: Which end of a move must learn each phase as it is recorded: the node that carries it out, and the
#: target at the drain (it starts its first batch then). Nobody acts on Restoring: the target reports
#: its restore with the download.
_PHASE_AUDIENCE: Mapping[MigrationPhase, tuple[bool, bool]] = {
    # (the old owner, the target)
    MigrationPhase.DRAINING: (True, True),
    MigrationPhase.CHECKPOINTING: (True, False),
    MigrationPhase.UPLOADING: (True, False),
    # A graceful move's release, or a forced move's fence: a live old owner stops.
    MigrationPhase.RELEASED: (True, False),
    MigrationPhase.DOWNLOADING: (False, True),
    MigrationPhase.RESTORING: (False, False),
    MigrationPhase.SEEKING: (False, True),
}
#: The phases a forced move's target acts on between its start and its end: the download, after the
#: fence (which granted it the epoch: it takes over once restored, with no word of Seeking).
_FORCED_TARGET_PHASES = frozenset({MigrationPhase.DOWNLOADING})


def concerned_nodes(before: DesiredState, after: DesiredState) -> set[int]:
    """The nodes whose assignment a write of a partition's desired state from `before` to `after` moves.

    Every node either state names, unless the write only takes a migration in flight from one phase
    to the next: then the nodes that phase asks something of (`_PHASE_AUDIENCE`); the others read
    the state at their next write. A move costs fewer assignment writes, and many moves away from
    one dead node do not all contend for its assignment record.
    """
    everyone = before.named_nodes() | after.named_nodes()
    old, new = before.migration, after.migration
    if (
        old is None
        or new is None
        or old.migration_id != new.migration_id
        or new.is_terminal
        or before.owner != after.owner
        or before.named_nodes() != after.named_nodes()
    ):
        if new is not None and not new.is_terminal and new.migration_kind == MigrationKind.FORCED:
            # A forced move asks nothing of its old owner (usually dead): it learns at the end, when the
            # partition leaves it; until then the fence, not its assignment, stops what it writes. Its
            # target has nothing to do before the fence either: it learns of the move at Downloading.
            untold = {new.from_node} - {new.to_node}
            if new.phase == MigrationPhase.PLANNED and before.owner == after.owner:
                untold |= {new.to_node} - before.named_nodes()
            return everyone - untold
        return everyone
    if new.phase == old.phase:
        return set()  # bookkeeping of the record (e.g. the warm bytes): nothing for a node to do
    if new.migration_kind == MigrationKind.FORCED:
        return {new.to_node} & everyone if new.phase in _FORCED_TARGET_PHASES else set()
    from_old, to_target = _PHASE_AUDIENCE.get(new.phase, (True, True))
    chosen = ({new.from_node} if from_old else set()) | ({new.to_node} if to_target else set())
    return chosen & everyone


class NodeAssignment(Record):
    """The control plane's index of what it asks of one node: the partitions whose desired state
    names the node, each with the revision of that state. A node polls only this record when idle
    and reads a partition's desired state only when its revision here moved."""

    kind: Literal["node-assignment"] = "node-assignment"
    node: int = Field(ge=1)
    #: Bumped by every write, so "nothing changed" is one comparison.
    version: int = Field(ge=1)
    partitions: dict[int, int] = Field(default_factory=dict)
    #: The desired states of the partitions in a move, as written (and of those this write ended a
    #: move of): a node takes a state from here when its revision is the one listed above, instead
    #: of reading it. Only a copy: the desired state stays the record.
    states: dict[int, DesiredState] = Field(default_factory=dict)
    updated_at: datetime
    write_id: str = Field(default_factory=new_write_id)

    def state(self, partition: int) -> DesiredState | None:
        """The copy of `partition`'s desired state at the revision listed, if this record carries it."""
        state = self.states.get(partition)
        return state if state is not None and state.revision == self.partitions.get(partition) else None


class DesiredStates:
    """CAS access to the desired-state records (control plane writes, nodes read).

    Every write also moves the assignment record (`NodeAssignment`) of each node it concerns
    (`concerned_nodes`), after the state itself, and nudges those nodes (advisory). A writer
    that dies in between leaves an assignment behind its state. A node taking part in a move
    reads the state itself once its entry has stopped moving (`StalledMoves`): a move's ends
    never wait on a lost write for more than seconds. The next write of the partition repairs
    the record too, and `sync_assignments` (run by `laminar rebalance` before it plans) rebuilds
    every node's record.
    """

    def __init__(self, ledger: Ledger, *, nudge: bool = True) -> None:
        self.ledger = ledger
        self._writer = LedgerWriter(ledger.store)
        self._nudge = nudge
        self._writes = _AssignmentWrites.of(ledger)
        self._addresses = self._writes.addresses(ledger)
        #: partition -> the record this instance last wrote and its ETag: the next write's first guess.
        self._written: dict[PartitionId, tuple[DesiredState, str]] = {}
        self._parsed: dict[int, tuple[str, NodeAssignment]] = {}  # node -> (ETag, assignment) as last read

    def last_written(self, partition: PartitionId) -> tuple[DesiredState, str] | None:
        """The record this instance last wrote for `partition`, with its ETag (None: none yet).

        A guess, not a read: someone may have written since. Use it only as the first attempt of a
        compare-and-swap (`update(read=..., retry=False)`), which fails if it is stale.
        """
        return self._written.get(partition)

    def read(self, partition: PartitionId) -> tuple[DesiredState, str | None]:
        key = desired_state_key(partition)
        obj = self._writer.get(key)
        if obj is None:
            return DesiredState(partition=partition, owner=UNASSIGNED, updated_at=now()), None
        return parse_record(key, obj.data, DesiredState), obj.etag

    def update(
        self,
        partition: PartitionId,
        change: Callable[[DesiredState], DesiredState | None],
        *,
        read: tuple[DesiredState, str | None] | None = None,
        retry: bool = True,
        linger_s: float = 0.0,
    ) -> DesiredState:
        """Apply `change` by compare-and-swap, re-reading on conflict. `change` may raise to abort.

        `read` is the record and ETag the caller just read (or `last_written`): the first attempt
        starts from it. With `retry=False` a conflict raises PreconditionFailed instead.
        `linger_s`: how long the assignment write waits for other writers' states to go with it
        (a driver of many moves at once).
        """
        key = ledger_key(desired_state_key(partition))
        while True:
            current, etag = read if read is not None else self.read(partition)
            read = None
            new = change(current)
            if new is None:
                return current
            revision = current.revision + 1
            new = new.model_copy(update={"updated_at": now(), "write_id": new_write_id(), "revision": revision})
            data = new.model_dump_json().encode()
            try:
                if etag is None:
                    written = self._writer.create(key, data)
                else:
                    written = self._writer.swap(key, data, etag)
            except PreconditionFailed:
                self._written.pop(partition, None)
                if not retry:
                    raise
                continue
            self._written[partition] = (new, written)
            self._assign(partition, concerned_nodes(current, new), new, linger_s)
            return new

    def read_many(self, partitions: list[PartitionId]) -> dict[PartitionId, tuple[DesiredState, str | None]]:
        """`read` of each of `partitions` (in parallel on remote stores)."""
        return dict(zip(partitions, self.ledger.read_each(self.read, partitions), strict=True))

    def all(self) -> dict[PartitionId, DesiredState]:
        """Every partition's desired state, read in parallel on remote stores: one after the other, a
        node's full pass at its start took 1,000 round trips, minutes on a loaded store, and the node
        looked at none of the moves towards it meanwhile."""
        return {p: state for p, (state, _) in self.read_many(self.ledger.partitions()).items()}

    # -- assignments -------------------------------------------------------------------

    def assignment(self, node: NodeId) -> tuple[NodeAssignment | None, str | None]:
        """`node`'s assignment record and its ETag (None, None before the control plane wrote one)."""
        key = assignment_key(node)
        obj = self._writer.get(key)
        if obj is None:
            return None, None
        cached = self._parsed.get(int(node))
        if cached is None or cached[0] != obj.etag:  # a node polls it far more often than it changes
            cached = self._parsed[int(node)] = (obj.etag, parse_record(key, obj.data, NodeAssignment))
        return cached[1], obj.etag

    def _assign(self, partition: PartitionId, nodes: set[int], state: DesiredState, linger_s: float = 0.0) -> None:
        """Bring the assignment of each of `nodes` in line with `state` of `partition`, then nudge them."""
        moved = [n for n in sorted(nodes) if self._assign_one(NodeId(n), {partition: state}, linger_s)]
        if moved and self._nudge:
            self.nudge(moved)

    def _assign_one(self, node: NodeId, states: Mapping[PartitionId, DesiredState], linger_s: float = 0.0) -> bool:
        """CAS `node`'s assignment to name exactly the `states` that name it; True if it changed.

        Concurrent calls for one node in this process are written together (one compare-and-swap
        for all their states, by whichever thread gets there first): moves that share a node do
        not race each other for its record.
        """
        return self._writes.queue(node).write(states, lambda batch: self._write_assignment(node, batch), linger_s)

    def _write_assignment(self, node: NodeId, states: Mapping[PartitionId, DesiredState]) -> bool:
        """Compare-and-set `node`'s assignment to `states`: a partition's entry only moves forward (a
        state older than the revision listed changes nothing), decided on the record as read and
        written over its ETag."""
        key = ledger_key(assignment_key(node))
        guess: tuple[NodeAssignment | None, str | None] | None = self._writes.last_written(node)
        while True:
            guessed = guess is not None
            current, etag = guess if guess is not None else self.assignment(node)
            guess = None
            partitions = dict(current.partitions) if current else {}
            # Copies of states in a move; those of moves ended by an earlier write are dropped.
            copies = {
                p: s
                for p, s in (current.states if current else {}).items()
                if s.migration is not None and not s.migration.is_terminal
            }
            for p, state in states.items():
                if state.revision < partitions.get(int(p), -1):
                    # A late writer's older state (a driver's phase over a completed cancel): the record
                    # lists what a later write decided, and never goes back.
                    continue
                if node in state.named_nodes():
                    partitions[int(p)] = state.revision
                    if state.migration is not None:
                        copies[int(p)] = state
                else:
                    partitions.pop(int(p), None)
                    copies.pop(int(p), None)
            copies = {p: s for p, s in copies.items() if partitions.get(p) == s.revision}
            if current is not None and partitions == current.partitions:
                if guessed:
                    continue  # "nothing to change" is decided on the record as read, not as remembered
                return False
            version = current.version + 1 if current else 1
            record = NodeAssignment(node=node, version=version, partitions=partitions, states=copies, updated_at=now())
            data = record.model_dump_json().encode()
            try:
                written = self._writer.create(key, data) if etag is None else self._writer.swap(key, data, etag)
            except PreconditionFailed:
                continue
            self._writes.wrote(node, record, written)
            return True

    def list_for_owner(self, partition: PartitionId, state: DesiredState) -> None:
        """Make sure `state.owner`'s assignment lists `state` (a writer that died between the state and
        the assignment left it out: the owner would never take up its grant), then nudge the owner."""
        self._assign_one(NodeId(state.owner), {partition: state})
        if self._nudge:
            self.nudge([state.owner])

    def ensure_assignment(self, node: NodeId) -> bool:
        """Give `node` an assignment record if it has none (an empty one); True if one was written."""
        return self._assign_one(node, {})

    def sync_assignments(self, states: Mapping[PartitionId, DesiredState] | None = None) -> list[NodeId]:
        """Rebuild every node's assignment from the desired states (a repair pass: O(partitions) reads).

        `states`: every partition's desired state as the caller just read it (`all`), else read here.
        Returns the nodes whose assignment changed (a writer died between a state and its
        assignments, or the store predates assignment records); they are nudged.
        """
        states = dict(states) if states is not None else self.all()
        named = {n for s in states.values() for n in s.named_nodes()}
        listed = (parse_assignment_key(k) for k in self.ledger.store.list(ASSIGNMENTS_PREFIX))
        nodes = named | {n for n in listed if n} | {int(v.record.node) for v in self.ledger.members.nodes()}
        changed = []
        for n in sorted(nodes):
            current, _ = self.assignment(NodeId(n))
            stale = {PartitionId(p) for p in (current.partitions if current else {}) if PartitionId(p) not in states}
            wanted = dict(states)
            for p in stale:
                # A partition that no longer exists: its entry goes, whatever revision it lists.
                at = current.partitions[int(p)] if current else 0
                wanted[p] = DesiredState(partition=p, owner=UNASSIGNED, revision=at, updated_at=now())
            if self._assign_one(NodeId(n), wanted):
                changed.append(NodeId(n))
        if changed and self._nudge:
            self.nudge(changed)
        return changed

    def nudge(self, nodes: Iterable[int]) -> None:
        """Wake `nodes` to read their assignment now (advisory: best effort, in the background).

        A node's address is read from its record at most every `nudge.ADDRESS_TTL_S`.
        """
        nudge_in_background(self._addresses.urls(nodes))


class _AssignmentWrites:
    """What every `DesiredStates` of one ledger in this process shares about assignment writes: each
    node's record as last written here (the next write swaps over it without a read; a stale one fails
    the swap, and the record is read then), and one group-commit queue per node."""

    _all: ClassVar[weakref.WeakKeyDictionary[Ledger, _AssignmentWrites]] = weakref.WeakKeyDictionary()
    _all_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written: dict[int, tuple[NodeAssignment, str]] = {}
        self._queues: dict[int, GroupCommit[DesiredState]] = {}
        self._addresses: NudgeAddresses | None = None

    def addresses(self, ledger: Ledger) -> NudgeAddresses:
        """The nodes' nudge addresses, read once per `ADDRESS_TTL_S` by every writer in this process."""
        # A weak reference: this object is the value of a weak-keyed map whose key is `ledger`.
        ref = weakref.ref(ledger)

        def read_node(n: int) -> NodeRecord | None:
            held = ref()
            return held.members.node(NodeId(n)) if held is not None else None

        with self._lock:
            if self._addresses is None:
                self._addresses = NudgeAddresses(read_node)
            return self._addresses

    @classmethod
    def of(cls, ledger: Ledger) -> _AssignmentWrites:
        with cls._all_lock:
            writes = cls._all.get(ledger)
            if writes is None:
                writes = cls._all[ledger] = cls()
            return writes

    def queue(self, node: NodeId) -> GroupCommit[DesiredState]:
        with self._lock:
            return self._queues.setdefault(int(node), GroupCommit[DesiredState]())

    def last_written(self, node: NodeId) -> tuple[NodeAssignment, str] | None:
        with self._lock:
            return self._written.get(int(node))

    def wrote(self, node: NodeId, record: NodeAssignment, etag: str) -> None:
        with self._lock:
            self._written[int(node)] = (record, etag)


#: How long a move in flight at a node may go without its assignment entry moving before the node
#: reads the partition's desired state itself: the most a lost assignment write delays a move whose
#: entry had just moved.
STALLED_MOVE_READ_S = 2.0
#: The longest wait between two reads of a stalled move's state: each read that finds nothing new
#: doubles the wait (after the second), up to this.
STALLED_MOVE_READ_MAX_S = 16.0


class StalledMoves:
    """Which of the moves in flight at one node have stopped moving in its assignment.

    A node learns a move's next phase from its assignment; a writer that died between the desired
    state and the assignment (the move Active, the new owner left at Seeking) would leave the node
    waiting for its next full pass. It reads such a move's state itself, `after_s` after its entry
    last moved, again `after_s` later, then twice as long after each read (up to `max_after_s`):
    nothing while no move is in flight at it, a few GETs per stalled move while one is. An entry
    also stands still while the node itself is busy with the phase (a restore on a loaded store can
    take a minute): reading every `after_s` then would cost a GET per move every two seconds, and the
    reads would slow the store the moves wait on.
    """

    def __init__(self, after_s: float = STALLED_MOVE_READ_S, max_after_s: float = STALLED_MOVE_READ_MAX_S) -> None:
        self._after_s = after_s
        self._max_after_s = max(after_s, max_after_s)
        #: partition -> the revision its assignment listed, since when (or the last read of it), and
        #: how many reads found it still.
        self._since: dict[int, tuple[int | None, float, int]] = {}

    def due(
        self, in_flight: Mapping[PartitionId, tuple[str, float | None]], listed: Mapping[int, int], at: float
    ) -> set[PartitionId]:
        """Of the node's moves `in_flight` (partition -> the migration and when it was seen ended, None
        while in flight), those whose revision in `listed` has not moved for their wait since it last
        moved or was last read; they count as read at `at` (seconds on the caller's monotonic clock)."""
        due: set[PartitionId] = set()
        since: dict[int, tuple[int | None, float, int]] = {}
        for p in (p for p, (_, ended) in in_flight.items() if ended is None):
            revision = listed.get(int(p))
            before = self._since.get(int(p))
            if before is None or before[0] != revision:
                since[int(p)] = (revision, at, 0)
            elif at - before[1] >= min(self._after_s * 2 ** max(0, before[2] - 1), self._max_after_s):
                due.add(p)
                since[int(p)] = (revision, at, before[2] + 1)
            else:
                since[int(p)] = before
        self._since = since
        return due
