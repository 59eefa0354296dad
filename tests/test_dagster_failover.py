"""Failover through Dagster alone: a real ``dagster-daemon``, worker nodes as processes, ``kill -9``.

The node-failure sensor must fence and drive the failover itself: both
partitions of the killed node are active on the live node before any
``failover_partition`` run has even started, and the runs then record the
phases. The figures (medians of several kills) come from
``benchmarks.bench_dagster_failover``; this test only bounds them loosely.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterEventType, DagsterRunStatus, EventRecordsFilter

from laminar_dev.localcluster import Cluster, wait_until
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.migration import DesiredStates, MigrationKind, MigrationPhase

from .dagster_plane import ControlPlane

HEARTBEAT_TIMEOUT_S = 3.0
#: Far above the target (timeout + 5 s): a loaded CI machine must not fail the test; the benchmark tells.
LOOSE_BOUND_S = HEARTBEAT_TIMEOUT_S + 30.0


def failed_over(cluster: Cluster, p: int, to_node: int) -> bool:
    task = DesiredStates(cluster.ledger).read(PartitionId(p))[0].migration
    return (
        task is not None
        and task.migration_kind == MigrationKind.FORCED
        and task.phase == MigrationPhase.ACTIVE
        and task.to_node == to_node
        and cluster.owner(p) == to_node
    )


@pytest.mark.spark
def test_a_killed_owner_is_failed_over_by_the_sensor_alone(tmp_path: Path) -> None:
    store_url = (tmp_path / "store").as_uri()
    cluster = Cluster(store_url, tmp_path, partitions=2, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    plane = ControlPlane(tmp_path, store_url, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    try:
        plane.start_daemon()  # loads the code location while the nodes start Spark
        cluster.start_node(1)
        cluster.start_node(2)
        cluster.wait_alive(1, 2, timeout=180)
        cluster.place({0: 1, 1: 1})
        cluster.produce(400)
        cluster.wait_committed(120)
        plane.wait_sensors_ticking()

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
        with plane.instance() as instance:
            runs = plane.runs()
            assert {r.job_name for r in runs} == {"failover_partition"}, "no observation (or other) runs"
            for run in runs:
                record = instance.get_run_record_by_id(run.run_id)
                assert record is not None and record.start_time is not None
                assert record.start_time > active_at - 0.5, "the sensor, not the run, made the partition active"
                assert run.tags["laminar/failed_node"] == "1" and run.tags["laminar/to_node"] == "2"
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

        # Nothing lost, nothing twice, across the failover.
        cluster.produce(200)
        cluster.wait_committed(120)
        audits = cluster.verify()
        assert audits and all(a.ok for a in audits), audits
    finally:
        plane.stop()
        cluster.shutdown()
