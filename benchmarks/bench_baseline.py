"""Baseline: what a user does without laminar (Spark Structured Streaming + a checkpoint), compared in one run.

Run from the repository root::

    python -m benchmarks.bench_baseline           # full: 3 moves, 2 split-brain variants, warm+cold restart
    python -m benchmarks.bench_baseline --quick   # 1 move, 1 split-brain variant, warm restart only, 300k-key big state
    python -m benchmarks.bench_baseline --keep DIR   # keep checkpoints, outputs and logs

Roughly 4-5 min full / 3 min quick on an idle 2-CPU machine (Spark start-up of 4-5
JVMs dominates); 7.5 min full measured at a load average of ~20.

The baseline ("spark-ss") is one streaming query per partition: a file source
(a directory of parquet files, the partition's events with their offsets),
``groupBy("key").agg(count, sum, min, max, max_by(value, offset), max(offset))``
in output mode "update", a `foreachBatch` sink that appends each micro-batch's
rows (with the batch id, the worker's name and the wall-clock emission time) as
one parquet file to an output directory, and a ``checkpointLocation``. A
"worker" is a separate process (this module with ``--worker``) running one
SparkSession (``local[1]``, the same settings as a laminar node:
`build_spark_session`) that starts/stops the query on command and writes a
heartbeat file every 1 s. The checkpoint and source directories are on the
shared local disk and passed unchanged to whichever worker runs the query (a
checkpoint can only be moved after its query stopped, and the file source's
path must be identical where the query restarts).

Both systems get the same events (`generate_events`, 1,000 events every 0.25 s
over 1,000 keys, the same seeds), the same aggregation, the same Spark settings,
the same heartbeat timeout (3 s) and interval (1 s), and a 20 ms detection poll.
Scenarios, each on both systems (one after the other, never concurrently):

1. a worker is killed (SIGKILL of its whole process tree): detection by the
   heartbeat timeout, then recovery elsewhere. spark-ss: the query restarts on a
   warm standby worker (SparkSession already up), and once more on a cold one
   (a new process); laminar: forced `MigrationCoordinator.run`.
2. a planned move of the partition: spark-ss: stop the query on A (after waiting
   for the micro-batch in flight to complete, at most 5 s), then start it on B;
   laminar: graceful `MigrationCoordinator.run`.
3. split-brain: the owner is paused with SIGSTOP while a batch is in flight,
   declared dead by the heartbeat timeout, the partition is started elsewhere
   with the same checkpoint (spark-ss) / failed over (laminar, forced), more
   events arrive, then the old owner is resumed with SIGCONT. Counted: output
   emitted twice or by the zombie, final per-key counts that differ from the
   truth, query/checkpoint errors; for laminar `audit_store` duplicates.

4. the same planned moves and killed worker at ~100 MB of state: both systems
   first get the same 2.7M keys, each produced once (spark-ss: one source file,
   its first micro-batch, on workers C and D; laminar: partition 1, committed
   in batches of <= 1M events), then the same load.
5. the ratios the targets are about, from the same run: laminar's planned-move
   unavailability and kill recovery over spark-ss's warm-standby figures, at
   ~1 MB (25,000 seeded keys, for both) and ~100 MB; target <= 0.5.

laminar's two nodes both run with ``--standby-for 0,1``: the node that does not
own a partition keeps a warm copy of it (laminar's warm standby), and the
graceful and forced moves go to that copy; the no-standby figures are in
`bench_migration`. Output "first output" = spark-ss: a non-empty micro-batch file is in the output
directory; laminar: a manifest naming output is committed. The table is also
written to ``benchmarks/results/baseline.txt``.

Here: the command line and the two runs, one per system. The spark-ss worker process is in
`baseline_worker`, each system's scenarios in `baseline_spark` and `baseline_laminar`, the load they
share in `baseline_load`, and the results and their table in `baseline_report`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from laminar_orchestration.dataplane.restore import committed_state
from laminar_orchestration.ops.verify import audit_store

from .baseline_laminar import (
    LAM_STANDBY_ARGS,
    LaminarLoad,
    committed_regressions,
    laminar_moves,
    laminar_zombie,
    seed_partition,
    standby_of,
)
from .baseline_load import BIG_KEYS, BIG_PREFIX, BIG_SEED, SEED, SMALL_KEYS, SMALL_PREFIX, SMALL_SEED, truth
from .baseline_report import Results, build_rows
from .baseline_spark import AFTER_SINK, BATCH_START, SsScenario, analyze, ss_big, ss_kill, ss_moves, ss_split_brain
from .baseline_worker import Worker, WorkerMain
from .common import format_table, progress, publish, run_title
from .migration_cluster import History, every_key_once, log_tails, start_cluster, wait_standby
from .migration_runs import failover_run, revive


@dataclass(frozen=True)
class Params:
    moves: int
    cold_restart: bool
    pauses: tuple[str, ...]
    big_keys: int = BIG_KEYS


FULL = Params(moves=3, cold_restart=True, pauses=(BATCH_START, AFTER_SINK))
QUICK = Params(moves=1, cold_restart=False, pauses=(BATCH_START,), big_keys=300_000)


def run_spark_ss(p: Params, workdir: Path, res: Results) -> None:
    ctl = workdir / "ctl"
    ctl.mkdir()
    progress("spark-ss: starting workers A, B and (for the ~100 MB case) C, D (SparkSession + warm-up query)")
    t0 = time.perf_counter()
    a, b, c, d = Worker("A", ctl), Worker("B", ctl), Worker("C", ctl), Worker("D", ctl)
    workers = [a, b, c, d]
    try:
        for w in workers:
            w.wait_ready(600)
        res.notes.append(f"spark-ss: 4 warm workers ready in {time.perf_counter() - t0:.1f} s")
        progress("spark-ss: planned moves")
        res.ss_moves, res.ss_move_analysis, res.ss_move_files = ss_moves([a, b], workdir / "ss-move", p.moves)
        progress("spark-ss: split-brain")
        for i, pause_at in enumerate(p.pauses):
            res.ss_splits.append(ss_split_brain(a, b, workdir / f"ss-split-{i}", pause_at))
        progress("spark-ss: killed worker (warm standby)")
        sc = SsScenario(workdir / "ss-kill", SEED + 3, seeded=every_key_once(SMALL_PREFIX, SMALL_KEYS, SMALL_SEED))
        # A may have lost its query in the split-brain run; its process (and session) are reused.
        a.wait_status(a.command("start", sc.dirs), 120)
        res.ss_kill_warm, running = ss_kill(a, b, sc)
        progress(f"    detection {res.ss_kill_warm.detection_s:.2f} s, recovery {res.ss_kill_warm.recovery_s:.2f} s")
        if p.cold_restart:
            progress("spark-ss: killed worker (cold restart: a new process)")
            res.ss_kill_cold, cold = ss_kill(running, running, sc, ctl=ctl)
            workers.append(cold)
            running = cold
            progress(
                f"    detection {res.ss_kill_cold.detection_s:.2f} s, recovery {res.ss_kill_cold.recovery_s:.2f} s"
            )
        sc.finish()
        sc.wait_marker(120)
        running.wait_status(running.command("stop"), 60)
        res.ss_kill_analysis = analyze(sc.dirs.out, truth(sc.tables()))
        with contextlib.suppress(Exception):
            running.close()
        progress(f"spark-ss (~100 MB): seeding {p.big_keys:,} keys, planned moves, killed worker (C, D)")
        res.ss_big = ss_big(c, d, workdir / "ss-big", p.moves, p.big_keys)
    except BaseException:
        for w in workers:
            progress(f"--- worker {w.name} log tail ---\n{w.log()[-3000:]}")
        raise
    finally:
        for w in workers:
            with contextlib.suppress(Exception):
                w.close()


def run_laminar(p: Params, workdir: Path, res: Results) -> None:
    progress("laminar: starting nodes 1 and 2 (both --standby-for 0,1)")
    t0 = time.perf_counter()
    cluster = start_cluster(workdir, (1, 2), 2, per_node_args={1: LAM_STANDBY_ARGS, 2: LAM_STANDBY_ARGS})
    load = LaminarLoad(cluster, 0)
    big_load = LaminarLoad(cluster, 1)
    try:
        cluster.wait_alive(1, 2, timeout=300)
        cluster.place({0: 1, 1: 2})
        res.notes.append(
            f"laminar: 2 nodes up in {time.perf_counter() - t0:.1f} s, both with {' '.join(LAM_STANDBY_ARGS)} "
            "(the node not owning a partition keeps a warm copy of it)"
        )
        small_seed = every_key_once(SMALL_PREFIX, SMALL_KEYS, SMALL_SEED)
        small_s = seed_partition(cluster, 0, small_seed, 300)
        progress(f"laminar: seeding {p.big_keys:,} keys into partition 1")
        res.lam_big_seeding_s = seed_partition(cluster, 1, every_key_once(BIG_PREFIX, p.big_keys, BIG_SEED), 1800)
        progress(f"    seeded in {res.lam_big_seeding_s:.1f} s")
        res.notes.append(
            f"laminar: seeded {SMALL_KEYS:,} keys into partition 0 in {small_s:.1f} s, {p.big_keys:,} keys into "
            f"partition 1 in {res.lam_big_seeding_s:.1f} s"
        )
        hist = History(cluster.store, 0)
        load.start(SEED + 1)
        laminar_moves(cluster, hist, p.moves, "move", res.lam_moves, warm_commits=3, timeout=120, standby_wait=300)
        load.stop()
        progress("laminar: zombie (SIGSTOP owner, forced failover, SIGCONT)")
        load.start(SEED + 2)
        res.lam_split = laminar_zombie(cluster, hist)
        load.stop()
        cluster.wait_alive(1, 2, timeout=60)
        progress("laminar: killed node (forced failover to the warm standby)")
        wait_standby(cluster, standby_of(cluster, 0), 0, 300)
        load.start(SEED + 3)
        res.lam_kill = failover_run(cluster, hist, warm_commits=3, timeout=120)
        progress(f"    detection {res.lam_kill.detection_s:.2f} s, recovery {res.lam_kill.recovery_s:.2f} s")
        load.stop()
        progress(f"laminar: restarting node {res.lam_kill.victim}")
        revive(cluster, res.lam_kill.victim)

        progress("laminar (~100 MB): planned moves, killed node")
        big = History(cluster.store, 1)
        big_load.start(SEED + 4)
        laminar_moves(
            cluster, big, p.moves, "big move", res.lam_big_moves, warm_commits=2, timeout=300, standby_wait=600
        )
        wait_standby(cluster, standby_of(cluster, 1), 1, 600)
        res.lam_big_kill = failover_run(cluster, big, warm_commits=2, timeout=300)
        k = res.lam_big_kill
        progress(f"    detection {k.detection_s:.2f} s, recovery {k.recovery_s:.2f} s")
        big_load.stop()
        progress(f"laminar: restarting node {k.victim}")
        revive(cluster, k.victim)

        cluster.wait_committed(timeout=600)
        progress("laminar: audit")
        t_audit = time.perf_counter()
        audits = audit_store(cluster.store)
        res.notes.append(f"laminar: audit_store of both partitions took {time.perf_counter() - t_audit:.1f} s")
        res.lam_audit_duplicates = sum(a.duplicates for a in audits)
        res.lam_audit_losses = sum(a.losses for a in audits)
        res.lam_audit_issues = [f"{i.kind}: {i.detail}" for a in audits for i in a.issues]
        res.lam_orphans = sum(a.orphan_outputs for a in audits)
        res.lam_regressions = committed_regressions(cluster.store, 0)
        state, _ = committed_state(cluster.store, 0)
        expected = truth([small_seed, *load.tables])
        got = dict(zip(state["key"].to_pylist(), state["count"].to_pylist(), strict=True))
        res.lam_keys = len(expected)
        res.lam_final_mismatch = sum(1 for k, n in expected.items() if got.get(k) != n)
    except BaseException:
        progress("laminar FAILED; node log tails:\n" + log_tails(cluster))
        raise
    finally:
        for ld in (load, big_load):
            with contextlib.suppress(Exception):
                ld.stop()
        cluster.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="one run per scenario")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--ctl", help=argparse.SUPPRESS)
    parser.add_argument("--no-warm-up", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keep", metavar="DIR", help="keep the work directory (logs, checkpoints) here")
    parser.add_argument("--big-keys", type=int, help="keys of the big state (default 2.7M; quick 300k)")
    args = parser.parse_args(argv)
    if args.worker:
        WorkerMain(args.worker, Path(args.ctl)).run(warm_up=not args.no_warm_up)
        return
    p = QUICK if args.quick else FULL
    if args.big_keys:
        p = Params(p.moves, p.cold_restart, p.pauses, args.big_keys)
    load_before = os.getloadavg()
    started = time.perf_counter()
    res = Results(big_keys=p.big_keys)
    with contextlib.ExitStack() as stack:
        if args.keep:
            workdir = Path(args.keep)
            workdir.mkdir(parents=True, exist_ok=False)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="laminar-bench-baseline-")))
        (workdir / "ss").mkdir()
        (workdir / "laminar").mkdir()
        run_spark_ss(p, workdir / "ss", res)
        run_laminar(p, workdir / "laminar", res)
    elapsed = time.perf_counter() - started
    rows, notes = build_rows(res)
    title = run_title("laminar vs Spark Structured Streaming baseline", args.quick, load_before)
    publish(format_table(rows, title, notes), elapsed, "baseline.txt")


if __name__ == "__main__":
    main()
