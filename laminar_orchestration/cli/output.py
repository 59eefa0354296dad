"""What the `laminar` commands print: tables and sentences for a terminal, or JSON with ``--json``.

Commands hand their results to an `Output`; `ConsoleOutput` writes text,
`JsonOutput` writes one JSON document per command (progress notes, which a
terminal user wants while a move runs, are dropped). A command never tests
``--json`` itself.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from laminar_orchestration.protocol.tasks import MigrationTask, PhaseReport

if TYPE_CHECKING:
    # Only types here: what a command needs loads when it runs (pyarrow with `query`, the audit
    # with `verify`, deltalake with `laminar table`), not with every command's launch.
    import pyarrow as pa

    from laminar_orchestration.control.moves import MoveOutcome
    from laminar_orchestration.control.operations import NodeFailoverPlan, RebalancePlan
    from laminar_orchestration.control.snapshot import ClusterSnapshot
    from laminar_orchestration.ops.sweep import SweepReport
    from laminar_orchestration.ops.verify import PartitionAudit
    from laminar_orchestration.protocol.capabilities import StoragePolicies
    from laminar_orchestration.protocol.records import ClusterRecord
    from laminar_orchestration.protocol.stream import StreamRecord
    from laminar_orchestration.table import TableAudit, TableStatus

    #: What a move of `migrate`, `failover` and `rebalance` returns: the phases it ran.
    MoveResult = MoveOutcome[list[PhaseReport]]

__all__ = ["ConsoleOutput", "JsonOutput", "Output", "output_for"]


class Output(Protocol):
    """Where a command's results go."""

    def initialized(self, record: ClusterRecord, store_url: str, stream: StreamRecord | None = None) -> None:
        """`init` created (or re-initialized) the cluster; `stream`: its stream record (None: the default)."""

    def status(
        self, snapshot: ClusterSnapshot, table: TableStatus | None = None, stream: StreamRecord | None = None
    ) -> None:
        """`status`: every partition and node, the output table's position (None: not read), the stream."""

    def produced(self, appended: dict[int, int], log_ends: dict[int, int]) -> None:
        """`produce`: events appended per partition."""

    def key_lookup(self, partition: int, offset: int, key: str, values: dict[str, Any] | None) -> None:
        """`query --key`: one key's committed values (None: not in the state)."""

    def state(self, partition: int, offset: int, state: pa.Table) -> None:
        """`query`: the whole committed state, written row by row."""

    def audit(self, audits: Sequence[PartitionAudit], table: TableAudit | None = None) -> None:
        """`verify`: each partition's audit, the output table's (None: there is no table yet), the verdict."""

    def phase(self, report: PhaseReport) -> None:
        """A migration phase finished (progress)."""

    def migrated(self, task: MigrationTask, reports: Sequence[PhaseReport]) -> None:
        """`migrate`: the migration ended active."""

    def cancelled(self, task: MigrationTask) -> None:
        """`migrate --cancel`: the migration in flight was cancelled."""

    def failover_planned(self, plan: NodeFailoverPlan) -> None:
        """`failover`: the moves about to run (progress)."""

    def move_done(self, outcome: MoveResult) -> None:
        """One move of a failover or rebalance ended (progress)."""

    def failed_over(self, plan: NodeFailoverPlan, outcomes: Sequence[MoveResult]) -> None:
        """`failover`: every move's outcome."""

    def rebalance_planned(self, plan: RebalancePlan, dry_run: bool) -> None:
        """`rebalance`: the plan, before any move runs (progress)."""

    def rebalanced(self, plan: RebalancePlan, dry_run: bool, outcomes: Sequence[MoveResult]) -> None:
        """`rebalance`: every move's outcome."""

    def swept(self, report: SweepReport, dry_run: bool) -> None:
        """`sweep`: what was (or would be) deleted and what was kept."""

    def policies(self, policies: StoragePolicies) -> None:
        """`policies`: each role's IAM policy and the bucket policy."""


