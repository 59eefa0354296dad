"""Prometheus metrics of a node and of the control plane: their names, their collectors, the exporter.

Nothing here uses prometheus_client's global registry: each node (and each
control-plane process) has its own `CollectorRegistry`, so several nodes can
run in one process (tests, benchmarks) without colliding. Most figures are
read from the owner's state when Prometheus scrapes (lag, epoch, committed
events, store requests); only latencies are observed as they happen, into
histograms the collectors expose.

Names follow Prometheus conventions: the ``laminar_`` prefix, base units
(``_seconds``, ``_events``), ``_total`` on counters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from laminar_orchestration.errors import UnavailableError

log = logging.getLogger("laminar.metrics")

#: A batch takes tens of milliseconds to seconds (Spark); a commit a few store round trips.
BATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: A move takes about a second to a minute (its default timeout is 30 s).
MIGRATION_BUCKETS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)

PARTITION_LABELS = ("node", "partition")


class BatchTimingsLike(Protocol):
    """Where a committed batch's time went, in milliseconds (`dataplane.tracking.BatchTimings`)."""

    @property
    def stage_ms(self) -> float: ...
    @property
    def spark_ms(self) -> float: ...
    @property
    def merge_ms(self) -> float: ...
    @property
    def output_ms(self) -> float: ...
    @property
    def delta_ms(self) -> float: ...
    @property
    def publish_ms(self) -> float: ...
    @property
    def apply_ms(self) -> float: ...


@dataclass(frozen=True)
class PartitionSample:
    """One partition a node runs, as a scrape reads it."""

    partition: int
    #: The epoch this node holds (0: none yet).
    epoch: int
    #: Events of the source log not committed yet; None when the log end could not be read.
    lag_events: int | None
    #: How long the oldest uncommitted event has waited (`LagClock`); None with `lag_events`.
    lag_seconds: float | None
    #: Events the partition's committed state covers (all epochs, every owner so far).
    committed_events: int
    #: Batches this node committed at this epoch.
    commits: int


class LagClock:
    """Lag in seconds from lag in events: when the event at the committed offset was appended.

    Each observation remembers when the source log reached its end. The oldest
    uncommitted event (at the committed offset) was appended between the last
    remembered end at or before that offset and the first one past it; its time
    is interpolated between the two (or, with no earlier end remembered, taken as
    the later one: then the age is a lower bound). Exact to the interval between
    observations (a scrape, a demo table); 0 while the partition is caught up.
    """

    def __init__(self, *, keep: int = 4096) -> None:
        self._ends: dict[int, deque[tuple[float, int]]] = {}
        self._keep = keep

    def observe(self, partition: int, end: int, committed: int, at: float | None = None) -> float:
        """Seconds the event at `committed` has waited, given the log ends at `end` now."""
        at = time.monotonic() if at is None else at
        ends = self._ends.setdefault(partition, deque(maxlen=self._keep))
        if not ends or end > ends[-1][1]:
            ends.append((at, end))
        # Keep one end at or before the committed offset: the interpolation's lower point.
        while len(ends) > 1 and ends[1][1] <= committed:
            ends.popleft()
        if end <= committed:
            ends.clear()
            ends.append((at, end))
            return 0.0
        (t0, e0), (t1, e1) = ends[0], ends[1] if len(ends) > 1 else ends[0]
        if e0 > committed:  # nothing remembered at or before the offset: a lower bound
            return max(0.0, at - t0)
        appended_at = t0 + (t1 - t0) * (committed - e0) / (e1 - e0)
        return max(0.0, at - appended_at)

    def forget(self, keep: Iterable[int]) -> None:
        """Drop the partitions not in `keep` (moved away)."""
        for p in set(self._ends) - set(keep):
            del self._ends[p]


