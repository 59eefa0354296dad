"""The ownership map as an observer reads it: a row per partition, its health, and the live-owner check.

What the Dagster ``ownership_map`` asset and the failure sensor show: `ownership_rows`
(`snapshot_cluster` without the offsets, which change with every commit), read again
only where something moved by `OwnershipRows` and patched by `ownership_rows_patched`
when a caller knows what just changed; `ownership_signature`, a fingerprint of the few
records that move whenever the map may have; each row's health word
(`ownership_health`), the rows with their figures (`report_ownership`) and whether
every partition is on a live node (`check_live_owners`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from laminar_orchestration.control.snapshot import fingerprint, is_alive, live_node_ids
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.membership import NodeView
from laminar_orchestration.protocol.move_reports import MoveReports
from laminar_orchestration.protocol.records import PartitionStatus

__all__ = [
    "LiveOwnersCheck",
    "OwnershipReport",
    "OwnershipRows",
    "check_live_owners",
    "ownership_health",
    "ownership_rows",
    "ownership_rows_patched",
    "ownership_signature",
    "patch_rows",
    "report_ownership",
    "with_failures",
]


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


#: Partitions a full read of `OwnershipRows` reads between looks at its deadline.
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
