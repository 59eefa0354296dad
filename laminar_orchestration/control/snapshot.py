"""Who owns what, read from the ledger: live nodes, owners, warm copies and one snapshot of it all.

`snapshot_cluster` is the one picture of the cluster's ownership that
`laminar status`, the Dagster ``ownership_map`` asset and the demo's table all
print: per partition the owner, epoch, status, owner liveness, the migration in
flight, committed offset, log end, lag and standbys, and whether a failover is
pending (the owner is dead and no migration has taken the partition yet).

What the Dagster assets show is computed here too, the code location only
translating it into observations and checks: the ownership rows and their
health (`report_ownership`), the live-owner check (`check_live_owners`), each
partition's last committed manifest (`checkpoint_rows`) and whether the stream
keeps up (`stream_progress`), with the data versions (`fingerprint`).
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import PartitionManifest
from laminar_orchestration.protocol.membership import NodeView
from laminar_orchestration.protocol.move_reports import MoveReports
from laminar_orchestration.protocol.records import NodeStatus, PartitionStatus
from laminar_orchestration.protocol.tasks import MigrationTask
from laminar_orchestration.store.metering import RequestPrices

if TYPE_CHECKING:
    from laminar_orchestration.protocol.source import SourceLog

__all__ = [
    "WARM_STATES",
    "ClusterSnapshot",
    "LiveOwnersCheck",
    "NodeSnapshot",
    "OwnershipReport",
    "PartitionSnapshot",
    "StreamProgress",
    "check_live_owners",
    "checkpoint_rows",
    "checkpoints_version",
    "fingerprint",
    "is_alive",
    "live_node_ids",
    "migrations_in_flight",
    "ownership_health",
    "ownership_map",
    "ownership_rows",
    "report_ownership",
    "snapshot_cluster",
    "stream_progress",
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


# --- what the Dagster assets show: ownership rows, the live-owner check, the manifests, progress ------


def fingerprint(value: Any) -> str:
    """A short stable hash of JSON-able data: the data version of an observation."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def ownership_signature(ledger: Ledger) -> str:
    """A fingerprint of what moves whenever the ownership map may have: each node's status,
    generation and liveness, its assignment's version and its move report.

    Three reads a node, none a partition: every grant follows a desired state that moves the
    assignment of a node it names, a clean stop's releases move the node's status, and a phase
    of a move in flight its node's move report. An observer reads every partition's records only
    when this changed (and now and then, for what it cannot show: the ledger written by hand).
    """
    desired = DesiredStates(ledger, nudge=False)
    reports = MoveReports(ledger)
    parts = []
    for view in ledger.members.nodes():
        node = NodeId(view.record.node)
        assignment, _ = desired.assignment(node)
        report = reports.read(node)
        parts.append(
            (
                int(node),
                str(view.record.status),
                view.record.generation,
                is_alive(view, None),
                assignment.version if assignment is not None else 0,
                report.model_dump(mode="json") if report is not None else None,
            )
        )
    return fingerprint(parts)


#: The ownership rows this process read last, per store: a look at one node's death patches them
#: instead of reading every partition again on the failover's path.
_LAST_ROWS: dict[str, tuple[dict[str, Any], ...]] = {}


