"""The life of a partition worker on a node: its states and the one table of allowed changes.

A worker starts, warms up (a migration's target) or goes straight to
restoring, runs, may drain for a graceful move and go back to running if the
move is aborted, and ends released, revoked (fenced by a newer epoch), failed
or stopped. An ended worker never changes state again: a restart is a new
worker.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from laminar_orchestration.dataplane.errors import IllegalWorkerTransition


class WorkerState(enum.StrEnum):
    """What a partition worker is doing; reported to the control plane in the node record."""

    STARTING = "starting"
    #: A migration's target following the chain before the handoff (a warm-up, like a standby).
    WARMING = "warming"
    RESTORING = "restoring"
    RUNNING = "running"
    DRAINING = "draining"
    RELEASED = "released"
    REVOKED = "revoked"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def is_finished(self) -> bool:
        """The worker is done with the partition: released it, lost it, failed or stopped.

        Only a shutdown's stop may still follow a release; the others are final.
        """
        return self in (WorkerState.RELEASED, WorkerState.REVOKED, WorkerState.FAILED, WorkerState.STOPPED)


_S = WorkerState
#: The failures and the clean stop that may end any live state.
_ENDINGS = frozenset({_S.REVOKED, _S.FAILED, _S.STOPPED})

#: Every allowed change of state: `TRANSITIONS[old]` holds the states that may follow `old`.
TRANSITIONS: Mapping[WorkerState, frozenset[WorkerState]] = MappingProxyType(
    {
        _S.STARTING: frozenset({_S.WARMING, _S.RESTORING}) | _ENDINGS,
        _S.WARMING: frozenset({_S.RESTORING}) | _ENDINGS,
        _S.RESTORING: frozenset({_S.RUNNING}) | _ENDINGS,
        # Released: a clean shutdown releases the partition before it stops.
        _S.RUNNING: frozenset({_S.DRAINING, _S.RELEASED}) | _ENDINGS,
        # Back to running: the migration that asked for the drain was aborted.
        _S.DRAINING: frozenset({_S.RUNNING, _S.RELEASED}) | _ENDINGS,
        # A shutdown's release is followed by its stop.
        _S.RELEASED: frozenset({_S.STOPPED}),
        _S.REVOKED: frozenset(),
        _S.FAILED: frozenset(),
        _S.STOPPED: frozenset(),
    }
)


def check_transition(old: WorkerState, new: WorkerState) -> WorkerState:
    """Return `new` if a worker in `old` may move to it; raise IllegalWorkerTransition otherwise.

    Staying in a state is not a transition and is always allowed.
    """
    if new != old and new not in TRANSITIONS[old]:
        raise IllegalWorkerTransition(old, new, tuple(sorted(TRANSITIONS[old])))
    return new
