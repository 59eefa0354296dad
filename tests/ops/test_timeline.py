"""The data of `laminar report`: every partition's epoch grants as spans (who held each epoch, how it began, when
it was released and when the next grant ended it), each partition's committed progress, the member nodes as
the ledger last saw them, and a time axis from the cluster's creation to the last activity in the store.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.ops.timeline import FAILOVER, FENCED, MIGRATION, PLACEMENT, collect_report
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import now
from laminar_orchestration.store import LocalObjectStore
from tests.ledgers import make_alive, make_dead, new_ledger
from tests.ops.test_report import build_history


def test_each_epoch_is_a_span_of_its_holder_named_by_how_it_began(tmp_path: Path) -> None:
    ledger = build_history(tmp_path)
    ledger.fence(PartitionId(1), UNASSIGNED, expected_epoch=1, reason="drain node 2")
    report = collect_report(ledger)
    first, second, third = report.partitions[0].spans
    assert [(s.epoch, s.node, s.previous_owner, s.transition) for s in (first, second, third)] == [
        (1, 1, 0, PLACEMENT),
        (2, 2, 1, MIGRATION),
        (3, 3, 2, FAILOVER),
    ]
    assert third.reason == "failover: node 2 stopped heartbeating"
    # Only the graceful handoff was released; each epoch ends at the next grant, the last at the axis' end.
    assert first.released_at is not None and second.released_at is None and third.released_at is None
    assert (first.ends_at, second.ends_at, third.ends_at) == (second.granted_at, third.granted_at, report.end)
    assert [s.current for s in report.partitions[0].spans] == [False, False, True]
    placed, drained = report.partitions[1].spans
    assert (placed.transition, drained.transition, drained.node) == (PLACEMENT, FENCED, UNASSIGNED)
    assert report.partitions[2].spans == []
    assert [report.count(t) for t in (PLACEMENT, MIGRATION, FAILOVER, FENCED)] == [2, 1, 1, 1]
    assert report.node_ids == [1, 2, 3]  # the epoch granted to nobody names no node


def test_each_partition_shows_its_committed_progress(tmp_path: Path) -> None:
    report = collect_report(build_history(tmp_path))
    committed, never = report.partitions[1], report.partitions[2]
    assert (committed.owner, committed.epoch, committed.status) == (2, 1, "active")
    assert (committed.committed_offset, committed.source_end, committed.lag) == (600, 1000, 400)
    assert committed.manifests > 0 and committed.last_commit_at is not None
    assert (never.owner, never.epoch, never.committed_offset, never.source_end, never.lag) == (0, 0, 0, 0, 0)
    assert (never.manifests, never.last_commit_at) == (0, None)


def test_the_time_axis_ends_at_the_last_activity_not_the_clock(tmp_path: Path) -> None:
    ledger = build_history(tmp_path)
    before = now()
    later = before + timedelta(hours=1)
    report = collect_report(ledger, generated_at=later)
    assert report.generated_at == later
    assert report.start == ledger.cluster().created_at
    # An hour on, the axis still ends where the store's activity did (or a second after the start, at least).
    assert max(s.granted_at for s in report.spans) <= report.end <= max(before, report.start + timedelta(seconds=1))
    # A cluster made a moment ago still gets an axis of a second.
    fresh = collect_report(new_ledger(LocalObjectStore(tmp_path / "fresh"), partitions=1))
    assert fresh.end - fresh.start == timedelta(seconds=1)


def test_a_node_marked_alive_whose_heartbeat_lapsed_is_dead(tmp_path: Path) -> None:
    ledger = Ledger(LocalObjectStore(tmp_path / "store"))
    ledger.init_cluster(1)
    make_alive(ledger, 1)
    make_dead(ledger, 2)  # killed: still marked alive, its heartbeat lapsed
    nodes = {n.node: (n.alive, n.status) for n in collect_report(ledger).nodes}
    assert nodes[1] == (True, "alive") and nodes[2] == (False, "dead")
