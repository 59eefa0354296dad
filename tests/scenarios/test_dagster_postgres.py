"""Dagster as deployed: the code location on an instance whose storage is PostgreSQL, its daemon and
webserver as processes, three Spark-less node processes with a graceful leave, four partitions.

On that instance, as on the SQLite one (`test_dagster_failover.py`): a `migrate_partition` run
launched as the Launchpad launches it runs from the pre-warmed pool with one op per phase; a rolling
restart under a steady producer, each node leaving by planned migrations while the daemon runs, and
the `rebalance_schedule` (every minute here: ``LAMINAR_REBALANCE_CRON``), turned on once the nodes
are back, giving the last restarted node its share back as a `rebalance` run; then a node killed
with ``kill -9``, failed over by the failure sensor, with one `failover_partition` run per
partition. Every run is read back from the PostgreSQL database itself, and at the end every event
is committed exactly once.

The nodes run without their own rejoin (as `laminar node run --no-rejoin`), so what brings a restarted
node partitions is either the next node's leave (it moves them to the least-loaded live nodes) or the
schedule's rebalance run.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from dagster import DagsterEventType, DagsterRunStatus, RunsFilter
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage

from jobs import GRACEFUL_OPS
from laminar_dev.localcluster import NodeProcess, wait_until
from laminar_dev.rolling import (
    HEARTBEAT_TIMEOUT_S,
    LEAVE_DEADLINE_S,
    NodeRestart,
    RollingCluster,
    SteadyProducer,
    healthz,
    place,
)
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.tasks import MigrationKind, MigrationPhase
from tests.postgres import PostgresControlPlane, PostgresDatabase, PostgresServer
from tests.postgres import postgres_server as postgres_server  # the session's server (a fixture)
from tests.processes import free_port

pytestmark = [pytest.mark.dagster, pytest.mark.processes, pytest.mark.slow(seconds=240)]

NODES = [1, 2, 3]
#: The schedule's runs come at most a minute apart; a run takes seconds.
SCHEDULE_WAIT_S = 150.0
LOOSE_BOUND_S = HEARTBEAT_TIMEOUT_S + 30.0
SCHEDULE = {
    "repositoryLocationName": "laminar",
    "repositoryName": "__repository__",
    "scheduleName": "rebalance_schedule",
}
#: A Spark-less node without its own rejoin: `laminar_dev.arrownode` with `LeaveSettings(rejoin=False)`.
NO_REJOIN_NODE = (
    "import functools, sys; from laminar_dev import arrownode; "
    "arrownode.LeaveSettings = functools.partial(arrownode.LeaveSettings, rejoin=False); "
    "arrownode.main(sys.argv[1:])"
)


class NoRejoinCluster(RollingCluster):
    """`RollingCluster` whose nodes leave gracefully but do not take their share back themselves."""

    def start_node(self, node_id: int, *extra: str) -> NodeProcess:
        log_path = self.workdir / f"node{node_id}-{int(time.time() * 1000)}.log"
        cmd = [
            sys.executable, "-c", NO_REJOIN_NODE, "--store", self.store_url, "--node-id", str(node_id),
            "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S), "--heartbeat-interval", "0.5",
            "--metrics-port", str(self.ports[node_id]), "--table-sync-interval", "1",
            "--leave-deadline", str(LEAVE_DEADLINE_S), *extra,
        ]  # fmt: skip
        with open(log_path, "wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env)
        node = NodeProcess(node_id, proc, log_path)
        self.nodes[node_id] = node
        return node


@dataclass
class Deployed:
    plane: PostgresControlPlane
    cluster: NoRejoinCluster
    database: PostgresDatabase


@pytest.fixture(scope="module")
def deployed(postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    workdir = tmp_path_factory.mktemp("dagster-postgres")
    database = postgres_server.create_database("laminar")
    store_url = (workdir / "store").as_uri()
    cluster = NoRejoinCluster(store_url, workdir, partitions=4, ports={n: free_port() for n in NODES})
    plane = PostgresControlPlane(
        workdir,
        store_url,
        database,
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        env={"LAMINAR_REBALANCE_CRON": "* * * * *"},
    )
    try:
        plane.start_daemon()
        for n in NODES:
            cluster.start_node(n)
        plane.start_webserver()
        cluster.wait_alive(*NODES, timeout=60)
        place(cluster)
        plane.wait_sensors_ticking()
        plane.wait_pool()
        yield Deployed(plane, cluster, database)
    finally:
        plane.stop()
        cluster.shutdown()


def stored_runs(database: PostgresDatabase, job_name: str) -> dict[str, str]:
    """run id -> status of the job's runs, read from the database with SQL, not through Dagster."""
    rows = database.query("SELECT run_id, status FROM runs WHERE pipeline_name = %s", (job_name,))
    return {str(run_id): str(status) for run_id, status in rows}


