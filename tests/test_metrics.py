"""The metrics' promises without processes: own registries, lag from state, counts read at scrape."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass

import pytest
from prometheus_client import generate_latest

from laminar_orchestration.metrics import (
    LagClock,
    MetricsPortUnavailable,
    NodeMetrics,
    PartitionSample,
    serve_metrics,
)
from tests.processes import samples


@dataclass(frozen=True)
class Timings:
    events: int = 10
    stage_ms: float = 10.0
    spark_ms: float = 200.0
    merge_ms: float = 20.0
    output_ms: float = 30.0
    delta_ms: float = 15.0
    publish_ms: float = 4.0
    apply_ms: float = 1.0


def test_two_nodes_in_one_process_keep_their_own_metrics() -> None:
    one, two = NodeMetrics(1), NodeMetrics(2)
    one.observe_batch(0, Timings())
    one.count_restart(0)
    got = samples(generate_latest(one.registry).decode())
    labels = (("node", "1"), ("partition", "0"))
    assert got[("laminar_batch_duration_seconds_count", labels)] == 1
    assert got[("laminar_batch_duration_seconds_sum", labels)] == pytest.approx(0.28)
    assert got[("laminar_commit_duration_seconds_sum", labels)] == pytest.approx(0.05)
    assert got[("laminar_partition_restarts_total", labels)] == 1
    assert not any(name.endswith("_count") for name, _ in samples(generate_latest(two.registry).decode()))


def test_partition_figures_and_store_requests_are_read_at_each_scrape() -> None:
    metrics = NodeMetrics(3)
    state = {"lag": 7, "requests": 5}
    metrics.watch(
        lambda: [PartitionSample(2, epoch=4, lag_events=state["lag"], lag_seconds=1.5, committed_events=90, commits=3)],
        lambda: {"GET": state["requests"], "PUT": 2},
    )
    labels = (("node", "3"), ("partition", "2"))
    first = samples(generate_latest(metrics.registry).decode())
    assert first[("laminar_partition_lag_events", labels)] == 7
    assert first[("laminar_partition_lag_seconds", labels)] == 1.5
    assert first[("laminar_partition_epoch", labels)] == 4
    assert first[("laminar_partition_committed_events_total", labels)] == 90
    assert first[("laminar_partition_commits_total", labels)] == 3
    assert first[("laminar_store_requests_total", (("method", "GET"),))] == 5
    state.update(lag=0, requests=9)
    second = samples(generate_latest(metrics.registry).decode())
    assert second[("laminar_partition_lag_events", labels)] == 0
    assert second[("laminar_store_requests_total", (("method", "GET"),))] == 9


def test_lag_seconds_is_the_wait_of_the_oldest_uncommitted_event() -> None:
    clock = LagClock()
    assert clock.observe(0, end=100, committed=100, at=10.0) == 0.0  # caught up
    # Event 120 was appended between t=10 (log end 100) and t=12 (log end 150): at t=10.8.
    assert clock.observe(0, end=150, committed=120, at=12.0) == pytest.approx(1.2)
    assert clock.observe(0, end=250, committed=150, at=15.0) == pytest.approx(3.0)  # event 150: by t=12
    assert clock.observe(0, end=250, committed=200, at=16.0) == pytest.approx(2.5)  # event 200: at t=13.5
    assert clock.observe(0, end=260, committed=260, at=21.0) == 0.0
    # A first look at a partition already behind: only a lower bound (nothing earlier is known).
    assert LagClock().observe(1, end=500, committed=0, at=30.0) == 0.0


def test_the_exporter_serves_its_registry_and_names_a_port_in_use() -> None:
    metrics = NodeMetrics(1)
    metrics.observe_batch(0, Timings())
    server = serve_metrics(0, registry=metrics.registry)
    try:
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            text = resp.read().decode()
        assert "laminar_batch_duration_seconds_count" in text
        with pytest.raises(MetricsPortUnavailable, match=str(server.port)):
            serve_metrics(server.port, registry=NodeMetrics(2).registry)
    finally:
        server.close()


def test_the_dashboard_queries_only_metrics_the_operations_guide_documents() -> None:
    import json
    import re
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    dashboard = json.loads((docs / "grafana-dashboard.json").read_text())
    used = {
        re.sub(r"_(bucket|sum|count)$", "", name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"laminar_[a-z_]+", target["expr"])
    }
    documented = set(re.findall(r"`(laminar_[a-z_]+)`", (docs / "operations.md").read_text()))
    assert used and used <= documented, used - documented
