"""What `laminar verify` and `laminar status` say about the output table (`audit`).

`audit_table` checks the table against the manifest chains: every batch the table claims is there
exactly once, with its manifest's lineage and row count, and nothing else is; each departure is
named by partition, kind and manifest seq (missing rows, a duplicate, rows of no committed entry or
of a partition the cluster lacks, rows stamped with another lineage, a table ahead of its chain).
Committed batches above the table's version are lag, not loss. `table_status` gives the table's
version and rows and, per partition, the newest batch in the table, the source offset it reached
and how many committed batches it still lacks.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from laminar_orchestration.cli import main
from laminar_orchestration.store import LocalObjectStore
from laminar_orchestration.table import TableCommitter, app_id, audit_table, table_location, table_status
from tests.table.cluster import Cluster, committed, output_table

#: Changes a table holding partition 0's batch `seq` (and others) behind the committer's back.
Tamper = Callable[[DeltaTable, int], None]


def test_verify_audits_the_table_once_there_is_one(
    local_store: LocalObjectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    # This cluster's commits carry no real state checkpoints: only verify's table part is judged here.
    cluster = Cluster(local_store, partitions=1)
    cluster.produce(60)
    cluster.commit_batches(cluster.acquire(0, 1))
    url = local_store.url
    main(["verify", "--store", url, "--json"])
    assert json.loads(capsys.readouterr().out)["output_table"] is None  # no node created it yet

    TableCommitter(local_store).sync([0])
    main(["verify", "--store", url, "--json"])
    table_report = json.loads(capsys.readouterr().out)["output_table"]
    assert table_report["ok"] and table_report["rows"] > 0 and not table_report["issues"]

    # A batch appended twice (a writer that ignored the transaction ids) fails the table's audit.
    table = DeltaTable(table_location(local_store).uri)
    write_deltalake(table, table.to_pyarrow_table().slice(0, 1), mode="append")
    assert main(["verify", "--store", url, "--json"]) == 1
    table_report = json.loads(capsys.readouterr().out)["output_table"]
    assert not table_report["ok"] and [i["kind"] for i in table_report["issues"]] == ["duplicate"]


def test_status_names_the_table_and_each_partitions_table_lag(
    local_store: LocalObjectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(80)
    for p in (0, 1):
        cluster.commit_batches(cluster.acquire(p, 1))
    TableCommitter(local_store).sync([0])  # partition 1's batches are not in the table yet
    assert main(["status", "--store", local_store.url, "--json"]) == 0
    table = json.loads(capsys.readouterr().out)["output_table"]
    assert table["uri"] == table_location(local_store).uri
    lag = {p["partition"]: p["lag_batches"] for p in table["partitions"]}
    assert lag[0] == 0 and lag[1] > 0

    assert main(["status", "--store", local_store.url]) == 0
    out = capsys.readouterr().out
    assert "TABLE LAG" in out and f"output table {table['uri']}" in out


def test_batches_committed_above_the_tables_version_are_lag_not_loss(local_store: LocalObjectStore) -> None:
    cluster = committed(local_store)
    TableCommitter(local_store).sync([0, 1])
    landed_offset = cluster.committed_offset(0)
    cluster.produce(160)
    behind = cluster.commit_batches(cluster.tokens[0])
    audit = audit_table(local_store)
    assert audit.ok and audit.exists, audit.summary_lines()
    zero, one = audit.partitions
    assert zero.lag_batches == behind > 0 and one.lag_batches == 0
    assert zero.committed_batches == zero.batches_in_table + behind
    assert zero.landed_seq == output_table(local_store).transaction_version(app_id(0))
    assert audit.rows == zero.rows + one.rows == output_table(local_store).to_pyarrow_table().num_rows

    status = table_status(local_store)
    assert (status.exists, status.version, status.rows) == (True, audit.version, audit.rows)
    assert [(p.partition, p.landed_seq, p.lag_batches) for p in status.partitions] == [
        (0, zero.landed_seq, behind),
        (1, one.landed_seq, 0),
    ]
    assert status.partitions[0].landed_offset == landed_offset and status.lag_batches == behind


def _append_with(column: str, value: int) -> Tamper:
    """Appends a copy of the batch's rows with `column` set to `value` (a writer that ignored the chains)."""

    def tamper(table: DeltaTable, seq: int) -> None:
        data = table.to_pyarrow_table()
        rows = data.filter(pc.and_(pc.equal(data["partition"], 0), pc.equal(data["batch_seq"], seq)))
        field = rows.schema.field(column)
        rows = rows.set_column(
            rows.schema.get_field_index(column), field, pa.array([value] * rows.num_rows, field.type)
        )
        write_deltalake(table, rows, mode="append")

    return tamper


def _restamp(table: DeltaTable, seq: int) -> None:
    table.update(updates={"epoch": "99"}, predicate=f"partition = 0 AND batch_seq = {seq}")


def _drop(table: DeltaTable, seq: int) -> None:
    table.delete(f"partition = 0 AND batch_seq = {seq}")


def _claim_beyond_the_chain(table: DeltaTable, _seq: int) -> None:
    # A commit of no rows that sets partition 0's transaction version past its chain's end.
    empty = pa.schema(table.schema().to_arrow()).empty_table()
    write_deltalake(
        table, empty, mode="append", commit_properties=CommitProperties(app_transactions=[Transaction(app_id(0), 999)])
    )


@pytest.mark.parametrize(
    ("tamper", "kind", "partition", "named_seq"),
    [
        (_drop, "missing", 0, True),
        (_restamp, "lineage", 0, True),
        (_append_with("batch_seq", 999), "foreign", 0, False),
        (_append_with("partition", 7), "foreign", 7, False),
        (_claim_beyond_the_chain, "ahead", 0, False),
    ],
    ids=["missing", "lineage", "foreign-batch", "foreign-partition", "ahead"],
)
def test_each_way_the_table_departs_from_the_chains_is_named(
    local_store: LocalObjectStore, tamper: Tamper, kind: str, partition: int, named_seq: bool
) -> None:
    committed(local_store)
    TableCommitter(local_store).sync([0, 1])
    assert audit_table(local_store).ok
    data = output_table(local_store).to_pyarrow_table()
    seq = min(data.filter(pc.equal(data["partition"], 0))["batch_seq"].to_pylist())
    tamper(output_table(local_store), seq)
    audit = audit_table(local_store)
    assert not audit.ok
    assert [(i.partition, i.kind) for i in audit.issues] == [(partition, kind)], audit.summary_lines()
    if named_seq:
        assert audit.issues[0].seq == seq
    assert f"partition {partition} {kind}" in "\n".join(audit.summary_lines())
