"""The base of every actor: one steppable simulated process, its status for the scheduler, and the
check each reader of a manifest chain makes of what it holds.
"""

from __future__ import annotations

import enum

from laminar_orchestration.protocol.chain import ManifestVersion

from .invariants import VoidEntryHeld
from .view import SimWorld


class ActorStatus(enum.Enum):
    """Whether the scheduler may step an actor."""

    UP = "up"
    CRASHED = "crashed"
    PAUSED = "paused"


class Actor:
    """One simulated process. `step` is one decision; `crash` forgets everything in memory."""

    name: str

    def __init__(self, world: SimWorld, name: str) -> None:
        self.world = world
        self.name = name
        self.status = ActorStatus.UP
        self.wake_at = 0.0
        #: When a crashed actor restarts, or a paused one resumes.
        self.back_at = 0.0
        #: On the scheduler's stack (mid-step, possibly preempted): not steppable.
        self.busy = False
        #: Crashed while preempted: dies at its next store call.
        self.crash_pending = False
        #: Ends for good at this simulated time (a zombie process); never otherwise.
        self.dies_at = float("inf")
        #: May write void entries (skips its client-side checks, or holds no grant's key).
        self.rogue = False
        #: Not part of the protocol (the sweeper, the standby, the intruder): its store calls do not
        #: count towards a scenario's protocol steps.
        self.observer = False

    def step(self) -> str:
        """Take one decision and carry it out; returns what it did (for the trace)."""
        raise NotImplementedError

    def crash(self) -> None:
        """Lose all in-memory state (the process died)."""
        self._fresh()

    def restart(self) -> None:
        """Start again after a crash, from nothing but the store."""
        self._fresh()

    def _fresh(self) -> None:
        """Set up the in-memory state a new process starts with (none by default)."""

    def idle(self, low: float, high: float) -> None:
        """Sleep (in simulated time) for a random while before the next step."""
        self.wake_at = self.world.clock.seconds + self.world.rng.uniform(low, high)


def hold(world: SimWorld, partition: int, version: ManifestVersion | None, reader: str) -> None:
    """`reader` takes `version` for the newest entry of `partition`'s chain: it must not be a void one."""
    if version is not None:
        seq = world.checker.is_void(partition, version.raw)
        if seq is not None:
            world.violated(VoidEntryHeld(partition, seq, reader))
