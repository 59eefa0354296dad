"""Backpressure from positions: lag = written - committed, no listing."""

from __future__ import annotations

import pytest

from laminar_orchestration.dataplane.backpressure import (
    Accept,
    AcceptWithWarning,
    BackpressureState,
    Reject,
    admit,
    partition_backpressure,
)
from laminar_orchestration.dataplane.errors import Backpressure
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore
from tests.commits import commit_all
from tests.processes import laminar


def state(written: int, committed: int) -> BackpressureState:
    return BackpressureState(0, written, committed, soft_threshold=100, hard_threshold=1000, retry_after_s=2.5)


def test_decisions_follow_the_thresholds() -> None:
    assert state(50, 0).evaluate() == Accept(50)
    assert state(150, 50).evaluate() == AcceptWithWarning(100, 100)  # the soft threshold itself warns
    assert state(600, 100).evaluate() == AcceptWithWarning(500, 100)
    assert state(2000, 1000).evaluate() == Reject(1000, 1000, 2.5)
    assert state(10, 50).pending_lag == 0  # committed ahead of a lagging head is no lag
    with pytest.raises(ValueError):
        BackpressureState(0, 0, 0, soft_threshold=10, hard_threshold=5)


def test_admit_raises_with_retry_after_for_the_partition_over_the_limit() -> None:
    with pytest.raises(Backpressure) as info:
        admit([state(10, 0), BackpressureState(3, 5000, 0, 100, 1000, 7.0)])
    assert (info.value.partition, info.value.pending_lag, info.value.retry_after_s) == (3, 5000, 7.0)
    assert "retry after 7.0s" in str(info.value)
    assert admit([state(500, 0)]) == [AcceptWithWarning(500, 100)]


def test_positions_come_from_the_source_head_and_the_manifest(store: ObjectStore) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(1)
    log = SourceLog(store, segment_events=100)
    log.append(0, generate_events(300, 5, 1, 1)[0])
    assert partition_backpressure(store, 0, soft_threshold=10, hard_threshold=20).pending_lag == 300
    token = ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    commit_all(store, token, snapshot_every=None)
    bp = partition_backpressure(store, 0, soft_threshold=10, hard_threshold=20)
    assert (bp.last_written_position, bp.last_committed_position, bp.pending_lag) == (300, 300, 0)


@pytest.mark.processes
def test_produce_refuses_past_the_hard_lag_and_appends_nothing(store_url: str) -> None:
    assert laminar("init", "--store", store_url, "--partitions", "1").returncode == 0
    assert laminar("produce", "--store", store_url, "--count", "50", "--hard-lag", "0").returncode == 0
    warned = laminar("produce", "--store", store_url, "--count", "10", "--soft-lag", "40", "--hard-lag", "100")
    assert warned.returncode == 0 and "50 events behind" in warned.stderr
    refused = laminar("produce", "--store", store_url, "--count", "10", "--soft-lag", "40", "--hard-lag", "60")
    assert refused.returncode == 3  # unavailable: retry later
    assert "partition 0 is 60 events behind (hard limit 60); retry after" in refused.stderr
    status = laminar("produce", "--store", store_url, "--count", "1", "--hard-lag", "0", "--json")
    assert status.returncode == 0
    from laminar_orchestration.store import open_store

    assert SourceLog(open_store(store_url)).end_offset(0) == 61
