"""Tests of the windowed cluster-epoch fence: unit tests and an in-process integration.

Ordering between threads uses Events and a polled count of queued slides,
never sleeps; the short ``Event.wait`` timeouts only confirm that a thread is
still blocked (a broken lock makes them fail, never a slow machine).
"""

from __future__ import annotations

import pickle
import random
import threading
import time
from collections.abc import Callable
from dataclasses import FrozenInstanceError

import pytest
from pydantic import ValidationError

from laminar_orchestration.protocol.cluster_epoch import (
    ClusterEpochError,
    ClusterEpochFenceTimeout,
    ClusterEpochSnapshot,
    ClusterEpochWindow,
    EpochFence,
    StaleClusterEpoch,
    WindowMetrics,
)
from tests.threads import run_together

N = 7
BLOCKED = 0.05  # how long a blocked thread must stay blocked to count as waiting
JOIN = 5.0


def _wait_until(predicate: Callable[[], bool], timeout: float = JOIN) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def _queued_slides(w: ClusterEpochWindow) -> int:
    # White-box: the number of fences waiting for the exclusive hold. It tells
    # deterministically that a slide is blocked, rather than guessing from time.
    with w._cond:
        return w._writers_waiting


def _establish(w: ClusterEpochWindow, *epochs: int) -> None:
    for epoch in epochs:
        with w.fence(epoch):
            pass


def _established(*epochs: int) -> ClusterEpochWindow:
    """A new window that fenced `epochs` in turn (each hold released at once)."""
    w = ClusterEpochWindow()
    _establish(w, *epochs)
    return w


class _Holder:
    """A thread that fences ``epoch`` and keeps the hold until `finish`."""

    def __init__(self, w: ClusterEpochWindow, epoch: int) -> None:
        self.w = w
        self.epoch = epoch
        self.entered = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()
        self.fence: EpochFence | None = None
        self.window_inside: tuple[int | None, int | None] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self.w.fence(self.epoch, timeout=JOIN) as fence:
                self.fence = fence
                self.window_inside = self.w.window()
                self.entered.set()
                if not self.release.wait(JOIN):
                    raise AssertionError("holder never released")
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def start(self) -> _Holder:
        self.thread.start()
        return self

    def hold(self) -> _Holder:
        """Start and wait until the fence is held."""
        self.start()
        assert self.entered.wait(JOIN), f"fence of {self.epoch} not granted: {self.error!r}"
        return self

    def finish(self) -> None:
        self.release.set()
        self.thread.join(JOIN)
        assert not self.thread.is_alive()


# --- unit tests -------------------------------------------------------------


def test_window_sliding() -> None:
    w = ClusterEpochWindow()
    assert w.window() == (None, None)

    with w.fence(N) as f:
        assert f == EpochFence(N, N, N, new_epoch=True)
    assert w.window() == (N, N)
    assert (w.oldest_accepted, w.latest_seen) == (None, N)

    with w.fence(N + 1) as f:
        assert f == EpochFence(N + 1, N, N + 1, new_epoch=True)
    assert w.window() == (N, N + 1)

    with w.fence(N + 2) as f:
        assert f == EpochFence(N + 2, N + 1, N + 2, new_epoch=True)
    assert w.window() == (N + 1, N + 2)
    assert (w.oldest_accepted, w.latest_seen) == (N + 1, N + 2)

    with pytest.raises(StaleClusterEpoch), w.fence(N):
        pass


def test_concurrent_fencing_two_holders_of_same_epoch() -> None:
    w = _established(N)
    a = _Holder(w, N).hold()
    b = _Holder(w, N).hold()  # granted while `a` still holds: shared
    assert a.fence == b.fence == EpochFence(N, N, N, new_epoch=False)
    a.finish()
    b.finish()
    assert a.error is None and b.error is None


