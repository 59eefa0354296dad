"""Migration benchmarks: graceful migration and forced failover on a live local cluster.

Run from the repository root::

    python -m benchmarks.bench_migration           # full: 3 runs per figure
    python -m benchmarks.bench_migration --quick   # 2/1/1 runs
    python -m benchmarks.bench_migration --keep DIR   # keep the store and node logs

Time is dominated by starting 3 Spark JVMs and building the ~100 MB state: roughly
5 min full / 3 min quick on an idle 2-CPU machine, about twice that under heavy load.

One `Cluster` (3 node processes, Spark ``local[1]`` each, one local file store,
heartbeat timeout 3 s, heartbeat every 1 s, guard refresh every 0.5 s, a state
checkpoint every 3 batches) serves every run, so Spark starts only once per node.
Load keeps running on the measured partition (a producer thread appends events
every 0.25-0.5 s), so both the old and the new owner have data commits to time.

Figures (each printed next to its target, with whether it was met; nothing asserts):

1. Graceful migration of a partition holding ~1 MB and ~100 MB of state (many
   distinct keys; the size is the final checkpoint the phases report as
   ``bytes_moved``): the wall time of `MigrationCoordinator.run` (launch ->
   Active), each phase's duration (its `on_phase` reports), and the partition's
   unavailability window: the old owner's last data commit -> the new owner's
   first data commit, both read from ``committed_at`` of the manifest history
   (a data commit is a manifest that names output).
2. Forced failover after SIGKILL of the owner (its whole process tree: Python
   and its Spark JVM): detection (kill -> the ledger sees the node dead, i.e. its
   heartbeat is older than the timeout; polled every 20 ms), recovery (forced
   `MigrationCoordinator.run` launched at once -> the new owner's first data
   commit), their sum (kill -> first data commit elsewhere), and the
   unavailability window as in 1. A killed node stays dead until a run needs a survivor
   (then the first one killed is restarted and takes back the partitions it still owned).

The table is also written to ``benchmarks/results/migration.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import platform
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ledger import parse_record
from laminar_orchestration.localcluster import HEARTBEAT_TIMEOUT_S, Cluster, wait_until
from laminar_orchestration.manifest import ManifestReader, PartitionManifest, manifest_history_key
from laminar_orchestration.migration import FORCED_PHASES, GRACEFUL_PHASES, MigrationPhase, PhaseReport
from laminar_orchestration.source import SourceLog
from laminar_orchestration.store import ObjectStore

from .common import Row, format_table, median, progress, verdict, write_result

MB = 1_000_000
HEARTBEAT_INTERVAL_S = 1.0  # NodeConfig default; `laminar node run` has no flag for it
NODE_ARGS = ("--refresh-interval", "0.5", "--checkpoint-every-batches", "3")  # as the tests' cluster
SPARK_MASTER = "local[1]"
DRIVER_MEMORY = "2g"  # a 100 MB (zstd) state is ~3M rows; 1g is tight for toArrow of it

# Targets (seed 003).
GRACEFUL_TARGET_S = 5.0  # graceful migration, state < 100 MB
FAILOVER_TARGET_S = 15.0  # forced migration 5-15 s
FAILOVER_TARGET_TEXT = "5-15 s"

#: Partitions of the benchmark cluster.
SMALL, BIG, FAILOVER = 0, 1, 2
LOCAL = "local"


@dataclass(frozen=True)
class Params:
    small_runs: int
    big_runs: int
    failover_runs: int
    #: Distinct keys of the ~1 MB / ~100 MB states (~35-44 bytes per key in zstd parquet).
    small_keys: int = 25_000
    big_keys: int = 2_700_000


FULL = Params(small_runs=3, big_runs=3, failover_runs=3)
QUICK = Params(small_runs=2, big_runs=1, failover_runs=1)


# --- processes ----------------------------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # "pid (comm) state ppid ..."; comm may contain spaces and parentheses.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def signal_tree(pid: int, sig: signal.Signals) -> None:
    """Send `sig` to `pid` and every descendant (the node's Python process and its Spark JVM)."""
    for p in process_tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def kill_node(cluster: Cluster, node_id: int) -> float:
    """SIGKILL a node's whole process tree; returns the wall-clock time of the kill."""
    node = cluster.nodes[node_id]
    tree = process_tree(node.proc.pid)
    t_kill = time.time()
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    node.proc.wait(30)
    return t_kill


# --- load -----------------------------------------------------------------------------------------------


def keyed_events(prefix: str, n_keys: int, count: int, rng: np.random.Generator) -> pa.Table:
    """`count` events on keys ``{prefix}{i}``, i uniform in [0, n_keys), values uniform in [0, 100)."""
    idx = rng.integers(0, n_keys, size=count)
    keys = np.char.add(prefix, idx.astype(str))
    return pa.table(
        {
            "key": pa.array(keys.tolist(), pa.string()),
            "value": pa.array(rng.random(count) * 100.0),
            "ts": pa.array(np.full(count, 1_700_000_000_000, dtype=np.int64)),
        }
    )


def every_key_once(prefix: str, n_keys: int, seed: int) -> pa.Table:
    """One event per key ``{prefix}0..{prefix}{n_keys-1}`` (builds a state of exactly `n_keys` rows)."""
    rng = np.random.default_rng(seed)
    keys = np.char.add(prefix, np.arange(n_keys).astype(str))
    return pa.table(
        {
            "key": pa.array(keys.tolist(), pa.string()),
            "value": pa.array(rng.random(n_keys) * 100.0),
            "ts": pa.array(np.full(n_keys, 1_700_000_000_000, dtype=np.int64)),
        }
    )


class Producer(threading.Thread):
    """Calls `sink(make())` every `interval_s` until stopped; keeps what it produced."""

    def __init__(self, make: Callable[[], pa.Table], sink: Callable[[pa.Table], None], interval_s: float) -> None:
        super().__init__(name="producer", daemon=True)
        self._make = make
        self._sink = sink
        self._interval_s = interval_s
        self._stop_event = threading.Event()
        self.tables: list[pa.Table] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self._stop_event.wait(self._interval_s):
                table = self._make()
                self._sink(table)
                self.tables.append(table)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)
        if self.error is not None:
            raise RuntimeError(f"producer failed: {self.error}") from self.error


