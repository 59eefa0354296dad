"""A node's /metrics (``laminar node run --metrics-port``): its partitions read at each scrape.

The partitions' lag, epoch and commits are read from the node's workers when
Prometheus scrapes, with one read of each owned partition's source-log head
(a GET per partition per scrape); batch and commit latencies are observed by
the workers as they commit (`NodeMetrics.observe_batch`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol

from laminar_orchestration.dataplane.worker import PartitionWorker
from laminar_orchestration.dataplane.worker_state import WorkerState
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.metrics import Health, LagClock, MetricsServer, NodeMetrics, PartitionSample, serve_metrics
from laminar_orchestration.protocol.membership import NodeHandle
from laminar_orchestration.protocol.records import now
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import StoreError
from laminar_orchestration.store.metering import RequestMeter


class ObservedNode(Protocol):
    """What the exporter reads of a node (`dataplane.node.Node`)."""

    @property
    def workers(self) -> Mapping[PartitionId, PartitionWorker]: ...
    @property
    def source(self) -> SourceLog: ...
    @property
    def metrics(self) -> NodeMetrics: ...
    @property
    def _meter(self) -> RequestMeter: ...
    @property
    def handle(self) -> NodeHandle | None: ...
    @property
    def leaving(self) -> threading.Event: ...


#: Worker states in which the node owns the partition and processes it.
OWNING = frozenset({WorkerState.RUNNING, WorkerState.DRAINING})


def partition_samples(node: ObservedNode, clock: LagClock) -> list[PartitionSample]:
    """The partitions `node` runs now, each with its lag against its source log's end."""
    samples = []
    for p, worker in sorted(list(node.workers.items())):
        if worker.state_name not in OWNING:
            continue
        progress = worker.progress()
        try:
            end: int | None = node.source.end_offset(int(p))
        except StoreError:
            end = None  # the scrape shows the rest; the lag is missing, not wrong
        lag = None if end is None else max(0, end - progress.source_offset)
        lag_s = None if end is None else clock.observe(int(p), end, progress.source_offset)
        samples.append(
            PartitionSample(
                partition=int(p),
                epoch=progress.epoch,
                lag_events=lag,
                lag_seconds=lag_s,
                committed_events=progress.events_committed,
                commits=progress.commits,
            )
        )
    clock.forget(s.partition for s in samples)
    return samples


def node_health(node: ObservedNode) -> Health:
    """Ready while the node is registered, its last heartbeat younger than its timeout, and it is not
    leaving; live unless a registered node that is not leaving stopped heartbeating for three timeouts
    (its heartbeat thread is stuck: a restart is the cure, and the cluster already counts it dead)."""
    handle = node.handle
    if handle is None:
        return Health(False, True, "not registered yet (starting)")
    record = handle.record
    age = (now() - record.heartbeat_at).total_seconds()
    timeout = record.heartbeat_timeout_s
    what = f"node {record.node} generation {record.generation}, last heartbeat {age:.1f}s ago"
    if node.leaving.is_set():
        return Health(False, True, f"{what}; leaving (moving its partitions away)")
    if age > timeout:
        return Health(False, age <= 3 * timeout, f"{what}: older than its {timeout:g}s timeout")
    return Health(True, True, what)


def expose_node(node: ObservedNode, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve `node`'s metrics at ``http://host:port/metrics`` (port 0: a free one) until closed, and its
    health at ``/healthz`` (readiness) and ``/livez`` (liveness): see `node_health`."""
    clock = LagClock()
    meter = node._meter  # the process's request meter, read (not copied) at each scrape
    node.metrics.watch(lambda: partition_samples(node, clock), lambda: meter.snapshot().by_method)
    return serve_metrics(port, host, registry=node.metrics.registry, health=lambda: node_health(node))