def test_new_epoch_waits_for_holders_then_previous_epoch_stays_accepted() -> None:
    w = _established(N)
    a = _Holder(w, N).hold()
    b = _Holder(w, N).hold()

    c = _Holder(w, N + 1).start()
    assert _wait_until(lambda: _queued_slides(w) == 1)
    assert not c.entered.wait(BLOCKED)
    assert w.window() == (N, N)

    a.finish()
    assert not c.entered.wait(BLOCKED)  # b still holds N
    assert w.window() == (N, N)

    b.finish()
    assert c.entered.wait(JOIN)
    assert c.fence == EpochFence(N + 1, N, N + 1, new_epoch=True)
    # The slide kept N: a commit of N is accepted while N+1 is held.
    with w.fence(N, timeout=JOIN) as f:
        assert f == EpochFence(N, N, N + 1, new_epoch=False)
    c.finish()
    assert c.error is None


def test_evicting_slide_waits_for_holders_then_rejects_evicted_epoch() -> None:
    w = _established(N, N + 1)
    a = _Holder(w, N).hold()
    b = _Holder(w, N + 1).hold()
    assert a.window_inside == (N, N + 1)

    c = _Holder(w, N + 2).start()
    assert _wait_until(lambda: _queued_slides(w) == 1)
    assert not c.entered.wait(BLOCKED)
    a.finish()
    assert not c.entered.wait(BLOCKED)
    assert w.window() == (N, N + 1)  # N stays valid until its holders are gone

    b.finish()
    assert c.entered.wait(JOIN)
    assert c.fence == EpochFence(N + 2, N + 1, N + 2, new_epoch=True)
    with pytest.raises(StaleClusterEpoch) as info, w.fence(N, timeout=JOIN):
        pass
    assert info.value == StaleClusterEpoch(N, N + 1, N + 2)
    with w.fence(N + 1, timeout=JOIN) as f:
        assert not f.new_epoch
    c.finish()
    assert a.error is None and b.error is None and c.error is None


def test_rejection_below_window() -> None:
    w = _established(N, N + 1)
    with pytest.raises(StaleClusterEpoch) as info, w.fence(N - 1):
        pytest.fail("a stale epoch must not enter the fence")
    err = info.value
    assert isinstance(err, ClusterEpochError)
    assert (err.epoch, err.oldest_accepted, err.latest_seen) == (N - 1, N, N + 1)
    assert w.window() == (N, N + 1)


def test_non_contiguous_epochs() -> None:
    w = _established(N)
    assert w.window() == (N, N)
    _establish(w, N + 5)
    assert w.window() == (N, N + 5)
    for epoch in range(N + 1, N + 5):
        with w.fence(epoch) as f:
            assert f == EpochFence(epoch, N, N + 5, new_epoch=False)
    assert w.window() == (N, N + 5)


def test_non_contiguous_jump_slides_from_previous_latest() -> None:
    w = _established(5, 6)
    _establish(w, 10)
    assert w.window() == (6, 10)
    for epoch in (6, 7, 8, 9, 10):
        with w.fence(epoch):
            pass
    with pytest.raises(StaleClusterEpoch) as info, w.fence(5):
        pass
    assert info.value == StaleClusterEpoch(5, 6, 10)


def test_snapshot_and_recovery_collapse_to_max_applied() -> None:
    w = ClusterEpochWindow()
    with w.fence(N):
        w.mark_applied(N)
    with w.fence(N + 1):
        w.mark_applied(N + 1)
    assert w.window() == (N, N + 1)

    snap = w.snapshot()
    assert snap.model_dump() == {"max_applied": N + 1}  # window fields are volatile
    restored = ClusterEpochSnapshot.model_validate_json(snap.model_dump_json())
    r = ClusterEpochWindow.recover(restored)

    assert r.window() == (N + 1, N + 1)
    assert (r.oldest_accepted, r.latest_seen, r.max_applied) == (None, None, N + 1)
    with pytest.raises(StaleClusterEpoch) as info, r.fence(N):
        pass
    assert info.value == StaleClusterEpoch(N, N + 1, N + 1)
    with r.fence(N + 1) as f:
        assert f == EpochFence(N + 1, N + 1, N + 1, new_epoch=False)
    with r.fence(N + 2) as f:
        assert f == EpochFence(N + 2, N + 1, N + 2, new_epoch=True)
    assert r.window() == (N + 1, N + 2)


