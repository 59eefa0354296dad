"""When a worker reads its log: at an announced end, on the fallback poll, and again at once after
a batch from a busy log whose producer rings no doorbell (or when it starts right after a commit)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from laminar_orchestration.dataplane import log_watch
from laminar_orchestration.dataplane.log_watch import LogWatch
from laminar_orchestration.protocol.records import now


def _watching(committed: int) -> LogWatch:
    watch = LogWatch(fallback_s=600.0)
    watch.advanced(committed, from_log_ends=True)
    return watch


def test_an_idle_log_at_its_recorded_end_waits_for_the_fallback_poll() -> None:
    watch = _watching(100)
    watch.after_read(100, None)  # nothing past the end
    due = watch.idle_until(100)
    assert due is not None and due > time.monotonic() + 500


def test_a_busy_log_without_a_doorbell_is_read_again_at_once_then_less_often() -> None:
    watch = _watching(100)
    watch.after_read(100, 100)  # a batch up to the recorded end: the producer may have appended since
    assert watch.idle_until(100) is None
    assert watch.read_limit(100) is None  # the next read goes past the recorded end
    waits = []
    for _ in range(8):  # ... and finds nothing, again and again
        watch.after_read(None, None)
        due = watch.idle_until(100)
        assert due is not None
        waits.append(round(due - watch.read_at, 2))
    assert waits[:5] == [0.05, 0.1, 0.2, 0.4, 0.8]
    assert waits[5:] == [600.0] * 3  # then idle until an end moves (or the fallback poll)
    watch.after_read(None, 120)  # events again: at once
    assert watch.idle_until(120) is None


def test_a_busy_log_whose_producer_rings_a_doorbell_waits_for_the_next_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    watch = _watching(100)
    watch.advanced(100, from_log_ends=False)  # a doorbell announced the end
    watch.after_read(100, 100)
    due = watch.idle_until(100)
    assert due is not None and due - watch.read_at == pytest.approx(600.0)  # the next append rings: no read on a guess
    monkeypatch.setattr(log_watch, "DOORBELL_TRUST_S", 0.0)
    time.sleep(0.01)
    assert watch.idle_until(100) is None  # a doorbell silent for long is not trusted


@pytest.mark.parametrize("commit_age_s", [0.5, 60.0, None])
def test_a_worker_starting_right_after_a_commit_probes_its_log_as_a_busy_one(commit_age_s: float | None) -> None:
    """A move's new owner starts moments after the old owner's last batch: its first read may come
    before the producer's next append, which it must not wait a poll of the recorded ends to see.
    A partition idle for long (or never committed) waits for the poll as before."""
    watch = _watching(100)
    watch.started_at(None if commit_age_s is None else now() - timedelta(seconds=commit_age_s))
    watch.after_read(None, None)  # the first read: nothing since the last commit
    due = watch.idle_until(100)
    assert due is not None
    expected = log_watch.BUSY_PROBE_FIRST_S if commit_age_s == 0.5 else 600.0
    assert due - watch.read_at == pytest.approx(expected)
