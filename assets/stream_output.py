"""``stream_output``: the committed output as an exactly-once Delta Lake table, observed.

The table (``<store>/tables/output`` unless ``LAMINAR_TABLE_URI`` says
otherwise) is written by the nodes' `TableCommitter` and by ``laminar table
sync``; Dagster never computes it, so it is an observable source asset. Each
observation reads the table's log and the manifest chains from the table's
position: its data version is the table version, its metadata the URI, the
rows, the committed batches not yet in the table and each partition's last
committed batch in the table. Read it downstream with ``deltalake`` alone::

    from deltalake import DeltaTable
    DeltaTable(uri, storage_options=...).to_pandas()
"""

from typing import Any

from dagster import (
    AssetObservation,
    DataVersion,
    MetadataValue,
    ObserveResult,
    TableColumn,
    TableRecord,
    TableSchema,
    observable_source_asset,
)

from laminar_orchestration.store import ObjectStore
from laminar_orchestration.table import TableStatus, open_table, table_location, table_status
from resources import LaminarResource

__all__ = ["stream_output", "stream_output_metadata", "stream_output_observation"]

#: The tag Dagster reads an observation's data version from.
_DATA_VERSION_TAG = "dagster/data_version"

_COLUMNS = [("partition", "int"), ("landed_seq", "int"), ("landed_offset", "int"), ("lag_batches", "int")]


def stream_output_metadata(status: TableStatus) -> dict[str, Any]:
    """What an observation of `stream_output` carries (also used by the maintenance job)."""
    rows = [vars(p) for p in status.partitions]
    schema = TableSchema(columns=[TableColumn(name, kind) for name, kind in _COLUMNS])
    return {
        "uri": status.uri,
        "table_version": status.version if status.version is not None else -1,
        "rows": status.rows,
        "lag_batches": status.lag_batches,
        "partitions": MetadataValue.table(records=[TableRecord(data=r) for r in rows], schema=schema),
    }


@observable_source_asset(
    name="stream_output",
    group_name="laminar",
    description="The committed output of every partition as a Delta Lake table, exactly once (Delta "
    "transaction identifiers per partition). Readable with deltalake, pandas, polars, DuckDB and Spark.",
)
def stream_output(laminar: LaminarResource) -> ObserveResult:
    """The table's version, rows, lag and each partition's last committed batch in it."""
    store = laminar.store()
    status = table_status(store, table_location(store))
    version = f"v{status.version}" if status.exists else "absent"
    return ObserveResult(data_version=DataVersion(version), metadata=stream_output_metadata(status))


def stream_output_observation(store: ObjectStore) -> AssetObservation | None:
    """`stream_output` as the table shows it now, as the observation sensor reports it (None: no
    table yet, nothing to observe). Its data version is the table version, as an "Observe" run's."""
    location = table_location(store)
    if open_table(location) is None:
        return None  # a look at the log alone: cheap while the nodes have not created the table
    status = table_status(store, location)
    return AssetObservation(
        asset_key=stream_output.key,
        metadata=stream_output_metadata(status),
        tags={_DATA_VERSION_TAG: f"v{status.version}"},
    )
