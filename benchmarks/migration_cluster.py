"""The live local cluster the migration benchmarks run on, and how they watch it: node processes and
their signals, the load on a partition, its manifest history, the nodes' logs (restores, committed
batches, the Spark warm-up) and their warm standby copies.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from laminar_dev.localcluster import HEARTBEAT_TIMEOUT_S, Cluster, wait_until
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.keys import manifest_history_key
from laminar_orchestration.protocol.manifest import PartitionManifest
from laminar_orchestration.protocol.records import parse_record
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore

from .common import median

MB = 1_000_000
#: What a node logs when its background Spark warm-up has ended (`SparkBatchEngine.keep_warming`).
WARM_UP_ENDED = "spark warm-up: "
HEARTBEAT_INTERVAL_S = 1.0  # NodeConfig default; `laminar node run` has no flag for it
NODE_ARGS = ("--refresh-interval", "0.5", "--checkpoint-every-batches", "3", "--log-level", "debug")
SPARK_MASTER = "local[1]"
DRIVER_MEMORY = "2g"


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
    return {int(v.record.node) for v in cluster.ledger.members.nodes() if v.alive}


def pick_target(cluster: Cluster, exclude: set[int], among: Sequence[int] | None = None) -> int:
    """The live node outside `exclude` (and inside `among`) that owns the fewest partitions (lowest id on ties)."""
    alive = sorted((alive_nodes(cluster) - exclude) & set(among if among is not None else alive_nodes(cluster)))
    if not alive:
        raise RuntimeError(f"no live node outside {sorted(exclude)}")
    return min(alive, key=lambda n: (len(cluster.partitions_of(n)), n))


def wait_dead(cluster: Cluster, node_id: int, timeout: float) -> float:
    """Poll the ledger every 20 ms until `node_id` is seen dead; return that wall-clock time."""
    wait_until(
        lambda: not any(v.alive for v in cluster.ledger.members.nodes() if int(v.record.node) == node_id),
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


def restore_summary(values: Sequence[Sequence[Restore]]) -> str:
    """The restore lines of each run, joined ("-" where a run logged none)."""
    return "; ".join(" + ".join(r.text() for r in rs) if rs else "-" for rs in values)


# --- warming up: standby copies, the Spark warm-up --------------------------------------------------------


def standby_offset(cluster: Cluster, node: int, partition: int) -> int | None:
    """The offset a node's warm standby copy of `partition` reflects (None: it reports none, or an error)."""
    record = cluster.ledger.members.node(NodeId(node))
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


def wait_warmed_up(cluster: Cluster, node: int) -> None:
    """Wait until `node`'s background Spark warm-up has ended.

    A node that owns nothing warms its Spark up for its first ~40 s (up to half a core): a run
    beside it would measure that warm-up's load on 2 cores, not the move.
    """
    wait_until(lambda: WARM_UP_ENDED in cluster.nodes[node].log(), 300, f"node {node}'s Spark warm-up to end", 0.5)
