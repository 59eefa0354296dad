"""Windowed fencing of the *cluster epoch* (membership generation) on a node's commit path.

The cluster epoch is bumped on every rebalance. A commit carries the cluster
epoch its batch was started under, and must *fence* that epoch before it is
made durable. Accepting only the newest epoch would fail the in-flight work of
every partition that a rebalance did not move, so a two-epoch
window ``[oldest_accepted, latest_seen]`` is accepted instead:

=================  ==========================
event              window afterwards
=================  ==========================
initial            ``[]``
first epoch N      ``[N]``
N + 1              ``[N, N+1]``
N + 2              ``[N+1, N+2]`` (N is out)
``[5, 6]`` then 10 ``[6, 10]`` (7..9 accepted)
=================  ==========================

Epochs below the window are rejected with `StaleClusterEpoch`, which keeps the
accepted epochs monotonic. The partition epoch (ownership) is strict and is
handled by `laminar_orchestration.protocol.fencing`, not here.

Concurrency is a reader-writer lock on one `threading.Condition`: a fence of
an epoch inside the window is a shared hold, held while the commit is made
durable; an epoch beyond the window needs the exclusive hold to slide the
window, which therefore waits until no commit is in flight, then downgrades to
a shared hold without letting anyone in between. So while any fence is held
the window cannot move, and an epoch pushed out of the window has no commit in
flight.

Only ``max_applied`` is persisted (`ClusterEpochSnapshot`); the window is
volatile and collapses to ``[max_applied]`` on `ClusterEpochWindow.recover`.

Rules that keep an epoch inside the window from being rejected or starved:

* The ``or_else(get_applied_epoch)`` fallback is applied everywhere (window
  test and slide, not only the bounds read), so a recovered window really
  accepts ``max_applied`` and the next epoch slides it to ``[max_applied, E]``.
* The double-check after waiting re-classifies the epoch against the current
  window: an epoch that another thread's slide brought *into* the window is
  granted instead of rejected.
* Waiting slides block new shared holds (writer preference) so a steady flow
  of commits cannot starve a rebalance.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from laminar_orchestration.errors import FencedError, LaminarError, UnavailableError
from laminar_orchestration.identity import RESERVED_EPOCH

__all__ = [
    "ClusterEpochError",
    "ClusterEpochFenceTimeout",
    "ClusterEpochSnapshot",
    "ClusterEpochWindow",
    "EpochFence",
    "StaleClusterEpoch",
    "WindowMetrics",
]

_log = logging.getLogger(__name__)


# --- errors ---------------------------------------------------------------


class ClusterEpochError(LaminarError):
    """Base of the cluster-epoch fencing errors (typed values: compare fields, never messages)."""


class StaleClusterEpoch(ClusterEpochError, FencedError):
    """The epoch is below the acceptance window: the commit must be abandoned.

    ``oldest_accepted``/``latest_seen`` are the window at the time of rejection,
    so ``epoch < oldest_accepted`` always holds.
    """

    epoch: int
    oldest_accepted: int
    latest_seen: int

    message = "stale cluster epoch {epoch}: below the accepted window [{oldest_accepted}, {latest_seen}]"


class ClusterEpochFenceTimeout(ClusterEpochError, UnavailableError):
    """The fence could not be acquired within ``timeout`` seconds (holders did not finish)."""

    epoch: int
    timeout: float

    message = "timed out after {timeout}s waiting to fence cluster epoch {epoch}"


# --- values ---------------------------------------------------------------


@dataclass(frozen=True)
class EpochFence:
    """A granted fence: proof that ``epoch`` was inside the window while it is held.

    ``oldest_accepted``/``latest_seen`` are the window at grant time; it cannot
    move until the fence is released. ``new_epoch`` is True when this fence slid
    the window.
    """

    epoch: int
    oldest_accepted: int
    latest_seen: int
    new_epoch: bool


@dataclass(frozen=True)
class WindowMetrics:
    """Point-in-time copy of the window counters.

    ``window_slides`` counts every advance of ``latest_seen``, including the one
    that establishes the first window. ``window_size`` is the current width
    ``latest - oldest + 1`` (0 while empty). ``last_rejected_epoch_gap`` is
    ``oldest_accepted - epoch`` of the last rejection (0 if none).
    """

    window_slides: int = 0
    window_size: int = 0
    epochs_rejected_stale: int = 0
    last_rejected_epoch_gap: int = 0
    new_epoch_fences: int = 0
    same_epoch_fences: int = 0


class ClusterEpochSnapshot(BaseModel):
    """The persisted part of the window: only ``max_applied``.

    ``latest_seen``/``oldest_accepted`` describe in-flight work and are rebuilt
    by the first fence after recovery.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_applied: int | None = Field(default=None, ge=1)


