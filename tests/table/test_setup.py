"""Choosing where the output table lives (`setup`), at ``laminar init --output-table URI``.

The choice is recorded in the store, so every node and command finds the same table without being
told. It is checked before anything is written: a place holding files but no Delta table, or another
cluster's table, is refused and nothing is recorded. A recorded location is moved only on purpose
(``--force``), which also repairs a corrupt record; the new table is built from the manifest chains.
Of two inits racing to record a location, the one that recorded first wins.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable

from laminar_orchestration.cli import main
from laminar_orchestration.errors import ErrorKind
from laminar_orchestration.protocol.keys import OUTPUT_TABLE_KEY
from laminar_orchestration.store import ForwardingStore, LocalObjectStore, ObjectStore, StoredObject
from laminar_orchestration.table import (
    InvalidTableUri,
    OutputTableRecordCorrupt,
    TableCommitter,
    TableLocationConflict,
    TableMismatch,
    audit_table,
    record_table_location,
    recorded_table,
    table_location,
)
from laminar_orchestration.table import location as location_module
from tests.table.cluster import Cluster, table_counts


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


def test_a_place_holding_files_but_no_delta_table_is_refused_and_nothing_recorded(
    local_store: LocalObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No wait for a creation in progress: these files will never get a log.
    monkeypatch.setattr(location_module, "CREATION_GRACE_S", 0.0)
    Cluster(local_store, partitions=1)
    place = tmp_path / "lake"
    place.mkdir()
    (place / "part-0.parquet").write_bytes(b"not a table")
    with pytest.raises(InvalidTableUri, match="holds files but no readable Delta table"):
        record_table_location(local_store, str(place))
    assert recorded_table(local_store) is None


def test_another_clusters_table_is_refused_and_nothing_recorded(local_store: LocalObjectStore, tmp_path: Path) -> None:
    other = Cluster(LocalObjectStore(tmp_path / "other-store"), partitions=1)
    other.produce(40)
    other.commit_batches(other.acquire(0, 1))
    theirs = table_location(other.store)
    TableCommitter(other.store).sync([0])
    ours = Cluster(local_store, partitions=1).ledger.cluster().cluster_id
    with pytest.raises(TableMismatch, match="laminar_output/") as err:
        record_table_location(local_store, theirs.uri, cluster_id=ours)
    assert ours in str(err.value)
    assert recorded_table(local_store) is None


def test_a_corrupt_record_is_named_unless_forced_and_force_repairs_it(
    local_store: LocalObjectStore, tmp_path: Path
) -> None:
    Cluster(local_store, partitions=1)
    local_store.put_if_absent(OUTPUT_TABLE_KEY, b"{not json")
    wanted = str(tmp_path / "lake")
    with pytest.raises(OutputTableRecordCorrupt):
        record_table_location(local_store, wanted)
    assert record_table_location(local_store, wanted, replace=True).uri == wanted
    record = recorded_table(local_store)
    assert record is not None and record.uri == wanted


class _ReadBeforeTheRival(ForwardingStore):
    """Answers the first read of the location record as absent: this init read it before a rival's
    init recorded its own, and then tries to create it."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.stale_reads = 1

    def get_or_none(self, key: str) -> StoredObject | None:
        if key == OUTPUT_TABLE_KEY and self.stale_reads:
            self.stale_reads -= 1
            return None
        return self.inner.get_or_none(key)


def test_of_two_inits_racing_to_record_a_location_the_first_wins(local_store: LocalObjectStore, tmp_path: Path) -> None:
    Cluster(local_store, partitions=1)
    rival, mine = str(tmp_path / "rival"), str(tmp_path / "mine")
    record_table_location(local_store, rival)
    racing = _ReadBeforeTheRival(local_store)
    with pytest.raises(TableLocationConflict) as err:
        record_table_location(racing, mine)
    assert racing.stale_reads == 0 and rival in str(err.value) and mine in str(err.value)
    record = recorded_table(local_store)
    assert record is not None and record.uri == rival
    # The same place as the rival's is no conflict: both inits agree.
    assert record_table_location(_ReadBeforeTheRival(local_store), rival).uri == rival
