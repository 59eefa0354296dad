"""Scraping /metrics of real node processes and of the control plane while a load runs and a partition moves."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from laminar_dev.localcluster import wait_until
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ops.ledger_metrics import serve_control_plane_metrics
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import open_store
from laminar_orchestration.store.metering import PROCESS_METER
from tests.processes import free_port, scrape

pytestmark = pytest.mark.processes


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[str, dict[int, int]]]:
    """Two Spark-less node processes on a fresh store, each serving /metrics: (store URL, node -> port)."""
    url = (tmp_path / "store").as_uri()
    Ledger(open_store(url, create=True)).init_cluster(2)
    ports = {1: free_port(), 2: free_port()}
    procs = []
    for n, port in ports.items():
        with open(tmp_path / f"node{n}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "laminar_dev.arrownode",
                        "--store",
                        url,
                        "--node-id",
                        str(n),
                        "--metrics-port",
                        str(port),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        yield url, ports
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(30)


def test_metrics_show_lag_commits_batch_latency_and_a_migrations_duration(nodes: tuple[str, dict[int, int]]) -> None:
    url, ports = nodes
    store = open_store(url)
    ledger = Ledger(store)
    wait_until(lambda: {v.record.node for v in ledger.members.nodes() if v.alive} == {1, 2}, 60, "both nodes alive")
    coordinator = MigrationCoordinator(ledger)
    for p in (0, 1):
        coordinator.run(PartitionId(p), NodeId(1))
    control = serve_control_plane_metrics(0, lambda: ledger, lambda: dict(PROCESS_METER.snapshot().by_method))
    source = SourceLog(store, partitions=2)
    manifests = ManifestReader(store)

    def load(seed: int) -> None:
        for p, table in generate_events(400, 20, seed, 2).items():
            source.append(p, table)

    def caught_up() -> bool:
        for p in (0, 1):
            current = manifests.current(PartitionId(p))
            if (current.manifest.source_offset if current else 0) < source.end_offset(p):
                return False
        return True

    try:
        load(1)
        wait_until(caught_up, 60, "the first load committed")
        coordinator.run(PartitionId(0), NodeId(2))  # graceful: node 1 -> node 2
        load(2)
        wait_until(caught_up, 60, "the second load committed")

        node1 = scrape(f"http://127.0.0.1:{ports[1]}/metrics")
        node2 = scrape(f"http://127.0.0.1:{ports[2]}/metrics")
        p0_on_2 = (("node", "2"), ("partition", "0"))
        p1_on_1 = (("node", "1"), ("partition", "1"))
        # Caught up: no lag, everything produced committed, by the owner at its epoch.
        assert node2[("laminar_partition_lag_events", p0_on_2)] == 0
        assert node2[("laminar_partition_lag_seconds", p0_on_2)] == 0
        assert node2[("laminar_partition_committed_events_total", p0_on_2)] == source.end_offset(0)
        assert node1[("laminar_partition_committed_events_total", p1_on_1)] == source.end_offset(1)
        assert node2[("laminar_partition_epoch", p0_on_2)] == ledger.ownership(PartitionId(0)).epoch  # type: ignore[union-attr]
        assert node2[("laminar_partition_commits_total", p0_on_2)] >= 1
        assert node2[("laminar_batch_duration_seconds_count", p0_on_2)] >= 1
        assert node1[("laminar_commit_duration_seconds_count", p1_on_1)] >= 1
        # Node 1 no longer runs partition 0.
        assert ("laminar_partition_epoch", (("node", "1"), ("partition", "0"))) not in node1
        assert node1[("laminar_store_requests_total", (("method", "PUT"),))] > 0

        plane = scrape(control.url)
        graceful = (("kind", "graceful"), ("outcome", "active"))
        assert plane[("laminar_migration_duration_seconds_count", graceful)] == 1
        assert plane[("laminar_migration_duration_seconds_sum", graceful)] > 0
        assert plane[("laminar_fences_total", (("kind", "placement"),))] == 2
        assert plane[("laminar_partition_owner_node", (("partition", "0"),))] == 2
        assert plane[("laminar_partition_owner_alive", (("partition", "0"),))] == 1
    finally:
        control.close()
