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
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from laminar_dev.localcluster import HEARTBEAT_TIMEOUT_S, Cluster, wait_until
from laminar_orchestration.control.placement import failover_target
from laminar_orchestration.control.snapshot import warm_copies
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.keys import manifest_history_key
from laminar_orchestration.protocol.manifest import PartitionManifest
from laminar_orchestration.protocol.records import parse_record
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import FORCED_PHASES, GRACEFUL_PHASES, MigrationPhase, PhaseReport
from laminar_orchestration.store import ObjectStore

from .common import Row, TableReport, median, progress, verdict

MB = 1_000_000
#: What a node logs when its background Spark warm-up has ended (`SparkBatchEngine.keep_warming`).
WARM_UP_ENDED = "spark warm-up: "
HEARTBEAT_INTERVAL_S = 1.0  # NodeConfig default; `laminar node run` has no flag for it
#: The load on each measured partition, (events, every seconds): a steady stream of small appends.
#: Arriving in bursts a batch interval apart would put that interval into every unavailability
#: figure (the new owner's first commit cannot come before the next burst), whatever the handoff.
SMALL_LOAD = (100, 0.025)
BIG_LOAD = (200, 0.05)
NODE_ARGS = ("--refresh-interval", "0.5", "--checkpoint-every-batches", "3", "--log-level", "debug")
SPARK_MASTER = "local[1]"
DRIVER_MEMORY = "2g"

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
    """A data commit: a manifest naming output (not a seal or a snapshot-only manifest)."""
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


def pick_target(cluster: Cluster, exclude: set[int], among: Sequence[int] | None = None) -> int:
    """The live node outside `exclude` (and inside `among`) that owns the fewest partitions (lowest id on ties)."""
    alive = sorted((alive_nodes(cluster) - exclude) & set(among if among is not None else alive_nodes(cluster)))
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


def start_cluster(
    workdir: Path,
    nodes: Sequence[int],
    partitions: int,
    *,
    per_node_args: Mapping[int, tuple[str, ...]] | None = None,
) -> Cluster:
    cluster = Cluster(
        (workdir / "store").as_uri(),
        workdir,
        partitions=partitions,
        env={"LAMINAR_SPARK_DRIVER_MEMORY": DRIVER_MEMORY},
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        spark_master=SPARK_MASTER,
        node_args=NODE_ARGS,
        per_node_args=per_node_args,
    )
    for n in nodes:
        cluster.start_node(n)
    return cluster


def log_tails(cluster: Cluster, chars: int = 2500) -> str:
    return "\n".join(f"--- node {n} ({node.log_path}) ---\n{node.log()[-chars:]}" for n, node in cluster.nodes.items())


# --- node logs: the new owner's restore --------------------------------------------------------------------

_RESTORED = re.compile(r"partition (\d+) restored to offset (\d+) \(([^,]+), (\d+) bytes, (\d+) deltas, (\d+) ms\)")


@dataclass(frozen=True)
class Restore:
    """One "restored to offset" line of a node's log."""

    how: str
    bytes: int
    deltas: int
    ms: int

    def text(self) -> str:
        return f"{self.how}: {self.bytes / MB:.2f} MB, {self.deltas} deltas, {self.ms} ms"


_COMMITTED = re.compile(
    r"partition (\d+) committed \[(\d+), (\d+)\): \d+ events: stage (\d+) ms, spark (\d+) ms \(waited (\d+)\), "
    r"merge (\d+) ms \(read (\d+)\), output (\d+) ms, delta (\d+) ms, publish (\d+) ms, apply (\d+) ms"
)


@dataclass(frozen=True)
class BatchLine:
    """One committed batch's timings from a node's debug log (`runtime.BatchTimings`)."""

    events: int
    spark_ms: int
    waited_ms: int
    #: The node's own work after Spark: merge (of which the local store's read), output, delta,
    #: publish and local apply.
    merge_ms: int
    read_ms: int
    output_ms: int
    delta_ms: int
    publish_ms: int
    apply_ms: int

    @property
    def commit_ms(self) -> int:
        return self.merge_ms + self.output_ms + self.delta_ms + self.publish_ms + self.apply_ms


def committed_batches(cluster: Cluster, node: int, mark: int, partition: int) -> list[BatchLine]:
    out = []
    for m in _COMMITTED.finditer(cluster.nodes[node].log()[mark:]):
        if int(m.group(1)) == partition:
            g = [int(x) for x in m.groups()]
            out.append(BatchLine(g[2] - g[1], g[4], g[5], *g[6:12]))
    return out