def test_snapshot_without_applied_epoch_recovers_empty() -> None:
    w = _established(N)  # fenced but never made durable
    snap = w.snapshot()
    assert snap.max_applied is None
    r = ClusterEpochWindow.recover(snap)
    assert r.window() == (None, None)
    _establish(r, N - 1)
    assert r.window() == (N - 1, N - 1)

    with pytest.raises(ValidationError):
        ClusterEpochSnapshot(max_applied=0)
    with pytest.raises(ValidationError):
        ClusterEpochSnapshot.model_validate({"max_applied": 3, "latest_seen": 4})


# --- edge cases -------------------------------------------------------------


def test_out_of_order_arrivals() -> None:
    w = _established(N + 1)
    assert w.window() == (N + 1, N + 1)
    with pytest.raises(StaleClusterEpoch) as info, w.fence(N):
        pass
    assert info.value == StaleClusterEpoch(N, N + 1, N + 1)
    _establish(w, N + 2)
    assert w.window() == (N + 1, N + 2)


def _hold_and_queue_slides(w: ClusterEpochWindow, held: int, *slides: int) -> tuple[_Holder, list[_Holder]]:
    """`held` fenced and held, then a fence of each of `slides` started: each queued behind the hold."""
    holder = _Holder(w, held).hold()
    queued = [_Holder(w, epoch).start() for epoch in slides]
    assert _wait_until(lambda: _queued_slides(w) == len(slides))
    return holder, queued


def test_waiting_slide_holds_back_new_shared_fences() -> None:
    w = _established(N)
    a, [c] = _hold_and_queue_slides(w, N, N + 1)

    # Writer preference: a steady flow of commits must not starve the slide.
    d = _Holder(w, N).start()
    assert not d.entered.wait(BLOCKED)

    a.finish()
    assert c.entered.wait(JOIN) and d.entered.wait(JOIN)
    assert d.fence == EpochFence(N, N, N + 1, new_epoch=False)  # entered after the slide
    c.finish()
    d.finish()
    assert c.error is None and d.error is None


def test_fence_queued_behind_evicting_slide_is_rejected() -> None:
    w = _established(N, N + 1)
    a, [c] = _hold_and_queue_slides(w, N + 1, N + 2)
    d = _Holder(w, N).start()  # in the window now, but queued behind the slide
    assert not d.entered.wait(BLOCKED)

    a.finish()
    assert c.entered.wait(JOIN)
    assert d.done.wait(JOIN)
    # Double-check after waiting: the slide pushed N out.
    assert d.error == StaleClusterEpoch(N, N + 1, N + 2)
    assert not d.entered.is_set()
    c.finish()


def test_concurrent_fences_of_same_new_epoch_slide_once() -> None:
    w = _established(N)
    a, [c1, c2] = _hold_and_queue_slides(w, N, N + 1, N + 1)
    a.finish()
    assert c1.entered.wait(JOIN) and c2.entered.wait(JOIN)
    assert c1.fence is not None and c2.fence is not None
    assert sorted([c1.fence.new_epoch, c2.fence.new_epoch]) == [False, True]
    assert w.metrics().window_slides == 2  # N, then N+1 once
    c1.finish()
    c2.finish()


def test_slide_past_a_queued_epoch_grants_it_instead_of_rejecting() -> None:
    w = _established(N)
    a, [high, low] = _hold_and_queue_slides(w, N, N + 2, N + 1)
    a.finish()
    # Either slide may win; neither fence may be rejected.
    assert _wait_until(lambda: high.entered.is_set() or low.entered.is_set())
    if low.entered.is_set() and low.fence is not None and low.fence.new_epoch:
        # N+1 slid first: N+2 must wait for its hold, then slide to [N+1, N+2].
        assert not high.entered.wait(BLOCKED)
        low.finish()
        assert high.entered.wait(JOIN)
        assert high.fence == EpochFence(N + 2, N + 1, N + 2, new_epoch=True)
    else:
        # N+2 slid first to [N, N+2]: the queued N+1 is now inside the window
        # and joins it (a re-check against the window before the wait would reject it).
        assert high.entered.wait(JOIN) and low.entered.wait(JOIN)
        assert high.fence == EpochFence(N + 2, N, N + 2, new_epoch=True)
        assert low.fence == EpochFence(N + 1, N, N + 2, new_epoch=False)
        low.finish()
    high.finish()
    assert high.error is None and low.error is None
    assert w.latest_seen == N + 2


