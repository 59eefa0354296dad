"""Audits: exactly-once of committed output and state, and the ledger's epoch history.

`audit_partition` recomputes, independently of Spark, what the committed
state and output of a partition must be from its source log, and compares:

* the manifest chain is well formed (seq, fencing tokens, commit ULIDs, parent hashes);
* committed output batches tile ``[0, committed offset)`` with no gap (loss)
  and no overlap (duplicate), and every artifact exists with its checksum;
* per key, the sum of output batch counts equals the events in the source
  (more: duplicated, fewer: lost), and output rows carry the manifest's epoch;
* the committed state equals the fold of every event up to the committed offset.

`audit_ledger` checks the immutable epoch history: epochs 1..n with no gap,
one grant per epoch, every grant preceded by a committed release or a fence.
Listing is used only for the orphan count (an audit path).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from laminar_orchestration.dataplane.checkpoint import BATCH_END_METADATA, BATCH_START_METADATA, download_table
from laminar_orchestration.dataplane.errors import CheckpointCorrupt, StateGap
from laminar_orchestration.dataplane.restore import committed_state
from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.processing.keyed import STATE_SCHEMA, empty_state
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.keys import (
    UnparseableObjectKey,
    fenced_object_prefixes,
    parse_fenced_object_key,
    sink_partition_prefix,
)
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import SuccessionError, verify_artifacts
from laminar_orchestration.protocol.records import GrantKind, LedgerError
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore


@dataclass(frozen=True)
class AuditIssue:
    """One violation found by an audit."""

    partition: int
    kind: str  # loss | duplicate | chain | forged | superseded | artifact | state | lineage | ledger
    detail: str
    start_offset: int | None = None
    end_offset: int | None = None


@dataclass
class PartitionAudit:
    partition: int
    committed_offset: int = 0
    events_in_source: int = 0
    manifests: int = 0
    epochs_granted: int = 0
    duplicates: int = 0
    losses: int = 0
    orphan_outputs: int = 0
    issues: list[AuditIssue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the audit found nothing wrong."""
        return not self.issues

    def to_json(self) -> dict[str, Any]:
        """The audit as plain JSON (what `laminar verify --json` prints per partition)."""
        return asdict(self)

    def summary_lines(self) -> list[str]:
        """The audit for a reader: one line of figures and verdict, then one line per issue."""
        verdict = "ok" if self.ok else f"{len(self.issues)} PROBLEMS"
        lines = [
            f"partition {self.partition}: committed {self.committed_offset}/{self.events_in_source} events, "
            f"{self.manifests} manifests, {self.epochs_granted} {'epoch' if self.epochs_granted == 1 else 'epochs'}: "
            f"{verdict}"
        ]
        for i in self.issues:
            where = f" [{i.start_offset}, {i.end_offset})" if i.start_offset is not None else ""
            lines.append(f"  {i.kind}{where}: {i.detail}")
        return lines


def reference_fold(events: pa.Table) -> pa.Table:
    """The default keyed aggregation of `events` in pyarrow, without Spark: count, sum, min, max, last by offset.

    The audit's expectation of the committed state, and the Spark-free batch
    aggregate of test and chaos nodes (`reference_batch_aggregate`).
    """
    if events.num_rows == 0:
        return empty_state()
    ordered = events.sort_by("offset")
    grouped = ordered.group_by("key", use_threads=False).aggregate(
        [
            ("value", "count"),
            ("value", "sum"),
            ("value", "min"),
            ("value", "max"),
            ("value", "last"),
            ("offset", "max"),
        ]
    )
    return pa.table(
        {
            "key": grouped["key"],
            "count": grouped["value_count"].cast(pa.int64()),
            "sum": grouped["value_sum"],
            "min": grouped["value_min"],
            "max": grouped["value_max"],
            "last": grouped["value_last"],
            "last_offset": grouped["offset_max"],
        },
        schema=STATE_SCHEMA,
    )


def reference_batch_aggregate(events: pa.Table) -> pa.Table:
    """`reference_fold` of one batch, named as the default processor's batch aggregate (``batch_count``, ...)."""
    fold = reference_fold(events)
    return fold.rename_columns(["key", *(f"batch_{name}" for name in fold.column_names[1:])])


def _as_dict(table: pa.Table, columns: Iterable[str]) -> dict[str, tuple[object, ...]]:
    cols = [table[c].to_pylist() for c in columns]
    return {k: tuple(row) for k, *row in zip(table["key"].to_pylist(), *cols, strict=True)}