class NodeMetrics:
    """A node's metrics: latencies observed on the batch path, the rest read when scraped.

    `registry` is the node's own; `watch` adds the scrape-time reading of its
    partitions and store requests, `serve_metrics(port, registry=...)` exposes it.
    """

    def __init__(self, node: int) -> None:
        self.node = str(node)
        self.registry = CollectorRegistry()
        self.batch_seconds = Histogram(
            "laminar_batch_duration_seconds",
            "A committed batch's own work: stage, Spark, merge, output, delta, publish and apply.",
            PARTITION_LABELS,
            buckets=BATCH_BUCKETS,
            registry=None,
        )
        self.commit_seconds = Histogram(
            "laminar_commit_duration_seconds",
            "A batch's fenced commit: output and delta uploaded, manifest published, local store applied.",
            PARTITION_LABELS,
            buckets=BATCH_BUCKETS,
            registry=None,
        )
        self.restarts = Counter(
            "laminar_partition_restarts",
            "Failures of a partition's worker on this node, each followed by a restart after a backoff.",
            PARTITION_LABELS,
            registry=None,
        )
        self.registry.register(_Yield(self.batch_seconds, self.commit_seconds, self.restarts))

    def observe_batch(self, partition: int, timings: BatchTimingsLike) -> None:
        """Record one committed batch's latencies."""
        t = timings
        commit_ms = t.output_ms + t.delta_ms + t.publish_ms + t.apply_ms
        labels = (self.node, str(partition))
        self.batch_seconds.labels(*labels).observe((t.stage_ms + t.spark_ms + t.merge_ms + commit_ms) / 1000.0)
        self.commit_seconds.labels(*labels).observe(commit_ms / 1000.0)

    def count_restart(self, partition: int) -> None:
        """One failure of the partition's worker (it is restarted after its backoff)."""
        self.restarts.labels(self.node, str(partition)).inc()

    def watch(
        self, partitions: Callable[[], Iterable[PartitionSample]], requests: Callable[[], Mapping[str, int]]
    ) -> None:
        """Read the node's partitions and its process's store requests at every scrape."""
        self.registry.register(PartitionCollector(self.node, partitions))
        self.registry.register(RequestCollector(requests))


class PartitionCollector(Collector):
    """Per-partition gauges and counters, read from the node when scraped."""

    def __init__(self, node: str, partitions: Callable[[], Iterable[PartitionSample]]) -> None:
        self._node = node
        self._partitions = partitions

    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "laminar_partition_lag_events",
            "Events in the partition's source log not committed yet.",
            labels=PARTITION_LABELS,
        )
        lag_s = GaugeMetricFamily(
            "laminar_partition_lag_seconds",
            "How long the oldest uncommitted event has waited, estimated from the log ends seen (0: caught up).",
            labels=PARTITION_LABELS,
        )
        epoch = GaugeMetricFamily(
            "laminar_partition_epoch", "The epoch this node owns the partition at.", labels=PARTITION_LABELS
        )
        events = CounterMetricFamily(
            "laminar_partition_committed_events",
            "Events the partition's committed state covers (all epochs, every owner so far).",
            labels=PARTITION_LABELS,
        )
        commits = CounterMetricFamily(
            "laminar_partition_commits", "Batches this node committed at its current epoch.", labels=PARTITION_LABELS
        )
        try:
            samples = list(self._partitions())
        except Exception:
            # A scrape must never take the node down, nor fail for one bad read.
            log.warning("metrics: reading the partitions failed", exc_info=True)
            samples = []
        for s in samples:
            labels = [self._node, str(s.partition)]
            epoch.add_metric(labels, s.epoch)
            events.add_metric(labels, s.committed_events)
            commits.add_metric(labels, s.commits)
            if s.lag_events is not None:
                lag.add_metric(labels, s.lag_events)
                lag_s.add_metric(labels, s.lag_seconds or 0.0)
        yield from (lag, lag_s, epoch, events, commits)


class RequestCollector(Collector):
    """The process's store requests by method (`store.metering`), read when scraped: counted once."""

    def __init__(self, requests: Callable[[], Mapping[str, int]]) -> None:
        self._requests = requests

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "laminar_store_requests",
            "Object-store requests this process sent, by method (as S3 bills them).",
            labels=["method"],
        )
        for method, n in sorted(self._requests().items()):
            family.add_metric([method], n)
        yield family


class ControlPlaneMetrics:
    """Migrations and fences as the control plane sees them end; `refresh` runs before every scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.migrations = Counter(
            "laminar_migrations",
            "Partition moves that ended, by kind (graceful, forced, placement) and outcome (active, failed, "
            "cancelled).",
            ["kind", "outcome"],
            registry=None,
        )
        self.migration_seconds = Histogram(
            "laminar_migration_duration_seconds",
            "From a move's plan to its end, by kind and outcome.",
            ["kind", "outcome"],
            buckets=MIGRATION_BUCKETS,
            registry=None,
        )
        self.fences = Counter(
            "laminar_fences",
            "Epochs granted without the previous owner's release, by kind: failover (an owner fenced out) "
            "or placement (a partition nobody owned).",
            ["kind"],
            registry=None,
        )
        self._lock = threading.Lock()

    def observe_migration(self, kind: str, outcome: str, seconds: float) -> None:
        self.migrations.labels(kind, outcome).inc()
        self.migration_seconds.labels(kind, outcome).observe(seconds)

    def count_fence(self, kind: str) -> None:
        self.fences.labels(kind).inc()

    def watch(
        self,
        refresh: Callable[[ControlPlaneMetrics], None],
        requests: Callable[[], Mapping[str, int]],
        *,
        extra: Sequence[Counter | Gauge | Histogram] = (),
    ) -> None:
        """Call `refresh(self)` before each scrape (it observes what ended since, and sets `extra`),
        and expose the process's store requests."""
        self.registry.register(_Refreshing(self, refresh, extra))
        self.registry.register(RequestCollector(requests))


