"""The promises the simulation checks after every applied write, as typed violations.

`Checker` watches the simulated store's writes (lost responses included: they
landed) and keeps, per partition, what it needs to decide each promise
incrementally: the grants, the manifest chain as created, the source events
and the fold of them, the state the chain's snapshot and deltas add up to.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq

from laminar_orchestration.errors import StructuredError
from laminar_orchestration.protocol import signing
from laminar_orchestration.protocol.keys import (
    ASSIGNMENTS_PREFIX,
    FENCED_OBJECT_PREFIXES,
    grant_key,
    ledger_partition_prefix,
    manifest_history_key,
    manifest_pointer_key,
    manifest_prefix,
    parse_fenced_object_key,
    source_partition_prefix,
)
from laminar_orchestration.protocol.manifest import PartitionManifest
from laminar_orchestration.protocol.records import CorruptLedgerObject, EpochGrant, parse_record
from laminar_orchestration.protocol.segments import SourceBatch, decode_segment
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore

#: Per key: (events counted, sum of their values) - the sim's keyed fold.
FoldState = dict[str, tuple[int, float]]


class InvariantViolation(StructuredError):
    """Base of the promises a run can break. `invariant` names the promise.

    Written like the library's errors (`StructuredError`), but no `LaminarError`: a broken
    promise of the simulation has no exit code.
    """

    invariant: ClassVar[str] = "invariant"

    def fields(self) -> dict[str, object]:
        """The violation's fields by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class DoubleGrant(InvariantViolation):
    """Two writers acted as the owner of one (partition, epoch), or its grant was written twice."""

    invariant: ClassVar[str] = "one owner per epoch"
    partition: int
    epoch: int
    writers: tuple[str, ...]

    def _message(self) -> str:
        return f"partition {self.partition} epoch {self.epoch} has more than one owner: {', '.join(self.writers)}"


class StaleManifestAccepted(InvariantViolation):
    """A manifest under an epoch created after the chain was sealed (fenced) at a later one."""

    invariant: ClassVar[str] = "no manifest after the fence"
    partition: int
    seq: int
    epoch: int
    fenced_at: int
    node: int

    message = (
        "partition {partition}: manifest seq {seq} under epoch {epoch} by node {node} "
        "accepted after the chain was fenced at epoch {fenced_at}"
    )


class OffsetRegression(InvariantViolation):
    """The committed source offset moved backwards along the chain."""

    invariant: ClassVar[str] = "offsets never move backwards"
    partition: int
    seq: int
    previous: int
    offset: int

    message = "partition {partition}: manifest seq {seq} moved the offset {previous} -> {offset}"


class ExactlyOnceViolated(InvariantViolation):
    """The committed deltas do not tile [snapshot offset, committed offset): events lost or applied twice."""

    invariant: ClassVar[str] = "exactly once"
    partition: int
    seq: int
    kind: str  # loss | duplicate
    start: int
    end: int

    message = "partition {partition}: manifest seq {seq}: {kind} of source offsets [{start}, {end})"


class StateMismatch(InvariantViolation):
    """The committed state is not the fold of exactly the events below the committed offset."""

    invariant: ClassVar[str] = "committed state = fold of the committed events"
    partition: int
    seq: int
    offset: int
    key: str
    expected: tuple[int, float] | None
    actual: tuple[int, float] | None

    message = (
        "partition {partition}: manifest seq {seq} at offset {offset}: key {key!r} "
        "is {actual}, the fold of the source says {expected}"
    )


class ChainBroken(InvariantViolation):
    """A history entry that does not follow its predecessor (gap, or beyond the source log's end)."""

    invariant: ClassVar[str] = "the manifest chain is well formed"
    partition: int
    key: str
    reason: str

    message = "partition {partition}: {key}: {reason}"


class ManifestArtifactDeleted(InvariantViolation):
    """An object some manifest names was deleted (before or after the manifest was published)."""

    invariant: ClassVar[str] = "no named object is deleted"
    key: str

    message = "{key} is named by a manifest and was deleted"


