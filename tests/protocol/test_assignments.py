"""A node learns what the control plane asks of it from one record about itself: its assignment.

Every desired-state write moves the assignment of each node it asks something of (a node it
starts or stops naming, or the end of a move in flight that the new phase is for), so a node
that polls only its assignment never misses a change it must act on, and a repair pass
rebuilds assignments a crashed writer left behind.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from datetime import UTC, datetime

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import LedgerWriter, ledger_key
from laminar_orchestration.protocol.desired_states import DesiredState, DesiredStates, StalledMoves
from laminar_orchestration.protocol.keys import assignment_key, desired_state_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.tasks import MigrationKind, MigrationPhase, MigrationTask, phase_sequence
from laminar_orchestration.store import ObjectStore, PreconditionFailed
from tests.stores import ForwardingStore

P, N = PartitionId, NodeId
AT = datetime(2026, 1, 1, tzinfo=UTC)


def _move(state: DesiredState, to: int) -> DesiredState:
    task = MigrationTask(
        migration_id="m1",
        partition=state.partition,
        migration_kind=MigrationKind.GRACEFUL,
        from_node=state.owner,
        to_node=to,
        from_epoch=1,
        to_epoch=2,
        phase=MigrationPhase.PLANNED,
        started_at=AT,
        updated_at=AT,
        timeout_s=60,
    )
    return state.model_copy(update={"migration": task})


def _forced(state: DesiredState) -> DesiredState:
    """A forced move of `state`'s partition to node 2, planned."""
    moved = _move(state, to=2)
    assert moved.migration is not None
    return moved.model_copy(
        update={"migration": moved.migration.model_copy(update={"migration_kind": MigrationKind.FORCED})}
    )


def _desired(store: ObjectStore, partitions: int = 2) -> DesiredStates:
    ledger = Ledger(store)
    ledger.init_cluster(partitions)
    return DesiredStates(ledger, nudge=False)


def _partitions(desired: DesiredStates, node: int) -> dict[int, int] | None:
    assignment, _ = desired.assignment(N(node))
    return None if assignment is None else assignment.partitions


def test_each_write_moves_the_assignment_of_every_node_it_names(store: ObjectStore) -> None:
    desired = _desired(store)
    placed = desired.update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    assert placed.revision == 1 and _partitions(desired, 1) == {0: 1} and _partitions(desired, 2) is None

    moving = desired.update(P(0), lambda s: _move(s, to=2))  # a move names both its ends
    assert _partitions(desired, 1) == {0: moving.revision} and _partitions(desired, 2) == {0: moving.revision}

    done = desired.update(P(0), lambda s: s.model_copy(update={"owner": 2, "migration": None}))
    assert _partitions(desired, 1) == {} and _partitions(desired, 2) == {0: done.revision}
    first, _ = desired.assignment(N(1))
    assert first is not None and first.version == 3  # one version per change


def test_a_write_that_changes_nothing_writes_no_assignment(store: ObjectStore) -> None:
    desired = _desired(store)
    desired.update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    before, etag = desired.assignment(N(1))
    assert desired.update(P(0), lambda s: None).revision == 1  # `change` declined: nothing written
    after, again = desired.assignment(N(1))
    assert before == after and etag == again


def test_the_repair_pass_rebuilds_what_a_crashed_writer_left_behind(store: ObjectStore) -> None:
    desired = _desired(store)
    desired.update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    Ledger(store).members.register_node(N(3))
    # A writer that died after the state's compare-and-swap, before the assignments.
    state, etag = desired.read(P(0))
    moved = state.model_copy(update={"owner": 2, "revision": state.revision + 1})
    assert etag is not None
    LedgerWriter(store).swap(ledger_key(desired_state_key(0)), moved.model_dump_json().encode(), etag)
    assert _partitions(desired, 1) == {0: 1} and _partitions(desired, 2) is None

    changed = desired.sync_assignments()

    assert set(changed) == {1, 2, 3}
    assert _partitions(desired, 1) == {} and _partitions(desired, 2) == {0: 2}
    assert _partitions(desired, 3) == {}  # a registered node without partitions gets its (empty) record
    assert desired.sync_assignments() == []  # nothing left to repair


