"""One Delta commit of the output table as the `TableCommitter` writes it: its data file, its log
entry, and a checkpoint every interval.

A commit is the committer's own, not delta-rs's (whose commit lists the log and
reads its entry back): one create-only PUT of the batches' Parquet file and one
of the log entry, after a GET of each entry other committers added since its
last look (`txns.TableLog`: no listing, no probe of the next name while the
other committers keep their pace, and a HEAD of log entry 0 only when no entry
read names the table's id). Every
`delta.checkpointInterval` (100) versions, the committer of that version has
delta-rs write a checkpoint, so readers and a restarted committer replay a short
log. What it writes is plain Delta (protocol 1/2: `add` with statistics, `txn`,
`commitInfo` naming the batches and transaction versions), which `deltalake`,
polars, DuckDB and Spark read.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from laminar_orchestration.protocol.keys import table_node_folder
from laminar_orchestration.table.batches import LINEAGE_SCHEMA, CommittedBatch, app_id
from laminar_orchestration.table.errors import TableStoreFault
from laminar_orchestration.table.location import TableLocation
from laminar_orchestration.table.objects import TableObjects
from laminar_orchestration.table.txns import TABLE_ID_FIELD, LogState

__all__ = ["CHECKPOINT_INTERVAL", "CLIENT_VERSION", "add_action", "checkpoint", "log_entry", "write_data_file"]

log = logging.getLogger(__name__)

#: Versions between two checkpoints unless the table's `delta.checkpointInterval` says otherwise.
CHECKPOINT_INTERVAL = 100
#: Written into each commit's `commitInfo` (what `DeltaTable.history()` shows).
CLIENT_VERSION = "laminar-orchestration"


def _stats(data: pa.Table) -> str:
    """A data file's Delta statistics: its rows, and the lineage columns' bounds (readers skip files by them)."""
    low: dict[str, int] = {}
    high: dict[str, int] = {}
    for f in LINEAGE_SCHEMA:
        if pa.types.is_integer(f.type) and f.name in data.column_names:
            bounds = pc.min_max(data[f.name])
            low[f.name], high[f.name] = bounds["min"].as_py(), bounds["max"].as_py()
    nulls = {name: 0 for name in low}
    return json.dumps(
        {"numRecords": data.num_rows, "minValues": low, "maxValues": high, "nullCount": nulls},
        separators=(",", ":"),
    )


def write_data_file(objects: TableObjects, data: pa.Table, node: int | None) -> tuple[str, int]:
    """Write `data` as a fresh Parquet data file (under `node`'s folder, if given): its name and size."""
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, compression="snappy")
    raw = sink.getvalue().to_pybytes()
    folder = table_node_folder(node) if node is not None else ""
    name = f"{folder}part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    if not objects.create(name, raw):
        raise TableStoreFault(objects.location.uri, name, "a fresh data file's name was taken")
    return name, len(raw)


def add_action(name: str, size: int, data: pa.Table, at_ms: int) -> dict[str, Any]:
    """The `add` action of the data file `name` (`size` bytes) holding `data`."""
    return {
        "path": name,
        "partitionValues": {},
        "size": size,
        "modificationTime": at_ms,
        "dataChange": True,
        "stats": _stats(data),
    }


def log_entry(
    state: LogState,
    txns: dict[int, int],
    batches: Sequence[CommittedBatch],
    at_ms: int,
    add: dict[str, Any] | None,
) -> bytes:
    """The log entry of a commit on top of `state`: its `commitInfo`, a transaction identifier per
    partition (version: its newest seq) and the `add` of its data file, if any."""
    summary = {str(p): [b.seq for b in batches if b.partition == p] for p in sorted(txns)}
    versions = {app_id(p): seq for p, seq in sorted(txns.items())}
    actions: list[dict[str, Any]] = [
        {
            "commitInfo": {
                "timestamp": at_ms,
                "operation": "WRITE",
                "operationParameters": {"mode": "Append"},
                "clientVersion": CLIENT_VERSION,
                "readVersion": state.version,
                "laminar.batches": json.dumps(summary, separators=(",", ":")),
                "laminar.transactions": json.dumps(versions, separators=(",", ":")),
                # Vouches for the table to the other committers reading this entry (`txns.TableLog`).
                TABLE_ID_FIELD: state.table_id,
            }
        }
    ]
    actions += [{"txn": {"appId": a, "version": v, "lastUpdated": at_ms}} for a, v in versions.items()]
    if add is not None:
        actions.append({"add": add})
    return "\n".join(json.dumps(a, separators=(",", ":")) for a in actions).encode()


def checkpoint(location: TableLocation, state: LogState, version: int) -> None:
    """Every `delta.checkpointInterval` versions, a checkpoint at `version` (by delta-rs, which
    replays the log since the last one): readers and a new committer start there."""
    interval = state.setting("delta.checkpointInterval", CHECKPOINT_INTERVAL)
    if interval <= 0 or version % interval:
        return
    try:
        DeltaTable(location.uri, version=version, storage_options=location.options()).create_checkpoint()
    except (DeltaError, OSError, ValueError) as exc:  # an optimisation: the log stays complete without it
        log.warning("output table %s: no checkpoint at version %d: %s", location.uri, version, exc)
