"""An idle node's store requests follow changes, not partitions: it polls its assignment record and
the recorded log ends, is woken by advisory nudges and doorbells, and converges without them. The
node is the real runtime with a pyarrow fold instead of Spark (`ArrowNode`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from laminar_dev.chaos import ArrowNode
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import run_migration
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.move_reports import MoveReports
from laminar_orchestration.protocol.nudge import SourceDoorbell
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.records import PartitionProgress
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import MigrationPhase
from laminar_orchestration.store import ObjectStore, StoreUnavailable
from laminar_orchestration.store.metering import RequestMeter

P, N = PartitionId, NodeId


@contextmanager
def running(node: ArrowNode) -> Iterator[ArrowNode]:
    runner = threading.Thread(target=node.run, kwargs={"install_signals": False}, daemon=True)
    runner.start()
    try:
        yield node
    finally:
        node.stop()
        runner.join(30)
        assert not runner.is_alive()


def _node(store: ObjectStore, tmp_path: Path, *, node_id: int = 1, **config: Any) -> ArrowNode:
    settings: dict[str, Any] = {"heartbeat_interval_s": 0.5, "idle_poll_max_s": 0.5, **config}
    workdir = str(tmp_path / f"node{node_id}")
    return ArrowNode(
        NodeConfig(store_url=store.url, node_id=node_id, workdir=workdir, **settings),
        store=store,
    )


def _place(ledger: Ledger, partition: int, node: int) -> None:
    """What the control plane does to place a partition (`MigrationCoordinator.reinstate`): the
    desired owner, the grant, and a nudge (the grant itself moves no assignment)."""
    desired = DesiredStates(ledger)
    desired.update(P(partition), lambda s: s.model_copy(update={"owner": node}))
    ledger.acquire(P(partition), N(node), expected_epoch=0, reason="place")
    desired.nudge([node])


def _wait_for(
    node: ArrowNode, done: Callable[[dict[int, PartitionProgress]], bool], what: str, timeout_s: float
) -> float:
    """Seconds until `done` holds for the node's partition reports; AssertionError naming `what` after `timeout_s`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if done(node._progress()):
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"{what} after {timeout_s}s: {node._progress()}")


def _wait_running(node: ArrowNode, partitions: set[int], timeout_s: float) -> float:
    return _wait_for(
        node,
        lambda progress: partitions <= {p for p, pr in progress.items() if pr.state == "running"},
        f"partitions {sorted(partitions)} not running",
        timeout_s,
    )


def test_an_idle_node_reads_its_assignment_and_no_partitions_desired_state(
    store: ObjectStore, tmp_path: Path, meter: RequestMeter
) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(6)
    for p in range(4):
        _place(ledger, p, 1)
    with running(_node(store, tmp_path, assignment_poll_s=0.2)) as node:
        _wait_running(node, {0, 1, 2, 3}, 30)
        time.sleep(1.0)  # the idle source polls reach their slowest
        before = meter.snapshot()
        time.sleep(3.0)
        after = meter.snapshot()

    families = {fam: n - before.by_family.get((m, fam), 0) for (m, fam), n in after.by_family.items() if m == "GET"}
    assert families.get("ledger/partitions/desired.json", 0) == 0  # nothing changed: no state read
    assert families.get("ledger/cluster.json", 0) == 0  # nor the partition count
    assert 5 <= families.get("ledger/assignments", 0) <= 3.0 / 0.2 + 3  # one GET per poll
    # Four idle partitions poll their source at most every idle_poll_max_s, one GET each.
    assert families.get("source", 0) <= 4 * (3.0 / 0.5 + 1)


def test_a_nudge_wakes_an_idle_node_long_before_its_next_poll(store: ObjectStore, tmp_path: Path) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(2)
    with running(_node(store, tmp_path, assignment_poll_s=60.0)) as node:
        time.sleep(0.5)  # registered, idle: its next poll is a minute away
        _place(ledger, 0, 1)
        took = _wait_running(node, {0}, 20)
    assert took < 10, took


