"""When a worker reads its log: at an announced end, on the fallback poll, and again at once after
a batch from a busy log whose producer rings no doorbell (or when it starts right after a commit)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from laminar_dev.chaos import ArrowNode
from laminar_orchestration.dataplane import log_watch
from laminar_orchestration.dataplane.log_watch import LogWatch
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.keys import LOG_ENDS_KEY
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import now
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ForwardingStore, LocalObjectStore, ObjectStore
from laminar_orchestration.store.base import StoredObject, TransientStoreError
from tests.dataplane import plane

P0, P1 = PartitionId(0), PartitionId(1)


#: The fallback poll of these watches: within the recorded ends' trust (`LOG_ENDS_TRUST_S`).
FALLBACK_S = 10.0


def _watching(committed: int) -> LogWatch:
    watch = LogWatch(fallback_s=FALLBACK_S)
    watch.advanced(committed, from_log_ends=True)
    return watch


def test_an_idle_log_at_its_recorded_end_waits_for_the_fallback_poll() -> None:
    watch = _watching(100)
    watch.after_read(100, None)  # nothing past the end
    due = watch.idle_until(100)
    assert due is not None and due > time.monotonic() + FALLBACK_S - 1


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
    assert waits[5:] == [FALLBACK_S] * 3  # then idle until an end moves (or the fallback poll)
    watch.after_read(None, 120)  # events again: at once
    assert watch.idle_until(120) is None


def test_a_busy_log_whose_producer_rings_a_doorbell_waits_for_the_next_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    watch = _watching(100)
    watch.advanced(100, from_log_ends=False)  # a doorbell announced the end
    watch.after_read(100, 100)
    due = watch.idle_until(100)
    # The next append rings: no read on a guess.
    assert due is not None and due - watch.read_at == pytest.approx(FALLBACK_S)
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
    expected = log_watch.BUSY_PROBE_FIRST_S if commit_age_s == 0.5 else FALLBACK_S
    assert due - watch.read_at == pytest.approx(expected)


def test_an_idle_log_waits_no_longer_than_the_trust_of_the_recorded_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_watch, "LOG_ENDS_TRUST_S", 0.2)
    watch = _watching(100)
    watch.after_read(100, None)
    due = watch.idle_until(100)
    assert due is not None and due <= watch.ends_seen_at + 0.2  # type: ignore[operator]


class _UnreadableEnds(ForwardingStore):
    """A node's store whose recorded log ends cannot be read once `refuse` is set (the rest reads well)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.refuse = threading.Event()
        #: When the first read of the ends was refused (monotonic); None: none yet.
        self.refused_since: float | None = None

    def get(self, key: str) -> StoredObject:
        if key == LOG_ENDS_KEY and self.refuse.is_set():
            if self.refused_since is None:
                self.refused_since = time.monotonic()
            raise TransientStoreError("get", key, "injected HTTP 503 ServiceUnavailable")
        return self.inner.get(key)


def _node_with_unreadable_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partitions: int
) -> tuple[LocalObjectStore, _UnreadableEnds, ArrowNode]:
    """Node 1 owning partition 0, reading the ends every 50 ms, trusting them for 0.5 s, its idle polls
    backing off to 0.2 s, its fallback poll 2 minutes away and no doorbell (it listens for none)."""
    monkeypatch.setattr(log_watch, "LOG_ENDS_TRUST_S", 0.5)
    store = LocalObjectStore(tmp_path / "store")
    Ledger(store).init_cluster(partitions)
    plane.assign(store, 0, 1)
    ends = _UnreadableEnds(store)
    config = plane.node_config(
        ends,
        1,
        tmp_path / "n1",
        log_ends_poll_s=0.05,
        idle_poll_max_s=0.2,
        source_fallback_poll_s=120.0,
        nudge_host=None,
    )
    return store, ends, ArrowNode(config, store=ends)


@pytest.mark.slow(seconds=8)
def test_a_caught_up_worker_polls_its_log_once_the_ends_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node cannot read the recorded log ends: once they are older than their trust, its idle
    worker polls its log with the idle backoff instead of sleeping until the fallback poll."""
    store, ends, node = _node_with_unreadable_ends(tmp_path, monkeypatch, partitions=1)
    producer = SourceLog(store, partitions=1)
    producer.append(0, plane.events([f"k{i}" for i in range(10)]))
    with plane.running(node):
        plane.wait_until(lambda: plane.committed_offset(store) == 10, 30, "the first events committed")
        watch = node.workers[P0].log_watch
        # Past the busy probes: the worker waits on the recorded ends for its fallback poll.
        plane.wait_until(lambda: watch.at_end and watch.probe_s > log_watch.BUSY_PROBE_LAST_S, 10, "an idle worker")
        ends.refuse.set()
        producer.append(0, plane.events([f"k{i}" for i in range(10)]))
        # The ends' trust (0.5 s) plus a backed-off poll (0.2 s) and a batch: well within 10 s; the
        # fallback poll would come after 2 minutes.
        plane.wait_until(lambda: plane.committed_offset(store) == 20, 10, "the new events committed")
    assert ends.refused_since is not None


@pytest.mark.slow(seconds=6)
def test_a_new_worker_is_handed_the_recorded_ends_as_old_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ends could not be read for longer than their trust when a partition comes to the node: its
    new worker does not take them as freshly seen, and polls its log."""
    store, ends, node = _node_with_unreadable_ends(tmp_path, monkeypatch, partitions=2)
    with plane.running(node):
        plane.wait_until(lambda: P0 in node.workers and node.workers[P0].log_watch.at_end, 30, "node 1 to run p0")
        ends.refuse.set()
        plane.wait_until(
            lambda: ends.refused_since is not None and time.monotonic() > ends.refused_since + 0.5,
            10,
            "the recorded ends to outlive their trust",
        )
        plane.assign(store, 1, 1)
        plane.wait_until(lambda: P1 in node.workers and node.workers[P1].log_watch.at_end, 30, "node 1 to run p1")
        assert node.workers[P1].log_watch.idle_until(0) is None  # it polls (the idle backoff), no wait on the ends
