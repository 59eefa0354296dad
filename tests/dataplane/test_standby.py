"""Warm standby: a copy that follows only published manifests, failovers that prefer it, and graceful
moves whose target warms up before the old owner drains (nodes in-process, batches without Spark)."""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from laminar_dev.chaos import ArrowBatchEngine, ArrowNode
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.failover import prepare_failover
from laminar_orchestration.control.moves import drive
from laminar_orchestration.control.placement import failover_target
from laminar_orchestration.control.snapshot import warm_copies
from laminar_orchestration.dataplane.batches import InFlightBatch, ReadAhead, read_ahead
from laminar_orchestration.dataplane.checkpoint import CheckpointStore
from laminar_orchestration.dataplane.restore import StateReplica, committed_state
from laminar_orchestration.dataplane.standby import StandbyFollower
from laminar_orchestration.dataplane.statestore import PartitionStateStore
from laminar_orchestration.identity import NodeId
from laminar_orchestration.ops.verify import audit_store
from laminar_orchestration.protocol.capabilities import CheckpointWriter, OutputCommitter, ReadStore, manifest_key
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.fencing import PartitionGuard
from laminar_orchestration.protocol.keys import manifest_history_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.segments import SourceBatch
from laminar_orchestration.protocol.signing import SigningKey, sign_record
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationPhase, PhaseReport
from laminar_orchestration.store import LocalObjectStore, ObjectStore
from laminar_orchestration.ulid import next_ulid
from tests.commits import commit_all
from tests.dataplane.plane import (
    P0,
    SCHEMA,
    as_dict,
    assign,
    build_lineage,
    committed_offset,
    events,
    fence_writer,
    node_config,
    reference_state,
    replica_state,
    running,
    wait_until,
)
from tests.spies import spy_source_reads


def _owned_by_node_1(tmp_path: Path) -> LocalObjectStore:
    """A local store with the test lineage, its writer fenced and partition 0 assigned to node 1."""
    store = LocalObjectStore(tmp_path / "store")
    fence_writer(store, build_lineage(store))
    assign(store, 0, 1)
    return store


def _wait_running_p0(node: ArrowNode) -> None:
    """Until `node` (node 1) runs partition 0 with a token."""
    wait_until(lambda: P0 in node.workers and node.workers[P0].token is not None, 30, "node 1 to run p0")


def _assert_audited(store: ObjectStore) -> None:
    assert all(a.ok for a in audit_store(store)), [a.issues for a in audit_store(store)]


def _assert_exact_and_audited(store: ObjectStore) -> None:
    """Partition 0's committed state is exactly the reference (nothing lost or doubled) and the audit passes."""
    assert as_dict(committed_state(store, 0)[0]) == reference_state(store)
    _assert_audited(store)


def _caught_up(store: ObjectStore, node: int) -> bool:
    """The node's standby copy reported the committed offset (a lag of 0 alone may predate the last commit)."""
    record = Ledger(store).members.node(NodeId(node))
    progress = record.partitions.get(0) if record else None
    return progress is not None and progress.lag == 0 and progress.source_offset == committed_offset(store)


def test_failover_target_prefers_the_warmest_live_copy() -> None:
    loads = {1: 0, 2: 3, 3: 1}
    assert failover_target(loads) == 1  # no standby: least loaded
    assert failover_target(loads, warm={2: 40, 3: 900}) == 2  # least lag wins over load
    assert failover_target(loads, warm={2: 0, 3: 0}) == 3  # equal lag: least loaded
    assert failover_target(loads, warm={2: 0}, exclude={2}) == 1
    assert failover_target(loads, warm={7: 0}) == 1  # a standby on a node that is not a candidate


