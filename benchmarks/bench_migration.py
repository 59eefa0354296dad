"""Migration benchmarks: graceful migration and forced failover on a live local cluster.

Run from the repository root::

    python -m benchmarks.bench_migration           # full: 3 runs per graceful figure, 2 per failover
    python -m benchmarks.bench_migration --quick   # 1 run per figure, a smaller "big" state
    python -m benchmarks.bench_migration --keep DIR   # keep the store and node logs

One `Cluster` serves every run, so Spark starts only once per node: 4 node
processes (Spark ``local[1]`` each, one local file store, heartbeat timeout 3 s,
heartbeat every 1 s, guard refresh every 0.5 s, a snapshot every 3 deltas).
Nodes 1 and 2 are plain; nodes 3 and 4 run with ``--standby-for 0,1`` and keep
a warm copy of both measured partitions while they do not own them. Partition 0
holds ~1 MB of state (25,000 keys), partition 1 ~100 MB (2.7M keys, seeded by
producing every key once through the source and letting its owner process it).
Load keeps running on both partitions the whole time (a producer thread each),
so both the old and the new owner have data commits to time.

Figures (each printed next to its target, with whether it was met; nothing asserts):

1. Graceful migration at ~1 MB and ~100 MB, to a node without a standby copy
   ("cold": nodes 1 <-> 2; the target still warms up while the move is Planned,
   as the coordinator lets it) and to a caught-up warm standby ("warm": nodes
   3 <-> 4): launch -> Active, each phase's duration, the PLANNED phase's report
   (how warm the target was), the DOWNLOADING phase's bytes_moved, the new
   owner's restore split from its log, and the unavailability window: the old
   owner's last data commit -> the new owner's first data commit (manifest
   ``committed_at``; a data commit is a manifest that names output).
2. Forced failover of the ~100 MB partition after SIGKILL of its owner's whole
   process tree: detection (kill -> the ledger sees the node dead; polled every
   20 ms), recovery (forced `MigrationCoordinator.run` launched at once -> the new
   owner's first data commit), total (kill -> that commit), unavailability.
   "warm": the owner is node 3 or 4 and the target is the other one (what
   `assignment.failover_target` picks: the live warm copy); "cold": the owner is
   node 1 or 2 and the target is explicitly the other plain node (no copy: it
   downloads the snapshot and applies the deltas). The victim is restarted after
   each run (with its standby flags) and waited for until its background Spark
   warm-up has ended and, when it is a standby node, until its copy has caught
   up again.

The table is also written to ``benchmarks/results/migration.txt``.

Here: the command line, the series of runs and the table. One graceful migration or forced failover
is `migration_runs`; the cluster, its load and what the runs read off it are `migration_cluster`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from laminar_dev.localcluster import HEARTBEAT_TIMEOUT_S, Cluster, wait_until
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import FORCED_PHASES, GRACEFUL_PHASES, MigrationPhase

from .common import Row, TableReport, median, progress, verdict
from .migration_cluster import (
    DRIVER_MEMORY,
    HEARTBEAT_INTERVAL_S,
    MB,
    NODE_ARGS,
    SPARK_MASTER,
    BatchLine,
    History,
    Producer,
    every_key_once,
    log_tails,
    partition_load,
    pick_target,
    restore_summary,
    start_cluster,
    wait_standby,
    wait_warmed_up,
)
from .migration_runs import FailoverRun, MigrationRun, failover_run, graceful_run, revive

#: The load on each measured partition, (events, every seconds): a steady stream of small appends.
#: Arriving in bursts a batch interval apart would put that interval into every unavailability
#: figure (the new owner's first commit cannot come before the next burst), whatever the handoff.
SMALL_LOAD = (100, 0.025)
BIG_LOAD = (200, 0.05)
#: Partitions of the benchmark cluster.
SMALL, BIG = 0, 1
#: Plain nodes, and nodes keeping a warm standby copy of both partitions.
COLD_NODES = (1, 2)
WARM_NODES = (3, 4)
STANDBY_ARGS = ("--standby-for", f"{SMALL},{BIG}")
LOCAL = "local"

# Targets.
GRACEFUL_TOTAL_TARGET_S = 5.0  # a planned move costs seconds, not minutes (launch -> Active)
UNAVAILABLE_COLD_TARGET_S = 1.0  # graceful, target without a standby copy
UNAVAILABLE_WARM_TARGET_S = 0.5  # graceful, target a caught-up warm standby
RECOVERY_COLD_TARGET_S = 1.5  # forced: launch -> first data commit, no standby
RECOVERY_WARM_TARGET_S = 0.3  # forced: launch -> first data commit, warm standby
COLD, WARM = "cold", "warm"


@dataclass(frozen=True)
class Params:
    graceful_runs: int
    failover_runs: int
    #: Distinct keys of the ~1 MB / ~100 MB states.
    small_keys: int = 25_000
    big_keys: int = 2_700_000


FULL = Params(graceful_runs=3, failover_runs=2)
#: The bench's sections, in the order they run: (state size, target kind), for `--only`.
SECTIONS: dict[str, tuple[str, str]] = {
    "small-cold": ("~1 MB", COLD),
    "small-warm": ("~1 MB", WARM),
    "big-cold": ("~100 MB", COLD),
    "failover-cold": ("~100 MB", COLD),
    "big-warm": ("~100 MB", WARM),
    "failover-warm": ("~100 MB", WARM),
}
QUICK = Params(graceful_runs=1, failover_runs=1, big_keys=500_000)


# --- the report ----------------------------------------------------------------------------------------


class Report(TableReport):
    def add(self, figure: str, value: str, target: str = "-", verdict_: str = "info") -> None:
        self.rows.append(Row(figure, LOCAL, value, target, verdict_))

    def add_median(self, figure: str, values: Sequence[float], unit: Callable[[float], str]) -> None:
        """The median of `values`, written in `unit` (`s`, `size`)."""
        self.add(figure, unit(median(values)))


def s(seconds: float) -> str:
    return f"{seconds:.2f} s"


def list_s(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def size(n: float) -> str:
    return f"{n / MB:.2f} MB"


def report_first_batch(report: Report, prefix: str, lines: Sequence[BatchLine | None]) -> None:
    """Where the new owner's first batch spent its time (Spark vs the node's own work)."""
    found = [b for b in lines if b is not None]
    if not found:
        report.add(f"{prefix}: new owner's first batch (no debug log line found)", "-")
        return
    report.add(
        f"{prefix}: new owner's first batch: Spark aggregate / waited on it / node's merge + commit (medians)",
        f"{median([b.spark_ms for b in found]):.0f} / {median([b.waited_ms for b in found]):.0f} / "
        f"{median([b.commit_ms for b in found]):.0f} ms",
    )
    report.add(
        f"{prefix}: new owner's first batch: merge (state read) / output / delta / publish / local apply (medians)",
        f"{median([b.merge_ms for b in found]):.0f} ({median([b.read_ms for b in found]):.0f}) / "
        + " / ".join(
            f"{median([getattr(b, f) for b in found]):.0f}" for f in ("output_ms", "delta_ms", "publish_ms", "apply_ms")
        )
        + " ms",
    )
    report.add(f"{prefix}: new owner's first batch: events (median)", f"{median([b.events for b in found]):,.0f}")


def report_phases(
    report: Report, prefix: str, phases: Sequence[MigrationPhase], runs: Sequence[Mapping[MigrationPhase, float]]
) -> None:
    """The median time of each of `phases` over the runs' phase timings (0 where a run lacks one)."""
    for phase in phases:
        report.add_median(f"{prefix}: phase {phase.value} (median)", [r.get(phase, 0.0) for r in runs], s)