@pytest.mark.parametrize("how", ["no endpoint", "unreachable endpoint"])
def test_a_node_that_misses_every_nudge_still_converges_at_its_poll(
    store: ObjectStore, tmp_path: Path, how: str
) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(2)
    config: dict[str, Any] = {"assignment_poll_s": 1.0}
    if how == "no endpoint":
        config["nudge_host"] = None
    with running(_node(store, tmp_path, **config)) as node:
        time.sleep(0.5)
        if how == "unreachable endpoint":
            assert node._nudges is not None
            node._nudges.close()  # its record still names the address: every nudge fails
        _place(ledger, 0, 1)
        _wait_running(node, {0}, 20)
        _place(ledger, 1, 1)
        _wait_running(node, {0, 1}, 20)


def _wait_committed(node: ArrowNode, partition: int, offset: int, timeout_s: float) -> float:
    return _wait_for(
        node,
        lambda progress: (pr := progress.get(partition)) is not None and pr.source_offset >= offset,
        f"partition {partition} not committed to {offset}",
        timeout_s,
    )


def _placed_and_running(store: ObjectStore, tmp_path: Path, partitions: int, **config: Any) -> ArrowNode:
    ledger = Ledger(store)
    ledger.init_cluster(partitions)
    for p in range(partitions):
        _place(ledger, p, 1)
    return _node(store, tmp_path, **config)


def test_while_producers_record_log_ends_an_idle_node_reads_one_object_not_each_log(
    store: ObjectStore, tmp_path: Path, meter: RequestMeter
) -> None:
    node = _placed_and_running(store, tmp_path, 4, log_ends_poll_s=0.2)
    with running(node):
        _wait_running(node, {0, 1, 2, 3}, 30)
        appended = SourceLog(store).append_many(generate_events(40, 8, seed=1, partitions=4))
        for p, result in appended.items():
            _wait_committed(node, p, result.next_offset, 30)
        # Every worker has seen the recorded ends since its last read, and has stopped re-reading its
        # log as a busy one (`log_watch.BUSY_PROBE_LAST_S`: 1.55 s of probes after the last batch).
        time.sleep(2.0)
        before = meter.snapshot()
        time.sleep(3.0)
        after = meter.snapshot()

    gets = {fam: n - before.by_family.get((m, fam), 0) for (m, fam), n in after.by_family.items() if m == "GET"}
    assert gets.get("source", 0) == 0  # no log is polled: the next poll of each is minutes away
    assert 5 <= gets.get("source/ends.json", 0) <= 3.0 / 0.2 + 3  # one GET per poll, whatever the partitions


@pytest.mark.parametrize("signal", ["recorded log ends", "doorbell"])
def test_an_append_reaches_its_owner_through_the_log_ends_or_the_doorbell(
    store: ObjectStore, tmp_path: Path, signal: str
) -> None:
    # A slow fallback poll: only the signal under test can bring the events in time.
    config: dict[str, object] = {"source_fallback_poll_s": 600.0, "log_ends_poll_s": 0.3}
    if signal == "doorbell":
        config["log_ends_poll_s"] = 600.0  # the node does not read the recorded ends again in time
    node = _placed_and_running(store, tmp_path, 1, **config)
    with running(node):
        _wait_running(node, {0}, 30)
        Ledger(store).members.admit_nodes()  # the doorbell rings the member nodes, as the control plane admits them
        # The node read the (empty) recorded ends as it started: each append needs the signal.
        doorbell = SourceDoorbell(ReadStore(store)) if signal == "doorbell" else None
        try:
            log = SourceLog(store, doorbell=doorbell)
            for seed in (1, 2):
                appended = log.append(0, generate_events(10, 2, seed=seed, partitions=1)[0])
                _wait_committed(node, 0, appended.next_offset, 30)
        finally:
            if doorbell is not None:
                doorbell.close()


