"""What the actors see of the world: the `SimWorld` protocol they are written against.

The actors take one decision per step through the real library and consult the
world only for what a process cannot know by itself: the scheduler's random
source and simulated clock, the scenario's shape and reverted fixes, whether
faults still last, a store client of their own, and the checker that judges
what they read. `World` provides all of it; the actors never import it.
"""

from __future__ import annotations

import random
from typing import NoReturn, Protocol

from laminar_orchestration.protocol.tasks import MigrationConfig
from laminar_orchestration.store import ObjectStore

from .invariants import Checker, EventDecoder, InvariantViolation
from .store import MemoryObjectStore


class SimTime(Protocol):
    """The simulated clock as the actors read it."""

    #: Simulated seconds since the scenario started.
    seconds: float


class FixReverts(Protocol):
    """The reverted fixes the actors themselves act on (the others are patched into the library)."""

    @property
    def revert_grant_seal(self) -> bool:
        """A grantee reads the chain as it stands instead of sealing it at its epoch."""
        ...

    @property
    def revert_lost_fence_fix(self) -> bool:
        """A driver leaves a record whose forced fence found the epoch moved as it is."""
        ...


class ScenarioShape(Protocol):
    """What the actors read of the scenario's configuration."""

    @property
    def partitions(self) -> int:
        """How many partitions the cluster has."""
        ...

    @property
    def knobs(self) -> FixReverts:
        """Which fixes are reverted."""
        ...


class SimWorld(Protocol):
    """Everything an actor uses of the world it runs in."""

    #: The scheduler's one seeded random source: every random decision an actor takes draws from it.
    rng: random.Random
    #: The store's contents, read in one instant (no scheduling point).
    memory: MemoryObjectStore
    #: Decodes a source batch's events.
    decoder: EventDecoder
    #: The invariants checked on every write, and what they know of the chains and grants.
    checker: Checker
    #: The migrations' timeouts.
    migration_config: MigrationConfig
    #: Whether the fault phase lasts.
    faults_on: bool
    #: Objects the auditor's sweeps deleted, counted over the scenario.
    swept: int

    @property
    def config(self) -> ScenarioShape:
        """The scenario."""
        ...

    @property
    def clock(self) -> SimTime:
        """Simulated time."""
        ...

    def client_store(self) -> ObjectStore:
        """A new store client for a process."""
        ...

    def violated(self, violation: InvariantViolation) -> NoReturn:
        """End the run with a broken promise an actor found."""
        ...
