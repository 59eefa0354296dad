"""The node's side of the output table: which of its partitions have committed batches the table
may lack, and one catch-up call for all of them per interval, off the batches' path.

The table's committer (`table.TableCommitter`, given to the node by its launcher: this layer does
not import it) reads the committed batches from the manifest chains itself and appends each at most
once, so what this module decides is only *when* to ask, and how far: a partition is owed a sync
after one of its workers committed a batch, or took it over (the old owner's last batches may be
missing), and stays owed until a sync succeeds and gets to the chain's end. While the node owns the
partition the sync goes to the chain's end; once it no longer does, only through the node's own last
batch: the successor's batches are the successor's to append. A sync that stops a partition before
a batch its keys may not read (`blocked`: a policy narrower than ``laminar policies``) leaves it
owed: the batch's writer may append it meanwhile. Every entry a worker publishes is handed over (its
snapshots' too), so a sync reads none of this node's entries back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Protocol

import pyarrow as pa

from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.chain import ManifestVersion

log = logging.getLogger("laminar.node")


class Committing(Protocol):
    """What the feed reads of a worker: how many batches it committed, and whether it is done with
    its partition (released or lost it: it stays listed until the node's next reconcile)."""

    @property
    def commits(self) -> int: ...

    @property
    def finished(self) -> bool: ...


class SyncOutcome(Protocol):
    """What the feed reads of a sync (`table.SyncResult`)."""

    @property
    def blocked(self) -> Mapping[int, int]:
        """Partitions the sync stopped before a batch it may not read (by that batch's seq)."""
        ...


class OutputTable(Protocol):
    """The output table as a node uses it (`table.TableCommitter`)."""

    def sync(self, partitions: Iterable[int], through: Mapping[int, int] | None = None) -> SyncOutcome:
        """Catch the table up with `partitions`' committed batches (those in `through` only up to that
        seq); raises on failure (retried)."""
        ...

    def remember(self, version: ManifestVersion, outputs: Mapping[str, pa.Table]) -> None:
        """A batch this node committed (entry and output rows): the next sync need not read it back."""
        ...


class TableFeed:
    """Tracks the partitions owed a table sync and makes the call. `committed` runs on the workers'
    threads, `note` and `flush` on the node's table thread."""

    def __init__(self, table: OutputTable) -> None:
        self.table = table
        #: Per partition, the worker last seen and its commit count then.
        self._seen: dict[PartitionId, tuple[int, int]] = {}
        #: Partitions owed a sync, each with a count of the reasons noted: a sync clears a partition
        #: only if nothing was noted for it while the sync ran.
        self._owed: dict[PartitionId, int] = {}
        #: Partitions with a worker at the last look: synced to their chain's end.
        self._owned: set[PartitionId] = set()
        #: Per partition, the seq of the newest batch (with output) this node committed.
        self._own_last: dict[PartitionId, int] = {}
        self._lock = threading.Lock()

    @property
    def owed(self) -> set[PartitionId]:
        with self._lock:
            return set(self._owed)

    def _owe(self, partition: PartitionId) -> None:
        with self._lock:
            self._owed[partition] = self._owed.get(partition, 0) + 1

    def committed(self, version: ManifestVersion, outputs: Mapping[str, pa.Table]) -> None:
        """A worker published a chain entry: handed to the table so the sync need not read it back, and,
        for a batch with output, owed a sync (even if the worker ends before the next look). An entry
        without output (a snapshot) adds nothing to the table: it owes none."""
        self.table.remember(version, outputs)
        if version.manifest.outputs:
            p = PartitionId(version.manifest.partition)
            with self._lock:
                self._own_last[p] = max(self._own_last.get(p, 0), version.manifest.seq)
            self._owe(p)

    def note(self, workers: Mapping[PartitionId, Committing]) -> None:
        """Owe a sync to every partition whose worker is new (a takeover: the old owner's last
        batches may be missing) or committed since the last look."""
        for p, worker in workers.items():
            mark = (id(worker), worker.commits)
            if self._seen.get(p) != mark:
                self._seen[p] = mark
                self._owe(p)
        with self._lock:
            self._owned = {p for p, worker in workers.items() if not worker.finished}

    def flush(self, node: object = "") -> bool:
        """One sync of every owed partition; False (logged, kept owed) if it failed.

        A partition the node no longer owns is synced through its own last batch only, and not at
        all if it committed none (owed for a takeover that moved on before a batch of its own)."""
        with self._lock:
            for p in [p for p in self._owed if p not in self._owned and p not in self._own_last]:
                del self._owed[p]
            taken = dict(self._owed)
            through = {int(p): self._own_last[p] for p in taken if p not in self._owned}
        partitions = sorted(taken)
        if not partitions:
            return True
        try:
            outcome = self.table.sync([int(p) for p in partitions], through=through)
        except Exception as exc:  # the table is a copy: any failure is retried, the node runs on
            log.warning("node %s: output table sync of partitions %s failed (retried): %s", node, partitions, exc)
            return False
        with self._lock:
            for p, count in taken.items():
                # One stopped before a batch it may not read stays owed: its writer may append it meanwhile.
                if self._owed.get(p) == count and int(p) not in outcome.blocked:
                    del self._owed[p]
        return True
