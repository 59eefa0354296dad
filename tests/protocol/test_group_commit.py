"""Group commit of one node's assignment, with real threads: the states callers hand in while a write is
under way go out together in the next write, the latest revision of each partition wins, every caller
learns whether the batch that carried its states changed the record, and a failed write raises only in
the thread that made it while its states go out with the next batch."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.group_commit import GroupCommit
from tests.threads import run_together

P = PartitionId


@dataclass(frozen=True)
class State:
    """A partition's desired state as the queue sees it: a value and its revision."""

    value: str
    revision: int


class Writes:
    """The record's writer: remembers each batch; the first write can be held open, or made to fail."""

    def __init__(self, *, changed: Callable[[int], bool] = lambda _n: True, fail_first: bool = False) -> None:
        self.batches: list[dict[PartitionId, State]] = []
        self.first_started, self.release_first = threading.Event(), threading.Event()
        self._changed, self._fail_first = changed, fail_first

    def __call__(self, batch: Mapping[PartitionId, State]) -> bool:
        n = len(self.batches)
        self.batches.append(dict(batch))
        if n == 0:
            self.first_started.set()
            assert self.release_first.wait(10), "the first write was never released"
            if self._fail_first:
                raise ConnectionError("the store went away")
        return self._changed(n)


def _wait_until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _callers_queued(queue: GroupCommit[State], n: int) -> Callable[[], bool]:
    # Every caller takes a ticket before it waits: `n` tickets taken means `n` callers queued.
    return lambda: queue._next >= n


def _start(target: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run `target` on a thread; what it returned or raised lands in the list."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(target())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_a_lone_caller_writes_its_states_at_once_and_gets_the_writes_answer() -> None:
    queue: GroupCommit[State] = GroupCommit()
    batches: list[dict[PartitionId, State]] = []

    def write(batch: Mapping[PartitionId, State]) -> bool:
        batches.append(dict(batch))
        return len(batches) == 1

    assert queue.write({P(0): State("a", 1)}, write) is True
    assert queue.write({P(1): State("b", 1)}, write) is False  # unchanged: the caller may skip the nudge
    assert batches == [{P(0): State("a", 1)}, {P(1): State("b", 1)}]


def test_callers_arriving_during_a_write_go_out_together_in_the_next_one() -> None:
    queue: GroupCommit[State] = GroupCommit()
    writes = Writes()
    first, first_outcome = _start(lambda: queue.write({P(0): State("first", 1)}, writes))
    assert writes.first_started.wait(10)
    results: dict[int, bool] = {}

    def later(i: int) -> None:
        results[i] = queue.write({P(10 + i): State(f"later{i}", 1)}, writes)

    others = threading.Thread(target=lambda: run_together(later, 8, timeout_s=20))
    others.start()
    _wait_until(_callers_queued(queue, 9), "the later callers never queued")
    writes.release_first.set()
    others.join(20)
    first.join(10)
    assert first_outcome == [True] and results == dict.fromkeys(range(8), True)
    assert writes.batches == [
        {P(0): State("first", 1)},
        {P(10 + i): State(f"later{i}", 1) for i in range(8)},  # eight callers, one write
    ]


def test_the_latest_revision_of_a_partition_wins_in_a_batch_whatever_the_order_of_arrival() -> None:
    queue: GroupCommit[State] = GroupCommit()
    writes = Writes()
    first, _ = _start(lambda: queue.write({P(9): State("other", 1)}, writes))
    assert writes.first_started.wait(10)
    newer, _ = _start(lambda: queue.write({P(0): State("newer", 3)}, writes))
    _wait_until(_callers_queued(queue, 2), "the newer state never queued")
    older, _ = _start(lambda: queue.write({P(0): State("older", 2), P(1): State("b", 1)}, writes))
    _wait_until(_callers_queued(queue, 3), "the older state never queued")
    writes.release_first.set()
    for t in (first, newer, older):
        t.join(10)
    assert writes.batches[1] == {P(0): State("newer", 3), P(1): State("b", 1)}


def test_each_caller_learns_whether_the_batch_that_carried_its_states_changed_the_record() -> None:
    queue: GroupCommit[State] = GroupCommit()
    writes = Writes(changed=lambda n: n == 0)  # the first write changes the record, the second does not
    first, first_outcome = _start(lambda: queue.write({P(0): State("a", 1)}, writes))
    assert writes.first_started.wait(10)
    second, second_outcome = _start(lambda: queue.write({P(0): State("a", 1)}, writes))
    _wait_until(_callers_queued(queue, 2), "the second caller never queued")
    writes.release_first.set()
    first.join(10)
    second.join(10)
    assert (first_outcome, second_outcome) == ([True], [False])


def test_a_failed_write_raises_in_its_thread_alone_and_its_states_go_out_with_the_next_batch() -> None:
    queue: GroupCommit[State] = GroupCommit()
    writes = Writes(fail_first=True)
    first, first_outcome = _start(lambda: queue.write({P(0): State("a", 1), P(1): State("b", 1)}, writes))
    assert writes.first_started.wait(10)
    # Handed in while the failing write is under way: a newer state of partition 1, and partition 2.
    second, second_outcome = _start(lambda: queue.write({P(1): State("b", 2), P(2): State("c", 1)}, writes))
    _wait_until(_callers_queued(queue, 2), "the second caller never queued")
    writes.release_first.set()
    first.join(10)
    second.join(10)
    assert len(first_outcome) == 1 and isinstance(first_outcome[0], ConnectionError)
    assert second_outcome == [True]  # the failure is not the other caller's
    # The failed batch's states are not lost, and do not overwrite what was handed in since.
    assert writes.batches[1] == {P(0): State("a", 1), P(1): State("b", 2), P(2): State("c", 1)}
    assert queue.write({P(3): State("d", 1)}, writes) is True and writes.batches[2] == {P(3): State("d", 1)}


def test_a_lingering_writer_takes_the_callers_that_arrive_meanwhile_into_its_write() -> None:
    queue: GroupCommit[State] = GroupCommit()
    batches: list[dict[PartitionId, State]] = []

    def write(batch: Mapping[PartitionId, State]) -> bool:
        batches.append(dict(batch))
        return True

    first, first_outcome = _start(lambda: queue.write({P(0): State("a", 1)}, write, linger_s=0.3))
    _wait_until(lambda: queue._writing, "the first caller never began its batch")
    assert queue.write({P(1): State("b", 1)}, write) is True  # returns once the lingering write is done
    first.join(10)
    assert first_outcome == [True] and batches == [{P(0): State("a", 1), P(1): State("b", 1)}]
