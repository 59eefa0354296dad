"""The output table through Dagster, in process on an ephemeral instance: the `stream_output` asset
observes the table (its version, rows and each partition's lag) and the `table_maintenance` job
compacts it; the job's schedule ships stopped."""

from __future__ import annotations

from typing import Any

import pytest
from dagster import AssetKey, DagsterInstance
from dagster._core.definitions.observe import observe  # the in-process observation of a source asset

from assets.stream_output import stream_output
from jobs.table_maintenance import table_maintenance, table_maintenance_schedule
from laminar_orchestration.store import LocalObjectStore
from laminar_orchestration.table import TableCommitter
from resources import LaminarResource
from tests.table.cluster import Cluster


def _observed(instance: DagsterInstance) -> dict[str, Any]:
    """The newest observation of `stream_output`: its metadata's values by name."""
    record = instance.fetch_observations(AssetKey("stream_output"), limit=1).records[0]
    assert record.asset_observation is not None
    return {name: value.value for name, value in record.asset_observation.metadata.items()}


@pytest.mark.dagster
def test_the_asset_observes_the_table_and_the_maintenance_job_compacts_it(local_store: LocalObjectStore) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(400)
    tokens = [cluster.acquire(p, 1) for p in range(cluster.partitions)]
    committer = TableCommitter(local_store)
    for _ in range(2):
        for token in tokens:
            cluster.commit_batches(token, max_batches=1)
        committer.sync([0, 1])
    cluster.commit_batches(tokens[1])  # partition 1 is behind the table
    laminar = LaminarResource(store_url=local_store.url)
    instance = DagsterInstance.ephemeral()

    observed = observe([stream_output], instance=instance, resources={"laminar": laminar})
    assert observed.success
    meta = _observed(instance)
    assert meta["table_version"] == 2 and meta["rows"] > 0  # created, then two syncs
    assert meta["lag_batches"] > 0
    rows = {r.data["partition"]: r.data for r in meta["partitions"].records}
    assert rows[0]["lag_batches"] == 0 and rows[1]["lag_batches"] > 0 and rows[0]["landed_seq"] > 1

    result = table_maintenance.execute_in_process(
        run_config={"ops": {"maintain_output_table": {"config": {"retention_hours": 0}}}},
        instance=instance,
        resources={"laminar": laminar},
    )
    assert result.success
    assert _observed(instance)["table_version"] > 2
    assert table_maintenance_schedule.default_status.value == "STOPPED"
