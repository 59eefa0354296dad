"""The retry policy of failed migrations: pure over the ownership and live nodes, then read from a ledger."""

from __future__ import annotations

import time

import pytest

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.retry import FailedMigration, RetryAction, RetryPolicy, decide_retry
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationKind, MigrationPhase
from laminar_orchestration.store import ObjectStore
from tests.ledgers import new_ledger

P, N = PartitionId, NodeId
G, F = MigrationKind.GRACEFUL, MigrationKind.FORCED
POLICY = RetryPolicy(max_retries=3, retry_delay_s=5.0)


def owned_by(node: int, epoch: int = 1) -> Ownership:
    return Ownership(P(0), epoch, N(node), PartitionStatus.ACTIVE if node else PartitionStatus.UNASSIGNED)


def decide(failed: FailedMigration, owner: int, live: set[int], *, is_stranded: bool = False) -> tuple[object, ...]:
    d = POLICY.decide(failed, owned_by(owner), live, is_stranded=is_stranded, now=100.0)
    return d.action, d.to_node, d.failed_node, d.epoch, d.attempt, d.not_before


def test_the_policy_of_a_failed_graceful_move() -> None:
    move = FailedMigration(G, 0, to_node=2)
    # Done by now (unless the target holds an epoch nobody runs): nothing to retry.
    stop = POLICY.decide(move, owned_by(2), {1, 2}, is_stranded=False, now=0.0)
    assert stop.action == RetryAction.STOP and stop.reason == "partition 0 is already on node 2"
    assert decide(move, 2, {1, 2}, is_stranded=True)[0] == RetryAction.RETRY
    # The old owner died: a failover of its epoch, to the target while it lives.
    assert decide(move, 1, {2}) == (RetryAction.FAILOVER, 2, 1, 1, 0, 0.0)
    assert decide(move, 1, set()) == (RetryAction.FAILOVER, None, 1, 1, 0, 0.0)
    # Otherwise the same move again, later: attempt 2, the delay after `now`; the target is kept.
    assert decide(move, 1, {1, 2}) == (RetryAction.RETRY, 2, 0, 0, 2, 105.0)
    assert decide(move, UNASSIGNED, set())[0] == RetryAction.RETRY  # nobody to fail over from


def test_the_policy_of_a_failed_failover() -> None:
    failover = FailedMigration(F, 0, to_node=9, attempt=3, label="failover_partition")
    # Its target died too: retried without it, the driver picks one.
    assert decide(failover, 1, {2}) == (RetryAction.RETRY, None, 0, 0, 4, 105.0)
    assert decide(FailedMigration(F, 0, to_node=2), 1, {2})[1] == 2
    # A live owner needs no failover, unless asked to fence it or it is stranded.
    alive = POLICY.decide(FailedMigration(F, 0), owned_by(2), {2}, is_stranded=False, now=0.0)
    assert alive.action == RetryAction.STOP
    assert alive.reason == "partition 0 is owned by live node 2: no failover needed"
    assert decide(FailedMigration(F, 0, allow_live_owner=True), 2, {2})[0] == RetryAction.RETRY
    assert decide(FailedMigration(F, 0), 2, {2}, is_stranded=True)[0] == RetryAction.RETRY
    # Out of retries: given up, named as the caller names it.
    spent = FailedMigration(F, 0, attempt=4, label="failover_partition")
    out = POLICY.decide(spent, owned_by(1), {2}, is_stranded=False, now=0.0)
    assert out.action == RetryAction.STOP
    assert out.reason == "failover_partition of partition 0 failed 4 time(s); max_retries is 3: giving up"
    ninth = FailedMigration(G, 0, to_node=2, attempt=9)
    unnamed = POLICY.decide(ninth, owned_by(1), {1, 2}, is_stranded=False, now=0.0)
    assert unnamed.reason.startswith("graceful migration of partition 0 failed 9 time(s)")


def test_the_policy_of_a_migrations_limits() -> None:
    assert RetryPolicy.of(MigrationConfig(max_retries=1, retry_delay_s=2.5)) == RetryPolicy(1, 2.5)
    assert RetryPolicy.of(MigrationConfig()) == RetryPolicy()


@pytest.fixture
def ledger(store: ObjectStore) -> Ledger:
    return new_ledger(store, 2)


def test_decide_retry_reads_the_ledger_and_fails_an_overdue_record_first(ledger: Ledger) -> None:
    ledger.members.register_node(N(1), heartbeat_timeout_s=60)
    ledger.members.register_node(N(2), heartbeat_timeout_s=60)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    missing = decide_retry(ledger, FailedMigration(G, 5, to_node=2), POLICY)
    assert missing.action == RetryAction.STOP and missing.reason == "partition 5 does not exist"
    stale = MigrationCoordinator(ledger, MigrationConfig(migration_timeout_s=0.05)).plan(P(0), N(2))
    time.sleep(0.1)  # the run driving it died without recording anything
    before = time.time()
    retry = decide_retry(ledger, FailedMigration(G, 0, to_node=2), POLICY)
    assert retry.action == RetryAction.RETRY and retry.attempt == 2 and retry.not_before >= before + 5.0
    current = MigrationCoordinator(ledger).current(P(0))
    assert current is not None and current.migration_id == stale.migration_id
    assert current.phase == MigrationPhase.FAILED and (current.error or "").startswith("deadline exceeded")
    # Node 1 dies: the failed move becomes a failover of its epoch.
    ledger.members.register_node(N(1), heartbeat_timeout_s=0.05)
    time.sleep(0.1)
    failover = decide_retry(ledger, FailedMigration(G, 0, to_node=2), POLICY, now=0.0)
    assert (failover.action, failover.failed_node, failover.epoch, failover.to_node) == (RetryAction.FAILOVER, 1, 1, 2)