def report_graceful(report: Report, label: str, kind: str, runs: Sequence[MigrationRun]) -> None:
    n = len(runs)
    tag = f"{label}, {kind}"
    total = median([r.total_s for r in runs])
    unavail = median([r.unavailable_s for r in runs])
    target = UNAVAILABLE_WARM_TARGET_S if kind == WARM else UNAVAILABLE_COLD_TARGET_S
    report.add(
        f"1. graceful {tag}: unavailability, old owner's last data commit -> new owner's first (median of {n})",
        s(unavail),
        f"<= {target:.1f} s",
        verdict(unavail, target),
    )
    report.add(
        f"1.   {tag}: launch -> Active (median)", s(total), f"<= {GRACEFUL_TOTAL_TARGET_S:.0f} s",
        verdict(total, GRACEFUL_TOTAL_TARGET_S),
    )  # fmt: skip
    report_phases(report, f"1.     {tag}", GRACEFUL_PHASES, [r.phases for r in runs])
    report.add_median(
        f"1.   {tag}: checkpoint bytes moved by the handoff (DOWNLOADING bytes_moved, median)",
        [r.download_bytes for r in runs],
        size,
    )
    report.add_median(
        f"1.   {tag}: checkpoint bytes the target's warm-up moved before the drain (PLANNED bytes_moved, median)",
        [r.planned_bytes for r in runs],
        size,
    )
    report.add_median(
        f"1.   {tag}: old owner's last data commit -> seal (median)", [r.last_data_to_seal_s for r in runs], s
    )
    report.add_median(
        f"1.   {tag}: seal -> new owner's first data commit (median)", [r.seal_to_data_s for r in runs], s
    )
    report_first_batch(report, f"1.   {tag}", [r.first_batch for r in runs])
    all_gaps = [g for r in runs for g in r.normal_gaps]
    if all_gaps:
        report.add(f"1.   {tag}: for scale, gap between data commits under load (median)", s(median(all_gaps)))
    report.note(
        f"1 ({tag}): unavailability {list_s([r.unavailable_s for r in runs])} s; launch -> Active "
        f"{list_s([r.total_s for r in runs])} s; old owner's last data commit was "
        f"{list_s([r.last_commit_before_launch_s for r in runs])} s before the launch; moves "
        f"{', '.join(f'{r.from_node}->{r.to_node}' for r in runs)}; DOWNLOADING bytes_moved "
        f"{', '.join(str(r.download_bytes) for r in runs)}; PLANNED bytes_moved "
        f"{', '.join(str(r.planned_bytes) for r in runs)}, {' | '.join(r.planned_detail for r in runs)}; "
        f"new owner's restore: {restore_summary([r.restores for r in runs])}"
    )


