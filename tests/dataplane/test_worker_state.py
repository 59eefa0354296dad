"""The partition worker's transition table: the paths a worker takes are allowed, nothing else is."""

from __future__ import annotations

import itertools

import pytest

from laminar_orchestration.dataplane.errors import IllegalWorkerTransition
from laminar_orchestration.dataplane.worker import PartitionWorker
from laminar_orchestration.dataplane.worker_state import TRANSITIONS, WorkerState, check_transition
from laminar_orchestration.errors import ErrorKind

S = WorkerState

#: The lives a worker leads (runtime.PartitionWorker.run and what it calls).
PATHS = [
    # Recovered after a restart, then moved away gracefully.
    [S.STARTING, S.RESTORING, S.RUNNING, S.DRAINING, S.RELEASED],
    # A migration's target: warms up, restores, runs; a clean shutdown releases then stops.
    [S.STARTING, S.WARMING, S.RESTORING, S.RUNNING, S.RELEASED, S.STOPPED],
    # A drain whose migration was aborted resumes running, then is fenced.
    [S.STARTING, S.RESTORING, S.RUNNING, S.DRAINING, S.RUNNING, S.REVOKED],
    # A migration aborted while the target was still warming up.
    [S.STARTING, S.WARMING, S.STOPPED],
    [S.STARTING, S.RESTORING, S.FAILED],
]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: "-".join(p))
def test_the_workers_paths_are_allowed(path: list[WorkerState]) -> None:
    for old, new in itertools.pairwise(path):
        assert check_transition(old, new) is new


def test_every_live_state_may_fail_or_be_revoked_and_ended_states_stay_ended() -> None:
    assert set(TRANSITIONS) == set(WorkerState)
    ended = {S.REVOKED, S.FAILED, S.STOPPED}
    for state in WorkerState:
        if state in ended:
            assert state.is_finished and not TRANSITIONS[state]
        elif state != S.RELEASED:
            assert {S.FAILED, S.REVOKED} <= TRANSITIONS[state]
    # Released is finished too (the node drops the worker), though a shutdown's stop may follow it.
    assert S.RELEASED.is_finished and TRANSITIONS[S.RELEASED] == {S.STOPPED}
    assert [s for s in WorkerState if s.is_finished] == [S.RELEASED, *sorted(ended, key=list(WorkerState).index)]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (S.RUNNING, S.WARMING),  # no going back to before the restore
        (S.STARTING, S.RUNNING),  # never runs unrestored
        (S.WARMING, S.RUNNING),
        (S.RELEASED, S.RUNNING),  # a released partition is another node's
        (S.RELEASED, S.FAILED),
        (S.REVOKED, S.RUNNING),  # a fenced worker never acts again
        (S.FAILED, S.RESTORING),  # a restart is a new worker
        (S.STOPPED, S.RUNNING),
    ],
)
def test_illegal_transitions_raise_a_typed_error(old: WorkerState, new: WorkerState) -> None:
    with pytest.raises(IllegalWorkerTransition) as info:
        check_transition(old, new)
    assert (info.value.old, info.value.new) == (old, new)
    assert info.value.error_kind == ErrorKind.FAILED
    assert str(old) in str(info.value) and str(new) in str(info.value)


def test_staying_in_a_state_is_not_a_transition() -> None:
    for state in WorkerState:
        assert check_transition(state, state) is state


def test_the_worker_checks_every_assignment_of_its_state() -> None:
    """`PartitionWorker.state_name` goes through the table: an illegal assignment raises and changes nothing."""
    worker = PartitionWorker.__new__(PartitionWorker)  # only the state: no node, no thread
    worker._state = S.STARTING
    worker.state_name = S.RESTORING
    worker.state_name = S.RUNNING
    assert worker.state_name == S.RUNNING and not worker.finished
    worker.state_name = S.FAILED
    assert worker.finished
    with pytest.raises(IllegalWorkerTransition):
        worker.state_name = S.RUNNING
    assert worker.state_name == S.FAILED