def partition_load(
    source: SourceLog, partition: int, prefix: str, n_keys: int, events: int, interval_s: float, seed: int
) -> Producer:
    rng = np.random.default_rng(seed)
    producer = Producer(
        lambda: keyed_events(prefix, n_keys, events, rng), lambda t: _append(source, partition, t), interval_s
    )
    producer.start()
    return producer


def _append(source: SourceLog, partition: int, table: pa.Table) -> None:
    source.append(partition, table)


# --- manifest history -------------------------------------------------------------------------------------


def is_data(m: PartitionManifest) -> bool:
    """A data commit: a manifest naming output (not a takeover or checkpoint-only manifest)."""
    return bool(m.outputs)


def ts(m: PartitionManifest) -> float:
    return m.committed_at.timestamp()


class History:
    """Reads (and caches) a partition's immutable manifest history entries by key."""

    def __init__(self, store: ObjectStore, partition: int) -> None:
        self._store = store
        self.partition = partition
        self._reader = ManifestReader(store)
        self._cache: dict[int, PartitionManifest] = {}

    def entry(self, seq: int) -> PartitionManifest | None:
        cached = self._cache.get(seq)
        if cached is not None:
            return cached
        key = manifest_history_key(self.partition, seq)
        obj = self._store.get_or_none(key)
        if obj is None:
            return None
        m = parse_record(key, obj.data, PartitionManifest)
        self._cache[seq] = m
        return m

    def head_seq(self) -> int:
        cur = self._reader.current(PartitionId(self.partition))
        return cur.manifest.seq if cur else 0

    def since(self, seq: int) -> list[PartitionManifest]:
        out = []
        while (m := self.entry(seq)) is not None:
            out.append(m)
            seq += 1
        return out

    def last_data(self, epoch: int, before_seq: int) -> PartitionManifest | None:
        """The newest data commit at `epoch` with seq < `before_seq`."""
        for seq in range(before_seq - 1, 0, -1):
            m = self.entry(seq)
            if m is not None and m.fencing_token == epoch and is_data(m):
                return m
            if m is not None and m.fencing_token < epoch:
                return None
        return None

    def wait_data(self, epoch: int, since_seq: int, count: int, timeout: float) -> list[PartitionManifest]:
        """Wait for `count` data commits at `epoch` with seq >= `since_seq`; return them."""
        found: list[PartitionManifest] = []

        def enough() -> bool:
            found[:] = [m for m in self.since(since_seq) if m.fencing_token == epoch and is_data(m)]
            return len(found) >= count

        wait_until(enough, timeout, f"{count} data commit(s) at epoch {epoch} of partition {self.partition}", 0.02)
        return found