def test_a_standby_applies_only_what_published_manifests_name(store: ObjectStore, tmp_path: Path) -> None:
    lineage = build_lineage(store)
    follower = StandbyFollower(
        StateReplica(tmp_path / "standby", 0, SCHEMA, ReadStore(store)), ManifestReader(store), poll_s=0.01, node=5
    )
    follower.follow_once()
    end = lineage.manifest.source_offset
    assert follower.replica.source_offset == end and follower.lag == 0
    assert replica_state(follower.replica) == reference_state(store)

    # A zombie's delta, uploaded but never named by a manifest, is never applied.
    zombie = pa.table({"key": ["zombie", "shared"], **{f.name: pa.array([1, 1], f.type) for f in SCHEMA}})
    CheckpointStore(CheckpointWriter(store)).upload_delta(PartitionGuard(lineage.token), zombie, end, end + 2)
    follower.follow_once()
    state = replica_state(follower.replica)
    assert "zombie" not in state and state == reference_state(store)

    # Nor when a forged manifest entry (signed with a key that is not its grant's) names it.
    zombie_ref = CheckpointStore(CheckpointWriter(store)).upload_delta(
        PartitionGuard(lineage.token), zombie, end, end + 2
    )
    current = ManifestReader(store).current(P0)
    assert current is not None
    m = current.manifest
    forged = m.model_copy(
        update={
            "seq": m.seq + 1,
            "commit_ulid": next_ulid(m.commit_ulid),
            "parent_hash": current.raw_hash,
            "source_offset": end + 2,
            "deltas": [*m.deltas, zombie_ref],
            "signature": None,
        }
    )
    forged = sign_record(forged, SigningKey.generate(0, m.fencing_token, m.node))
    key = manifest_history_key(0, forged.seq)
    OutputCommitter(store).create_manifest(manifest_key(key), forged.model_dump_json().encode())
    follower.follow_once()
    state = replica_state(follower.replica)
    assert "zombie" not in state and state == reference_state(store)
    assert follower.replica.source_offset == end and follower.lag == 0 and follower.error is None

    # A new commit is applied as its delta only.
    SourceLog(store, segment_events=100).append(0, events(["shared", "late"] * 3))
    commit_all(store, lineage.token, snapshot_every=None)
    follower.follow_once()
    assert follower.replica.source_offset == committed_offset(store) == end + 6
    assert replica_state(follower.replica) == reference_state(store)
    follower.replica.close()


def test_a_failover_goes_to_the_standby_and_applies_only_the_missing_deltas(tmp_path: Path) -> None:
    store = _owned_by_node_1(tmp_path)
    owner = ArrowNode(node_config(store, 1, tmp_path / "n1"), store=store)
    standby = ArrowNode(node_config(store, 2, tmp_path / "n2", standby_for=(0,)), store=store)
    bystander = ArrowNode(node_config(store, 3, tmp_path / "n3"), store=store)
    source = SourceLog(store, segment_events=100)
    with running(owner), running(standby), running(bystander):
        wait_until(lambda: P0 in owner.workers and owner.workers[P0].commits >= 0, 30, "node 1 to run p0")
        source.append(0, events([f"k{i % 17}" for i in range(300)]))
        wait_until(lambda: committed_offset(store) == source.end_offset(0), 30, "node 1 to commit")
        wait_until(lambda: _caught_up(store, 2), 30, "node 2's standby to catch up")
        assert warm_copies(Ledger(store).members.nodes()) == {0: {2: 0}}
        coordinator = MigrationCoordinator(Ledger(store), MigrationConfig(migration_timeout_s=60))
        # Node 3 holds nothing and would win on load; the warm copy on node 2 wins.
        decision = prepare_failover(coordinator, 0, live={1, 2, 3}, allow_live_owner=True)
        assert decision.task is not None and decision.task.to_node == 2
        drive(coordinator, decision.task)
        wait_until(lambda: P0 in standby.workers and standby.workers[P0].commits >= 0, 30, "node 2 to take p0")
        restore = standby.workers[P0].last_catch_up
        assert restore is not None and not restore.full_restore and restore.bytes_downloaded < 10_000
        source.append(0, events([f"k{i % 5}" for i in range(100)]))
        wait_until(lambda: committed_offset(store) == source.end_offset(0), 30, "node 2 to commit")
    _assert_audited(store)


