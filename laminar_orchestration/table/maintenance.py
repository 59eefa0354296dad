"""Keeping the output table cheap to read: compact small files, checkpoint the log, vacuum.

A node commits once per commit interval, so the table gathers many small data
files and log entries. `compact_and_checkpoint` (the `table_maintenance`
Dagster job and ``laminar table maintain``) rewrites small files into larger
ones (a data-neutral commit: readers and the transaction versions are
unaffected), writes a log checkpoint so readers replay no long log, removes
log entries past the log retention, and vacuums files no version within the
retention references. Compaction may
race a node's append; delta-rs rebases a compaction over appends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deltalake import DeltaTable

from laminar_orchestration.errors import NotFoundError
from laminar_orchestration.table.location import TableLocation, open_table

#: Files younger than this are never vacuumed: a reader of an older version still needs them.
DEFAULT_RETENTION_HOURS = 168


class NoTable(NotFoundError):
    """There is no output table to maintain yet."""

    uri: str

    message = "no output table at {uri!r} yet (`laminar table sync` creates it)"


@dataclass(frozen=True)
class MaintenanceReport:
    uri: str
    version_before: int
    version_after: int
    files_removed: int
    files_added: int
    vacuumed: int

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    def summary_lines(self) -> list[str]:
        return [
            f"output table {self.uri}: version {self.version_before} -> {self.version_after}, compacted "
            f"{self.files_removed} files into {self.files_added}, vacuumed {self.vacuumed}"
        ]


def compact_and_checkpoint(
    location: TableLocation,
    *,
    retention_hours: int = DEFAULT_RETENTION_HOURS,
    target_size: int | None = None,
) -> MaintenanceReport:
    """Compact small files, checkpoint the log at the new version, vacuum beyond `retention_hours`."""
    table: DeltaTable | None = open_table(location)
    if table is None:
        raise NoTable(location.uri)
    before = table.version()
    metrics = table.optimize.compact(target_size=target_size)
    table.update_incremental()
    table.create_checkpoint()
    # Log entries older than `delta.logRetentionDuration` (30 days) behind the checkpoint: the nodes'
    # commits leave them (their cleanup would list the whole log on every commit).
    table.cleanup_metadata()
    vacuumed = table.vacuum(
        retention_hours=retention_hours,
        dry_run=False,
        enforce_retention_duration=retention_hours >= DEFAULT_RETENTION_HOURS,
    )
    table.update_incremental()
    return MaintenanceReport(
        location.uri,
        before,
        table.version(),
        int(metrics.get("numFilesRemoved", 0)),
        int(metrics.get("numFilesAdded", 0)),
        len(vacuumed),
    )