def verified(audits: Sequence[PartitionAudit], table: TableAudit | None) -> bool:
    """`verify`'s verdict: every partition's audit, and the output table's if there is one."""
    return all(a.ok for a in audits) and (table is None or table.ok)


def output_for(as_json: bool, stream: TextIO | None = None) -> Output:
    """`JsonOutput` when ``--json`` was given, else `ConsoleOutput`; both write to `stream` (default stdout)."""
    return JsonOutput(stream) if as_json else ConsoleOutput(stream)


def phase_json(report: PhaseReport) -> dict[str, Any]:
    """One phase as JSON."""
    return {
        "phase": str(report.phase),
        "duration_s": round(report.duration_s, 6),
        "bytes_moved": report.bytes_moved,
        "detail": report.detail,
    }


def outcome_json(outcome: MoveResult) -> dict[str, Any]:
    """One move's outcome as JSON: the move, ok, duration, error and phases."""
    return {
        **outcome.move.to_json(),
        "ok": outcome.ok,
        "duration_s": round(outcome.duration_s, 6),
        "error": None if outcome.ok else f"{type(outcome.error).__name__}: {outcome.error}",
        "phases": [phase_json(r) for r in (outcome.result or [])],
    }


def stream_lines(stream: StreamRecord | None) -> list[str]:
    """The stream's processor and schema in two lines (None: the default stream, which has no record)."""
    from laminar_orchestration.processing.registry import DEFAULT_PROCESSOR
    from laminar_orchestration.processing.schema import DEFAULT_STREAM_SCHEMA

    schema = stream.stream_schema if stream is not None else DEFAULT_STREAM_SCHEMA
    roles = {schema.key: " (key)", schema.event_time: " (event time)"}
    columns = ", ".join(f"{c.name} {c.type}{roles.get(c.name, '')}" for c in schema.columns)
    if stream is None:
        return [f"stream: the default, processor {DEFAULT_PROCESSOR}", f"schema: {columns}"]
    return [
        f"stream: processor {stream.processor} (fingerprint {stream.processor_fingerprint[:12]})",
        f"schema: {columns}",
    ]


def stream_json(stream: StreamRecord | None) -> dict[str, Any]:
    """The stream as JSON: its processor, fingerprint (None: the default stream) and schema document."""
    from laminar_orchestration.processing.registry import DEFAULT_PROCESSOR
    from laminar_orchestration.processing.schema import DEFAULT_STREAM_SCHEMA

    if stream is None:
        return {
            "processor": DEFAULT_PROCESSOR,
            "processor_fingerprint": None,
            "schema": DEFAULT_STREAM_SCHEMA.model_dump(mode="json"),
        }
    return {
        "processor": stream.processor,
        "processor_fingerprint": stream.processor_fingerprint,
        "schema": stream.stream_schema.model_dump(mode="json"),
    }


