"""A node's graceful leave, with a real node runtime in this process and a target that never takes over."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from laminar_dev.chaos.arrow import ArrowNode
from laminar_orchestration.control import leave as leave_module
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.leave import (
    GracefulLeave,
    LeaveSettings,
    RejoinOutcome,
    leave_pace,
    reinstate_after_cut_moves,
    rejoin_when_registered,
)
from laminar_orchestration.control.placement import Move
from laminar_orchestration.control.snapshot import snapshot_cluster
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.membership import NodeHandle
from laminar_orchestration.protocol.migration_errors import CancelRefused
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationPhase, MigrationTask
from laminar_orchestration.store import ObjectStore
from tests.dataplane.plane import running
from tests.ledgers import make_alive, new_ledger, place_on_node_1
from tests.nodes import quick_node_config


def test_a_leave_whose_target_never_takes_over_ends_released_not_granted_back_to_the_stopping_node(
    store: ObjectStore, tmp_path: Path
) -> None:
    """Two nodes stopping at once: the leaving node's move goes to a peer that stops too. At the deadline
    the move is cancelled; the partition must end released by the leaving node at its epoch. Granted
    back to it, it would sit on a stopped node, active and owned, until a failover."""
    ledger = new_ledger(store, 1)
    place_on_node_1(ledger)
    make_alive(ledger, 2)  # heartbeating as far as the ledger knows, but it never takes a partition up
    node = ArrowNode(quick_node_config(store, tmp_path), store=store)
    stopped = threading.Event()
    with running(node):
        deadline = time.monotonic() + 30
        while (worker := node.workers.get(PartitionId(0))) is None or worker.state_name.value != "running":
            assert time.monotonic() < deadline, "node 1 never ran partition 0"
            time.sleep(0.02)
        leave = GracefulLeave(node, LeaveSettings(deadline_s=3.0))
        node_stop = node.stop

        def stop_and_tell() -> None:
            node_stop()
            stopped.set()

        node.stop = stop_and_tell  # type: ignore[method-assign]
        leave.request()
        assert stopped.wait(30), "the leave never stopped the node"
    assert leave.outcome is not None and leave.outcome.moved == (), leave.outcome
    assert leave.outcome.left_behind[0].endswith("; cancelled"), leave.outcome

    own = ledger.ownership(PartitionId(0))
    assert own is not None
    assert (int(own.owner), own.epoch, own.status) == (1, 1, PartitionStatus.RELEASED), own
    state, _ = DesiredStates(ledger).read(PartitionId(0))
    assert state.migration is not None and state.migration.phase == MigrationPhase.CANCELLED
    assert snapshot_cluster(ledger).partitions[0].phase_text() == "released by node 1"


def test_a_restarted_node_takes_back_what_its_last_leave_left_moving_once_that_move_is_overdue(
    store: ObjectStore,
) -> None:
    """The leave's process exited with a move away from it still in flight after its release (a slow
    store ate the time to cancel it): nothing drives that move any more. The restarted node waits for
    the move's deadline, then the record is failed and the partition granted back to it."""
    ledger = new_ledger(store, 1)
    place_on_node_1(ledger)
    make_alive(ledger, 1, 2)
    MigrationCoordinator(ledger, MigrationConfig(migration_timeout_s=0.5, warmup_timeout_s=0)).plan(
        PartitionId(0), NodeId(2)
    )
    token = ledger.adopt(PartitionId(0), NodeId(1))
    ledger.release(token, commit_ulid=None, source_offset=0)
    started = time.monotonic()
    granted = reinstate_after_cut_moves(ledger, 1, threading.Event())
    assert time.monotonic() - started >= 0.4, "a move in flight decides until its deadline"
    assert granted == {0: 2}
    own = ledger.ownership(PartitionId(0))
    assert own is not None and (int(own.owner), own.epoch, own.status) == (1, 2, PartitionStatus.ACTIVE), own
    # Nothing left moving: no wait, nothing granted.
    assert reinstate_after_cut_moves(ledger, 1, threading.Event()) == {}


def test_a_leave_moves_one_partition_at_a_time_while_the_deadline_allows_and_more_when_it_does_not() -> None:
    # Two moves fit one after the other in half of 20 s: each partition pauses for its own move only.
    assert leave_pace(2, 0.5, 20.0, 4) == 1
    assert leave_pace(10, 2.0, 30.0, 4) == 2  # 20 s of moves in a third of 30 s: two at once
    assert leave_pace(100, 1.0, 20.0, 4) == 4  # never more than the cap
    assert leave_pace(3, 2.0, 3.0, 4) == 3  # never more than remain
    assert leave_pace(0, 1.0, 20.0, 4) == 0
    assert leave_pace(5, 1.0, -1.0, 4) == 4  # past the deadline: everything at once, up to the cap


