"""Who owns what, read from the ledger: live nodes, owners, warm copies and one snapshot of it all.

`snapshot_cluster` is the one picture of the cluster's ownership that
`laminar status`, the Dagster ``ownership_map`` asset and the demo's table all
print: per partition the owner, epoch, status, owner liveness, the migration in
flight, committed offset, log end, lag and standbys, and whether a failover is
pending (the owner is dead and no migration has taken the partition yet).

What the Dagster assets show of it is computed beside it: the ownership rows,
their health and the live-owner check in `control.ownership`, each partition's
last committed manifest and whether the stream keeps up in `control.progress`;
their data versions are `fingerprint`s.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.membership import NodeView
from laminar_orchestration.protocol.records import NodeStatus, PartitionStatus
from laminar_orchestration.protocol.tasks import MigrationTask
from laminar_orchestration.store.metering import RequestPrices

if TYPE_CHECKING:
    from laminar_orchestration.protocol.source import SourceLog

__all__ = [
    "WARM_STATES",
    "ClusterSnapshot",
    "NodeSnapshot",
    "PartitionSnapshot",
    "fingerprint",
    "is_alive",
    "live_node_ids",
    "migrations_in_flight",
    "ownership_map",
    "snapshot_cluster",
    "warm_copies",
]

#: Progress states in which a node holds a warm copy of a partition it does not own.
WARM_STATES = frozenset({"standby", "warming"})


def is_alive(view: NodeView, heartbeat_timeout_s: float | None) -> bool:
    """Whether `view`'s node is alive, judged by `heartbeat_timeout_s` (None: the node's own timeout)."""
    if heartbeat_timeout_s is None:
        return view.alive
    return view.record.status == NodeStatus.ALIVE and view.heartbeat_age_s <= heartbeat_timeout_s


def live_node_ids(ledger: Ledger, *, heartbeat_timeout_s: float | None = None) -> set[int]:
    """Member nodes that are alive: status alive and a heartbeat younger than the timeout.

    `heartbeat_timeout_s` overrides each node's own timeout (the failure sensor's setting).
    """
    return {view.record.node for view in ledger.members.nodes() if is_alive(view, heartbeat_timeout_s)}


def ownership_map(ledger: Ledger) -> dict[int, int]:
    """Partition -> current owner (0: unassigned) for every partition of the cluster."""
    return {
        int(p): (int(own.owner) if own is not None else UNASSIGNED)
        for p, own in ledger.ownerships(ledger.partitions()).items()
    }


def warm_copies(views: Iterable[NodeView]) -> dict[int, dict[int, int]]:
    """partition -> {node: lag in events} of the live nodes reporting a warm copy of it."""
    warm: dict[int, dict[int, int]] = {}
    for view in views:
        if not view.alive:
            continue
        for p, progress in view.record.partitions.items():
            if progress.state in WARM_STATES and progress.lag is not None and progress.error is None:
                warm.setdefault(int(p), {})[view.record.node] = progress.lag
    return warm


def migrations_in_flight(ledger: Ledger) -> dict[int, MigrationTask]:
    """partition -> its migration that has not ended yet (partitions not moving are left out)."""
    return {
        int(p): state.migration
        for p, state in DesiredStates(ledger).all().items()
        if state.migration is not None and not state.migration.is_terminal
    }


@dataclass(frozen=True)
class PartitionSnapshot:
    """One partition as the ledger, its manifest chain and its source log show it."""

    partition: int
    epoch: int
    #: 0: unassigned.
    owner: int
    #: The ownership status (`PartitionStatus` value): active, released, ...
    status: str
    #: True when the ledger's head record lagged its grants and was rolled forward.
    head_lagged: bool
    owner_alive: bool
    #: The migration moving the partition now, if any.
    migration: MigrationTask | None
    #: Offset reached by the last committed manifest; None when offsets were not read.
    committed_offset: int | None
    #: End of the partition's source log; None when offsets were not read.
    log_end: int | None
    #: node -> lag in events of the live nodes holding a warm copy.
    standbys: Mapping[int, int] = field(default_factory=dict)
    #: Consecutive failures of the owner's worker and the last one's reason.
    failures: int = 0
    last_failure: str | None = None

    @property
    def lag(self) -> int | None:
        """Events in the source log not committed yet (None when offsets were not read)."""
        if self.committed_offset is None or self.log_end is None:
            return None
        return max(0, self.log_end - self.committed_offset)

    @property
    def failover_pending(self) -> bool:
        """The owner is dead and no migration is moving the partition yet: it waits for a failover.

        A partition its owner released (a clean stop) waits for no failover: nobody died holding it.
        """
        return (
            self.owner != UNASSIGNED
            and not self.owner_alive
            and self.migration is None
            and self.status != PartitionStatus.RELEASED
        )

    def phase_text(self) -> str:
        """The status with the migration in flight, e.g. ``graceful 1→2 (draining)``, for tables."""
        task = self.migration
        if task is not None:
            return f"{task.migration_kind} {task.from_node or '-'}→{task.to_node} ({task.phase})"
        if self.status == PartitionStatus.RELEASED and self.owner != UNASSIGNED:
            return f"released by node {self.owner}"
        if self.failover_pending:
            return f"failover pending (node {self.owner} dead)"
        return self.status


@dataclass(frozen=True)
class NodeSnapshot:
    """One member node: identity, heartbeat and liveness as judged when the snapshot was taken."""

    node: int
    generation: int
    status: str
    alive: bool
    last_heartbeat: datetime
    heartbeat_age_s: float
    host: str
    pid: int
    #: Store requests per second by method over the node's last heartbeat interval (empty: not reported).
    requests_per_s: Mapping[str, float] = field(default_factory=dict)
    #: The busiest "METHOD family" pairs over that interval, in requests per second.
    busiest_requests: Mapping[str, float] = field(default_factory=dict)

    @property
    def request_rate(self) -> float:
        """All the node's store requests per second."""
        return sum(self.requests_per_s.values())

    @property
    def liveness(self) -> str:
        """What the node is now: ``dead`` for a member whose heartbeat is older than its timeout,
        else its recorded status (``alive``, ``leaving``, ``left``)."""
        return "dead" if self.status == NodeStatus.ALIVE and not self.alive else self.status


