"""A rolling restart with nobody typing a command: three node processes, four partitions, a producer at a
steady rate; each node in turn gets SIGTERM, moves its partitions away as planned migrations (its
/healthz says "not ready" meanwhile), exits, starts again and takes its share back. At the end every
event is committed exactly once (`laminar verify`) and the output table, read with `deltalake` alone,
holds exactly the events produced. On the local store and on the S3-protocol server; the nodes run with
`laminar node run`'s timing. An S3-protocol server that runs one request at a time answers a handoff's chain
of conditional writes in seconds under the suite's load, not the local store's tenths: a leave there takes
6-12 s alone and up to its whole 25 s deadline beside the suite's other scenarios, so each node is held to
what a pod's grace period promises: exit within the deadline and the 10 s after it.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from laminar_dev.localcluster import wait_until
from laminar_dev.rolling import EXIT_AFTER_DEADLINE_S, LEAVE_DEADLINE_S, RollingCluster, rolling_restart
from laminar_orchestration.table import table_location, table_status
from tests.processes import free_port, laminar

pytestmark = [pytest.mark.processes, pytest.mark.slow(seconds=120)]

NODES = [1, 2, 3]


def _deltalake_alone(uri: str) -> DeltaTable:
    """The table as a downstream reader opens it: for S3, endpoint and credentials from the environment by hand."""
    if not uri.startswith("s3://"):
        return DeltaTable(uri)
    options = {
        "AWS_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"],
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": os.environ.get("AWS_REGION", "us-east-1"),
        "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"],
    }
    return DeltaTable(uri, storage_options=options)


@pytest.mark.parametrize("store_url", ["local", "s3"], indirect=True)
def test_a_rolling_restart_moves_every_partition_gracefully_and_loses_nothing(store_url: str, tmp_path: Path) -> None:
    cluster = RollingCluster(store_url, tmp_path, partitions=4, ports={n: free_port() for n in NODES})
    for n in NODES:
        cluster.start_node(n)
    try:
        report = rolling_restart(cluster, NODES)
        wait_until(lambda: table_status(cluster.store).lag_batches == 0, 60, "the nodes to catch the table up")
    finally:
        cluster.shutdown()

    for turn in report.restarts:
        assert turn.exit_code == 0, f"node {turn.node} exited with {turn.exit_code}"
        assert turn.owned, f"node {turn.node} owned nothing when it was stopped"
        # Planned moves, not a failure timeout nor a release: each partition went Active elsewhere.
        assert set(turn.left_by.values()) == {"graceful"}, turn.left_by
        took = f"node {turn.node} took {turn.leave_s:.1f}s to leave"
        assert turn.leave_s < LEAVE_DEADLINE_S + EXIT_AFTER_DEADLINE_S, took
        assert turn.not_ready_while_leaving, f"node {turn.node}'s /healthz never said 503 while it left"
    gaps, planned = report.gaps, report.planned_gaps
    assert gaps, "no change of owner was recorded"
    assert len(planned) == 4, f"each planned move (the yardstick) is a change of owner: {report.handoffs}"
    kinds = report.gaps_by_kind(cluster.ledger)
    print(
        f"rolling restart ({store_url.split(':')[0]}): {len(gaps)} handoffs, unavailability "
        f"p50 {gaps[len(gaps) // 2]:.2f}s max {gaps[-1]:.2f}s (leaves {kinds['leave']}, returns {kinds['return']}; "
        f"planned moves, same run: {planned}); leaves "
        + ", ".join(f"node {t.node} {t.leave_s:.1f}s" for t in report.restarts)
    )

    # Every batch's manifest entry and output read back: thousands of GETs of an S3 server answering one at a time.
    verified = laminar("verify", "--store", store_url, timeout=300)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    rows = _deltalake_alone(table_location(cluster.store).uri).to_pyarrow_table(
        columns=["partition", "batch_seq", "key", "batch_count"]
    )
    partitions, seqs, keys = (rows[c].to_pylist() for c in ("partition", "batch_seq", "key"))
    assert max(Counter(zip(partitions, seqs, keys, strict=True)).values()) == 1, "a batch's row landed twice"
    counts: Counter[str] = Counter()
    for key, n in zip(keys, rows["batch_count"].to_pylist(), strict=True):
        counts[key] += n
    assert dict(counts) == cluster.expected_counts()