def test_a_forced_move_to_a_node_without_a_copy_starts_its_first_batch_before_the_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first batch needs the events, not the state: its aggregate runs while the target downloads
    the snapshot and deltas, and it commits exactly once on top of them."""
    store = LocalObjectStore(tmp_path / "store")
    lineage = build_lineage(store)
    committed = lineage.delta_ends[-1]
    fence_writer(store, lineage)
    assign(store, 0, 1)  # node 1 never runs: the owner is dead
    source = SourceLog(store, segment_events=100)
    source.append(0, events([f"k{i % 13}" for i in range(200)]))
    reads = spy_source_reads(monkeypatch)
    reads_at_restore: list[list[int]] = []
    catch_up = StateReplica.catch_up

    def spy_catch_up(self: StateReplica, manifest: Any) -> Any:
        reads_at_restore.append(list(reads))
        return catch_up(self, manifest)

    monkeypatch.setattr(StateReplica, "catch_up", spy_catch_up)
    with running(ArrowNode(node_config(store, 2, tmp_path / "n2"), store=store)):
        ledger = Ledger(store)
        wait_until(lambda: any(v.alive and v.record.node == 2 for v in ledger.members.nodes()), 30, "node 2 to join")
        coordinator = MigrationCoordinator(ledger, MigrationConfig(migration_timeout_s=60))
        decision = prepare_failover(coordinator, 0, live={2}, allow_live_owner=True)
        assert decision.task is not None and decision.task.to_node == 2
        drive(coordinator, decision.task)
        wait_until(lambda: committed_offset(store) == source.end_offset(0), 30, "node 2 to commit")
    monkeypatch.undo()
    assert reads_at_restore and committed in reads_at_restore[0], (
        f"the restore began before the first batch was read from offset {committed}: reads {reads_at_restore[0]}"
    )
    _assert_exact_and_audited(store)


def test_a_targets_handoff_steps_do_not_wait_for_the_read_of_its_first_batchs_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target reads its first batch's keys' values while it waits on the handoff, but on a thread
    of its own: with that read held (a just-restored large store takes about a second), the move still
    goes Active; the batch commits once the read is let go, exactly once."""
    store = _owned_by_node_1(tmp_path)  # node 1 never runs: the owner is dead
    source = SourceLog(store, segment_events=100)
    source.append(0, events([f"k{i % 13}" for i in range(200)]))
    held, release = threading.Event(), threading.Event()
    get_many = PartitionStateStore.get_many

    def held_get_many(self: PartitionStateStore, keys: Sequence[str]) -> pa.Table:
        held.set()
        assert release.wait(30), "the read was never let go"
        return get_many(self, keys)

    monkeypatch.setattr(PartitionStateStore, "get_many", held_get_many)
    with running(ArrowNode(node_config(store, 2, tmp_path / "n2"), store=store)):
        ledger = Ledger(store)
        wait_until(lambda: any(v.alive and v.record.node == 2 for v in ledger.members.nodes()), 30, "node 2 to join")
        # A short limit per node phase: a target stuck in the read would not report Seeking in time.
        config = MigrationConfig(migration_timeout_s=60, checkpoint_transfer_timeout_s=10)
        coordinator = MigrationCoordinator(ledger, config)
        decision = prepare_failover(coordinator, 0, live={2}, allow_live_owner=True)
        assert decision.task is not None and decision.task.to_node == 2
        try:
            task = drive(coordinator, decision.task)
            assert task.phase == MigrationPhase.ACTIVE
            assert held.is_set(), "the first batch's keys were not read ahead during the handoff"
            assert committed_offset(store) < source.end_offset(0)  # the first batch waits for its values
        finally:
            release.set()
        wait_until(lambda: committed_offset(store) == source.end_offset(0), 30, "node 2 to commit")
    monkeypatch.undo()
    _assert_exact_and_audited(store)


def test_a_graceful_move_warms_the_target_before_the_old_owner_drains(tmp_path: Path) -> None:
    store = _owned_by_node_1(tmp_path)
    old = ArrowNode(node_config(store, 1, tmp_path / "n1"), store=store)
    new = ArrowNode(node_config(store, 2, tmp_path / "n2"), store=store)
    source = SourceLog(store, segment_events=100)
    reports: list[PhaseReport] = []
    with running(old), running(new):
        _wait_running_p0(old)
        source.append(0, events([f"k{i % 17}" for i in range(300)]))
        wait_until(lambda: committed_offset(store) == source.end_offset(0), 30, "node 1 to commit")
        coordinator = MigrationCoordinator(Ledger(store), MigrationConfig(migration_timeout_s=60))
        task = coordinator.run(P0, NodeId(2), on_phase=reports.append)
        assert task.phase == MigrationPhase.ACTIVE
        planned = reports[0]
        assert planned.phase == MigrationPhase.PLANNED and "warm" in planned.detail and "not warm" not in planned.detail
        # The handoff itself transferred no snapshot: the target had it before the drain.
        download = next(r for r in reports if r.phase == MigrationPhase.DOWNLOADING)
        assert download.bytes_moved < 10_000, download
        restore = new.workers[P0].last_catch_up
        assert restore is not None and not restore.full_restore
    _assert_audited(store)


