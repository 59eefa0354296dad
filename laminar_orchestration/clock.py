"""The time and entropy the protocol reads, replaceable for a deterministic simulation.

Every decision that depends on time (heartbeat liveness, migration deadlines,
record timestamps, ULIDs) reads `current().now()` (an age or interval `current().monotonic()`), and every nonce (record
write ids, ULID randomness) comes from `current().random_bytes`. Production
uses `SYSTEM_CLOCK`; the simulator installs its own clock with `use_clock` for
the duration of a run, so a run is a pure function of its seed.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """A source of the current time and of random bytes."""

    def now(self) -> datetime:
        """The current time, timezone-aware (UTC)."""
        ...

    def random_bytes(self, n: int) -> bytes:
        """`n` random bytes (nonces, ULID randomness)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for ages and intervals, not for records)."""
        ...


class SystemClock:
    """The wall clock and the operating system's entropy."""

    def now(self) -> datetime:
        """`datetime.now(UTC)`."""
        return datetime.now(UTC)

    def random_bytes(self, n: int) -> bytes:
        """`os.urandom(n)`."""
        return os.urandom(n)

    def monotonic(self) -> float:
        """`time.monotonic()`."""
        return time.monotonic()


SYSTEM_CLOCK: Clock = SystemClock()
# A context variable, not a global: a simulation in one thread never changes another thread's time.
_CURRENT: ContextVar[Clock] = ContextVar("laminar_clock", default=SYSTEM_CLOCK)


def current() -> Clock:
    """The clock in effect (the system clock unless `use_clock` installed another)."""
    return _CURRENT.get()


@contextlib.contextmanager
def use_clock(clock: Clock) -> Iterator[Clock]:
    """Install `clock` for the current context until the block ends."""
    token = _CURRENT.set(clock)
    try:
        yield clock
    finally:
        _CURRENT.reset(token)
