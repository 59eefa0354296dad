"""Spark JVM options of a node: how fast a fresh JVM's batches get, and what each costs in CPU.

Run from the repository root::

    python -m benchmarks.bench_spark_jvm            # 3 fresh JVMs per setting, 60 batches each
    python -m benchmarks.bench_spark_jvm --quick    # 1 JVM per setting, 40 batches

Each run starts a fresh Spark (``local[1]``, `spark_conf` with only the JVM options
changed) in a child process and aggregates the same 4,000-event batch (1,000 keys)
through `SparkBatchEngine` again and again, timing each batch's wall time and the
CPU time of the JVM. It compares the JVM's defaults (tiered compilation up to C2,
G1) with `SPARK_JAVA_OPTIONS` (C1 only, serial GC), and those options with the
machine's class archive mapped (`dataplane.class_archive`, made first if missing).
What matters for a handoff is the first batches of a node that has not run any
yet (a migration's target, a standby), and on a shared machine the CPU each batch
takes from the other nodes; for a node's start (a restart, a cold target), the
time and JVM CPU from nothing to its first batch done.

The table is also written to ``benchmarks/results/spark_jvm.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from .common import REPO_ROOT, Row, format_table, median, progress, publish, verdict

BATCH_EVENTS = 4_000
BATCH_KEYS = 1_000
#: Batches 2..10 ("first batches") and the tail from this batch on ("warm").
WARM_FROM = 30


def _jvm_cpu_s() -> float:
    """CPU seconds of this process's children (the Spark JVM), from /proc."""
    me, ticks, total = os.getpid(), os.sysconf("SC_CLK_TCK"), 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[1]) == me:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def probe(java_options: str, batches: int, archive: bool) -> None:
    """Child process: a fresh Spark with `java_options` (and the class archive); one JSON line per batch."""
    os.environ["LAMINAR_SPARK_JAVA_OPTIONS"] = java_options
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from laminar_orchestration.dataplane.engine import SparkBatchEngine, build_spark_session

    started = time.perf_counter()
    spark = build_spark_session("local[1]", "laminar-bench-spark-jvm", archive="machine" if archive else None)
    with tempfile.TemporaryDirectory(prefix="laminar-bench-jvm-") as tmp:
        engine = SparkBatchEngine(spark, workdir=tmp)
        rng = np.random.default_rng(7)
        keys = rng.integers(0, BATCH_KEYS, BATCH_EVENTS)
        events = pa.table(
            {
                "offset": pa.array(np.arange(BATCH_EVENTS), pa.int64()),
                "key": pa.array([f"k{k}" for k in keys], pa.string()),
                "value": pa.array(rng.random(BATCH_EVENTS), pa.float64()),
                "ts": pa.array(np.arange(BATCH_EVENTS), pa.int64()),
            }
        )
        path = Path(tmp) / "events.parquet"
        pq.write_table(events, path)
        for i in range(batches):
            cpu0, t0 = _jvm_cpu_s(), time.perf_counter()
            engine.aggregate([path], epoch=1, generation=0, job_group=f"bench-{i}")
            wall, cpu = time.perf_counter() - t0, _jvm_cpu_s() - cpu0
            print(json.dumps({"batch": i, "wall_ms": wall * 1000, "jvm_cpu_ms": cpu * 1000}), flush=True)
            if i == 0:  # the start: from nothing to the first batch done
                start = {"start_s": time.perf_counter() - started, "start_jvm_cpu_s": _jvm_cpu_s()}
                print(json.dumps({"batch": -1, **start}), flush=True)
    spark.stop()


