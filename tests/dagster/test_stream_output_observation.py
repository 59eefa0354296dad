"""``stream_output`` is observed by the observation sensor, with no run: once the nodes have written
the output table, and again whenever its version moved (at most every `TABLE_EVERY_S`), carrying the
table version as its data version, so assets downstream of the table can react."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from dagster import AssetObservation

from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import LocalObjectStore
from laminar_orchestration.table import TableCommitter
from sensors.observation import TABLE_EVERY_S, TABLE_UNSEEN_EVERY_S, ObservationCursor, observe
from tests.table.cluster import committed

pytestmark = pytest.mark.dagster


def _table_events(events: Sequence[object]) -> list[AssetObservation]:
    return [e for e in events if isinstance(e, AssetObservation) and e.asset_key.to_user_string() == "stream_output"]


def test_the_output_table_is_observed_when_its_version_moves(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    cluster = committed(store)
    ledger, at = Ledger(store), 1_000_000.0
    manifests = ManifestReader(store)
    before = observe(ledger, manifests, ObservationCursor(), now=at)
    assert not _table_events(before.events)  # no table yet: nothing to observe

    TableCommitter(store).sync([0, 1])
    # Not seen yet: looked for again sooner than a minute later.
    (first,) = _table_events(observe(ledger, manifests, before.cursor, now=at + TABLE_UNSEEN_EVERY_S).events)
    cursor = observe(ledger, manifests, before.cursor, now=at + TABLE_EVERY_S).cursor
    assert first.tags["dagster/data_version"] == "v1"
    rows = first.metadata["rows"].value
    assert isinstance(rows, int) and rows > 0 and first.metadata["lag_batches"].value == 0
    # Unchanged: not observed again; within the interval: not even read.
    assert not _table_events(observe(ledger, manifests, cursor, now=at + 2 * TABLE_EVERY_S).events)

    cluster.produce(40)
    cluster.commit_batches(cluster.tokens[0])
    TableCommitter(store).sync([0, 1])
    assert not _table_events(observe(ledger, manifests, cursor, now=at + TABLE_EVERY_S + 1).events)
    (moved,) = _table_events(observe(ledger, manifests, cursor, now=at + 3 * TABLE_EVERY_S).events)
    assert moved.tags["dagster/data_version"] == "v2"
