"""The ``pyspark`` resource runs the partitions: a ``worker_node`` run and ``committed_state`` on real Spark.

A worker node runs as a Dagster run (``dagster job execute``, recorded in a
real instance under a temporary ``DAGSTER_HOME``), processes its partitions on
the resource's SparkSession, and is stopped the way Dagster terminates a run
(an interrupt to the run's process): it drains, releases and leaves. The output
table it kept, read with `deltalake` alone, holds every event once. Then
``committed_state`` partitions are materialized on Spark from the committed
checkpoints, with the same resource.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, DagsterRunStatus, materialize
from deltalake import DeltaTable

from assets import LAMINAR_PARTITIONS, committed_state
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.records import NodeStatus, PartitionStatus
from laminar_orchestration.store import open_store
from laminar_orchestration.table import table_location
from resources import LaminarResource, spark_resource_from_env

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.processes, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).with_name("dagster")
EVENTS = 400
KEYS = 20


def wait_until(what: str, check: object, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run's process exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def test_worker_node_run_keeps_the_table_and_committed_state_use_the_pyspark_resource(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_url = (tmp_path / "store").as_uri()
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "LAMINAR_STORE": store_url,
        "LAMINAR_SPARK_MASTER": "local[1]",
        "PYTHONPATH": str(REPO),
    }
    cli = [sys.executable, "-m", "laminar_orchestration.cli"]
    subprocess.run([*cli, "init", "--partitions", "2", "--store", store_url], check=True, env=env, cwd=tmp_path)
    produce = [*cli, "produce", "--count", str(EVENTS), "--keys", str(KEYS), "--store", store_url]
    subprocess.run(produce, check=True, env=env, cwd=tmp_path, capture_output=True)
    (tmp_path / "node.yaml").write_text(
        "ops:\n  run_node:\n    config:\n      node_id: 1\n      heartbeat_timeout_s: 30\n"
    )
    log = (tmp_path / "run.log").open("wb")
    run = subprocess.Popen(
        [
            str(DAGSTER),
            "job",
            "execute",
            "-f",
            "definitions.py",
            "-j",
            "worker_node",
            "-c",
            str(tmp_path / "node.yaml"),
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        ledger = Ledger(open_store(store_url))
        wait_until("node 1 to join", lambda: any(v.alive for v in ledger.members.nodes()), 180, run)
        coordinator = MigrationCoordinator(ledger)
        for p in (0, 1):  # place both partitions on the node, as `laminar rebalance` would
            coordinator.run(PartitionId(p), NodeId(1), forced=True)
        reader = ManifestReader(ledger.store)
        total = 0

        def all_committed() -> bool:
            nonlocal total
            offsets = [reader.current(PartitionId(p)) for p in (0, 1)]
            total = sum(m.manifest.events_applied for m in offsets if m is not None)
            return total == EVENTS

        wait_until(f"{EVENTS} events committed", all_committed, 120, run)

        # Terminate the run the way Dagster does: an interrupt to the run's process.
        run.send_signal(signal.SIGINT)
        assert run.wait(120) is not None
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        log.close()
    output = (tmp_path / "run.log").read_text(errors="replace")
    assert "starting on the pyspark resource's session (local[1], app laminar-dagster)" in output, output[-3000:]
    assert "draining and releasing its partitions" in output, output[-3000:]
    # Drained and released after the last commit; the node left the cluster.
    for p in (0, 1):
        own = ledger.ownership(PartitionId(p))
        assert own is not None and (own.owner, own.status) == (1, PartitionStatus.RELEASED)
    record = ledger.members.node(NodeId(1))
    assert record is not None and record.status == NodeStatus.LEFT
    with DagsterInstance.from_config(str(home)) as instance:
        (stored,) = instance.get_runs()
        assert stored.job_name == "worker_node" and stored.tags["laminar/node"] == "1"
        assert stored.status in (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE), stored.status

    # The run's node keeps the output table as `laminar node run`'s does (flushed as it drained):
    # read with deltalake alone, every batch once and each key's events adding up to what was produced.
    rows = DeltaTable(table_location(open_store(store_url)).uri).to_pyarrow_table().to_pylist()
    batches = [(r["partition"], r["batch_seq"], r["key"]) for r in rows]
    assert len(batches) == len(set(batches)), "a batch's row landed twice"
    counts: Counter[str] = Counter()
    for r in rows:
        counts[r["key"]] += r["batch_count"]
    produced = generate_events(EVENTS, KEYS, 0, 2)  # `laminar produce --count`'s default seed
    assert counts == Counter(k for table in produced.values() for k in table["key"].to_pylist())

    # committed_state on the same resource: one Dagster partition per stream partition.
    monkeypatch.setenv("LAMINAR_SPARK_MASTER", "local[1]")
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(LAMINAR_PARTITIONS.name or "", ["0", "1"])
    resources = {"laminar": LaminarResource(store_url=store_url), "pyspark": spark_resource_from_env()}
    out_dir = tmp_path / "assets"
    events = 0
    for key in ("0", "1"):
        result = materialize(
            [committed_state],
            partition_key=key,
            instance=instance,
            resources=resources,
            run_config={"ops": {"committed_state": {"config": {"output_dir": str(out_dir)}}}},
        )
        assert result.success
        (mat,) = result.asset_materializations_for_node("committed_state")
        meta = mat.metadata
        events += int(meta["events"].value)  # type: ignore[arg-type]
        assert meta["committed_offset"].value == reader.current(PartitionId(int(key))).manifest.source_offset  # type: ignore[union-attr]
        table = pq.read_table(out_dir / "committed_state" / f"partition={int(key):05d}")
        assert table.num_rows == meta["keys"].value and sum(table.column("count").to_pylist()) == meta["events"].value
    assert events == EVENTS
