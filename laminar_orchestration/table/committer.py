"""The `TableCommitter`: appends committed batches to the Delta table, each exactly once.

Exactly once, by construction:

* **after the fence** - the committer reads only entries on the manifest
  chain (`batches.ChainFollower`), so a batch reaches the table only after
  its fenced manifest commit, and output no committed entry names (a
  zombie's orphan files, a superseded writer's void entry) never does;
* **at most once** - every Delta commit carries one transaction identifier
  per partition it appends for (`batches.app_id`), whose version is the seq
  of the newest manifest entry it holds. Before each commit the committer
  reads those versions at the table version it commits on (`txns.TableLog`),
  and appends only entries above them. The commit is a create-only write of
  the next log entry: of two committers racing from the same version one
  lands and the other finds the name taken (commits are never rebased,
  whatever they hold). The loser reads the entry that beat it and skips what
  landed; a commit whose response was lost is found the same way.

What one commit writes (plain Delta, the committer's own write, not delta-rs's) and the
checkpoint every interval are `delta_commit`'s.

One call of `TableCommitter.sync` makes one Delta commit for all the
partitions it is given (more only for a catch-up longer than
`max_batches_per_commit`). A node calls it from its own thread once per
commit interval, off the batch's critical path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Schema
from deltalake.exceptions import CommitFailedError, DeltaError

from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import ArtifactRef
from laminar_orchestration.store import AccessDenied, ObjectStore
from laminar_orchestration.store.metering import RequestMeter
from laminar_orchestration.table.batches import (
    ChainFollower,
    ChainWalk,
    CommittedBatch,
    ProbeMemo,
    batch_rows,
    read_output,
)
from laminar_orchestration.table.delta_commit import add_action, checkpoint, log_entry, write_data_file
from laminar_orchestration.table.errors import (
    TableCommitFailed,
    TableLogCorrupt,
    TableMismatch,
    TableSchemaMismatch,
    TableStoreFault,
)
from laminar_orchestration.table.location import (
    TABLE_NAME_PREFIX,
    TableLocation,
    check_identity_of,
    open_table,
    table_location,
)
from laminar_orchestration.table.objects import TableObjects
from laminar_orchestration.table.txns import LogState, TableLog, entry_name

__all__ = ["SyncResult", "TableCommitter"]

log = logging.getLogger(__name__)


def _schema_text(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


#: Batches remembered but not synced yet, at most (beyond, they are read back from the store).
KNOWN_MAX = 10_000
TABLE_DESCRIPTION = "laminar-orchestration: the committed output of every partition, exactly once"


class _CommitRaced(Exception):
    """The log entry a commit was to write is there already: another committer landed that version."""


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
    #: Per partition stopped short, the seq of the first batch whose output this committer's
    #: credentials may not read: it and the partition's later batches are left to one that may.
    blocked: dict[int, int] = field(default_factory=dict)

    def summary_lines(self) -> list[str]:
        stopped = [
            f"partition {p} stopped before batch {s} (its output is not ours to read)" for p, s in self.blocked.items()
        ]
        return [
            f"output table {self.uri}: version {self.version}, appended {self.batches} batches "
            f"({self.rows} rows) in {self.commits} commit(s)",
            *stopped,
        ]

    def to_json(self) -> dict[str, Any]:
        # Every field as it is, in declaration order, but keyed by text as JSON wants it.
        text = {name: {str(p): s for p, s in sorted(getattr(self, name).items())} for name in ("landed", "blocked")}
        return {**vars(self), **text}


def _before(walks: Mapping[int, ChainWalk], blocked: Mapping[int, int]) -> dict[int, list[CommittedBatch]]:
    """Each partition's walked batches before the one it stopped at (all of them if none)."""
    return {p: [b for b in w.batches if p not in blocked or b.seq < blocked[p]] for p, w in walks.items()}


