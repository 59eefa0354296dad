"""A rolling restart's unavailability: how long each partition goes without a commit while its nodes
restart one after the other, against the planned move's.

    python -m benchmarks.bench_rolling_restart [--quick] [--backends local,s3] [--rounds N]

Three node processes, four partitions, a producer at 200 events/s; each node in turn gets SIGTERM,
moves its partitions away as planned migrations (`control.leave`), exits, starts again and takes its
share back, with no command from anyone (`laminar_dev.rolling`). A partition's unavailability at a
change of owner is its old owner's last data commit -> its new owner's first (the manifests'
``committed_at``), as `bench_baseline` measures a planned move; every change of owner of the run
counts, the leaves' and the returns'. Printed: p50 and max over those, per backend, against the same
figures of planned moves (`laminar migrate`, each partition twice: 8 moves, about as many as the
restarts' 7 handoffs, so the two largest are drawn from samples of one size) made in the same cluster, under the
same load, just before the restarts. Nodes are the real node runtime
with a pyarrow fold instead of Spark (the leave and the handoff are what is measured, not Spark).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks.common import Row, TableReport, percentile, progress, start_s3_server, verdict
from laminar_dev.rolling import RollingCluster, rolling_restart
from laminar_orchestration.ops.verify import audit_store
from laminar_orchestration.store import open_store

#: bench_baseline --quick: laminar's ~1 MB planned move, old owner's last output -> new owner's first.
BASELINE_PLANNED_MOVE_S = 0.21
#: bench_migration's target for a graceful move to a node without a warm copy.
PLANNED_MOVE_TARGET_S = 1.0
NODES = [1, 2, 3]


def _free_ports(n: int) -> list[int]:
    import socket

    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
    return ports


def one_run(store_url: str, workdir: Path) -> tuple[list[float], list[float], list[str], bool]:
    """One rolling restart: the restarts' handoff gaps, the planned moves' (same cluster, just before),
    a line per node's leave, whether the audit passed."""
    if store_url.startswith("file:"):
        open_store(store_url, create=True)
    cluster = RollingCluster(store_url, workdir, partitions=4, ports=dict(zip(NODES, _free_ports(3), strict=True)))
    for n in NODES:
        cluster.start_node(n)
    try:
        # Each partition moved twice: 8 planned moves against the restarts' 7 handoffs, so their largest
        # is held against a largest of as many (a largest of 4 loses to one of 7 from the same spread 7 times in 11).
        report = rolling_restart(cluster, NODES, planned_rounds=2)
    finally:
        cluster.shutdown()
    audits = audit_store(cluster.store)
    exact = all(a.ok for a in audits)
    named = report.restart_handoffs(cluster.ledger)  # each handoff's grant read once, for both lines below
    kinds = {kind: sorted(h.gap_s for h, k, _ in named if k == kind) for kind in ("leave", "return")}
    lines = (
        [
            "handoffs: leaves "
            + ", ".join(f"{g:.2f}" for g in kinds["leave"])
            + " s; returns "
            + ", ".join(f"{g:.2f}" for g in kinds["return"])
            + " s; planned moves before them "
            + ", ".join(f"{g:.2f}" for g in report.planned_gaps)
            + " s",
        ]
        + [
            "handoffs, by partition: "
            + ", ".join(f"p{h.partition} {kind} {move} {h.gap_s:.2f} s" for h, kind, move in named)
        ]
        + [
            f"node {t.node}: owned {t.owned}, left in {t.leave_s:.1f}s ({', '.join(sorted(set(t.left_by.values())))}), "
            f"ready again {t.ready_s:.1f}s after its start, owned a partition {t.took_back_s:.1f}s after it"
            for t in report.restarts
        ]
    )
    return report.gaps, report.planned_gaps, lines, exact


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="one round per backend (the default is 3)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--backends", default="local,s3")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    started, load_before = time.monotonic(), os.getloadavg()
    report = TableReport()
    for backend in args.backends.split(","):
        gaps: list[float] = []
        planned: list[float] = []
        for r in range(rounds):
            progress(f"{backend}: rolling restart {r + 1}/{rounds}")
            with tempfile.TemporaryDirectory(prefix="laminar-bench-rolling-") as tmp:
                if backend == "s3":
                    with start_s3_server() as endpoint:
                        import boto3

                        # The node processes and this one reach the server through the environment.
                        os.environ["AWS_ENDPOINT_URL"] = endpoint
                        bucket = f"rolling-{r}-{int(time.time())}"
                        boto3.client("s3").create_bucket(Bucket=bucket)
                        run_gaps, run_planned, lines, exact = one_run(f"s3://{bucket}/laminar", Path(tmp))
                else:
                    run_gaps, run_planned, lines, exact = one_run((Path(tmp) / "store").as_uri(), Path(tmp))
            gaps += run_gaps
            planned += run_planned
            for line in lines:
                report.note(f"{backend} round {r + 1}: {line}")
            report.note(f"{backend} round {r + 1}: laminar verify {'exactly once' if exact else 'FAILED'}")
        if not gaps or not planned:
            report.rows.append(Row("rolling restart unavailability", backend, "no handoff", verdict="MISSED"))
            continue
        # The yardstick: the same cluster's planned moves just before the restarts, under the same load.
        for name, ours, theirs in (
            ("p50", percentile(gaps, 50), percentile(planned, 50)),
            ("max", max(gaps), max(planned)),
        ):
            report.rows.append(
                Row(
                    f"rolling restart unavailability {name} ({len(gaps)} handoffs)",
                    backend,
                    f"{ours:.2f} s",
                    f"<= a planned move's {name}, same run ({len(planned)} moves): {theirs:.2f} s",
                    verdict(ours, theirs),
                )
            )
    report.note(
        f"for scale: bench_baseline --quick's ~1 MB planned move on Spark nodes ({BASELINE_PLANNED_MOVE_S:.2f} s), "
        f"bench_migration's target for a move to a node without a warm copy ({PLANNED_MOVE_TARGET_S:.1f} s)"
    )
    report.publish(
        "bench_rolling_restart", args.quick, load_before, time.monotonic() - started, "bench_rolling_restart.txt"
    )


if __name__ == "__main__":
    main()
