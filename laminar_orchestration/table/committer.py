"""The `TableCommitter`: appends committed batches to the Delta table, each exactly once.

Exactly once, by construction:

* **after the fence** - the committer reads only entries on the manifest
  chain (`batches.ChainFollower`), so a batch reaches the table only after
  its fenced manifest commit, and output no committed entry names (a
  zombie's orphan files, a superseded writer's void entry) never does;
* **at most once** - every Delta commit carries one transaction identifier
  per partition it appends for (`batches.app_id`), whose version is the seq
  of the newest manifest entry it holds. Before each commit the committer
  reads those versions from the table snapshot it commits on, and appends
  only entries above them. Two committers racing for the same partition
  both commit on top of the same log version, and the Delta log entry of
  that version is a create-only object: one lands, the other fails
  (`CommitFailedError`; commits are never rebased, whatever they hold).
  The loser re-reads the table and skips what landed; a commit whose
  response was lost is found the same way.

One call of `TableCommitter.sync` makes one Delta commit for all the
partitions it is given (more only for a catch-up longer than
`max_batches_per_commit`). A node calls it from its own thread once per
commit interval, off the batch's critical path.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Schema, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, DeltaProtocolError, TableNotFoundError
from deltalake.transaction import PostCommitHookProperties

from laminar_orchestration.errors import (
    CorruptDataError,
    InvalidInputError,
    LaminarError,
    UnavailableError,
)
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import ForwardingStore, ObjectMeta, ObjectNotFound, ObjectStore, StoredObject
from laminar_orchestration.table.batches import (
    LINEAGE_SCHEMA,
    ChainFollower,
    CommittedBatch,
    app_id,
    batch_rows,
    read_output,
)
from laminar_orchestration.table.location import TableLocation, table_location
from laminar_orchestration.table.txns import LandedSeqs

log = logging.getLogger(__name__)

#: The table's name (Delta metadata) is this plus the cluster id: a table of another cluster is refused.
TABLE_NAME_PREFIX = "laminar_output/"


# --- errors -----------------------------------------------------------------------------------


class TableError(LaminarError):
    """Base of the output table's errors (each subclass declares its kind)."""


class TableMismatch(TableError, InvalidInputError):
    """The table location holds something that is not this cluster's output table."""

    uri: str
    reason: str

    message = "output table {uri!r} is not this cluster's output table: {reason}"


class TableSchemaMismatch(TableError, InvalidInputError):
    """A committed batch's output columns differ from the table's schema (fixed at its first commit)."""

    uri: str
    partition: int
    seq: int
    expected: str
    actual: str

    message = (
        "output of partition {partition} (manifest seq {seq}) does not fit the schema of table {uri!r}: "
        "table has [{expected}], batch has [{actual}]; nothing was written"
    )


class TableLogCorrupt(TableError, CorruptDataError):
    """The table's Delta log is missing or unreadable; `rebuild_table` recreates it from the manifests."""

    uri: str
    reason: str

    message = "the Delta log of output table {uri!r} is unusable ({reason}); run `laminar table rebuild`"


class TableCommitFailed(TableError, UnavailableError):
    """A table commit kept failing (store errors or concurrent commits); nothing was appended twice."""

    uri: str
    attempts: int
    reason: str

    message = "could not commit to output table {uri!r} after {attempts} attempts: {reason}"


# --- reading the table -------------------------------------------------------------------------


