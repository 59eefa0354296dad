"""The Dagster code location: it loads as the webserver loads it, and its jobs, config and resources.

Job runs here use a real ledger in a temporary local store; nodes exist only
as ledger records, so runs that need a node's report end by timeout, which is
what the failure-path tests want. End-to-end runs against live nodes belong
to the runtime's tests.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    Definitions,
    EnvVar,
    Failure,
    FloatMetadataValue,
    OpExecutionContext,
    in_process_executor,
)
from dagster._config import process_config
from dagster_aws.s3 import S3Resource
from dagster_pyspark import PySparkResource

from assets import checkpoint_observation, ownership_observation
from jobs import GRACEFUL_OPS, MIGRATION_ID_TAG, RISING_OPS, failover_partition, migrate_partition, rebalance
from jobs.migration import _HANDLES, run_handle
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.dataplane.engine import spark_conf
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import OutputCommitter
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.keys import desired_state_key, grant_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import DeltaRef, SnapshotFile, SnapshotRef, artifact_ref
from laminar_orchestration.protocol.tasks import GRACEFUL_PHASES, MigrationPhase
from laminar_orchestration.sizes import human_size
from laminar_orchestration.store.retry import RetryingStore
from laminar_orchestration.store.s3 import S3ObjectStore
from resources import LaminarResource, build_resources, laminar_resource_from_env
from tests.ledgers import make_alive
from tests.processes import run_text

P, N = PartitionId, NodeId
REPO = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).with_name("dagster")


def run(job: Any, laminar: LaminarResource, run_config: dict[str, Any], instance: DagsterInstance | None = None) -> Any:
    return job.execute_in_process(
        run_config=run_config,
        instance=instance or DagsterInstance.ephemeral(),
        resources={"laminar": laminar},
        raise_on_error=False,
    )


def step_events(result: Any, kind: DagsterEventType) -> dict[str, Any]:
    return {e.step_key: e for e in result.all_events if e.event_type == kind}


# --- loading --------------------------------------------------------------------------------


@pytest.mark.dagster
@pytest.mark.processes
def test_workspace_loads_like_the_webserver(tmp_path: Path) -> None:
    """`dagster definitions validate` through a code server (gRPC), as `dagster dev` loads it."""
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "LAMINAR_STORE": (tmp_path / "store").as_uri()}
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    proc = run_text(
        [str(DAGSTER), "definitions", "validate", "-w", "workspace.yaml", "--load-with-grpc"], cwd=REPO, env=env
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Validation successful for code location laminar" in output
    assert not (tmp_path / "store").exists(), "loading definitions must not touch the store"


def test_definitions_hold_every_piece() -> None:
    import definitions

    defs: Definitions = definitions.defs
    Definitions.validate_loadable(defs)
    assert {j.name for j in defs.resolve_all_job_defs()} >= {
        "migrate_partition",
        "failover_partition",
        "rebalance",
        "worker_node",
    }
    repository = defs.get_repository_def()
    assert {s.name for s in repository.sensor_defs} == {
        "node_failure_sensor",
        "migration_retry_sensor",
        "laminar_observation_sensor",
    }
    assert {s.name for s in repository.schedule_defs} == {"rebalance_schedule", "table_maintenance_schedule"}
    keys = defs.resolve_asset_graph().get_all_asset_keys()
    assert {
        AssetKey("ownership_map"),
        AssetKey("assignment_plan"),
        AssetKey("checkpoint_manifests"),
        AssetKey("committed_state"),
        AssetKey("stream_output"),
    } <= keys
    # The ledger assets are observed by the sensors, never by a job of their own.
    assert not any(j.name.startswith("observe") for j in defs.resolve_all_job_defs())
    # Observation-only assets: the UI offers Observe (they can be observed), never Materialize.
    graph = defs.resolve_asset_graph()
    for key in ("ownership_map", "assignment_plan"):
        node = graph.get(AssetKey(key))
        assert node.is_observable and not node.is_materializable, key
    assert graph.get(AssetKey("ownership_map")).check_keys == {
        AssetCheckKey(AssetKey("ownership_map"), "partitions_on_live_nodes")
    }


# --- jobs -------------------------------------------------------------------------------------


def op_chain(job: Any) -> list[str]:
    """The ops of a linear job, first to last, following each op's single upstream."""
    deps = job.graph.dependency_structure
    upstream = {
        node.name: [o.node_name for outs in deps.input_to_upstream_outputs_for_node(node.name).values() for o in outs]
        for node in job.graph.nodes
    }
    assert all(len(ups) <= 1 for ups in upstream.values()), upstream
    chain = [name for name, ups in upstream.items() if not ups]
    assert len(chain) == 1, f"one first op expected: {chain}"
    while True:
        nxt = [name for name, ups in upstream.items() if ups == [chain[-1]]]
        if not nxt:
            return chain
        assert len(nxt) == 1
        chain.append(nxt[0])


