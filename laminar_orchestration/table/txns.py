"""The output table's log as the committer follows it: its version, schema and every partition's
transaction version, kept current by reading only the log entries it has not seen.

The table says how far it holds each partition in a Delta transaction identifier
(`batches.app_id`) whose version is the seq of the newest manifest entry it holds.
`TableLog` learns them once, from the checkpoint `_last_checkpoint` names and the
entries after it (a GET each, no listing), then follows the log forward: each sync
reads the entries added since it last looked (normally the other nodes' commits).
Its own commits need no read at all (`committed`).

It is exact, not a hint: the versions it gives are those of the version the next
commit is made on, and that commit is a create-only write of the next log entry,
so a commit made on anything older fails and is never rebased: the at-most-once
argument of `committer` rests on this. The create-only write is also what finds
the log's end: a look reads as many new entries as other committers added between
the committer's last two commits (their pace) and does not probe the name after
them; if that name is taken after all, the commit fails and the next look reads
to the first absent name (`raced`).

A table replaced under a running committer (`laminar table rebuild`, or its log
lost) could have the next name free too, so before a commit on a remembered view
a look needs proof that the log is still the one it followed: an entry it read
that names the table id it knows (every commit of ours does, in `commitInfo`), or
else one HEAD of its anchor, log entry 0 (`_last_checkpoint` when the log starts
at a checkpoint); if that is not the one seen before, the log is read afresh. A
rebuilt table is published as a checkpoint above every version the old log
reached, whose log entry names a new table id and every transaction version: a
follower meeting that entry takes the table's state from it alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import Schema

from laminar_orchestration.table.errors import TableLogCorrupt, TableMismatch
from laminar_orchestration.table.objects import TableObjects

_APP = re.compile(r"^laminar/partition-(\d+)$")
#: The `commitInfo` field naming the table id a commit was made on (what vouches for a log entry).
TABLE_ID_FIELD = "laminar.table"
LAST_CHECKPOINT = "_delta_log/_last_checkpoint"
#: Writer features a plain append honours without doing anything (the table's own are none).
_HARMLESS_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "timestampNtz"})


def entry_name(version: int) -> str:
    """The object name of log entry `version`."""
    return f"_delta_log/{version:020d}.json"


def log_entry_txns(raw: bytes) -> dict[int, int]:
    """The partitions' transaction versions one Delta log entry (a commit's JSON lines) sets."""
    found: dict[int, int] = {}
    for line in raw.splitlines():
        if b'"txn"' not in line:
            continue
        txn = json.loads(line).get("txn")
        if isinstance(txn, dict):
            _take_txn(txn, found)
    return found


def _take_txn(txn: dict[str, Any], into: dict[int, int]) -> None:
    match = _APP.match(str(txn.get("appId", "")))
    if match:
        into[int(match.group(1))] = int(txn["version"])


@dataclass
class LogState:
    """The table at one version, as far as a commit on top of it needs to know."""

    version: int
    table_id: str = ""
    name: str = ""
    schema_json: str = ""
    configuration: dict[str, str] = field(default_factory=dict)
    #: partition -> the seq of its newest manifest entry in the table (absent: none).
    txns: dict[int, int] = field(default_factory=dict)

    def delta_schema(self) -> Schema:
        return Schema.from_json(self.schema_json)

    def arrow_schema(self) -> pa.Schema:
        return pa.schema(self.delta_schema().to_arrow())

    def setting(self, key: str, default: int) -> int:
        try:
            return int(self.configuration.get(key, default))
        except ValueError:
            return default

    def apply_metadata(self, meta: dict[str, Any]) -> None:
        self.table_id = str(meta.get("id") or "")
        self.name = str(meta.get("name") or "")
        self.schema_json = str(meta.get("schemaString") or "")
        config = meta.get("configuration") or {}
        self.configuration = {str(k): str(v) for k, v in (config.items() if isinstance(config, dict) else config)}


def _check_protocol(uri: str, protocol: dict[str, Any]) -> None:
    """TableMismatch if a commit of ours would not honour the table's protocol (its writer features)."""
    features = set(protocol.get("writerFeatures") or ()) - _HARMLESS_WRITER_FEATURES
    if int(protocol.get("minWriterVersion") or 0) > 7 or features:
        raise TableMismatch(uri, f"its Delta protocol asks writers for {sorted(features) or protocol}")


