"""Unit tests of the migration coordinator (`control.coordinator`): planning a move and recording each
phase before it takes effect, a failed or cancelled move's record, one migration per partition at a
time, a record past its deadline failed by whoever finds it, a fence that lost its race, two drivers
of one move, a move ended while its grant is in flight (the grant completed first), `laminar migrate
--cancel`'s rule, the drain's wait for the old owner's next commit, and a forced move's report of
Active recorded in one write."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from laminar_orchestration import cli
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import drive, run_migration
from laminar_orchestration.dataplane.handoff import PartitionDuty, partition_duty
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol import migration_errors
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.membership import NodeHandle
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.records import PartitionProgress, now
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import (
    GRACEFUL_PHASES,
    MigrationConfig,
    MigrationKind,
    MigrationPhase,
    MigrationTask,
)
from laminar_orchestration.store import LocalObjectStore, ObjectStore, open_store
from laminar_orchestration.store.metering import RequestMeter
from tests.commits import commit_all

P, N = PartitionId, NodeId


# --- planning and ending a move -------------------------------------------------------------


def _nodes_1_and_2(store: ObjectStore, partitions: int, owned: int) -> Ledger:
    """A cluster of `partitions` with nodes 1 and 2 registered and partition `owned` granted to node 1."""
    ledger = Ledger(store)
    ledger.init_cluster(partitions)
    ledger.members.register_node(N(1))
    ledger.members.register_node(N(2))
    ledger.acquire(P(owned), N(1), expected_epoch=0)
    return ledger


def test_migration_phase_failed_captures_context(store: ObjectStore) -> None:
    ledger = _nodes_1_and_2(store, partitions=1, owned=0)
    coordinator = MigrationCoordinator(ledger)
    task = coordinator.plan(P(0), N(2))
    coordinator._transition(P(0), task.migration_id, MigrationPhase.DRAINING)
    failed = coordinator.fail(P(0), task.migration_id, "disk full")
    assert failed.phase == MigrationPhase.FAILED
    assert (failed.failed_phase, failed.error) == (MigrationPhase.DRAINING, "disk full")
    assert failed.completed_at is not None
    stored = coordinator.current(P(0))
    assert stored == failed  # persisted before anything else happens
    # A failed migration frees the partition for the next one.
    assert coordinator.plan(P(0), N(2)).migration_id != task.migration_id


def test_migration_task_creation(store: ObjectStore) -> None:
    ledger = _nodes_1_and_2(store, partitions=2, owned=1)
    coordinator = MigrationCoordinator(ledger, MigrationConfig(migration_timeout_s=12))
    task = coordinator.plan(P(1), N(2))
    assert (task.partition, task.from_node, task.to_node) == (1, 1, 2)
    assert (task.from_epoch, task.to_epoch) == (1, 2)
    assert task.phase == MigrationPhase.PLANNED and task.migration_kind == MigrationKind.GRACEFUL
    assert task.timeout_s == 12 and task.completed_at is None and task.started_at <= now()
    with pytest.raises(migration_errors.MigrationEpochConflict):
        coordinator.plan(P(1), N(2))  # one migration per partition at a time
    with pytest.raises(migration_errors.NoLiveNode):
        coordinator.plan(P(0), N(7))
    unassigned = coordinator.plan(P(0), N(2))
    assert unassigned.migration_kind == MigrationKind.FORCED and unassigned.from_node == 0  # placement is a forced move


# --- fence races, moves ended mid-grant, overdue and wedged migrations ------------------------


def report_done(handle: NodeHandle, task: MigrationTask, done: MigrationPhase = MigrationPhase.ACTIVE) -> None:
    """What the target node's process reports when it finished `task` up to `done` (every phase)."""
    progress = PartitionProgress(
        partition=task.partition,
        epoch=task.to_epoch,
        state="running",
        migration_id=task.migration_id,
        phase_done=done.value,
    )
    handle.heartbeat(partitions={task.partition: progress})