def test_events_whose_log_end_was_never_recorded_are_found_at_the_fallback_poll(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _placed_and_running(store, tmp_path, 1, log_ends_poll_s=0.2, source_fallback_poll_s=1.0)
    with running(node):
        _wait_running(node, {0}, 30)
        first = SourceLog(store).append(0, generate_events(10, 2, seed=1, partitions=1)[0])
        _wait_committed(node, 0, first.next_offset, 30)

        def producer_dies_before_recording(self: SourceLog, ends: object) -> None:
            raise StoreUnavailable("put", "source/ends.json", "the producer died")

        monkeypatch.setattr(SourceLog, "_merge_ends", producer_dies_before_recording)
        second = SourceLog(store).append(0, generate_events(10, 2, seed=2, partitions=1)[0])
        assert SourceLog(store).log_ends() == {0: first.next_offset}  # the recorded end lags the log
        _wait_committed(node, 0, second.next_offset, 30)


def test_a_moves_driver_reads_the_move_reports_not_the_heartbeats(
    store: ObjectStore, tmp_path: Path, meter: RequestMeter
) -> None:
    """Each phase is reported in the node's small move report (only the partitions in a move), which
    the driver polls; the node records, with every partition's progress, are read a few times a move."""
    ledger = Ledger(store)
    ledger.init_cluster(12)
    for p in range(12):
        _place(ledger, p, 1)
    with running(_node(store, tmp_path)) as one, running(_node(store, tmp_path, node_id=2)):
        _wait_running(one, set(range(12)), 60)
        before = meter.snapshot()
        started = time.monotonic()
        final = run_migration(MigrationCoordinator(ledger), 0, 2)
        took = time.monotonic() - started
        after = meter.snapshot()
        reports = {n: MoveReports(ledger).read(N(n)) for n in (1, 2)}

    assert final.phase == MigrationPhase.ACTIVE
    gets = {fam: n - before.by_family.get((m, fam), 0) for (m, fam), n in after.by_family.items() if m == "GET"}
    assert gets.get("ledger/moves", 0) >= 2, gets  # the phases of both ends came through the move reports
    # The plan's look at the live nodes, the nudge addresses, the grant, and the old owner's liveness
    # every quarter of a second while it drains (a poll of the heartbeats would be one read per 10 ms).
    assert gets.get("ledger/nodes", 0) <= 10 + took / 0.25, (gets, took)
    for n, report in reports.items():
        assert report is not None and set(report.partitions) <= {0}, f"node {n} reports partitions in no move"


def test_a_loaded_partition_commits_batch_after_batch_without_waiting_for_the_log_ends(
    store: ObjectStore, tmp_path: Path
) -> None:
    """A producer that rings no doorbell appends every 0.1 s; the node reads the recorded ends only
    every 10 minutes. The worker's batches follow each other (a read right after each), not one per
    poll: everything is committed within seconds of the last append, long before the next poll."""
    node = _placed_and_running(store, tmp_path, 1, log_ends_poll_s=600.0, source_fallback_poll_s=600.0)
    log = SourceLog(store)
    first = log.append(0, generate_events(10, 2, seed=0, partitions=1)[0])  # before the node's first read
    with running(node):
        _wait_running(node, {0}, 30)
        _wait_committed(node, 0, first.next_offset, 30)
        last = first
        for seed in range(1, 31):
            last = log.append(0, generate_events(10, 2, seed=seed, partitions=1)[0])
            time.sleep(0.1)
        # Waiting for the recorded ends would wait for the node's next read of them, 10 minutes away.
        _wait_committed(node, 0, last.next_offset, 30)


def test_while_nudges_reach_it_a_moving_node_polls_its_assignment_slowly(store: ObjectStore, tmp_path: Path) -> None:
    """The nudge after each recorded phase brings a moving node to its assignment at once, so its
    poll is a fallback: every second while nudges arrive, fast when none came lately (or ever)."""
    Ledger(store).init_cluster(1)
    node = _node(store, tmp_path)
    assert node._moving_interval() == node.config.reconcile_interval_s  # never nudged
    node._nudged.set()
    assert node._moving_interval() == node.config.nudged_reconcile_interval_s == 1.0
    node._nudged.heard_at = time.monotonic() - 31.0  # the nudges stopped arriving
    assert node._moving_interval() == node.config.reconcile_interval_s