def gaps(commits: Sequence[PartitionManifest]) -> list[float]:
    return [ts(b) - ts(a) for a, b in itertools.pairwise(commits)]


#: When, within a batch interval, a move or a kill happens: uniform, from a fixed seed (reproducible).
_ARRIVALS = np.random.default_rng(20_261_122)


def random_instant(intervals: Sequence[float]) -> float:
    """Sleep a uniform fraction of the median interval (so the event lands anywhere in a batch); return it."""
    delay = float(_ARRIVALS.uniform(0.0, median(intervals))) if intervals else 0.0
    time.sleep(delay)
    return delay


# --- cluster helpers --------------------------------------------------------------------------------------


def alive_nodes(cluster: Cluster) -> set[int]:
    return {int(v.record.node) for v in cluster.ledger.nodes() if v.alive}


def pick_target(cluster: Cluster, exclude: set[int]) -> int:
    """The live node outside `exclude` that owns the fewest partitions (lowest id on ties)."""
    alive = sorted(alive_nodes(cluster) - exclude)
    if not alive:
        raise RuntimeError(f"no live node outside {sorted(exclude)}")
    return min(alive, key=lambda n: (len(cluster.partitions_of(n)), n))


def wait_dead(cluster: Cluster, node_id: int, timeout: float) -> float:
    """Poll the ledger every 20 ms until `node_id` is seen dead; return that wall-clock time."""
    wait_until(
        lambda: not any(v.alive for v in cluster.ledger.nodes() if int(v.record.node) == node_id),
        timeout,
        f"node {node_id} to be seen dead",
        interval=0.02,
    )
    return time.time()


def start_cluster(workdir: Path, nodes: Sequence[int], partitions: int) -> Cluster:
    cluster = Cluster(
        (workdir / "store").as_uri(),
        workdir,
        partitions=partitions,
        env={"LAMINAR_SPARK_DRIVER_MEMORY": DRIVER_MEMORY},
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        spark_master=SPARK_MASTER,
        node_args=NODE_ARGS,
    )
    for n in nodes:
        cluster.start_node(n)
    return cluster


def log_tails(cluster: Cluster, chars: int = 2500) -> str:
    return "\n".join(f"--- node {n} ({node.log_path}) ---\n{node.log()[-chars:]}" for n, node in cluster.nodes.items())


# --- one graceful migration -----------------------------------------------------------------------------


@dataclass
class MigrationRun:
    from_node: int
    to_node: int
    total_s: float
    phases: dict[MigrationPhase, float]
    bytes_moved: int
    #: Old owner's last data commit -> new owner's first data commit (manifest committed_at).
    unavailable_s: float
    #: Old owner's last data commit -> the migration's launch (negative: it committed after the launch).
    last_commit_before_launch_s: float
    #: New owner's takeover manifest -> its first data commit.
    takeover_to_data_s: float
    #: Launch -> the new owner's first data commit.
    launch_to_first_data_s: float
    #: Data commit -> launch: a random fraction of the commit interval.
    launch_delay_s: float = 0.0
    #: Gaps between the old owner's consecutive data commits just before the migration.
    normal_gaps: list[float] = field(default_factory=list)


