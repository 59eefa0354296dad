"""Group commit: the writes many threads ask of one record at once go out as one.

The control plane's moves each change a node's assignment as their phases are recorded; when many
moves share a node (a failover), the states handed in while a write is under way, or within a short
linger once several callers are seen together, are written by one compare-and-swap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Generic, Protocol, TypeVar

from laminar_orchestration.identity import PartitionId


class Revised(Protocol):
    """A record with a revision: the newer of two is kept."""

    @property
    def revision(self) -> int: ...


V = TypeVar("V", bound=Revised)

#: How many of its last batches a `GroupCommit` remembers the outcome of, for late waiters.
_BATCHES_REMEMBERED = 256


#: How long the writer of a node's assignment waits for more states when its caller drives many moves
#: at a time (a failover's burst): one write for the moves whose phases end close together. A single
#: move's writes never wait.
ASSIGNMENT_LINGER_S = 0.03


class GroupCommit(Generic[V]):
    """Group commit of one node's assignment: the states callers hand in while a write is under way
    go out together in the next one (the latest revision of each partition). Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: dict[PartitionId, V] = {}
        self._next = 0  # the ticket the next caller gets
        self._done = -1  # every ticket up to this one is written
        self._writing = False
        self._changed: dict[int, bool] = {}  # the last ticket of a batch -> whether it changed the record

    def write(
        self,
        states: Mapping[PartitionId, V],
        write: Callable[[Mapping[PartitionId, V]], bool],
        linger_s: float = 0.0,
    ) -> bool:
        """Have `states` written by `write` (here or by the thread writing now); True if the batch that
        carried them changed the record. A failed write raises in the thread that made it; the others
        go on with the next batch. `linger_s`: how long the thread that writes waits for others to
        join its batch first."""
        with self._cond:
            ticket = self._next
            self._next += 1
            for p, state in states.items():
                held = self._pending.get(p)
                if held is None or held.revision <= state.revision:
                    self._pending[p] = state
            while True:
                if self._done >= ticket:
                    # The batch that carried it (long-forgotten ones: True, so the node is nudged).
                    return next((changed for last, changed in sorted(self._changed.items()) if last >= ticket), True)
                if not self._writing:
                    break
                self._cond.wait()
            self._writing = True
            if linger_s > 0:
                self._cond.wait(linger_s)  # others join this batch meanwhile (they wait on `_writing`)
            batch, self._pending = self._pending, {}
            last = self._next - 1
        changed = False
        try:
            changed = write(batch)
        except BaseException:
            with self._cond:
                for p, state in batch.items():  # back in line for the next writer
                    self._pending.setdefault(p, state)
                self._writing = False
                self._cond.notify_all()
            raise
        with self._cond:
            self._writing = False
            self._done = last
            self._changed[last] = changed
            if len(self._changed) > _BATCHES_REMEMBERED:
                del self._changed[min(self._changed)]
            self._cond.notify_all()
        return changed
