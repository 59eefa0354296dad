"""What every figure of the runtime benchmark shares: how much work a run does, the results table and
its number formats, the fencing-OFF worker, and an in-process node on a one-partition local cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.dataplane.engine import SparkBatchEngine
from laminar_orchestration.dataplane.node import Node
from laminar_orchestration.dataplane.worker import PartitionWorker
from laminar_orchestration.dataplane.worker_state import WorkerState
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestUpdate
from laminar_orchestration.protocol.fencing import FencingToken, PartitionGuard
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import PartitionManifest
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.store import LocalObjectStore, ObjectStore

from .common import Row, TableReport

P0 = PartitionId(0)
NODE1 = NodeId(1)
NODE2 = NodeId(2)
MASTER = "local[2]"
KEYS = 1_000
MB = 1_000_000
LOCAL = "local"


@dataclass(frozen=True)
class Params:
    """How much work each figure does; `--quick` scales it down."""

    #: Rounds of (10k, 100k, 1M) aggregates through the shared session before measuring.
    warmup_rounds: int
    #: Batches per state size come in two series of this many, interleaved between the sizes (the
    #: first batch after the restore is reported on its own). With 10 (`checkpoint_every_batches`)
    #: the 2.7M node takes one snapshot between them and the restore finds 10 deltas after it.
    series_batches: int
    restore_runs: int
    standby_runs: int
    breakdown_runs: int
    #: Snapshots of the snapshot series (figure 3).
    snapshot_series: int
    #: (batch size, interleaved runs per configuration)
    sizes: tuple[tuple[int, int], ...]
    drain_runs: int
    #: Interleaved runs per input form, size and machine state (figure 6).
    input_runs: int


# --- the report ------------------------------------------------------------------------------


class Report(TableReport):
    def add(self, *rows: Row) -> None:
        self.rows.extend(rows)

    def info(self, figure: str, value: str, backend: str = LOCAL) -> None:
        self.rows.append(Row(figure, backend, value, "-", "info"))


def fmt_eps(eps: float) -> str:
    return f"{eps / 1000:,.1f}k ev/s"


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def fmt_bytes(n: float) -> str:
    if n >= MB:
        return f"{n / MB:.2f} MB"
    return f"{n / 1000:.1f} KB"


def fmt_size(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:g}M"
    return f"{n // 1000}k"


def fmt_list_ms(values: Sequence[float]) -> str:
    return ", ".join(f"{v * 1000:.0f}" for v in values)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.001) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# --- fencing OFF: a benchmark-only worker ------------------------------------------------------


class _UncheckedGuard(PartitionGuard):
    """A guard whose hot-path check never raises, so the writers' own checks
    (`OutputWriter.write`, `CheckpointStore.upload_delta`) are off too. Benchmark only."""

    def check(self) -> None:
        return None


class UnfencedWorker(PartitionWorker):
    """`PartitionWorker` with fencing switched off, to measure what fencing costs.

    * `_check` (tracker + guard, before each read, after Spark and before the publish) does nothing;
    * the installed guard's `check()` does nothing (the writers' checks);
    * `_publish` calls the publisher directly (no successor-grant probe, no fence-the-tracker on error);
    * the node runs no guard-refresh loop for it (see `throughput_once`).

    What remains is structural: the manifest publish still compares the token's
    epoch with the previous manifest's (one int compare on the manifest it reads
    anyway for the sequence number and parent hash), and the create-only history
    entry is the commit itself; the takeover seal is part of the grant.
    """

    def _check(self) -> None:
        return None

    def _install(self, token: FencingToken) -> None:
        self.token = token
        self.guard = _UncheckedGuard(token)
        self.node.guards.insert(self.guard)

    def _publish(self, update: ManifestUpdate) -> ManifestVersion:
        assert self.token is not None
        return self.node.publisher.publish(self.token, update)


# --- shared helpers ----------------------------------------------------------------------------


def new_local_cluster(root: Path) -> tuple[LocalObjectStore, Ledger]:
    """A fresh local store (fsync on, as in production) with a one-partition cluster."""
    store = LocalObjectStore(root / "store")
    ledger = Ledger(store)
    ledger.init_cluster(1)
    return store, ledger


def new_node(store: ObjectStore, spark: Any, workdir: Path, **config: Any) -> Node:
    cfg = NodeConfig(store_url=store.url, node_id=int(NODE1), spark_master=MASTER, workdir=str(workdir), **config)
    return Node(cfg, store=store, spark=spark)


def attach_engine(node: Node) -> None:
    """`Node.start_spark` minus its per-node warm-up batch (the shared session is warm already)."""
    node.engine = SparkBatchEngine(node._spark, None, str(node.workdir / "spark"))


def join_cluster(node: Node) -> None:
    """What `Node.run` does before its loops: register, read the cluster epoch."""
    node.handle = node.ledger.members.register_node(node.id, heartbeat_timeout_s=node.config.heartbeat_timeout_s)
    node.observe_cluster_epoch(node.ledger.members.record().cluster_epoch)


def in_process_node(store: ObjectStore, spark: Any, workdir: Path, **config: Any) -> Node:
    """A node whose partitions are started by the benchmark (no reconcile/heartbeat loops)."""
    node = new_node(store, spark, workdir, **config)
    attach_engine(node)
    join_cluster(node)
    return node


def close_node(node: Node) -> None:
    node.stop()
    node.snapshot_pool.shutdown(wait=True, cancel_futures=True)


def want_owner(node: Node) -> None:
    """Record in the desired state that `node` should run partition 0 (what a placement does)."""
    node.desired.update(P0, lambda s: s.model_copy(update={"owner": int(node.id)}))
    own = node.ledger.ownership(P0)
    if own is not None and (own.owner != node.id or own.status == PartitionStatus.RELEASED):
        # What the control plane does: grant it (the node only adopts).
        node.ledger.acquire(P0, node.id, expected_epoch=own.epoch, reason="place", generation=node.generation)


def start_worker(node: Node, worker: PartitionWorker, timeout: float = 300.0) -> float:
    """`Node._start` (what the reconcile loop calls); seconds until the worker reports RUNNING."""
    t0 = time.perf_counter()
    node._start(worker)
    wait_for(lambda: worker.state_name == WorkerState.RUNNING or worker.finished, timeout, "the worker")
    elapsed = time.perf_counter() - t0
    if worker.state_name != WorkerState.RUNNING:
        raise RuntimeError(f"worker did not start: {worker.progress().error}")
    return elapsed


def stop_worker(worker: PartitionWorker, timeout: float = 120.0) -> None:
    """request_stop() and wait for the thread (it releases the partition after its last commit)."""
    worker.request_stop()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError(f"worker of partition {worker.partition} did not stop")


def events_table(n: int, seed: int) -> pa.Table:
    return generate_events(n, KEYS, seed, 1)[0]


#: After reporting RUNNING the worker makes one read of the (still empty) log and
#: parks in its idle wait; this is ample for that on the local store.
SETTLE_S = 0.2


def current_manifest(store: ObjectStore) -> PartitionManifest:
    current = ManifestReader(store).current(P0)
    if current is None:
        raise RuntimeError("partition 0 has no manifest")
    return current.manifest


def history(store: ObjectStore) -> list[PartitionManifest]:
    return [v.manifest for v in ManifestReader(store).history(P0)]