class _HeldWhenArmed(ArrowBatchEngine):
    """Aggregates like `ArrowBatchEngine`; while armed, each batch stays in flight (a Spark job still
    running, or a hung process) until released."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        #: Set once an armed batch is in flight.
        self.in_flight = threading.Event()
        self.release = threading.Event()

    def before_batch(self, epoch: int, job_group: str | None) -> None:
        if self.armed.is_set():
            self.in_flight.set()
            assert self.release.wait(60), "the batch was never let go"


def test_an_owner_drains_while_its_batchs_keys_are_still_being_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner reads a batch's keys' values from its local store while Spark aggregates the batch,
    on a thread of its own: with both held (a just-opened large store on a busy node reads for about a
    second), a drain still abandons the batch and the move goes Active; nothing is lost or doubled."""
    store = _owned_by_node_1(tmp_path)
    engine = _HeldWhenArmed()
    read_held, read_release = threading.Event(), threading.Event()
    get_many = PartitionStateStore.get_many

    def held_get_many(self: PartitionStateStore, keys: Sequence[str]) -> pa.Table:
        if engine.armed.is_set() and "n1" in self.path.parts:
            read_held.set()
            assert read_release.wait(30), "the read was never let go"
        return get_many(self, keys)

    class HeldNode(ArrowNode):
        def start_spark(self) -> None:
            self.engine = engine

    monkeypatch.setattr(PartitionStateStore, "get_many", held_get_many)
    old = HeldNode(node_config(store, 1, tmp_path / "n1"), store=store)
    new = ArrowNode(node_config(store, 2, tmp_path / "n2"), store=store)
    source = SourceLog(store, segment_events=100)
    with running(old), running(new):
        _wait_running_p0(old)
        engine.armed.set()
        source.append(0, events([f"k{i % 17}" for i in range(300)]))
        try:
            assert read_held.wait(30), "node 1 never read its batch's keys"
            config = MigrationConfig(migration_timeout_s=60, release_wait_timeout_s=10)
            task = MigrationCoordinator(Ledger(store), config).run(P0, NodeId(2))
            assert task.phase == MigrationPhase.ACTIVE
            assert not read_release.is_set()  # the whole move ran while node 1's read was held
        finally:
            read_release.set()
            engine.release.set()
        wait_until(lambda: committed_offset(store) == source.end_offset(0), 30, "node 2 to commit the batch")
    monkeypatch.undo()
    _assert_exact_and_audited(store)


def test_an_owner_that_hands_a_partition_over_keeps_following_it_from_its_own_copy(tmp_path: Path) -> None:
    store = _owned_by_node_1(tmp_path)
    owner = ArrowNode(node_config(store, 1, tmp_path / "n1", standby_for=(0,)), store=store)
    target = ArrowNode(node_config(store, 2, tmp_path / "n2"), store=store)
    with running(owner), running(target):
        _wait_running_p0(owner)
        copy = owner.workers[P0].replica
        coordinator = MigrationCoordinator(Ledger(store), MigrationConfig(migration_timeout_s=60))
        assert coordinator.run(P0, NodeId(2)).phase == MigrationPhase.ACTIVE
        wait_until(lambda: P0 in owner.standbys, 30, "node 1 to follow p0 as a standby")
        # The released owner's own copy goes on as the standby: nothing is downloaded again.
        assert owner.standbys[P0].replica is copy and copy.store is not None
        SourceLog(store, segment_events=100).append(0, events(["shared"] * 10))
        wait_until(lambda: committed_offset(store) == SourceLog(store).end_offset(0), 30, "node 2 to commit")
        wait_until(lambda: _caught_up(store, 1), 30, "node 1's standby to catch up")
        assert replica_state(copy) == reference_state(store)


