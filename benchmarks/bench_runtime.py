"""Runtime benchmarks of the data plane: batch cost vs state size, throughput, checkpoint bytes, restore, drain.

Run from the repository root::

    python -m benchmarks.bench_runtime           # full, 1.5 minutes on a quiet machine, < 5 loaded
    python -m benchmarks.bench_runtime --quick   # fewer runs, < 1 minute quiet, < 3 loaded
    python -m benchmarks.bench_runtime --only 1,4  # some figures only (1 also makes 3 and 4)

Figures (each printed next to its target, with whether it was met; nothing asserts):

1. Batch cost vs state size. A 10k-event batch over 1,000 keys (5 % of them new
   to the state) end to end on Spark ``local[2]``: the clock starts before the
   append to the source log and stops when the partition's committed offset
   (set after the manifest publish and the local apply) reaches the log end;
   each batch's stored manifest is checked afterwards. Measured with 1k keys of
   state and with 2.7M keys (a ~57 MB compacted RocksDB snapshot), the two
   side by side with their batches interleaved; medians of the batches after
   the first one (the first batch after a restore is reported on its own), the
   ratio of the two medians, and a per-step breakdown of one batch (the calls
   `PartitionWorker._process` / `_commit` make, made one by one here).
   The state is seeded without Spark: the source gets one event per key, a
   `PartitionStateStore` is filled with the state those events make, its RocksDB
   checkpoint is uploaded with `CheckpointStore.upload_snapshot` under a real
   token from `Ledger.acquire`, a manifest names it at the log end, and the
   epoch is released; then a real `Node` (in-process, the shared session) takes
   the partition, restores it and processes the batches.
2. Throughput: end-to-end events/s of one node for ONE batch of 10k, 100k and
   1M events over 1,000 keys from an empty state, with fencing ON (the library's
   `PartitionWorker` + the node's guard-refresh loop) and OFF (`UnfencedWorker`
   in `runtime_setup`, benchmark only), interleaved, and the ratio ON/OFF. Paired runs
   differ by tens of percent, so the 1% the fencing may cost is judged on the
   ratio implied by the fencing work timed directly; the measured ratio is
   printed next to it with its spread.
3. Checkpoint bytes: per batch (output + delta, from the manifests), per
   snapshot (the full first one vs the node's incremental later ones, from the
   manifest chain), and a series of snapshots taken the node's way, each after
   10 batch-sized deltas, timed and sized directly.
4. Restore of the 2.7M-key partition, split into download / open / delta apply
   (`CatchUp`): a fresh node taking the partition (snapshot + 10 deltas), and
   a replica that already holds the snapshot catching up (deltas only).
5. Drain with a batch in flight: a node runs for real (`Node.run`), a migration
   asks for Draining while a 10k batch is in flight; the figure is the wall time
   of `MigrationCoordinator.run_phase(DRAINING)`.
6. A batch's input to Spark: the same batch staged and aggregated once as one
   Arrow table (`SourceBatch.to_table`) and once as its Parquet files, one per
   segment (`SourceBatch.write_parquet`), interleaved: 1,000 and 10,000 events
   in 200-event segments (a producer appending every 50 ms) and 50,000 events in
   2,000-event segments; on the machine as it is, and again with two
   busy-looping processes competing for the two cores (a node on a busy
   machine). The ratios table / files are what `spark_takes_table` is set from.

One SparkSession (``local[2]``) is built once, warmed up, and shared by every
node of every run. The table is also written to ``benchmarks/results/runtime.txt``.

The figures are measured in `runtime_state` (1, 3, 4), `runtime_throughput` (2, 6) and
`runtime_drain` (5), on what `runtime_setup` provides.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from laminar_orchestration.dataplane.engine import build_spark_session

from .common import progress
from .runtime_drain import bench_drain
from .runtime_setup import MASTER, Params, Report
from .runtime_state import bench_states, report_bytes, report_restore, report_states
from .runtime_throughput import bench_batch_input, bench_throughput, warm_up

FULL = Params(
    warmup_rounds=8,
    series_batches=10,
    restore_runs=5,
    standby_runs=5,
    breakdown_runs=5,
    snapshot_series=12,
    sizes=((10_000, 11), (100_000, 7), (1_000_000, 5)),
    drain_runs=9,
    input_runs=15,
)
QUICK = Params(
    warmup_rounds=2,
    series_batches=10,
    restore_runs=1,
    standby_runs=1,
    breakdown_runs=1,
    snapshot_series=6,
    sizes=((10_000, 2), (100_000, 2), (1_000_000, 2)),
    drain_runs=2,
    input_runs=5,
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (< 3 minutes)")
    parser.add_argument(
        "--only", default="1,2,5,6", help="figures to run, comma-separated from 1,2,5,6 (1 also makes 3 and 4)"
    )
    args = parser.parse_args(argv)
    p = QUICK if args.quick else FULL
    only = {s.strip() for s in args.only.split(",") if s.strip()}

    import pyspark

    load_before = os.getloadavg()
    started = time.perf_counter()
    report = Report()
    progress(f"starting Spark ({MASTER})")
    spark = build_spark_session(MASTER, "laminar-bench-runtime")
    spark_start = time.perf_counter() - started
    try:
        with tempfile.TemporaryDirectory(prefix="laminar-bench-runtime-") as tmp:
            workroot = Path(tmp)
            t0 = time.perf_counter()
            warm_up(spark, workroot, p.warmup_rounds)
            warm_s = time.perf_counter() - t0
            if "1" in only:
                small, big = bench_states(spark, workroot, p)
                report_states(report, small, big)
            if "2" in only:
                bench_throughput(report, spark, workroot, p)
            if "1" in only:
                report_bytes(report, small, big)
                report_restore(report, big)
            if "5" in only:
                progress("5. drain")
                bench_drain(report, spark, workroot, p.drain_runs)
            if "6" in only:
                progress("6. a batch's input to Spark")
                bench_batch_input(report, spark, workroot, p.input_runs)
    finally:
        spark.stop()
    elapsed = time.perf_counter() - started

    report.note(
        f"Spark {pyspark.__version__}, one session {MASTER} built in {spark_start:.1f} s, warmed up with "
        f"{p.warmup_rounds} rounds of 10k/100k/1M aggregates ({warm_s:.1f} s) and shared by every node"
    )
    report.note(
        "the old checkpoint MB/s figures (upload_bytes/download_bytes, local and moto S3) are gone with "
        "upload_bytes: snapshot upload and restore download times are in figures 3 and 4 (local store only)"
    )
    report.publish("laminar runtime benchmark", args.quick, load_before, elapsed, "runtime.txt")


if __name__ == "__main__":
    main()
