"""A node's move report: written only when it changes, never over a newer process's, and read once per
look however many moves wait on the node."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

import pytest

from laminar_orchestration.identity import NodeId as N
from laminar_orchestration.protocol.capabilities import LedgerWriter
from laminar_orchestration.protocol.keys import move_report_key
from laminar_orchestration.protocol.ledger import Ledger, NodeIdentityConflict
from laminar_orchestration.protocol.move_reports import MoveReporter, MoveReports
from laminar_orchestration.protocol.records import PartitionProgress
from laminar_orchestration.store import ObjectStore, StoredObject
from tests.stores import ForwardingStore


class CountingStore(ForwardingStore):
    """Counts the GETs and the conditional PUTs of each key."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.gets: Counter[str] = Counter()
        self.puts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def get(self, key: str) -> StoredObject:
        with self._lock:
            self.gets[key] += 1
        return super().get(key)

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        self.puts[key] += 1
        return super().put_if_absent(key, data, metadata)

    def put_if_match(self, key: str, data: bytes, etag: str, metadata: Mapping[str, str] | None = None) -> str:
        self.puts[key] += 1
        return super().put_if_match(key, data, etag, metadata)


def progress(partition: int, phase: str | None, migration: str = "m1") -> PartitionProgress:
    return PartitionProgress(partition=partition, epoch=1, state="draining", migration_id=migration, phase_done=phase)


def test_a_report_is_written_once_per_change(store: ObjectStore) -> None:
    counting = CountingStore(store)
    reporter = MoveReporter(LedgerWriter(counting), N(2), generation=1)
    key = move_report_key(2)
    assert reporter.report({3: progress(3, "draining")})
    assert not reporter.report({3: progress(3, "draining")}), "an unchanged report is no request"
    assert reporter.report({3: progress(3, "checkpointing")})
    assert counting.puts[key] == 2

    read = MoveReports(Ledger(store)).progress(N(2), 3)
    assert read is not None and read.phase_done == "checkpointing"


def test_an_older_process_never_overwrites_a_newer_ones_report(store: ObjectStore) -> None:
    old = MoveReporter(LedgerWriter(store), N(2), generation=1)
    new = MoveReporter(LedgerWriter(store), N(2), generation=2)
    old.report({3: progress(3, "draining")})
    new.report({})  # the restarted process's first report replaces the old one's
    with pytest.raises(NodeIdentityConflict) as info:
        old.report({3: progress(3, "released")})
    assert (info.value.node, info.value.generation) == (2, 1)
    assert MoveReports(Ledger(store)).progress(N(2), 3) is None
    # And a newer process takes the record over from an older one that wrote after it started.
    newest = MoveReporter(LedgerWriter(store), N(2), generation=3)
    assert newest.report({4: progress(4, "restoring", "m2")})
    assert MoveReports(Ledger(store)).progress(N(2), 4) is not None


def test_moves_waiting_on_one_node_share_one_read(local_store: ObjectStore) -> None:
    counting = CountingStore(local_store)
    MoveReporter(LedgerWriter(local_store), N(5), generation=1).report({p: progress(p, "restoring") for p in range(8)})
    board = MoveReports(Ledger(counting))
    start = threading.Barrier(8)
    seen: list[PartitionProgress | None] = []

    def wait_on(p: int) -> None:
        start.wait()
        seen.append(board.progress(N(5), p, max_age_s=30.0))

    threads = [threading.Thread(target=wait_on, args=(p,)) for p in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(seen) == 8 and all(s is not None and s.phase_done == "restoring" for s in seen)
    assert counting.gets[move_report_key(5)] == 1, "eight waits on one node read its report once"
    board.progress(N(5), 0, max_age_s=0.0)
    assert counting.gets[move_report_key(5)] == 2, "a caller that wants a fresh look gets one"


def test_a_node_without_a_move_report_is_read_through_its_heartbeat(store: ObjectStore) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(4)
    handle = ledger.members.register_node(N(1), heartbeat_timeout_s=60)
    handle.heartbeat(partitions={0: progress(0, "released")})
    got = MoveReports(ledger).progress(N(1), 0)
    assert got is not None and got.phase_done == "released"
    # Once the node writes a move report, that record is what counts.
    MoveReporter(LedgerWriter(store), N(1), generation=handle.generation).report({})
    assert MoveReports(ledger).progress(N(1), 0) is None


def test_the_board_is_one_per_ledger(local_store: ObjectStore) -> None:
    ledger = Ledger(local_store)
    assert MoveReports.of(ledger) is MoveReports.of(ledger)
    assert MoveReports.of(Ledger(local_store)) is not MoveReports.of(ledger)


def test_drivers_waiting_on_many_nodes_space_their_reads(local_store: ObjectStore) -> None:
    """Polls of one or two nodes (a single move) are fresh when asked; with more nodes waited on at
    once (a failover's burst) a read is shared for a while, so the reads do not grow with the nodes."""
    counting = CountingStore(local_store)
    for n in range(1, 6):
        MoveReporter(LedgerWriter(local_store), N(n), generation=1).report({n: progress(n, "restoring")})
    board = MoveReports(Ledger(counting))
    board.progress(N(1), 1, max_age_s=0.0)
    board.progress(N(1), 1, max_age_s=0.0)
    assert counting.gets[move_report_key(1)] == 2, "one move's waits look fresh"
    assert not board.busy()
    for n in range(2, 6):
        board.progress(N(n), n, max_age_s=0.0)
    assert board.busy()
    board.progress(N(1), 1, max_age_s=0.0)
    assert counting.gets[move_report_key(1)] == 2, "five nodes waited on: a read just made is shared"
