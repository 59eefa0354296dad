"""The laminar side of the baseline comparison: the same load on a laminar partition, the zombie
(split-brain) scenario, the committed output checked for stale overwrites, and the planned moves
to the warm standby.
"""

from __future__ import annotations

import signal
import time

import pyarrow as pa

from laminar_dev.localcluster import HEARTBEAT_TIMEOUT_S, Cluster, wait_until
from laminar_orchestration.dataplane.checkpoint import download_table
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import MigrationPhase
from laminar_orchestration.store import ObjectStore

from .baseline_load import LAMINAR, TICK_S, EventStream
from .baseline_spark import SplitBrain
from .common import median, progress
from .migration_cluster import History, Producer, gaps, pick_target, signal_tree, wait_dead, wait_standby
from .migration_runs import MigrationRun, graceful_run

#: laminar nodes keep a warm standby copy of both partitions while they do not own them.
LAM_STANDBY_ARGS = ("--standby-for", "0,1")


class LaminarLoad:
    """The same event stream appended to a laminar partition (one producer per scenario; all kept for truth)."""

    def __init__(self, cluster: Cluster, partition: int = 0) -> None:
        self.cluster = cluster
        self.partition = partition
        self.tables: list[pa.Table] = []
        self.producer: Producer | None = None

    def start(self, seed: int) -> None:
        stream = EventStream(seed)
        self.producer = Producer(stream.next, lambda t: self._append(t), TICK_S)
        self.producer.start()

    def _append(self, t: pa.Table) -> None:
        self.cluster.source.append(self.partition, t)

    def stop(self) -> None:
        if self.producer is not None:
            self.producer.stop()
            self.tables.extend(self.producer.tables)
            self.producer = None


def laminar_zombie(cluster: Cluster, hist: History) -> SplitBrain:
    p = hist.partition
    zombie, old_epoch = cluster.owner(p), cluster.epoch(p)
    start_seq = hist.head_seq() + 1
    commits = hist.wait_data(old_epoch, start_seq, 3, 120)
    # Pause inside a batch: 40% of the usual commit interval after a data commit, with events pending.
    gap = median(gaps(commits))
    hist.wait_data(old_epoch, start_seq, len(commits) + 1, 120)
    time.sleep(0.4 * gap)
    pending = cluster.source.end_offset(p) - cluster.committed(p)
    where = (
        f"{0.4 * gap:.2f} s after a data commit (40% of the {gap:.2f} s commit interval), "
        f"{pending} events pending: inside the next batch"
    )
    pid = cluster.nodes[zombie].proc.pid
    signal_tree(pid, signal.SIGSTOP)
    t_pause = time.time()
    t_dead = wait_dead(cluster, zombie, HEARTBEAT_TIMEOUT_S + 15)
    target = pick_target(cluster, {zombie})
    task = cluster.coordinator.run(PartitionId(p), NodeId(target), forced=True)
    if task.phase != MigrationPhase.ACTIVE:
        raise RuntimeError(f"failover ended in {task.phase}: {task.error}")
    new_epoch = cluster.epoch(p)
    hist.wait_data(new_epoch, start_seq, 2, 120)
    signal_tree(pid, signal.SIGCONT)
    t_resume = time.time()
    progress("  laminar zombie: resumed; waiting for it to see its revocation")
    revoked_after: float | None = None
    reason: str | None = None
    try:
        wait_until(lambda: "REVOKED" in cluster.nodes[zombie].log(), 60, "the zombie to see its revocation", 0.02)
        revoked_after = time.time() - t_resume
        line = next(ln for ln in cluster.nodes[zombie].log().splitlines() if "REVOKED" in ln)
        reason = line.split("REVOKED", 1)[1].strip()
    except TimeoutError:
        pass
    time.sleep(3.0)  # let any stray attempt of the zombie land (or fail)
    entries = hist.since(start_seq)
    takeover = next(i for i, m in enumerate(entries) if m.fencing_token == new_epoch)
    after = entries[takeover:]
    return SplitBrain(
        system=LAMINAR,
        variant="mid-batch",
        in_flight=where,
        detection_s=t_dead - t_pause,
        zombie_commits_after_takeover=sum(1 for m in after if m.node == zombie or m.fencing_token <= old_epoch),
        revoked_after_s=revoked_after,
        zombie_error=reason,
    )


def committed_regressions(store: ObjectStore, partition: int) -> int:
    """Committed output rows (in manifest order) whose count is below one already committed for the key."""
    read, high, n = ReadStore(store), dict[str, int](), 0
    for version in ManifestReader(store).history(PartitionId(partition)):
        for ref in version.manifest.outputs:
            out = download_table(read, ref)
            for key, count in zip(out["key"].to_pylist(), out["count"].to_pylist(), strict=True):
                if count < high.get(key, 0):
                    n += 1
                high[key] = max(high.get(key, 0), count)
    return n


def seed_partition(cluster: Cluster, partition: int, table: pa.Table, timeout: float) -> float:
    """Append `table` (every key once) to `partition` and wait until it is committed; the seconds it took."""
    t0 = time.perf_counter()
    SourceLog(cluster.store, segment_events=250_000).append(partition, table)
    end = cluster.source.end_offset(partition)
    wait_until(lambda: cluster.committed(partition) >= end, timeout, f"partition {partition} to commit {end}", 0.2)
    return time.perf_counter() - t0


def standby_of(cluster: Cluster, partition: int) -> int:
    """The live node that does not own `partition` (the cluster has two)."""
    return pick_target(cluster, {cluster.owner(partition)})


def laminar_moves(
    cluster: Cluster,
    hist: History,
    moves: int,
    what: str,
    into: list[MigrationRun],
    *,
    warm_commits: int,
    timeout: float,
    standby_wait: float,
) -> None:
    """`moves` planned moves of `hist.partition`, each to the other node once its standby copy is caught
    up; every run is appended to `into` as it ends (a later failure keeps the earlier ones)."""
    for i in range(moves):
        target = standby_of(cluster, hist.partition)
        wait_standby(cluster, target, hist.partition, standby_wait)
        progress(f"  laminar {what} {i + 1}/{moves}: {cluster.owner(hist.partition)} -> {target}")
        into.append(graceful_run(cluster, hist, target, warm_commits=warm_commits, timeout=timeout))
        progress(f"    launch->Active {into[-1].total_s:.2f} s, unavailable {into[-1].unavailable_s:.2f} s")