def run_probe(java_options: str, batches: int, archive: bool) -> list[dict[str, float]]:
    """One fresh JVM's lines: its start (batch -1) first, then its batches."""
    flags = ["--archive"] if archive else []
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_spark_jvm",
            "--probe",
            java_options,
            "--batches",
            str(batches),
            *flags,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return sorted(lines, key=lambda line: line["batch"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="one JVM per setting, 40 batches")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, default=60, help=argparse.SUPPRESS)
    parser.add_argument("--archive", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe is not None:
        probe(args.probe, args.batches, args.archive)
        return

    from laminar_orchestration.dataplane.engine import SPARK_JAVA_OPTIONS
    from laminar_orchestration.ops.class_archive import prepare

    jvms, batches = (1, 40) if args.quick else (3, 60)
    progress(f"class archive: {prepare()}")
    settings: dict[str, tuple[str, bool]] = {
        "JVM defaults (tiered C2, G1)": ("", False),
        f"laminar ({SPARK_JAVA_OPTIONS})": (SPARK_JAVA_OPTIONS, False),
        "laminar + class archive": (SPARK_JAVA_OPTIONS, True),
    }
    load_before = os.getloadavg()
    started = time.perf_counter()
    samples: dict[str, list[list[dict[str, float]]]] = {name: [] for name in settings}
    # Alternate the settings so a change of machine load hits both alike.
    for run in range(jvms):
        for name, (options, archive) in settings.items():
            progress(f"run {run + 1}/{jvms}: {name}")
            samples[name].append(run_probe(options, batches, archive))

    def figure(name: str, key: str, lo: int, hi: int) -> float:
        # Line 0 is the start; batches follow from line 1.
        return median([b[key] for runs in samples[name] for b in runs[lo + 1 : hi + 1]])

    def start(name: str, key: str) -> float:
        return median([runs[0][key] for runs in samples[name]])

    rows: list[Row] = []
    summary: dict[str, dict[str, float]] = {}
    for name in settings:
        first = figure(name, "wall_ms", 0, 1)
        early, early_cpu = figure(name, "wall_ms", 1, 10), figure(name, "jvm_cpu_ms", 1, 10)
        warm, warm_cpu = figure(name, "wall_ms", WARM_FROM, batches), figure(name, "jvm_cpu_ms", WARM_FROM, batches)
        summary[name] = {"early": early, "early_cpu": early_cpu, "warm": warm, "warm_cpu": warm_cpu}
        summary[name] |= {"start": start(name, "start_s"), "start_cpu": start(name, "start_jvm_cpu_s")}
        rows += [
            Row(
                f"{name}: start to first batch done, wall / JVM CPU (median)",
                "local[1]",
                f"{summary[name]['start']:,.1f} / {summary[name]['start_cpu']:,.1f} s",
            ),
            Row(f"{name}: first batch of a fresh JVM (median of {jvms})", "local[1]", f"{first:,.0f} ms"),
            Row(f"{name}: batches 2-10, wall / JVM CPU (median)", "local[1]", f"{early:,.0f} / {early_cpu:,.0f} ms"),
            Row(
                f"{name}: batches {WARM_FROM + 1}-{batches}, wall / JVM CPU (median)",
                "local[1]",
                f"{warm:,.0f} / {warm_cpu:,.0f} ms",
            ),
        ]
    default, ours, archived = (summary[name] for name in settings)
    for label, key in (
        ("batches 2-10 wall", "early"),
        ("batches 2-10 JVM CPU", "early_cpu"),
        ("warm JVM CPU", "warm_cpu"),
    ):
        ratio = ours[key] / default[key]
        rows.append(
            Row(f"ratio laminar / JVM defaults: {label}", "local[1]", f"{ratio:.2f}", "<= 1.0", verdict(ratio, 1.0))
        )
    ratio = ours["warm"] / default["warm"]
    rows.append(
        Row("ratio laminar / JVM defaults: warm wall", "local[1]", f"{ratio:.2f}", "<= 1.1", verdict(ratio, 1.1))
    )
    for label, key in (("start JVM CPU", "start_cpu"), ("start wall", "start"), ("warm wall", "warm")):
        ratio = archived[key] / ours[key]
        limit = 1.1 if key == "warm" else 1.0
        rows.append(
            Row(f"ratio with / without the class archive: {label}", "local[1]", f"{ratio:.2f}", f"<= {limit}",
                verdict(ratio, limit))
        )  # fmt: skip

    load_after = os.getloadavg()
    title = (
        f"laminar Spark JVM benchmark ({'quick' if args.quick else 'full'}), "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%SZ')}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average (1/5/15 min) {'/'.join(f'{x:.1f}' for x in load_before)} before, "
        f"{'/'.join(f'{x:.1f}' for x in load_after)} after"
    )
    notes = [
        f"each JVM aggregates the same {BATCH_EVENTS:,}-event batch over {BATCH_KEYS:,} keys {batches} times; "
        "JVM CPU includes the JIT compiler and GC threads",
        "the 'warm wall' target allows 10 %: the options must not make a warm node slower",
    ]
    publish(format_table(rows, title, notes), time.perf_counter() - started, "spark_jvm.txt")


if __name__ == "__main__":
    main()
