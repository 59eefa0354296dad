"""ULIDs: 26 Crockford characters that sort by creation time (the writer's clock), carry that time
back out, follow a given ULID strictly, and never repeat, however many threads draw them."""

from __future__ import annotations

import random
import threading
import time

import pytest

from laminar_dev.sim.clock import EPOCH_START, SimClock
from laminar_orchestration.clock import use_clock
from laminar_orchestration.ulid import ULID_PATTERN, decode_ulid, next_ulid, ulid_time_ms
from tests.threads import run_together

EPOCH_START_MS = int(EPOCH_START.timestamp() * 1000)


def test_a_ulid_is_well_formed_and_carries_its_writers_time() -> None:
    sim = SimClock(random.Random(3))
    with use_clock(sim):
        first = next_ulid()
        sim.seconds = 12.345
        later = next_ulid()
    for ulid in (first, later):
        assert len(ulid) == 26 and ULID_PATTERN.match(ulid), ulid
    assert ulid_time_ms(first) == EPOCH_START_MS
    assert ulid_time_ms(later) == EPOCH_START_MS + 12_345
    # Under the system clock, the wall time in ms since the Unix epoch.
    assert abs(ulid_time_ms(next_ulid()) - time.time() * 1000) < 5_000


def test_ulids_sort_by_time_whatever_their_randomness() -> None:
    sim = SimClock(random.Random(5))
    drawn = []
    with use_clock(sim):
        for step in range(200):
            sim.seconds = step * 0.001  # one ms apart: the 80 random bits must never outweigh the time
            drawn.append(next_ulid())
    assert sorted(drawn) == drawn and len(set(drawn)) == len(drawn)
    # The text order is the numeric order, so a string comparison compares creation times.
    assert [decode_ulid(u) for u in drawn] == sorted(decode_ulid(u) for u in drawn)


def test_a_ulid_after_another_is_strictly_greater_even_when_the_clock_is_behind() -> None:
    sim = SimClock(random.Random(1))
    with use_clock(sim):
        sim.seconds = 3600.0
        ahead = next_ulid()  # written by a clock an hour ahead of the next writer's
        sim.seconds = 0.0
        follower = next_ulid(ahead)
        assert follower > ahead and decode_ulid(follower) == decode_ulid(ahead) + 1
        sim.seconds = 7200.0
        fresh = next_ulid(ahead)  # a clock past `after` needs no bump: its own time shows
    assert fresh > ahead and ulid_time_ms(fresh) == EPOCH_START_MS + 7_200_000


def test_a_seeded_clock_draws_the_same_ulids() -> None:
    def draws(seed: int) -> list[str]:
        with use_clock(SimClock(random.Random(seed))):
            return [next_ulid() for _ in range(5)]

    assert draws(11) == draws(11)
    assert draws(11) != draws(12)


def test_ulids_drawn_by_many_threads_at_once_are_unique_and_each_threads_chain_increases() -> None:
    chains: list[list[str]] = [[] for _ in range(8)]
    lock = threading.Lock()

    def draw(i: int) -> None:
        chain: list[str] = []
        last: str | None = None
        for _ in range(500):
            last = next_ulid(last)
            chain.append(last)
        with lock:
            chains[i] = chain

    assert run_together(draw, 8, timeout_s=30) == []
    everything = [u for chain in chains for u in chain]
    assert len(everything) == 8 * 500 == len(set(everything))
    assert all(chain == sorted(chain) and all(ULID_PATTERN.match(u) for u in chain) for chain in chains)


@pytest.mark.parametrize(
    "bad", ["01J000000000000000000000IL", "01j0000000000000000000000a", "01J00000000000000000000-0A"]
)
def test_decoding_refuses_characters_outside_crockford_base32(bad: str) -> None:
    assert not ULID_PATTERN.match(bad)
    with pytest.raises(ValueError):
        decode_ulid(bad)


def test_the_pattern_refuses_a_value_beyond_128_bits_and_the_wrong_length() -> None:
    assert ULID_PATTERN.match("7ZZZZZZZZZZZZZZZZZZZZZZZZZ")  # the largest 128-bit value
    assert not ULID_PATTERN.match("8ZZZZZZZZZZZZZZZZZZZZZZZZZ")
    assert not ULID_PATTERN.match("01J000000000000000000000A")
    assert decode_ulid("7ZZZZZZZZZZZZZZZZZZZZZZZZZ") == 2**128 - 1