def test_concurrent_window_transitions_random_epochs() -> None:
    w = ClusterEpochWindow()
    threads, per_thread, max_epoch = 16, 60, 40
    lock = threading.Lock()
    attempted: list[int] = []
    granted: list[tuple[EpochFence, tuple[int | None, int | None]]] = []
    slides: list[int] = []
    rejected: list[StaleClusterEpoch] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(per_thread):
            epoch = rng.randint(1, max_epoch)
            with lock:
                attempted.append(epoch)
            try:
                with w.fence(epoch, timeout=JOIN) as fence:
                    seen = w.window()  # recorded inside the hold
                    with lock:
                        granted.append((fence, seen))
                        if fence.new_epoch:
                            # No slide can happen while this is held, so
                            # appends are in slide order.
                            slides.append(fence.latest_seen)
                    if rng.random() < 0.2:
                        time.sleep(0.0005)
            except StaleClusterEpoch as exc:
                with lock:
                    rejected.append(exc)

    unexpected = run_together(worker, threads, 30)
    assert unexpected == []

    assert len(granted) + len(rejected) == threads * per_thread
    assert w.latest_seen == max(attempted)
    for fence, (oldest, latest) in granted:
        # The window seen inside the hold is the one granted, and contains the epoch.
        assert (oldest, latest) == (fence.oldest_accepted, fence.latest_seen)
        assert fence.oldest_accepted <= fence.epoch <= fence.latest_seen
    assert slides == sorted(set(slides))  # strictly increasing
    assert rejected, "random epochs below the window must have been rejected"
    for err in rejected:
        assert err.epoch < err.oldest_accepted <= err.latest_seen

    m = w.metrics()
    assert m.new_epoch_fences == m.window_slides == len(slides)
    assert m.new_epoch_fences + m.same_epoch_fences == len(granted)
    assert m.epochs_rejected_stale == len(rejected)
    assert _queued_slides(w) == 0


def test_metrics_counters() -> None:
    w = ClusterEpochWindow()
    assert w.metrics() == WindowMetrics()

    _establish(w, N, N)
    assert w.metrics() == WindowMetrics(window_slides=1, window_size=1, new_epoch_fences=1, same_epoch_fences=1)
    _establish(w, N + 1, N + 3)
    assert w.metrics() == WindowMetrics(window_slides=3, window_size=3, new_epoch_fences=3, same_epoch_fences=1)
    for stale in (N - 1, N):
        with pytest.raises(StaleClusterEpoch), w.fence(stale):
            pass
    assert w.metrics() == WindowMetrics(
        window_slides=3,
        window_size=3,
        epochs_rejected_stale=2,
        last_rejected_epoch_gap=1,  # window starts at N+1, last rejected N
        new_epoch_fences=3,
        same_epoch_fences=1,
    )
    with pytest.raises(StaleClusterEpoch), w.fence(N - 4):
        pass
    assert w.metrics().last_rejected_epoch_gap == 5
    with pytest.raises(FrozenInstanceError):
        w.metrics().window_slides = 0  # type: ignore[misc]


# --- integration tests, in process ----------------------------------------------


def test_concurrent_producers_with_mixed_epochs() -> None:
    w = _established(N)
    upload_started = threading.Event()
    upload_may_finish = threading.Event()
    results: dict[str, EpochFence | BaseException] = {}

    def producer_a() -> None:
        epoch = N  # taken before the rebalance
        upload_started.set()
        try:
            assert upload_may_finish.wait(JOIN)  # slow upload
            with w.fence(epoch, timeout=JOIN) as fence:
                w.mark_applied(epoch)
                results["a"] = fence
        except BaseException as exc:
            results["a"] = exc

    def producer_b() -> None:
        try:
            with w.fence(N + 1, timeout=JOIN) as fence:
                w.mark_applied(N + 1)
                results["b"] = fence
        except BaseException as exc:
            results["b"] = exc

    a = threading.Thread(target=producer_a)
    a.start()
    assert upload_started.wait(JOIN)
    b = threading.Thread(target=producer_b)
    b.start()
    b.join(JOIN)  # B completes first
    assert results["b"] == EpochFence(N + 1, N, N + 1, new_epoch=True)
    upload_may_finish.set()
    a.join(JOIN)
    # A's epoch is one behind but still inside the window: no spurious failure.
    assert results["a"] == EpochFence(N, N, N + 1, new_epoch=False)
    assert w.max_applied == N + 1