class GarbageNotSwept(InvariantViolation):
    """Once faults stopped and a sweep ran, an object no manifest names, of a sealed epoch, is still there."""

    invariant: ClassVar[str] = "liveness: unreachable objects of sealed epochs are swept"
    partition: int
    key: str
    epoch: int
    sealed_at: int

    message = (
        "partition {partition}: {key} (epoch {epoch}) is named by no manifest and its epoch "
        "is sealed (below {sealed_at}), yet a sweep after the faults stopped left it"
    )


class MigrationWedged(InvariantViolation):
    """A migration record still unfinished well after its deadline, once faults stopped."""

    invariant: ClassVar[str] = "every migration terminates by its deadline"
    partition: int
    migration_id: str
    phase: str
    overdue_s: float

    message = "partition {partition}: migration {migration_id} still {phase} {overdue_s:.1f}s after its deadline"


class PartitionNotLive(InvariantViolation):
    """After faults stopped, a partition was not active on a live node within the bound."""

    invariant: ClassVar[str] = "liveness: every partition active on a live node"
    partition: int
    epoch: int
    owner: int
    reason: str
    waited_s: float

    message = (
        "partition {partition} not active on a live node {waited_s:.1f}s after faults stopped "
        "(ledger: epoch {epoch}, owner {owner}): {reason}"
    )


class VoidEntryAdopted(InvariantViolation):
    """A genuine entry that does not follow the newest genuine one: built on a void entry (forged, or a
    writer the chain had moved past), or on an older entry."""

    invariant: ClassVar[str] = "the chain never continues from a void entry"
    partition: int
    seq: int
    node: int
    parent: str

    message = "partition {partition}: manifest seq {seq} by node {node} follows {parent}, not the newest genuine entry"


class VoidEntryHeld(InvariantViolation):
    """A reader (a standby, a fresh reader, a restoring owner) took a void entry for the chain's newest."""

    invariant: ClassVar[str] = "no reader holds a void entry"
    partition: int
    seq: int
    reader: str

    message = "partition {partition}: {reader} holds void entry seq {seq} as the newest manifest"


class ReaderDisagrees(InvariantViolation):
    """At one instant, a fresh ManifestReader's `current` (or the last entry of its `history`, the
    audit's walk from the first entry) is not the newest genuine entry."""

    invariant: ClassVar[str] = "a fresh reader and the audit agree on the newest entry"
    partition: int
    reader: str
    reader_seq: int | None
    genuine_seq: int | None

    message = "partition {partition}: {reader} ends on seq {reader_seq}, the newest genuine entry is seq {genuine_seq}"


class HandoffRefused(InvariantViolation):
    """A graceful handoff failed with HandoffMismatch although the old owner's release was genuine."""

    invariant: ClassVar[str] = "a genuine release hands over"
    partition: int
    epoch: int
    detail: str

    message = "partition {partition}: the takeover at epoch {epoch} refused a genuine release ({detail})"


class OwnerCommitRefused(InvariantViolation):
    """The owner's publish was refused by a succession check (not a fence): it read a void entry as the newest."""

    invariant: ClassVar[str] = "the owner's commits never fail on a void entry"
    partition: int
    epoch: int
    node: int
    detail: str

    message = "partition {partition}: node {node}'s commit at epoch {epoch} refused: {detail}"


class FencedEpochAccepted(InvariantViolation):
    """An entry under epoch e was accepted after grant e+1 existed and the control plane had completed it."""

    invariant: ClassVar[str] = "no entry of an epoch is accepted once a later grant is completed"
    partition: int
    seq: int
    epoch: int
    completed: int
    node: int

    message = (
        "partition {partition}: manifest seq {seq} under epoch {epoch} by node {node} "
        "accepted after the control plane completed the grant of epoch {completed}"
    )


class UndecodableKeyAppended(InvariantViolation):
    """The source log holds an event whose key is not valid UTF-8: no worker can ever process it."""

    invariant: ClassVar[str] = "the log never holds an undecodable key"
    key: str
    detail: str

    message = "{key} holds a key that is not valid UTF-8: {detail}"


class AssignmentWentBack(InvariantViolation):
    """A node's assignment listed an older revision of a partition's desired state than it had listed:
    the node would act on a state a later write replaced (drain for a cancelled move)."""

    invariant: ClassVar[str] = "an assignment never goes back"
    node: int
    partition: int
    listed: int
    written: int

    message = "node {node}'s assignment listed partition {partition} at revision {written} after {listed}"