def _check_epoch(epoch: int) -> None:
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise TypeError(f"cluster epoch must be an int, got {type(epoch).__name__}")
    if epoch <= RESERVED_EPOCH:
        raise ValueError(f"cluster epoch must be >= 1 (0 is reserved), got {epoch}")


# --- the window -----------------------------------------------------------


class ClusterEpochWindow:
    """Two-epoch acceptance window for the cluster epoch, with fencing for commits.

    Thread-safe. Typical use on the commit path::

        with window.fence(batch.cluster_epoch):
            publish_commit(...)
            window.mark_applied(batch.cluster_epoch)

    Fences are not reentrant: a thread holding one must not fence again, since
    a waiting slide blocks new holds until the held one is released.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._latest_seen: int | None = None
        self._oldest_accepted: int | None = None
        self._max_applied: int | None = None
        # Reader-writer state. The exclusive hold is never *held* across a
        # release of the mutex: once shared holders are gone the slide and
        # the downgrade happen in one critical section.
        self._readers = 0
        self._writers_waiting = 0
        self._slides = 0
        self._rejected = 0
        self._last_gap = 0
        self._new_fences = 0
        self._same_fences = 0

    @classmethod
    def recover(cls, snapshot: ClusterEpochSnapshot) -> ClusterEpochWindow:
        """A window rebuilt from a snapshot: collapsed to ``[max_applied]`` (or empty)."""
        window = cls()
        window._max_applied = snapshot.max_applied
        return window

    # --- observability ----------------------------------------------------

    @property
    def latest_seen(self) -> int | None:
        """Newest epoch fenced since start/recovery (volatile; None until the first fence)."""
        with self._cond:
            return self._latest_seen

    @property
    def oldest_accepted(self) -> int | None:
        """Lower end of a two-epoch window (volatile; None while it has one epoch)."""
        with self._cond:
            return self._oldest_accepted

    @property
    def max_applied(self) -> int | None:
        """Highest epoch recorded by `mark_applied` (the persisted field)."""
        with self._cond:
            return self._max_applied

    def window(self) -> tuple[int | None, int | None]:
        """The accepted range ``(oldest, latest)``, both inclusive; ``(None, None)`` if empty.

        A single-epoch window ``[N]`` reads ``(N, N)``; a recovered window reads
        ``(max_applied, max_applied)``.
        """
        with self._cond:
            return self._bounds()

    def metrics(self) -> WindowMetrics:
        """A consistent copy of the counters."""
        with self._cond:
            oldest, latest = self._bounds()
            size = 0 if oldest is None or latest is None else latest - oldest + 1
            return WindowMetrics(
                window_slides=self._slides,
                window_size=size,
                epochs_rejected_stale=self._rejected,
                last_rejected_epoch_gap=self._last_gap,
                new_epoch_fences=self._new_fences,
                same_epoch_fences=self._same_fences,
            )

    # --- state changes ----------------------------------------------------

    def snapshot(self) -> ClusterEpochSnapshot:
        """The persisted state: ``max_applied`` only."""
        with self._cond:
            return ClusterEpochSnapshot(max_applied=self._max_applied)

    def mark_applied(self, epoch: int) -> None:
        """Record that a commit carrying ``epoch`` was made durable (``max_applied`` only rises).

        Raises ValueError for an epoch that was never fenced (above the window).
        """
        _check_epoch(epoch)
        with self._cond:
            _, latest = self._bounds()
            if latest is None or epoch > latest:
                # A durable commit above latest_seen was never fenced; recording
                # it would let recovery accept epochs this node never saw.
                raise ValueError(f"cluster epoch {epoch} was never fenced (window latest={latest})")
            if self._max_applied is None or epoch > self._max_applied:
                self._max_applied = epoch

    @contextmanager
    def fence(self, epoch: int, *, timeout: float | None = None) -> Iterator[EpochFence]:
        """Fence ``epoch`` for the duration of the ``with`` block.

        Inside the window: a shared hold. Beyond it: waits until no fence is
        held, slides the window to end at ``epoch``, then holds shared. Below
        it (possibly after waiting): raises `StaleClusterEpoch`. Raises
        `ClusterEpochFenceTimeout` if not granted within ``timeout`` seconds,
        ValueError for epoch <= 0.
        """
        _check_epoch(epoch)
        granted = self._acquire(epoch, timeout)
        try:
            yield granted
        finally:
            self._release()

    # --- internals (call with self._cond held) ----------------------------

    def _bounds(self) -> tuple[int | None, int | None]:
        # Until a new epoch is seen, a recovered window is [max_applied].
        latest = self._latest_seen if self._latest_seen is not None else self._max_applied
        oldest = self._oldest_accepted if self._oldest_accepted is not None else latest
        return oldest, latest

    def _acquire(self, epoch: int, timeout: float | None) -> EpochFence:
        deadline = None if timeout is None else time.monotonic() + timeout
        queued_to_slide = False
        with self._cond:
            try:
                while True:
                    # Re-classified on every wakeup: this is the double-check.
                    oldest, latest = self._bounds()
                    if oldest is not None and latest is not None and epoch < oldest:
                        self._rejected += 1
                        self._last_gap = oldest - epoch
                        _log.debug(
                            "rejecting cluster epoch %d below window [%d, %d]",
                            epoch,
                            oldest,
                            latest,
                        )
                        raise StaleClusterEpoch(epoch, oldest, latest)
                    if oldest is not None and latest is not None and epoch <= latest:
                        if queued_to_slide:
                            # Another slide brought our epoch into the window: we
                            # no longer need the exclusive hold, so stop blocking others.
                            queued_to_slide = False
                            self._writers_waiting -= 1
                            self._cond.notify_all()
                        # Writer preference: queue behind a waiting slide.
                        if self._writers_waiting == 0:
                            self._readers += 1
                            self._same_fences += 1
                            return EpochFence(epoch, oldest, latest, new_epoch=False)
                    elif self._readers == 0:
                        self._slide(epoch)
                        # Downgrade: take the shared hold before releasing the
                        # mutex, so no other slide can slip in.
                        self._readers += 1
                        self._new_fences += 1
                        new_oldest, new_latest = self._bounds()
                        assert new_oldest is not None and new_latest is not None
                        self._cond.notify_all()  # queued fences of `epoch` may now enter
                        return EpochFence(epoch, new_oldest, new_latest, new_epoch=True)
                    elif not queued_to_slide:
                        queued_to_slide = True
                        self._writers_waiting += 1
                    if deadline is None:
                        self._cond.wait()
                    else:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            assert timeout is not None
                            raise ClusterEpochFenceTimeout(epoch, timeout)
                        self._cond.wait(remaining)
            finally:
                if queued_to_slide:
                    self._writers_waiting -= 1
                    # Shared fences held back by our queued slide may proceed.
                    self._cond.notify_all()

    def _slide(self, epoch: int) -> None:
        previous = self._latest_seen if self._latest_seen is not None else self._max_applied
        if previous is not None:
            # The old latest becomes the oldest accepted; everything below it is out.
            self._oldest_accepted = previous
        self._latest_seen = epoch
        self._slides += 1
        _log.debug("cluster epoch window slid to [%s, %d]", previous, epoch)

    def _release(self) -> None:
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()  # a queued slide may proceed
