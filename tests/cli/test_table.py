"""`laminar table`, the operator's commands over the output table, on one cluster: ``status`` before the table
exists, ``sync`` of some partitions and then of all, ``audit``, ``maintain``, ``rebuild``, a ``sync``
to another table with ``--table``, and ``maintain`` of a place with no table (a not-found error)."""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable

from laminar_orchestration.cli import main
from laminar_orchestration.store import LocalObjectStore
from laminar_orchestration.table import table_location, table_status
from tests.table.cluster import Cluster


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
