"""The cluster as a viewer follows it: reads that follow changes, not partitions.

`ClusterWatch` is what the demo's table and phase lines read, look after look:
each member's assignment record (and the membership once per table), and a
partition's desired state and ownership only when a revision listed for it
moved, a move of it is in flight, or its owner's node changed status,
generation or liveness. Committed offsets come from the owners' heartbeats and
the log ends from the one record of them all, so an idle cluster costs a
viewer a few reads per look, whatever its partitions.

`summarize_cluster` is `laminar status` without ``--detail``: the same picture
from the node records, their assignments and the log ends alone (a few reads a
node), each partition as its owner last reported it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable

from laminar_orchestration.control.snapshot import (
    WARM_STATES,
    ClusterSnapshot,
    NodeSnapshot,
    PartitionSnapshot,
    is_alive,
    warm_copies,
)
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.desired_states import DesiredState, DesiredStates, NodeAssignment
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.keys import NODES_PREFIX, parse_node_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.membership import NodeView
from laminar_orchestration.protocol.records import NodeRecord, PartitionProgress, PartitionStatus, now
from laminar_orchestration.protocol.tasks import MigrationTask

__all__ = ["ClusterWatch", "summarize_cluster"]

#: Worker states in which the owner's report says it runs the partition's batches.
_RUNNING = frozenset({"running", "draining"})


class ClusterWatch:
    """One viewer's picture of the cluster, kept between looks (not thread-safe: one viewer's loop).

    `poll` reads each known member's assignment record and the desired state of only the
    partitions whose listed revision moved (or whose move is in flight); `snapshot` adds the
    membership, the node records, the log ends and the ownership of only the partitions marked
    since. Every desired-state write moves the assignment of a node it names, and every grant
    follows one, so nothing a viewer shows is missed; a full read every `full_every_s` covers a
    ledger written by hand.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        full_every_s: float = 300.0,
        discover_every_s: float = 60.0,
        heartbeat_timeout_s: float | None = None,
    ) -> None:
        self.ledger = ledger
        self.full_every_s = full_every_s
        self.discover_every_s = discover_every_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._desired = DesiredStates(ledger, nudge=False)
        self._partitions: list[int] | None = None
        self._members: set[int] = set()
        self._cluster_epoch = 0
        self._discovered_at = -math.inf
        self._full_at = -math.inf
        #: node -> partition -> revision, as its assignment listed them at the last poll.
        self._listed: dict[int, dict[int, int]] = {}
        self.states: dict[int, DesiredState] = {}
        self._owners: dict[int, Ownership | None] = {}
        #: Partitions whose ownership the next snapshot reads again.
        self._stale: set[int] = set()
        #: node -> (status, generation, alive) at the last snapshot.
        self._node_keys: dict[int, tuple[str, int, bool]] = {}
        self._committed: dict[int, int] = {}
        self._manifests: ManifestReader | None = None

    # -- the cheap look: assignments, and the states that moved ------------------------------

    def poll(self) -> set[int]:
        """Read every member's assignment; read again the desired state of each partition whose listed
        revision moved, whose move was in flight, or all of them when due. The partitions read."""
        if self._partitions is None:
            self._partitions = [int(p) for p in self.ledger.partitions()]
        if not self._members:
            self._read_membership()
        listed: dict[int, dict[int, int]] = {}
        copies: dict[int, DesiredState] = {}
        # The members, and every node a known state names (a move's ends may not be members yet).
        nodes = self._members | {n for s in self.states.values() for n in _named(s)}
        for node in sorted(nodes):
            assignment, _ = self._desired.assignment(NodeId(node))
            listed[node] = dict(assignment.partitions) if assignment is not None else {}
            copies.update(_copies(assignment))
        due = time.monotonic() - self._full_at >= self.full_every_s
        if due:
            wanted = set(self._partitions)
        else:
            wanted = {p for p, s in self.states.items() if s.migration is not None and not s.migration.is_terminal}
            for node in listed.keys() | self._listed.keys():
                now_, before = listed.get(node, {}), self._listed.get(node, {})
                wanted |= {p for p in now_.keys() | before.keys() if now_.get(p) != before.get(p)}
        self._listed = listed
        read = {p for p in wanted if p in copies and self._newer(copies[p])}
        for p in read:
            self.states[p] = copies[p]  # the assignment carries the state at the listed revision
        rest = sorted(wanted - read)
        for pid, (state, _) in self._desired.read_many([PartitionId(p) for p in rest]).items():
            self.states[int(pid)] = state
        if due:
            self._full_at = time.monotonic()
        changed = set(wanted)
        self._stale |= changed
        return changed

    def _newer(self, state: DesiredState) -> bool:
        known = self.states.get(state.partition)
        return known is None or state.revision >= known.revision

    def _read_membership(self) -> None:
        membership = self.ledger.members.record()
        self._cluster_epoch = membership.cluster_epoch
        members = set(membership.members)
        if time.monotonic() - self._discovered_at >= self.discover_every_s:
            # Registered but not admitted yet: a node too (one listing a minute, not one a look).
            members |= {n for n in (parse_node_key(k) for k in self.ledger.store.list(NODES_PREFIX)) if n}
            self._discovered_at = time.monotonic()
        else:
            members |= self._members
        self._members = members

    def moving(self) -> dict[int, MigrationTask]:
        """partition -> its migration in flight, as the last poll read it."""
        return {
            p: s.migration for p, s in self.states.items() if s.migration is not None and not s.migration.is_terminal
        }

    # -- the table: membership, node records, ownership of what moved, offsets ----------------

    def snapshot(self) -> ClusterSnapshot:
        """The cluster as `snapshot_cluster` shows it, read where it may have changed since the last call."""
        self._read_membership()
        self.poll()
        at = now()
        records = [r for r in (self.ledger.members.node(NodeId(n)) for n in sorted(self._members)) if r is not None]
        views = [NodeView.judge(r, at) for r in records]
        live = {v.record.node for v in views if is_alive(v, self.heartbeat_timeout_s)}
        keys = {v.record.node: (str(v.record.status), v.record.generation, v.record.node in live) for v in views}
        recount: set[int] = set()
        for node in keys.keys() | self._node_keys.keys():
            if keys.get(node) != self._node_keys.get(node):
                # Its partitions: a clean stop's releases, a new generation, a death.
                held = set(self._listed.get(node, {}))
                held |= {p for p, o in self._owners.items() if o is not None and int(o.owner) == node}
                self._stale |= held
                recount |= held
        self._node_keys = keys
        assert self._partitions is not None
        stale = sorted(p for p in self._stale | (set(self._partitions) - self._owners.keys()))
        for pid, own in self.ledger.ownerships([PartitionId(p) for p in stale]).items():
            self._owners[int(pid)] = own
        self._stale = set()
        ends = _log_ends(self.ledger)
        reports = _reports(views)
        partitions = []
        for p in self._partitions:
            own = self._owners.get(p)
            if own is None:
                continue
            owner = int(own.owner)
            reported = reports.get((owner, p))
            if reported is not None and reported.state not in WARM_STATES:
                self._committed[p] = max(self._committed.get(p, 0), reported.source_offset)
            elif p not in self._committed or p in recount:
                # A node that stopped reports nothing: its final commits are in the manifests.
                self._committed[p] = max(self._committed.get(p, 0), self._manifest_offset(p))
            partitions.append(
                _partition(p, own, owner in live, self.moving().get(p), self._committed[p], ends.get(p), reported)
            )
        return ClusterSnapshot(
            store=self.ledger.store.url,
            cluster_id=self.ledger.cluster().cluster_id,
            cluster_epoch=self._cluster_epoch,
            partitions=tuple(_with_standbys(partitions, views)),
            nodes=tuple(_node(v, v.record.node in live) for v in views),
        )

    def _manifest_offset(self, partition: int) -> int:
        # Once per partition its owner never reported (a dead owner from before the watch began).
        if self._manifests is None:
            self._manifests = ManifestReader(self.ledger.store)
        current = self._manifests.current(PartitionId(partition))
        return current.manifest.source_offset if current else 0


