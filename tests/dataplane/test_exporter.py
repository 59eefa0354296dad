"""A node's /metrics: the partitions it owns, each with its lag against its source log's end, read from
its workers at each scrape along with the process's store requests, served from the node's own registry."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from laminar_orchestration.dataplane.exporter import expose_node, partition_samples
from laminar_orchestration.dataplane.worker_state import WorkerState
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.metrics import LagClock, NodeMetrics
from laminar_orchestration.protocol.records import PartitionProgress
from laminar_orchestration.store import TransientStoreError
from laminar_orchestration.store.metering import RequestMeter, RequestMethod
from tests.processes import scrape


@dataclass
class FakeWorker:
    state_name: WorkerState
    offset: int

    def progress(self) -> PartitionProgress:
        return PartitionProgress(
            partition=0, epoch=2, state=self.state_name.value, source_offset=self.offset, events_committed=self.offset
        )


@dataclass
class FakeSource:
    ends: dict[int, int]

    def end_offset(self, partition: int) -> int:
        return self.ends[partition]


class UnreachableSource:
    """A source log whose head cannot be read (the store is down)."""

    def end_offset(self, partition: int) -> int:
        raise TransientStoreError("get", f"source/{partition}/head", "503: SlowDown")


@dataclass
class FakeNode:
    workers: dict[PartitionId, Any] = field(default_factory=dict)
    source: Any = field(default_factory=lambda: FakeSource({}))
    metrics: NodeMetrics = field(default_factory=lambda: NodeMetrics(1))
    _meter: RequestMeter = field(default_factory=RequestMeter)
    handle: Any = None
    leaving: threading.Event = field(default_factory=threading.Event)


def test_a_nodes_lag_is_its_source_log_end_minus_its_committed_offset() -> None:
    node = FakeNode(
        {PartitionId(0): FakeWorker(WorkerState.RUNNING, 40), PartitionId(1): FakeWorker(WorkerState.WARMING, 0)},
        FakeSource({0: 100, 1: 100}),
    )
    (only,) = partition_samples(node, LagClock())
    assert (only.partition, only.epoch, only.lag_events, only.committed_events) == (0, 2, 60, 40)


def test_a_draining_partition_is_still_the_nodes_and_a_finished_one_is_not() -> None:
    states = list(WorkerState)
    workers = {PartitionId(p): FakeWorker(state, 10) for p, state in enumerate(states)}
    node = FakeNode(workers, FakeSource(dict.fromkeys(range(len(states)), 10)))
    shown = {states[s.partition] for s in partition_samples(node, LagClock())}
    assert shown == {WorkerState.RUNNING, WorkerState.DRAINING}


def test_an_unreadable_log_end_leaves_the_lag_missing_not_wrong() -> None:
    node = FakeNode({PartitionId(3): FakeWorker(WorkerState.RUNNING, 40)}, UnreachableSource())
    (only,) = partition_samples(node, LagClock())
    assert (only.partition, only.lag_events, only.lag_seconds) == (3, None, None)
    assert (only.epoch, only.committed_events) == (2, 40)  # the rest of the scrape still shows


def test_the_exporter_serves_the_nodes_registry_read_afresh_at_each_scrape() -> None:
    worker = FakeWorker(WorkerState.RUNNING, 40)
    node = FakeNode({PartitionId(0): worker}, FakeSource({0: 100}), NodeMetrics(7))
    node._meter.count(RequestMethod.GET, "source/0/head")
    server = expose_node(node, 0)
    labels = (("node", "7"), ("partition", "0"))
    try:
        first = scrape(server.url)
        worker.offset = 90
        node._meter.count(RequestMethod.PUT, "manifests/0/history/1")
        second = scrape(server.url)
    finally:
        server.close()
    assert first[("laminar_partition_lag_events", labels)] == 60
    assert first[("laminar_store_requests_total", (("method", "GET"),))] == 1
    assert ("laminar_store_requests_total", (("method", "PUT"),)) not in first
    assert second[("laminar_partition_lag_events", labels)] == 10
    assert second[("laminar_partition_committed_events_total", labels)] == 90
    assert second[("laminar_store_requests_total", (("method", "PUT"),))] == 1