class _LeavingStub:
    """A registered node for `GracefulLeave` whose moves are timed stand-ins (`_move` is replaced)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.leaving = threading.Event()
        self.on_leave: Callable[[], None] | None = None
        self.handle: NodeHandle | None = ledger.members.register_node(NodeId(1), heartbeat_timeout_s=60)
        self.stopped = threading.Event()

    @property
    def id(self) -> NodeId:
        return NodeId(1)

    def stop(self) -> None:
        self.stopped.set()


def _three_on_node_1(store: ObjectStore) -> Ledger:
    ledger = new_ledger(store, 3)
    for p in range(3):
        DesiredStates(ledger).update(PartitionId(p), lambda s: s.model_copy(update={"owner": 1}))
        ledger.acquire(PartitionId(p), NodeId(1), expected_epoch=0, reason="place", generation=1)
    return ledger


def _concurrency_of_a_leave(store: ObjectStore, deadline_s: float, move_s: float) -> tuple[int, tuple[int, ...]]:
    ledger = _three_on_node_1(store)
    node = _LeavingStub(ledger)
    make_alive(ledger, 2)
    leave = GracefulLeave(node, LeaveSettings(deadline_s=deadline_s, max_concurrent=4))
    lock = threading.Lock()
    now_running, most = 0, 0

    def move(_move: Move, _deadline: float) -> str:
        nonlocal now_running, most
        with lock:
            now_running += 1
            most = max(most, now_running)
        time.sleep(move_s)
        with lock:
            now_running -= 1
        return "active"

    leave._move = move  # type: ignore[method-assign,assignment]
    outcome = leave.leave()
    return most, outcome.moved


def test_a_leave_with_time_to_spare_runs_its_moves_one_after_another(store: ObjectStore) -> None:
    most, moved = _concurrency_of_a_leave(store, deadline_s=30.0, move_s=0.2)
    assert moved == (0, 1, 2)
    assert most == 1, f"{most} moves ran at once; each partition would pause for the others' drains"


def test_a_leave_short_of_time_runs_its_moves_side_by_side(store: ObjectStore) -> None:
    most, moved = _concurrency_of_a_leave(store, deadline_s=3.0, move_s=0.5)
    assert moved == (0, 1, 2)
    assert most == 3, f"only {most} moves at once with 3 s for three moves expected to take 2 s each"


def test_a_move_past_its_cancel_point_at_the_deadline_is_finished_not_left_waiting(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the deadline a move whose new owner may hold the epoch cannot be cancelled; the leaving node
    is its only driver, so it drives it on to Active within the cancels' budget."""
    ledger = _three_on_node_1(store)
    node = _LeavingStub(ledger)
    make_alive(ledger, 2)
    leave = GracefulLeave(node, LeaveSettings(deadline_s=0.5))
    in_flight = {p: MigrationCoordinator(ledger).plan(PartitionId(p), NodeId(2)) for p in range(3)}
    leave._move = lambda move, deadline: "the deadline passed before active"  # type: ignore[method-assign]

    def refused(self: MigrationCoordinator, partition: PartitionId, *, grant_back: bool = True) -> MigrationTask:
        raise CancelRefused(partition, in_flight[int(partition)].migration_id, MigrationPhase.SEEKING)

    driven: list[tuple[int, float]] = []

    def drive(
        coordinator: MigrationCoordinator, task: MigrationTask, deadline: float, *, grant_back: bool = True
    ) -> SimpleNamespace:
        driven.append((task.partition, deadline - time.monotonic()))
        assert not grant_back, "the leaving node stops next: nothing may be granted back to it"
        return SimpleNamespace(finished=True)

    monkeypatch.setattr(MigrationCoordinator, "cancel_current", refused)
    monkeypatch.setattr(leave_module, "drive_with_deadline", drive)
    outcome = leave.leave()
    assert sorted(p for p, _ in driven) == [0, 1, 2]
    assert all(0 < budget <= leave_module.CANCEL_BUDGET_S for _, budget in driven), driven
    assert all(why.endswith("; finished") for why in outcome.left_behind.values()), outcome.left_behind


def test_a_returning_node_waits_for_its_warm_copy_as_a_planned_move_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leave is on the pod's clock and waits 2 s at most for a target's warm copy; a return is not on
    a clock: its moves wait for the returning node's copy as long as any planned move does, so the
    partition does not pause while a cold copy restores."""
    asked: list[MigrationConfig] = []

    def rejoin(_ledger: object, node: int, config: MigrationConfig) -> RejoinOutcome:
        asked.append(config)
        return RejoinOutcome(node, {}, ())

    monkeypatch.setattr(leave_module, "rejoin", rejoin)
    monkeypatch.setattr(leave_module, "reinstate_after_cut_moves", lambda *_args: {})
    node = SimpleNamespace(handle=object(), leaving=threading.Event(), ledger=None, id=NodeId(1))
    settings = LeaveSettings()
    rejoin_when_registered(node, settings).join(10)
    assert [c.warmup_timeout_s for c in asked] == [MigrationConfig().warmup_timeout_s]
    assert settings.migration.warmup_timeout_s < MigrationConfig().warmup_timeout_s  # the leave's own moves
