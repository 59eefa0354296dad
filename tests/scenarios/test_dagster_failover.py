"""Dagster as the demo runs it: a real daemon and webserver, worker nodes as processes, a UI launch, ``kill -9``.

A migration launched through the webserver (as the Launchpad does) runs
from the pre-warmed pool with one op per phase. The node-failure sensor must
fence and drive a failover itself: both partitions of the killed node are
active on the live node before any ``failover_partition`` run has even
started, and the runs then record the phases. Meanwhile the sensors tick
many times, and the Runs list holds only the migration and the failovers (no
observation runs); the stream's freshness policy passes. The figures
(medians of several kills and launches) come from
``benchmarks.bench_dagster_failover``; this test only bounds them loosely.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, DagsterRunStatus, EventRecordsFilter
from dagster._core.definitions.freshness import FreshnessState
from dagster._core.scheduler.instigation import InstigatorType

from jobs import GRACEFUL_OPS
from laminar_dev.localcluster import Cluster, wait_until
from laminar_orchestration.identity import PartitionId
from tests.dagster_plane import ControlPlane, bring_up, failed_over

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.processes, pytest.mark.slow]

HEARTBEAT_TIMEOUT_S = 3.0
#: Far above the target (timeout + 5 s): a loaded CI machine must not fail the test; the benchmark tells.
LOOSE_BOUND_S = HEARTBEAT_TIMEOUT_S + 30.0
#: The jobs whose runs may appear in the Runs list: the moves and worker nodes, never observations.
MOVE_JOBS = {"migrate_partition", "failover_partition", "rebalance", "worker_node"}
SENSORS = {"node_failure_sensor", "migration_retry_sensor", "laminar_observation_sensor"}


def sensor_ticks(instance: DagsterInstance) -> dict[str, int]:
    """How many times each sensor has ticked so far."""
    return {
        state.instigator_name: len(instance.get_ticks(state.instigator_origin_id, state.selector_id))
        for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
    }


def test_a_ui_migration_then_a_killed_owner_failed_over_by_the_sensor_alone(tmp_path: Path) -> None:
    store_url = (tmp_path / "store").as_uri()
    cluster = Cluster(store_url, tmp_path, partitions=2, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    plane = ControlPlane(tmp_path, store_url, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    try:
        bring_up(plane, cluster, cluster.start_node, {0: 2, 1: 1}, alive_timeout_s=180)  # nodes start Spark

        # A UI launch moves partition 0 to node 1, in a run forked from the pool, one op per phase.
        run_id = plane.launch("migrate_partition", {"partition": 0, "to_node": 1})
        wait_until(lambda: cluster.owner(0) == 1, LOOSE_BOUND_S, "partition 0 on node 1")
        migrated = plane.wait_finished(run_id)
        assert migrated.status == DagsterRunStatus.SUCCESS
        assert "laminar/run_worker_pid" in migrated.tags, "the run was forked from the pool"
        with plane.instance() as instance:
            succeeded = {e.step_key for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_SUCCESS)}
            assert succeeded == {"plan", *GRACEFUL_OPS}

        epochs = {p: cluster.epoch(p) for p in (0, 1)}
        killed = time.time()
        cluster.kill(1)
        wait_until(lambda: all(failed_over(cluster, p, 2) for p in (0, 1)), LOOSE_BOUND_S, "both partitions on node 2")
        active_at = time.time()
        print(f"kill -9 -> both partitions active on node 2: {active_at - killed:.1f}s")

        # One run per partition records the failover; each started after the partition was active.
        def runs_done() -> bool:
            plane.check_running()
            runs = plane.runs("failover_partition")
            return len(runs) == 2 and all(r.status == DagsterRunStatus.SUCCESS for r in runs)

        wait_until(runs_done, 180, "two successful failover_partition runs", interval=0.5)
        for p in (0, 1):
            # One death, one failover per partition: the sensor's fence, and no second grant from its runs.
            grant = cluster.ledger.grant(PartitionId(p), epochs[p] + 1)
            assert grant is not None and grant.grant_kind == "fence" and grant.node == 2, grant
            assert cluster.ledger.grant(PartitionId(p), epochs[p] + 2) is None
        with plane.instance() as instance:
            runs = plane.runs("failover_partition")
            for run in runs:
                record = instance.get_run_record_by_id(run.run_id)
                assert record is not None and record.start_time is not None
                assert record.start_time > active_at - 0.5, "the sensor, not the run, made the partition active"
                assert run.tags["laminar/from_node"] == "1" and run.tags["laminar/to_node"] == "2"
                outputs = {
                    e.step_key: e.dagster_event.event_specific_data.metadata  # type: ignore[union-attr]
                    for e in instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_OUTPUT)
                }
                assert set(outputs) == {"fence", "download", "restore", "seek", "activate"}
                assert "bytes_moved" in outputs["download"] and "bytes_moved" not in outputs["restore"]
            # The dead owner was observed as it happened: a failover pending, then none.
            observations = instance.fetch_observations(AssetKey("ownership_map"), limit=100).records
            dead = [o for o in observations if o.asset_observation.metadata["on_dead_nodes"].value]  # type: ignore[union-attr]
            assert dead, "the ownership map never showed the dead owner"
            records = instance.event_log_storage.get_event_records(
                EventRecordsFilter(event_type=DagsterEventType.ASSET_CHECK_EVALUATION), limit=20
            )
            outcomes = [r.event_log_entry.dagster_event.event_specific_data.passed for r in records]  # type: ignore[union-attr]
            assert False in outcomes and outcomes[0] is True, outcomes  # newest first: healthy again

        # Nothing lost, nothing twice, across the migration and the failover.
        cluster.produce(200)
        cluster.wait_committed(120)
        audits = cluster.verify()
        assert audits and all(a.ok for a in audits), audits

        # Several more ticks of every sensor later, the Runs list holds only the moves.
        with plane.instance() as instance:
            before = sensor_ticks(instance)
            assert set(before) == SENSORS, before

            def ticked() -> bool:
                plane.check_running()
                now = sensor_ticks(instance)
                return all(now[name] >= before[name] + 4 for name in SENSORS)

            wait_until(ticked, 180, "four more ticks of every sensor", interval=1.0)
            jobs = sorted(r.job_name for r in instance.get_runs())
            assert set(jobs) <= MOVE_JOBS and jobs == ["failover_partition", "failover_partition", "migrate_partition"]

            # The stream kept up: the manifests' freshness policy passes (the daemon evaluates it every 30 s).
            def fresh() -> bool:
                records = instance.get_freshness_state_records([AssetKey("checkpoint_manifests")])
                record = records.get(AssetKey("checkpoint_manifests"))
                return record is not None and record.freshness_state == FreshnessState.PASS

            wait_until(fresh, 120, "the checkpoint_manifests freshness to pass", interval=1.0)
        for name in ("dagster-daemon", "dagster-webserver"):
            log = (tmp_path / f"{name}.log").read_text(errors="replace")
            assert "BetaWarning" not in log and "PreviewWarning" not in log, f"{name}: {log[-2000:]}"
    finally:
        plane.stop()
        cluster.shutdown()