def test_a_ui_launched_migration_runs_on_the_postgresql_instance(deployed: Deployed) -> None:
    plane, cluster, database = deployed.plane, deployed.cluster, deployed.database
    with plane.instance() as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
    # The daemon's sensor ticks are in the database.
    assert int(str(database.query("SELECT count(*) FROM job_ticks")[0][0])) > 0

    partition = cluster.partitions_of(1)[0]
    run_id = plane.launch("migrate_partition", {"partition": partition, "to_node": 2})
    wait_until(lambda: cluster.owner(partition) == 2, LOOSE_BOUND_S, f"partition {partition} on node 2")
    run = plane.wait_finished(run_id)
    assert run.status == DagsterRunStatus.SUCCESS
    assert "laminar/run_worker_pid" in run.tags, "the run was forked from the pool"
    with plane.instance() as instance:
        succeeded = {e.step_key for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_SUCCESS)}
    assert succeeded == {"plan", *GRACEFUL_OPS}
    assert stored_runs(database, "migrate_partition") == {run_id: "SUCCESS"}


def _rebalance_runs(deployed: Deployed) -> list[tuple[str, str, str]]:
    """Each rebalance run's id, status and creation time, for a failure's message."""
    with deployed.plane.instance() as instance:
        records = instance.get_run_records(RunsFilter(job_name="rebalance"))
    return [(r.dagster_run.run_id[:8], r.dagster_run.status.value, r.create_timestamp.isoformat()) for r in records]


def _leave_and_return(cluster: NoRejoinCluster, node: int) -> NodeRestart:
    """SIGTERM `node`, watch /healthz until it exits, then start it again until /healthz answers 200."""
    turn = NodeRestart(node, cluster.partitions_of(node))
    port = cluster.ports[node]
    started = time.monotonic()
    proc = cluster.nodes[node].proc
    cluster.nodes[node].signal(signal.SIGTERM)
    while proc.poll() is None and time.monotonic() - started < 60:
        if healthz(port) == 503:
            turn.not_ready_while_leaving = True
        time.sleep(0.05)
    turn.exit_code = proc.wait(5)
    turn.leave_s = time.monotonic() - started
    for p in turn.owned:
        task = cluster.coordinator.current(PartitionId(p))
        graceful = (
            task is not None
            and task.migration_kind == MigrationKind.GRACEFUL
            and task.from_node == node
            and task.phase == MigrationPhase.ACTIVE
            and cluster.owner(p) == task.to_node
        )
        turn.left_by[p] = "graceful" if graceful else f"on node {cluster.owner(p)}: {task}"
    started = time.monotonic()
    cluster.start_node(node)
    wait_until(lambda: healthz(port) == 200, 60, f"node {node}'s /healthz to answer 200", 0.05)
    turn.ready_s = time.monotonic() - started
    return turn


def _schedule(plane: PostgresControlPlane, mutation: str) -> str:
    """Turn `rebalance_schedule` on ("startSchedule") or back to its default, off ("resetSchedule"), as the
    UI's toggle does; the mutation's result type."""
    query = f"mutation($s: ScheduleSelector!) {{ {mutation}(scheduleSelector: $s) {{ __typename }} }}"
    return str(plane.graphql(query, {"s": SCHEDULE})[mutation]["__typename"])


def _moved_by(deployed: Deployed, run_id: str) -> set[int]:
    """The partitions a `rebalance` run moved (its summary's metadata)."""
    with deployed.plane.instance() as instance:
        for event in instance.all_logs(run_id, of_type=DagsterEventType.STEP_OUTPUT):
            if event.step_key == "summarize_rebalance":
                text = event.dagster_event.event_specific_data.metadata["partitions"].value  # type: ignore[union-attr]
                return {int(p) for p in str(text).split(", ") if p.isdigit()}
    return set()