def test_writers_of_different_partitions_never_lose_each_others_assignment(store: ObjectStore) -> None:
    desired = _desired(store, partitions=2)
    rounds = 15
    start = threading.Barrier(2)

    def writer(p: int) -> None:
        start.wait()
        for i in range(rounds):
            owner = 1 if i % 2 == 0 else 0  # named, then not, then named again...

            def change(state: DesiredState, owner: int = owner) -> DesiredState:
                return state.model_copy(update={"owner": owner})

            desired.update(P(p), change)

    threads = [threading.Thread(target=writer, args=(p,)) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # The last write of each names node 1 (rounds is odd): both are in its assignment, at their last revision.
    assert _partitions(desired, 1) == {0: rounds, 1: rounds}


def _phase(state: DesiredState, phase: MigrationPhase) -> DesiredState:
    assert state.migration is not None
    return state.model_copy(update={"migration": state.migration.model_copy(update={"phase": phase})})


def test_a_phase_moves_only_the_assignment_of_the_end_it_asks_something_of(store: ObjectStore) -> None:
    desired = _desired(store)
    desired.update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    desired.update(P(0), lambda s: _move(s, to=2))
    seen = {n: _partitions(desired, n) for n in (1, 2)}
    moved: dict[MigrationPhase, set[int]] = {}
    for phase in phase_sequence(MigrationKind.GRACEFUL)[1:-1]:
        desired.update(P(0), functools.partial(_phase, phase=phase))
        now = {n: _partitions(desired, n) for n in (1, 2)}
        moved[phase] = {n for n in (1, 2) if now[n] != seen[n]}
        seen = now
    assert moved == {
        MigrationPhase.DRAINING: {1, 2},  # the target starts its first batch's work at the drain
        MigrationPhase.CHECKPOINTING: {1},
        MigrationPhase.UPLOADING: {1},
        MigrationPhase.RELEASED: {1},
        MigrationPhase.DOWNLOADING: {2},
        MigrationPhase.RESTORING: set(),  # the target reported its restore with the download
        MigrationPhase.SEEKING: {2},
    }

    # The end of the move concerns both ends again: the owner changes, the old owner is named no more.
    def finish(s: DesiredState) -> DesiredState:
        return _phase(s, MigrationPhase.ACTIVE).model_copy(update={"owner": 2})

    done = desired.update(P(0), finish)
    assert _partitions(desired, 1) == {} and _partitions(desired, 2) == {0: done.revision}


def test_a_bookkeeping_write_moves_no_assignment(store: ObjectStore) -> None:
    desired = _desired(store)
    desired.update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    desired.update(P(0), lambda s: _move(s, to=2))
    before = {n: desired.assignment(N(n)) for n in (1, 2)}

    def warm(s: DesiredState) -> DesiredState:
        assert s.migration is not None
        return s.model_copy(update={"migration": s.migration.model_copy(update={"warm_bytes": 1024})})

    desired.update(P(0), warm)
    assert {n: desired.assignment(N(n)) for n in (1, 2)} == before


def test_a_forced_move_tells_its_old_owner_only_at_the_end(store: ObjectStore) -> None:
    """Many failovers away from one dead node would all write its assignment at every phase: it has
    nothing to do in a forced move, so only the end of the move (the partition leaves it) moves it."""
    desired = _desired(store)
    desired.update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    _, dead_before = desired.assignment(N(1))

    desired.update(P(0), _forced)
    for phase in phase_sequence(MigrationKind.FORCED)[1:-1]:
        desired.update(P(0), functools.partial(_phase, phase=phase))
        assert desired.assignment(N(1))[1] == dead_before, f"{phase} moved the old owner's assignment"
    target = _partitions(desired, 2)

    def finish(s: DesiredState) -> DesiredState:
        return _phase(s, MigrationPhase.ACTIVE).model_copy(update={"owner": 2})

    done = desired.update(P(0), finish)
    assert _partitions(desired, 1) == {} and _partitions(desired, 2) == {0: done.revision} != target


class _ConflictCounting(ForwardingStore):
    """Counts the compare-and-swaps of assignment records that lost to another write."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.lost = 0

    def put_if_match(self, key: str, data: bytes, etag: str, metadata: Mapping[str, str] | None = None) -> str:
        try:
            return super().put_if_match(key, data, etag, metadata)
        except PreconditionFailed:
            if "assignments/" in key:
                self.lost += 1
            raise


def test_moves_to_one_node_write_its_assignment_together_without_racing(store: ObjectStore) -> None:
    """Sixteen moves towards one node at once (a failover, a placement): their assignment writes are
    batched in the process (whichever coordinator makes them), so none loses a compare-and-swap to
    another and none is lost."""
    counting = _ConflictCounting(store)
    ledger = Ledger(counting)
    ledger.init_cluster(16)
    desired = DesiredStates(ledger, nudge=False)
    start = threading.Barrier(16)

    def place(p: int) -> None:
        start.wait()
        # One coordinator per move, as a failover or a rebalance makes them: the batching is the ledger's.
        DesiredStates(ledger, nudge=False).update(P(p), lambda s: s.model_copy(update={"owner": 1}))

    threads = [threading.Thread(target=place, args=(p,)) for p in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert _partitions(desired, 1) == dict.fromkeys(range(16), 1)
    assert counting.lost == 0


def test_a_forced_moves_target_learns_of_it_at_downloading_with_a_copy_of_its_state(store: ObjectStore) -> None:
    """The target of a forced move has nothing to do before the fence: its assignment first names the
    partition at Downloading, carrying a copy of the state at the listed revision (the node reads no
    desired state), and the copy leaves the record with the write after the one that ended the move."""
    desired = _desired(store)
    desired.update(P(0), lambda s: s.model_copy(update={"owner": 1}))

    desired.update(P(0), _forced)
    assert desired.assignment(N(2))[0] is None, "the plan of a forced move told its target"
    desired.update(P(0), functools.partial(_phase, phase=MigrationPhase.RELEASED))
    assert desired.assignment(N(2))[0] is None
    downloading = desired.update(P(0), functools.partial(_phase, phase=MigrationPhase.DOWNLOADING))
    told, _ = desired.assignment(N(2))
    assert told is not None and told.partitions == {0: downloading.revision}
    assert told.state(0) == downloading
    # A copy at another revision than the one listed is no copy.
    stale = told.model_copy(update={"partitions": {0: downloading.revision + 1}})
    assert stale.state(0) is None

    for phase in (MigrationPhase.RESTORING, MigrationPhase.SEEKING):
        desired.update(P(0), functools.partial(_phase, phase=phase))
    done = desired.update(P(0), lambda s: _phase(s, MigrationPhase.ACTIVE).model_copy(update={"owner": 2}))
    ended, _ = desired.assignment(N(2))
    assert ended is not None and ended.state(0) == done
    desired.update(P(1), lambda s: s.model_copy(update={"owner": 2}))
    later, _ = desired.assignment(N(2))
    assert later is not None and 0 not in later.states and later.partitions[0] == done.revision


class _PausingSwap(ForwardingStore):
    """Blocks the first compare-and-swap of `key` until `resume` is set: a driver stalled between a
    desired state's write and its assignment's."""

    def __init__(self, inner: ObjectStore, key: str) -> None:
        super().__init__(inner)
        self.key = key
        self.reached, self.resume = threading.Event(), threading.Event()

    def put_if_match(self, key: str, data: bytes, etag: str, metadata: Mapping[str, str] | None = None) -> str:
        if key == self.key and not self.reached.is_set():
            self.reached.set()
            if not self.resume.wait(30):
                raise TimeoutError("the paused swap was never resumed")
        return super().put_if_match(key, data, etag, metadata)


def test_a_late_drivers_assignment_write_never_lists_an_older_revision(store: ObjectStore) -> None:
    """A driver records Draining (revision 4), stalls before the old owner's assignment write, and an
    operator's cancel (revision 5) completes meanwhile: the driver's late write must not put the
    assignment back to 4, or the owner drains for a move that no longer exists."""
    operator = _desired(store)
    operator.update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    operator.update(P(0), lambda s: _move(s, to=2))
    operator.update(P(0), functools.partial(_phase, phase=MigrationPhase.PLANNED))
    paused = _PausingSwap(store, assignment_key(1))
    driver = DesiredStates(Ledger(paused), nudge=False)
    drained: list[DesiredState] = []
    thread = threading.Thread(
        target=lambda: drained.append(driver.update(P(0), functools.partial(_phase, phase=MigrationPhase.DRAINING)))
    )
    thread.start()
    assert paused.reached.wait(10)

    def cancel(s: DesiredState) -> DesiredState:
        return _phase(s, MigrationPhase.CANCELLED)

    cancelled = operator.update(P(0), cancel)
    paused.resume.set()
    thread.join(10)

    assert not thread.is_alive() and drained[0].revision == 4 and cancelled.revision == 5
    owner, _ = operator.assignment(N(1))
    assert owner is not None and owner.partitions == {0: 5}
    # What the owner takes for the partition at the listed revision: the cancel, so it keeps processing.
    taken = owner.state(0) or operator.read(P(0))[0]
    assert taken.migration is not None and taken.migration.phase == MigrationPhase.CANCELLED


def test_a_move_in_flight_whose_assignment_entry_stopped_moving_is_read_once_per_interval() -> None:
    stalls = StalledMoves(after_s=2.0)
    moving = {P(0): ("m0", None), P(1): ("m1", None), P(2): ("m2", 5.0)}  # p2's move was seen ended
    assert stalls.due(moving, {0: 3, 1: 7, 2: 4}, at=0.0) == set()
    assert stalls.due(moving, {0: 3, 1: 8, 2: 4}, at=1.5) == set()  # p1's entry moved: its wait starts again
    assert stalls.due(moving, {0: 3, 1: 8, 2: 4}, at=2.0) == {P(0)}  # p0 stalled; an ended move is never read
    assert stalls.due(moving, {0: 3, 1: 8, 2: 4}, at=3.0) == set()  # read at 2.0: not again before 4.0
    assert stalls.due(moving, {0: 3, 1: 8, 2: 4}, at=4.0) == {P(0), P(1)}
    # A move that left the node's moves in flight is forgotten; back in flight, it waits afresh.
    assert stalls.due({P(1): ("m1", None)}, {0: 3, 1: 8}, at=10.0) == {P(1)}
    assert stalls.due(moving, {0: 3, 1: 8}, at=10.5) == set()
