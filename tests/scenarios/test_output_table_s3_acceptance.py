"""On the S3-protocol server, with node processes keeping the table: after a graceful move and a
kill -9 failover, the table read with `deltalake` alone (its own storage options, no laminar code)
holds exactly the events produced, each batch once.

Nodes are the real node runtime with a pyarrow fold instead of Spark (`laminar_dev.chaos.ArrowNode`),
each with its `TableCommitter` every 0.5 s, as `laminar node run` runs them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from laminar_dev.localcluster import Cluster, NodeProcess, wait_until
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.tasks import MigrationPhase
from laminar_orchestration.table import audit_table, table_location, table_status

pytestmark = [pytest.mark.processes, pytest.mark.slow]

HEARTBEAT_TIMEOUT_S = 3.0
#: A node process: `laminar node run` without Spark, polling gently (one S3 server answering one request at a time).
NODE = """
import sys
from laminar_dev.chaos.arrow import ArrowNode
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.store import open_store
from laminar_orchestration.table import TableCommitter

url, node = sys.argv[1], int(sys.argv[2])
config = NodeConfig(
    store_url=url, node_id=node, heartbeat_timeout_s=3.0, heartbeat_interval_s=0.5, refresh_interval_s=0.5,
    checkpoint_every_batches=3, reconcile_interval_s=0.25, idle_poll_s=0.25, standby_poll_s=0.25,
    migration_poll_s=0.05, table_sync_interval_s=0.5,
)
ArrowNode(config, output_table=TableCommitter(open_store(url))).run()
"""


class ArrowCluster(Cluster):
    """`localcluster.Cluster` with Spark-less node processes that keep the output table."""

    def start_node(self, node_id: int, *extra: str) -> NodeProcess:
        log_path = self.workdir / f"node{node_id}-{int(time.time() * 1000)}.log"
        with open(log_path, "wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-c", NODE, self.store_url, str(node_id)],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        node = NodeProcess(node_id, proc, log_path)
        self.nodes[node_id] = node
        return node


def _plain_deltalake(uri: str) -> DeltaTable:
    """The table as a downstream reader opens it: endpoint and credentials from the environment, by hand."""
    options = {
        "AWS_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"],
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": os.environ.get("AWS_REGION", "us-east-1"),
        "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"],
    }
    return DeltaTable(uri, storage_options=options)


def test_after_a_move_and_a_failover_the_table_holds_exactly_the_events_produced(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    url = f"s3://{s3_bucket}/acceptance"
    cluster = ArrowCluster(url, tmp_path, partitions=2, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    try:
        for n in (1, 2, 3):
            cluster.start_node(n)
        cluster.wait_alive(1, 2, 3, timeout=120)
        cluster.place({0: 1, 1: 2})
        cluster.produce(3_000)
        cluster.wait_committed()

        # A graceful move with events in flight.
        cluster.produce(3_000)
        moved = cluster.coordinator.run(PartitionId(0), NodeId(3))
        assert moved.phase == MigrationPhase.ACTIVE and cluster.owner(0) == 3
        cluster.produce(1_000)
        cluster.wait_committed()

        # kill -9 of partition 1's owner mid-load, then a forced move to a survivor.
        cluster.produce(3_000)
        cluster.kill(2)
        cluster.wait_dead(2, timeout=HEARTBEAT_TIMEOUT_S + 15)
        failed_over = cluster.coordinator.run(PartitionId(1), NodeId(1), forced=True)
        assert failed_over.phase == MigrationPhase.ACTIVE and cluster.owner(1) == 1
        cluster.produce(1_000)
        cluster.wait_committed()
        wait_until(lambda: table_status(cluster.store).lag_batches == 0, 60, "the nodes to catch the table up")
    finally:
        cluster.shutdown()

    table = _plain_deltalake(table_location(cluster.store).uri)
    rows = table.to_pyarrow_table(columns=["partition", "batch_seq", "key", "batch_count", "epoch"])
    partitions, seqs, keys = (rows[c].to_pylist() for c in ("partition", "batch_seq", "key"))
    batches = Counter(zip(partitions, seqs, keys, strict=True))
    assert max(batches.values()) == 1, "a batch's row landed twice"
    counts: Counter[str] = Counter()
    for key, n in zip(keys, rows["batch_count"].to_pylist(), strict=True):
        counts[key] += n
    assert dict(counts) == cluster.expected_counts()
    # Both owners of each partition wrote to the table: the move's and the failover's epochs are there.
    epochs = Counter(zip(partitions, rows["epoch"].to_pylist(), strict=True))
    assert {e for p, e in epochs if p == 0} == {1, 2} and {e for p, e in epochs if p == 1} == {1, 2}
    audit = audit_table(cluster.store)
    assert audit.ok and audit.exists, audit.summary_lines()