class _Yield(Collector):
    """Expose metric objects kept out of any registry (one node's, in a process of several)."""

    def __init__(self, *metrics: Counter | Gauge | Histogram) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        for m in self._metrics:
            yield from m.collect()


class _Refreshing(Collector):
    def __init__(
        self,
        metrics: ControlPlaneMetrics,
        refresh: Callable[[ControlPlaneMetrics], None],
        extra: Sequence[Counter | Gauge | Histogram],
    ) -> None:
        self._metrics = metrics
        self._refresh = refresh
        self._extra = tuple(extra)

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        with m._lock:  # two scrapes at once must not count one migration twice
            try:
                self._refresh(m)
            except Exception:
                log.warning("metrics: reading the ledger failed", exc_info=True)
        for metric in (m.migrations, m.migration_seconds, m.fences, *self._extra):
            yield from metric.collect()


class MetricsPortUnavailable(UnavailableError):
    """The /metrics port cannot be bound (taken, or not ours to take)."""

    host: str
    port: int
    reason: str

    message = "cannot serve metrics on {host}:{port}: {reason} (pass another --metrics-port)"


@dataclass
class MetricsServer:
    """A running /metrics endpoint."""

    host: str
    port: int
    _server: object
    _thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        shutdown = getattr(self._server, "shutdown", None)
        if shutdown is not None:
            shutdown()
        close = getattr(self._server, "server_close", None)
        if close is not None:
            close()


@dataclass(frozen=True)
class Health:
    """What a process's health endpoints answer: `/healthz` (readiness) and `/livez` (liveness)."""

    #: Ready for work: Kubernetes routes to it and counts it available (a PodDisruptionBudget's unit).
    ready: bool
    #: Alive: false asks the kubelet to restart the process.
    live: bool
    #: One line saying why, shown in the response body.
    detail: str


#: The readiness and liveness paths served beside /metrics when a health callback is given.
HEALTH_PATHS = {"/healthz": "ready", "/readyz": "ready", "/livez": "live"}


def _health_app(registry: CollectorRegistry, health: Callable[[], Health]) -> Callable[..., Iterable[bytes]]:
    """A WSGI app: the health paths answered from `health()`, everything else the Prometheus exposition."""
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, object], start_response: Callable[..., object]) -> Iterable[bytes]:
        which = HEALTH_PATHS.get(str(environ.get("PATH_INFO", "")))
        if which is None:
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        try:
            report = health()
        except Exception as exc:  # a broken check is an unhealthy process, never a 500 with a traceback
            report = Health(False, False, f"health check failed: {type(exc).__name__}: {exc}")
        ok = report.ready if which == "ready" else report.live
        status = "200 OK" if ok else "503 Service Unavailable"
        body = f"{'ok' if ok else 'not ' + which}: {report.detail}\n".encode()
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve_metrics(
    port: int,
    host: str = "127.0.0.1",
    *,
    registry: CollectorRegistry,
    health: Callable[[], Health] | None = None,
) -> MetricsServer:
    """Serve `registry` at ``http://host:port/metrics`` from a daemon thread (port 0: any free port).

    With `health`, the same server answers ``/healthz`` (and ``/readyz``) 200 while `health().ready`,
    503 otherwise, and ``/livez`` by `health().live`. `MetricsPortUnavailable` if the port is taken.
    """
    try:
        if health is None:
            server, thread = start_http_server(port, addr=host, registry=registry)
        else:
            server, thread = _serve_wsgi(port, host, _health_app(registry, health))
    except OSError as exc:
        raise MetricsPortUnavailable(host, port, exc.strerror or str(exc)) from None
    bound = int(server.server_address[1])
    log.info("metrics: serving http://%s:%s/metrics", host, bound)
    return MetricsServer(host, bound, server, thread)


def _serve_wsgi(port: int, host: str, app: Callable[..., Iterable[bytes]]) -> tuple[WSGIServer, threading.Thread]:
    """`app` on a threading WSGI server that does not log each request (as prometheus_client serves)."""
    from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_SilentHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread
