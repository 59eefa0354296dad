"""Where the output table is (`location`): beside the store by default (``<root>/tables/output``
locally, under the S3 store's prefix with its endpoint handed to delta-rs), even behind store
wrappers; a location recorded in the store overrides that, and ``$LAMINAR_TABLE_URI`` or an explicit
URI override both; a corrupt record is named. A place the table may not be is refused, naming what
is wrong: a URI delta-rs cannot use, a place among the store's keys or around the store (its vacuum
would delete them), a file, a place that holds another Delta table; under the store's ``tables/``
prefix is fine. Through ``laminar init --output-table`` on a local store, and `check_table_uri` on
the S3-protocol server.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from laminar_orchestration.cli import main
from laminar_orchestration.errors import ErrorKind
from laminar_orchestration.protocol.keys import OUTPUT_TABLE_KEY
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import ForwardingStore, LocalObjectStore, ObjectStore
from laminar_orchestration.store.s3 import S3ObjectStore
from laminar_orchestration.table import (
    InvalidTableUri,
    OutputTableRecordCorrupt,
    check_table_uri,
    record_table_location,
    table_location,
)
from laminar_orchestration.table.location import TABLE_URI_ENV
from tests.table.cluster import Cluster


def test_by_default_the_table_sits_in_the_local_stores_directory_even_behind_wrappers(
    local_store: LocalObjectStore,
) -> None:
    location = table_location(ForwardingStore(ForwardingStore(local_store)))
    assert location.uri == str(local_store.root / "tables" / "output")
    assert location.is_local and location.options() is None


def test_by_default_the_table_sits_under_the_s3_stores_prefix_reached_through_its_endpoint(
    s3_store: S3ObjectStore, s3_endpoint: str
) -> None:
    location = table_location(ForwardingStore(s3_store))
    assert location.uri == f"s3://{s3_store.bucket}/{s3_store.prefix}/tables/output" and not location.is_local
    # delta-rs does not use boto3: it is handed the store's endpoint (plain HTTP here) and a region.
    options = location.options()
    assert options is not None
    assert options["AWS_ENDPOINT_URL"] == s3_endpoint and options["AWS_ALLOW_HTTP"] == "true"
    assert options["AWS_REGION"]


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