class TableLog:
    """Follows one table's log forward. Not thread-safe: its committer calls it under its own lock."""

    def __init__(self, objects: TableObjects) -> None:
        self.objects = objects
        self.uri = objects.location.uri
        self.state: LogState | None = None
        #: The object telling this table from a replacement (log entry 0, else `_last_checkpoint`) and
        #: its identity when the state was read.
        self._anchor: tuple[str, str | None] = (entry_name(0), None)
        #: Log entries read after the first look (the other committers' commits).
        self.entries_read = 0
        #: Entries other committers added between our last two commits: how many a look reads
        #: before it lets the create-only commit find the end.
        self.expected = 0
        #: The version of our last commit on this state (None: none since it was read).
        self._own: int | None = None
        #: The next look reads to the first absent name (after a lost race or an unknown outcome).
        self._to_end = False
        #: Whether the last look read to the first absent name (else the end is a guess).
        self.end_seen = True

    def reset(self) -> None:
        self.state, self._anchor = None, (entry_name(0), None)
        self._own, self.expected, self._to_end, self.end_seen = None, 0, False, True

    def follow(self) -> LogState | None:
        """The table at its newest version, or at a version whose next name is only presumed free
        (`end_seen` False: the commit's create-only write tells). None: no log entry 0 and no
        checkpoint, so no table.

        TableLogCorrupt for an unreadable entry or checkpoint; TableStoreFault for a failed request.
        """
        if self.state is not None:
            limit = None if self._to_end else self.expected
            self._to_end = False
            self.end_seen, vouched = self._forward(self.state, counted=True, limit=limit)
            if vouched:
                return self.state
            name, identity = self._anchor
            if vouched is None and self.objects.identity(name) == identity:
                return self.state
            self.reset()  # rebuilt, lost, cleaned up or replaced under this committer: read afresh
        return self._load()

    def raced(self) -> None:
        """Our commit on the state found its name taken, or its outcome is unknown: the next look
        reads every entry up to the first absent name."""
        self._to_end = True

    def committed(self, version: int, txns: dict[int, int]) -> None:
        """Our own commit landed as `version` (the one after the state it was made on) with `txns`."""
        if self.state is None or version != self.state.version + 1:
            self.reset()
            return
        if self._own is not None:
            self.expected = max(0, version - 1 - self._own)
        self._own = version
        self.state.version = version
        self.state.txns.update(txns)

    # -- reading -------------------------------------------------------------------------------

    def _load(self) -> LogState | None:
        first = self.objects.identity(entry_name(0))
        # A log cleaned up behind a checkpoint (or a rebuilt one) has no entry 0: its pointer tells a replacement.
        if first is not None:
            self._anchor = (entry_name(0), first)
        else:
            self._anchor = (LAST_CHECKPOINT, self.objects.identity(LAST_CHECKPOINT))
        state = self._from_checkpoint()
        if state is None:
            raw = self.objects.get(entry_name(0))
            if raw is None:
                return None
            state = LogState(version=0)
            self._apply(state, 0, raw)
        self._forward(state, counted=False)
        self.state = state
        return state

    def _from_checkpoint(self) -> LogState | None:
        """The state at the checkpoint `_last_checkpoint` names (None: none, so read from entry 0)."""
        raw = self.objects.get(LAST_CHECKPOINT)
        if raw is None:
            return None
        try:
            pointer = json.loads(raw)
            version, parts = int(pointer["version"]), int(pointer.get("parts") or 0)
        except (ValueError, KeyError, TypeError) as exc:
            raise TableLogCorrupt(self.uri, f"_last_checkpoint is unreadable: {exc}") from exc
        names = (
            [f"_delta_log/{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)]
            if parts
            else [f"_delta_log/{version:020d}.checkpoint.parquet"]
        )
        state = LogState(version=version)
        for name in names:
            data = self.objects.get(name)
            if data is None:
                return None  # a checkpoint named but gone: the log from entry 0 is the truth
            try:
                file = pq.ParquetFile(pa.BufferReader(data))
                wanted = [c for c in ("protocol", "metaData", "txn") if c in file.schema_arrow.names]
                actions = file.read(columns=wanted).to_pydict()
            except (pa.ArrowException, OSError) as exc:
                raise TableLogCorrupt(self.uri, f"checkpoint {name} is unreadable: {exc}") from exc
            for protocol in actions.get("protocol", []):
                if protocol:
                    _check_protocol(self.uri, protocol)
            for meta in actions.get("metaData", []):
                if meta:
                    state.apply_metadata(meta)
            for txn in actions.get("txn", []):
                if txn:
                    _take_txn(txn, state.txns)
        return state

    def _forward(self, state: LogState, *, counted: bool, limit: int | None = None) -> tuple[bool, bool | None]:
        """Read the entries after `state.version` until the first absent one, or `limit` of them.

        Returns whether the absent one was seen, and what the entries read say of the table: True if
        one vouches for it and none names another, False if one names another, None if none says.
        """
        says: set[bool] = set()
        read = 0
        while limit is None or read < limit:
            raw = self.objects.get(entry_name(state.version + 1))
            if raw is None:
                return True, min(says, default=None)
            vouch = self._apply(state, state.version + 1, raw)
            if vouch is not None:
                says.add(vouch)
            state.version += 1
            read += 1
            self.entries_read += counted
        return False, min(says, default=None)

    def _apply(self, state: LogState, version: int, raw: bytes) -> bool | None:
        """Take one entry's actions into `state`. True if the entry vouches for the table: it names
        the table id the state has, or publishes a table (a rebuilt one) replacing it; False if it
        names another table id; None if it says nothing (a writer other than ours)."""
        made_on = None
        replaced = False
        try:
            for line in raw.splitlines():
                if not line.strip():
                    continue
                action = json.loads(line)
                if "txn" in action:
                    _take_txn(action["txn"], state.txns)
                elif "metaData" in action:
                    meta = action["metaData"]
                    if state.table_id and str(meta.get("id") or "") != state.table_id:
                        # A rebuilt table published over this one: its entry lists every transaction version.
                        state.txns.clear()
                        replaced = True
                    state.apply_metadata(meta)
                elif "protocol" in action:
                    _check_protocol(self.uri, action["protocol"])
                elif "commitInfo" in action:
                    made_on = action["commitInfo"].get(TABLE_ID_FIELD)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TableLogCorrupt(self.uri, f"log entry {version} is unreadable: {exc}") from exc
        if replaced:
            return True
        return None if made_on is None else bool(state.table_id) and made_on == state.table_id
