"""A viewer follows changes: watching a cluster costs requests per change, not per partition per look."""

from __future__ import annotations

import pyarrow as pa

from laminar_orchestration.control.snapshot import snapshot_cluster
from laminar_orchestration.control.watch import ClusterWatch, summarize_cluster
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ops.demo_status import PhaseWatch
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import PartitionProgress
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import MigrationPhase
from laminar_orchestration.store import ObjectStore
from laminar_orchestration.store.metering import RequestCounts, RequestMeter
from tests.commits import commit_all
from tests.ledgers import new_ledger
from tests.ops.test_demo_status import task

PARTITIONS = 12


def per_partition_reads(before: RequestCounts, after: RequestCounts) -> int:
    """Requests for any partition's ledger records (desired state, head, grants, releases) between two counts."""
    return sum(
        n - before.by_family.get((m, fam), 0)
        for (m, fam), n in after.by_family.items()
        if fam.startswith("ledger/partitions")
    )


def placed(store: ObjectStore) -> Ledger:
    """`PARTITIONS` partitions granted and desired on nodes 1 and 2 (alternately), both alive and members."""
    ledger = new_ledger(store, PARTITIONS)
    handles = {n: ledger.members.register_node(NodeId(n), heartbeat_timeout_s=60) for n in (1, 2)}
    ledger.members.admit_nodes()
    desired = DesiredStates(ledger, nudge=False)
    for p in range(PARTITIONS):
        node = 1 + p % 2
        desired.update(PartitionId(p), lambda s, n=node: s.model_copy(update={"owner": n}))  # type: ignore[misc]
        ledger.acquire(PartitionId(p), NodeId(node), expected_epoch=0, generation=1)
    for n, handle in handles.items():
        progress = {
            p: PartitionProgress(partition=p, epoch=1, state="running", source_offset=10 * p)
            for p in range(PARTITIONS)
            if 1 + p % 2 == n
        }
        handle.heartbeat(partitions=progress)
    return ledger


def test_a_look_at_an_unchanged_cluster_reads_no_partition_record(store: ObjectStore, meter: RequestMeter) -> None:
    ledger = placed(store)
    watch = ClusterWatch(ledger)
    first = watch.snapshot()
    assert [(p.partition, p.owner, p.epoch, p.committed_offset) for p in first.partitions] == [
        (p, 1 + p % 2, 1, 10 * p) for p in range(PARTITIONS)
    ]
    before = meter.snapshot()
    again = watch.snapshot()
    after = meter.snapshot()
    assert per_partition_reads(before, after) == 0
    # Membership, cluster record, two node records, two assignments, the log ends: a few reads a node.
    assert sum(after.by_method.values()) - sum(before.by_method.values()) <= 8
    assert [(p.owner, p.epoch, p.owner_alive) for p in again.partitions] == [
        (p.owner, p.epoch, p.owner_alive) for p in first.partitions
    ]


def test_a_change_reads_only_the_partition_that_moved(store: ObjectStore, meter: RequestMeter) -> None:
    ledger = placed(store)
    watch = ClusterWatch(ledger)
    watch.snapshot()
    desired = DesiredStates(ledger, nudge=False)
    desired.update(PartitionId(3), lambda s: s.model_copy(update={"migration": task(MigrationPhase.DRAINING)}))
    before = meter.snapshot()
    changed = watch.poll()
    after = meter.snapshot()
    assert changed == {3}
    desired_reads = sum(
        n - before.by_family.get((m, fam), 0) for (m, fam), n in after.by_family.items() if fam.endswith("desired.json")
    )
    assert desired_reads <= 1  # the assignment may carry the state: then none at all
    state = watch.states[3]
    assert state.migration is not None and state.migration.phase == MigrationPhase.DRAINING
    # The table's next look reads that partition's ownership again, and no other's.
    before = meter.snapshot()
    snap = watch.snapshot()
    after = meter.snapshot()
    assert 0 < per_partition_reads(before, after) <= 5
    assert snap.partitions[3].migration is not None


def test_the_demo_phase_lines_read_no_partition_while_nothing_moves(store: ObjectStore, meter: RequestMeter) -> None:
    ledger = placed(store)
    phases = PhaseWatch()
    assert phases.poll(ledger) == []  # the first look reads every state once
    before = meter.snapshot()
    for _ in range(5):
        assert phases.poll(ledger) == []
    assert per_partition_reads(before, meter.snapshot()) == 0


def test_the_summary_agrees_with_the_ledger_and_reads_nothing_per_partition(
    store: ObjectStore, meter: RequestMeter
) -> None:
    ledger = placed(store)
    DesiredStates(ledger, nudge=False).update(
        PartitionId(5), lambda s: s.model_copy(update={"migration": task(MigrationPhase.DRAINING)})
    )
    before = meter.snapshot()
    summary = summarize_cluster(ledger)
    after = meter.snapshot()
    assert per_partition_reads(before, after) == 0
    full = snapshot_cluster(ledger)
    assert [(p.partition, p.owner, p.epoch, p.status, p.owner_alive) for p in summary.partitions] == [
        (p.partition, p.owner, p.epoch, p.status, p.owner_alive) for p in full.partitions
    ]
    assert [p.committed_offset for p in summary.partitions] == [10 * p for p in range(PARTITIONS)]
    assert summary.partitions[5].migration is not None and summary.partitions[4].migration is None


def test_a_node_that_stopped_shows_its_final_commits_not_its_last_report(store: ObjectStore) -> None:
    """A clean stop commits after the node's last heartbeat and leaves a record reporting nothing: the
    viewer's final table must show the partition's last commit (from its manifest), not the old report."""
    ledger = new_ledger(store, 1)
    handle = ledger.members.register_node(NodeId(1), heartbeat_timeout_s=60)
    ledger.members.admit_nodes()
    DesiredStates(ledger, nudge=False).update(PartitionId(0), lambda s: s.model_copy(update={"owner": 1}))
    token = ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    SourceLog(store, partitions=1).append(0, pa.table({"key": ["a", "b"] * 15, "value": [1.0] * 30}))
    handle.heartbeat(partitions={0: PartitionProgress(partition=0, epoch=1, state="running", source_offset=0)})
    watch = ClusterWatch(ledger)
    assert watch.snapshot().partitions[0].committed_offset == 0
    assert commit_all(store, token)[1] == 30
    handle.leave()
    assert watch.snapshot().partitions[0].committed_offset == 30