def first_batch(cluster: Cluster, node: int, mark: int, partition: int) -> BatchLine | None:
    """The new owner's first committed batch after `mark` (its log line follows the commit by a few ms)."""
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: bool(committed_batches(cluster, node, mark, partition)), 5.0, "first batch line", 0.05)
    found = committed_batches(cluster, node, mark, partition)
    return found[0] if found else None


def log_mark(cluster: Cluster, node: int) -> int:
    """Where the node's current log ends (restore lines are read after it)."""
    return len(cluster.nodes[node].log())


def restores(cluster: Cluster, node: int, mark: int, partition: int) -> list[Restore]:
    out = []
    for m in _RESTORED.finditer(cluster.nodes[node].log()[mark:]):
        if int(m.group(1)) == partition:
            out.append(Restore(m.group(3), int(m.group(4)), int(m.group(5)), int(m.group(6))))
    return out


# --- warm standbys ----------------------------------------------------------------------------------------


def standby_offset(cluster: Cluster, node: int, partition: int) -> int | None:
    """The offset a node's warm standby copy of `partition` reflects (None: it reports none, or an error)."""
    record = cluster.ledger.node(NodeId(node))
    pr = record.partitions.get(partition) if record else None
    if pr is None or pr.state != "standby" or pr.error is not None or pr.lag is None:
        return None
    return pr.source_offset


def wait_standby(cluster: Cluster, node: int, partition: int, timeout: float) -> float:
    """Wait until `node`'s standby copy of `partition` reflects what was committed when the wait began."""
    t0 = time.perf_counter()
    goal = cluster.committed(partition)

    def caught_up() -> bool:
        if cluster.nodes[node].proc.poll() is not None:
            raise RuntimeError(f"node {node} exited:\n{cluster.nodes[node].log()[-3000:]}")
        offset = standby_offset(cluster, node, partition)
        return offset is not None and offset >= goal

    wait_until(caught_up, timeout, f"node {node}'s standby copy of partition {partition} to reach {goal}", 0.05)
    return time.perf_counter() - t0


# --- one graceful migration -----------------------------------------------------------------------------


@dataclass
class MigrationRun:
    from_node: int
    to_node: int
    total_s: float
    phases: dict[MigrationPhase, float]
    #: The DOWNLOADING phase's bytes_moved: checkpoint bytes the handoff itself transferred.
    download_bytes: int
    #: The PLANNED phase's bytes_moved: what the target's warm-up downloaded before the old owner drained.
    planned_bytes: int
    #: The PLANNED phase's report (how warm the target was when the old owner was asked to drain).
    planned_detail: str
    restores: list[Restore]
    #: Old owner's last data commit -> new owner's first data commit (manifest committed_at).
    unavailable_s: float
    #: Old owner's last data commit -> the migration's launch (negative: it committed after the launch).
    last_commit_before_launch_s: float
    #: The seal (the new owner's takeover entry) -> its first data commit.
    seal_to_data_s: float
    #: Launch -> the new owner's first data commit.
    launch_to_first_data_s: float
    #: Old owner's last data commit -> the seal.
    last_data_to_seal_s: float
    #: Gaps between the old owner's consecutive data commits just before the migration.
    normal_gaps: list[float] = field(default_factory=list)
    #: The new owner's first batch, from its log.
    first_batch: BatchLine | None = None


def graceful_run(cluster: Cluster, hist: History, target: int, *, warm_commits: int, timeout: float) -> MigrationRun:
    """Migrate `hist.partition` to `target` under load; time it from the manifests and phase reports."""
    p = hist.partition
    old_epoch, old_owner = cluster.epoch(p), cluster.owner(p)
    start_seq = hist.head_seq() + 1
    random_instant(gaps(hist.wait_data(old_epoch, start_seq, warm_commits, timeout)))
    mark = log_mark(cluster, target)
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
    seal = next(m for m in entries if m.fencing_token == new_epoch)
    if not seal.is_seal:
        raise RuntimeError(f"the new owner's first manifest is {seal.note!r}, not a seal")
    by_phase = {r.phase: r for r in reports}
    planned = by_phase.get(MigrationPhase.PLANNED)
    download = by_phase.get(MigrationPhase.DOWNLOADING)
    return MigrationRun(
        from_node=old_owner,
        to_node=target,
        total_s=total,
        phases={r.phase: r.duration_s for r in reports},
        download_bytes=download.bytes_moved if download else 0,
        planned_bytes=planned.bytes_moved if planned else 0,
        planned_detail=planned.detail if planned else "-",
        restores=restores(cluster, target, mark, p),
        first_batch=first_batch(cluster, target, mark, p),
        unavailable_s=ts(first_new) - ts(last_old),
        last_commit_before_launch_s=launched - ts(last_old),
        seal_to_data_s=ts(first_new) - ts(seal),
        launch_to_first_data_s=ts(first_new) - launched,
        last_data_to_seal_s=ts(seal) - ts(last_old),
        normal_gaps=gaps(old_data[-4:]),
    )


