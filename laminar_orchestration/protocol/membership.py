"""Node membership in the ledger: the member set and the cluster epoch (`MembershipRecord`), each
node's own record (`NodeRecord`), and the handle a node heartbeats with.

A node writes only its own record (`register_node`, then `NodeHandle.heartbeat`); admitting it to
the member set, and the new cluster epoch that brings, is the control plane's (`admit_nodes`).
Liveness is judged from a node's own heartbeat and timeout (`NodeView`).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from pydantic import BaseModel

from laminar_orchestration.identity import UNASSIGNED, NodeId
from laminar_orchestration.protocol.capabilities import LedgerWriter, ledger_key
from laminar_orchestration.protocol.keys import CLUSTER_KEY, MEMBERSHIP_KEY, NODES_PREFIX, node_key, parse_node_key
from laminar_orchestration.protocol.ledger_errors import ClusterNotInitialized, NodeIdentityConflict
from laminar_orchestration.protocol.records import (
    ClusterRecord,
    CorruptLedgerObject,
    MembershipRecord,
    NodeRecord,
    NodeStatus,
    ParsedRecords,
    PartitionProgress,
    RequestReport,
    new_write_id,
    now,
)
from laminar_orchestration.store import ObjectStore, PreconditionFailed

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class NodeView:
    """A node record plus its liveness as judged now."""

    record: NodeRecord
    alive: bool
    heartbeat_age_s: float

    @classmethod
    def judge(cls, record: NodeRecord, at: datetime | None = None) -> NodeView:
        """`record` judged at `at` (now): alive while its heartbeat is younger than its own timeout."""
        age = ((at or now()) - record.heartbeat_at).total_seconds()
        return cls(record, record.status == NodeStatus.ALIVE and age <= record.heartbeat_timeout_s, age)

    def draining(self, heartbeat_timeout_s: float | None = None) -> bool:
        """True while the node says it is leaving and its heartbeat is fresh (by `heartbeat_timeout_s`,
        None: its own): its final drain releases what it still runs, so that is no failure yet."""
        limit = self.record.heartbeat_timeout_s if heartbeat_timeout_s is None else heartbeat_timeout_s
        return self.record.status == NodeStatus.LEAVING and self.heartbeat_age_s <= limit


def _encode(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


class Membership:
    """The member set, the cluster epoch and the node records of one cluster's ledger."""

    def __init__(self, store: ObjectStore, records: ParsedRecords) -> None:
        self.store = store
        self._writer = LedgerWriter(store)
        self._records = records

    def _read(self, key: str, model: type[M]) -> tuple[M, str] | None:
        obj = self._writer.get(key)
        return None if obj is None else (self._records.parse(obj, model), obj.etag)

    def _require_cluster(self) -> None:
        """ClusterNotInitialized if `init` never ran (CorruptLedgerObject if its record does not parse)."""
        if self._read(CLUSTER_KEY, ClusterRecord) is None:
            raise ClusterNotInitialized(self.store.url)

    def record(self) -> MembershipRecord:
        """The membership record; ClusterNotInitialized if `init` never ran."""
        got = self._read(MEMBERSHIP_KEY, MembershipRecord)
        if got is None:
            self._require_cluster()  # raises ClusterNotInitialized when that is the cause
            raise CorruptLedgerObject(MEMBERSHIP_KEY, "missing")
        return got[0]

    def _update(self, change: Callable[[MembershipRecord], MembershipRecord | None]) -> MembershipRecord:
        while True:
            got = self._read(MEMBERSHIP_KEY, MembershipRecord)
            if got is None:
                raise CorruptLedgerObject(MEMBERSHIP_KEY, "missing")
            current, etag = got
            new = change(current)
            if new is None:
                return current
            try:
                self._writer.swap(ledger_key(MEMBERSHIP_KEY), _encode(new), etag)
                return new
            except PreconditionFailed:
                continue

    def bump_cluster_epoch(self, reason: str) -> int:
        """Advance the cluster epoch (membership generation), e.g. on a rebalance."""
        rec = self._update(
            lambda m: m.model_copy(update={"cluster_epoch": m.cluster_epoch + 1, "reason": reason, "updated_at": now()})
        )
        return rec.cluster_epoch

    def register_node(
        self,
        node: NodeId,
        *,
        heartbeat_timeout_s: float = 10.0,
        host: str | None = None,
        pid: int | None = None,
        nudge_url: str | None = None,
    ) -> NodeHandle:
        """Write this node's own record (a new generation on each call) and return the handle that heartbeats.

        `nudge_url` is where the control plane may wake the node (advisory, `protocol.nudge`).

        The node touches nothing else: the control plane admits it to the member
        set (`admit_nodes`), and `nodes` lists it meanwhile.
        """
        if node == UNASSIGNED:
            raise ValueError("node 0 is the 'unassigned' sentinel")
        self._require_cluster()
        key = node_key(node)
        while True:
            got = self._read(key, NodeRecord)
            generation = got[0].generation + 1 if got else 1
            ts = now()
            record = NodeRecord(
                node=node,
                generation=generation,
                status=NodeStatus.ALIVE,
                host=host or socket.gethostname(),
                pid=pid if pid is not None else os.getpid(),
                started_at=ts,
                heartbeat_at=ts,
                heartbeat_timeout_s=heartbeat_timeout_s,
                nudge_url=nudge_url,
            )
            try:
                if got is None:
                    etag = self._writer.create(ledger_key(key), _encode(record))
                else:
                    etag = self._writer.swap(ledger_key(key), _encode(record), got[1])
                break
            except PreconditionFailed:
                continue

        return NodeHandle(self._writer, record, etag)

    def admit_nodes(self) -> list[NodeId]:
        """Add every node that registered since the last call to the member set (the control plane's step).

        A node writes only its own record; joining the member set (and the new
        cluster epoch it brings, one per admission) is the control plane's.
        Returns the nodes admitted; ClusterNotInitialized if `init` never ran.
        """
        self._require_cluster()
        admitted: list[NodeId] = []

        def join(m: MembershipRecord) -> MembershipRecord | None:
            new = sorted(set(self._registered()) - set(m.members))
            admitted[:] = [NodeId(n) for n in new]
            if not new:
                return None
            return m.model_copy(
                update={
                    "members": sorted([*m.members, *new]),
                    "cluster_epoch": m.cluster_epoch + 1,
                    "reason": f"node(s) {', '.join(map(str, new))} joined",
                    "updated_at": now(),
                }
            )

        self._update(join)
        return admitted

    def _registered(self) -> list[int]:
        """Node ids with a record in the ledger (one listing of the node records' prefix)."""
        return sorted(n for n in (parse_node_key(k) for k in self.store.list(NODES_PREFIX)) if n is not None)

    def node(self, node: NodeId) -> NodeRecord | None:
        got = self._read(node_key(node), NodeRecord)
        return got[0] if got else None

    def nodes(self, *, at: datetime | None = None) -> list[NodeView]:
        """Every member node with its liveness (heartbeat younger than its timeout)."""
        ts = at or now()
        # A node registered but not admitted yet is a node too: it is alive and may be given work.
        ids = sorted(set(self.record().members) | set(self._registered()))
        records = (self.node(NodeId(n)) for n in ids)
        return [NodeView.judge(rec, ts) for rec in records if rec is not None]


