"""Where the output table is: `<store>/tables/output` by default, chosen at `laminar init --output-table`
and found there by every node and command; a place it may not be is refused, naming what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_orchestration.cli import main
from laminar_orchestration.errors import ErrorKind
from laminar_orchestration.protocol.keys import OUTPUT_TABLE_KEY
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import LocalObjectStore, ObjectStore
from laminar_orchestration.store.s3 import S3ObjectStore
from laminar_orchestration.table import (
    InvalidTableUri,
    OutputTableRecordCorrupt,
    TableCommitter,
    TableLocationConflict,
    audit_table,
    check_table_uri,
    record_table_location,
    recorded_table,
    table_location,
)
from laminar_orchestration.table.location import TABLE_URI_ENV
from tests.table.cluster import Cluster, table_counts


@pytest.fixture(autouse=True)
def _no_table_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TABLE_URI_ENV, raising=False)


def test_init_records_the_table_where_nodes_and_commands_find_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "lake" / "stream-output"
    url = (tmp_path / "store").as_uri()
    assert main(["init", "--store", url, "--partitions", "2", "--output-table", str(elsewhere)]) == 0
    assert f"output table {elsewhere}" in capsys.readouterr().out
    store = LocalObjectStore(tmp_path / "store", create=False)
    record = recorded_table(store)
    assert record is not None and record.uri == str(elsewhere)

    # What a node keeps (`laminar node run` builds its committer from the store alone) lands there.
    committer = TableCommitter(store)
    assert committer.location.uri == str(elsewhere)
    cluster = Cluster(store, partitions=2, existing=True)
    cluster.produce(120)
    for p in (0, 1):
        cluster.commit_batches(cluster.acquire(p, 1))
    committer.sync([0, 1])
    assert not (tmp_path / "store" / "tables" / "output").exists()
    data = DeltaTable(str(elsewhere)).to_pyarrow_table()
    for p in (0, 1):
        assert table_counts(data, p) == cluster.source_counts(p)
    assert main(["table", "status", "--store", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["uri"] == str(elsewhere)
    assert audit_table(store).ok


def _refused(tmp_path: Path, uri: str, capsys: pytest.CaptureFixture[str]) -> str:
    url = (tmp_path / "store").as_uri()
    assert main(["init", "--store", url, "--partitions", "2", "--output-table", uri]) == 2
    err = capsys.readouterr().err
    assert err.startswith("laminar: error: --output-table: ") and err.count("\n") == 1, err
    if (tmp_path / "store").exists():  # refused before the store was opened otherwise
        store = LocalObjectStore(tmp_path / "store", create=False)
        assert not Ledger(store).is_initialized() and store.get_or_none(OUTPUT_TABLE_KEY) is None  # nothing written
    return err


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("ftp://host/tables/out", "unsupported scheme 'ftp'"),
        ("s3:///prefix-without-bucket", "no bucket"),
        ("   ", "empty"),
    ],
)
def test_a_uri_delta_rs_cannot_use_is_refused(
    tmp_path: Path, uri: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert says in _refused(tmp_path, uri, capsys)


def test_a_place_among_the_stores_keys_or_around_the_store_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    inside = _refused(tmp_path, str(store / "ledger" / "table"), capsys)
    assert "inside the store" in inside and "tables/" in inside
    around = _refused(tmp_path, str(tmp_path), capsys)
    assert "contains the store" in around and "vacuum" in around
    assert "contains the store" in _refused(tmp_path, store.as_uri(), capsys)
    (tmp_path / "a-file").write_text("x")
    assert "is a file" in _refused(tmp_path, str(tmp_path / "a-file"), capsys)
    foreign = tmp_path / "foreign"
    write_deltalake(str(foreign), pa.table({"x": [1]}), name="someone-elses")
    assert "already holds a Delta table ('someone-elses')" in _refused(tmp_path, str(foreign), capsys)
    # Under the store's tables/ prefix is fine.
    url = store.as_uri()
    assert main(["init", "--store", url, "--partitions", "1", "--output-table", str(store / "tables" / "b")]) == 0


def test_moving_the_table_of_an_existing_cluster_takes_force(
    local_store: LocalObjectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = Cluster(local_store, partitions=1)
    cluster.produce(60)
    cluster.commit_batches(cluster.acquire(0, 1))
    TableCommitter(local_store).sync([0])  # the default location has this cluster's table
    default = table_location(local_store).uri
    url, moved = local_store.url, str(tmp_path / "moved")
    assert main(["init", "--store", url, "--partitions", "1", "--output-table", moved]) == 4  # exists, no --force
    assert "already exists" in capsys.readouterr().err and recorded_table(local_store) is None
    assert main(["init", "--store", url, "--partitions", "1", "--force", "--output-table", moved]) == 0
    assert table_location(local_store).uri == moved
    TableCommitter(local_store).sync([0])  # the new table is built from the manifest chains
    assert table_counts(DeltaTable(moved).to_pyarrow_table(), 0) == cluster.source_counts(0)
    # Back to the old place: it holds this cluster's table, so it is accepted.
    assert main(["init", "--store", url, "--partitions", "1", "--force", "--output-table", default]) == 0
    with pytest.raises(TableLocationConflict) as err:
        record_table_location(local_store, moved, cluster_id=cluster.ledger.cluster().cluster_id)
    assert err.value.error_kind is ErrorKind.CONFLICT and moved in str(err.value) and default in str(err.value)


def test_the_environment_overrides_the_record_and_a_corrupt_record_is_named(
    local_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Cluster(local_store, partitions=1)
    record_table_location(local_store, str(tmp_path / "recorded"))
    monkeypatch.setenv(TABLE_URI_ENV, str(tmp_path / "per-process"))
    assert table_location(local_store).uri == str(tmp_path / "per-process")
    monkeypatch.delenv(TABLE_URI_ENV)
    assert table_location(local_store).uri == str(tmp_path / "recorded")
    assert table_location(local_store, str(tmp_path / "flag")).uri == str(tmp_path / "flag")

    current = local_store.get(OUTPUT_TABLE_KEY)
    local_store.put_if_match(OUTPUT_TABLE_KEY, b'{"uri": 3}', current.etag)
    with pytest.raises(OutputTableRecordCorrupt) as err:
        table_location(local_store)
    assert err.value.error_kind is ErrorKind.CORRUPT_DATA and OUTPUT_TABLE_KEY in str(err.value)


def test_on_s3_a_place_among_the_stores_keys_or_around_it_is_refused(s3_store: S3ObjectStore) -> None:
    bucket, prefix = s3_store.bucket, s3_store.prefix
    assert check_table_uri(s3_store, f"s3://{bucket}/{prefix}/tables/mine").uri == f"s3://{bucket}/{prefix}/tables/mine"
    assert check_table_uri(s3_store, f"s3://other-bucket/{prefix}/ledger").uri == f"s3://other-bucket/{prefix}/ledger"
    assert check_table_uri(s3_store, f"s3a://{bucket}/{prefix}-lake/out").uri == f"s3://{bucket}/{prefix}-lake/out"
    with pytest.raises(InvalidTableUri, match=r"inside the store .* not under its tables/ prefix"):
        check_table_uri(s3_store, f"s3://{bucket}/{prefix}/manifests/out")
    for around in (f"s3://{bucket}", f"s3://{bucket}/{prefix}"):
        with pytest.raises(InvalidTableUri, match="contains the store"):
            check_table_uri(s3_store, around)