class TableCommitter:
    """Catches the output table up with the manifest chains of the partitions it is given.

    Thread-safe (one sync at a time per committer); several committers, in any
    processes, may sync the same or overlapping partitions concurrently. `node`
    (else the node of the first entry `remember` is given) puts the data files this
    committer writes under its folder (``n-00001/``), where a node's storage policy lets it write.
    `meter`, if given, counts the table's own requests (log, checkpoints, data files) by kind.
    """

    def __init__(
        self,
        store: ObjectStore,
        location: TableLocation | None = None,
        *,
        node: int | None = None,
        max_attempts: int = 8,
        max_batches_per_commit: int = 2_000,
        retry_backoff_s: float = 0.05,
        meter: RequestMeter | None = None,
    ) -> None:
        self.store = store
        self.location = location or table_location(store)
        self.node = node
        self.max_attempts = max_attempts
        self.max_batches_per_commit = max_batches_per_commit
        self.retry_backoff_s = retry_backoff_s
        # Single-threaded under the lock below, as the probe memo needs.
        self._follower = ChainFollower(ProbeMemo(store))
        #: Output rows this process wrote (`remember`), by object key: not read back.
        self._known_outputs: dict[str, pa.Table] = {}
        self._reads = ReadStore(store)
        self.objects = TableObjects(self.location, meter)
        #: The log as of the last look: the table version and each partition's transaction version.
        self.log = TableLog(self.objects)
        self._lock = threading.Lock()
        self._cluster_id: str | None = None
        #: The table id whose name and lineage columns were checked, and its schema (Delta, Arrow).
        self._checked: str | None = None
        self._schema: tuple[str, Schema, pa.Schema] | None = None
        #: The data file written for a set of batches whose commit failed: a retry of the same
        #: batches names it again instead of writing another.
        self._written: dict[tuple[tuple[int, int], ...], tuple[str, int]] = {}
        #: partition -> (the table's seq when the walk was made, the newest entry walked up to).
        self._positions: dict[int, tuple[int, ManifestVersion | None]] = {}
        #: partition -> the batch it last stopped before (logged once), and why its output was refused.
        self._stopped: dict[int, int] = {}
        self._denied: dict[int, str] = {}

    @property
    def cluster_id(self) -> str:
        if self._cluster_id is None:
            self._cluster_id = Ledger(self.store).cluster().cluster_id
        return self._cluster_id

    # -- sync ---------------------------------------------------------------------------------

    def remember(self, version: ManifestVersion, outputs: Mapping[str, pa.Table]) -> None:
        """A batch this process committed: its chain entry and its output rows by object key. The next
        sync takes them instead of reading them back (the node that wrote them calls this)."""
        # No lock: a sync may hold the committer's for seconds, and this runs on the batch's path
        # (single dict operations are atomic; a batch not found here is read from the store).
        if self.node is None:
            self.node = version.manifest.node  # only the node that published an entry hands it over
        if len(self._known_outputs) > KNOWN_MAX:
            self._known_outputs.clear()  # never synced (a partition that moved away): read if needed
        self._follower.remember(version)
        self._known_outputs.update(outputs)

    def sync(self, partitions: Iterable[int], through: Mapping[int, int] | None = None) -> SyncResult:
        """Append every committed batch of `partitions` not yet in the table; one Delta commit per call.

        `through` bounds a partition to its batches up to that manifest seq: a node that released
        it owes the table its own batches, not its successor's (no entry past the bound is read).
        A partition whose next batch's output this committer may not read stops before it
        (`SyncResult.blocked`, logged) while the others are committed: never skipped, the batch
        stays the next one for a committer that may read it.

        Safe to call again after any error: what landed is skipped, nothing is appended twice.
        Raises TableSchemaMismatch (nothing written), TableMismatch, TableLogCorrupt, TableCommitFailed.
        """
        wanted = sorted(set(partitions))
        bounds = dict(through or {})
        with self._lock:
            result = SyncResult(self.location.uri)
            while True:
                more = self._sync_once(wanted, bounds, result)
                if not more:
                    return result

    def _follow(self) -> LogState | None:
        """The table at its newest version, checked to be this cluster's (None: not created yet)."""
        state = self.log.follow()
        if state is None:
            # No log: nothing there, a creation in progress, or files whose log was lost (corrupt).
            if open_table(self.location) is None:
                return None
            state = self.log.follow()  # created meanwhile by a racing committer
            if state is None:
                raise TableLogCorrupt(self.location.uri, "neither _last_checkpoint nor log entry 0 is readable")
        if self._checked != state.table_id:
            check_identity_of(state.name, state.arrow_schema(), self.location, self.cluster_id)
            self._checked = state.table_id
        return state

    def _start(self, state: LogState | None, partition: int) -> tuple[int, ManifestVersion | None]:
        """Where to walk `partition`'s chain from: the table's seq and the entry at (or past) it."""
        landed = state.txns.get(partition, 0) if state is not None else 0
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

    def _sync_once(self, partitions: Sequence[int], bounds: Mapping[int, int], result: SyncResult) -> bool:
        """One Delta commit (retried); True when a catch-up needs another."""
        rows_cache: dict[tuple[int, int], pa.Table | None] = {}
        blocked = result.blocked
        last_error = ""
        attempt = 0
        while attempt < self.max_attempts:
            attempt += 1
            try:
                state = self._follow()
            except TableStoreFault as exc:
                last_error = str(exc)
                result.retries += 1
                time.sleep(self.retry_backoff_s * attempt)
                continue
            starts = {p: self._start(state, p) for p in partitions}
            walks = {p: self._follower.walk(p, start, bounds.get(p)) for p, (_, start) in starts.items()}
            result.version = state.version if state is not None else None
            for p in [p for p, seq in blocked.items() if seq <= starts[p][0]]:
                del blocked[p]  # another committer appended it meanwhile
            chosen = self._readable(self._choose(_before(walks, blocked)), rows_cache, blocked)
            if blocked and not self.log.end_seen:
                self.log.raced()  # a view whose end is a guess: others may have appended that batch
                attempt -= 1
                continue
            for p, seq in blocked.items():
                if self._stopped.get(p) != seq:  # said once per batch, not once per interval
                    self._stopped[p] = seq
                    log.warning(
                        "output table %s: partition %d stops before batch %d: %s; it is left to a committer "
                        "that may read it (its writer's node)", self.location.uri, p, seq, self._denied.get(p),
                    )  # fmt: skip
            pending = _before(walks, blocked)
            if not chosen:
                for p in partitions:
                    # A stopped partition's walk went past batches not in the table: walk again.
                    self._positions[p] = starts[p] if p in blocked else (starts[p][0], walks[p].newest)
                    result.landed[p] = starts[p][0]
                return False
            data = self._rows(state, chosen, rows_cache)
            txns: dict[int, int] = {}
            for b in chosen:
                txns[b.partition] = max(txns.get(b.partition, 0), b.seq)
            if state is None:
                if data is None:
                    return False  # only empty outputs and no table to record their versions in yet
                # Log entry 0 first, with no data file: a table's files never precede its log, so
                # files without a log always mean a lost log, however slow the store.
                failed = self._create(data.schema)
                self.log.reset()
                try:
                    state = self._follow()
                except TableStoreFault as exc:
                    failed, state = str(exc), None
                if state is None:  # a store fault, not a lost race: wait as after a failed commit
                    last_error = failed or "log entry 0 not found after it was written"
                    result.retries += 1
                    time.sleep(self.retry_backoff_s * attempt)
                    continue
                if state.version != 0:
                    continue  # a racing committer appended already: walk from what landed
            base = state.version
            try:
                self._append(state, data, txns, chosen)
            except _CommitRaced:
                # Another committer landed this version: the next look reads it and skips what it holds.
                self.log.raced()
                if not self.log.end_seen:
                    attempt -= 1  # a guess at the log's end (the others' pace) missed: not a lost race
                    continue
                last_error = f"log entry {base + 1} was written by another committer"
                log.info("output table commit attempt %d: %s", attempt, last_error)
                result.retries += 1
                time.sleep(self.retry_backoff_s * attempt)
                continue
            except (TableStoreFault, OSError) as exc:
                # Unknown outcome: the next look finds the entry if it landed, and skips what it holds.
                self.log.raced()
                last_error = " ".join(str(exc).split())[:300]
                log.info("output table commit attempt %d failed: %s", attempt, last_error)
                result.retries += 1
                time.sleep(self.retry_backoff_s * attempt)
                continue
            self._written.clear()
            for b in chosen:  # kept until they landed: reading them back costs a GET each
                for ref in b.outputs:
                    self._known_outputs.pop(ref.key, None)
            result.commits += 1
            result.batches += len(chosen)
            result.rows += data.num_rows if data is not None else 0
            exhausted = True
            for p in partitions:
                new = txns.get(p, starts[p][0])
                taken_all = len(pending[p]) == sum(1 for b in chosen if b.partition == p)
                exhausted = exhausted and taken_all
                # Past the appended batches the walk only saw entries without output (seals, snapshots).
                past = taken_all and p not in blocked
                self._positions[p] = (new, walks[p].newest if past else self._follower.entry(p, new))
                self._follower.forget(p, new)
                result.landed[p] = new
            # Never rebased: the commit is the version after the one it was made on.
            result.version = base + 1
            self.log.committed(base + 1, txns)
            checkpoint(self.location, state, base + 1)
            return not exhausted
        raise TableCommitFailed(self.location.uri, self.max_attempts, last_error)

    def _readable(
        self, chosen: list[CommittedBatch], cache: dict[tuple[int, int], pa.Table | None], blocked: dict[int, int]
    ) -> list[CommittedBatch]:
        """`chosen` up to each partition's first batch whose output these credentials may not read
        (noted in `blocked`: the partition stops there); the rows of the rest are in `cache`."""
        kept: list[CommittedBatch] = []
        for b in chosen:
            if b.seq >= blocked.get(b.partition, b.seq + 1):
                continue  # at or past the batch its partition stopped before
            if (b.partition, b.seq) not in cache:
                try:
                    outputs = [self._output(r) for r in b.outputs]
                except AccessDenied as exc:
                    blocked[b.partition] = b.seq
                    self._denied[b.partition] = str(exc)
                    continue
                cache[(b.partition, b.seq)] = batch_rows(b, outputs)
            kept.append(b)
        return kept

    def _output(self, ref: ArtifactRef) -> pa.Table:
        known = self._known_outputs.get(ref.key)  # an empty table is remembered too (it is falsy)
        return known if known is not None else read_output(self._reads, ref)

    def _choose(self, pending: dict[int, list[CommittedBatch]]) -> list[CommittedBatch]:
        """The batches of the next commit: each partition's oldest first, at most `max_batches_per_commit`."""
        chosen: list[CommittedBatch] = []
        for p in sorted(pending):
            room = self.max_batches_per_commit - len(chosen)
            if room <= 0:
                break
            chosen.extend(pending[p][:room])
        return chosen

    def _table_schema(self, state: LogState | None) -> tuple[Schema, pa.Schema] | None:
        if state is None or not state.schema_json:
            return None
        if self._schema is None or self._schema[0] != state.schema_json:
            delta = state.delta_schema()
            self._schema = (state.schema_json, delta, pa.schema(delta.to_arrow()))
        return self._schema[1], self._schema[2]

    def _rows(
        self,
        state: LogState | None,
        batches: Sequence[CommittedBatch],
        cache: dict[tuple[int, int], pa.Table | None],
    ) -> pa.Table | None:
        """The rows of `batches`, checked against the table's schema (or the first batch's).

        The schema is whatever the processor's output is (after the lineage columns): the first
        commit fixes it, and every later batch must match it.
        """
        fixed = self._table_schema(state)
        expected, expected_arrow = fixed if fixed is not None else (None, None)
        parts: list[pa.Table] = []
        for b in batches:
            rows = cache[(b.partition, b.seq)]  # read by `_readable`
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
            return None
        target = expected_arrow if fixed is not None else parts[0].schema
        assert target is not None
        return pa.concat_tables([p if p.schema.equals(target) else p.cast(target) for p in parts])

    def _create(self, schema: pa.Schema) -> str | None:
        """Write the table's log entry 0 (its name and `schema`, no rows); a lost race to create it is fine.

        Returns why it failed, if it did (a store fault: the caller's next attempt looks again).
        """
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
            return None if "already exists" in reason.lower() else reason
        return None

    def _data_file(self, data: pa.Table, batches: Sequence[CommittedBatch], at_ms: int) -> dict[str, Any]:
        """The `add` action of the data file holding `data` (written now, or by a failed attempt)."""
        key = tuple((b.partition, b.seq) for b in batches)
        written = self._written.get(key)
        if written is None:
            written = write_data_file(self.objects, data, self.node)
            self._written = {key: written}
        name, size = written
        return add_action(name, size, data, at_ms)

    def _append(
        self, state: LogState, data: pa.Table | None, txns: dict[int, int], batches: Sequence[CommittedBatch]
    ) -> None:
        """One Delta commit on top of `state`: the data file, then log entry `state.version + 1`
        holding it with a transaction identifier per partition (version: its newest seq).

        _CommitRaced if that entry is there already (never rebased onto it); TableStoreFault if
        the outcome is unknown.
        """
        at_ms = int(time.time() * 1000)
        add = self._data_file(data, batches, at_ms) if data is not None and data.num_rows else None
        if not self.objects.create(entry_name(state.version + 1), log_entry(state, txns, batches, at_ms, add)):
            raise _CommitRaced()