def test_jobs_have_the_protocol_phases_in_order() -> None:
    assert op_chain(migrate_partition) == [
        "plan",
        "drain",
        "checkpoint",
        "upload",
        "release",
        "download",
        "restore",
        "seek",
        "activate",
    ]
    assert op_chain(failover_partition) == ["fence", "download", "restore", "seek", "activate"]
    # Every phase of a graceful move after Planned (the plan op's), in order; tests/protocol/test_tasks.py
    # pins the sequence itself.
    assert list(GRACEFUL_OPS.values()) == list(GRACEFUL_PHASES[1:])
    assert RISING_OPS == ("download", "restore", "seek", "activate")
    assert {n.name for n in rebalance.graph.nodes} == {"plan_rebalance", "migrate", "summarize_rebalance"}


def config_fields(job: Any) -> dict[str, Any]:
    """The top-level fields of a job's run config, as the Launchpad shows them."""
    return dict(job.run_config_schema.config_type.fields)


def undescribed(fields: dict[str, Any], path: str = "") -> list[str]:
    """The config fields (nested ones too) the Launchpad would show without a description."""
    missing = []
    for name, field in fields.items():
        if not (field.description or "").strip():
            missing.append(f"{path}{name}")
        inner = getattr(field.config_type, "fields", None)
        if isinstance(inner, dict):
            missing += undescribed(inner, f"{path}{name}.")
    return missing


def test_launchpad_config_and_executor() -> None:
    fields = config_fields(migrate_partition)
    # The Launchpad lists fields by name: the required ones come first, then the optional ones.
    names = sorted(fields)
    assert names == ["partition", "to_node", "tuning"]
    assert fields["partition"].is_required and not fields["to_node"].is_required
    assert not fields["tuning"].is_required
    assert set(fields["tuning"].config_type.fields) == {
        "migration_timeout_s",
        "release_wait_timeout_s",
        "checkpoint_transfer_timeout_s",
        "max_retries",
        "retry_delay_s",
    }
    # An empty config's error suggests only what is valid: Dagster makes up 0 for every required Int,
    # and 0 is no node (a required `to_node` would read `to_node: 0`).
    empty = process_config(migrate_partition.run_config_schema.config_type, {})
    assert not empty.success and empty.errors is not None
    message = " ".join(e.message for e in empty.errors)
    assert "'partition': 0" in message and "to_node" not in message, message
    fields = config_fields(failover_partition)
    assert fields["partition"].is_required and not fields["to_node"].is_required
    fields = config_fields(rebalance)
    assert {"dry_run", "max_concurrent_migrations", "weights", "tuning"} <= set(fields)
    for job in (migrate_partition, failover_partition, rebalance):
        assert undescribed(config_fields(job)) == [], job.name
    assert fields["max_concurrent_migrations"].default_value == 2
    for job in (migrate_partition, failover_partition, rebalance):
        assert job.executor_def is in_process_executor


@pytest.mark.dagster
@pytest.mark.usefixtures("partition_0_on_node_1")
def test_a_failing_phase_fails_its_op_with_a_clear_message_and_fails_the_migration(
    ledger: Ledger, laminar: LaminarResource
) -> None:
    instance = DagsterInstance.ephemeral()
    result = run(
        migrate_partition,
        laminar,
        {"partition": 0, "to_node": 2, "tuning": {"release_wait_timeout_s": 0.05}},
        instance,
    )
    assert not result.success
    assert set(step_events(result, DagsterEventType.STEP_SUCCESS)) == {"plan"}
    planned = step_events(result, DagsterEventType.STEP_OUTPUT)["plan"]
    meta = planned.event_specific_data.metadata
    # Duration first, bytes (plan: the target's warm-up is a transfer) as a size and exactly, then the detail;
    # who/what/which epoch as run tags.
    assert list(meta)[:4] == ["duration_s", "bytes_moved", "size_moved", "detail"]
    assert isinstance(meta["duration_s"], FloatMetadataValue)
    assert meta["size_moved"].value == human_size(meta["bytes_moved"].value)
    assert "warm" in meta["detail"].value and "drain" in meta["detail"].value, meta["detail"]
    stored = instance.get_run_by_id(result.run_id)
    assert stored is not None
    migration_id = stored.tags[MIGRATION_ID_TAG]  # filterable in the UI
    assert {k: stored.tags[k] for k in ("laminar/partition", "laminar/from_node", "laminar/to_node")} == {
        "laminar/partition": "0",
        "laminar/from_node": "1",
        "laminar/to_node": "2",
    }
    assert (stored.tags["laminar/from_epoch"], stored.tags["laminar/to_epoch"]) == ("1", "2")
    # Only what a user filters runs by: the partition, the nodes, the epochs, the migration id (each once).
    assert {k for k in stored.tags if k.startswith("laminar/")} == {
        "laminar/partition",
        "laminar/migration_id",
        "laminar/from_node",
        "laminar/to_node",
        "laminar/from_epoch",
        "laminar/to_epoch",
    }
    failed = step_events(result, DagsterEventType.STEP_FAILURE)["drain"]
    user = failed.event_specific_data.user_failure_data
    assert user is not None
    assert user.description.startswith(f"migration {migration_id} failed at draining: MigrationTimeout")
    assert user.metadata["error_type"].value == "MigrationTimeout"
    assert user.metadata["migration_id"].value == migration_id
    assert set(step_events(result, DagsterEventType.STEP_START)) == {"plan", "drain"}
    # The record says Failed, so nodes stop and a retry plans afresh.
    task = ledger.store.get(desired_state_key(0))
    assert b'"phase":"failed"' in task.data and b'"failed_phase":"draining"' in task.data


