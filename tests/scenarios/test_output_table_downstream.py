"""The README's downstream read of the output table, executed as written: plain `deltalake`, and a
Dagster asset downstream of `stream_output` that materializes from the table alone."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from laminar_orchestration.store import LocalObjectStore
from laminar_orchestration.table import TableCommitter, table_location
from tests.table.cluster import Cluster

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_snippet(uri: str) -> dict[str, Any]:
    """The code block of "The output as a table", its table path replaced by `uri`, run."""
    text = README.read_text().split("### The output as a table", 1)[1]
    code = text.split("```python", 1)[1].split("```", 1)[0]
    assert ".laminar/store/tables/output" in code
    namespace: dict[str, Any] = {}
    exec(code.replace(".laminar/store/tables/output", uri), namespace)
    return namespace


@pytest.mark.dagster
def test_the_readmes_downstream_asset_materializes_from_the_table(local_store: LocalObjectStore) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(300)
    for p in (0, 1):
        cluster.commit_batches(cluster.acquire(p, 1))
    TableCommitter(local_store).sync([0, 1])
    namespace = _readme_snippet(table_location(local_store).uri)
    result = dg.materialize([namespace["events_per_key"]])
    assert result.success
    metadata = result.asset_materializations_for_node("events_per_key")[0].metadata
    produced = Counter[str]()
    for p in (0, 1):
        produced.update(cluster.source_counts(p))
    assert metadata["keys"] == dg.IntMetadataValue(len(produced))