def report_failover(report: Report, label: str, kind: str, runs: Sequence[FailoverRun]) -> None:
    n = len(runs)
    tag = f"{label}, {kind}"
    target = RECOVERY_WARM_TARGET_S if kind == WARM else RECOVERY_COLD_TARGET_S
    recovery = median([r.recovery_s for r in runs])
    report.add(
        f"2. failover {tag}: recovery, forced launch -> new owner's first data commit (median of {n})",
        s(recovery),
        f"<= {target:.1f} s",
        verdict(recovery, target),
    )
    report.add_median(
        f"2.   {tag}: detection, SIGKILL -> ledger sees the node dead (timeout {HEARTBEAT_TIMEOUT_S:.0f} s; median)",
        [r.detection_s for r in runs],
        s,
    )
    report.add_median(
        f"2.   {tag}: total, SIGKILL -> first data commit elsewhere (median)", [r.total_s for r in runs], s
    )
    report.add_median(
        f"2.   {tag}: forced MigrationCoordinator.run, launch -> Active (median)", [r.run_s for r in runs], s
    )
    report_phases(report, f"2.     {tag}", FORCED_PHASES, [r.phases for r in runs])
    report.add_median(f"2.   {tag}: launch -> seal (median)", [r.launch_to_seal_s for r in runs], s)
    report.add_median(
        f"2.   {tag}: Active -> first data commit, i.e. the new owner's first batch (median)",
        [r.recovery_s - r.run_s for r in runs],
        s,
    )
    report_first_batch(report, f"2.   {tag}", [r.first_batch for r in runs])
    report.add_median(
        f"2.   {tag}: checkpoint bytes moved (DOWNLOADING bytes_moved, median)", [r.download_bytes for r in runs], size
    )
    report.add_median(
        f"2.   {tag}: unavailability, old owner's last data commit -> new owner's first (median)",
        [r.unavailable_s for r in runs],
        s,
    )
    report.note(
        f"2 ({tag}): recovery {list_s([r.recovery_s for r in runs])} s; detection "
        f"{list_s([r.detection_s for r in runs])} s; total {list_s([r.total_s for r in runs])} s; unavailability "
        f"{list_s([r.unavailable_s for r in runs])} s; kills/targets "
        f"{', '.join(f'{r.victim}->{r.to_node}' for r in runs)} (failover_target picked "
        f"{', '.join(str(r.library_choice) for r in runs)}); DOWNLOADING bytes_moved "
        f"{', '.join(str(r.download_bytes) for r in runs)}; new owner's restore: "
        f"{restore_summary([r.restores for r in runs])}"
    )


