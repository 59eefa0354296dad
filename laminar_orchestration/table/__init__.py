"""The committed output as an open table: an exactly-once Delta Lake table beside the store.

What lives here: where the table is (`location`) and choosing it at `laminar
init` (`setup`), the committed batches the manifest chains name (`batches`), the
`TableCommitter` that appends them with Delta transaction identifiers
(`committer`) and follows each partition's transaction version in the log
(`txns`), the audit and lag figures of `laminar verify` and `laminar status`
(`audit`), and compaction, checkpoints and vacuum (`maintenance`). The table is written with `deltalake` (delta-rs)
directly to the filesystem or S3, never through our store interface.

Layer: beside `dataplane` and `control`. It may import the shared root
modules, `store` and `protocol`; never `dataplane`, `control`, `ops` or
`cli`. A node calls `TableCommitter.sync` from its own thread; the CLI, the
Dagster assets and `verify` call the functions below.
"""

from __future__ import annotations

from laminar_orchestration.table.audit import TableAudit, TableStatus, audit_table, table_status
from laminar_orchestration.table.batches import CommittedBatch, app_id
from laminar_orchestration.table.committer import SyncResult, TableCommitter
from laminar_orchestration.table.errors import (
    TableCommitFailed,
    TableError,
    TableLogCorrupt,
    TableMismatch,
    TableSchemaMismatch,
)
from laminar_orchestration.table.location import (
    InvalidTableUri,
    OutputTableRecord,
    OutputTableRecordCorrupt,
    TableLocation,
    check_table_uri,
    open_table,
    recorded_table,
    table_location,
)
from laminar_orchestration.table.maintenance import MaintenanceReport, compact_and_checkpoint
from laminar_orchestration.table.rebuild import rebuild_table
from laminar_orchestration.table.setup import TableLocationConflict, record_table_location

__all__ = [
    "CommittedBatch",
    "InvalidTableUri",
    "MaintenanceReport",
    "OutputTableRecord",
    "OutputTableRecordCorrupt",
    "SyncResult",
    "TableAudit",
    "TableCommitFailed",
    "TableCommitter",
    "TableError",
    "TableLocation",
    "TableLocationConflict",
    "TableLogCorrupt",
    "TableMismatch",
    "TableSchemaMismatch",
    "TableStatus",
    "app_id",
    "audit_table",
    "check_table_uri",
    "compact_and_checkpoint",
    "open_table",
    "rebuild_table",
    "record_table_location",
    "recorded_table",
    "table_location",
    "table_status",
]