def graceful_run(cluster: Cluster, hist: History, target: int, *, warm_commits: int, timeout: float) -> MigrationRun:
    """Migrate `hist.partition` to `target` under load; time it from the manifests and phase reports."""
    p = hist.partition
    old_epoch, old_owner = cluster.epoch(p), cluster.owner(p)
    start_seq = hist.head_seq() + 1
    delay = random_instant(gaps(hist.wait_data(old_epoch, start_seq, warm_commits, timeout)))
    reports: list[PhaseReport] = []
    launched = time.time()
    t0 = time.perf_counter()
    task = cluster.coordinator.run(PartitionId(p), NodeId(target), on_phase=reports.append)
    total = time.perf_counter() - t0
    if task.phase != MigrationPhase.ACTIVE:
        raise RuntimeError(f"migration ended in {task.phase}: {task.error}")
    new_epoch = cluster.epoch(p)
    first_new = hist.wait_data(new_epoch, start_seq, 1, timeout)[0]
    entries = hist.since(start_seq)
    old_data = [m for m in entries if m.fencing_token == old_epoch and is_data(m)]
    last_old = old_data[-1]
    takeover = next(m for m in entries if m.fencing_token == new_epoch)
    if takeover.note != "takeover":
        raise RuntimeError(f"the new owner's first manifest is {takeover.note!r}, not a takeover")
    return MigrationRun(
        from_node=old_owner,
        to_node=target,
        total_s=total,
        phases={r.phase: r.duration_s for r in reports},
        bytes_moved=max((r.bytes_moved for r in reports), default=0),
        unavailable_s=ts(first_new) - ts(last_old),
        last_commit_before_launch_s=launched - ts(last_old),
        takeover_to_data_s=ts(first_new) - ts(takeover),
        launch_to_first_data_s=ts(first_new) - launched,
        launch_delay_s=delay,
        normal_gaps=gaps(old_data[-4:]),
    )


# --- one forced failover ----------------------------------------------------------------------------------


@dataclass
class FailoverRun:
    victim: int
    to_node: int
    detection_s: float
    recovery_s: float
    run_s: float
    phases: dict[MigrationPhase, float]
    launch_to_takeover_s: float
    total_s: float
    unavailable_s: float
    #: Events the new owner replayed or re-processed: committed offset at the kill vs. the checkpoint it restored.
    replayed_events: int
    #: Data commit -> kill: a random fraction of the commit interval.
    kill_delay_s: float = 0.0


def failover_run(
    cluster: Cluster,
    hist: History,
    *,
    warm_commits: int,
    timeout: float,
    target: int | None = None,
) -> FailoverRun:
    """SIGKILL the owner of `hist.partition`, detect it, fail over (forced), time it. The victim stays dead."""
    p = hist.partition
    victim, old_epoch = cluster.owner(p), cluster.epoch(p)
    start_seq = hist.head_seq() + 1
    delay = random_instant(gaps(hist.wait_data(old_epoch, start_seq, warm_commits, timeout)))
    to_node = target if target is not None else pick_target(cluster, {victim})
    t_kill = kill_node(cluster, victim)
    t_dead = wait_dead(cluster, victim, HEARTBEAT_TIMEOUT_S + 15)
    reports: list[PhaseReport] = []
    t_launch = time.time()
    task = cluster.coordinator.run(PartitionId(p), NodeId(to_node), forced=True, on_phase=reports.append)
    t_active = time.time()
    if task.phase != MigrationPhase.ACTIVE:
        raise RuntimeError(f"failover ended in {task.phase}: {task.error}")
    new_epoch = cluster.epoch(p)
    first_new = hist.wait_data(new_epoch, start_seq, 1, timeout)[0]
    entries = hist.since(start_seq)
    last_old = [m for m in entries if m.fencing_token == old_epoch and is_data(m)][-1]
    takeover = next(m for m in entries if m.fencing_token == new_epoch)
    run = FailoverRun(
        victim=victim,
        to_node=to_node,
        detection_s=t_dead - t_kill,
        recovery_s=ts(first_new) - t_launch,
        run_s=t_active - t_launch,
        phases={r.phase: r.duration_s for r in reports},
        launch_to_takeover_s=ts(takeover) - t_launch,
        total_s=ts(first_new) - t_kill,
        unavailable_s=ts(first_new) - ts(last_old),
        replayed_events=takeover.source_offset - takeover.state_offset,
        kill_delay_s=delay,
    )
    return run


