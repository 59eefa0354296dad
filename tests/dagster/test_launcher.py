"""The pre-warmed run launcher on a real webserver and daemon: runs fork from the pool and stay Dagster runs.

Launched through the webserver's GraphQL API as the Launchpad does, a run is
forked from the pool (its worker pid is a run tag), executes its ops as any
run does, can be terminated from the UI, and a worker killed with ``kill -9``
is reported failed by the daemon's run monitoring. Without a pool the run
launches the default way, through the code server, and a new pool is started.
No worker nodes are needed: the ledger says partition 0 is already on node 1,
so a migration to node 1 has nothing to do, and a retry delay keeps a run
waiting as long as the test needs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
from dagster import DagsterEventType, DagsterRun, DagsterRunStatus

from jobs import NOT_BEFORE_TAG
from laminar_dev.localcluster import wait_until
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import LocalObjectStore
from launcher import POOL_PID_TAG
from launcher.pool import process_start_ticks
from tests.dagster_plane import ControlPlane

pytestmark = [pytest.mark.dagster, pytest.mark.processes, pytest.mark.slow]

#: The failure sensor must leave the ledger's only node alone for the whole test.
HEARTBEAT_TIMEOUT_S = 3600.0


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    workdir = tmp_path_factory.mktemp("launcher")
    ledger = Ledger(LocalObjectStore(workdir / "store"))
    ledger.init_cluster(2)
    ledger.members.register_node(NodeId(1), heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    control = ControlPlane(workdir, (workdir / "store").as_uri(), heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    try:
        control.start_daemon()  # run monitoring
        control.start_webserver()
        yield control
    finally:
        control.stop()


def finished(plane: ControlPlane, run_id: str, timeout_s: float = 120) -> DagsterRun:
    return plane.wait_finished(run_id, timeout_s, interval=0.2)


def started(plane: ControlPlane, run_id: str) -> DagsterRun:
    def check() -> bool:
        with plane.instance() as instance:
            run = instance.get_run_by_id(run_id)
            return run is not None and run.status == DagsterRunStatus.STARTED and POOL_PID_TAG in run.tags

    wait_until(check, 120, f"run {run_id} to start", interval=0.2)
    with plane.instance() as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None
        return run


def messages(plane: ControlPlane, run_id: str, kind: DagsterEventType | None = None) -> list[str]:
    """The run's event messages (of one kind), oldest first."""
    with plane.instance() as instance:
        events = instance.all_logs(run_id, of_type=kind) if kind else instance.all_logs(run_id)
    return [(e.dagster_event.message or "") if e.dagster_event else e.user_message for e in events]


def nothing_to_do(plane: ControlPlane, tags: dict[str, str] | None = None) -> str:
    return plane.launch("migrate_partition", {"partition": 0, "to_node": 1}, tags)


def test_a_launched_run_is_forked_from_the_pool_and_runs_its_ops(plane: ControlPlane) -> None:
    plane.wait_pool()
    run = finished(plane, nothing_to_do(plane))
    assert run.status == DagsterRunStatus.SUCCESS
    worker = int(run.tags[POOL_PID_TAG])
    assert worker not in (plane.pool_pid(), os.getpid())
    with plane.instance() as instance:
        steps = {e.step_key: e.dagster_event_type for e in instance.all_logs(run.run_id) if e.step_key}
    assert steps["plan"] == DagsterEventType.STEP_SUCCESS and steps["drain"] == DagsterEventType.STEP_SKIPPED
    engine = messages(plane, run.run_id, DagsterEventType.ENGINE_EVENT)
    assert f"Started process for run (pid: {worker})." in engine, engine


def test_the_ui_terminates_a_forked_run(plane: ControlPlane) -> None:
    # A retry delay far ahead keeps the plan op sleeping until the run is terminated.
    run_id = nothing_to_do(plane, {NOT_BEFORE_TAG: str(time.time() + 3600)})
    run = started(plane, run_id)
    assert plane.terminate(run_id) == "TerminateRunSuccess"
    run = finished(plane, run_id)
    assert run.status == DagsterRunStatus.CANCELED
    pid = int(run.tags[POOL_PID_TAG])
    wait_until(lambda: process_start_ticks(pid) is None, 30, "the run worker to exit")


def test_run_monitoring_fails_a_run_whose_worker_was_killed(plane: ControlPlane) -> None:
    run_id = nothing_to_do(plane, {NOT_BEFORE_TAG: str(time.time() + 3600)})
    run = started(plane, run_id)
    os.kill(int(run.tags[POOL_PID_TAG]), signal.SIGKILL)
    run = finished(plane, run_id, timeout_s=180)  # the daemon checks every 15 s
    assert run.status == DagsterRunStatus.FAILURE
    said = messages(plane, run_id)
    assert any("run worker process" in m and "exited" in m for m in said), said[-5:]


def test_without_a_pool_runs_launch_through_the_code_server_and_a_pool_starts_again(plane: ControlPlane) -> None:
    pid = plane.pool_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: plane.pool_pid() is None, 30, "the pool to be gone")
    run = finished(plane, nothing_to_do(plane))
    assert run.status == DagsterRunStatus.SUCCESS and POOL_PID_TAG not in run.tags
    engine = messages(plane, run.run_id, DagsterEventType.ENGINE_EVENT)
    assert any("through the code server" in m for m in engine), engine
    # The launcher started a new pool for the next run.
    wait_until(lambda: plane.pool_pid() not in (None, pid), 180, "a new pool")
    run = finished(plane, nothing_to_do(plane))
    assert run.status == DagsterRunStatus.SUCCESS and POOL_PID_TAG in run.tags