@dataclass(frozen=True)
class ClusterSnapshot:
    """Every partition's ownership and every node's liveness, read once."""

    store: str
    cluster_id: str
    cluster_epoch: int
    partitions: tuple[PartitionSnapshot, ...]
    nodes: tuple[NodeSnapshot, ...]
    #: False: a summary from node and assignment records (`control.watch.summarize_cluster`).
    detail: bool = True

    def request_rate(self) -> float:
        """The live nodes' store requests per second, as their last heartbeats report them."""
        return sum(n.request_rate for n in self.nodes if n.alive)

    def monthly_request_cost(self, prices: RequestPrices | None = None) -> float:
        """The live nodes' request rate as dollars per month at `prices` (default: S3 list prices)."""
        rates: dict[str, float] = {}
        for n in self.nodes:
            if n.alive:
                for method, rate in n.requests_per_s.items():
                    rates[method] = rates.get(method, 0.0) + rate
        return (prices or RequestPrices()).monthly_cost(rates)

    def owned_by(self, node: int) -> list[int]:
        """The partitions `node` owns."""
        return [p.partition for p in self.partitions if p.owner == node]

    def to_json(self) -> dict[str, Any]:
        """The snapshot as plain JSON: what `laminar status --json` prints."""
        return {
            "store": self.store,
            "cluster_id": self.cluster_id,
            "cluster_epoch": self.cluster_epoch,
            "detail": self.detail,
            "partitions": [
                {
                    "partition": p.partition,
                    "epoch": p.epoch,
                    "owner": p.owner,
                    "status": p.status,
                    "head_lagged": p.head_lagged,
                    "owner_alive": p.owner_alive,
                    "failover_pending": p.failover_pending,
                    "migration": None if p.migration is None else p.migration.migration_id,
                    "committed_offset": p.committed_offset,
                    "log_end": p.log_end,
                    "lag": p.lag,
                    "standbys": {str(n): lag for n, lag in sorted(p.standbys.items())},
                    "failures": p.failures,
                    "last_failure": p.last_failure,
                }
                for p in self.partitions
            ],
            "nodes": [
                {
                    "node": n.node,
                    "generation": n.generation,
                    "status": n.status,
                    "liveness": n.liveness,
                    "alive": n.alive,
                    "last_heartbeat": n.last_heartbeat.isoformat(),
                    "heartbeat_age_s": round(n.heartbeat_age_s, 3),
                    "host": n.host,
                    "pid": n.pid,
                    "requests_per_s": dict(n.requests_per_s),
                    "busiest_requests": dict(n.busiest_requests),
                }
                for n in self.nodes
            ],
            "requests": {
                "per_s": round(self.request_rate(), 3),
                "monthly_cost_usd": round(self.monthly_request_cost(), 2),
                "prices": RequestPrices().model_dump(),
            },
        }