class _RecordingEngine(ArrowBatchEngine):
    """Aggregates like `ArrowBatchEngine` and records, per call, the epoch and the migration's recorded phase."""

    def __init__(self, store: ObjectStore) -> None:
        self.coordinator = MigrationCoordinator(Ledger(store))
        self.calls: list[tuple[int, MigrationPhase | None]] = []

    def before_batch(self, epoch: int, job_group: str | None) -> None:
        task = self.coordinator.current(P0)
        self.calls.append((epoch, task.phase if task else None))


def test_a_targets_first_batch_starts_once_the_old_owner_is_asked_to_drain_and_commits_once(tmp_path: Path) -> None:
    """The target aggregates the events the old owner left behind while the handoff is still being
    recorded (from the drain request, before Seeking), stamped with its coming epoch; they are
    committed once, by the target."""
    store = _owned_by_node_1(tmp_path)
    old_engine, new_engine = _HeldWhenArmed(), _RecordingEngine(store)

    class OldNode(ArrowNode):
        def start_spark(self) -> None:
            self.engine = old_engine

    class NewNode(ArrowNode):
        def start_spark(self) -> None:
            self.engine = new_engine

    old = OldNode(node_config(store, 1, tmp_path / "n1"), store=store)
    new = NewNode(node_config(store, 2, tmp_path / "n2"), store=store)
    source = SourceLog(store, segment_events=100)
    with running(old), running(new):
        _wait_running_p0(old)
        source.append(0, events([f"k{i % 17}" for i in range(300)]))
        wait_until(lambda: committed_offset(store) == source.end_offset(0), 30, "node 1 to commit")
        final_offset = committed_offset(store)
        old_engine.armed.set()
        source.append(0, events([f"k{i % 5}" for i in range(50)]))
        try:
            assert old_engine.in_flight.wait(30), "node 1 never started the batch the drain abandons"
            coordinator = MigrationCoordinator(Ledger(store), MigrationConfig(migration_timeout_s=60))
            task = coordinator.run(P0, NodeId(2))
            assert task.phase == MigrationPhase.ACTIVE
            wait_until(lambda: committed_offset(store) == source.end_offset(0), 30, "node 2 to commit")
        finally:
            old_engine.release.set()
        early = {MigrationPhase.DRAINING, MigrationPhase.CHECKPOINTING, MigrationPhase.UPLOADING}
        early |= {MigrationPhase.RELEASED}
        early |= {MigrationPhase.DOWNLOADING, MigrationPhase.RESTORING}
        first = next(call for call in new_engine.calls if call[0] == task.to_epoch)
        assert first[1] in early, new_engine.calls
        history = ManifestReader(store).history(P0)
        data = [m.manifest for m in history if m.manifest.outputs]
        at_new_epoch = [m for m in data if m.fencing_token == task.to_epoch]
        assert at_new_epoch and at_new_epoch[0].source_offset == source.end_offset(0)
        assert max(m.source_offset for m in data if m.fencing_token < task.to_epoch) == final_offset
    _assert_audited(store)


def test_a_graceful_drain_follows_an_old_owner_commit_under_load(tmp_path: Path) -> None:
    """Under steady traffic the coordinator asks for the drain right after one of the old owner's data
    commits, so the partition's output stops as late as possible; nothing is lost or applied twice."""
    store = _owned_by_node_1(tmp_path)
    # The nodes see each append within 50 ms (as a producer's doorbell would have them): a steady cadence.
    old = ArrowNode(node_config(store, 1, tmp_path / "n1", log_ends_poll_s=0.05), store=store)
    new = ArrowNode(node_config(store, 2, tmp_path / "n2", log_ends_poll_s=0.05), store=store)
    source = SourceLog(store, segment_events=100)
    stop = threading.Event()

    def produce() -> None:
        while not stop.wait(0.05):
            source.append(0, events([f"k{i % 7}" for i in range(20)]))

    producer = threading.Thread(target=produce, daemon=True)
    reports: list[PhaseReport] = []
    with running(old), running(new):
        wait_until(lambda: P0 in old.workers and old.workers[P0].commits >= 0, 30, "node 1 to run p0")
        producer.start()
        wait_until(lambda: old.workers[P0].commits >= 5, 30, "node 1 to commit under load")
        coordinator = MigrationCoordinator(Ledger(store), MigrationConfig(migration_timeout_s=60))
        task = coordinator.run(P0, NodeId(2), on_phase=reports.append)
        stop.set()
        producer.join()
        assert task.phase == MigrationPhase.ACTIVE
        match = re.search(r"right after the old owner's commit at offset (\d+)", reports[0].detail)
        assert match, reports[0].detail
        aligned = int(match.group(1))
        data = [v.manifest for v in ManifestReader(store).history(P0) if v.manifest.outputs]
        old_commits = [m.source_offset for m in data if m.fencing_token == task.from_epoch]
        # The drain followed that commit: at most one more slipped in between seeing it and the drain.
        assert aligned in old_commits and len([o for o in old_commits if o > aligned]) <= 1, (aligned, old_commits)
        wait_until(lambda: committed_offset(store) == source.end_offset(0), 30, "node 2 to commit the rest")
    _assert_audited(store)