# --- one forced failover ----------------------------------------------------------------------------------


@dataclass
class FailoverRun:
    victim: int
    to_node: int
    #: What `assignment.failover_target` picks among the live nodes (the CLI, the sensor).
    library_choice: int | None
    detection_s: float
    recovery_s: float
    run_s: float
    phases: dict[MigrationPhase, float]
    download_bytes: int
    restores: list[Restore]
    launch_to_seal_s: float
    total_s: float
    unavailable_s: float
    #: Events after the committed offset at the seal that the new owner had to process first.
    seal_offset: int = 0
    #: Data commit -> kill: a random fraction of the commit interval.
    kill_delay_s: float = 0.0
    #: The new owner's first batch, from its log.
    first_batch: BatchLine | None = None


def library_failover_choice(cluster: Cluster, partition: int, victim: int) -> int | None:
    views = cluster.ledger.nodes()
    loads = {int(v.record.node): 0 for v in views if v.alive and int(v.record.node) != victim}
    for q in cluster.partitions:
        owner = cluster.owner(q)
        if owner in loads:
            loads[owner] += 1
    return failover_target(loads, warm=warm_copies(views).get(partition, {}), exclude={victim})


def failover_run(
    cluster: Cluster,
    hist: History,
    *,
    warm_commits: int,
    timeout: float,
    target: int | None = None,
) -> FailoverRun:
    """SIGKILL the owner of `hist.partition`, detect it, fail over (forced), time it. The victim stays dead.

    `target`: the node to fail over to; None: the one `assignment.failover_target` picks.
    """
    p = hist.partition
    victim, old_epoch = cluster.owner(p), cluster.epoch(p)
    start_seq = hist.head_seq() + 1
    delay = random_instant(gaps(hist.wait_data(old_epoch, start_seq, warm_commits, timeout)))
    t_kill = kill_node(cluster, victim)
    t_dead = wait_dead(cluster, victim, HEARTBEAT_TIMEOUT_S + 15)
    choice = library_failover_choice(cluster, p, victim)
    to_node = target if target is not None else choice
    if to_node is None:
        raise RuntimeError(f"no live node to fail partition {p} over to")
    mark = log_mark(cluster, to_node)
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
    seal = next(m for m in entries if m.fencing_token == new_epoch)
    download = next((r for r in reports if r.phase == MigrationPhase.DOWNLOADING), None)
    return FailoverRun(
        victim=victim,
        to_node=to_node,
        library_choice=choice,
        detection_s=t_dead - t_kill,
        recovery_s=ts(first_new) - t_launch,
        run_s=t_active - t_launch,
        phases={r.phase: r.duration_s for r in reports},
        download_bytes=download.bytes_moved if download else 0,
        restores=restores(cluster, to_node, mark, p),
        first_batch=first_batch(cluster, to_node, mark, p),
        launch_to_seal_s=ts(seal) - t_launch,
        total_s=ts(first_new) - t_kill,
        unavailable_s=ts(first_new) - ts(last_old),
        seal_offset=seal.source_offset,
        kill_delay_s=delay,
    )


def revive(cluster: Cluster, node: int, *, settle: bool = True) -> None:
    """Restart a killed node (with its standby flags) and wait until it took back what it was left owning
    and (`settle`) its Spark warm-up ended."""
    stranded = {q: cluster.epoch(q) for q in cluster.partitions_of(node)}
    cluster.start_node(node)
    cluster.wait_alive(node, timeout=300)
    # The restarted node re-fences them (a new epoch), restores them and resumes.
    wait_until(
        lambda: all(cluster.epoch(q) > e for q, e in stranded.items()),
        180,
        f"node {node} to take back partitions {sorted(stranded)}",
    )
    if settle:
        wait_warmed_up(cluster, node)


def wait_warmed_up(cluster: Cluster, node: int) -> None:
    """Wait until `node`'s background Spark warm-up has ended.

    A node that owns nothing warms its Spark up for its first ~40 s (up to half a core): a run
    beside it would measure that warm-up's load on 2 cores, not the move.
    """
    wait_until(lambda: WARM_UP_ENDED in cluster.nodes[node].log(), 300, f"node {node}'s Spark warm-up to end", 0.5)


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


def restore_summary(values: Sequence[Sequence[Restore]]) -> str:
    """The restore lines of each run, joined ("-" where a run logged none)."""
    return "; ".join(" + ".join(r.text() for r in rs) if rs else "-" for rs in values)


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
