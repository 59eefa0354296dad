"""Choosing where the output table lives, at ``laminar init --output-table URI``.

The choice is recorded in the store (`location.OutputTableRecord`), so every
node and command finds the same table without being told. It is checked before
anything is written: a place `location.check_table_uri` refuses, or one that
already holds another Delta table (another cluster's, or anything that is not
this cluster's output table), is an error naming what is wrong. A recorded
location is moved only on purpose (``--force``); the table at the old place is
left as it is, and the new one is built from the manifest chains by the nodes'
next syncs (or ``laminar table sync``).
"""

from __future__ import annotations

from laminar_orchestration.errors import ConflictError
from laminar_orchestration.protocol.keys import OUTPUT_TABLE_KEY
from laminar_orchestration.protocol.records import now
from laminar_orchestration.store import ObjectStore, PreconditionFailed
from laminar_orchestration.table.errors import TableError, TableLogCorrupt
from laminar_orchestration.table.location import (
    InvalidTableUri,
    OutputTableRecord,
    OutputTableRecordCorrupt,
    TableLocation,
    check_identity,
    check_table_uri,
    open_table,
    parse_table_record,
)


class TableLocationConflict(TableError, ConflictError):
    """The store already records another location for its output table."""

    store_url: str
    recorded: str
    requested: str

    message = (
        "{store_url} already records its output table at {recorded!r}; pass --force to move it to "
        "{requested!r} (the table at the old place is left as it is)"
    )


def record_table_location(
    store: ObjectStore, uri: str, *, cluster_id: str | None = None, replace: bool = False
) -> TableLocation:
    """Check `uri` as the output table of `store` (`cluster_id`: the cluster's, if it exists) and record it.

    InvalidTableUri for a place the table may not be or one holding another table;
    TableLocationConflict if another location is recorded and not `replace`.
    """
    location = check_table_uri(store, uri)
    try:
        existing = open_table(location)
    except TableLogCorrupt:
        raise InvalidTableUri(uri, "it holds files but no readable Delta table: choose an empty place") from None
    if existing is not None:
        if cluster_id is None:
            name = existing.metadata().name or "unnamed"
            raise InvalidTableUri(uri, f"it already holds a Delta table ({name!r}), not this cluster's")
        check_identity(existing, location, cluster_id)
    data = OutputTableRecord(uri=location.uri, recorded_at=now()).model_dump_json().encode()
    current = store.get_or_none(OUTPUT_TABLE_KEY)
    while current is None:
        try:
            store.put_if_absent(OUTPUT_TABLE_KEY, data)
            return location
        except PreconditionFailed:
            current = store.get_or_none(OUTPUT_TABLE_KEY)  # a concurrent init recorded one first
    try:
        recorded: str | None = parse_table_record(current.data).uri
    except OutputTableRecordCorrupt:
        if not replace:
            raise
        recorded = None  # replaced below: `--force` repairs it
    if recorded == location.uri:
        return location
    if not replace:
        raise TableLocationConflict(store.url, str(recorded), location.uri)
    # A concurrent change of the record moves its ETag: PreconditionFailed (a conflict) propagates.
    store.put_if_match(OUTPUT_TABLE_KEY, data, current.etag)
    return location
