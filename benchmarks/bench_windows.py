"""Windowed counts, laminar against Spark Structured Streaming on the RocksDB state store, in one run.

Run from the repository root::

    python -m benchmarks.bench_windows               # 10 minutes of load per side, 3 moves, 2 kills
    python -m benchmarks.bench_windows --quick       # 2 minutes per side, 2 moves, 1 kill
    python -m benchmarks.bench_windows --minutes 5   # any length
    python -m benchmarks.bench_windows --keep DIR    # keep checkpoints, stores and logs

About 2 x (minutes + 3) minutes on an idle 2-CPU machine.

Both sides compute the windowed-count example (`examples/windowed_counts.py`): per user, 5-minute
tumbling windows on the event time with 1 minute of allowed lateness, each window emitted once
when final (append mode), with its views and summed amount. They get the same events
(`windows_load`), one partition, at the same input rate, one after the other (never concurrently):

* spark-ss: ``withWatermark("at", "1 minute").groupBy(window("at", "5 minutes"), "user")`` over a
  parquet file source, output mode append, a `foreachBatch` sink writing each micro-batch as a
  parquet file with its wall-clock emission time, a ``checkpointLocation`` on the shared local disk
  and the RocksDB state store provider (with changelog checkpointing). A worker is a process with one
  SparkSession (``local[1]``, the settings of a laminar node: `build_spark_session`), driven by
  command files (the baseline's worker, `baseline_worker`); worker B is a warm standby (SparkSession
  up, its warm-up query run). A planned move stops the query on A (after the micro-batch in flight)
  and starts it on B with the same checkpoint; a kill SIGKILLs A's process tree and starts the query
  on B once A's heartbeat (1 s) is older than 3 s. A killed worker is replaced by a new warm one.
* laminar: two `laminar node run` processes (the local cluster launcher, as `bench_baseline`) with
  ``--standby-for 0``, on a cluster whose stream record (``ledger/stream.json``) names the processor
  and schema; a planned move is `MigrationCoordinator.run` to the warm standby, a kill is SIGKILL
  of the owner's process tree, detection by the 3 s heartbeat timeout and a forced failover to the
  standby; the killed node is restarted afterwards.

Each side: the backlog's catch-up, then `--minutes` of scheduled load; the first half undisturbed
(throughput, CPU, window latency), the second half the planned moves and kills; the state sampled
every 30 s through the whole load (laminar: the keys of the committed state, as `laminar query`
reads it, and the latest snapshot's bytes; spark-ss: its state rows and its checkpoint's state
bytes). The table is also written to ``benchmarks/results/windows.txt``.

Here: the command line. The load is in `windows_load`, each side in `windows_spark` and
`windows_laminar`, the table in `windows_report`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from pathlib import Path

from .common import format_table, progress, publish, run_title
from .windows_laminar import run_laminar, source_takes_schemas
from .windows_report import build_rows
from .windows_spark import Plan, WindowsWorkerMain, run_spark

FULL = Plan(minutes=10.0, moves=3, kills=2)
QUICK = Plan(minutes=2.0, moves=2, kills=1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="2 minutes of load per side, 2 moves, 1 kill")
    parser.add_argument("--minutes", type=float, help="minutes of load per side (default 10; quick 2)")
    parser.add_argument("--keep", metavar="DIR", help="keep the work directory (logs, checkpoints, stores) here")
    parser.add_argument("--only", choices=("spark-ss", "laminar"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--stream",
        choices=("auto", "clicks", "default"),
        default="auto",
        help="clicks: the clicks schema and examples.windowed_counts; default: the same events and windows on "
        "the source log's default schema (benchmarks.windows_processor); auto: clicks when the log takes schemas",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--ctl", help=argparse.SUPPRESS)
    parser.add_argument("--pages", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-warm-up", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        WindowsWorkerMain(args.worker, Path(args.ctl), args.pages).run(warm_up=not args.no_warm_up)
        return
    plan = QUICK if args.quick else FULL
    if args.minutes:
        plan = Plan(args.minutes, plan.moves, plan.kills)
    clicks_mode = source_takes_schemas() if args.stream == "auto" else args.stream == "clicks"
    progress(
        "the stream: the clicks schema and examples.windowed_counts:processor"
        if clicks_mode
        else "the stream: the source log holds only its default schema (key, value, ts): the same events and "
        "windows through benchmarks.windows_processor:processor (no pages collect_set on either side)"
    )
    load_before = os.getloadavg()
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.keep:
            workdir = Path(args.keep)
            workdir.mkdir(parents=True, exist_ok=False)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="laminar-bench-windows-")))
        from .windows_spark import SideRun

        lam = run_laminar(plan, workdir / "laminar", clicks_mode) if args.only != "spark-ss" else SideRun()
        ss = run_spark(plan, workdir / "ss", clicks_mode) if args.only != "laminar" else SideRun()
    rows, notes = build_rows(ss, lam, plan.minutes)
    mode = "the clicks schema" if clicks_mode else "default-schema mapping of the clicks"
    notes.append(f"stream: {mode}")
    title = run_title("windowed counts: laminar vs Spark SS (RocksDB state store)", args.quick, load_before)
    publish(format_table(rows, title, notes), time.perf_counter() - started, "windows.txt")


if __name__ == "__main__":
    main()