# --- the benchmark ---------------------------------------------------------------------------------------


def bulk_load(cluster: Cluster, partition: int, prefix: str, keys: int, seed: int, timeout: float) -> float:
    """Append one event per key to `partition` and wait until it is committed; returns the seconds it took."""
    t0 = time.perf_counter()
    table = every_key_once(prefix, keys, seed)
    SourceLog(cluster.store, segment_events=250_000).append(partition, table)
    end = cluster.source.end_offset(partition)
    wait_until(lambda: cluster.committed(partition) >= end, timeout, f"partition {partition} to commit {end}", 0.2)
    return time.perf_counter() - t0


def graceful_series(
    cluster: Cluster, hist: History, kind: str, runs: int, *, warm_commits: int, timeout: float
) -> list[MigrationRun]:
    p = hist.partition
    group = WARM_NODES if kind == WARM else COLD_NODES
    out = []
    for i in range(runs):
        owner = cluster.owner(p)
        target = pick_target(cluster, {owner}, group)
        if kind == WARM:
            waited = wait_standby(cluster, target, p, timeout)
            progress(f"  node {target}'s standby of partition {p} caught up ({waited:.1f} s)")
        progress(f"  {kind} run {i + 1}/{runs}: partition {p} node {owner} -> {target}")
        out.append(graceful_run(cluster, hist, target, warm_commits=warm_commits, timeout=timeout))
        r = out[-1]
        progress(
            f"    unavailable {r.unavailable_s:.2f} s, launch->Active {r.total_s:.2f} s, "
            f"downloaded {size(r.download_bytes)}; {r.planned_detail}; {restore_summary([r.restores])}"
        )
    return out


def failover_series(
    cluster: Cluster, hist: History, kind: str, runs: int, *, timeout: float, last: bool = False
) -> list[FailoverRun]:
    """Kill the partition's owner `runs` times; `last`: no run follows this series (the final restart
    need not settle)."""
    p = hist.partition
    group = WARM_NODES if kind == WARM else COLD_NODES
    out: list[FailoverRun] = []
    for i in range(runs):
        victim = cluster.owner(p)
        if victim not in group:
            raise RuntimeError(f"partition {p} is on node {victim}, not on one of {group}")
        (other,) = [n for n in group if n != victim]
        if kind == WARM:
            waited = wait_standby(cluster, other, p, timeout)
            progress(f"  node {other}'s standby of partition {p} caught up ({waited:.1f} s)")
        progress(f"  {kind} run {i + 1}/{runs}: kill node {victim}")
        # Warm: whatever failover_target picks (the caught-up standby); cold: the other plain node.
        out.append(failover_run(cluster, hist, warm_commits=3, timeout=timeout, target=None if kind == WARM else other))
        f = out[-1]
        progress(
            f"    -> node {f.to_node}: recovery {f.recovery_s:.2f} s, detection {f.detection_s:.2f} s, "
            f"total {f.total_s:.2f} s, downloaded {size(f.download_bytes)}; {restore_summary([f.restores])}"
        )
        progress(f"  restarting node {victim}")
        revive(cluster, victim, settle=not (last and i == runs - 1))
    return out