# --- the summary: node records, assignments and log ends, nothing per partition ---------------


def summarize_cluster(ledger: Ledger, *, heartbeat_timeout_s: float | None = None) -> ClusterSnapshot:
    """Every partition as the node records and assignments show it: a few reads a node, none a partition.

    A partition's owner is the node whose assignment names it (the desired state's owner when a
    move is in flight, from the copy the assignment carries), its epoch, committed offset and
    failures what that owner last reported in its heartbeat; a partition no assignment names is
    unassigned. Its status is "active" once the owner reports running it at an epoch, "released"
    after a clean stop; the ledger's own records (``laminar status --detail``) are the authority.
    """
    cluster = ledger.cluster()
    membership = ledger.members.record()
    views = ledger.members.nodes()
    live = {v.record.node for v in views if is_alive(v, heartbeat_timeout_s)}
    desired = DesiredStates(ledger, nudge=False)
    nodes = [v.record.node for v in views]
    # One read a node, in parallel on remote stores (the ledger's pool).
    read = ledger.read_each(lambda n: desired.assignment(NodeId(int(n)))[0], [PartitionId(n) for n in nodes])
    assignments = dict(zip(nodes, read, strict=True))
    listed: dict[int, set[int]] = {}
    moving: dict[int, DesiredState] = {}
    for node, assignment in assignments.items():
        for p in assignment.partitions if assignment is not None else {}:
            listed.setdefault(int(p), set()).add(node)
        for p, state in _copies(assignment).items():
            if state.migration is not None and not state.migration.is_terminal:
                moving[p] = state
    reports = _reports(views)
    ends = _log_ends(ledger)
    partitions = []
    for p in range(cluster.partitions):
        named = listed.get(p, set())
        in_move = moving.get(p)
        if in_move is not None:
            owner = in_move.owner
        else:
            # One node names it unless a write is half done: the one that reports running it wins.
            running = sorted(n for n in named if (r := reports.get((n, p))) is not None and r.state not in WARM_STATES)
            owner = (running or sorted(named) or [UNASSIGNED])[0]
        reported = reports.get((owner, p)) if owner != UNASSIGNED else None
        status: str
        if owner == UNASSIGNED:
            status = PartitionStatus.UNASSIGNED
        elif reported is not None and reported.state == "released":
            status = PartitionStatus.RELEASED
        elif reported is not None and reported.state in _RUNNING:
            status = PartitionStatus.ACTIVE
        else:
            # Starting, restoring, failed ... or no report yet ("assigned"): what the owner says it does.
            status = reported.state if reported is not None else "assigned"
        committed = reported.source_offset if reported is not None and reported.state not in WARM_STATES else None
        partitions.append(
            PartitionSnapshot(
                partition=p,
                epoch=reported.epoch if reported is not None else 0,
                owner=owner,
                status=str(status),
                head_lagged=False,
                owner_alive=owner in live,
                migration=in_move.migration if in_move is not None else None,
                committed_offset=committed,
                log_end=ends.get(p),
                failures=reported.consecutive_failures if reported else 0,
                last_failure=reported.last_failure if reported else None,
            )
        )
    return ClusterSnapshot(
        store=ledger.store.url,
        cluster_id=cluster.cluster_id,
        cluster_epoch=membership.cluster_epoch,
        partitions=tuple(_with_standbys(partitions, views)),
        nodes=tuple(_node(v, v.record.node in live) for v in views),
        detail=False,
    )


