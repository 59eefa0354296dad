"""The time and entropy the protocol reads: the system clock by default, another clock installed with
`use_clock` for one block and one context only (a simulation in one thread never changes another's time)."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta

import pytest

from laminar_dev.sim.clock import EPOCH_START, SimClock
from laminar_orchestration import clock
from laminar_orchestration.clock import SYSTEM_CLOCK, SystemClock, current, use_clock


def test_the_system_clock_reads_utc_wall_time_and_os_entropy() -> None:
    before = datetime.now(UTC)
    at = SYSTEM_CLOCK.now()
    after = datetime.now(UTC)
    assert at.tzinfo is not None and at.utcoffset() == timedelta(0)
    assert before <= at <= after
    nonces = {SYSTEM_CLOCK.random_bytes(16) for _ in range(50)}
    assert len(nonces) == 50 and all(len(n) == 16 for n in nonces)
    assert SYSTEM_CLOCK.random_bytes(0) == b""
    assert isinstance(SYSTEM_CLOCK, SystemClock)


def test_the_system_clock_is_in_effect_unless_another_is_installed() -> None:
    assert current() is SYSTEM_CLOCK
    sim = SimClock(random.Random(1))
    with use_clock(sim) as installed:
        assert installed is sim and clock.current() is sim
        assert current().now() == EPOCH_START
        sim.seconds = 90.0  # the simulator moves time; readers see it at once
        assert current().now() == EPOCH_START + timedelta(seconds=90)
    assert current() is SYSTEM_CLOCK


def test_use_clock_nests_and_restores_the_outer_clock_even_when_the_block_raises() -> None:
    outer, inner = SimClock(random.Random(1)), SimClock(random.Random(2))
    with use_clock(outer):
        with pytest.raises(RuntimeError, match="inside"), use_clock(inner):
            assert current() is inner
            raise RuntimeError("inside")
        assert current() is outer
    assert current() is SYSTEM_CLOCK


def test_a_clock_installed_in_one_thread_leaves_other_threads_on_theirs() -> None:
    sim = SimClock(random.Random(1))
    installed, checked = threading.Event(), threading.Event()
    seen: list[object] = []

    def other_thread() -> None:
        installed.wait(10)
        seen.append(current())  # read while the main thread's block is open
        checked.set()

    t = threading.Thread(target=other_thread)
    t.start()
    with use_clock(sim):
        installed.set()
        assert checked.wait(10)
        assert current() is sim
    t.join(10)
    assert seen == [SYSTEM_CLOCK]


def test_a_seeded_clock_gives_the_same_entropy_on_every_run() -> None:
    """A simulation run is a pure function of its seed: the entropy the protocol reads is the clock's."""

    def draws(seed: int) -> list[bytes]:
        with use_clock(SimClock(random.Random(seed))):
            return [current().random_bytes(10) for _ in range(5)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
