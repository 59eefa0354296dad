"""A cluster on one machine: worker nodes as separate processes on one store.

Used by the chaos suite, the benchmarks and the tests. Nodes
are started with ``python -m laminar_orchestration.cli node run`` and can be
killed (SIGKILL), paused (SIGSTOP), resumed (SIGCONT) or stopped (SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import reinstate_all
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ops.verify import PartitionAudit, audit_store
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore, open_store

HEARTBEAT_TIMEOUT_S = 3.0


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def stop_processes(procs: Iterable[subprocess.Popen[bytes]], timeout_s: float = 60.0) -> None:
    """SIGTERM every process still running, then wait for each; one that outlives `timeout_s` is killed.

    All are signalled before any is waited for, so their clean stops overlap."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class NodeProcess:
    def __init__(self, node_id: int, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.node_id = node_id
        self.proc = proc
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)


class Cluster:
    """Nodes, the store, a producer and the coordinator, for one test module."""

    def __init__(
        self,
        store_url: str,
        workdir: Path,
        *,
        partitions: int,
        env: Mapping[str, str] | None = None,
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        spark_master: str = "local[1]",
        node_args: tuple[str, ...] = ("--refresh-interval", "0.5", "--checkpoint-every-batches", "3"),
        init: bool = True,
        per_node_args: Mapping[int, tuple[str, ...]] | None = None,
    ) -> None:
        self.store_url = store_url
        self.workdir = workdir
        self.env = {**os.environ, **(env or {})}
        self.store: ObjectStore = open_store(store_url)
        self.ledger = Ledger(self.store)
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.spark_master = spark_master
        self.node_args = node_args
        #: Extra arguments of particular nodes (e.g. ``--standby-for 0,1``), on every (re)start of them.
        self.per_node_args: dict[int, tuple[str, ...]] = dict(per_node_args or {})
        if init:
            self.ledger.init_cluster(partitions)
        self.partitions = [PartitionId(p) for p in range(partitions)]
        self.source = SourceLog(self.store, partitions=partitions, segment_events=20_000)
        self.coordinator = MigrationCoordinator(self.ledger)
        self.manifests = ManifestReader(self.store)
        self.nodes: dict[int, NodeProcess] = {}
        self.produced: list[pa.Table] = []
        self._seed = 0

    # -- nodes ---------------------------------------------------------------------

    def start_node(self, node_id: int, *extra: str) -> NodeProcess:
        log_path = self.workdir / f"node{node_id}-{int(time.time() * 1000)}.log"
        cmd = [
            sys.executable, "-m", "laminar_orchestration.cli", "node", "run",
            "--store", self.store_url, "--node-id", str(node_id),
            "--spark-master", self.spark_master,
            "--heartbeat-timeout", str(self.heartbeat_timeout_s),
            *self.node_args,
            *self.per_node_args.get(node_id, ()),
            *extra,
        ]  # fmt: skip
        with open(log_path, "wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env)
        node = NodeProcess(node_id, proc, log_path)
        self.nodes[node_id] = node
        return node

    def wait_alive(self, *node_ids: int, timeout: float = 120.0) -> None:
        def ready() -> bool:
            alive = {v.record.node for v in self.ledger.members.nodes() if v.alive}
            for n in node_ids:
                if self.nodes[n].proc.poll() is not None:
                    raise RuntimeError(f"node {n} exited:\n{self.nodes[n].log()[-3000:]}")
            return set(node_ids) <= alive

        wait_until(ready, timeout, f"nodes {node_ids} to join")

    def wait_dead(self, node_id: int, timeout: float = 30.0) -> None:
        wait_until(
            lambda: not any(v.alive for v in self.ledger.members.nodes() if v.record.node == node_id),
            timeout,
            f"node {node_id} to be seen dead",
        )

    def kill(self, node_id: int) -> None:
        node = self.nodes[node_id]
        node.signal(signal.SIGKILL)
        node.proc.wait(30)

    def stop(self, node_id: int, timeout: float = 120.0) -> int:
        node = self.nodes[node_id]
        node.signal(signal.SIGTERM)
        return node.proc.wait(timeout)

    def shutdown(self) -> None:
        for node in self.nodes.values():
            node.signal(signal.SIGCONT)
            node.signal(signal.SIGKILL)
        for node in self.nodes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(30)

    # -- data ----------------------------------------------------------------------

    def produce(self, count: int, keys: int = 40) -> dict[int, int]:
        """Append `count` generated events over all partitions; returns the new log ends."""
        self._seed += 1
        ends = {}
        for p, table in generate_events(count, keys, self._seed, len(self.partitions)).items():
            self.source.append(p, table)
            self.produced.append(table)
            ends[p] = self.source.end_offset(p)
        return ends

    def committed(self, p: int) -> int:
        current = self.manifests.current(PartitionId(p))
        return current.manifest.source_offset if current else 0

    def wait_committed(self, timeout: float = 120.0) -> None:
        """Wait until every partition has committed everything produced so far."""
        ends = {p: self.source.end_offset(p) for p in self.partitions}
        wait_until(
            lambda: all(self.committed(p) >= ends[p] for p in self.partitions),
            timeout,
            f"commits up to {ends}",
            interval=0.2,
        )

    def expected_counts(self) -> dict[str, int]:
        """Per key, how many events were produced (computed without the library's audit)."""
        return self._produced_per_key("count")

    def expected_sums(self) -> dict[str, float]:
        return self._produced_per_key("sum")

    def _produced_per_key(self, aggregation: str) -> dict[str, Any]:
        """Per key, the `aggregation` ("count" or "sum") of the produced values, over every produced table."""
        totals: dict[str, Any] = {}
        for table in self.produced:
            grouped = table.group_by("key").aggregate([("value", aggregation)])
            column = grouped[f"value_{aggregation}"].to_pylist()
            for key, value in zip(grouped["key"].to_pylist(), column, strict=True):
                totals[key] = totals.get(key, 0) + value
        return totals

    def verify(self) -> list[PartitionAudit]:
        return audit_store(self.store)

    # -- ownership -----------------------------------------------------------------

    def owner(self, p: int) -> int:
        own = self.ledger.ownership(PartitionId(p))
        assert own is not None
        return int(own.owner)

    def epoch(self, p: int) -> int:
        own = self.ledger.ownership(PartitionId(p))
        assert own is not None
        return own.epoch

    def place(self, assignment: Mapping[int, int]) -> None:
        """Move each partition to its node (forced from unassigned, graceful otherwise)."""
        for p, n in assignment.items():
            if self.owner(p) != n:
                self.coordinator.run(PartitionId(p), NodeId(n))

    def reinstate(self) -> dict[int, int]:
        """The control plane's periodic step: grant released partitions back to their live desired owners."""
        return reinstate_all(self.coordinator)

    def partitions_of(self, node_id: int) -> list[int]:
        return [p for p in self.partitions if self.owner(p) == node_id]


def total(values: pa.ChunkedArray) -> int:
    return int(pc.sum(values).as_py() or 0)