def test_producer_holding_fence_delays_rebalance_and_both_succeed() -> None:
    w = _established(N)
    a = _Holder(w, N).hold()  # slow commit in flight under the fence
    b = _Holder(w, N + 1).start()
    assert _wait_until(lambda: _queued_slides(w) == 1)
    w.mark_applied(N)  # A's commit becomes durable, then A releases
    a.finish()
    assert b.entered.wait(JOIN)
    b.finish()
    assert a.error is None and b.error is None
    assert w.window() == (N, N + 1)
    assert w.max_applied == N


def test_rapid_epoch_transitions() -> None:
    w = ClusterEpochWindow()
    for epoch in range(N, N + 4):
        with w.fence(epoch):
            w.mark_applied(epoch)
    for ok in (N + 2, N + 3):
        with w.fence(ok) as f:
            assert not f.new_epoch
    for stale in (N + 1, N):
        with pytest.raises(StaleClusterEpoch) as info, w.fence(stale):
            pass
        assert info.value == StaleClusterEpoch(stale, N + 2, N + 3)


# --- API contract -------------------------------------------------------------


def test_reserved_and_invalid_epochs() -> None:
    w = ClusterEpochWindow()
    for bad in (0, -3):
        with pytest.raises(ValueError), w.fence(bad):
            pass
        with pytest.raises(ValueError):
            w.mark_applied(bad)
    with pytest.raises(TypeError), w.fence("3"):  # type: ignore[arg-type]
        pass
    assert w.window() == (None, None)
    assert w.metrics() == WindowMetrics()


def test_mark_applied_only_rises_and_requires_fenced_epoch() -> None:
    w = ClusterEpochWindow()
    with pytest.raises(ValueError):
        w.mark_applied(N)  # nothing fenced yet
    _establish(w, N, N + 1)
    w.mark_applied(N + 1)
    w.mark_applied(N)
    assert w.max_applied == N + 1
    with pytest.raises(ValueError):
        w.mark_applied(N + 2)
    assert w.snapshot().max_applied == N + 1


def test_fence_timeout_is_typed_and_leaves_no_queued_slide() -> None:
    w = _established(N)
    a = _Holder(w, N).hold()
    with pytest.raises(ClusterEpochFenceTimeout) as info, w.fence(N + 1, timeout=0.05):
        pass
    assert info.value == ClusterEpochFenceTimeout(N + 1, 0.05)
    assert _queued_slides(w) == 0
    with w.fence(N, timeout=JOIN):  # not held back by the abandoned slide
        pass
    a.finish()
    assert w.window() == (N, N)


def test_exception_inside_fence_releases_the_hold() -> None:
    w = ClusterEpochWindow()
    with pytest.raises(RuntimeError), w.fence(N):
        raise RuntimeError("commit failed")
    # A leaked shared hold would make this slide time out.
    with pytest.raises(StaleClusterEpoch), w.fence(N + 1, timeout=JOIN):
        raise StaleClusterEpoch(1, 2, 3)  # frozen fields survive contextlib's re-raise
    with w.fence(N + 2, timeout=JOIN) as f:
        assert f.new_epoch


def test_stale_error_is_a_typed_immutable_value() -> None:
    err = StaleClusterEpoch(epoch=3, oldest_accepted=5, latest_seen=6)
    assert err == StaleClusterEpoch(3, 5, 6)
    assert hash(err) == hash(StaleClusterEpoch(3, 5, 6))
    assert pickle.loads(pickle.dumps(err)) == err
    assert "3" in str(err) and "[5, 6]" in str(err)
    with pytest.raises(FrozenInstanceError):
        err.epoch = 4  # type: ignore[misc]
    timeout = ClusterEpochFenceTimeout(epoch=2, timeout=0.5)
    assert pickle.loads(pickle.dumps(timeout)) == timeout
