"""What the nodes have committed: each partition's last committed manifest, and whether the stream keeps up.

What the Dagster ``checkpoint_manifests`` asset shows: a row per committed
partition (`checkpoint_rows`), kept between looks by `CheckpointRows`, their data
version (`checkpoints_version`), and each partition's progress since the last
report (`stream_progress`), which decides whether the asset is materialized.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from laminar_orchestration.control.snapshot import WARM_STATES, fingerprint
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import PartitionManifest

if TYPE_CHECKING:
    from laminar_orchestration.protocol.source import SourceLog

__all__ = [
    "CheckpointRows",
    "StreamProgress",
    "checkpoint_rows",
    "checkpoints_version",
    "stream_progress",
]


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
