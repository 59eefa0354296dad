"""The simulation's clock: simulated time and seeded entropy, installed as the library's `Clock`."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

#: Simulated time is counted from here (any fixed instant would do).
EPOCH_START = datetime(2030, 1, 1, tzinfo=UTC)


class SimClock:
    """Simulated time (seconds since `EPOCH_START`) and seeded entropy: the `Clock` the library reads."""

    def __init__(self, entropy: random.Random) -> None:
        self.seconds = 0.0
        self._entropy = entropy
        #: The instant last asked for, and its seconds: many reads come between two moves of the clock.
        self._now = (0.0, EPOCH_START)

    def now(self) -> datetime:
        """The simulated instant."""
        if self._now[0] != self.seconds:
            self._now = (self.seconds, EPOCH_START + timedelta(seconds=self.seconds))
        return self._now[1]

    def random_bytes(self, n: int) -> bytes:
        """Seeded bytes (record write ids, ULIDs)."""
        return self._entropy.randbytes(n)

    def monotonic(self) -> float:
        """The simulated seconds."""
        return self.seconds