@pytest.mark.dagster
@pytest.mark.usefixtures("partition_0_on_node_1")
def test_a_phase_op_rebuilds_the_migration_from_the_run_as_a_re_execution_would(
    ledger: Ledger, laminar: LaminarResource
) -> None:
    with DagsterInstance.ephemeral() as instance:
        limits = {"release_wait_timeout_s": 0.05, "migration_timeout_s": 20.0}
        result = run(migrate_partition, laminar, {"partition": 0, "to_node": 2, "tuning": limits}, instance)
        assert not result.success
        planned = _HANDLES.pop(result.run_id)  # what the plan op handed the phase ops in its process
        stored = instance.get_run_by_id(result.run_id)
        assert stored is not None
        # A re-execution runs in another process: only the run's tags and config say which migration.
        context = cast(OpExecutionContext, SimpleNamespace(run_id=result.run_id, instance=instance, run=stored))
        assert run_handle(context) == planned
        assert planned.migration_config().release_wait_timeout_s == 0.05
        # A run whose first op never tagged it names what is missing.
        bare = cast(OpExecutionContext, SimpleNamespace(run_id="none", instance=instance, run=stored.with_tags({})))
        with pytest.raises(Failure, match="no migration recorded"):
            run_handle(bare)


@pytest.mark.dagster
def test_nothing_to_do_skips_the_phases(ledger: Ledger, laminar: LaminarResource) -> None:
    ledger.members.register_node(N(1), heartbeat_timeout_s=60)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    result = run(migrate_partition, laminar, {"partition": 0, "to_node": 1})
    assert result.success
    assert len(step_events(result, DagsterEventType.STEP_SKIPPED)) == 8
    result = run(failover_partition, laminar, {"partition": 0})  # owner alive
    assert result.success
    assert len(step_events(result, DagsterEventType.STEP_SKIPPED)) == 4


@pytest.mark.dagster
def test_without_to_node_the_move_goes_to_the_least_loaded_other_live_node(
    ledger: Ledger, laminar: LaminarResource
) -> None:
    make_alive(ledger, 1, 2, 3)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.acquire(P(1), N(2), expected_epoch=0)
    # Node 3 holds nothing; the drain (node 1 never answers here) fails the run after the plan.
    result = run(migrate_partition, laminar, {"partition": 0, "tuning": {"release_wait_timeout_s": 0.05}})
    assert set(step_events(result, DagsterEventType.STEP_SUCCESS)) == {"plan"}
    assert result.dagster_run.tags["laminar/to_node"] == "3"


