"""A node's /metrics (``laminar node run --metrics-port``): its partitions read at each scrape.

The partitions' lag, epoch and commits are read from the node's workers when
Prometheus scrapes, with one read of each owned partition's source-log head
(a GET per partition per scrape); batch and commit latencies are observed by
the workers as they commit (`NodeMetrics.observe_batch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from laminar_orchestration.dataplane.worker import PartitionWorker
from laminar_orchestration.dataplane.worker_state import WorkerState
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.metrics import LagClock, MetricsServer, NodeMetrics, PartitionSample, serve_metrics
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


def expose_node(node: ObservedNode, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve `node`'s metrics at ``http://host:port/metrics`` (port 0: a free one) until closed."""
    clock = LagClock()
    meter = node._meter  # the process's request meter, read (not copied) at each scrape
    node.metrics.watch(lambda: partition_samples(node, clock), lambda: meter.snapshot().by_method)
    return serve_metrics(port, host, registry=node.metrics.registry)
