"""What `laminar verify` and `laminar status` say about the output table.

`audit_table` checks the table against the manifest chains: every committed
batch the table claims (its transaction version per partition) is there
exactly once, with its manifest's lineage and row count, and nothing else is
(no batch a committed manifest does not name: a zombie's, another
cluster's). Committed batches above the table's version are lag, not loss.

`table_status` gives the operator view: the table's URI and version, and per
partition the newest batch in the table and how many committed batches it
still lacks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import ArtifactRef
from laminar_orchestration.store import ObjectStore
from laminar_orchestration.table.batches import ChainFollower, CommittedBatch, OutputUnreadable
from laminar_orchestration.table.location import TableLocation, check_identity, landed_seq, open_table, table_location


@dataclass(frozen=True)
class TableIssue:
    """One violation of exactly-once found in the table."""

    partition: int
    kind: str  # missing | duplicate | foreign | lineage | ahead | table
    detail: str
    seq: int | None = None


@dataclass(frozen=True)
class PartitionTableAudit:
    """What `audit_table` counted for one partition (its issues are the table audit's)."""

    partition: int
    #: The seq of the newest manifest entry the table holds (its transaction version).
    landed_seq: int
    committed_batches: int
    batches_in_table: int
    #: Committed batches the table does not hold yet (above `landed_seq`): lag, not loss.
    lag_batches: int
    rows: int


@dataclass
class _TableFacts:
    """What the audit and the status both say first: the table's URI, whether it exists, version and rows."""

    uri: str
    exists: bool = False
    version: int | None = None
    rows: int = 0

    def _facts_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(_TableFacts)}

    def _facts_line(self) -> str:
        return f"output table {self.uri}: version {self.version}, {self.rows} rows"