class _GroupRecordingEngine(ArrowBatchEngine):
    """Aggregates like `ArrowBatchEngine` and records each call's (epoch, job group)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def before_batch(self, epoch: int, job_group: str | None) -> None:
        self.calls.append((epoch, job_group or ""))

    def speculative(self) -> list[tuple[int, str]]:
        return [c for c in self.calls if "speculative" in c[1]]


def _hung_owner_and_standby(
    store: ObjectStore, tmp_path: Path
) -> tuple[ArrowNode, threading.Event, _HeldWhenArmed, ArrowNode, _GroupRecordingEngine]:
    """Node 1 owns p0 and can hang (no heartbeat, its batch blocked); node 2 keeps a standby copy."""
    hung = threading.Event()
    owner_engine, standby_engine = _HeldWhenArmed(), _GroupRecordingEngine()

    class HangingNode(ArrowNode):
        def start_spark(self) -> None:
            self.engine = owner_engine

        def _heartbeat_loop(self) -> None:
            assert self.handle is not None
            handle, beat = self.handle, self.handle.heartbeat

            def heartbeat(*args: Any, **kwargs: Any) -> Any:
                # A hung process writes nothing: its record ages until the ledger sees it dead.
                return handle.record if hung.is_set() else beat(*args, **kwargs)

            handle.heartbeat = heartbeat  # type: ignore[method-assign]
            super()._heartbeat_loop()

    class StandbyNode(ArrowNode):
        def start_spark(self) -> None:
            self.engine = standby_engine

    owner = HangingNode(node_config(store, 1, tmp_path / "n1", heartbeat_timeout_s=1.0), store=store)
    standby = StandbyNode(node_config(store, 2, tmp_path / "n2", standby_for=(0,)), store=store)
    return owner, hung, owner_engine, standby, standby_engine


def _commit_then_hang(
    store: ObjectStore, owner: ArrowNode, hung: threading.Event, owner_engine: _HeldWhenArmed, source: SourceLog
) -> tuple[int, int]:
    """Node 1 commits 300 events over 17 keys and node 2's standby catches up; then node 1 hangs in
    its batch of 50 more events over 5 keys. Returns the committed offset and epoch before the hang."""
    _wait_running_p0(owner)
    source.append(0, events([f"k{i % 17}" for i in range(300)]))
    wait_until(lambda: committed_offset(store) == source.end_offset(0), 30, "node 1 to commit")
    wait_until(lambda: _caught_up(store, 2), 30, "node 2's standby to catch up")
    committed, epoch = committed_offset(store), Ledger(store).ownership(P0).epoch  # type: ignore[union-attr]
    owner_engine.armed.set()
    hung.set()
    source.append(0, events([f"k{i % 5}" for i in range(50)]))
    return committed, epoch


def test_a_standby_starts_the_takeover_batch_while_the_owner_looks_dead_and_it_commits_once(tmp_path: Path) -> None:
    """Once the owner's heartbeat is overdue, the standby aggregates the events after its copy at the
    epoch the fence will mint; the failover's first commit is that batch, and the hung owner's own
    batch of the same events is fenced out when it wakes up."""
    store = _owned_by_node_1(tmp_path)
    owner, hung, owner_engine, standby, standby_engine = _hung_owner_and_standby(store, tmp_path)
    source = SourceLog(store, segment_events=100)
    with running(owner), running(standby):
        final_offset, epoch = _commit_then_hang(store, owner, hung, owner_engine, source)
        assert owner_engine.in_flight.wait(30), "node 1 never started the batch it hangs in"
        wait_until(lambda: bool(standby_engine.speculative()), 30, "node 2 to start the takeover batch")
        assert standby_engine.speculative()[0][0] == epoch + 1
        assert committed_offset(store) == final_offset

        coordinator = MigrationCoordinator(Ledger(store), MigrationConfig(migration_timeout_s=60))
        decision = prepare_failover(coordinator, 0, live={2}, allow_live_owner=True)
        assert decision.task is not None and decision.task.to_node == 2 and decision.task.to_epoch == epoch + 1
        drive(coordinator, decision.task)
        wait_until(lambda: committed_offset(store) == source.end_offset(0), 30, "node 2 to commit")
        # The speculative batch was the takeover's first batch: those events were aggregated once at that epoch.
        at_new_epoch = [c for c in standby_engine.calls if c[0] == epoch + 1]
        assert len(at_new_epoch) == 1 and "speculative" in at_new_epoch[0][1], standby_engine.calls
        data = [m.manifest for m in ManifestReader(store).history(P0) if m.manifest.outputs]
        assert [(m.fencing_token, m.source_offset) for m in data if m.fencing_token > epoch] == [
            (epoch + 1, source.end_offset(0))
        ]

        owner_engine.release.set()  # the zombie wakes up with a batch of the same events
        wait_until(lambda: owner.workers.get(P0) is None or owner.workers[P0].finished, 30, "node 1 to be fenced")
        assert committed_offset(store) == source.end_offset(0)
    _assert_audited(store)


def test_the_takeover_batch_reads_its_keys_from_the_standby_copy_before_the_failover(tmp_path: Path) -> None:
    """While the owner looks dead, the standby also reads the takeover batch's keys from its copy
    once the aggregate is done: the failover's first commit only merges (no read of the local store),
    and the committed state is still exactly the fold of every event."""
    store = _owned_by_node_1(tmp_path)
    owner, hung, owner_engine, standby, _ = _hung_owner_and_standby(store, tmp_path)
    source = SourceLog(store, segment_events=100)
    with running(owner), running(standby):
        _commit_then_hang(store, owner, hung, owner_engine, source)
        follower = standby.standbys[P0]
        wait_until(lambda: follower.read_ahead is not None, 30, "node 2 to read the takeover batch's keys")
        ahead = follower.read_ahead
        assert ahead is not None and follower.speculative is not None
        assert ahead.group == follower.speculative.group and ahead.values.num_rows == 5

        copy = follower.replica.store
        assert copy is not None
        reads: list[int] = []
        read = copy.get_many

        def counted(keys: Sequence[str]) -> pa.Table:
            reads.append(len(keys))
            return read(keys)

        copy.get_many = counted  # type: ignore[method-assign]
        coordinator = MigrationCoordinator(Ledger(store), MigrationConfig(migration_timeout_s=60))
        decision = prepare_failover(coordinator, 0, live={2}, allow_live_owner=True)
        assert decision.task is not None
        drive(coordinator, decision.task)
        wait_until(lambda: committed_offset(store) == source.end_offset(0), 30, "node 2 to commit")
        assert reads == [], f"the takeover's first commit read {reads} keys from the store"
        # The local store is written right after the publish: compare once it holds that commit.
        copy_at = standby.workers[P0].replica
        wait_until(lambda: copy_at.source_offset == source.end_offset(0), 10, "node 2 to apply its commit locally")
        assert replica_state(copy_at) == reference_state(store)
        owner_engine.release.set()
        wait_until(lambda: owner.workers.get(P0) is None or owner.workers[P0].finished, 30, "node 1 to be fenced")
    _assert_audited(store)


def test_values_read_ahead_serve_only_their_batch_at_the_offset_they_were_read_at() -> None:
    """A copy that moved on (the owner committed after the read) holds other values for those keys:
    the read-ahead no longer stands in for the read, nor does it for another batch."""
    done: Future[tuple[pa.Table, float]] = Future()
    done.set_result((pa.table({"key": pa.array(["a"])}), 0.0))

    def batch(start: int, group: str) -> InFlightBatch:
        events = SourceBatch(0, start, start + 10, (), ())
        return InFlightBatch(events, done, epoch=3, group=group, cluster_epoch=1, read_at=0.0, staged_at=0.0)

    ahead = ReadAhead("g1", 100, pa.array(["a"]), pa.table({"count": pa.array([1])}))
    assert ahead.serves(batch(100, "g1"), 100)
    assert not ahead.serves(batch(100, "g1"), 110), "the copy moved past the read"
    assert not ahead.serves(batch(110, "g1"), 110)
    assert not ahead.serves(batch(100, "g2"), 100), "another batch's keys"


def test_values_read_ahead_line_up_with_the_aggregate_and_give_way_to_keys_they_lack() -> None:
    """Read for the batch's event keys, the values are taken in the aggregate's row order; a key the
    aggregate made up (not an event key) means the read-ahead cannot stand in for the read."""
    ahead = ReadAhead(
        "g1",
        100,
        pa.array(["a", "b", "c"]),
        pa.table({"count": pa.array([1, None, 3], pa.int64())}),
    )
    previous = ahead.previous(pa.chunked_array([["c", "a"], ["b"]]))
    assert previous is not None and previous["count"].to_pylist() == [3, 1, None]
    assert ahead.previous(pa.array(["a", "z"])) is None


def test_a_read_ahead_never_labels_values_of_a_later_offset_with_its_batchs_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that moves the copy between the read-ahead's look at the offset and its read (another
    thread applying a commit) makes the read-ahead come back empty: the store checks and reads in one
    step, so values of the later offset are never served as the batch start's."""
    state = PartitionStateStore(tmp_path / "state", SCHEMA, partition=0)
    row = {"count": [1], "sum": [1.0], "min": [1.0], "max": [1.0], "last": [1.0], "last_offset": [9]}
    state.apply(pa.table({"key": ["a"], **row}), 10)
    batch = SourceBatch(0, 10, 20, (), ())
    done: Future[tuple[pa.Table, float]] = Future()
    inflight = InFlightBatch(batch, done, epoch=1, group="g", cluster_epoch=1, read_at=0.0, staged_at=0.0)
    copy = type("Copy", (), {"store": state})()
    monkeypatch.setattr(SourceBatch, "keys", lambda self: pa.array(["a"]))
    ahead = read_ahead(inflight, copy)
    assert ahead is not None and ahead.offset == 10 and ahead.values["count"].to_pylist() == [1]

    def keys_then_a_commit(self: SourceBatch) -> pa.Array:
        state.apply(pa.table({"key": ["a"], **row, "count": [7]}), 20)  # lands inside the window
        return pa.array(["a"])

    monkeypatch.setattr(SourceBatch, "keys", keys_then_a_commit)
    state.apply(pa.table({"key": ["a"], **row}), 10)  # back at the batch's start
    assert read_ahead(inflight, copy) is None
    state.close()


