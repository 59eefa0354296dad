"""The control plane's /metrics, read from the ledger at each scrape: moves that ended, fences, owners.

Moves are driven by several processes (Dagster runs, the failure sensor,
``laminar migrate``, the demo), so the control plane does not count them where
they run: whichever process serves these metrics reads the ledger when scraped
and counts each move it sees ended (the partition's desired state keeps its
last move, with its start and end) and each epoch granted since the previous
scrape (grants are immutable and never deleted). A scrape costs a read of each
partition's desired state and ownership, plus one read per new epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Gauge

from laminar_orchestration.control.snapshot import snapshot_cluster
from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.metrics import ControlPlaneMetrics, MetricsServer, serve_metrics
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import EpochGrant, GrantKind
from laminar_orchestration.protocol.tasks import MigrationTask

#: Grants read per partition at the first scrape (the history before it; later scrapes read only new ones).
FIRST_SCRAPE_GRANTS = 256


def move_kind(task: MigrationTask) -> str:
    """graceful, forced, or placement (a partition nobody owned got its first owner)."""
    return "placement" if task.from_node == UNASSIGNED else str(task.migration_kind)


def fence_kind(grant: EpochGrant) -> str | None:
    """failover (an owner fenced out), placement (a partition nobody owned), None (a graceful grant)."""
    if grant.grant_kind != GrantKind.FENCE:
        return None
    return "placement" if grant.previous_owner == UNASSIGNED else "failover"


@dataclass
class LedgerWatch:
    """Counts, at each scrape, what ended in the ledger since the previous one."""

    ledger: Callable[[], Ledger]
    _counted: set[str] = field(default_factory=set)
    _epochs: dict[int, int] = field(default_factory=dict)
    _owner: Gauge | None = None
    _alive: Gauge | None = None

    def gauges(self) -> tuple[Gauge, Gauge]:
        if self._owner is None or self._alive is None:
            self._owner = Gauge(
                "laminar_partition_owner_node", "The node owning the partition (0: none).", ["partition"], registry=None
            )
            self._alive = Gauge(
                "laminar_partition_owner_alive",
                "1 while the partition's owner heartbeats, else 0.",
                ["partition"],
                registry=None,
            )
        return self._owner, self._alive

    def __call__(self, metrics: ControlPlaneMetrics) -> None:
        ledger = self.ledger()
        for state in DesiredStates(ledger).all().values():
            task = state.migration
            if task is None or not task.is_terminal or task.migration_id in self._counted:
                continue
            self._counted.add(task.migration_id)
            ended = task.completed_at or task.updated_at
            metrics.observe_migration(move_kind(task), str(task.phase), (ended - task.started_at).total_seconds())
        owner, alive = self.gauges()
        for snap in snapshot_cluster(ledger, offsets=False).partitions:
            owner.labels(str(snap.partition)).set(snap.owner)
            alive.labels(str(snap.partition)).set(1 if snap.owner != UNASSIGNED and snap.owner_alive else 0)
            self._count_grants(ledger, metrics, snap.partition, snap.epoch)

    def _count_grants(self, ledger: Ledger, metrics: ControlPlaneMetrics, p: int, epoch: int) -> None:
        seen = self._epochs.get(p)
        if seen is None:
            seen = max(0, epoch - FIRST_SCRAPE_GRANTS)
        for e in range(seen + 1, epoch + 1):
            grant = ledger.grant(PartitionId(p), e)
            kind = fence_kind(grant) if grant is not None else None
            if kind is not None:
                metrics.count_fence(kind)
        self._epochs[p] = max(seen, epoch)


def control_plane_metrics(ledger: Callable[[], Ledger], requests: Callable[[], dict[str, int]]) -> ControlPlaneMetrics:
    """The control plane's metrics over the ledger `ledger()` opens (called at the first scrape)."""
    metrics = ControlPlaneMetrics()
    watch = LedgerWatch(ledger)
    metrics.watch(watch, requests, extra=watch.gauges())
    return metrics


def serve_control_plane_metrics(
    port: int, ledger: Callable[[], Ledger], requests: Callable[[], dict[str, int]], host: str = "127.0.0.1"
) -> MetricsServer:
    """Serve the control plane's metrics at ``http://host:port/metrics``."""
    return serve_metrics(port, host, registry=control_plane_metrics(ledger, requests).registry)
