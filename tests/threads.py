"""Threads for concurrency tests: released together, all joined, every error seen."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_together(target: Callable[[int], object], n: int, timeout_s: float) -> list[BaseException]:
    """Run `target(0)` .. `target(n - 1)` on `n` threads released together by a barrier; wait for them all.

    Returns what they raised: no error is hidden. A thread still running after `timeout_s` fails the
    test, since what it was to do is then incomplete.
    """
    barrier = threading.Barrier(n)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout_s)
            target(i)
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in threads), f"a thread still runs after {timeout_s} s"
    return errors
