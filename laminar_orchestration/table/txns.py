"""Each partition's transaction version in the output table, kept current by reading only new log entries.

The table says how far it holds each partition in a Delta transaction identifier
(`batches.app_id`) whose version is the seq of the newest manifest entry it holds.
delta-rs answers `DeltaTable.transaction_version` by replaying the log from its
last checkpoint, one GET per log entry, on every call: per partition per sync,
that was most of the table's requests. `LandedSeqs` asks delta-rs once per
partition, then follows the log itself: every sync reads the entries added since
it last looked (one GET each: normally the other nodes' commits), and a commit of
its own needs no read at all.

It is exact, not a hint: the versions it gives are those of the table version the
next commit is made on (`refresh`), and a commit is never rebased, so the
at-most-once argument of `committer` is unchanged. A log entry that is gone
(cleaned up after a long pause) makes it start over from delta-rs. A table
replaced under a running committer (`laminar table rebuild`, or its log lost) is
one a delta-rs handle cannot see: it updates incrementally from its own version
on, keeping the old table's id and state. So each refresh also looks at log
entry 0 (one HEAD): if it is not the one seen before, the caller reopens the
table instead of committing through a handle of another table.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from laminar_orchestration.table.batches import app_id
from laminar_orchestration.table.location import TableLocation

log = logging.getLogger(__name__)

_APP = re.compile(r"^laminar/partition-(\d+)$")


def log_entry_txns(raw: bytes) -> dict[int, int]:
    """The partitions' transaction versions one Delta log entry (a commit's JSON lines) sets."""
    found: dict[int, int] = {}
    for line in raw.splitlines():
        if b'"txn"' not in line:
            continue
        txn = json.loads(line).get("txn")
        if not isinstance(txn, dict):
            continue
        match = _APP.match(str(txn.get("appId", "")))
        if match:
            found[int(match.group(1))] = int(txn["version"])
    return found


class LandedSeqs:
    """Per partition, the seq of the newest manifest entry the output table holds, at one table version.

    Not thread-safe: its committer calls it under its own lock.
    """

    def __init__(self, location: TableLocation) -> None:
        self.location = location
        self._table_id: str | None = None
        #: The table version `_seqs` is exact at (None: nothing known).
        self._version: int | None = None
        #: partition -> landed seq (0: none), for the partitions asked about since the last reset.
        self._seqs: dict[int, int] = {}
        self._s3: Any = None
        #: Log entry 0 as stored when first seen (ETag, or inode, size and mtime; None: absent).
        self._anchor: str | None = None
        #: Log entries read by this tracker (the figure the benchmark reports).
        self.entries_read = 0

    def reset(self) -> None:
        self._table_id, self._version, self._seqs = None, None, {}

    def refresh(self, table: DeltaTable | None) -> bool:
        """Catch up with `table` at its current version: read the log entries added since the last call.

        False when the location no longer holds the table the tracker followed (replaced, or its log
        gone): `table` is a stale handle, the caller reopens it and refreshes again.
        """
        if table is None:
            self.reset()
            self._anchor = None
            return True
        anchor = self._identity(0)
        if self._anchor is not None and anchor != self._anchor:
            self.reset()
            self._anchor = None
            return False
        self._anchor = anchor
        version, table_id = table.version(), str(table.metadata().id)
        if self._version is None or table_id != self._table_id or version < self._version:
            self.reset()
        else:
            for v in range(self._version + 1, version + 1):
                raw = self._read_entry(v)
                try:
                    txns = log_entry_txns(raw) if raw is not None else None
                except (ValueError, KeyError, TypeError):
                    txns = None
                if txns is None:  # gone (cleaned up after a long pause) or unreadable: ask delta-rs again
                    self.reset()
                    break
                for partition, seq in txns.items():
                    if partition in self._seqs:
                        self._seqs[partition] = seq
        self._table_id, self._version = table_id, version
        return True

    def seq(self, table: DeltaTable | None, partition: int) -> int:
        """The landed seq of `partition` at the version of the last `refresh` (`table` must be at it)."""
        if table is None:
            return 0
        if partition not in self._seqs:
            # Once per partition: delta-rs replays the log from its last checkpoint.
            self._seqs[partition] = table.transaction_version(app_id(partition)) or 0
        return self._seqs[partition]

    def committed(self, version: int, txns: Mapping[int, int]) -> None:
        """Our own commit landed as `version` (the one after the snapshot it was made on) with `txns`."""
        if self._version is None or version != self._version + 1:
            self.reset()
            return
        self._version = version
        for partition, seq in txns.items():
            self._seqs[partition] = seq

    # -- reading one log entry ---------------------------------------------------------------

    def _read_entry(self, version: int) -> bytes | None:
        """Log entry `version` as stored; None if it is gone or cannot be read (the caller starts over)."""
        self.entries_read += 1
        name = f"_delta_log/{version:020d}.json"
        try:
            if self.location.is_local:
                return (Path(self.location.uri) / name).read_bytes()
            bucket, key = self._s3_key(name)
            body = self._client().get_object(Bucket=bucket, Key=key)["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()
        except Exception as exc:  # any failure: delta-rs's own replay is the exact fallback
            log.info("output table %s: log entry %d unread (%s): replaying the log", self.location.uri, version, exc)
            return None

    def _identity(self, version: int) -> str | None:
        """Log entry `version` as stored, in one HEAD (a stat locally); None if absent."""
        name = f"_delta_log/{version:020d}.json"
        if self.location.is_local:
            try:
                st = (Path(self.location.uri) / name).stat()
            except FileNotFoundError:
                return None
            return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
        bucket, key = self._s3_key(name)
        client = self._client()
        try:
            head = client.head_object(Bucket=bucket, Key=key)
        except client.exceptions.ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return f"{head.get('ETag')}:{head.get('ContentLength')}"

    def _s3_key(self, name: str) -> tuple[str, str]:
        rest = self.location.uri.split("://", 1)[1]
        bucket, _, prefix = rest.partition("/")
        return bucket, f"{prefix.strip('/')}/{name}" if prefix.strip("/") else name

    def _client(self) -> Any:
        if self._s3 is None:
            from laminar_orchestration.store.s3 import make_s3_client

            self._s3 = make_s3_client(self.location.storage_options.get("AWS_ENDPOINT_URL"))
        return self._s3
