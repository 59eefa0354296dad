"""Maintenance keeps the content and the transaction versions; the `laminar table` commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_orchestration.cli import main
from laminar_orchestration.store import LocalObjectStore
from laminar_orchestration.table import (
    TableCommitter,
    app_id,
    audit_table,
    compact_and_checkpoint,
    table_location,
    table_status,
)
from tests.table.cluster import Cluster, table_counts


def test_compaction_checkpoint_and_vacuum_keep_every_batch_once(local_store: LocalObjectStore) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(200)
    tokens = [cluster.acquire(p, 1) for p in (0, 1)]
    committer = TableCommitter(local_store)
    for _ in range(4):  # several small commits: several small files
        for token in tokens:
            cluster.commit_batches(token, max_batches=1)
        committer.sync([0, 1])
    location = table_location(local_store)
    before = DeltaTable(location.uri)
    versions = {p: before.transaction_version(app_id(p)) for p in (0, 1)}
    report = compact_and_checkpoint(location, retention_hours=0)
    assert report.files_removed > report.files_added >= 1 and report.vacuumed == report.files_removed
    after = DeltaTable(location.uri)
    assert {p: after.transaction_version(app_id(p)) for p in (0, 1)} == versions
    assert list((Path(location.uri) / "_delta_log").glob("*.checkpoint.parquet"))
    data = after.to_pyarrow_table()
    for p in (0, 1):
        cluster.commit_batches(tokens[p])
    committer.sync([0, 1])  # appends go on after maintenance, from the same transaction versions
    data = DeltaTable(location.uri).to_pyarrow_table()
    for p in (0, 1):
        assert table_counts(data, p) == cluster.source_counts(p)
    assert audit_table(local_store).ok


def test_the_table_commands(local_store: LocalObjectStore, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(120)
    for p in (0, 1):
        cluster.commit_batches(cluster.acquire(p, 1))
    url = local_store.url

    assert main(["table", "status", "--store", url, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["exists"] is False and status["lag_batches"] > 0

    assert main(["table", "sync", "--store", url, "--partitions", "0", "--json"]) == 0
    synced = json.loads(capsys.readouterr().out)
    assert synced["commits"] == 1 and set(synced["landed"]) == {"0"}
    lag = table_status(local_store).partitions
    assert lag[0].lag_batches == 0 and lag[1].lag_batches > 0

    assert main(["table", "sync", "--store", url]) == 0
    assert "appended" in capsys.readouterr().out
    assert main(["table", "audit", "--store", url]) == 0
    assert ": ok" in capsys.readouterr().out
    assert main(["table", "maintain", "--store", url, "--retention-hours", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version_after"] >= 2
    assert main(["table", "rebuild", "--store", url, "--json"]) == 0
    rebuilt = json.loads(capsys.readouterr().out)
    assert rebuilt["removed_objects"] > 0 and rebuilt["batches"] > 0
    assert main(["table", "status", "--store", url]) == 0
    out = capsys.readouterr().out
    assert table_location(local_store).uri in out and "0 committed batches behind" in out

    other = local_store.root.parent / "elsewhere"
    assert main(["table", "sync", "--store", url, "--table", other.as_uri()]) == 0
    assert DeltaTable(str(other)).version() == 1  # created, then every batch in one commit
    capsys.readouterr()
    assert main(["table", "maintain", "--store", url, "--table", str(local_store.root.parent / "none")]) == 7
    assert "no output table" in capsys.readouterr().err


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