class NodeHandle:
    """A node's write access to its own ledger record, and nothing else."""

    def __init__(self, writer: LedgerWriter, record: NodeRecord, etag: str) -> None:
        self._writer = writer
        self._record = record
        self._etag = etag
        self._lock = threading.Lock()

    @property
    def record(self) -> NodeRecord:
        return self._record

    @property
    def node(self) -> NodeId:
        return NodeId(self._record.node)

    @property
    def generation(self) -> int:
        return self._record.generation

    def heartbeat(
        self,
        status: NodeStatus = NodeStatus.ALIVE,
        partitions: dict[int, PartitionProgress] | None = None,
        requests: RequestReport | None = None,
    ) -> NodeRecord:
        """CAS our own record with a fresh timestamp (and progress and request counts, if given).

        NodeIdentityConflict if another process took the record.
        """
        with self._lock:
            update: dict[str, object] = {"heartbeat_at": now(), "status": status, "write_id": new_write_id()}
            if partitions is not None:
                update["partitions"] = dict(partitions)
            if requests is not None:
                update["requests"] = requests
            new = self._record.model_copy(update=update)
            key = node_key(self._record.node)
            try:
                self._etag = self._writer.swap(ledger_key(key), _encode(new), self._etag)
            except PreconditionFailed:
                raise NodeIdentityConflict(self.node, self._record.generation) from None
            self._record = new
            return new

    def leave(self) -> NodeRecord:
        return self.heartbeat(NodeStatus.LEFT, partitions={})
