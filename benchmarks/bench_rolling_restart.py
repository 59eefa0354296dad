"""A rolling restart's unavailability: how long each partition goes without a commit while its nodes
restart one after the other, against the planned move's.

    python -m benchmarks.bench_rolling_restart [--quick] [--backends local,s3] [--rounds N]

Three node processes, four partitions, a producer at 200 events/s; each node in turn gets SIGTERM,
moves its partitions away as planned migrations (`control.leave`), exits, starts again and takes its
share back, with no command from anyone (`laminar_dev.rolling`). A partition's unavailability at a
change of owner is its old owner's last data commit -> its new owner's first (the manifests'
``committed_at``), as `bench_baseline` measures a planned move; every change of owner of the run
counts, the leaves' and the returns'. Printed: p50 and max over those, per backend, against the
planned-move figure `bench_baseline --quick` recorded (docs/benchmarks.md) and the target a planned
move to a node without a warm copy has in `bench_migration` (1 s). Nodes are the real node runtime
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


def one_run(store_url: str, workdir: Path) -> tuple[list[float], list[str], bool]:
    """One rolling restart: the handoff gaps, a line per node's leave, whether the audit passed."""
    if store_url.startswith("file:"):
        open_store(store_url, create=True)
    cluster = RollingCluster(store_url, workdir, partitions=4, ports=dict(zip(NODES, _free_ports(3), strict=True)))
    for n in NODES:
        cluster.start_node(n)
    try:
        report = rolling_restart(cluster, NODES)
    finally:
        cluster.shutdown()
    audits = audit_store(cluster.store)
    exact = all(a.ok for a in audits)
    lines = [
        f"node {t.node}: owned {t.owned}, left in {t.leave_s:.1f}s ({', '.join(sorted(set(t.left_by.values())))}), "
        f"ready again {t.ready_s:.1f}s after its start, owned a partition {t.took_back_s:.1f}s after it"
        for t in report.restarts
    ]
    return report.gaps, lines, exact


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
        for r in range(rounds):
            progress(f"{backend}: rolling restart {r + 1}/{rounds}")
            with tempfile.TemporaryDirectory(prefix="laminar-bench-rolling-") as tmp:
                if backend == "s3":
                    with start_s3_server():
                        import boto3

                        bucket = f"rolling-{r}-{int(time.time())}"
                        boto3.client("s3").create_bucket(Bucket=bucket)
                        run_gaps, lines, exact = one_run(f"s3://{bucket}/laminar", Path(tmp))
                else:
                    run_gaps, lines, exact = one_run((Path(tmp) / "store").as_uri(), Path(tmp))
            gaps += run_gaps
            for line in lines:
                report.note(f"{backend} round {r + 1}: {line}")
            report.note(f"{backend} round {r + 1}: laminar verify {'exactly once' if exact else 'FAILED'}")
        if not gaps:
            report.rows.append(Row("rolling restart unavailability", backend, "no handoff", verdict="MISSED"))
            continue
        p50, worst = percentile(gaps, 50), max(gaps)
        report.rows.append(
            Row(
                f"rolling restart unavailability p50 ({len(gaps)} handoffs)",
                backend,
                f"{p50:.2f} s",
                f"<= {PLANNED_MOVE_TARGET_S:.1f} s (planned move {BASELINE_PLANNED_MOVE_S:.2f} s)",
                verdict(p50, PLANNED_MOVE_TARGET_S),
            )
        )
        report.rows.append(
            Row(
                "rolling restart unavailability max",
                backend,
                f"{worst:.2f} s",
                f"<= {PLANNED_MOVE_TARGET_S:.1f} s",
                verdict(worst, PLANNED_MOVE_TARGET_S),
            )
        )
    report.note(
        f"planned move: bench_baseline --quick's ~1 MB move on Spark nodes ({BASELINE_PLANNED_MOVE_S:.2f} s, "
        "docs/benchmarks.md); these nodes aggregate with pyarrow"
    )
    report.publish(
        "bench_rolling_restart", args.quick, load_before, time.monotonic() - started, "bench_rolling_restart.txt"
    )


if __name__ == "__main__":
    main()
