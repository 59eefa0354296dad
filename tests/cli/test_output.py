"""What the `laminar` commands print: the status table (a row per partition with its lag in events and, with an
output table, in batches; a row per node with its liveness), one JSON document per command with ``--json``
and no progress notes in it, a failed move named with its error, and `verify`'s verdict over every partition
and the output table.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from decimal import Decimal

import pyarrow as pa

from laminar_orchestration.cli.output import ConsoleOutput, JsonOutput, outcome_json, output_for, verified
from laminar_orchestration.control.moves import MoveOutcome
from laminar_orchestration.control.placement import Move
from laminar_orchestration.control.snapshot import ClusterSnapshot, NodeSnapshot, PartitionSnapshot
from laminar_orchestration.ops.verify import AuditIssue, PartitionAudit, reference_fold
from laminar_orchestration.protocol.tasks import MigrationPhase, PhaseReport
from laminar_orchestration.table import TableAudit, TableStatus
from laminar_orchestration.table.audit import PartitionTableStatus, TableIssue
from tests.ops.test_demo_status import task

HEARTBEAT = datetime(2024, 1, 1, tzinfo=UTC)
DRAINED = PhaseReport(MigrationPhase.DRAINING, 0.25, 1024, "drained at offset 40")


def _cluster() -> ClusterSnapshot:
    """Partition 0 on node 1, 60 events behind, warm on node 2, failing; partition 1 unassigned; node 2 dead."""
    owned = PartitionSnapshot(
        partition=0,
        epoch=4,
        owner=1,
        status="active",
        head_lagged=False,
        owner_alive=True,
        migration=None,
        committed_offset=40,
        log_end=100,
        standbys={2: 5},
        failures=2,
        last_failure="OSError: disk full",
    )
    unassigned = PartitionSnapshot(1, 0, 0, "unassigned", False, False, None, committed_offset=0, log_end=0)
    live = NodeSnapshot(1, 2, "alive", True, HEARTBEAT, 0.4, "host", 10, requests_per_s={"GET": 2.0, "PUT": 0.5})
    dead = NodeSnapshot(2, 1, "alive", False, HEARTBEAT, 42.0, "host", 11, requests_per_s={"GET": 9.0})
    left = NodeSnapshot(3, 1, "left", False, HEARTBEAT, 900.0, "host", 12, requests_per_s={"GET": 4.0})
    return ClusterSnapshot("file:///store", "c-1", 3, (owned, unassigned), (live, dead, left))


def _printed(table: TableStatus | None = None) -> list[str]:
    stream = io.StringIO()
    output_for(False, stream).status(_cluster(), table)
    return stream.getvalue().splitlines()


def test_status_table_has_a_row_per_partition_with_its_lag_and_a_row_per_node() -> None:
    lines = _printed()
    assert lines[0] == "store file:///store  cluster c-1  cluster epoch 3"
    assert lines[1].split()[:9] == ["PARTITION", "EPOCH", "OWNER", "COMMITTED", "LOG", "END", "LAG", "TABLE", "LAG"]
    owned, unassigned = lines[2], lines[3]
    # Committed 40 of 100: 60 events of lag; no output table read: no table lag.
    assert owned.split()[:7] == ["0", "4", "1", "40", "100", "60", "-"]
    assert "2(lag 5)" in owned and owned.endswith("  2  active  (OSError: disk full)")
    assert unassigned.split() == ["1", "0", "-", "0", "0", "0", "-", "-", "0", "unassigned"]
    nodes = {line.split()[0]: line.split() for line in lines[5:8]}
    assert nodes["1"] == ["1", "2", "yes", "0.4s", "2.5", "alive"]
    # The status agrees with liveness, and a gone node's last rates are not shown as current.
    assert nodes["2"] == ["2", "1", "NO", "42.0s", "-", "dead"]
    assert nodes["3"] == ["3", "1", "NO", "900.0s", "-", "left"]
    # Only live nodes' requests count.
    assert lines[-1].startswith("store requests: 2.5/s from live nodes, about $")


def test_status_table_shows_each_partitions_batches_behind_in_the_output_table() -> None:
    table = TableStatus(
        "file:///table", exists=True, version=7, rows=90, partitions=[PartitionTableStatus(0, 3, 30, 2)]
    )
    lines = _printed(table)
    assert lines[2].split()[6] == "2" and lines[3].split()[6] == "-"
    assert "output table file:///table: version 7, 90 rows, 2 committed batches behind" in lines


def test_json_is_one_document_per_command_without_progress_notes() -> None:
    moved = task(MigrationPhase.ACTIVE)
    text, data = io.StringIO(), io.StringIO()
    for out in (output_for(False, text), output_for(True, data)):
        out.phase(DRAINED)
        out.move_done(MoveOutcome(Move(0, 1, 2), [DRAINED], None, 0.25))
        out.migrated(moved, [DRAINED])
    assert isinstance(output_for(True), JsonOutput) and isinstance(output_for(False), ConsoleOutput)
    assert json.loads(data.getvalue()) == {
        "migration": moved.model_dump(mode="json"),
        "phases": [{"phase": "draining", "duration_s": 0.25, "bytes_moved": 1024, "detail": "drained at offset 40"}],
    }
    phase, done, migrated = text.getvalue().splitlines()
    assert phase.split() == ["draining", "0.250s", "1024", "bytes", "drained", "at", "offset", "40"]
    assert done == "partition 0: node 1 -> 2 in 0.25s: active, 1024 bytes"
    assert migrated == f"migration {moved.migration_id}: partition 0 node 1 -> 2, epoch 1 -> 2: active in 0.25s"


def test_a_failed_move_is_named_with_its_error() -> None:
    failed = MoveOutcome[list[PhaseReport]](Move(3, 0, 2), None, TimeoutError("no download in 0.1s"), 1.5)
    assert outcome_json(failed) == {
        "partition": 3,
        "from_node": 0,
        "to_node": 2,
        "ok": False,
        "duration_s": 1.5,
        "error": "TimeoutError: no download in 0.1s",
        "phases": [],
    }
    stream = io.StringIO()
    ConsoleOutput(stream).move_done(failed)
    assert stream.getvalue() == "partition 3: node - -> 2 in 1.50s: FAILED: TimeoutError: no download in 0.1s\n"


def test_verify_fails_when_any_partition_or_the_output_table_has_a_problem() -> None:
    clean = [PartitionAudit(0, committed_offset=10, events_in_source=10, manifests=2, epochs_granted=1)]
    lost = [*clean, PartitionAudit(1, issues=[AuditIssue(1, "loss", "no committed output", 0, 10)])]
    table_ok = TableAudit("file:///table", exists=True, version=1, rows=10)
    table_bad = TableAudit("file:///table", issues=[TableIssue(0, "duplicate", "batch twice", seq=2)])
    assert verified(clean, None) and verified(clean, table_ok)
    assert not verified(lost, None) and not verified(clean, table_bad)
    stream = io.StringIO()
    ConsoleOutput(stream).audit(lost)
    assert stream.getvalue().splitlines() == [
        "partition 0: committed 10/10 events, 2 manifests, 1 epoch: ok",
        "partition 1: committed 0/0 events, 0 manifests, 0 epochs: 1 PROBLEMS",
        "  loss [0, 10): no committed output",
        "output table: none yet",
        "verify: FAILED",
    ]
    stream = io.StringIO()
    JsonOutput(stream).audit(clean, table_bad)
    document = json.loads(stream.getvalue())
    assert document["ok"] is False and document["output_table"]["issues"][0]["kind"] == "duplicate"
    assert document["partitions"] == [clean[0].to_json()]


def test_json_state_lists_every_key_without_its_last_offset() -> None:
    events = pa.table({"offset": [0, 1, 2], "key": ["a", "b", "a"], "value": [1.0, 5.0, 3.0]})
    stream = io.StringIO()
    JsonOutput(stream).state(4, 3, reference_fold(events))
    document = json.loads(stream.getvalue())
    assert (document["partition"], document["committed_offset"]) == (4, 3)
    assert sorted(document["keys"], key=lambda row: str(row["key"])) == [
        {"key": "a", "count": 2, "sum": 4.0, "min": 1.0, "max": 3.0, "last": 3.0},
        {"key": "b", "count": 1, "sum": 5.0, "min": 5.0, "max": 5.0, "last": 5.0},
    ]


def test_a_processors_own_state_prints_as_text_and_json_with_every_arrow_type() -> None:
    # A windowed stream's state: decimals, timestamps, lists and nulls, and no default columns.
    state = pa.table(
        {
            "key": ["1700000100000|u1"],
            "views": pa.array([3], pa.int64()),
            "amount": pa.array([Decimal("12.50")], pa.decimal128(12, 2)),
            "window_start": pa.array([datetime(2023, 11, 14, 22, 15, tzinfo=UTC)], pa.timestamp("ms", tz="UTC")),
            "pages": pa.array([["/", "/cart"]], pa.list_(pa.string())),
            "tags": pa.array([None], pa.list_(pa.string())),
        }
    )
    text = io.StringIO()
    ConsoleOutput(text).state(0, 9, state)
    lines = text.getvalue().splitlines()
    assert lines[1].split() == ["KEY", "VIEWS", "AMOUNT", "WINDOW_START", "PAGES", "TAGS"]
    assert '"12.50"' in lines[2] and "2023-11-14T22:15:00+00:00" in lines[2] and "null" in lines[2]
    document = io.StringIO()
    JsonOutput(document).state(0, 9, state)
    (row,) = json.loads(document.getvalue())["keys"]
    assert row["amount"] == "12.50" and row["pages"] == ["/", "/cart"] and row["tags"] is None
    assert row["window_start"].startswith("2023-11-14T22:15:00")