def test_a_rolling_restart_under_the_daemon_records_the_rebalance_as_runs_in_postgresql(deployed: Deployed) -> None:
    plane, cluster, database = deployed.plane, deployed.cluster, deployed.database
    place(cluster)  # balanced again after the UI's move
    runs_before = {r.run_id for r in plane.runs()}
    producer = SteadyProducer(cluster, per_tick=20, interval_s=0.1)
    producer.start()
    turns: list[NodeRestart] = []
    try:
        for n in NODES:
            turns.append(_leave_and_return(cluster, n))
            time.sleep(1.0)
        last = NODES[-1]
        assert not cluster.partitions_of(last), "nothing but the schedule gives the last node partitions"
        returned = time.time()
        # On once the nodes are back: a rebalance planned while a node leaves counts it as live.
        assert _schedule(plane, "startSchedule") == "ScheduleStateResult"
        try:
            wait_until(
                lambda: bool(cluster.partitions_of(last)) and all(r.is_finished for r in plane.runs("rebalance")),
                SCHEDULE_WAIT_S,
                f"the scheduled rebalance to give node {last} its share back",
                interval=0.5,
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; the rebalance runs: {_rebalance_runs(deployed)}") from exc
    finally:
        producer.stop()
        _schedule(plane, "resetSchedule")  # back to its default: off
    cluster.wait_committed(120)

    for turn in turns:
        assert turn.exit_code == 0, f"node {turn.node} exited with {turn.exit_code}"
        assert turn.owned, f"node {turn.node} owned nothing when it was stopped"
        assert set(turn.left_by.values()) == {"graceful"}, turn.left_by
        assert turn.not_ready_while_leaving, f"node {turn.node}'s /healthz never said 503 while it left"

    # The runs of the rolling restart: the schedule's rebalances, no failover (every leave was planned).
    new_runs = [r for r in plane.runs() if r.run_id not in runs_before]
    assert {r.job_name for r in new_runs} == {"rebalance"}, [(r.job_name, r.status) for r in new_runs]
    assert all(r.tags.get("dagster/schedule_name") == "rebalance_schedule" for r in new_runs)
    stored = stored_runs(database, "rebalance")
    assert {r.run_id for r in new_runs} <= set(stored)
    assert all(status == "SUCCESS" for status in stored.values()), stored
    with plane.instance() as instance:
        records = [instance.get_run_record_by_id(r.run_id) for r in new_runs]
    late = [rec.dagster_run for rec in records if rec and rec.create_timestamp.timestamp() >= returned - 1]
    moved = set().union(*(_moved_by(deployed, r.run_id) for r in late))
    share = set(cluster.partitions_of(last))
    assert share and share <= moved, f"node {last} holds {share}; the rebalance runs after its return moved {moved}"
    for p in share:
        task = cluster.coordinator.current(PartitionId(p))
        assert task is not None and task.migration_kind == MigrationKind.GRACEFUL and task.to_node == last
    print(
        "rolling restart on PostgreSQL: leaves "
        + ", ".join(f"node {t.node} {t.leave_s:.1f}s" for t in turns)
        + f"; {len(new_runs)} rebalance run(s), node {last}'s share {sorted(share)} back "
        f"{time.time() - returned:.0f}s after its return"
    )
    audits = cluster.verify()
    assert audits and all(a.ok for a in audits), audits


def test_a_killed_node_is_failed_over_by_the_sensor_and_recorded_in_postgresql(deployed: Deployed) -> None:
    plane, cluster, database = deployed.plane, deployed.cluster, deployed.database
    victim = max(NODES, key=lambda n: len(cluster.partitions_of(n)))
    owned = cluster.partitions_of(victim)
    assert owned
    before = set(stored_runs(database, "failover_partition"))
    cluster.kill(victim)

    def failed_over(p: int) -> bool:
        task = DesiredStates(cluster.ledger).read(PartitionId(p))[0].migration
        return (
            task is not None
            and task.migration_kind == MigrationKind.FORCED
            and task.phase == MigrationPhase.ACTIVE
            and cluster.owner(p) not in (0, victim)
        )

    wait_until(lambda: all(failed_over(p) for p in owned), LOOSE_BOUND_S, f"node {victim}'s partitions failed over")

    def recorded() -> bool:
        plane.check_running()
        runs = {k: v for k, v in stored_runs(database, "failover_partition").items() if k not in before}
        return len(runs) == len(owned) and all(v == "SUCCESS" for v in runs.values())

    wait_until(recorded, 180, f"{len(owned)} successful failover_partition runs in PostgreSQL", interval=0.5)
    for run in plane.runs("failover_partition"):
        if run.run_id not in before:
            assert run.tags["laminar/from_node"] == str(victim)
    cluster.produce(200)
    cluster.wait_committed(120)
    audits = cluster.verify()
    assert audits and all(a.ok for a in audits), audits