class EventDecoder:
    """The (key, value) events of a source batch, decoding each immutable Parquet payload once."""

    def __init__(self) -> None:
        self._cache: dict[bytes, list[tuple[str, float]]] = {}

    def events(self, batch: SourceBatch) -> list[tuple[str, float]]:
        """Every event of `batch` in offset order."""
        out: list[tuple[str, float]] = []
        for payload in batch.payloads:
            out.extend(self.payload(payload))
        return out

    def payload(self, payload: bytes) -> list[tuple[str, float]]:
        """The events of one frame's Parquet payload; UnicodeDecodeError for a key that is not UTF-8."""
        decoded = self._cache.get(payload)
        if decoded is None:
            # ParquetFile on one thread: several times faster than read_table on tiny payloads.
            table = pq.ParquetFile(pa.BufferReader(payload)).read(columns=["key", "value"], use_threads=False)
            keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
            decoded = self._cache[payload] = list(zip(keys, values, strict=True))
        return decoded


def fold(state: FoldState, events: list[tuple[str, float]]) -> None:
    """Apply `events` in order to `state` (count and sum per key)."""
    for key, value in events:
        count, total = state.get(key, (0, 0.0))
        state[key] = (count + 1, total + value)


def decode_delta(data: bytes) -> FoldState:
    """A sim delta object: the touched keys' full new values."""
    return {k: (int(v[0]), float(v[1])) for k, v in json.loads(data).items()}


def encode_delta(values: Mapping[str, tuple[int, float]]) -> bytes:
    """The bytes of a sim delta object (sorted, so equal values give equal bytes)."""
    return json.dumps({k: list(values[k]) for k in sorted(values)}, separators=(",", ":")).encode()


@dataclass
class _Partition:
    pointer_key: str
    manifest_prefix: str
    ledger_prefix: str
    source_prefix: str
    #: The genuine chain: what every reader must end on (void entries are no part of it).
    chain: list[PartitionManifest] = field(default_factory=list)
    #: sha256 of the newest genuine entry's stored bytes.
    tip_hash: str | None = None
    #: History entries written, void ones included (their sequence numbers are contiguous).
    written: int = 0
    #: sha256 of every void entry's stored bytes -> its sequence number.
    void: dict[str, int] = field(default_factory=dict)
    #: epoch -> (node, generation, public key) of its grant.
    grants: dict[int, tuple[int, int | None, str | None]] = field(default_factory=dict)
    #: epoch -> the newest generation of the grant's node that sealed the chain at it: a restarted
    #: process re-adopts its node's grant and seals again, and only it may publish from then on.
    sealed_generation: dict[int, int] = field(default_factory=dict)
    #: The newest epoch whose grant the control plane completed (its seal ensured): nothing under an
    #: older epoch may be accepted from then on.
    completed: int = 0
    events: list[tuple[str, float]] = field(default_factory=list)
    ref_offset: int = 0
    ref_state: FoldState = field(default_factory=dict)
    overlay_keys: list[str] = field(default_factory=list)
    overlay: FoldState = field(default_factory=dict)


