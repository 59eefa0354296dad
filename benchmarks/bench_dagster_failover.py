"""Failover and migration through Dagster: where the seconds go, with the demo's settings.

Run from the repository root::

    python -m benchmarks.bench_dagster_failover           # 3 kills, 3 UI-launched migrations
    python -m benchmarks.bench_dagster_failover --quick   # 1 of each

Set-up: two worker nodes as processes (Spark ``local[1]`` each, heartbeat
timeout 6 s, a heartbeat every 1 s, as in `laminar demo`), two partitions on
one local store with 200 events/s of load, and Dagster as `laminar demo` runs
it: ``dagster-daemon`` and ``dagster-webserver`` on an instance configured by
the repo's ``dagster.yaml``.

Figures (medians; each printed next to its target):

1. **kill -9 of the owner of both partitions → both active on the other node**
   (migration record Active, recorded by the node-failure sensor), split into
   kill → declared dead (its last heartbeat + the timeout), detection (declared
   dead → the sensor planned the failover), the failover itself (planned →
   Active) and, off the critical path, the ``failover_partition`` run that
   records it (planned → run started → run succeeded). The killed node is
   restarted after each kill and the next kill hits the other node.
2. **A UI-launched migration, Launch → Active**: ``launchRun`` through the
   webserver's GraphQL API (dagster-graphql's ``DagsterGraphQLClient``, the
   mutation the Launchpad's button sends) → the migration record Active,
   split into launch → run started (the run worker forked from the
   pre-warmed pool, or a new process loading the code location when the pool
   cannot take the run), run started → the plan op starts, the plan op (the
   protocol's target warm-up and drain alignment) and the eight phase ops.
   Next to it, in the same run and under the same load, the same move driven
   by the coordinator alone (`laminar migrate`'s path, no Dagster): the
   difference is what Dagster adds.

The table is also written to ``benchmarks/results/dagster_failover.txt``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import DagsterEventType
from dagster_graphql import DagsterGraphQLClient

from laminar_dev.localcluster import Cluster, wait_until
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import run_migration
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.tasks import MigrationKind, MigrationPhase, MigrationTask, PhaseReport
from launcher import POOL_PID_TAG
from tests.dagster_plane import ControlPlane

HEARTBEAT_TIMEOUT_S = 6.0
RATE = 200  # events/s, as the demo produces
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Kill:
    total_s: float  # kill -> both partitions Active
    dead_s: float  # kill -> declared dead (the last heartbeat + the timeout)
    detect_s: float  # declared dead -> failover planned (the sensor)
    drive_s: float  # planned -> Active (slowest partition)
    run_start_s: float  # planned -> the recording run started
    run_done_s: float  # planned -> the recording run succeeded


@dataclass(frozen=True)
class Launch:
    total_s: float  # launchRun -> Active
    start_s: float  # launchRun -> run started
    ops_s: float  # run started -> Active
    to_plan_s: float  # run started -> the plan op started
    plan_s: float  # the plan op (warm-up, drain alignment)
    phases_s: float  # the plan op done -> Active (eight phase ops)
    forked: bool  # the run worker came from the pool
    load: float  # 1-minute load average when it ended


@dataclass(frozen=True)
class Direct:
    total_s: float  # run_migration called -> Active (the coordinator alone)
    plan_s: float  # its plan phase
    load: float


def _task(cluster: Cluster, p: int) -> MigrationTask | None:
    return DesiredStates(cluster.ledger).read(PartitionId(p))[0].migration


def _producer(cluster: Cluster, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        cluster.produce(RATE, keys=50)


def kill_once(cluster: Cluster, plane: ControlPlane, victim: int, survivor: int) -> Kill:
    before = {p: (t.migration_id if (t := _task(cluster, p)) else None) for p in (0, 1)}
    killed = time.time()
    cluster.kill(victim)
    heartbeat_at = next(v.record.heartbeat_at for v in cluster.ledger.members.nodes() if v.record.node == victim)

    def done() -> bool:
        tasks = [_task(cluster, p) for p in (0, 1)]
        return all(
            t is not None
            and t.migration_id != before[p]
            and t.migration_kind == MigrationKind.FORCED
            and t.phase == MigrationPhase.ACTIVE
            and t.to_node == survivor
            for p, t in zip((0, 1), tasks, strict=True)
        )

    wait_until(done, 120, f"both partitions active on node {survivor}", interval=0.02)
    active = time.time()
    tasks = [t for t in (_task(cluster, p) for p in (0, 1)) if t is not None]
    planned = min(t.started_at.timestamp() for t in tasks)
    completed = max(t.completed_at.timestamp() for t in tasks if t.completed_at is not None)
    dead_at = heartbeat_at.timestamp() + HEARTBEAT_TIMEOUT_S
    ids = {t.migration_id for t in tasks}

    def recorded() -> list[float]:
        plane.check_running()
        with plane.instance() as instance:
            got = []
            for run in plane.runs("failover_partition"):
                if run.tags.get("laminar/migration_id") not in ids or not run.is_success:
                    continue
                rec = instance.get_run_record_by_id(run.run_id)
                if rec is not None and rec.start_time and rec.end_time:
                    got += [rec.start_time, rec.end_time]
            return got

    wait_until(lambda: len(recorded()) == 4, 180, "the failover runs", interval=0.5)
    times = recorded()
    return Kill(
        total_s=completed - killed if completed >= killed else active - killed,
        dead_s=dead_at - killed,
        detect_s=planned - dead_at,
        drive_s=completed - planned,
        run_start_s=max(times[0::2]) - planned,
        run_done_s=max(times[1::2]) - planned,
    )


def launch_once(cluster: Cluster, plane: ControlPlane, client: Any, p: int, to_node: int) -> Launch:
    previous = _task(cluster, p)
    before = previous.migration_id if previous else None
    launched = time.time()
    run_id = client.submit_job_execution(
        "migrate_partition",
        repository_location_name="laminar",
        repository_name="__repository__",
        run_config={"partition": p, "to_node": to_node},
    )

    def active() -> bool:
        t = _task(cluster, p)
        return t is not None and t.migration_id != before and t.phase == MigrationPhase.ACTIVE and t.to_node == to_node

    wait_until(active, 120, f"partition {p} active on node {to_node}", interval=0.02)
    task = _task(cluster, p)
    assert task is not None and task.completed_at is not None
    done = task.completed_at.timestamp()
    with plane.instance() as instance:
        wait_until(lambda: bool((r := instance.get_run_record_by_id(run_id)) and r.end_time), 60, "run end")
        record = instance.get_run_record_by_id(run_id)
        assert record is not None and record.start_time is not None
        started = record.start_time
        steps = {
            (e.step_key, e.dagster_event_type): e.timestamp
            for e in instance.all_logs(run_id, of_type={DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS})
        }
        forked = POOL_PID_TAG in record.dagster_run.tags
    plan_start = steps[("plan", DagsterEventType.STEP_START)]
    plan_done = steps[("plan", DagsterEventType.STEP_SUCCESS)]
    return Launch(
        total_s=done - launched,
        start_s=started - launched,
        ops_s=done - started,
        to_plan_s=plan_start - started,
        plan_s=plan_done - plan_start,
        phases_s=done - plan_done,
        forked=forked,
        load=os.getloadavg()[0],
    )


def direct_once(cluster: Cluster, p: int, to_node: int) -> Direct:
    """The same move driven by the coordinator in this process, as `laminar migrate` does."""
    coordinator = MigrationCoordinator(cluster.ledger)
    reports: list[PhaseReport] = []
    called = time.time()
    task = run_migration(coordinator, p, to_node, on_phase=reports.append)
    assert task.phase == MigrationPhase.ACTIVE and task.completed_at is not None, task
    plan = next((r.duration_s for r in reports if r.phase == MigrationPhase.PLANNED), 0.0)
    return Direct(total_s=task.completed_at.timestamp() - called, plan_s=plan, load=os.getloadavg()[0])


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s" + (f"  (runs: {', '.join(f'{v:.2f}' for v in values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one kill and one launch")
    parser.add_argument("--launches", type=int, default=5, help="UI launches (and as many coordinator moves)")
    parser.add_argument("--kills", type=int, default=3, help="kill -9 rounds")
    parser.add_argument("--keep", type=Path, help="keep the store, node and Dagster logs in this directory")
    args = parser.parse_args()
    n_launches, n_kills = (1, 1) if args.quick else (args.launches, args.kills)
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="bench-dagster-"))
    workdir.mkdir(parents=True, exist_ok=True)
    store_url = (workdir / "store").as_uri()
    cluster = Cluster(store_url, workdir, partitions=2, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, node_args=())
    plane = ControlPlane(workdir, store_url, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    stop = threading.Event()
    kills: list[Kill] = []
    launches: list[Launch] = []
    directs: list[Direct] = []
    load_before = os.getloadavg()
    try:
        plane.start_daemon()
        cluster.start_node(1)
        cluster.start_node(2)
        plane.start_webserver()
        cluster.wait_alive(1, 2, timeout=240)
        cluster.place({0: 1, 1: 1})
        threading.Thread(target=_producer, args=(cluster, stop), daemon=True).start()
        plane.wait_sensors_ticking()
        plane.wait_pool()  # as in the demo, started when the webserver answered
        client = DagsterGraphQLClient("127.0.0.1", port_number=plane.port)
        # Moves first (both nodes up): partition 0 back and forth between nodes 1 and 2, alternately
        # by the coordinator alone and by a UI launch, so both see the same load.
        for i in range(n_launches):
            to_node = 2 if cluster.owner(0) == 1 else 1
            directs.append(direct_once(cluster, 0, to_node))
            print(f"coordinator move {i + 1}: {directs[-1]}", flush=True)
            time.sleep(2)  # a few commits on the new owner, as between two UI clicks
            to_node = 2 if cluster.owner(0) == 1 else 1
            launches.append(launch_once(cluster, plane, client, 0, to_node))
            print(f"launch {i + 1}: {launches[-1]}", flush=True)
            time.sleep(2)
        cluster.place({0: 1, 1: 1})
        victim, survivor = 1, 2
        for i in range(n_kills):
            kills.append(kill_once(cluster, plane, victim, survivor))
            print(f"kill {i + 1}: {kills[-1]}", flush=True)
            cluster.start_node(victim)
            cluster.wait_alive(victim, timeout=240)
            victim, survivor = survivor, victim
    finally:
        stop.set()
        plane.stop()
        cluster.shutdown()
    load_after = os.getloadavg()
    target_kill = HEARTBEAT_TIMEOUT_S + 5
    kill_met = "met" if statistics.median([k.total_s for k in kills]) <= target_kill else "NOT met"
    launch_met = "met" if statistics.median([x.total_s for x in launches]) <= 5 else "NOT met"
    ratios = [x.total_s / d.total_s for x, d in zip(launches, directs, strict=True) if d.total_s > 0]
    forked = sum(x.forked for x in launches)
    lines = [
        f"Dagster failover and launch ({n_kills} kill(s), {n_launches} launch(es) and coordinator moves; heartbeat "
        f"timeout {HEARTBEAT_TIMEOUT_S:g} s; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; "
        f"{os.cpu_count()} CPUs)",
        "",
        f"kill -9 -> both partitions active        {_median([k.total_s for k in kills])}   "
        f"target <= {target_kill:g} s: {kill_met}",
        f"  kill -> declared dead (heartbeat + 6 s)  {_median([k.dead_s for k in kills])}",
        f"  declared dead -> failover planned        {_median([k.detect_s for k in kills])}",
        f"  planned -> active (sensor drives it)     {_median([k.drive_s for k in kills])}",
        f"  planned -> recording run started         {_median([k.run_start_s for k in kills])}   (off the path)",
        f"  planned -> recording run succeeded       {_median([k.run_done_s for k in kills])}",
        f"UI launch -> migration active            {_median([x.total_s for x in launches])}   "
        f"target <= 5 s: {launch_met}",
        f"  launchRun -> run started                 {_median([x.start_s for x in launches])}   "
        f"({forked} of {len(launches)} forked from the pool)",
        f"  run started -> plan op started           {_median([x.to_plan_s for x in launches])}",
        f"  plan op (warm-up, drain alignment)       {_median([x.plan_s for x in launches])}",
        f"  plan done -> active (8 phase ops)        {_median([x.phases_s for x in launches])}",
        f"coordinator alone -> migration active    {_median([d.total_s for d in directs])}   (same moves, no Dagster)",
        f"  its plan phase                           {_median([d.plan_s for d in directs])}",
        f"UI launch / coordinator alone            {statistics.median(ratios):6.2f} x   (median of per-round ratios)",
        f"load average at each launch              {', '.join(f'{x.load:.1f}' for x in launches)}",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "dagster_failover.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