class ConsoleOutput:
    """Text for a terminal: sentences and aligned tables, progress as it happens."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def _say(self, line: str = "") -> None:
        print(line, file=self._stream or sys.stdout, flush=True)

    def initialized(self, record: ClusterRecord, store_url: str, stream: StreamRecord | None = None) -> None:
        self._say(f"initialized cluster {record.cluster_id} with {record.partitions} partitions in {store_url}")
        for line in stream_lines(stream):
            self._say(line)

    def status(
        self, snapshot: ClusterSnapshot, table: TableStatus | None = None, stream: StreamRecord | None = None
    ) -> None:
        say = self._say
        say(f"store {snapshot.store}  cluster {snapshot.cluster_id}  cluster epoch {snapshot.cluster_epoch}")
        if stream is not None:  # a stream of one's own (the default one: `--json` says so)
            for line in stream_lines(stream):
                say(line)
        if not snapshot.detail:
            say("as the owners' heartbeats and the assignments show it (--detail: every partition's ledger records)")
        say(
            f"{'PARTITION':>9}  {'EPOCH':>5}  {'OWNER':>5}  {'COMMITTED':>12}  {'LOG END':>12}  {'LAG':>10}  "
            f"{'TABLE LAG':>9}  {'STANDBYS':<12}  {'FAILURES':>8}  STATUS"
        )
        # Committed batches not yet in the output table, per partition.
        behind = {t.partition: str(t.lag_batches) for t in table.partitions} if table is not None else {}
        for p in snapshot.partitions:
            owner = p.owner or "-"
            failing = f"  ({p.last_failure})" if p.failures else ""
            standbys = ",".join(f"{n}(lag {lag})" for n, lag in p.standbys.items()) or "-"
            committed, end, lag = (("-" if v is None else v) for v in (p.committed_offset, p.log_end, p.lag))
            say(
                f"{p.partition:>9}  {p.epoch:>5}  {owner:>5}  {committed:>12}  {end:>12}  "
                f"{lag:>10}  {behind.get(p.partition, '-'):>9}  {standbys:<12}  {p.failures:>8}  "
                f"{p.phase_text()}{failing}"
            )
        if table is not None:
            line = table.summary_lines()[0]
            # A summary walks no chain: the table's version and rows, and where its lag is.
            say(line if snapshot.detail else f"{line.rpartition(', ')[0]}; its lag per partition with --detail")
        say(f"{'NODE':>9}  {'GEN':>5}  {'ALIVE':>5}  {'HEARTBEAT AGE':>13}  {'REQUESTS/S':>10}  STATUS")
        for n in snapshot.nodes:
            alive = "yes" if n.alive else "NO"
            # A dead or departed node's last reported rates are history, not current: not shown.
            rate = f"{n.request_rate:.1f}" if n.requests_per_s and n.alive else "-"
            say(f"{n.node:>9}  {n.generation:>5}  {alive:>5}  {n.heartbeat_age_s:>12.1f}s  {rate:>10}  {n.liveness}")
        say(
            f"store requests: {snapshot.request_rate():.1f}/s from live nodes, "
            f"about ${snapshot.monthly_request_cost():,.2f}/month at S3 list prices"
        )

    def produced(self, appended: dict[int, int], log_ends: dict[int, int]) -> None:
        for p, n in sorted(appended.items()):
            self._say(f"partition {p}: appended {n} events (log end {log_ends[p]})")

    def key_lookup(self, partition: int, offset: int, key: str, values: dict[str, Any] | None) -> None:
        if values is None:
            self._say(f"partition {partition}: committed offset {offset}, key {key!r} not in the state")
        else:
            self._say(f"partition {partition}: committed offset {offset}, key {key!r}: {values}")

    def state(self, partition: int, offset: int, state: pa.Table) -> None:
        self._say(f"partition {partition}: committed offset {offset}, {state.num_rows} keys")
        if state.schema.names[: len(_DEFAULT_STATE_COLUMNS)] == list(_DEFAULT_STATE_COLUMNS):
            self._say(f"{'KEY':<16} {'COUNT':>10} {'SUM':>16} {'MIN':>12} {'MAX':>12} {'LAST':>12}")
            for r in _rows(state):
                self._say(
                    f"{r['key']:<16} {r['count']:>10} {r['sum']:>16.4f} {r['min']:>12.4f} {r['max']:>12.4f} "
                    f"{r['last']:>12.4f}"
                )
            return
        # A processor's own state columns: one line per key, each value as JSON writes it.
        names = [n for n in state.schema.names if n != "last_offset"]
        self._say("  ".join(n.upper() for n in names))
        for r in _rows(state):
            self._say("  ".join(json.dumps(r[n], default=_json_default) for n in names))

    def audit(self, audits: Sequence[PartitionAudit], table: TableAudit | None = None) -> None:
        for a in audits:
            for line in a.summary_lines():
                self._say(line)
        for line in table.summary_lines() if table is not None else ["output table: none yet"]:
            self._say(line)
        self._say("verify: OK" if verified(audits, table) else "verify: FAILED")

    def phase(self, report: PhaseReport) -> None:
        self._say(f"{report.phase!s:<14} {report.duration_s:>9.3f}s {report.bytes_moved:>12} bytes  {report.detail}")

    def migrated(self, task: MigrationTask, reports: Sequence[PhaseReport]) -> None:
        total = sum(r.duration_s for r in reports)
        self._say(
            f"migration {task.migration_id}: partition {task.partition} node {task.from_node} -> "
            f"{task.to_node}, epoch {task.from_epoch} -> {task.to_epoch}: {task.phase} in {total:.2f}s"
        )

    def cancelled(self, task: MigrationTask) -> None:
        self._say(
            f"cancelled migration {task.migration_id} of partition {task.partition} "
            f"(node {task.from_node} -> {task.to_node}) at phase {task.failed_phase}"
        )

    def failover_planned(self, plan: NodeFailoverPlan) -> None:
        self._say(f"node {plan.node}: {len(plan.moves)} partition(s) to fail over")

    def move_done(self, outcome: MoveResult) -> None:
        m = outcome.move
        moved = sum(r.bytes_moved for r in (outcome.result or []))
        if outcome.ok:
            verdict = f"active, {moved} bytes"
        else:
            verdict = f"FAILED: {type(outcome.error).__name__}: {outcome.error}"
        self._say(
            f"partition {m.partition}: node {m.from_node or '-'} -> {m.to_node} in {outcome.duration_s:.2f}s: {verdict}"
        )

    def failed_over(self, plan: NodeFailoverPlan, outcomes: Sequence[MoveResult]) -> None:
        """Nothing more: each move was printed as it ended."""

    def rebalance_planned(self, plan: RebalancePlan, dry_run: bool) -> None:
        say, a = self._say, plan.assignment
        say(f"live nodes {sorted(plan.live_nodes)}: {len(plan.moves)} move(s)" + (" (dry run)" if dry_run else ""))
        say(f"{'NODE':>6} {'QUOTA':>7} {'RANGE':>7} {'BEFORE':>7} {'AFTER':>6}")
        for n, b in sorted(a.bounds.items()):
            say(
                f"{n:>6} {b.quota:>7.2f} {f'{b.low}..{b.high}':>7} {a.counts_before.get(n, 0):>7} "
                f"{a.counts_after.get(n, 0):>6}"
            )
        for m in plan.moves:
            say(f"move partition {m.partition}: node {m.from_node or '-'} -> {m.to_node}")
        if plan.skipped_in_flight:
            say(f"skipped (migration in flight): partitions {[m.partition for m in plan.skipped_in_flight]}")

    def rebalanced(self, plan: RebalancePlan, dry_run: bool, outcomes: Sequence[MoveResult]) -> None:
        """Nothing more: the plan and each move were printed as they happened."""

    def swept(self, report: SweepReport, dry_run: bool) -> None:
        verb = "would delete" if dry_run else "deleted"
        self._say(
            f"scanned {report.scanned} objects: {report.referenced} referenced, "
            f"{verb} {len(report.deleted)}, {len(report.kept_in_grace)} unreferenced but within the grace period, "
            f"{len(report.kept_unsealed)} of an epoch that may still publish, "
            f"{len(report.kept_unverified)} kept unverified, {len(report.unparseable)} with a name that does not parse"
        )
        for key, why in sorted(report.kept_unverified.items()):
            self._say(f"  kept {key}: {why}")
        deleted = set(report.deleted)
        for key, why in sorted(report.unparseable.items()):
            self._say(f"  {verb if key in deleted else 'kept (within the grace period)'} {key}: {why}")

    def policies(self, policies: StoragePolicies) -> None:
        where = f"s3://{policies.bucket}/{policies.prefix}".rstrip("/")
        for role, document in policies.roles.items():
            self._say(f"# IAM policy of the {role} role ({where}): attach to that role's user or role only")
            self._say(json.dumps(document, indent=2))
            self._say()
        self._say(f"# bucket policy of {policies.bucket} (conditions only S3 enforces): put-bucket-policy")
        self._say(json.dumps(policies.bucket_policy, indent=2))


def _json_default(value: object) -> object:
    # State and events of a user's stream hold any Arrow type: decimals as exact strings, binary as hex.
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


class JsonOutput:
    """One JSON document per command on stdout, for scripts; no progress notes."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def _dump(self, data: Any) -> None:
        print(json.dumps(data, indent=2, default=_json_default), file=self._stream or sys.stdout, flush=True)

    def initialized(self, record: ClusterRecord, store_url: str, stream: StreamRecord | None = None) -> None:
        self._dump({**record.model_dump(mode="json"), "stream": stream_json(stream)})

    def status(
        self, snapshot: ClusterSnapshot, table: TableStatus | None = None, stream: StreamRecord | None = None
    ) -> None:
        self._dump(
            {
                **snapshot.to_json(),
                "output_table": table.to_json() if table is not None else None,
                "stream": stream_json(stream),
            }
        )

    def produced(self, appended: dict[int, int], log_ends: dict[int, int]) -> None:
        self._dump({"appended": {str(p): n for p, n in sorted(appended.items())}})

    def key_lookup(self, partition: int, offset: int, key: str, values: dict[str, Any] | None) -> None:
        self._dump({"partition": partition, "committed_offset": offset, "key": key, "values": values})

    def state(self, partition: int, offset: int, state: pa.Table) -> None:
        # Written row by row, so a large state is never one string in memory.
        out = self._stream or sys.stdout
        out.write(f'{{"partition": {partition}, "committed_offset": {offset}, "keys": [')
        first = True
        for row in _rows(state):
            out.write(("" if first else ", ") + json.dumps(row, default=_json_default))
            first = False
        out.write("]}\n")
        out.flush()

    def audit(self, audits: Sequence[PartitionAudit], table: TableAudit | None = None) -> None:
        self._dump(
            {
                "ok": verified(audits, table),
                "partitions": [a.to_json() for a in audits],
                "output_table": table.to_json() if table is not None else None,
            }
        )

    def phase(self, report: PhaseReport) -> None:
        """Progress: left out of the JSON document."""

    def migrated(self, task: MigrationTask, reports: Sequence[PhaseReport]) -> None:
        self._dump({"migration": task.model_dump(mode="json"), "phases": [phase_json(r) for r in reports]})

    def cancelled(self, task: MigrationTask) -> None:
        self._dump({"migration": task.model_dump(mode="json")})

    def failover_planned(self, plan: NodeFailoverPlan) -> None:
        """Progress: left out of the JSON document."""

    def move_done(self, outcome: MoveResult) -> None:
        """Progress: left out of the JSON document."""

    def failed_over(self, plan: NodeFailoverPlan, outcomes: Sequence[MoveResult]) -> None:
        self._dump({"node": plan.node, "failovers": [outcome_json(o) for o in outcomes]})

    def rebalance_planned(self, plan: RebalancePlan, dry_run: bool) -> None:
        """Progress: left out of the JSON document."""

    def rebalanced(self, plan: RebalancePlan, dry_run: bool, outcomes: Sequence[MoveResult]) -> None:
        self._dump({"dry_run": dry_run, **plan.to_json(), "results": [outcome_json(o) for o in outcomes]})

    def swept(self, report: SweepReport, dry_run: bool) -> None:
        self._dump(report.to_json())

    def policies(self, policies: StoragePolicies) -> None:
        self._dump(policies.to_json())


#: The default processor's state columns, shown as a fixed-width table.
_DEFAULT_STATE_COLUMNS = ("key", "count", "sum", "min", "max", "last")


def _rows(state: pa.Table) -> Iterable[dict[str, Any]]:
    for batch in state.to_batches(65_536):
        yield from batch.drop_columns([c for c in ("last_offset",) if c in batch.schema.names]).to_pylist()
