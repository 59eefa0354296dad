"""Rebuilding the output table from the manifest chains (`laminar table rebuild`), under live syncs.

The nodes keep syncing while a rebuild runs, and a node's commit may be in flight across it: its
view of the table read, its data file and log entry written afterwards. Whatever the timing, such
a commit must never become part of the rebuilt table. So the rebuild never empties the place and
starts again at version 0 (where a late commit of version N+1 would land in the new log); it:

1. builds the table in a scratch folder no committer knows (``_rebuild-<id>/`` inside the
   table's, which readers skip), by an ordinary sync of every partition, and checkpoints it;
2. publishes it above every version the old log reached: with N the newest version there,
   the checkpoint as version N+2 and its log entry (create-only: a live commit that took the
   version moves the rebuild above it), holding the new table id and every partition's
   transaction version, then `_last_checkpoint` pointing at it;
3. removes the old log, log entry 0 first.

A late commit was made on a version at most N, so it lands at N+1 at most: below the checkpoint,
where no reader looks (readers start at the newest checkpoint). Its committer learns of the rebuild
at its next sync (log entry 0 or `_last_checkpoint` changed, or it reads the published entry's new
table id) and starts over from the rebuilt table: `txns.TableLog`. Old data files are left for
`laminar table maintain` to vacuum (a committer retrying a commit may still name its own).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import PurePosixPath

from deltalake import DeltaTable

from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import ObjectStore
from laminar_orchestration.table.committer import SyncResult, TableCommitter
from laminar_orchestration.table.delta_commit import CLIENT_VERSION
from laminar_orchestration.table.errors import TableCommitFailed, TableLogCorrupt
from laminar_orchestration.table.location import (
    TableLocation,
    check_identity,
    open_table,
    remove_table,
    table_location,
)
from laminar_orchestration.table.objects import TableObjects
from laminar_orchestration.table.txns import LAST_CHECKPOINT, TableLog, entry_name

__all__ = ["rebuild_table"]

#: Attempts at publishing above the live commits before giving up (each loses only to a new commit).
PUBLISH_ATTEMPTS = 8
_VERSIONED = re.compile(r"^_delta_log/(\d{20})\.")


def rebuild_table(
    store: ObjectStore, location: TableLocation | None = None, *, force: bool = False
) -> tuple[int, SyncResult]:
    """Recreate the output table from the manifest chains, safe while nodes sync.

    For a deleted or corrupted log. A readable table of another cluster is kept unless `force`
    (TableMismatch). Returns the old log objects removed and the rebuilding sync's result (its
    version: the published one).
    """
    location = location or table_location(store)
    ledger = Ledger(store)
    if not force:
        try:
            existing = open_table(location)
        except TableLogCorrupt:
            existing = None
        if existing is not None:
            check_identity(existing, location, ledger.cluster().cluster_id)
    scratch = _scratch_location(location)
    try:
        result = TableCommitter(store, scratch).sync(ledger.partitions())
        result.uri = location.uri
        if result.version is None:
            return remove_table(location), result  # no output committed yet: no table to publish
        DeltaTable(scratch.uri, storage_options=scratch.options()).create_checkpoint()
        result.version, removed = _publish(TableObjects(scratch), TableObjects(location), result.version)
    finally:
        remove_table(scratch)
    return removed, result


def _scratch_location(location: TableLocation) -> TableLocation:
    """A fresh folder inside the table's, where the table's access rules already reach; its
    ``_`` prefix is what Delta readers and vacuum skip."""
    return TableLocation(f"{location.uri.rstrip('/')}/_rebuild-{uuid.uuid4().hex[:12]}", location.storage_options)


def _checkpoint_name(version: int) -> str:
    return f"_delta_log/{version:020d}.checkpoint.parquet"


def _newest_version(objects: TableObjects) -> int:
    """The newest version any log object names (-1: none)."""
    versions = [int(m.group(1)) for n in objects.names("_delta_log/") if (m := _VERSIONED.match(n))]
    return max(versions, default=-1)


def _published_entry(scratch: TableObjects, version: int) -> bytes:
    """The log entry of the published version: the scratch table's protocol and metadata (its new id)
    and every partition's transaction version, so a follower takes the table's state from it alone."""
    first = scratch.get(entry_name(0))
    state = TableLog(scratch).follow()
    if first is None or state is None or state.version != version:
        raise TableLogCorrupt(scratch.location.uri, "the rebuilt table changed while it was published")
    at_ms = int(time.time() * 1000)
    lines: list[dict[str, object]] = [
        {"commitInfo": {"timestamp": at_ms, "operation": "REPLACE TABLE", "clientVersion": CLIENT_VERSION}}
    ]
    for raw in first.splitlines():
        action = json.loads(raw) if raw.strip() else {}
        if "protocol" in action or "metaData" in action:
            lines.append(action)
    lines += [
        {"txn": {"appId": f"laminar/partition-{p}", "version": seq, "lastUpdated": at_ms}}
        for p, seq in sorted(state.txns.items())
    ]
    return "\n".join(json.dumps(a, separators=(",", ":")) for a in lines).encode()


def _publish(scratch: TableObjects, target: TableObjects, version: int) -> tuple[int, int]:
    """Copy the scratch table at `version` above every version of `target`; (published version, old
    log objects removed)."""
    for name in scratch.names():
        if not name.startswith("_delta_log/"):
            data = scratch.get(name)
            if data is not None:
                target.create(name, data)  # fresh unique names: nothing of the old table is replaced
    checkpoint = scratch.get(_checkpoint_name(version))
    pointer = scratch.get(LAST_CHECKPOINT)
    if checkpoint is None or pointer is None:
        raise TableLogCorrupt(scratch.location.uri, f"no checkpoint at version {version}")
    entry = _published_entry(scratch, version)
    for _ in range(PUBLISH_ATTEMPTS):
        # A commit in flight was made on a version at most `newest`: it lands below the checkpoint.
        published = _newest_version(target) + 2
        if not target.create(_checkpoint_name(published), checkpoint):
            continue
        if target.create(entry_name(published), entry):
            break
        target.delete(_checkpoint_name(published))  # a live commit took the version: publish above it
    else:
        raise TableCommitFailed(target.location.uri, PUBLISH_ATTEMPTS, "live commits kept taking the version")
    target.put(LAST_CHECKPOINT, json.dumps({**json.loads(pointer), "version": published}).encode())
    # Entry 0 first: its removal is what tells a committer still on the old log to read afresh.
    old = [n for n in target.names("_delta_log/") if _old_log_object(n, published)]
    old.sort(key=lambda n: n != entry_name(0))
    for name in old:
        target.delete(name)
    return published, len(old)


def _old_log_object(name: str, published: int) -> bool:
    """A log object of a version below the published one (entries, checkpoints, staged commits)."""
    match = _VERSIONED.match(name)
    if match is not None:
        return int(match.group(1)) < published
    return PurePosixPath(name).name.startswith("_commit_")