def ownership_rows_patched(ledger: Ledger, changed: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """The rows this process last read (`ownership_rows`) with the `changed` ones over them, kept so:
    what a caller that knows what just changed shows without reading every partition. None when
    this process read none yet."""
    last = _LAST_ROWS.get(ledger.store.url)
    if last is None:
        return None
    rows = patch_rows(last, changed)
    _LAST_ROWS[ledger.store.url] = tuple(rows)
    return rows


def patch_rows(rows: Sequence[Mapping[str, Any]], changed: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`rows` with the `changed` ones over them (nothing read, nothing kept)."""
    return [dict(changed.get(int(r["partition"]), r)) for r in rows]


def ownership_rows(ledger: Ledger) -> list[dict[str, Any]]:
    """One row per partition: partition, epoch, owner, status, owner_alive, migration ("" or "id (phase)").

    From `snapshot_cluster` without the offsets: they change with every
    commit, and the rows are what an observer fingerprints.
    """
    rows = _ownership_rows(ledger)
    _LAST_ROWS[ledger.store.url] = tuple(rows)
    return rows


def _ownership_rows(ledger: Ledger) -> list[dict[str, Any]]:
    views = ledger.members.nodes()
    live = {v.record.node for v in views if v.alive}
    rows = _rows_of(ledger, DesiredStates(ledger, nudge=False), (int(p) for p in ledger.partitions()), live)
    return with_failures([rows[p] for p in sorted(rows)], views)


def with_failures(rows: Sequence[Mapping[str, Any]], views: Iterable[NodeView]) -> list[dict[str, Any]]:
    """`rows` with ``failure``: the last failure the owner reports for the partition ("" while it runs).

    Read from the node records a look reads anyway: a processor that raised shows at the next look.
    """
    failures = {
        (v.record.node, p): progress.last_failure or progress.error or "failed"
        for v in views
        for p, progress in v.record.partitions.items()
        if progress.consecutive_failures or progress.state == "failed"
    }
    return [{**r, "failure": failures.get((int(r["owner"]), int(r["partition"])), "")} for r in rows]


class OwnershipRows:
    """`ownership_rows` kept between looks by one process (the observation sensor's): a look reads
    every node's record and assignment, and the records of only the partitions whose listed
    revision moved in an assignment, or whose node changed status, generation or liveness (all of
    them when a node joined or left).

    Every grant follows a desired state that moves the assignment of a node it names, so a move's
    phases are seen as its nodes learn them; what no assignment shows (a ledger written by hand)
    waits for the next full look, every `full_every_s` by this object's own clock (a look cut short
    by its caller's deadline goes on at the next call). Thread-safe.
    """

    def __init__(self, full_every_s: float = 300.0) -> None:
        self.full_every_s = full_every_s
        self._full_at = -math.inf
        self._lock = threading.Lock()
        self._rows: dict[int, dict[str, Any]] = {}
        #: node -> its assignment's partitions and revisions at the last look.
        self._listed: dict[int, dict[int, int]] = {}
        #: node -> (status, generation, alive) at the last look.
        self._nodes: dict[int, tuple[str, int, bool]] = {}
        #: A full read under way: the partitions left, the rows read so far.
        self._todo: list[int] | None = None
        self._staging: dict[int, dict[str, Any]] = {}

    def rows(self, ledger: Ledger, *, deadline: float | None = None) -> list[dict[str, Any]] | None:
        """Every partition's row, read again where its records may have moved (all of them when due).

        A full read stops at `deadline` (`time.monotonic()`) and goes on at the next call: None
        until it is complete (the rows of a large cluster take more than one sensor tick).
        """
        with self._lock:
            views = ledger.members.nodes()
            desired = DesiredStates(ledger, nudge=False)
            listed = {v.record.node: dict(a.partitions) if (a := desired.assignment(NodeId(v.record.node))[0]) else {}
                      for v in views}  # fmt: skip
            nodes = {v.record.node: (str(v.record.status), v.record.generation, v.alive) for v in views}
            live = {n for n, (_, _, alive) in nodes.items() if alive}
            # A node that joined or left: every partition (a rare event, and placements follow it).
            due = time.monotonic() - self._full_at >= self.full_every_s
            wanted = due or not self._rows or nodes.keys() != self._nodes.keys()
            if wanted and self._todo is None:
                self._todo = [int(p) for p in ledger.partitions()]
                self._staging = {}
                self._listed, self._nodes = listed, nodes  # what the full read is measured against
            if self._todo is not None:
                while self._todo and (deadline is None or time.monotonic() < deadline):
                    chunk, self._todo = self._todo[:_CHUNK], self._todo[_CHUNK:]
                    self._staging.update(_rows_of(ledger, desired, chunk, live))
                if self._todo:
                    return None
                self._rows, self._todo, self._full_at = self._staging, None, time.monotonic()
            # What moved since the last look (or since the full read began).
            changed: set[int] = set()
            for node in listed.keys() | self._listed.keys():
                now_, before = listed.get(node, {}), self._listed.get(node, {})
                changed |= {p for p in now_.keys() | before.keys() if now_.get(p) != before.get(p)}
            for node in nodes.keys() | self._nodes.keys():
                if nodes.get(node) != self._nodes.get(node):
                    changed |= set(listed.get(node, {})) | {p for p, r in self._rows.items() if r["owner"] == node}
            self._rows.update(_rows_of(ledger, desired, changed, live))
            self._listed, self._nodes = listed, nodes
            rows = with_failures([self._rows[p] for p in sorted(self._rows)], views)
        _LAST_ROWS[ledger.store.url] = tuple(rows)
        return rows


#: Partitions a full read of `OwnershipRows` or `CheckpointRows` reads between looks at its deadline.
_CHUNK = 50


def _rows_of(
    ledger: Ledger, desired: DesiredStates, partitions: Iterable[int], live: set[int]
) -> dict[int, dict[str, Any]]:
    """The `ownership_rows` rows of `partitions` (their ownership and desired state read)."""
    rows = {}
    for pid, own in ledger.ownerships([PartitionId(p) for p in sorted(partitions)]).items():
        if own is None:
            continue
        task = desired.read(pid)[0].migration
        moving = task is not None and not task.is_terminal
        rows[int(pid)] = {
            "partition": int(pid),
            "epoch": own.epoch,
            "owner": int(own.owner),
            "status": own.status.value,
            "owner_alive": int(own.owner) in live,
            "migration": f"{task.migration_id} ({task.phase})" if task is not None and moving else "",
        }
    return rows


def ownership_health(row: Mapping[str, Any]) -> str:
    """One word on an `ownership_rows` row: what an operator must know first."""
    if row["owner"] == UNASSIGNED:
        return "unassigned"
    if row["status"] == PartitionStatus.RELEASED and not row["migration"]:
        return f"released by node {row['owner']}"  # a clean stop: nobody died holding it
    if not row["owner_alive"]:
        return "failover in flight" if row["migration"] else "owner dead: failover pending"
    if row.get("failure"):
        return f"failed: {row['failure']}"
    return "moving" if row["migration"] else "ok"


@dataclass(frozen=True)
class OwnershipReport:
    """The ownership map as an operator reads it: the rows with their health, and the figures that matter."""

    #: `ownership_rows` with a "health" word each (`ownership_health`).
    rows: tuple[dict[str, Any], ...]
    live_nodes: tuple[int, ...]
    cluster_epoch: int
    store: str

    @property
    def on_dead_nodes(self) -> int:
        """Partitions whose owner is dead."""
        return sum(1 for r in self.rows if r["owner"] != UNASSIGNED and not r["owner_alive"])

    @property
    def migrations_in_flight(self) -> int:
        """Partitions a migration is moving."""
        return sum(1 for r in self.rows if r["migration"])

    @property
    def unassigned(self) -> int:
        """Partitions nobody owns."""
        return sum(1 for r in self.rows if r["owner"] == UNASSIGNED)

    @property
    def version(self) -> str:
        """The data version: ownership only (partition, epoch, owner, status); liveness makes no new version."""
        return fingerprint([(r["partition"], r["epoch"], r["owner"], r["status"]) for r in self.rows])


def report_ownership(ledger: Ledger, rows: Sequence[Mapping[str, Any]] | None = None) -> OwnershipReport:
    """The ownership map as the ledger shows it now (or as `rows`, read a moment ago), with the live nodes."""
    table = [{**r, "health": ownership_health(r)} for r in (rows if rows is not None else ownership_rows(ledger))]
    return OwnershipReport(
        rows=tuple(table),
        live_nodes=tuple(sorted(live_node_ids(ledger))),
        cluster_epoch=ledger.members.record().cluster_epoch,
        store=ledger.store.url,
    )


@dataclass(frozen=True)
class LiveOwnersCheck:
    """Whether every partition is owned by a live node; the others named with their health."""

    partitions: int
    #: "p3 (owner dead: failover pending)", one per partition unassigned or on a dead node.
    troubled: tuple[str, ...]

    @property
    def passed(self) -> bool:
        """True when no partition is unassigned or on a dead node."""
        return not self.troubled

    @property
    def listing(self) -> str:
        """The troubled partitions in one line ("-": none)."""
        return ", ".join(self.troubled) or "-"

    @property
    def description(self) -> str:
        """The check's one-line verdict."""
        if self.passed:
            return f"all {self.partitions} partitions on live nodes"
        return f"{len(self.troubled)} of {self.partitions} partitions not on a live node: {self.listing}"


def check_live_owners(rows: Sequence[Mapping[str, Any]]) -> LiveOwnersCheck:
    """The live-owner check over `ownership_rows` rows."""
    troubled = tuple(
        f"p{r['partition']} ({ownership_health(r)})" for r in rows if r["owner"] == UNASSIGNED or not r["owner_alive"]
    )
    return LiveOwnersCheck(partitions=len(rows), troubled=troubled)


def checkpoint_rows(ledger: Ledger, manifests: ManifestReader) -> list[dict[str, Any]]:
    """One row per partition with a committed manifest (partitions never committed are left out):
    seq, fencing token, node, offsets, snapshot and delta sizes, outputs, commit id and time."""
    rows = []
    for p in ledger.partitions():
        version = manifests.current(PartitionId(p))
        if version is not None:
            rows.append(_checkpoint_row(int(p), version.manifest))
    return rows


def _checkpoint_row(partition: int, m: PartitionManifest) -> dict[str, Any]:
    return {
        "partition": partition,
        "seq": m.seq,
        "fencing_token": m.fencing_token,
        "node": m.node,
        "source_offset": m.source_offset,
        "state_offset": m.state_offset,
        "events_applied": m.events_applied,
        "snapshot_files": len(m.snapshot.files) if m.snapshot else 0,
        "snapshot_bytes": m.snapshot.size if m.snapshot else 0,
        "deltas": len(m.deltas),
        "delta_bytes": sum(d.ref.size for d in m.deltas),
        "outputs": len(m.outputs),
        "commit_ulid": m.commit_ulid,
        "committed_at": m.committed_at.isoformat(),
    }


class CheckpointRows:
    """`checkpoint_rows` kept between looks by one process (the observation sensor's).

    A partition's manifest is read again only when the nodes report another commit of it (or
    another node or epoch runs it) in their heartbeats, which the look reads anyway, and every
    partition's every `full_every_s`: an idle cluster's look reads no manifest.
    """

    def __init__(self, full_every_s: float = 300.0) -> None:
        self.full_every_s = full_every_s
        self._full_at = -math.inf
        #: partition -> (what the nodes reported of it when its row was read, the row or None).
        self._rows: dict[int, tuple[Any, dict[str, Any] | None]] = {}
        #: The partitions a full look still has to read (None: none under way).
        self._due: set[int] | None = None

    def rows(
        self, ledger: Ledger, manifests: ManifestReader, *, deadline: float | None = None
    ) -> list[dict[str, Any]] | None:
        """The rows as `checkpoint_rows` returns them; None when `deadline` (`time.monotonic()`)
        came before every manifest due was read (the next call goes on from there)."""
        reported: dict[int, list[tuple[int, int, str, int]]] = {}
        for view in ledger.members.nodes():
            for p, progress in view.record.partitions.items():
                if progress.state not in WARM_STATES:  # a standby's progress is not a commit
                    key = (view.record.node, progress.epoch, progress.state, progress.commits)
                    reported.setdefault(int(p), []).append(key)
        partitions = [int(p) for p in ledger.partitions()]
        if self._due is None and time.monotonic() - self._full_at >= self.full_every_s:
            self._due = set(partitions)  # every manifest, over as many calls as it takes
        out, complete = [], True
        for p in partitions:
            seen = sorted(reported.get(p, []))
            cached = self._rows.get(p)
            if cached is None or cached[0] != seen or (self._due is not None and p in self._due):
                if deadline is not None and time.monotonic() >= deadline:
                    complete = False
                    continue
                version = manifests.current(PartitionId(p))
                cached = (seen, None if version is None else _checkpoint_row(p, version.manifest))
                self._rows[p] = cached
                if self._due is not None:
                    self._due.discard(p)
            if cached[1] is not None:
                out.append(cached[1])
        if self._due is not None and not self._due:
            self._due, self._full_at = None, time.monotonic()
        return out if complete else None


def checkpoints_version(rows: Sequence[Mapping[str, Any]]) -> str:
    """The data version of `checkpoint_rows`: each partition's last commit."""
    return fingerprint([(r["partition"], r["seq"], r["commit_ulid"]) for r in rows])


@dataclass(frozen=True)
class StreamProgress:
    """Whether every partition kept up since the last report: committed since, or nothing left to commit."""

    #: partition -> seq of its last committed manifest (absent: never committed).
    seqs: dict[int, int]
    #: partition -> events in its source log not committed yet.
    lags: dict[int, int]
    #: Partitions with events to commit and no commit since the last report.
    behind: list[int]

    @property
    def keeping_up(self) -> bool:
        """True when no partition is behind."""
        return not self.behind

    @property
    def uncommitted_events(self) -> int:
        """Events in all the source logs not committed yet."""
        return sum(self.lags.values())

    def behind_listing(self) -> str:
        """The partitions behind with their uncommitted events, in one line ("-": none)."""
        return ", ".join(f"p{p} ({self.lags[p]} events)" for p in self.behind) or "-"


def stream_progress(ledger: Ledger, rows: Sequence[Mapping[str, Any]], reported: Mapping[int, int]) -> StreamProgress:
    """Each partition's progress since the manifests `reported` (partition -> seq) at the last report,
    from its `checkpoint_rows` row and its source log's end as the producers recorded it (one read
    for every partition; it may lag a producer that died between a segment and its record)."""
    source = _source_log(ledger)
    ends = source.log_ends()
    by_partition = {r["partition"]: r for r in rows}
    seqs, lags, behind = {}, {}, []
    for p in (int(p) for p in ledger.partitions()):
        row = by_partition.get(p)
        committed = row["source_offset"] if row else 0
        # No recorded ends at all: a store from before producers recorded them, read each head.
        end = ends.get(p, 0) if ends is not None else source.end_offset(p)
        lags[p] = max(0, end - committed)
        if row is not None:
            seqs[p] = row["seq"]
        progressed = row is not None and reported.get(p) != row["seq"]
        if lags[p] > 0 and not progressed:
            behind.append(p)
    return StreamProgress(seqs=seqs, lags=lags, behind=behind)


def _source_log(ledger: Ledger) -> SourceLog:
    # Imported here: the source log brings pyarrow, which the commands that only move partitions
    # (`laminar migrate`, `failover`: imported on every launch) never need.
    from laminar_orchestration.protocol.source import SourceLog

    return SourceLog(ledger.store)