def run(p: Params, report: Report, keep: str | None, only: Collection[str] = tuple(SECTIONS)) -> None:
    with contextlib.ExitStack() as stack:
        if keep:
            workdir = Path(keep)
            workdir.mkdir(parents=True, exist_ok=False)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="laminar-bench-migration-")))
        nodes = (*COLD_NODES, *WARM_NODES)
        progress(f"starting {len(nodes)} nodes")
        t0 = time.perf_counter()
        cluster = start_cluster(workdir, nodes, 2, per_node_args={n: STANDBY_ARGS for n in WARM_NODES})
        producers: list[Producer] = []
        try:
            cluster.wait_alive(*nodes, timeout=300)
            startup = time.perf_counter() - t0
            cluster.place({SMALL: COLD_NODES[0], BIG: COLD_NODES[1]})
            report.note(
                f"cluster: {len(nodes)} nodes up in {startup:.1f} s (Spark {SPARK_MASTER} each, driver memory "
                f"{DRIVER_MEMORY}); nodes {WARM_NODES[0]} and {WARM_NODES[1]} run with {' '.join(STANDBY_ARGS)}"
            )

            progress(f"seeding: {p.small_keys:,} keys into partition {SMALL}, {p.big_keys:,} into {BIG}")
            small_s = bulk_load(cluster, SMALL, "a", p.small_keys, 1, 300)
            big_s = bulk_load(cluster, BIG, "b", p.big_keys, 2, 1200)
            t1 = time.perf_counter()
            for n in WARM_NODES:
                wait_standby(cluster, n, BIG, 600)
            standby_s = time.perf_counter() - t1
            for n in nodes:
                wait_warmed_up(cluster, n)
            report.note(
                f"seeding (every key produced once, committed by the owner in batches of <= 1M events): "
                f"{p.small_keys:,} keys in {small_s:.1f} s, {p.big_keys:,} keys in {big_s:.1f} s; the standbys "
                f"had caught up {standby_s:.1f} s after the big partition's last seeding commit"
            )
            report.add(f"0. seeding the ~100 MB partition: {p.big_keys:,} keys produced once -> committed", s(big_s))
            sources = SourceLog(cluster.store, segment_events=20_000)
            producers.append(partition_load(sources, SMALL, "a", p.small_keys, *SMALL_LOAD, seed=11))
            producers.append(partition_load(sources, BIG, "b", p.big_keys, *BIG_LOAD, seed=13))

            small, big = History(cluster.store, SMALL), History(cluster.store, BIG)
            graceful: dict[str, list[MigrationRun]] = {}
            failover: dict[str, list[FailoverRun]] = {}
            # The ~1 MB partition ends its runs on a standby node, so killing a plain node (the cold
            # failovers) strands nothing there; it goes back to a plain node before the warm moves.
            if "small-cold" in only:
                progress("1. graceful, ~1 MB, cold (nodes 1 <-> 2)")
                graceful["small-cold"] = graceful_series(
                    cluster, small, COLD, p.graceful_runs, warm_commits=3, timeout=180
                )
            if "small-warm" in only:
                progress("1. graceful, ~1 MB, warm (to nodes 3, 4)")
                graceful["small-warm"] = graceful_series(
                    cluster, small, WARM, p.graceful_runs, warm_commits=3, timeout=180
                )
            if "big-cold" in only:
                progress("1. graceful, ~100 MB, cold (nodes 1 <-> 2)")
                graceful["big-cold"] = graceful_series(cluster, big, COLD, p.graceful_runs, warm_commits=2, timeout=300)
            if "failover-cold" in only:
                if cluster.owner(SMALL) in COLD_NODES:  # its own runs were left out: kill no owner of it
                    cluster.coordinator.run(PartitionId(SMALL), NodeId(WARM_NODES[0]))
                progress("2. failover, ~100 MB, cold (nodes 1 <-> 2)")
                failover["failover-cold"] = failover_series(
                    cluster,
                    big,
                    COLD,
                    p.failover_runs,
                    timeout=300,
                    last=[name for name in SECTIONS if name in only][-1] == "failover-cold",
                )
            # The small partition goes back to a plain node: the warm moves' targets then run nothing
            # else, like the cold moves' (whose small partition is on a standby node), and a killed
            # standby node strands nothing.
            if cluster.owner(SMALL) != COLD_NODES[0]:
                cluster.coordinator.run(PartitionId(SMALL), NodeId(COLD_NODES[0]))
            if "big-warm" in only:
                progress("1. graceful, ~100 MB, warm (to nodes 3, 4)")
                graceful["big-warm"] = graceful_series(cluster, big, WARM, p.graceful_runs, warm_commits=2, timeout=300)
            if "failover-warm" in only:
                progress("2. failover, ~100 MB, warm (nodes 3 <-> 4)")
                failover["failover-warm"] = failover_series(cluster, big, WARM, p.failover_runs, timeout=300, last=True)

            for name, runs in graceful.items():
                size_label, kind = SECTIONS[name]
                report_graceful(report, size_label, kind, runs)
            for name, fails in failover.items():
                size_label, kind = SECTIONS[name]
                report_failover(report, size_label, kind, fails)
            report.note(
                f"load during the runs: {SMALL_LOAD[0]:,} events every {SMALL_LOAD[1]} s on the ~1 MB partition's "
                f"keys and {BIG_LOAD[0]:,} events every {BIG_LOAD[1]} s on the ~100 MB partition's keys "
                f"({SMALL_LOAD[0] / SMALL_LOAD[1]:,.0f} events/s each), both all the time"
            )
            for prod in producers:
                prod.stop()
        except BaseException:
            progress("FAILED; node log tails:\n" + log_tails(cluster))
            raise
        finally:
            for prod in producers:
                with contextlib.suppress(Exception):
                    prod.stop()
            cluster.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="one run per figure, 500k keys as the big state")
    parser.add_argument("--big-keys", type=int, help="keys of the big partition (default 2.7M; quick 500k)")
    parser.add_argument("--keep", metavar="DIR", help="keep the work directory (store, node logs) here")
    parser.add_argument(
        "--only",
        type=lambda text: text.split(","),
        default=list(SECTIONS),
        metavar="SECTION[,SECTION]",
        help=f"run only these sections (default: all): {', '.join(SECTIONS)}",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only) - set(SECTIONS))
    if unknown:
        parser.error(f"--only: unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    p = QUICK if args.quick else FULL
    if args.big_keys:
        p = Params(p.graceful_runs, p.failover_runs, p.small_keys, args.big_keys)
    load_before = os.getloadavg()
    started = time.perf_counter()
    report = Report()
    run(p, report, args.keep, args.only)
    elapsed = time.perf_counter() - started
    report.note(
        f"setup: local file store (fsync on), nodes = `laminar node run` processes, heartbeat timeout "
        f"{HEARTBEAT_TIMEOUT_S:.0f} s / interval {HEARTBEAT_INTERVAL_S:.0f} s, {' '.join(NODE_ARGS)}; "
        "coordinator polls node records every 20 ms; timelines use wall-clock time.time() and the manifests' "
        "committed_at (same machine); each launch/kill happens at a uniformly random point (fixed seed) of the "
        "partition's commit interval, after >= 2-3 data commits under load; no run starts while a node runs its "
        "background Spark warm-up (up to 200 batches after it starts, at most half a core): the bench waits for "
        "it to end after the start and after each restart"
    )
    report.note(
        "a data commit = a manifest that names output; the seal (the new owner's takeover entry, no output) "
        "already fences the old owner but is not counted as data; unavailability includes the new owner's "
        "first batch (the events queued during the move)"
    )
    report.publish("laminar migration benchmark", args.quick, load_before, elapsed, "migration.txt")


if __name__ == "__main__":
    main()
