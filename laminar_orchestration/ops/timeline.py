"""The data of `laminar report`: every partition's epoch grants as spans on a timeline, read
through the ledger, manifest and source APIs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import EpochGrant, GrantKind, NodeStatus, now
from laminar_orchestration.protocol.source import SourceLog

#: How an epoch began (the marker drawn at its start).
PLACEMENT = "placement"
MIGRATION = "migration"
FAILOVER = "failover"
FENCED = "fenced"

# --- the data -------------------------------------------------------------------------


@dataclass(frozen=True)
class EpochSpan:
    """One epoch of one partition: who held it, how it began, and for how long."""

    partition: int
    epoch: int
    node: int
    grant_kind: str
    #: placement | migration | failover | fenced (granted to nobody).
    transition: str
    previous_owner: int
    reason: str
    granted_at: datetime
    #: When the holder released it (graceful handoff), else None.
    released_at: datetime | None
    #: The next grant's time, or the end of the report for the current epoch.
    ends_at: datetime
    current: bool


@dataclass(frozen=True)
class PartitionSummary:
    """A partition's epochs and its committed progress."""

    partition: int
    owner: int
    epoch: int
    status: str
    committed_offset: int
    source_end: int
    manifests: int
    last_commit_at: datetime | None
    spans: list[EpochSpan] = field(default_factory=list)

    @property
    def lag(self) -> int:
        """Events appended to the source but not committed yet."""
        return max(0, self.source_end - self.committed_offset)


@dataclass(frozen=True)
class NodeSummary:
    """A member node as the ledger last saw it."""

    node: int
    alive: bool
    status: str
    generation: int
    heartbeat_at: datetime


@dataclass(frozen=True)
class TimelineReport:
    """Everything the report shows, read from one store."""

    store_url: str
    cluster_id: str
    created_at: datetime
    generated_at: datetime
    #: The time axis: from the cluster's creation to the last activity seen in the store.
    start: datetime
    end: datetime
    partitions: list[PartitionSummary]
    nodes: list[NodeSummary]

    @property
    def spans(self) -> list[EpochSpan]:
        """Every epoch of every partition, by partition then epoch."""
        return [s for p in self.partitions for s in p.spans]

    def count(self, transition: str) -> int:
        """How many epochs began with `transition` (migration, failover, ...)."""
        return sum(1 for s in self.spans if s.transition == transition)

    @property
    def node_ids(self) -> list[int]:
        """Every node that held an epoch or is a member, ascending."""
        ids = {s.node for s in self.spans if s.node != UNASSIGNED} | {n.node for n in self.nodes}
        return sorted(ids)


def _transition(grant_kind: str, node: int, previous_owner: int) -> str:
    if node == UNASSIGNED:
        return FENCED
    if previous_owner == UNASSIGNED:
        return PLACEMENT
    return MIGRATION if grant_kind == GrantKind.ACQUIRE else FAILOVER


def collect_report(ledger: Ledger, *, generated_at: datetime | None = None) -> TimelineReport:
    """Read grants, releases, manifests and source heads of every partition of the cluster.

    The time axis ends at the last activity the store shows (a heartbeat, a
    commit, an append, a grant or a release), not at the wall clock, so the
    report of a demo that stopped an hour ago is not mostly empty space.
    """
    cluster = ledger.cluster()
    generated = generated_at or now()
    store = ledger.store
    manifests = ManifestReader(store)
    source = SourceLog(store, partitions=cluster.partitions)
    nodes = []
    for v in ledger.members.nodes(at=generated):
        # A node still marked alive whose heartbeat is stale is dead (killed, not stopped).
        status = "dead" if v.record.status == NodeStatus.ALIVE and not v.alive else v.record.status.value
        nodes.append(NodeSummary(v.record.node, v.alive, status, v.record.generation, v.record.heartbeat_at))
    activity: list[datetime] = [cluster.created_at, *(n.heartbeat_at for n in nodes)]
    histories: list[tuple[PartitionSummary, list[tuple[EpochGrant, datetime | None]]]] = []
    for p in ledger.partitions():
        history = []
        for g in ledger.grants(p):
            release = ledger.release_record(p, g.epoch)
            history.append((g, release.released_at if release else None))
            activity.append(g.granted_at)
            if release is not None:
                activity.append(release.released_at)
        current = manifests.current(p)
        head = source.head(int(p))
        own = ledger.ownership(PartitionId(p))
        if current is not None:
            activity.append(current.manifest.committed_at)
        if head is not None:
            activity.append(head.updated_at)
        summary = PartitionSummary(
            partition=int(p),
            owner=int(own.owner) if own else UNASSIGNED,
            epoch=own.epoch if own else 0,
            status=own.status.value if own else "unknown",
            committed_offset=current.manifest.source_offset if current else 0,
            source_end=head.next_offset if head else 0,
            manifests=current.manifest.seq if current else 0,
            last_commit_at=current.manifest.committed_at if current else None,
        )
        histories.append((summary, history))
    start = cluster.created_at
    # A store built within milliseconds (tests, a fresh demo) still gets a readable axis.
    end = max(max(activity), start + timedelta(seconds=1))
    partitions = []
    for summary, history in histories:
        spans = []
        for i, (g, released_at) in enumerate(history):
            nxt = history[i + 1][0] if i + 1 < len(history) else None
            spans.append(
                EpochSpan(
                    partition=summary.partition,
                    epoch=g.epoch,
                    node=g.node,
                    grant_kind=str(g.grant_kind),
                    transition=_transition(g.grant_kind, g.node, g.previous_owner),
                    previous_owner=g.previous_owner,
                    reason=g.reason,
                    granted_at=g.granted_at,
                    released_at=released_at,
                    ends_at=max(nxt.granted_at if nxt else end, g.granted_at),
                    current=nxt is None,
                )
            )
        partitions.append(replace(summary, spans=spans))
    return TimelineReport(
        store_url=store.url,
        cluster_id=cluster.cluster_id,
        created_at=cluster.created_at,
        generated_at=generated,
        start=start,
        end=end,
        partitions=partitions,
        nodes=nodes,
    )