@dataclass
class TableAudit(_TableFacts):
    """The output table checked against the manifest chains."""

    partitions: list[PartitionTableAudit] = field(default_factory=list)
    issues: list[TableIssue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every batch the table holds is a committed one, exactly once."""
        return not self.issues

    def to_json(self) -> dict[str, Any]:
        return {
            **self._facts_json(),
            "ok": self.ok,
            "partitions": [vars(p) for p in self.partitions],
            "issues": [vars(i) for i in self.issues],
        }

    def summary_lines(self) -> list[str]:
        lag = sum(p.lag_batches for p in self.partitions)
        verdict = "ok" if self.ok else f"{len(self.issues)} PROBLEMS"
        lines = [f"{self._facts_line()}, {lag} batches behind: {verdict}"]
        lines += [
            f"  partition {i.partition} {i.kind}" + (f" seq {i.seq}" if i.seq else "") + f": {i.detail}"
            for i in self.issues
        ]
        return lines


def _rows_of(reads: ReadStore, refs: Iterable[ArtifactRef]) -> int:
    total = 0
    for ref in refs:
        obj = reads.get(ref.key)
        if obj is None:
            raise OutputUnreadable(ref.key, "missing from the store")
        total += pq.ParquetFile(pa.BufferReader(obj.data)).metadata.num_rows
    return total


def audit_table(
    store: ObjectStore, location: TableLocation | None = None, *, ledger: Ledger | None = None
) -> TableAudit:
    """Check the output table against every partition's manifest chain (an audit path: reads it all)."""
    location = location or table_location(store)
    ledger = ledger or Ledger(store)
    audit = TableAudit(location.uri)
    table = open_table(location)
    follower = ChainFollower(store)
    reads = ReadStore(store)
    held: dict[tuple[int, int], tuple[int, set[tuple[int, int, int, int]]]] = {}
    if table is not None:
        audit.exists, audit.version = True, table.version()
        check_identity(table, location, ledger.cluster().cluster_id)
        lineage = ["partition", "batch_seq", "epoch", "generation", "start_offset", "end_offset"]
        data = table.to_pyarrow_table(columns=lineage)
        audit.rows = data.num_rows
        grouped = data.group_by(
            ["partition", "batch_seq", "epoch", "generation", "start_offset", "end_offset"]
        ).aggregate([("batch_seq", "count")])
        for row in grouped.to_pylist():
            key = (int(row["partition"]), int(row["batch_seq"]))
            rows, stamps = held.get(key, (0, set()))
            stamp = (row["epoch"], row["generation"], row["start_offset"], row["end_offset"])
            held[key] = (rows + int(row["batch_seq_count"]), stamps | {stamp})
    partitions = ledger.partitions()
    for p in partitions:
        landed = landed_seq(table, p)
        lag = in_table = rows_in_table = 0
        walk = follower.walk(p, None)
        committed: dict[int, CommittedBatch] = {b.seq: b for b in walk.batches}
        newest = walk.newest.manifest.seq if walk.newest else 0
        if landed > newest:
            audit.issues.append(
                TableIssue(p, "ahead", f"table holds up to manifest seq {landed}, chain ends at {newest}")
            )
        for seq, batch in sorted(committed.items()):
            if seq > landed:
                lag += 1
                if (p, seq) in held:
                    audit.issues.append(TableIssue(p, "foreign", "batch in the table above its version", seq))
                continue
            try:
                expected = _rows_of(reads, batch.outputs)
            except OutputUnreadable as exc:
                audit.issues.append(TableIssue(p, "missing", str(exc), seq))
                continue
            rows, stamps = held.get((p, seq), (0, set()))
            if rows:
                in_table += 1
                rows_in_table += rows
            if rows < expected:
                audit.issues.append(TableIssue(p, "missing", f"{rows} of {expected} rows in the table", seq))
            elif rows > expected:
                audit.issues.append(TableIssue(p, "duplicate", f"{rows} rows in the table, {expected} committed", seq))
            want = (batch.epoch, batch.generation, batch.start_offset, batch.end_offset)
            if stamps and stamps != {want}:
                audit.issues.append(
                    TableIssue(p, "lineage", f"rows stamped {sorted(stamps)}, manifest says {want}", seq)
                )
        for held_p, seq in sorted(held):
            if held_p == p and seq not in committed:
                audit.issues.append(TableIssue(p, "foreign", "rows of no committed manifest entry", seq))
        audit.partitions.append(PartitionTableAudit(p, landed, len(committed), in_table, lag, rows_in_table))
    known = set(partitions)
    for stray in sorted({hp for hp, _ in held} - known):
        audit.issues.append(TableIssue(stray, "foreign", "rows of a partition the cluster does not have"))
    return audit


@dataclass(frozen=True)
class PartitionTableStatus:
    partition: int
    #: The newest manifest entry in the table (0: none) and the source offset it reached.
    landed_seq: int
    landed_offset: int
    #: Committed batches not yet in the table.
    lag_batches: int


@dataclass
class TableStatus(_TableFacts):
    """The operator view of the output table (`laminar status`, the Dagster asset)."""

    partitions: list[PartitionTableStatus] = field(default_factory=list)

    @property
    def lag_batches(self) -> int:
        return sum(p.lag_batches for p in self.partitions)

    def summary_lines(self) -> list[str]:
        head = self._facts_line() if self.exists else f"output table {self.uri}: not created yet"
        lines = [f"{head}, {self.lag_batches} committed batches behind"]
        lines += [
            f"  partition {p.partition}: manifest seq {p.landed_seq} (offset {p.landed_offset}), "
            f"{p.lag_batches} batches behind"
            for p in self.partitions
        ]
        return lines

    def to_json(self) -> dict[str, Any]:
        return {**self._facts_json(), "lag_batches": self.lag_batches, "partitions": [vars(p) for p in self.partitions]}


def table_status(
    store: ObjectStore,
    location: TableLocation | None = None,
    *,
    partitions: Iterable[int] | None = None,
    ledger: Ledger | None = None,
) -> TableStatus:
    """URI, version, rows and per-partition lag of the output table (reads the table's log, walks the
    chains from the table's position: one GET per batch behind)."""
    location = location or table_location(store)
    ledger = ledger or Ledger(store)
    table = open_table(location)
    rows = 0
    if table is not None:
        actions = pa.table(table.get_add_actions(flatten=True))
        if "num_records" in actions.column_names and actions.num_rows:
            rows = int(pc.sum(actions["num_records"]).as_py() or 0)
    follower = ChainFollower(store)
    result: list[PartitionTableStatus] = []
    for p in sorted(partitions) if partitions is not None else ledger.partitions():
        seq = landed_seq(table, p)
        start = follower.entry(p, seq) if seq else None
        walk = follower.walk(p, start)
        offset = start.manifest.source_offset if start else 0
        result.append(PartitionTableStatus(p, seq, offset, len(walk.batches)))
    return TableStatus(location.uri, table is not None, table.version() if table is not None else None, rows, result)