# --- shared helpers ---------------------------------------------------------------------------


def _named(state: DesiredState) -> set[int]:
    """The nodes a state names, a move's ends included once it ended (their assignments moved then)."""
    named = {state.owner}
    if state.migration is not None:
        named |= {state.migration.from_node, state.migration.to_node}
    return named - {UNASSIGNED}


def _copies(assignment: NodeAssignment | None) -> dict[int, DesiredState]:
    """The desired states an assignment carries at the revision it lists."""
    if assignment is None:
        return {}
    return {int(p): s for p in assignment.states if (s := assignment.state(int(p))) is not None}


def _reports(views: Iterable[NodeView]) -> dict[tuple[int, int], PartitionProgress]:
    return {(v.record.node, int(p)): pr for v in views for p, pr in v.record.partitions.items()}


def _log_ends(ledger: Ledger) -> dict[int, int]:
    # Imported here: the source log brings pyarrow, which commands that only move partitions never need.
    from laminar_orchestration.protocol.source import SourceLog

    return SourceLog(ledger.store).log_ends() or {}


def _partition(
    p: int,
    own: Ownership,
    owner_alive: bool,
    migration: MigrationTask | None,
    committed: int,
    log_end: int | None,
    reported: PartitionProgress | None,
) -> PartitionSnapshot:
    return PartitionSnapshot(
        partition=p,
        epoch=own.epoch,
        owner=int(own.owner),
        status=own.status.value,
        head_lagged=own.head_lagged,
        owner_alive=owner_alive,
        migration=migration,
        committed_offset=committed,
        log_end=log_end if log_end is not None else committed,
        failures=reported.consecutive_failures if reported else 0,
        last_failure=reported.last_failure if reported else None,
    )


def _with_standbys(partitions: list[PartitionSnapshot], views: list[NodeView]) -> list[PartitionSnapshot]:
    standbys = warm_copies(views)
    out = []
    for part in partitions:
        warm = standbys.get(part.partition)
        if warm:
            part = dataclasses.replace(part, standbys=dict(sorted(warm.items())))
        out.append(part)
    return out


def _node(view: NodeView, alive: bool) -> NodeSnapshot:
    record: NodeRecord = view.record
    return NodeSnapshot(
        node=record.node,
        generation=record.generation,
        status=record.status.value,
        alive=alive,
        last_heartbeat=record.heartbeat_at,
        heartbeat_age_s=view.heartbeat_age_s,
        host=record.host,
        pid=record.pid,
        requests_per_s=dict(record.requests.per_s) if record.requests else {},
        busiest_requests=dict(record.requests.top_families) if record.requests else {},
    )