def audit_ledger(ledger: Ledger, partition: PartitionId) -> tuple[list[AuditIssue], int]:
    """Check the immutable epoch history of one partition; returns (issues, epochs granted)."""
    issues: list[AuditIssue] = []
    grants = list(ledger.grants(partition))
    for i, g in enumerate(grants):
        expected_epoch = i + 1
        if g.epoch != expected_epoch or g.previous_epoch != expected_epoch - 1:
            issues.append(
                AuditIssue(partition, "ledger", f"grant {g.epoch} does not follow epoch {expected_epoch - 1}")
            )
        if g.grant_kind == GrantKind.ACQUIRE and g.previous_epoch > 0 and g.previous_owner != UNASSIGNED:
            release = ledger.release_record(partition, g.previous_epoch)
            if release is None or release.node != g.previous_owner:
                issues.append(
                    AuditIssue(
                        partition,
                        "ledger",
                        f"graceful grant of epoch {g.epoch} without a release of epoch {g.previous_epoch}",
                    )
                )
        if i > 0 and g.previous_owner != grants[i - 1].node:
            issues.append(
                AuditIssue(
                    partition,
                    "ledger",
                    f"grant {g.epoch} names previous owner {g.previous_owner}, "
                    f"epoch {g.previous_epoch} belonged to {grants[i - 1].node}",
                )
            )
    own = ledger.ownership(partition)
    if own is not None and own.epoch != len(grants):
        issues.append(AuditIssue(partition, "ledger", f"ownership at epoch {own.epoch}, {len(grants)} grants"))
    return issues, len(grants)


def audit_partition(store: ObjectStore, partition: PartitionId, *, ledger: Ledger | None = None) -> PartitionAudit:
    """Everything `laminar verify` checks for one partition."""
    audit = PartitionAudit(partition)
    ledger = ledger or Ledger(store)
    ledger_issues, audit.epochs_granted = audit_ledger(ledger, partition)
    audit.issues.extend(ledger_issues)

    reader = ManifestReader(store)
    history: list[ManifestVersion] = []
    try:
        history = list(reader.history(partition))
    except LedgerError as exc:
        audit.issues.append(AuditIssue(partition, "chain", str(exc)))
    audit.manifests = len(history)
    # Forged entries (no signature of their epoch's grant key) and superseded writers' entries are
    # no part of the chain: reported, never counted; the genuine entry after them follows the last one.
    for forged in reader.forged.values():
        audit.issues.append(AuditIssue(partition, "forged", str(forged)))
    for superseded in reader.superseded.values():
        audit.issues.append(AuditIssue(partition, "superseded", str(superseded)))
    for prev, cur in itertools.pairwise(history):
        try:
            skipped = cur.manifest.seq - prev.manifest.seq - 1
            cur.manifest.validate_succession(prev.manifest, prev.raw_hash, skipped=skipped)
        except (SuccessionError, LedgerError) as exc:
            audit.issues.append(AuditIssue(partition, "chain", f"seq {cur.manifest.seq}: {exc}"))
        except Exception as exc:  # StaleFencingToken is an EpochError
            audit.issues.append(AuditIssue(partition, "chain", f"seq {cur.manifest.seq}: {exc}"))
    committed = history[-1].manifest.source_offset if history else 0
    audit.committed_offset = committed

    # Output ranges must tile [0, committed) exactly.
    outputs: list[tuple[int, int, pa.Table, int]] = []
    read = ReadStore(store)
    for version in history:
        m = version.manifest
        try:
            verify_artifacts(store, m)
        except LedgerError as exc:
            audit.issues.append(AuditIssue(partition, "artifact", f"seq {m.seq}: {exc}"))
            continue
        for ref in m.outputs:
            meta = store.head(ref.key)
            assert meta is not None
            start = int(meta.metadata.get(BATCH_START_METADATA, "-1"))
            end = int(meta.metadata.get(BATCH_END_METADATA, "-1"))
            try:
                outputs.append((start, end, download_table(read, ref), m.fencing_token))
            except CheckpointCorrupt as exc:
                audit.issues.append(AuditIssue(partition, "artifact", str(exc)))
    position = 0
    for start, end, table, token in sorted(outputs, key=lambda o: (o[0], o[1])):
        if start > position:
            audit.issues.append(AuditIssue(partition, "loss", "no committed output", position, start))
            audit.losses += start - position
        elif start < position:
            overlap = min(end, position) - start
            audit.issues.append(AuditIssue(partition, "duplicate", "output committed twice", start, min(end, position)))
            audit.duplicates += overlap
        position = max(position, end)
        epochs = set(pc.unique(table["epoch"]).to_pylist()) if table.num_rows else set()
        if epochs and epochs != {token}:
            audit.issues.append(
                AuditIssue(
                    partition,
                    "lineage",
                    f"rows stamped with epochs {sorted(epochs)} in a commit at {token}",
                    start,
                    end,
                )
            )
    if position < committed:
        audit.issues.append(AuditIssue(partition, "loss", "committed offset beyond output", position, committed))
        audit.losses += committed - position

    # Per key counts: output vs source.
    source = SourceLog(store)
    parts = [b.to_table() for b in source.iter_batches(partition, 0, 1_000_000)]
    events = pa.concat_tables(parts) if parts else pa.table({"offset": pa.array([], pa.int64())})
    audit.events_in_source = events.num_rows
    if "key" in events.column_names:
        events = events.filter(pc.less(events["offset"], committed))
        expected = reference_fold(events)
    else:
        expected = empty_state()
    seen: dict[str, int] = {}
    for _s, _e, table, _t in outputs:
        for key, n in zip(table["key"].to_pylist(), table["batch_count"].to_pylist(), strict=True):
            seen[key] = seen.get(key, 0) + n
    want = {k: v[0] for k, v in _as_dict(expected, ["count"]).items()}
    for key in sorted(set(want) | set(seen)):
        got, exp = seen.get(key, 0), int(str(want.get(key, 0)))
        if got > exp:
            audit.issues.append(
                AuditIssue(partition, "duplicate", f"key {key!r}: {got} events in output, {exp} in source")
            )
        elif got < exp:
            audit.issues.append(AuditIssue(partition, "loss", f"key {key!r}: {got} events in output, {exp} in source"))

    # The committed state must be the fold of every committed event.
    try:
        state, _ = committed_state(store, partition)
    except (CheckpointCorrupt, LedgerError, StateGap) as exc:
        audit.issues.append(AuditIssue(partition, "state", str(exc)))
        return audit
    have = _as_dict(state, ["count", "sum", "min", "max", "last"])
    should = _as_dict(expected, ["count", "sum", "min", "max", "last"])
    for key in sorted(set(have) | set(should)):
        a, b = have.get(key), should.get(key)
        if a is None or b is None or not _close(a, b):
            audit.issues.append(AuditIssue(partition, "state", f"key {key!r}: committed {a}, expected {b}"))
            if len(audit.issues) > 50:
                break

    audit.orphan_outputs = sum(
        1
        for k in store.list(sink_partition_prefix(partition))
        if k not in {r.key for v in history for r in v.manifest.outputs}
    )
    return audit