class Checker:
    """Decides the safety promises on every applied write; `violation` keeps the first one broken."""

    def __init__(self, memory: ObjectStore, partitions: int, decoder: EventDecoder) -> None:
        self._memory = memory
        self._decoder = decoder
        self._source = SourceLog(memory, partitions=partitions)
        self._parts = [
            _Partition(
                manifest_pointer_key(p),
                manifest_prefix(p) + "/",
                ledger_partition_prefix(p) + "/",
                source_partition_prefix(p) + "/",
            )
            for p in range(partitions)
        ]
        self._named: set[str] = set()
        #: (assignment key, partition) -> the newest revision that node's assignment listed for it.
        self._listed: dict[tuple[str, int], int] = {}
        #: Every key a delete removed (the sweep's).
        self._deleted: set[str] = set()
        self.violation: InvariantViolation | None = None
        self.manifests_checked = 0
        #: Manifests that named a newer snapshot than the entry before them.
        self.snapshots_named = 0
        #: Data commits under an epoch made after a later epoch was granted (before its seal: legitimate).
        self.late_commits = 0
        #: Void entries written (forged, or by a writer the chain had moved past).
        self.void_entries = 0
        #: Whether the write being applied comes from a process that may write void entries (a zombie
        #: that skips its client-side checks, or an intruder with another node's keys). Set by the world.
        self.rogue_writer: Callable[[], bool] = lambda: False

    def applied(self, op: str, key: str, data: bytes | None) -> None:
        """Check what the write of `key` changed (never raises: the first violation is kept)."""
        if self.violation is not None:
            return
        try:
            self._check(op, key, data)
        except InvariantViolation as exc:
            self.violation = exc

    def _check(self, op: str, key: str, data: bytes | None) -> None:
        if data is None:
            self._deleted.add(key)
            if key in self._named:
                raise ManifestArtifactDeleted(key)
            return
        if key.startswith(ASSIGNMENTS_PREFIX):
            self._assignment(key, data)
            return
        for p, part in enumerate(self._parts):
            if key.startswith(part.manifest_prefix) and key != part.pointer_key:
                self._manifest(p, part, key, data)
                return
            if key.startswith(part.ledger_prefix) and b'"kind":"epoch-grant"' in data:
                self._grant(p, part, key, op, data)
                return
            if key.startswith(part.source_prefix) and key.endswith(".seg"):
                self._segment(p, part, key, data)
                return

    def _assignment(self, key: str, data: bytes) -> None:
        """Every partition an assignment lists is at a revision no older than it ever listed."""
        record = json.loads(data)
        for p, revision in record["partitions"].items():
            listed = self._listed.get((key, int(p)), -1)
            if revision < listed:
                raise AssignmentWentBack(int(record["node"]), int(p), listed, revision)
            self._listed[(key, int(p))] = revision

    def _segment(self, p: int, part: _Partition, key: str, data: bytes) -> None:
        """Every key of a segment the log took must decode: no worker could ever process it otherwise.
        (The events are decoded once, for whoever reads them later.)"""
        start = int(key[len(part.source_prefix) : -len(".seg")])
        for payload, _rows in decode_segment(key, data, partition=p, start_offset=start):
            try:
                self._decoder.payload(bytes(payload))
            except UnicodeDecodeError as exc:
                raise UndecodableKeyAppended(key, str(exc)) from None

    def _grant(self, p: int, part: _Partition, key: str, op: str, data: bytes) -> None:
        grant = parse_record(key, data, EpochGrant)
        if key != grant_key(p, grant.epoch):
            raise ChainBroken(p, key, f"a grant of epoch {grant.epoch} stored under the wrong key")
        if grant.epoch in part.grants or op != "put_if_absent":
            raise DoubleGrant(p, grant.epoch, (f"grant {part.grants.get(grant.epoch)}", f"node {grant.node}"))
        part.grants[grant.epoch] = (grant.node, grant.generation, grant.public_key)

    def _manifest(self, p: int, part: _Partition, key: str, data: bytes) -> None:
        part.written += 1
        if key != manifest_history_key(p, part.written):
            raise ChainBroken(p, key, f"entry written after {part.written - 1} entries")
        raw_hash = hashlib.sha256(data).hexdigest()
        try:
            m: PartitionManifest | None = parse_record(key, data, PartitionManifest)
        except CorruptLedgerObject:
            m = None
        void = self._void(p, part, m)
        if void is not None:
            self._void_written(p, part, key, m, raw_hash, void)
            return
        assert m is not None
        self.manifests_checked += 1
        if part.chain:
            prev = part.chain[-1]
            if m.parent_hash != part.tip_hash:
                seq = part.void.get(m.parent_hash or "")
                parent = f"void entry seq {seq}" if seq is not None else f"parent {m.parent_hash}"
                raise VoidEntryAdopted(p, m.seq, m.node, parent)
            if m.source_offset < prev.source_offset:
                raise OffsetRegression(p, m.seq, prev.source_offset, m.source_offset)
        elif m.parent_hash is not None:
            raise VoidEntryAdopted(p, m.seq, m.node, f"parent {m.parent_hash} (the first genuine entry)")
        if m.fencing_token < part.completed:
            raise FencedEpochAccepted(p, m.seq, m.fencing_token, part.completed, m.node)
        grant = part.grants.get(m.fencing_token)
        if m.is_seal and grant is not None and grant[0] == m.node:
            known = part.sealed_generation.get(m.fencing_token, -1)
            part.sealed_generation[m.fencing_token] = max(known, m.generation)
        if not m.is_seal and m.node != 0:
            if max(part.grants, default=0) > m.fencing_token:
                self.late_commits += 1
            holder = part.sealed_generation.get(m.fencing_token, grant[1] if grant else None)
            if grant is None or grant[0] != m.node or (holder is not None and holder != m.generation):
                raise DoubleGrant(
                    p,
                    m.fencing_token,
                    (
                        f"grant {grant[:2] if grant else None} (sealed by gen {holder})",
                        f"manifest seq {m.seq} by node {m.node} gen {m.generation}",
                    ),
                )
        for ref in m.artifacts():
            # Objects are uploaded before the manifest that names them: one gone by now was deleted.
            if ref.key not in self._named and ref.key in self._deleted and self._memory.head(ref.key) is None:
                raise ManifestArtifactDeleted(ref.key)
        self._exactly_once(p, part, m)
        if m.snapshot is not None and (not part.chain or part.chain[-1].snapshot != m.snapshot):
            self.snapshots_named += 1
        part.chain.append(m)
        part.tip_hash = raw_hash
        self._named.update(ref.key for ref in m.artifacts())

    def _void(self, p: int, part: _Partition, m: PartitionManifest | None) -> str | None:
        """Why the entry `m` (None: it does not parse) is void, as every reader must judge it; None if genuine.

        Forged: not signed by the key of its epoch's grant to its node. Superseded: genuinely signed,
        but under an epoch older than the newest genuine entry's, or by an earlier generation of the
        same node at the same epoch (the chain moved past its writer).
        """
        if m is None:
            return "forged: does not parse"
        if m.partition != p or m.seq != part.written:
            return f"forged: names partition {m.partition} seq {m.seq}"
        grant = part.grants.get(m.fencing_token)
        if grant is None:
            return f"forged: epoch {m.fencing_token} was never granted"
        if grant[0] != m.node:
            return f"forged: epoch {m.fencing_token} was granted to node {grant[0]}, not node {m.node}"
        problem = signing.signature_problem(m, grant[2])
        if problem is not None:
            return f"forged: {problem}"
        tip = part.chain[-1] if part.chain else None
        if tip is not None and m.fencing_token < tip.fencing_token:
            return f"superseded: epoch {m.fencing_token} after the chain reached epoch {tip.fencing_token}"
        if (
            tip is not None
            and m.fencing_token == tip.fencing_token
            and m.node == tip.node
            and m.generation < tip.generation
        ):
            return f"superseded: generation {m.generation} after the chain reached generation {tip.generation}"
        return None

    def _void_written(
        self, p: int, part: _Partition, key: str, m: PartitionManifest | None, raw_hash: str, reason: str
    ) -> None:
        """A void entry: only a process that skips its checks (or holds no grant's key) writes one."""
        part.void[raw_hash] = part.written
        self.void_entries += 1
        if self.rogue_writer():
            return
        tip = part.chain[-1] if part.chain else None
        if m is not None and tip is not None and m.fencing_token < tip.fencing_token:
            raise StaleManifestAccepted(p, m.seq, m.fencing_token, tip.fencing_token, m.node)
        writer = f"manifest seq {m.seq} by node {m.node} gen {m.generation}" if m is not None else key
        epoch = m.fencing_token if m is not None else 0
        raise DoubleGrant(p, epoch, (f"an honest writer's void entry: {reason}", writer))

    # -- what the simulation tells the checker ---------------------------------------------------

    def is_void(self, partition: int, raw: bytes) -> int | None:
        """The sequence number of the void entry stored as `raw`, None if it is not a void entry."""
        return self._parts[partition].void.get(hashlib.sha256(raw).hexdigest())

    def tip(self, partition: int) -> tuple[int, str] | None:
        """The newest genuine entry of `partition`: (seq, sha256 of its bytes), None before the first."""
        part = self._parts[partition]
        return (part.chain[-1].seq, part.tip_hash or "") if part.chain else None

    def newest_grant(self, partition: int) -> int:
        """The newest epoch of `partition` granted so far (0: none)."""
        return max(self._parts[partition].grants, default=0)

    def grant_completed(self, partition: int, epoch: int) -> None:
        """The control plane completed every grant of `partition` up to `epoch` (the chain is sealed at it)."""
        part = self._parts[partition]
        part.completed = max(part.completed, epoch)

    def _exactly_once(self, p: int, part: _Partition, m: PartitionManifest) -> None:
        if m.outputs:
            # Output is visible once its manifest is: each commit's output (the range of its
            # delta) must start where the chain's previous entry ended, or events repeat or vanish.
            start = part.chain[-1].source_offset if part.chain else 0
            last = m.deltas[-1] if m.deltas else None
            if last is None or last.start_offset != start or last.end_offset != m.source_offset:
                got = last.start_offset if last is not None else m.source_offset
                kind = "duplicate" if got < start else "loss"
                raise ExactlyOnceViolated(p, m.seq, kind, min(got, start), max(got, start))
        # The snapshot holds the state at its offset; the deltas must tile the rest up to the commit's.
        expected = m.state_offset
        for d in m.deltas:
            if d.start_offset != expected:
                kind = "duplicate" if d.start_offset < expected else "loss"
                raise ExactlyOnceViolated(p, m.seq, kind, min(expected, d.start_offset), max(expected, d.start_offset))
            expected = d.end_offset
        if expected != m.source_offset:
            kind = "duplicate" if expected > m.source_offset else "loss"
            lo, hi = sorted((expected, m.source_offset))
            raise ExactlyOnceViolated(p, m.seq, kind, lo, hi)
        keys = [f.ref.key for f in m.snapshot.files] if m.snapshot else []
        keys += [d.ref.key for d in m.deltas]
        if keys[: len(part.overlay_keys)] != part.overlay_keys:
            part.overlay_keys, part.overlay = [], {}
        for k in keys[len(part.overlay_keys) :]:
            obj = self._memory.get_or_none(k)
            if obj is None:
                raise ChainBroken(p, k, "a snapshot file or delta the manifest names does not exist")
            part.overlay.update(decode_delta(obj.data))
            part.overlay_keys.append(k)
        reference = self._reference(p, part, m.source_offset, m.seq)
        if reference != part.overlay:
            for k in sorted(set(reference) | set(part.overlay)):
                if reference.get(k) != part.overlay.get(k):
                    raise StateMismatch(p, m.seq, m.source_offset, k, reference.get(k), part.overlay.get(k))

    def _reference(self, p: int, part: _Partition, offset: int, seq: int) -> FoldState:
        while len(part.events) < offset:
            batch = self._source.read(p, len(part.events), 10_000)
            if batch is None:
                raise ChainBroken(p, manifest_history_key(p, seq), f"offset {offset} is beyond the source log's end")
            part.events.extend(self._decoder.events(batch))
        if offset < part.ref_offset:
            part.ref_offset, part.ref_state = 0, {}
        fold(part.ref_state, part.events[part.ref_offset : offset])
        part.ref_offset = offset
        return part.ref_state

    def check_swept(self, ledger_epochs: Mapping[int, int]) -> None:
        """Raise GarbageNotSwept for an object left that no manifest names and whose epoch is sealed.

        Sealed: below both the partition's ledger epoch (`ledger_epochs`) and the
        fencing token of its manifest chain, so no publish can ever name it.
        """
        for prefix in FENCED_OBJECT_PREFIXES:
            for key in self._memory.list(prefix):
                if key in self._named:
                    continue
                name = parse_fenced_object_key(key)
                part = self._parts[name.partition]
                token = part.chain[-1].fencing_token if part.chain else 0
                sealed_at = min(token, ledger_epochs.get(name.partition, 0))
                if name.epoch < sealed_at:
                    raise GarbageNotSwept(name.partition, key, name.epoch, sealed_at)