@pytest.mark.dagster
def test_without_to_node_and_no_other_live_node_the_plan_says_so(ledger: Ledger, laminar: LaminarResource) -> None:
    make_alive(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    result = run(migrate_partition, laminar, {"partition": 0})
    failure = step_events(result, DagsterEventType.STEP_FAILURE)["plan"].event_specific_data.user_failure_data
    assert failure.description == (
        "no live node to move partition 0 to (live: [1], owner: node 1): start a node or give to_node"
    )


@pytest.mark.dagster
def test_plan_errors_are_named(ledger: Ledger, laminar: LaminarResource) -> None:
    ledger.members.register_node(N(1), heartbeat_timeout_s=60)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    result = run(migrate_partition, laminar, {"partition": 0, "to_node": 5})
    failure = step_events(result, DagsterEventType.STEP_FAILURE)["plan"].event_specific_data.user_failure_data
    assert failure.description == (
        "cannot plan moving partition 0 to node 5: NoLiveNode: "
        "node 5 is not a live member: it cannot receive a partition"
    )


@pytest.mark.dagster
def test_a_migration_in_flight_elsewhere_is_named(ledger: Ledger, laminar: LaminarResource) -> None:
    for n in (1, 2, 3):
        ledger.members.register_node(N(n), heartbeat_timeout_s=60)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    task = MigrationCoordinator(ledger).plan(P(0), N(3))
    result = run(migrate_partition, laminar, {"partition": 0, "to_node": 2})
    failure = step_events(result, DagsterEventType.STEP_FAILURE)["plan"].event_specific_data.user_failure_data
    assert f"migration {task.migration_id} to node 3 is in flight (phase planned)" in failure.description


@pytest.mark.dagster
def test_failover_fences_then_waits_for_the_new_owner(ledger: Ledger, laminar: LaminarResource) -> None:
    ledger.members.register_node(N(1), heartbeat_timeout_s=0.05)
    ledger.members.register_node(N(2), heartbeat_timeout_s=60)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    time.sleep(0.1)
    result = run(failover_partition, laminar, {"partition": 0, "tuning": {"checkpoint_transfer_timeout_s": 0.05}})
    assert set(step_events(result, DagsterEventType.STEP_SUCCESS)) == {"fence"}
    meta = step_events(result, DagsterEventType.STEP_OUTPUT)["fence"].event_specific_data.metadata
    assert list(meta)[:2] == ["duration_s", "detail"]
    assert meta["detail"].value == "epoch 1 fenced: node 2 granted epoch 2", meta["detail"]
    tags = result.dagster_run.tags
    assert (tags["laminar/from_node"], tags["laminar/to_node"], tags["laminar/to_epoch"]) == ("1", "2", "2")
    assert "download" in step_events(result, DagsterEventType.STEP_FAILURE)
    own = ledger.ownership(P(0))
    assert own is not None and (own.owner, own.epoch) == (2, 2)
    assert ledger.store.head(grant_key(0, 2)) is not None


@pytest.mark.dagster
def test_rebalance_dry_run_only_shows_the_plan(ledger: Ledger, laminar: LaminarResource) -> None:
    make_alive(ledger, 1, 2)
    for p in range(4):
        ledger.acquire(P(p), N(1), expected_epoch=0)
    instance = DagsterInstance.ephemeral()
    result = rebalance.execute_in_process(
        run_config={"dry_run": True}, instance=instance, resources={"laminar": laminar}
    )
    assert result.success
    observations = instance.fetch_observations(AssetKey("assignment_plan"), limit=1).records
    meta = observations[0].asset_observation.metadata  # type: ignore[union-attr]
    assert meta["moves"].value == 2 and meta["dry_run"].value is True
    assert "| 2 | 1 | 2 |" in str(meta["plan"].value)
    assert all(ledger.ownership(P(p)).owner == 1 for p in range(4))  # type: ignore[union-attr]


@pytest.mark.dagster
def test_rebalance_fans_moves_out_in_waves_within_the_node_limit(ledger: Ledger, laminar: LaminarResource) -> None:
    make_alive(ledger, 1, 2)
    epoch_before = ledger.members.record().cluster_epoch
    # 4 unassigned partitions, 2 nodes, 1 migration per node at a time: 2 waves of 2 forced moves.
    # No node process reports the download, so each move ends by timeout after its grant.
    result = run(
        rebalance,
        laminar,
        {
            "max_concurrent_migrations": 1,
            "tuning": {"checkpoint_transfer_timeout_s": 0.05},
        },
    )
    assert not result.success
    outputs = [
        e for e in result.all_events if e.event_type == DagsterEventType.STEP_OUTPUT and e.step_key == "plan_rebalance"
    ]
    assert [e.event_specific_data.mapping_key for e in outputs] == ["wave_1", "wave_2"]
    failures = step_events(result, DagsterEventType.STEP_FAILURE)
    assert set(failures) == {"migrate[wave_1]", "migrate[wave_2]"}
    for step in failures.values():
        assert "2 of 2 move(s) failed" in step.event_specific_data.user_failure_data.description
    assert ledger.members.record().cluster_epoch == epoch_before + 1
    owners = [ledger.ownership(P(p)).owner for p in range(4)]  # type: ignore[union-attr]
    assert sorted(owners) == [1, 1, 2, 2]


def test_observations_record_the_ledger_as_asset_metadata(ledger: Ledger) -> None:
    ledger.members.register_node(N(1), heartbeat_timeout_s=60)
    token = ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.acquire(P(1), N(1), expected_epoch=0)
    publisher = ManifestPublisher(OutputCommitter(ledger.store), ledger.store)
    snapshot = SnapshotRef(
        source_offset=40, files=[SnapshotFile(name="000008.sst", ref=artifact_ref("checkpoints/00000/s.sst", b"state"))]
    )
    delta = DeltaRef(ref=artifact_ref("checkpoints/00000/d.parquet", b"delta!"), start_offset=40, end_offset=42, rows=2)
    publisher.publish(token, ManifestUpdate(source_offset=42, snapshot=snapshot, deltas=(delta,)))

    own = ownership_observation(ledger)
    rows = [r.data for r in own.metadata["ownership"].value.records]  # type: ignore[union-attr]
    assert rows[0] == {
        "partition": 0,
        "epoch": 1,
        "owner": 1,
        "status": "active",
        "owner_alive": True,
        "migration": "",
        "failure": "",
        "health": "ok",
    }
    assert rows[2]["health"] == "unassigned"
    assert own.metadata["unassigned"].value == 2
    assert list(own.metadata)[:3] == ["on_dead_nodes", "migrations_in_flight", "unassigned"]
    assert own.tags["dagster/data_version"]
    ckpt = checkpoint_observation(ledger, ManifestReader(ledger.store))
    entry: Any = ckpt.metadata["partition_00000"].value
    assert (entry["seq"], entry["fencing_token"], entry["source_offset"]) == (2, 1, 42)  # after the grant's seal
    assert (entry["state_offset"], entry["snapshot_files"], entry["snapshot_bytes"]) == (40, 1, 5)
    assert (entry["deltas"], entry["delta_bytes"]) == (1, 6)
    second: Any = ckpt.metadata["partition_00001"].value
    assert second["seq"] == 1  # only the seal of its grant


# --- resources ------------------------------------------------------------------------------


def test_resources_default_to_the_local_store_and_local_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAMINAR_STORE", raising=False)
    resources = build_resources()
    assert set(resources) == {"laminar", "pyspark"}
    assert resources["laminar"].store_url.endswith("/.laminar/store")
    spark = resources["pyspark"]
    assert isinstance(spark, PySparkResource)
    assert spark.spark_config["spark.master"] == "local[*]"
    assert spark.spark_config["spark.ui.enabled"] == "false"
    # One Spark configuration for `laminar node run` and the resource: only the app name differs.
    assert spark.spark_config == spark_conf("local[*]", "laminar-dagster")
    monkeypatch.setenv("LAMINAR_STORE", "file:///somewhere/else")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:9000")
    resource = laminar_resource_from_env()
    assert isinstance(resource.store_url, EnvVar) and resource.store_url.env_var_name == "LAMINAR_STORE"
    assert resource.s3 is not None and resource.s3.max_attempts == 0
    assert isinstance(resource.s3.endpoint_url, EnvVar)


def test_s3_store_is_built_from_the_dagster_aws_client(s3_endpoint: str, s3_bucket: str) -> None:
    resource = LaminarResource(
        store_url=f"s3://{s3_bucket}/laminar",
        s3=S3Resource(endpoint_url=s3_endpoint, region_name="us-east-1", max_attempts=0),
    )
    store = resource.store()
    assert isinstance(store, RetryingStore) and isinstance(store.inner, S3ObjectStore)
    assert store.url == f"s3://{s3_bucket}/laminar"
    client: Any = store.inner._client
    assert client.meta.config.retries["total_max_attempts"] == 1, "botocore must not retry on its own"
    resource.ledger().init_cluster(2)
    assert Ledger(store).cluster().partitions == 2


@pytest.mark.dagster
@pytest.mark.usefixtures("partition_0_on_node_1")
def test_the_ops_enforce_the_migrations_overall_deadline(ledger: Ledger, laminar: LaminarResource) -> None:
    # The per-phase limits keep their generous defaults: only the whole migration's deadline can end the drain wait.
    limits = {"migration_timeout_s": 0.5}
    started = time.monotonic()
    result = run(migrate_partition, laminar, {"partition": 0, "to_node": 2, "tuning": limits})
    assert time.monotonic() - started < 20
    failed = step_events(result, DagsterEventType.STEP_FAILURE)["drain"].event_specific_data.user_failure_data
    assert failed.metadata["error_type"].value == "MigrationTimeout"
    task = MigrationCoordinator(ledger).current(P(0))
    assert task is not None and task.phase == MigrationPhase.FAILED
    assert (task.error or "").startswith("deadline exceeded")