def rival_fence_first(ledger: Ledger, monkeypatch: pytest.MonkeyPatch, winner: NodeId) -> None:
    """Make the next `ledger.fence` lose the race: another fence of the same epoch lands just before it."""
    real = ledger.fence

    def racing(partition: PartitionId, node: NodeId, *, expected_epoch: int, **kw: Any) -> Any:
        monkeypatch.setattr(ledger, "fence", real)
        real(partition, winner, expected_epoch=expected_epoch, reason="a rival failover")
        return real(partition, node, expected_epoch=expected_epoch, **kw)

    monkeypatch.setattr(ledger, "fence", racing)


def three_nodes(store: ObjectStore) -> tuple[Ledger, dict[int, NodeHandle]]:
    ledger = Ledger(store)
    ledger.init_cluster(1)
    handles = {n: ledger.members.register_node(N(n), heartbeat_timeout_s=60) for n in (1, 2, 3)}
    ledger.acquire(P(0), N(1), expected_epoch=0)
    return ledger, handles


def test_forced_migration_that_loses_the_fence_race_fails_and_a_new_one_succeeds(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, handles = three_nodes(store)
    coordinator = MigrationCoordinator(ledger, MigrationConfig(checkpoint_transfer_timeout_s=5))
    task = coordinator.plan(P(0), N(2), forced=True)
    rival_fence_first(ledger, monkeypatch, N(3))
    with pytest.raises(migration_errors.FenceLost) as info:
        drive(coordinator, task)
    assert (info.value.migration_id, info.value.expected, info.value.actual) == (task.migration_id, 1, 2)
    failed = coordinator.current(P(0))
    assert failed is not None and failed.migration_id == task.migration_id
    assert failed.phase == MigrationPhase.FAILED and failed.failed_phase == MigrationPhase.RELEASED
    assert failed.error is not None and "lost the fence race" in failed.error
    # Not wedged: a new forced migration is planned from the epoch the rival left, and completes.
    retry = coordinator.plan(P(0), N(2), forced=True)
    assert (retry.from_node, retry.from_epoch, retry.to_epoch) == (3, 2, 3)
    report_done(handles[2], retry)
    final = drive(coordinator, retry)
    assert final.phase == MigrationPhase.ACTIVE and final.migration_id == retry.migration_id
    own = ledger.ownership(P(0))
    assert own is not None and (own.owner, own.epoch) == (2, 3)


def test_two_drivers_of_one_forced_migration_both_pass_its_fence(store: ObjectStore) -> None:
    """Two coordinators (a sensor tick and a retried run) drive the same forced move at once: both
    check the ledger, both fence; the one that loses the create finds this very migration's grant
    there, and neither fails the move."""
    ledger, handles = three_nodes(store)
    task = MigrationCoordinator(ledger).plan(P(0), N(2), forced=True)
    both_checked = threading.Barrier(2, timeout=10)

    class PausedLedger(Ledger):
        def fence(self, *args: Any, **kwargs: Any) -> Any:
            both_checked.wait()  # each driver has read the epoch and is about to fence
            return super().fence(*args, **kwargs)

    outcomes: list[object] = []

    def drive_fence() -> None:
        coordinator = MigrationCoordinator(PausedLedger(store), MigrationConfig(checkpoint_transfer_timeout_s=5))
        try:
            outcomes.append(coordinator.begin_phase(P(0), task.migration_id, MigrationPhase.RELEASED).phase)
        except Exception as exc:
            outcomes.append(exc)

    drivers = [threading.Thread(target=drive_fence) for _ in range(2)]
    for t in drivers:
        t.start()
    for t in drivers:
        t.join(timeout=30)
    assert outcomes == [MigrationPhase.RELEASED, MigrationPhase.RELEASED]
    grants = [(g.epoch, g.node) for g in ledger.grants(P(0))]
    assert grants.count((task.to_epoch, 2)) == 1 and max(e for e, _ in grants) == task.to_epoch
    report_done(handles[2], task)
    final = drive(MigrationCoordinator(ledger), task)
    assert final.phase == MigrationPhase.ACTIVE and final.migration_id == task.migration_id


def held_in(store: ObjectStore, method: str) -> tuple[Ledger, threading.Event, threading.Event]:
    """A ledger whose calls of `method` signal the first event, then wait for the second: a driver
    held just before its grant."""
    reached, go_on = threading.Event(), threading.Event()
    ledger = Ledger(store)
    real = getattr(ledger, method)

    def held(*args: Any, **kwargs: Any) -> Any:
        reached.set()
        go_on.wait(10)
        return real(*args, **kwargs)

    setattr(ledger, method, held)
    return ledger, reached, go_on


def test_a_move_ended_while_its_driver_is_about_to_fence_completes_the_grant_first(store: ObjectStore) -> None:
    """A second driver of a forced move recorded Released, checked the record and is held just
    before its fence while the move is ended (a sensor timed it out). The end completes the grant
    itself before recording the outcome, so the grant and the record agree: the target holds the
    epoch and is the desired owner (its node takes the partition up), and the late fence creates
    nothing. Without that, the late grant would land after the outcome and strand the partition."""
    ledger, handles = three_nodes(store)
    coordinator = MigrationCoordinator(ledger, MigrationConfig(checkpoint_transfer_timeout_s=5))
    first = coordinator.plan(P(0), N(3), forced=True)
    held, at_fence, go_on = held_in(store, "fence")
    late = MigrationCoordinator(held)
    outcome: list[object] = []
    driver = threading.Thread(
        target=lambda: outcome.append(late.begin_phase(P(0), first.migration_id, MigrationPhase.RELEASED).phase)
    )
    driver.start()
    assert at_fence.wait(10)
    failed = coordinator.fail(P(0), first.migration_id, "timed out by the sensor")
    assert failed.phase == MigrationPhase.FAILED
    own = ledger.ownership(P(0))
    assert own is not None and (own.owner, own.epoch) == (3, first.to_epoch)
    state = DesiredStates(ledger).read(P(0))[0]
    assert state.owner == 3
    assert partition_duty(state, node=N(3), finished_migration=None, ownership=lambda: own) == PartitionDuty.RECOVER

    second = coordinator.plan(P(0), N(2), forced=True)
    assert (second.from_node, second.from_epoch) == (3, first.to_epoch)
    go_on.set()
    driver.join(timeout=10)
    # The late fence found this very migration's grant: it created nothing and did not fail.
    assert outcome == [MigrationPhase.RELEASED]
    assert [(g.epoch, g.node) for g in ledger.grants(P(0))] == [(1, 1), (first.to_epoch, 3)]
    report_done(handles[2], second)
    final = drive(coordinator, second)
    assert final.phase == MigrationPhase.ACTIVE
    own = ledger.ownership(P(0))
    assert own is not None and (own.owner, own.epoch) == (2, second.to_epoch)
    assert DesiredStates(ledger).read(P(0))[0].owner == 2


def test_a_graceful_move_failed_while_its_grant_is_in_flight_leaves_the_target_the_owner(store: ObjectStore) -> None:
    """Seeking is recorded before the target's grant; a move failed from then on completes the grant
    first. Staged: the driver is held inside its grant while the move's deadline is enforced."""
    ledger, _ = three_nodes(store)
    coordinator = MigrationCoordinator(ledger, MigrationConfig(checkpoint_transfer_timeout_s=5))
    task = coordinator.plan(P(0), N(2))
    assert task.migration_kind == MigrationKind.GRACEFUL
    for phase in GRACEFUL_PHASES[: GRACEFUL_PHASES.index(MigrationPhase.SEEKING)]:
        coordinator.begin_phase(P(0), task.migration_id, phase)
    ledger.release(ledger.adopt(P(0), N(1)), commit_ulid=None, source_offset=0)
    held, in_grant, go_on = held_in(store, "acquire")
    driver = threading.Thread(
        target=MigrationCoordinator(held).begin_phase,
        args=(P(0), task.migration_id, MigrationPhase.SEEKING),
    )
    driver.start()
    assert in_grant.wait(10)
    seeking = coordinator.current(P(0))
    assert seeking is not None and seeking.phase == MigrationPhase.SEEKING  # recorded before the grant
    coordinator.fail(P(0), task.migration_id, "deadline exceeded")
    go_on.set()
    driver.join(timeout=10)

    own = ledger.ownership(P(0))
    assert own is not None and (own.owner, own.epoch) == (2, task.to_epoch)
    assert DesiredStates(ledger).read(P(0))[0].owner == 2
    assert [(g.epoch, g.node) for g in ledger.grants(P(0))] == [(1, 1), (task.to_epoch, 2)]


def test_an_abort_that_reads_the_record_before_the_grant_phase_completes_the_grant_once_it_is_recorded(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The abort read the record at Planned; the driver records Released (and is about to fence)
    before the abort's write. The abort's write finds the grant phase recorded, completes the
    grant, and records the outcome with the target as the desired owner."""
    ledger, _ = three_nodes(store)
    coordinator = MigrationCoordinator(ledger)
    task = coordinator.plan(P(0), N(3), forced=True)
    driver = MigrationCoordinator(ledger)
    real_ownership = ledger.ownership
    calls = 0

    def ownership_then_the_driver_records_released(partition: PartitionId) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            # The driver records Released in the abort's read-to-write window (its fence comes later).
            driver._transition(P(0), task.migration_id, MigrationPhase.RELEASED)
        return real_ownership(partition)

    monkeypatch.setattr(ledger, "ownership", ownership_then_the_driver_records_released)
    failed = coordinator.fail(P(0), task.migration_id, "timed out")
    monkeypatch.setattr(ledger, "ownership", real_ownership)

    assert failed.phase == MigrationPhase.FAILED and failed.failed_phase == MigrationPhase.RELEASED
    own = ledger.ownership(P(0))
    assert own is not None and (own.owner, own.epoch) == (3, task.to_epoch)
    assert DesiredStates(ledger).read(P(0))[0].owner == 3


def test_a_conflict_with_another_migrations_record_leaves_that_record_alone(store: ObjectStore) -> None:
    ledger, _ = three_nodes(store)
    coordinator = MigrationCoordinator(ledger)
    theirs = coordinator.plan(P(0), N(2))
    with pytest.raises(migration_errors.MigrationEpochConflict) as info:
        run_migration(coordinator, 0, 3)
    assert info.value.other_migration == theirs.migration_id
    current = coordinator.current(P(0))
    assert current is not None and current.migration_id == theirs.migration_id and not current.is_terminal


def test_a_record_past_its_deadline_is_failed_by_the_next_coordinator_call(store: ObjectStore) -> None:
    ledger, _ = three_nodes(store)
    hasty = MigrationCoordinator(ledger, MigrationConfig(migration_timeout_s=0.05))
    stale = hasty.plan(P(0), N(2))
    time.sleep(0.1)  # its driver died: nobody will ever finish or fail it
    coordinator = MigrationCoordinator(ledger)
    fresh = coordinator.plan_or_resume(P(0), N(3))  # another target: a live record would conflict
    assert fresh.migration_id != stale.migration_id and fresh.phase == MigrationPhase.PLANNED
    # `plan` alone does the same.
    coordinator.desired.update(
        P(0), lambda s: s.model_copy(update={"migration": stale.model_copy(update={"migration_id": "old"})})
    )
    assert coordinator.plan(P(0), N(3)).migration_id != "old"


def test_run_phase_enforces_the_records_overall_deadline(store: ObjectStore) -> None:
    ledger, _ = three_nodes(store)
    # The phase limit (15 s by default) is generous; only the migration's own deadline can stop the wait.
    coordinator = MigrationCoordinator(ledger, MigrationConfig(migration_timeout_s=0.3))
    task = coordinator.plan(P(0), N(2))
    started = time.monotonic()
    with pytest.raises(migration_errors.MigrationTimeout):
        coordinator.run_phase(P(0), task.migration_id, MigrationPhase.DRAINING)  # node 1 never reports
    assert time.monotonic() - started < 5
    failed = coordinator.current(P(0))
    assert failed is not None and failed.phase == MigrationPhase.FAILED
    assert failed.failed_phase == MigrationPhase.DRAINING
    assert failed.error is not None and failed.error.startswith("deadline exceeded")
    # A driver resuming a record already past its deadline fails it without waiting.
    late = MigrationCoordinator(ledger, MigrationConfig(migration_timeout_s=0.05)).plan(P(0), N(2))
    time.sleep(0.1)
    with pytest.raises(migration_errors.MigrationTimeout):
        coordinator.run_phase(P(0), late.migration_id, MigrationPhase.DRAINING)
    expired = coordinator.current(P(0))
    assert expired is not None and expired.phase == MigrationPhase.FAILED
    assert expired.failed_phase == MigrationPhase.PLANNED


def wedge(ledger: Ledger, coordinator: MigrationCoordinator) -> MigrationTask:
    """A forced migration stuck at Released whose fence lost, as older releases left it."""
    task = coordinator.plan(P(0), N(2), forced=True)
    coordinator._transition(P(0), task.migration_id, MigrationPhase.RELEASED)
    ledger.fence(P(0), N(3), expected_epoch=1, reason="a rival failover")
    return task


def test_cli_migrate_cancel_ends_a_wedged_migration(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    ledger, handles = three_nodes(open_store(store_url, create=True))
    coordinator = MigrationCoordinator(ledger)
    wedged = wedge(ledger, coordinator)
    with pytest.raises(migration_errors.MigrationEpochConflict):
        coordinator.plan(P(0), N(2))
    assert cli.main(["migrate", "--store", store_url, "--partition", "0", "--cancel"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"cancelled migration {wedged.migration_id} of partition 0 (node 1 -> 2) at phase released"
    cancelled = coordinator.current(P(0))
    assert cancelled is not None and cancelled.phase == MigrationPhase.CANCELLED
    # The partition can be moved again.
    retry = coordinator.plan(P(0), N(2), forced=True)
    report_done(handles[2], retry)
    assert drive(coordinator, retry).phase == MigrationPhase.ACTIVE
    # Nothing in flight: a clear message and a non-zero exit.
    assert cli.main(["migrate", "--store", store_url, "--partition", "0", "--cancel"]) == 1
    err = capsys.readouterr().err
    assert f"no migration of partition 0 to cancel (the last one, {retry.migration_id}, ended active)" in err


def test_cli_migrate_cancel_refuses_once_the_new_owner_may_hold_the_epoch(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger, _ = three_nodes(open_store(store_url, create=True))
    coordinator = MigrationCoordinator(ledger)
    task = coordinator.plan(P(0), N(2))
    for phase in GRACEFUL_PHASES[1 : GRACEFUL_PHASES.index(MigrationPhase.SEEKING) + 1]:
        coordinator._transition(P(0), task.migration_id, phase)
    assert cli.main(["migrate", "--store", store_url, "--partition", "0", "--cancel"]) == 1
    assert f"cannot cancel migration {task.migration_id} of partition 0 at phase seeking" in capsys.readouterr().err
    current = coordinator.current(P(0))
    assert current is not None and current.phase == MigrationPhase.SEEKING
    assert cli.main(["migrate", "--store", store_url, "--partition", "0"]) == 2
    assert "--to: give the node to move the partition to" in capsys.readouterr().err


# --- the drain's alignment with the old owner's commits ---------------------------------------------


def test_the_drain_waits_for_the_old_owners_next_commit_when_the_last_is_older_than_the_limit(
    tmp_path: Path,
) -> None:
    """The drain is asked right after the old owner's next data commit. The wait is bounded from when
    it starts (and by three commit intervals after the last commit), so a commit due 0.6 s later is
    waited for although the last one is 1.2 s old with a 1.5 s limit. Bounding it from the last
    commit asked the drain at once, abandoning the batch about to commit."""
    store = LocalObjectStore(tmp_path / "store")  # the coordinator's timing, not the store, is under test
    ledger, _ = three_nodes(store)
    token = ledger.adopt(P(0), N(1))
    source = SourceLog(store, partitions=1)

    def commit_one(seed: int) -> None:
        source.append(0, generate_events(100, 10, seed, 1)[0])
        commit_all(store, token, snapshot_every=None)

    commit_one(1)
    time.sleep(1.0)
    commit_one(2)  # a commit every second: the next one is due within three seconds of this one
    time.sleep(1.2)
    coordinator = MigrationCoordinator(ledger, MigrationConfig(drain_alignment_s=1.5, warmup_timeout_s=0.0))
    task = coordinator.plan(P(0), N(2))
    committer = threading.Timer(0.6, commit_one, args=(3,))
    committer.start()
    try:
        report = coordinator.run_phase(P(0), task.migration_id, MigrationPhase.PLANNED)
    finally:
        committer.join()
    assert "right after the old owner's commit" in report.detail, report.detail

    # Right after a commit, with a limit shorter than the cadence, no commit is waited for.
    coordinator.cancel(P(0), task.migration_id)
    impatient = MigrationCoordinator(ledger, MigrationConfig(drain_alignment_s=0.3, warmup_timeout_s=0.0))
    task = impatient.plan(P(0), N(2))
    report = impatient.run_phase(P(0), task.migration_id, MigrationPhase.PLANNED)
    assert "next commit not expected within 0.3s" in report.detail, report.detail


# --- a forced move's target reporting Active ------------------------------------------------------


def forced_move_at_downloading(
    store: ObjectStore,
) -> tuple[Ledger, dict[int, NodeHandle], MigrationCoordinator, MigrationTask]:
    """A forced move of p0 from node 1 to node 2, fenced and recorded at Downloading."""
    ledger, handles = three_nodes(store)
    coordinator = MigrationCoordinator(ledger, MigrationConfig(checkpoint_transfer_timeout_s=5))
    task = coordinator.plan(P(0), N(2), forced=True)
    for phase in (MigrationPhase.PLANNED, MigrationPhase.RELEASED):
        coordinator.run_phase(P(0), task.migration_id, phase)
    coordinator.begin_phase(P(0), task.migration_id, MigrationPhase.DOWNLOADING)
    return ledger, handles, coordinator, task


def test_a_forced_moves_target_report_of_active_records_restoring_to_active_in_one_write(
    store: ObjectStore, meter: RequestMeter
) -> None:
    """The fence granted the epoch, so a forced move's target restores, takes it and reports Active
    at once. The wait on Downloading ends only on that report (a report of Restoring alone does not
    end it), and the record then goes from Downloading through Restoring and Seeking to Active in one
    checked write: the partition is the target's. The later phases are done with it: driving them
    reads and writes nothing."""
    ledger, handles, coordinator, task = forced_move_at_downloading(store)
    report_done(handles[2], task, MigrationPhase.RESTORING)
    assert coordinator.phase_reported(task, MigrationPhase.DOWNLOADING) is None
    report_done(handles[2], task)
    before = meter.snapshot()
    assert coordinator.phase_reported(task, MigrationPhase.DOWNLOADING) is not None
    writes = meter.snapshot().by_family.get(("PUT", "ledger/partitions/desired.json"), 0)
    assert writes - before.by_family.get(("PUT", "ledger/partitions/desired.json"), 0) == 1
    state = coordinator.desired.read(P(0))[0]
    assert state.migration is not None and state.migration.phase == MigrationPhase.ACTIVE
    assert state.owner == 2 and state.migration.completed_at is not None
    quiet = meter.snapshot()
    for phase in (MigrationPhase.RESTORING, MigrationPhase.SEEKING, MigrationPhase.ACTIVE):
        report = coordinator.run_phase(P(0), task.migration_id, phase)
        assert "recorded at once" in report.detail
    assert meter.snapshot().by_method == quiet.by_method  # not one request
    final = drive(MigrationCoordinator(ledger), task)  # a driver resuming it finds it done
    assert final.phase == MigrationPhase.ACTIVE


def test_a_forced_move_cancelled_before_the_targets_active_report_is_recorded_ends_cancelled(
    store: ObjectStore,
) -> None:
    """A cancel recorded while Downloading is: the target's later report of Active does not take the
    record to Active over it; the driver is told the move ended."""
    ledger, handles, coordinator, task = forced_move_at_downloading(store)
    MigrationCoordinator(ledger).cancel(P(0), task.migration_id)
    report_done(handles[2], task)
    with pytest.raises(migration_errors.MigrationFailed):
        coordinator.phase_reported(task, MigrationPhase.DOWNLOADING)
    ended = coordinator.current(P(0))
    assert ended is not None and ended.phase == MigrationPhase.CANCELLED