def revive(cluster: Cluster, node: int) -> None:
    """Restart a killed node and wait until it has taken back the partitions it was left owning."""
    stranded = {q: cluster.epoch(q) for q in cluster.partitions_of(node)}
    cluster.start_node(node)
    cluster.wait_alive(node, timeout=300)
    # The restarted node re-fences them (a new epoch), restores them and resumes.
    wait_until(
        lambda: all(cluster.epoch(q) > e for q, e in stranded.items()),
        180,
        f"node {node} to take back partitions {sorted(stranded)}",
    )


# --- the report ----------------------------------------------------------------------------------------


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, figure: str, value: str, target: str = "-", verdict_: str = "info") -> None:
        self.rows.append(Row(figure, LOCAL, value, target, verdict_))

    def note(self, text: str) -> None:
        self.notes.append(text)


def s(seconds: float) -> str:
    return f"{seconds:.2f} s"


def list_s(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def size(n: float) -> str:
    return f"{n / MB:.1f} MB"


def report_graceful(report: Report, label: str, runs: Sequence[MigrationRun]) -> None:
    n = len(runs)
    moved = median([r.bytes_moved for r in runs])
    total = median([r.total_s for r in runs])
    unavail = median([r.unavailable_s for r in runs])
    report.add(
        f"1. graceful migration {label} state ({size(moved)} moved): launch -> Active (median of {n})",
        s(total),
        f"<= {GRACEFUL_TARGET_S:.0f} s",
        verdict(total, GRACEFUL_TARGET_S),
    )
    for phase in GRACEFUL_PHASES:
        values = [r.phases.get(phase, 0.0) for r in runs]
        report.add(f"1.   phase {phase.value} (median)", s(median(values)))
    report.add(
        f"1. unavailability {label}: old owner's last data commit -> new owner's first (median of {n})",
        s(unavail),
        f"<= {GRACEFUL_TARGET_S:.0f} s",
        verdict(unavail, GRACEFUL_TARGET_S),
    )
    report.add(
        f"1.   = old owner's last data commit -> launch (random point of a batch; {label}, median)",
        s(median([r.last_commit_before_launch_s for r in runs])),
    )
    report.add(
        f"1.   + launch -> new owner's first data commit ({label}, median)",
        s(median([r.launch_to_first_data_s for r in runs])),
    )
    report.add(
        f"1.     of which: takeover manifest -> first data commit, i.e. its first batch ({label}, median)",
        s(median([r.takeover_to_data_s for r in runs])),
    )
    all_gaps = [g for r in runs for g in r.normal_gaps]
    if all_gaps:
        report.add(
            f"1.   for scale: gap between data commits under load, no migration ({label}, median)", s(median(all_gaps))
        )
    report.note(
        f"1 ({label}): launch -> Active {list_s([r.total_s for r in runs])} s; unavailability "
        f"{list_s([r.unavailable_s for r in runs])} s; old owner's last data commit was "
        f"{list_s([r.last_commit_before_launch_s for r in runs])} s before the launch; "
        f"moves {', '.join(f'{r.from_node}->{r.to_node}' for r in runs)}; bytes_moved "
        f"{', '.join(str(r.bytes_moved) for r in runs)}"
    )


def report_failover(report: Report, runs: Sequence[FailoverRun]) -> None:
    n = len(runs)
    total = median([r.total_s for r in runs])
    report.add(
        f"2. failover detection: SIGKILL -> ledger sees the node dead (timeout {HEARTBEAT_TIMEOUT_S:.0f} s; "
        f"median of {n})",
        s(median([r.detection_s for r in runs])),
    )
    report.add(
        f"2. failover recovery: forced launch -> new owner's first data commit (median of {n})",
        s(median([r.recovery_s for r in runs])),
    )
    report.add(
        "2.   of which: forced MigrationCoordinator.run, launch -> Active (median)", s(median([r.run_s for r in runs]))
    )
    for phase in FORCED_PHASES:
        values = [r.phases.get(phase, 0.0) for r in runs]
        report.add(f"2.     phase {phase.value} (median)", s(median(values)))
    report.add("2.   of which: launch -> takeover manifest (median)", s(median([r.launch_to_takeover_s for r in runs])))
    report.add(
        f"2. failover total: SIGKILL -> first data commit elsewhere (median of {n})",
        s(total),
        FAILOVER_TARGET_TEXT,
        verdict(total, FAILOVER_TARGET_S),
    )
    report.add(
        "2. failover unavailability: old owner's last data commit -> new owner's first (median)",
        s(median([r.unavailable_s for r in runs])),
    )
    report.note(
        f"2: detection {list_s([r.detection_s for r in runs])} s; recovery {list_s([r.recovery_s for r in runs])} s; "
        f"total {list_s([r.total_s for r in runs])} s; unavailability {list_s([r.unavailable_s for r in runs])} s; "
        f"events replayed from the last checkpoint {', '.join(str(r.replayed_events) for r in runs)}; "
        f"kills/targets {', '.join(f'{r.victim}->{r.to_node}' for r in runs)}"
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
    cluster: Cluster, partition: int, runs: int, *, warm_commits: int, timeout: float
) -> list[MigrationRun]:
    hist = History(cluster.store, partition)
    out = []
    for i in range(runs):
        target = pick_target(cluster, {cluster.owner(partition)})
        progress(f"  run {i + 1}/{runs}: partition {partition} node {cluster.owner(partition)} -> {target}")
        out.append(graceful_run(cluster, hist, target, warm_commits=warm_commits, timeout=timeout))
        progress(
            f"    launch->Active {out[-1].total_s:.2f} s, unavailable {out[-1].unavailable_s:.2f} s, "
            f"{size(out[-1].bytes_moved)}"
        )
    return out


def run(p: Params, report: Report, keep: str | None) -> None:
    with contextlib.ExitStack() as stack:
        if keep:
            workdir = Path(keep)
            workdir.mkdir(parents=True, exist_ok=False)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="laminar-bench-migration-")))
        progress("starting 3 nodes")
        t0 = time.perf_counter()
        cluster = start_cluster(workdir, (1, 2, 3), partitions=3)
        try:
            cluster.wait_alive(1, 2, 3, timeout=300)
            startup = time.perf_counter() - t0
            cluster.place({SMALL: 1, BIG: 2, FAILOVER: 3})
            report.note(
                f"cluster: 3 nodes up in {startup:.1f} s (Spark {SPARK_MASTER} each, driver memory "
                f"{DRIVER_MEMORY}); partitions placed {SMALL}->1, {BIG}->2, {FAILOVER}->3"
            )

            # 1. ~1 MB
            progress(f"1. graceful, ~1 MB: bulk load of {p.small_keys:,} keys")
            load_s = bulk_load(cluster, SMALL, "a", p.small_keys, 1, 120)
            load = partition_load(cluster.source, SMALL, "a", p.small_keys, 1_000, 0.25, seed=11)
            try:
                small = graceful_series(cluster, SMALL, p.small_runs, warm_commits=3, timeout=120)
            finally:
                load.stop()
            report_graceful(report, "~1 MB", small)
            report.note(
                f"1 (~1 MB): {p.small_keys:,} keys loaded in {load_s:.1f} s; load during the runs: 1,000 "
                "events every 0.25 s on those keys"
            )

            # 1. ~100 MB
            progress(f"1. graceful, ~100 MB: bulk load of {p.big_keys:,} keys into partition {BIG}")
            load_s = bulk_load(cluster, BIG, "b", p.big_keys, 2, 600)
            load = partition_load(cluster.source, BIG, "b", p.big_keys, 2_000, 0.5, seed=13)
            try:
                big = graceful_series(cluster, BIG, p.big_runs, warm_commits=2, timeout=180)
            finally:
                load.stop()
            report_graceful(report, "~100 MB", big)
            report.note(
                f"1 (~100 MB): {p.big_keys:,} keys loaded in {load_s:.1f} s (batches of <= 1M events); "
                "load during the runs: 2,000 events every 0.5 s on those keys"
            )

            # 2. failover (after the ~100 MB runs: a killed node may leave partitions behind)
            progress("2. failover")
            hist = History(cluster.store, FAILOVER)
            load = partition_load(cluster.source, FAILOVER, "c", 1_000, 1_000, 0.25, seed=12)
            failovers: list[FailoverRun] = []
            dead: list[int] = []
            try:
                for i in range(p.failover_runs):
                    if len(alive_nodes(cluster)) < 2:
                        node = dead.pop(0)
                        progress(f"  restarting node {node} (a failover needs a survivor)")
                        revive(cluster, node)
                        report.note(f"2: node {node} restarted before failover run {i + 1}")
                    victim = cluster.owner(FAILOVER)
                    progress(f"  run {i + 1}/{p.failover_runs}: kill node {victim}")
                    failovers.append(failover_run(cluster, hist, warm_commits=3, timeout=120))
                    dead.append(victim)
                    f = failovers[-1]
                    progress(
                        f"    detection {f.detection_s:.2f} s, recovery {f.recovery_s:.2f} s, total {f.total_s:.2f} s"
                    )
            finally:
                load.stop()
            report_failover(report, failovers)
        except BaseException:
            progress("FAILED; node log tails:\n" + log_tails(cluster))
            raise
        finally:
            cluster.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (~3 minutes)")
    parser.add_argument("--keep", metavar="DIR", help="keep the work directory (store, node logs) here")
    args = parser.parse_args(argv)
    p = QUICK if args.quick else FULL
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    report = Report()
    run(p, report, args.keep)
    elapsed = time.perf_counter() - started
    report.note(
        f"setup: local file store (fsync on), nodes = `laminar node run` processes, heartbeat timeout "
        f"{HEARTBEAT_TIMEOUT_S:.0f} s / interval {HEARTBEAT_INTERVAL_S:.0f} s, {' '.join(NODE_ARGS)}; "
        "coordinator polls node records every 20 ms; timelines use wall-clock time.time() and the manifests' "
        "committed_at (same machine); each launch/kill happens at a uniformly random point (fixed seed) of the "
        "partition's commit interval, after >= 2-3 data commits under load"
    )
    report.note(
        "a data commit = a manifest that names output; the takeover manifest (first of a new owner, no output) "
        "already fences the old owner but is not counted as data; unavailability includes the new owner's "
        "first batch (Spark folds the events queued during the move into the whole state)"
    )
    title = (
        f"laminar migration benchmark ({'quick' if args.quick else 'full'}), "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%SZ')}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"1-min load average {load_before:.1f} before / {os.getloadavg()[0]:.1f} after"
    )
    text = format_table(report.rows, title, report.notes) + f"\ntotal benchmark time: {elapsed:.1f} s"
    print(text, flush=True)
    progress(f"written to {write_result('migration.txt', text)}")


if __name__ == "__main__":
    main()