def snapshot_cluster(
    ledger: Ledger,
    *,
    offsets: bool = True,
    heartbeat_timeout_s: float | None = None,
    partitions: Sequence[int] | None = None,
) -> ClusterSnapshot:
    """Read the cluster's ownership once: partitions (owner, epoch, status, migration, offsets) and nodes.

    ``offsets=False`` skips the manifest and source-log reads (two per
    partition): what changes with every commit is then left out, as an
    observer that fingerprints ownership wants. `heartbeat_timeout_s`
    overrides each node's own timeout when judging liveness; `partitions` reads only those.
    Per-partition records are read in parallel on remote stores (the ledger's pool).
    """
    cluster = ledger.cluster()
    membership = ledger.members.record()
    views = ledger.members.nodes()
    live = {v.record.node for v in views if is_alive(v, heartbeat_timeout_s)}
    # What the owner reports about its worker: consecutive failures and the last reason.
    progress = {(v.record.node, int(p)): pr for v in views for p, pr in v.record.partitions.items()}
    standbys = warm_copies(views)
    wanted = ledger.partitions() if partitions is None else [PartitionId(p) for p in sorted(set(partitions))]
    states = DesiredStates(ledger, nudge=False).read_many(wanted)
    moving = {int(p): s.migration for p, (s, _) in states.items() if s.migration and not s.migration.is_terminal}
    committed_at: dict[int, int] = {}
    ends: dict[int, int] = {}
    if offsets:
        manifests, source = ManifestReader(ledger.store), _source_log(ledger)
        current = ledger.read_each(manifests.current, wanted)
        committed_at = {int(p): c.manifest.source_offset if c else 0 for p, c in zip(wanted, current, strict=True)}
        # Each log's own end (its head, rolled forward), in parallel: the producers' recorded ends are a
        # hint that lags a producer that died before recording, and the detail must tell the truth.
        heads = ledger.read_each(lambda p: source.end_offset(int(p)), wanted)
        ends = {int(p): e for p, e in zip(wanted, heads, strict=True)}
    rows = []
    for pid, own in ledger.ownerships(wanted).items():
        if own is None:
            continue
        p, owner = int(pid), int(own.owner)
        reported = progress.get((owner, p))
        committed = committed_at.get(p) if offsets else None
        log_end = max(ends.get(p, 0), committed or 0) if offsets else None
        rows.append(
            PartitionSnapshot(
                partition=p,
                epoch=own.epoch,
                owner=owner,
                status=own.status.value,
                head_lagged=own.head_lagged,
                owner_alive=owner in live,
                migration=moving.get(p),
                committed_offset=committed,
                log_end=log_end,
                standbys=dict(sorted(standbys.get(p, {}).items())),
                failures=reported.consecutive_failures if reported else 0,
                last_failure=reported.last_failure if reported else None,
            )
        )
    nodes = tuple(
        NodeSnapshot(
            node=v.record.node,
            generation=v.record.generation,
            status=v.record.status.value,
            alive=v.record.node in live,
            last_heartbeat=v.record.heartbeat_at,
            heartbeat_age_s=v.heartbeat_age_s,
            host=v.record.host,
            pid=v.record.pid,
            requests_per_s=dict(v.record.requests.per_s) if v.record.requests else {},
            busiest_requests=dict(v.record.requests.top_families) if v.record.requests else {},
        )
        for v in views
    )
    return ClusterSnapshot(
        store=ledger.store.url,
        cluster_id=cluster.cluster_id,
        cluster_epoch=membership.cluster_epoch,
        partitions=tuple(rows),
        nodes=nodes,
    )


def fingerprint(value: Any) -> str:
    """A short stable hash of JSON-able data: the data version of an observation."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _source_log(ledger: Ledger) -> SourceLog:
    # Imported here: the source log brings pyarrow, which the commands that only move partitions
    # (`laminar migrate`, `failover`: imported on every launch) never need.
    from laminar_orchestration.protocol.source import SourceLog

    return SourceLog(ledger.store)
