"""Moving partitions during a scenario: the library's rebalance and failover plans, each move retried.

A retry is noted in the scenario's report: a move that needed one may point at
a library problem, and the table shows it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import MoveOutcome, run_moves
from laminar_orchestration.control.operations import failover_move, plan_node_failover, plan_rebalance, rebalance_move
from laminar_orchestration.control.placement import Move
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationError, MigrationPhase, MigrationTask
from laminar_orchestration.store import ObjectStore, StoreError

from .profiles import MIGRATION_CONFIG

T = TypeVar("T")

P = PartitionId


def retrying(fn: Callable[[], T], what: str, note: Callable[[str], None], attempts: int = 3) -> T:
    """Call `fn`, retrying a failed migration; every retry is noted (it may point at a library problem)."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (MigrationError, StoreError) as exc:
            if attempt == attempts:
                raise
            note(f"retried: {what}: attempt {attempt} failed with {type(exc).__name__}: {exc}")
            time.sleep(1.0)
    raise AssertionError("unreachable")


def coordinator_for(ledger: Ledger, config: MigrationConfig) -> MigrationCoordinator:
    """A coordinator polling as often as the store can bear."""
    # Each poll of a node's progress is a few requests; the moto server (one request at a time)
    # shared with the nodes must not spend its time answering them.
    remote = not ledger.store.url.startswith("file:")
    return MigrationCoordinator(ledger, config, poll_interval_s=0.1 if remote else 0.02)


def migrate_unless_there(
    ledger: Ledger, move: Move, live: Collection[int], config: MigrationConfig
) -> MigrationTask | None:
    """`rebalance_move`, where "already active on the target" (an earlier attempt got it there) is success.

    An attempt can time out waiting for the new owner's last report although the
    partition is running there (see the notes of the scenario that retried it).
    """
    coordinator = coordinator_for(ledger, config)
    desired, _ = coordinator.desired.read(P(move.partition))
    own = ledger.ownership(P(move.partition))
    settled = desired.migration is None or desired.migration.phase == MigrationPhase.ACTIVE
    # Only when the desired owner says so too: a move that failed after the new owner took its
    # epoch leaves the ledger naming it while nobody runs the partition (`stranded`: forced again).
    here = own is not None and own.owner == move.to_node and own.status == PartitionStatus.ACTIVE
    if settled and desired.owner == move.to_node and here:
        return None
    return rebalance_move(coordinator, move, live)


def balance(
    ledger: Ledger,
    live: set[int],
    note: Callable[[str], None],
    *,
    weights: Mapping[int, float] | None = None,
    bump_reason: str | None = None,
    config: MigrationConfig = MIGRATION_CONFIG,
) -> list[MoveOutcome[MigrationTask | None]]:
    """`laminar rebalance` over `live`: the library's plan (`plan_rebalance`), each move retried."""
    plan = plan_rebalance(ledger, weights, live=live)
    if not plan.moves:
        return []
    if bump_reason:
        ledger.members.bump_cluster_epoch(bump_reason)

    def move(m: Move) -> MigrationTask | None:
        return retrying(
            lambda: migrate_unless_there(ledger, m, plan.live_nodes, config),
            f"move of partition {m.partition} to node {m.to_node}",
            note,
        )

    return run_moves(plan.moves, move, config.max_concurrent_migrations, live_nodes=plan.live_nodes)


def fail_over(
    ledger: Ledger, node: int, live: set[int], note: Callable[[str], None], config: MigrationConfig = MIGRATION_CONFIG
) -> list[MoveOutcome[MigrationTask | None]]:
    """`laminar failover` of `node`: the library's plan (`plan_node_failover`), each move retried."""
    plan = plan_node_failover(ledger, node, live=live - {node})

    def failover(m: Move) -> MigrationTask | None:
        return retrying(
            lambda: failover_move(coordinator_for(ledger, config), m, plan.takers),
            f"failover of partition {m.partition}",
            note,
        )

    return run_moves(plan.moves, failover, config.max_concurrent_migrations, live_nodes=plan.takers)


def outcome_issues(outcomes: Sequence[MoveOutcome[Any]], what: str) -> list[str]:
    """One issue line per move that failed."""
    return [
        f"{what} of partition {o.move.partition} to node {o.move.to_node} failed: {type(o.error).__name__}: {o.error}"
        for o in outcomes
        if not o.ok
    ]


def events_behind(store: ObjectStore) -> int:
    """Events produced but not yet committed, over all partitions."""
    reader, source = ManifestReader(store), SourceLog(store)
    behind = 0
    for p in Ledger(store).partitions():
        current = reader.current(p)
        behind += max(0, source.end_offset(p) - (current.manifest.source_offset if current else 0))
    return behind


def wait_committed(store: ObjectStore, timeout: float) -> int:
    """Wait until everything produced is committed; return what is still behind at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        behind = events_behind(store)
        if behind == 0 or time.monotonic() > deadline:
            return behind
        time.sleep(0.2)
