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
   webserver's GraphQL API (what the Launchpad's button sends) → the
   migration record Active, split into launch → run started (the run worker
   process loading the code location) and run started → Active (the ops).

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

from laminar_dev.localcluster import Cluster, wait_until
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.migration import DesiredStates, MigrationKind, MigrationPhase, MigrationTask
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


def _task(cluster: Cluster, p: int) -> MigrationTask | None:
    return DesiredStates(cluster.ledger).read(PartitionId(p))[0].migration


def _producer(cluster: Cluster, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        cluster.produce(RATE, keys=50)


def kill_once(cluster: Cluster, plane: ControlPlane, victim: int, survivor: int) -> Kill:
    before = {p: (t.migration_id if (t := _task(cluster, p)) else None) for p in (0, 1)}
    killed = time.time()
    cluster.kill(victim)
    heartbeat_at = next(v.record.heartbeat_at for v in cluster.ledger.nodes() if v.record.node == victim)

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


def launch_once(cluster: Cluster, plane: ControlPlane, p: int, to_node: int) -> Launch:
    previous = _task(cluster, p)
    before = previous.migration_id if previous else None
    launched = time.time()
    run_id = plane.launch("migrate_partition", {"partition": p, "to_node": to_node})

    def active() -> bool:
        t = _task(cluster, p)
        return t is not None and t.migration_id != before and t.phase == MigrationPhase.ACTIVE and t.to_node == to_node

    wait_until(active, 120, f"partition {p} active on node {to_node}", interval=0.02)
    task = _task(cluster, p)
    assert task is not None and task.completed_at is not None
    done = task.completed_at.timestamp()
    with plane.instance() as instance:
        wait_until(lambda: bool((r := instance.get_run_record_by_id(run_id)) and r.start_time), 60, "run start")
        record = instance.get_run_record_by_id(run_id)
        assert record is not None and record.start_time is not None
        started = record.start_time
    return Launch(total_s=done - launched, start_s=started - launched, ops_s=done - started)


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s" + (f"  (runs: {', '.join(f'{v:.2f}' for v in values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one kill and one launch")
    parser.add_argument("--keep", type=Path, help="keep the store, node and Dagster logs in this directory")
    args = parser.parse_args()
    rounds = 1 if args.quick else 3
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="bench-dagster-"))
    workdir.mkdir(parents=True, exist_ok=True)
    store_url = (workdir / "store").as_uri()
    cluster = Cluster(store_url, workdir, partitions=2, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, node_args=())
    plane = ControlPlane(workdir, store_url, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    stop = threading.Event()
    kills: list[Kill] = []
    launches: list[Launch] = []
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
        # UI launches first (both nodes up): partition 0 back and forth between nodes 1 and 2.
        for i in range(rounds):
            to_node = 2 if cluster.owner(0) == 1 else 1
            launches.append(launch_once(cluster, plane, 0, to_node))
            print(f"launch {i + 1}: {launches[-1]}", flush=True)
        cluster.place({0: 1, 1: 1})
        victim, survivor = 1, 2
        for i in range(rounds):
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
    lines = [
        f"Dagster failover and launch ({rounds} run(s) each; heartbeat timeout {HEARTBEAT_TIMEOUT_S:g} s; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; {os.cpu_count()} CPUs)",
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
        f"  launchRun -> run started                 {_median([x.start_s for x in launches])}",
        f"  run started -> active (the ops)          {_median([x.ops_s for x in launches])}",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "dagster_failover.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