def test_a_takeover_batch_is_dropped_when_the_owner_turns_out_alive(tmp_path: Path) -> None:
    """A slow owner that commits after all: the standby drops the batch it started, nothing else changes."""
    store = _owned_by_node_1(tmp_path)
    owner, hung, owner_engine, standby, standby_engine = _hung_owner_and_standby(store, tmp_path)
    source = SourceLog(store, segment_events=100)
    with running(owner), running(standby):
        _wait_running_p0(owner)
        wait_until(lambda: _caught_up(store, 2), 30, "node 2's standby to catch up")
        owner_engine.armed.set()
        hung.set()
        source.append(0, events([f"k{i % 5}" for i in range(50)]))
        follower = standby.standbys[P0]
        wait_until(lambda: follower.speculative is not None, 30, "node 2 to start the takeover batch")

        owner_engine.armed.clear()
        hung.clear()
        owner_engine.release.set()
        wait_until(lambda: committed_offset(store) == source.end_offset(0), 30, "node 1 to commit after all")
        wait_until(lambda: follower.speculative is None, 30, "node 2 to drop its takeover batch")
        assert all("speculative" in c[1] for c in standby_engine.calls)  # it never ran p0 itself
        assert Ledger(store).ownership(P0).owner == 1  # type: ignore[union-attr]
    _assert_audited(store)
