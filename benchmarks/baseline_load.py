"""The load both systems of the baseline comparison get: the same event stream, the same seeded key
spaces, and the true per-key counts their outputs are checked against; and the two systems' names
in the table.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from laminar_orchestration.protocol.producers import generate_events

KEYS = 1_000
EVENTS_PER_TICK = 1_000
TICK_S = 0.25
SEED = 2024
#: The seeded states: every key produced once before the load (~1 MB and ~100 MB of laminar state).
SMALL_KEYS = 25_000
BIG_KEYS = 2_700_000
SMALL_PREFIX, BIG_PREFIX = "a", "b"
SMALL_SEED, BIG_SEED = 1, 2

SS = "spark-ss"
LAMINAR = "laminar"


class EventStream:
    """The shared load: `EVENTS_PER_TICK` events over `KEYS` keys per tick, deterministic per tick."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.tick = 0

    def next(self) -> pa.Table:
        self.tick += 1
        return generate_events(EVENTS_PER_TICK, KEYS, self.seed * 100_003 + self.tick, 1)[0]


def truth(tables: Sequence[pa.Table]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in tables:
        grouped = t.group_by("key").aggregate([("value", "count")])
        for k, n in zip(grouped["key"].to_pylist(), grouped["value_count"].to_pylist(), strict=True):
            counts[k] = counts.get(k, 0) + n
    return counts