def _schema_text(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


#: How long files without a log may be a creation in progress before they count as a table whose
#: log was lost. The committer writes log entry 0 before any data file, so only a table made by
#: another writer (data files first, then the log) is ever seen this way.
CREATION_GRACE_S = 1.0
#: Batches remembered but not synced yet, at most (beyond, they are read back from the store).
KNOWN_MAX = 10_000


def open_table(location: TableLocation) -> DeltaTable | None:
    """The table at `location` (None: nothing there yet). TableLogCorrupt for a missing or broken log."""
    deadline = time.monotonic() + CREATION_GRACE_S
    while True:
        try:
            return DeltaTable(location.uri, storage_options=location.options())
        except TableNotFoundError as exc:
            if not _holds_files(location):
                return None
            if time.monotonic() >= deadline:
                raise TableLogCorrupt(location.uri, "data files but no readable _delta_log") from exc
            time.sleep(0.1)
        except (DeltaError, DeltaProtocolError, OSError, ValueError) as exc:
            raise TableLogCorrupt(location.uri, " ".join(str(exc).split())[:300]) from exc


def _is_pending_commit(relative: str) -> bool:
    """A commit being written (delta-rs stages one as ``_delta_log/_commit_<id>.json.tmp``)."""
    return relative.startswith("_delta_log/_commit_") or relative.endswith(".tmp")


def _holds_files(location: TableLocation) -> bool:
    """Whether anything but a commit being written is at `location`."""
    if location.is_local:
        root = Path(location.uri)
        return root.is_dir() and any(
            not _is_pending_commit(p.relative_to(root).as_posix()) for p in root.rglob("*") if p.is_file()
        )
    bucket, prefix = _bucket_prefix(location)
    pages = _s3_client(location).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return any(not _is_pending_commit(o["Key"][len(prefix) + 1 :]) for page in pages for o in page.get("Contents", []))


def _bucket_prefix(location: TableLocation) -> tuple[str, str]:
    rest = location.uri.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


def _s3_client(location: TableLocation) -> Any:
    from laminar_orchestration.store.s3 import make_s3_client

    return make_s3_client(location.storage_options.get("AWS_ENDPOINT_URL"))


def remove_table(location: TableLocation) -> int:
    """Delete every object of the table at `location` (log and data files); the count removed."""
    if location.is_local:
        path = Path(location.uri)
        if not path.exists():
            return 0
        count = sum(1 for p in path.rglob("*") if p.is_file())
        shutil.rmtree(path)
        return count
    bucket, prefix = _bucket_prefix(location)
    client = _s3_client(location)
    removed = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            removed += len(keys)
    return removed


def check_identity(table: DeltaTable, location: TableLocation, cluster_id: str) -> None:
    """TableMismatch unless `table` is the output table of cluster `cluster_id`."""
    name = table.metadata().name or ""
    if name != TABLE_NAME_PREFIX + cluster_id:
        raise TableMismatch(location.uri, f"its name is {name!r}, expected {TABLE_NAME_PREFIX + cluster_id!r}")
    have = {f.name: f for f in pa.schema(table.schema().to_arrow())}
    for want in LINEAGE_SCHEMA:
        got = have.get(want.name)
        if got is None or got.type != want.type:
            raise TableMismatch(location.uri, f"column {want.name!r} is {got.type if got else 'missing'}")


def landed_seq(table: DeltaTable | None, partition: int) -> int:
    """The seq of the newest manifest entry of `partition` the table holds (0: none)."""
    if table is None:
        return 0
    return table.transaction_version(app_id(partition)) or 0


# --- the committer -----------------------------------------------------------------------------


class _ProbeMemo(ForwardingStore):
    """The store as the chain walk reads it, minus a redundant request: a GET that found nothing
    answers the HEAD of the same key that follows it.

    The walk GETs the next manifest entry and, when the reader returns none, HEADs the key to tell
    the chain's end (absent) from a forged entry (present); after a 404 the HEAD can only say
    absent. Each sync ends every partition's walk this way, so this halves its manifest probes.
    """

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self._absent: str | None = None

    def get(self, key: str) -> StoredObject:
        self._absent = None
        try:
            return self.inner.get(key)
        except ObjectNotFound:
            self._absent = key
            raise

    def head(self, key: str) -> ObjectMeta | None:
        if key == self._absent:
            self._absent = None
            return None
        return self.inner.head(key)

    def close(self) -> None:
        self.inner.close()


#: After each commit: a checkpoint every `delta.checkpointInterval` commits (readers replay a short
#: log), but no expired-log cleanup, which lists the whole `_delta_log` on every commit
#: (`laminar table maintain` cleans the log up).
TABLE_DESCRIPTION = "laminar-orchestration: the committed output of every partition, exactly once"
_POST_COMMIT = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


@dataclass
class SyncResult:
    """What one `TableCommitter.sync` did."""

    uri: str
    #: The table version after the call (None: no table yet, nothing to write).
    version: int | None = None
    batches: int = 0
    rows: int = 0
    #: Delta commits made (normally 0 or 1) and attempts that lost to a concurrent commit or failed.
    commits: int = 0
    retries: int = 0
    #: Per partition, the seq of the newest manifest entry in the table after the call.
    landed: dict[int, int] = field(default_factory=dict)

    def summary_lines(self) -> list[str]:
        return [
            f"output table {self.uri}: version {self.version}, appended {self.batches} batches "
            f"({self.rows} rows) in {self.commits} commit(s)"
        ]

    def to_json(self) -> dict[str, Any]:
        # Every field as it is, in declaration order, but `landed` keyed by text as JSON wants it.
        return {**vars(self), "landed": {str(p): s for p, s in sorted(self.landed.items())}}


class TableCommitter:
    """Catches the output table up with the manifest chains of the partitions it is given.

    Thread-safe (one sync at a time per committer); several committers, in any
    processes, may sync the same or overlapping partitions concurrently.
    """

    def __init__(
        self,
        store: ObjectStore,
        location: TableLocation | None = None,
        *,
        max_attempts: int = 8,
        max_batches_per_commit: int = 2_000,
        retry_backoff_s: float = 0.05,
    ) -> None:
        self.store = store
        self.location = location or table_location(store)
        self.max_attempts = max_attempts
        self.max_batches_per_commit = max_batches_per_commit
        self.retry_backoff_s = retry_backoff_s
        # Single-threaded under the lock below, as the probe memo needs.
        self._follower = ChainFollower(_ProbeMemo(store))
        #: Output rows this process wrote (`remember`), by object key: not read back.
        self._known_outputs: dict[str, pa.Table] = {}
        self._reads = ReadStore(store)
        #: Each partition's transaction version in the table, following the log (no replay per sync).
        self._landed = LandedSeqs(self.location)
        self._lock = threading.Lock()
        self._table: DeltaTable | None = None
        self._cluster_id: str | None = None
        #: partition -> (the table's seq when the walk was made, the newest entry walked up to).
        self._positions: dict[int, tuple[int, ManifestVersion | None]] = {}

    @property
    def cluster_id(self) -> str:
        if self._cluster_id is None:
            self._cluster_id = Ledger(self.store).cluster().cluster_id
        return self._cluster_id

    # -- the table ---------------------------------------------------------------------------

    def table(self) -> DeltaTable | None:
        """The table at its newest version (None: not created yet); checked to be this cluster's."""
        if self._table is not None:
            try:
                self._table.update_incremental()
                return self._table
            except (DeltaError, OSError) as exc:
                log.info("reloading output table %s: %s", self.location.uri, exc)
                self._table = None
        table = open_table(self.location)
        if table is not None:
            check_identity(table, self.location, self.cluster_id)
        self._table = table
        return table

    # -- sync ---------------------------------------------------------------------------------

    def remember(self, version: ManifestVersion, outputs: Mapping[str, pa.Table]) -> None:
        """A batch this process committed: its chain entry and its output rows by object key. The next
        sync takes them instead of reading them back (the node that wrote them calls this)."""
        # No lock: a sync may hold the committer's for seconds, and this runs on the batch's path
        # (single dict operations are atomic; a batch not found here is read from the store).
        if len(self._known_outputs) > KNOWN_MAX:
            self._known_outputs.clear()  # never synced (a partition that moved away): read if needed
        self._follower.remember(version)
        self._known_outputs.update(outputs)

    def sync(self, partitions: Iterable[int]) -> SyncResult:
        """Append every committed batch of `partitions` not yet in the table; one Delta commit per call.

        Safe to call again after any error: what landed is skipped, nothing is appended twice.
        Raises TableSchemaMismatch (nothing written), TableMismatch, TableLogCorrupt, TableCommitFailed.
        """
        wanted = sorted(set(partitions))
        with self._lock:
            result = SyncResult(self.location.uri)
            while True:
                more = self._sync_once(wanted, result)
                if not more:
                    return result

    def _start(self, table: DeltaTable | None, partition: int) -> tuple[int, ManifestVersion | None]:
        """Where to walk `partition`'s chain from: the table's seq and the entry at (or past) it."""
        landed = self._landed.seq(table, partition)
        known = self._positions.get(partition)
        if known is not None and known[0] == landed and (known[1] is None or known[1].manifest.seq >= landed):
            return landed, known[1]  # walked before from the same table state: go on from there
        if landed == 0:
            return 0, None
        entry = self._follower.entry(partition, landed)
        if entry is None:
            raise TableMismatch(
                self.location.uri,
                f"it holds partition {partition} up to manifest seq {landed}, which the store's chain lacks",
            )
        return landed, entry

    def _sync_once(self, partitions: Sequence[int], result: SyncResult) -> bool:
        """One Delta commit (retried); True when a catch-up needs another."""
        rows_cache: dict[tuple[int, int], pa.Table | None] = {}
        last_error = ""
        for attempt in range(1, self.max_attempts + 1):
            table = self.table()
            if not self._landed.refresh(table):
                # Rebuilt, or its log lost or cleaned up, under this handle: never commit through a stale one.
                log.warning("output table %s: log entry 0 changed: reopening it", self.location.uri)
                self._table = None
                table = self.table()
                self._landed.refresh(table)
            starts = {p: self._start(table, p) for p in partitions}
            walks = {p: self._follower.walk(p, start) for p, (_, start) in starts.items()}
            result.version = table.version() if table is not None else None
            chosen = self._choose({p: w.batches for p, w in walks.items()})
            if not chosen:
                for p in partitions:
                    self._positions[p] = (starts[p][0], walks[p].newest)
                    result.landed[p] = starts[p][0]
                return False
            data = self._rows(table, chosen, rows_cache)
            txns: dict[int, int] = {}
            for b in chosen:
                txns[b.partition] = max(txns.get(b.partition, 0), b.seq)
            if data is None and table is None:
                # Only empty outputs and no table to record their versions in yet: nothing to hold.
                return False
            if table is None:
                assert data is not None
                # Log entry 0 first, with no data file: a table's files never precede its log, so
                # files without a log always mean a lost log, however slow the store.
                failed = self._create(data.schema)
                table = self.table()
                if table is None:  # a store fault, not a lost race: wait as after a failed commit
                    last_error = failed or "log entry 0 not found after it was written"
                    result.retries += 1
                    time.sleep(self.retry_backoff_s * attempt)
                    continue
                if table.version() != 0 or not self._landed.refresh(table):
                    continue  # a racing committer appended already: walk from what landed
            # The snapshot the commit is made on (delta-rs moves `table` to the new version on success).
            base = table.version()
            try:
                self._append(table, data, txns, chosen)
            except (CommitFailedError, DeltaError, OSError) as exc:
                # Lost to a concurrent commit (delta-rs refused the rebase: the same transaction
                # identifier moved), a store fault, or an unknown outcome: re-read and skip what landed.
                last_error = " ".join(str(exc).split())[:300]
                log.info("output table commit attempt %d failed: %s", attempt, last_error)
                result.retries += 1
                if not isinstance(exc, CommitFailedError):
                    self._table = None  # maybe a broken handle: open the table afresh
                time.sleep(self.retry_backoff_s * attempt)
                continue
            result.commits += 1
            result.batches += len(chosen)
            result.rows += data.num_rows if data is not None else 0
            exhausted = True
            for p in partitions:
                new = txns.get(p, starts[p][0])
                walked_all = len(walks[p].batches) == sum(1 for b in chosen if b.partition == p)
                exhausted = exhausted and walked_all
                # Past the appended batches the walk only saw entries without output (seals, snapshots).
                self._positions[p] = (new, walks[p].newest if walked_all else self._follower.entry(p, new))
                self._follower.forget(p, new)
                result.landed[p] = new
            # Never rebased: the commit is the version after the snapshot it was made on.
            result.version = base + 1
            self._landed.committed(result.version, txns)
            return not exhausted
        raise TableCommitFailed(self.location.uri, self.max_attempts, last_error)

    def _choose(self, pending: dict[int, list[CommittedBatch]]) -> list[CommittedBatch]:
        """The batches of the next commit: each partition's oldest first, at most `max_batches_per_commit`."""
        chosen: list[CommittedBatch] = []
        for p in sorted(pending):
            room = self.max_batches_per_commit - len(chosen)
            if room <= 0:
                break
            chosen.extend(pending[p][:room])
        return chosen

    def _rows(
        self,
        table: DeltaTable | None,
        batches: Sequence[CommittedBatch],
        cache: dict[tuple[int, int], pa.Table | None],
    ) -> pa.Table | None:
        """The rows of `batches`, checked against the table's schema (or the first batch's)."""
        expected: Schema | None = table.schema() if table is not None else None
        expected_arrow = pa.schema(expected.to_arrow()) if expected is not None else None
        parts: list[pa.Table] = []
        for b in batches:
            if (b.partition, b.seq) not in cache:
                outputs = [self._known_outputs.pop(ref.key, None) or read_output(self._reads, ref) for ref in b.outputs]
                cache[(b.partition, b.seq)] = batch_rows(b, outputs)
            rows = cache[(b.partition, b.seq)]
            if rows is None:
                continue
            got = Schema.from_arrow(rows.schema)
            if expected is None:
                expected, expected_arrow = got, rows.schema
            elif got != expected:
                assert expected_arrow is not None
                raise TableSchemaMismatch(
                    self.location.uri, b.partition, b.seq, _schema_text(expected_arrow), _schema_text(rows.schema)
                )
            parts.append(rows)
        if not parts:
            if table is None or expected_arrow is None:
                return None
            return expected_arrow.empty_table()
        target = parts[0].schema
        return pa.concat_tables([p if p.schema.equals(target) else p.cast(target) for p in parts])

    def _create(self, schema: pa.Schema) -> str | None:
        """Write the table's log entry 0 (its name and `schema`, no rows); a lost race to create it is fine.

        Returns why it failed, if it did (a store fault: the caller's next attempt looks again).
        """
        self._table = None
        try:
            DeltaTable.create(
                self.location.uri,
                schema,
                mode="error",
                name=TABLE_NAME_PREFIX + self.cluster_id,
                description=TABLE_DESCRIPTION,
                storage_options=self.location.options(),
                # No retry: delta-rs would land a racing create as version 1 on top of the winner's.
                commit_properties=CommitProperties(max_commit_retries=0),
            )
        except (CommitFailedError, DeltaError, OSError) as exc:
            reason = " ".join(str(exc).split())[:300]
            log.info("output table %s: not created here (%s)", self.location.uri, reason)
            return reason
        return None

    def _append(
        self, table: DeltaTable, data: pa.Table | None, txns: dict[int, int], batches: Sequence[CommittedBatch]
    ) -> None:
        """One Delta commit: `data` with a transaction identifier per partition (version: its newest seq).

        On top of `table` (the snapshot the versions were read from), so a concurrent commit of the
        same partitions makes delta-rs refuse this one instead of rebasing it.
        """
        assert data is not None
        summary = {str(p): [b.seq for b in batches if b.partition == p] for p in sorted(txns)}
        write_deltalake(
            table,
            data,
            post_commithook_properties=_POST_COMMIT,
            mode="append",
            commit_properties=CommitProperties(
                # No rebase onto a concurrent commit: delta-rs's rebase does not check every case (a
                # racing create lands twice), so any concurrent commit fails this one at the log's
                # create-only entry, and `sync` re-reads the transaction versions before it tries again.
                max_commit_retries=0,
                app_transactions=[Transaction(app_id(p), seq) for p, seq in sorted(txns.items())],
                custom_metadata={"laminar.batches": json.dumps(summary, separators=(",", ":"))},
            ),
        )


def rebuild_table(
    store: ObjectStore, location: TableLocation | None = None, *, force: bool = False
) -> tuple[int, SyncResult]:
    """Recreate the output table from the manifest chains: remove what is there, sync every partition.

    For a deleted or corrupted log. A readable table of another cluster is kept unless `force`
    (TableMismatch). Returns the objects removed and the sync's result.
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
    removed = remove_table(location)
    committer = TableCommitter(store, location)
    return removed, committer.sync(ledger.partitions())