def _close(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    for x, y in zip(a, b, strict=True):
        if isinstance(x, float) and isinstance(y, float):
            if abs(x - y) > 1e-6 * max(1.0, abs(x), abs(y)):
                return False
        elif x != y:
            return False
    return True


def audit_store(store: ObjectStore) -> list[PartitionAudit]:
    """`audit_partition` for every partition of the cluster."""
    ledger = Ledger(store)
    return [audit_partition(store, p, ledger=ledger) for p in ledger.partitions()]


# --- the epoch history, cross-checked against what was written ----------------------------

#: ULIDs carry milliseconds: an object minted just after its grant may look up to 1 ms older.
_ULID_RESOLUTION = timedelta(milliseconds=1)


@dataclass
class EpochHistoryAudit:
    """What `audit_epoch_history` found for one partition."""

    partition: int
    epochs_granted: int = 0
    #: epoch -> the node ids seen acting under it: its grantee, manifest writers, artifact writers.
    owners: dict[int, set[int]] = field(default_factory=dict)
    max_owners_per_epoch: int = 0
    #: Epochs acted on by more than one node (must be 0: grants are create-only).
    double_grants: int = 0
    #: Writes under an epoch made after the chain was fenced above it: a fenced owner's late writes.
    stale_writes: int = 0
    #: Of those, the ones that became visible (a manifest, or an artifact a manifest names).
    stale_writes_accepted: int = 0
    issues: list[AuditIssue] = field(default_factory=list)

    @property
    def stale_writes_rejected(self) -> int:
        return self.stale_writes - self.stale_writes_accepted


def _artifact_created_at(key: str) -> datetime | None:
    """When a fenced object was written, from the ULID its name ends in (None: not a fenced object's name)."""
    try:
        return datetime.fromtimestamp(parse_fenced_object_key(key).created_ms / 1000.0, UTC)
    except UnparseableObjectKey:
        return None


def audit_epoch_history(
    store: ObjectStore, partition: PartitionId, *, ledger: Ledger | None = None
) -> EpochHistoryAudit:
    """`audit_ledger`, cross-checked against every manifest and fenced object of the partition.

    Each manifest and each ``sink/``/``checkpoints/`` object carries the epoch and
    node it was written under. Per epoch, the grantee and every writer seen must
    be one node (`max_owners_per_epoch` is measured, not assumed).

    The fence point of epoch e is in the manifest chain: the first entry under a
    later epoch, normally the seal the grant of e+1 put there (before any such
    entry exists, the grant of e+1 itself). A manifest under e after that entry
    is a stale write that was accepted; an object written under e after that
    point is a stale write, accepted if a manifest names it. Writes under e
    between the grant of e+1 and its seal are the old owner's last commit, not
    stale. Seal entries (no outputs, the previous offset, node 0 for a fence to
    "unassigned") are neither writers nor stale. Object times come from their
    ULIDs, so this needs the writers' clocks to agree (one machine, as in
    the chaos suite). Lists the store: an audit path.
    """
    ledger = ledger or Ledger(store)
    result = EpochHistoryAudit(partition)
    result.issues, result.epochs_granted = audit_ledger(ledger, partition)
    grants = {g.epoch: g for g in ledger.grants(partition)}
    for e, g in grants.items():
        if g.node != UNASSIGNED:
            result.owners.setdefault(e, set()).add(g.node)

    def check_granted(epoch: int, at: datetime, what: str, tolerance: timedelta = timedelta(0)) -> None:
        grant = grants.get(epoch)
        if grant is None:
            result.issues.append(AuditIssue(partition, "ledger", f"{what} written under epoch {epoch}, never granted"))
        elif at + tolerance < grant.granted_at:
            result.issues.append(AuditIssue(partition, "ledger", f"{what} written before epoch {epoch} was granted"))

    reader = ManifestReader(store)
    history = list(reader.history(partition))
    for void in reader.superseded.values():
        # Written after the chain moved past its writer, and passed over by every reader: not accepted.
        result.stale_writes += 1
        result.issues.append(AuditIssue(partition, "superseded", str(void)))
    # epoch -> when the chain was fenced above it (the first entry under a later epoch).
    fenced_at: dict[int, datetime] = {}
    named: set[str] = set()
    top = 0
    for version in history:
        m = version.manifest
        named.update(ref.key for ref in m.artifacts())
        if m.node != UNASSIGNED:
            result.owners.setdefault(m.fencing_token, set()).add(m.node)
        check_granted(m.fencing_token, m.committed_at, f"manifest seq {m.seq}")
        if m.fencing_token < top:
            result.stale_writes += 1
            result.stale_writes_accepted += 1
            result.issues.append(
                AuditIssue(
                    partition,
                    "stale-write",
                    f"manifest seq {m.seq} published under epoch {m.fencing_token} by node {m.node} "
                    f"after the chain was fenced at epoch {top}",
                    m.source_offset,
                )
            )
        elif m.fencing_token > top:
            for e in range(top, m.fencing_token):
                fenced_at.setdefault(e, m.committed_at)
            top = m.fencing_token

    def fence_point(epoch: int) -> datetime | None:
        if epoch in fenced_at:
            return fenced_at[epoch]
        nxt = grants.get(epoch + 1)  # granted, its seal not (yet) in the chain: the grant fences
        return nxt.granted_at if nxt else None

    for prefix in fenced_object_prefixes(partition):
        for key in store.list(prefix):
            meta = store.head(key)
            created = _artifact_created_at(key)
            if meta is None or created is None:
                continue  # swept meanwhile, or not a fenced write of ours
            try:
                epoch = int(meta.metadata.get("x-laminar-epoch", ""))
                node = int(meta.metadata.get("x-laminar-node", ""))
            except ValueError:
                result.issues.append(AuditIssue(partition, "artifact", f"{key}: no fencing identity in its metadata"))
                continue
            result.owners.setdefault(epoch, set()).add(node)
            check_granted(epoch, created, key, _ULID_RESOLUTION)
            fence = fence_point(epoch)
            if fence is not None and created > fence:
                result.stale_writes += 1
                if key in named:
                    result.stale_writes_accepted += 1
                    result.issues.append(
                        AuditIssue(
                            partition,
                            "stale-write",
                            f"{key}: written by node {node} under epoch {epoch} after the chain was fenced "
                            "above it, and named by a manifest",
                        )
                    )
    result.max_owners_per_epoch = max((len(nodes) for nodes in result.owners.values()), default=0)
    result.double_grants = sum(1 for nodes in result.owners.values() if len(nodes) > 1)
    for epoch, nodes in sorted(result.owners.items()):
        if len(nodes) > 1:
            result.issues.append(
                AuditIssue(partition, "split-brain", f"epoch {epoch} acted on by nodes {sorted(nodes)}")
            )
    return result


def audit_history(store: ObjectStore) -> list[EpochHistoryAudit]:
    """`audit_epoch_history` for every partition of the cluster."""
    ledger = Ledger(store)
    return [audit_epoch_history(store, p, ledger=ledger) for p in ledger.partitions()]
