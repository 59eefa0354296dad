"""Per-partition commit manifests, published under the owner's fencing token.

A manifest names what one commit made visible together: the source offset
reached, the state checkpoint (a snapshot plus the deltas committed since it)
and the output files. Publishing is fenced twice:

* the immutable history entry ``manifests/p/history/<seq>`` is created
  create-only, so exactly one writer commits sequence number `seq`;
* the new manifest's `fencing_token` (the partition epoch) must be >= the
  previous one, so a stale holder loses even when it read the freshest
  version (``validate_succession``, "stale holder with a fresh version").

The fence point is in this chain. Granting epoch e+1 *seals* it (`seal_chain`):
a seal is the next history entry, a copy of the previous manifest with
``fencing_token = e+1`` and no outputs. The ledger writes it right after it
creates the grant, and the grantee re-ensures it (idempotently) before it
reads the chain to restore, so the seal always precedes the new owner's read.
A publish under e that read the chain before the seal collides with it on the
create-only sequence number; one that reads it after fails on the token. A
write that lands before the seal is the old owner's last commit, and the seal
(carrying its offset and state) hands it to the new owner.

Readers enforce the same rule: rolling forward from the pointer, every entry
must follow its predecessor (sequence, parent hash, fencing token never
decreasing). An entry signed by a writer the chain had already moved past (a
former owner with its old epoch's key after the seal, or a restarted node's
earlier incarnation) is void (`SupersededEntry`): readers pass over it, so a
fenced writer can neither be restored from nor stop its successor's readers.
Any other break is rejected with `BrokenManifestChain`, naming the object.

``manifests/p/current.json`` is a CAS pointer to the newest entry; readers roll
forward over history entries it has not caught up with, so no listing is needed
(the chain is a `versioned.VersionedObject`; its keys are spelled in `keys`).

Every entry is signed with the private key of the grant of its fencing token
(`signing`): the publisher with its grant's key, a seal with the key of the
grant it seals at. Store policies let any node write under ``manifests/``, so
an entry that does not verify against its grant's public key is forged and
void: readers pass over it (`ManifestReader`), a writer whose sequence number
it took moves on to the next, and nothing it names is ever read or restored.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from pydantic import Field

from .capabilities import ManifestKey, OutputCommitter, ReadStore, manifest_key
from .errors import ConflictError, CorruptDataError
from .fencing import ConditionalPutFailed, FencingToken
from .identity import UNASSIGNED, PartitionId
from .keys import manifest_history_key, manifest_pointer_key, node_key
from .records import (
    CorruptLedgerObject,
    LedgerError,
    NodeRecord,
    Record,
    SignedRecord,
    new_write_id,
    now,
    parse_record,
)
from .signing import ForgedRecord, GrantKeys, SigningKey, SigningKeys, sign_record
from .store import ObjectStore, PreconditionFailed, StoredObject
from .ulid import next_ulid
from .versioned import VersionedObject, VersionedReader

SHA256_METADATA = "x-laminar-sha256"

log = logging.getLogger(__name__)


# --- records ----------------------------------------------------------------


class ArtifactRef(Record):
    """An object a manifest depends on, verified by HEAD (size and checksum), never by listing."""

    key: str
    size: int = Field(ge=0)
    sha256: str = Field(min_length=64, max_length=64)


class SnapshotFile(Record):
    """One file of a local store snapshot, uploaded as its own create-only object."""

    name: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._-]+$")
    ref: ArtifactRef


class SnapshotRef(Record):
    """A consistent copy of a partition's local store: every file, and the offset it reflects.

    Files are shared between snapshots of one lineage (an unchanged SST file is
    uploaded once and named again), so a new snapshot uploads only new files.
    """

    source_offset: int = Field(ge=0)
    files: list[SnapshotFile]

    @property
    def size(self) -> int:
        return sum(f.ref.size for f in self.files)


class DeltaRef(Record):
    """The full new values of the keys one commit touched, for source offsets [start_offset, end_offset)."""

    ref: ArtifactRef
    start_offset: int = Field(ge=0)
    end_offset: int = Field(ge=0)
    rows: int = Field(ge=0)


class PartitionManifest(SignedRecord):
    """One commit of one partition, signed with the key of the grant of its `fencing_token`."""

    kind: Literal["partition-manifest"] = "partition-manifest"
    partition: int = Field(ge=0)
    seq: int = Field(ge=1)
    #: The partition epoch of the writer; must never go down.
    fencing_token: int = Field(ge=1)
    #: The writer's node; 0 only on a seal made by a fence to "unassigned".
    node: int = Field(ge=0)
    generation: int = Field(ge=0)
    commit_ulid: str = Field(min_length=26, max_length=26)
    #: sha256 of the previous manifest's raw stored bytes; None only for seq 1.
    parent_hash: str | None
    cluster_epoch: int = Field(ge=0)
    #: Source offset reached: every event below it is reflected in state/outputs.
    source_offset: int = Field(ge=0)
    #: The newest uploaded snapshot of the state (None: the state starts empty).
    snapshot: SnapshotRef | None = None
    #: Every commit's delta after the snapshot, in order; snapshot + deltas = state at `source_offset`.
    deltas: list[DeltaRef] = Field(default_factory=list)
    outputs: list[ArtifactRef]
    #: Total events applied since the partition began (for audits).
    events_applied: int = Field(ge=0)
    note: str = ""
    committed_at: datetime
    write_id: str = Field(default_factory=new_write_id)

    @property
    def is_seal(self) -> bool:
        """A seal: the entry a grant puts on the chain (no outputs, the previous offset and state)."""
        return self.note.startswith(SEAL_NOTE) and not self.outputs

    def artifacts(self) -> list[ArtifactRef]:
        """Every object this manifest names (state checkpoint objects and outputs): the sweep keeps them."""
        files = [f.ref for f in self.snapshot.files] if self.snapshot else []
        return files + [d.ref for d in self.deltas] + list(self.outputs)

    @property
    def state_offset(self) -> int:
        """The source offset the snapshot reflects (0 without one)."""
        return self.snapshot.source_offset if self.snapshot else 0

    def validate_succession(self, previous: PartitionManifest, previous_raw_hash: str, *, skipped: int = 0) -> None:
        """Raise a SuccessionError unless this manifest may follow `previous`.

        `skipped` forged entries (void: no part of the chain) may stand between the two.
        """
        if self.seq != previous.seq + 1 + skipped:
            raise SequenceGap(PartitionId(self.partition), previous.seq, self.seq)
        if self.fencing_token < previous.fencing_token:
            raise StaleFencingToken(PartitionId(self.partition), self.fencing_token, previous.fencing_token)
        if (
            self.fencing_token == previous.fencing_token
            and self.node == previous.node
            and self.generation < previous.generation
        ):
            # A restarted node re-adopts its epoch; its earlier incarnation is fenced by generation.
            raise StaleGeneration(
                PartitionId(self.partition),
                self.fencing_token,
                previous.fencing_token,
                self.generation,
                previous.generation,
            )
        if self.commit_ulid <= previous.commit_ulid:
            raise CommitUlidRegression(PartitionId(self.partition), previous.commit_ulid, self.commit_ulid)
        if self.parent_hash != previous_raw_hash:
            raise ParentHashMismatch(PartitionId(self.partition), previous_raw_hash, self.parent_hash)
        if self.source_offset < previous.source_offset:
            raise SourceOffsetRegression(PartitionId(self.partition), previous.source_offset, self.source_offset)


#: How a seal's note begins (`PartitionManifest.is_seal`).
SEAL_NOTE = "seal"


# --- errors -----------------------------------------------------------------


class SuccessionError(LedgerError, ConflictError):
    """A manifest that may not follow its predecessor."""


@dataclass
class StaleFencingToken(ConditionalPutFailed):
    """Publish with a fencing token below the current manifest's: the writer lost ownership."""

    def __str__(self) -> str:
        return (
            f"stale fencing token for partition {self.partition}: attempted {self.expected_epoch} "
            f"< current {self.actual_epoch}"
        )


@dataclass
class StaleGeneration(ConditionalPutFailed):
    """Publish by an earlier incarnation of the owner: a restarted process of the same node re-adopted
    the epoch and sealed the chain at its newer generation."""

    generation: int
    current_generation: int

    def __str__(self) -> str:
        return (
            f"stale generation for partition {self.partition} at epoch {self.actual_epoch}: "
            f"attempted generation {self.generation} < current {self.current_generation}"
        )


@dataclass
class SequenceGap(SuccessionError):
    partition: PartitionId
    previous: int
    attempted: int

    def __str__(self) -> str:
        return f"manifest seq of partition {self.partition} must follow {self.previous}, got {self.attempted}"


@dataclass
class CommitUlidRegression(SuccessionError):
    partition: PartitionId
    previous: str
    attempted: str

    def __str__(self) -> str:
        return f"commit_ulid regression on partition {self.partition}: {self.previous} -> {self.attempted}"


@dataclass
class ParentHashMismatch(SuccessionError):
    partition: PartitionId
    expected: str
    actual: str | None

    def __str__(self) -> str:
        return f"parent hash mismatch on partition {self.partition}: expected {self.expected}, got {self.actual}"


@dataclass
class SourceOffsetRegression(SuccessionError):
    partition: PartitionId
    previous: int
    attempted: int

    def __str__(self) -> str:
        return f"source offset regression on partition {self.partition}: {self.previous} -> {self.attempted}"


@dataclass
class SupersededEntry(LedgerError, ConflictError):
    """A genuinely signed entry written after the chain moved past its writer: under an epoch lower
    than the entry before it (a former owner, with its old epoch's key, after the seal that fenced
    it), or by an earlier incarnation of the same node at its epoch.

    It is void, like a forged entry: readers pass over it and nothing it names counts.
    """

    partition: PartitionId
    key: str
    epoch: int
    node: int
    reason: str

    def __str__(self) -> str:
        return (
            f"superseded entry {self.key!r} of partition {self.partition} "
            f"(node {self.node}, epoch {self.epoch}): {self.reason}"
        )


@dataclass
class BrokenManifestChain(SuccessionError):
    """A stored history entry that may not follow its predecessor: readers refuse to roll past it.

    Only a writer that bypassed the publisher's fencing (or a corrupted store)
    can create one; nothing overwrites it, an operator must look at `key`.
    """

    partition: PartitionId
    key: str
    reason: str

    def __str__(self) -> str:
        return f"manifest chain of partition {self.partition} is broken at {self.key!r}: {self.reason}"


@dataclass
class SealContended(SuccessionError):
    """The seal kept losing its sequence number to concurrent publishes under the old epoch."""

    partition: PartitionId
    epoch: int
    attempts: int

    def __str__(self) -> str:
        return (
            f"could not seal the manifest chain of partition {self.partition} at epoch {self.epoch}: "
            f"lost the next sequence number {self.attempts} times"
        )


@dataclass
class PublishContended(SuccessionError):
    """A publish kept losing its sequence number to forged entries (a writer without the grant's key)."""

    partition: PartitionId
    epoch: int
    attempts: int

    def __str__(self) -> str:
        return (
            f"could not publish to the manifest chain of partition {self.partition} at epoch {self.epoch}: "
            f"forged entries took the next sequence number {self.attempts} times"
        )


@dataclass
class ArtifactMissing(LedgerError, CorruptDataError):
    key: str

    def __str__(self) -> str:
        return f"artifact {self.key!r} named by a manifest does not exist"


@dataclass
class ArtifactMismatch(LedgerError, CorruptDataError):
    key: str
    field: str
    expected: str
    actual: str

    def __str__(self) -> str:
        return f"artifact {self.key!r}: {self.field} is {self.actual}, manifest says {self.expected}"


# --- reading and publishing ---------------------------------------------------


@dataclass(frozen=True)
class ManifestVersion:
    """A manifest with the raw bytes it was stored as (for the parent hash)."""

    manifest: PartitionManifest
    raw: bytes

    @property
    def raw_hash(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()


@dataclass(frozen=True)
class ManifestUpdate:
    """What a commit wants to make visible."""

    source_offset: int
    snapshot: SnapshotRef | None = None
    deltas: Sequence[DeltaRef] = ()
    outputs: Sequence[ArtifactRef] = ()
    events_applied: int = 0
    cluster_epoch: int = 0
    generation: int = 0
    note: str = ""


@dataclass(frozen=True)
class ChainRead:
    """A chain as read: its newest genuine entry, the pointer's ETag, the first sequence number nobody took."""

    version: ManifestVersion | None
    pointer_etag: str | None
    #: Past every entry written, forged ones included: where the next entry goes.
    next_seq: int


def _decode_manifest(obj: StoredObject) -> ManifestVersion:
    return ManifestVersion(parse_record(obj.key, obj.data, PartitionManifest), obj.data)


def _same(a: ManifestVersion | None, b: ManifestVersion | None) -> bool:
    return (a.raw if a else None) == (b.raw if b else None)


#: How many void (forged or superseded) entries a reader keeps for an audit to report.
_VOID_KEPT = 10_000


class ManifestReader:
    """Reads current manifests and their history by explicit keys, passing over forged entries.

    An entry counts only when the key of the grant of its `fencing_token` signed
    it, for this partition, at the sequence number it is stored under, and the
    grant names its node (`signing.GrantKeys`). A forged entry is void: the walk
    steps over it, and the next genuine entry must follow the last genuine one
    (parent hash, tokens, sequence number counting the void entries between).
    The forged entries seen are kept in `forged` (an audit reports them).

    The pointer is a hint, never trusted for more than where to start: a forged
    pointer is ignored; a genuine one is used only when the entry reached from
    it belongs to an epoch not yet superseded (its signer is the current owner
    or the control plane) or this reader checked the chain up to it before.
    Otherwise the walk restarts from the newest entry this reader checked, or
    from the first entry. That keeps a former owner, who still holds its old
    epoch's key, from steering readers past the seal that fenced it.
    """

    def __init__(self, store: ObjectStore, *, signing_keys: SigningKeys | None = None) -> None:
        self._reads = ReadStore(store)
        self.grant_keys = GrantKeys(self._reads)
        self.signing_keys = signing_keys or SigningKeys(self._reads)
        #: The newest entry of each partition reached link by link from a trusted start (entries never change).
        self._trusted: dict[int, ManifestVersion] = {}
        #: Forged objects seen, by key.
        self.forged: dict[str, ForgedRecord] = {}
        #: Genuine entries of writers the chain had already moved past, by key (void like forged ones).
        self.superseded: dict[str, SupersededEntry] = {}

    def _chain(self, partition: int) -> VersionedReader[ManifestVersion | None, ManifestKey]:
        return VersionedReader(
            self._reads,
            entry_key=lambda seq: manifest_key(manifest_history_key(partition, seq)),
            pointer_key=manifest_key(manifest_pointer_key(partition)),
            decode=lambda seq, obj: self._genuine(partition, seq, obj),
        )

    def _genuine(self, partition: int, seq: int | None, obj: StoredObject) -> ManifestVersion | None:
        """`obj` as a manifest of `partition` (at `seq`, for a history entry) if genuine; None if forged."""
        try:
            version = _decode_manifest(obj)
        except CorruptLedgerObject as exc:
            # Anyone with write access to the prefix can store bytes that do not parse: forged too.
            self._forged(ForgedRecord(PartitionId(partition), obj.key, 0, f"does not parse: {exc.reason}"))
            return None
        m = version.manifest
        reason: str | None
        if m.partition != partition:
            reason = f"names partition {m.partition}"
        elif seq is not None and m.seq != seq:
            reason = f"names sequence number {m.seq}"
        else:
            grant = self.grant_keys.grant(partition, m.fencing_token)
            if grant is not None and grant.public_key is None:
                # A grant made before grants carried keys: nothing at its epoch can be verified, and
                # passing over the whole chain would restore nothing. Stop instead (fail closed).
                raise ForgedRecord(
                    PartitionId(partition), obj.key, m.fencing_token, "its epoch's grant carries no public key"
                )
            reason = self.grant_keys.problem(m, partition, m.fencing_token, m.node)
        if reason is not None:
            self._forged(ForgedRecord(PartitionId(partition), obj.key, m.fencing_token, reason))
            return None
        return version

    def _forged(self, record: ForgedRecord) -> None:
        if record.key not in self.forged:
            log.warning("%s; passed over", record)
        if len(self.forged) >= _VOID_KEPT:
            self.forged.clear()
        self.forged[record.key] = record

    def entry(self, partition: PartitionId, seq: int) -> ManifestVersion | None:
        """History entry `seq` if it is genuine (not checked against its neighbours); None if absent or forged."""
        entry = self._chain(partition).entry(seq) if seq >= 1 else None
        return entry.value if entry else None

    def parent(self, version: ManifestVersion) -> ManifestVersion | None:
        """The entry `version` follows: the one whose stored bytes hash to its `parent_hash`.

        Found by probing back from the sequence number below it, past void entries (forged, or
        written by a superseded writer) that may stand between the two: the chain is linked by
        parent hash, not by adjacent sequence numbers. None for the first entry, or when no entry
        below hashes to the parent (a chain broken below `version`).
        """
        m = version.manifest
        if m.parent_hash is None:
            return None
        for seq in range(m.seq - 1, 0, -1):
            obj = self._chain(m.partition).entry(seq)
            if obj is not None and hashlib.sha256(obj.raw).hexdigest() == m.parent_hash:
                return obj.value
        return None

    def current(self, partition: PartitionId) -> ManifestVersion | None:
        """The newest genuine manifest: from the pointer (or a trusted start), rolled forward."""
        return self.read_chain(partition).version

    def read_chain(self, partition: int) -> ChainRead:
        """The chain's newest genuine entry, the pointer's ETag and the next free sequence number."""
        chain = self._chain(partition)
        pointer = chain.pointer()
        trusted = self._trusted.get(partition)
        pointed: ManifestVersion | None
        if pointer is not None and trusted is not None and pointer.data == trusted.raw:
            pointed = trusted  # checked already (the usual case for the owner: its own last entry)
        else:
            pointed = self._genuine(partition, None, pointer) if pointer is not None else None
        start: ManifestVersion | None
        if trusted is not None and (pointed is None or pointed.manifest.seq <= trusted.manifest.seq):
            start, from_trust = trusted, True
        else:
            # No pointer (or a forged one) and nothing checked yet: from the first entry, which is trusted.
            start, from_trust = pointed, pointed is None
        if from_trust:
            version, next_seq = self._walk(partition, start)
        else:
            version, next_seq = self._walk_from_pointer(partition, start, trusted)
        if version is not None:
            self._trust(partition, version)
        return ChainRead(version, pointer.etag if pointer else None, next_seq)

    def _walk_from_pointer(
        self, partition: int, pointed: ManifestVersion | None, trusted: ManifestVersion | None
    ) -> tuple[ManifestVersion | None, int]:
        """`_walk` from an entry reached through the pointer alone, which is only a hint: a former
        owner still holds its old epoch's key, so it can sign an entry after the seal that fenced it
        and point the pointer there. The walk then ends on that entry (at a superseded epoch), or
        the genuine entries after it do not follow it (BrokenManifestChain): either way the chain is
        walked again from a trusted start (or the first entry), so a forged pointer stops no reader."""
        try:
            version, next_seq = self._walk(partition, pointed)
        except BrokenManifestChain:
            return self._walk(partition, trusted)
        if version is not None and self._writer_moved_past(partition, version.manifest):
            return self._walk(partition, trusted)
        return version, next_seq

    def _writer_moved_past(self, partition: int, m: PartitionManifest) -> bool:
        """Whether the ledger shows that the chain may have moved past `m`'s writer: a later epoch was
        granted, or the writing node has restarted since (its record carries a newer generation, and
        the restarted process seals the chain at it before it commits). Either way an entry reached
        through the pointer alone is not trusted: the walk from a trusted start decides."""
        if self.grant_keys.superseded(partition, m.fencing_token):
            return True
        if m.node == UNASSIGNED:
            return False
        record = self._reads.get(node_key(m.node))
        if record is None:
            return False
        return parse_record(record.key, record.data, NodeRecord).generation > m.generation

    def _trust(self, partition: int, version: ManifestVersion) -> None:
        known = self._trusted.get(partition)
        if known is None or known.manifest.seq < version.manifest.seq:
            self._trusted[partition] = version

    def _walk(self, partition: int, start: ManifestVersion | None) -> tuple[ManifestVersion | None, int]:
        """Roll forward from `start` (None: from the first entry) over every entry written, skipping forged ones.

        Each genuine entry must follow the last genuine one (`validate_succession`),
        else BrokenManifestChain naming it. Returns the newest genuine entry and the
        sequence number after the last entry written.
        """
        version = start
        seq = start.manifest.seq + 1 if start else 1
        skipped = 0
        for entry in self._chain(partition).roll_forward(seq):
            seq = entry.position + 1
            if entry.value is None:
                skipped += 1
                continue
            m = entry.value.manifest
            if version is not None:
                # Succession is enforced here, not only by honest publishers: an entry under a
                # lower epoch than its predecessor (a write after the seal) is never rolled onto.
                if not self._follows(partition, entry.key, entry.value, version, skipped, strict=True):
                    skipped += 1
                    continue
            elif m.parent_hash is not None:
                raise BrokenManifestChain(PartitionId(partition), entry.key, "the first entry names a parent")
            version, skipped = entry.value, 0
        return version, seq

    def _follows(
        self,
        partition: int,
        key: str,
        entry: ManifestVersion,
        previous: ManifestVersion,
        skipped: int,
        *,
        strict: bool,
    ) -> bool:
        """Whether `entry` may follow `previous`; False for a superseded writer's entry (void, recorded).

        A former owner keeps its old epoch's key, and a restarted node's earlier incarnation its
        generation: what they sign after the chain moved past them is void, so it cannot stop
        readers. Any other break is BrokenManifestChain when `strict` (an audit reports it itself).
        """
        try:
            entry.manifest.validate_succession(previous.manifest, previous.raw_hash, skipped=skipped)
        except (StaleFencingToken, StaleGeneration) as exc:
            m = entry.manifest
            found = SupersededEntry(PartitionId(partition), key, m.fencing_token, m.node, str(exc))
            if key not in self.superseded:
                log.warning("%s; passed over", found)
                if len(self.superseded) >= _VOID_KEPT:
                    self.superseded.clear()  # kept for audits; a long-lived reader must not grow without bound
            self.superseded[key] = found
            return False
        except (SuccessionError, ConditionalPutFailed) as exc:
            if strict:
                raise BrokenManifestChain(PartitionId(partition), key, str(exc)) from exc
        return True

    def history(self, partition: PartitionId) -> Iterator[ManifestVersion]:
        """Every genuine manifest from seq 1, in order (an audit path: one GET per entry).

        Forged entries and superseded writers' entries are passed over (kept in `forged` and
        `superseded`); other breaks of succession are left for the caller to check.
        """
        previous: ManifestVersion | None = None
        skipped = 0
        for entry in self._chain(partition).roll_forward(1):
            if entry.value is None or (
                previous is not None
                and not self._follows(partition, entry.key, entry.value, previous, skipped, strict=False)
            ):
                skipped += 1
                continue
            yield entry.value
            previous, skipped = entry.value, 0


class ManifestWrites(Protocol):
    """The manifest half of a write capability (`OutputCommitter`, `ManifestSealer`)."""

    def create_manifest(self, key: ManifestKey, data: bytes, metadata: Mapping[str, str] | None = None) -> str: ...

    def swap_manifest(self, key: ManifestKey, data: bytes, etag: str) -> str: ...


#: A seal retries on top of each publish that beat it to a sequence number; only a writer
#: under the old epoch publishing in a tight loop could make it lose this often.
_SEAL_ATTEMPTS = 50
#: A publish moves past forged entries that take its sequence number this many times at most.
_PUBLISH_ATTEMPTS = 50


class ChainSealer(ManifestReader):
    """Seals manifest chains: the part of granting an epoch that fences the manifest history."""

    def __init__(self, writer: ManifestWrites, store: ObjectStore, *, signing_keys: SigningKeys | None = None) -> None:
        super().__init__(store, signing_keys=signing_keys)
        self._committer = writer

    def _writable_chain(self, partition: int) -> VersionedObject[ManifestVersion, ManifestKey]:
        return VersionedObject(
            self._reads,
            entry_key=lambda seq: manifest_key(manifest_history_key(partition, seq)),
            pointer_key=manifest_key(manifest_pointer_key(partition)),
            decode=lambda _seq, obj: _decode_manifest(obj),
            create=self._committer.create_manifest,
            swap=self._committer.swap_manifest,
        )

    def seal(
        self,
        partition: PartitionId,
        epoch: int,
        *,
        node: int,
        generation: int = 0,
        reason: str = "",
        signing_key: SigningKey | None = None,
    ) -> ManifestVersion:
        """Make sure the chain's newest entry carries a fencing token >= `epoch`; return that entry.

        Idempotent: when the chain is already sealed at `epoch` (or an owner at
        `epoch` or later has published), nothing is written and the newest entry
        is returned, so a caller can tell it was superseded (token > `epoch`).
        At `epoch` itself, a newer `generation` of the same `node` (a restarted
        process re-adopting its grant) seals again, which fences its earlier
        incarnation out (`StaleGeneration`).
        Otherwise the seal is created as the next entry: a copy of the newest
        manifest (offset, state, events applied and any other field carry over)
        under `epoch` with no outputs, or an empty first entry. A publish under
        an older epoch that wins a sequence number first is the old owner's last
        commit; the seal goes on top of it (and past forged entries).
        The seal is signed with the key of the grant of `epoch` (`signing_key`,
        else read for `node`: the grantee's own, or any for the control plane).
        """
        for _ in range(_SEAL_ATTEMPTS):
            read = self.read_chain(partition)
            previous = read.version
            if previous is not None and previous.manifest.fencing_token >= epoch:
                newer_incarnation = (
                    previous.manifest.fencing_token == epoch
                    and previous.manifest.node == node
                    and previous.manifest.generation < generation
                )
                if not newer_incarnation:
                    return previous
            note = f"{SEAL_NOTE} at epoch {epoch}" + (f": {reason}" if reason else "")
            if previous is None:
                manifest = PartitionManifest(
                    partition=partition,
                    seq=read.next_seq,
                    fencing_token=epoch,
                    node=node,
                    generation=generation,
                    commit_ulid=next_ulid(),
                    parent_hash=None,
                    cluster_epoch=0,
                    source_offset=0,
                    outputs=[],
                    events_applied=0,
                    note=note,
                    committed_at=now(),
                )
            else:
                prev = previous.manifest
                # A copy, so fields added to manifests later carry over without touching this.
                manifest = prev.model_copy(
                    update={
                        "seq": read.next_seq,
                        "fencing_token": epoch,
                        "node": node,
                        "generation": generation,
                        "commit_ulid": next_ulid(prev.commit_ulid),
                        "parent_hash": previous.raw_hash,
                        "outputs": [],
                        "note": note,
                        "committed_at": now(),
                        "write_id": new_write_id(),
                        "signature": None,
                    }
                )
                manifest.validate_succession(prev, previous.raw_hash, skipped=read.next_seq - prev.seq - 1)
            key = signing_key or self.signing_keys.get(node, partition, epoch)
            manifest = sign_record(manifest, key)
            raw = manifest.model_dump_json().encode()
            try:
                self._writable_chain(partition).create(manifest.seq, raw)
            except PreconditionFailed:
                continue  # the old owner's last commit (or a forged entry) took this seq: seal on top of it
            version = ManifestVersion(manifest, raw)
            self._trust(partition, version)
            self._move_pointer(partition, raw, read.pointer_etag)
            return version
        raise SealContended(partition, epoch, _SEAL_ATTEMPTS)

    def _move_pointer(self, partition: int, raw: bytes, pointer_etag: str | None) -> None:
        # The pointer is a cache; losing this CAS only means a reader rolls forward.
        with contextlib.suppress(PreconditionFailed):
            self._writable_chain(partition).move_pointer(raw, pointer_etag)


class ManifestPublisher(ChainSealer):
    """Publishes manifests. Holds the `OutputCommitter` capability."""

    def __init__(
        self, committer: OutputCommitter, store: ObjectStore, *, signing_keys: SigningKeys | None = None
    ) -> None:
        super().__init__(committer, store, signing_keys=signing_keys)

    def publish(self, token: FencingToken, update: ManifestUpdate) -> ManifestVersion:
        """Commit `update` for `token.partition`, fenced by `token.epoch`, signed with its grant's key.

        Raises StaleFencingToken if the chain was sealed (or published) at a
        newer epoch, and ConditionalPutFailed if that happened concurrently
        (the seal took our sequence number). A forged entry that takes our
        sequence number is passed over: the commit goes to the next one.
        SigningKeyUnavailable if this node cannot read its grant's key.
        """
        p = token.partition
        key = self.signing_keys.get(token.node, p, token.epoch)
        read = self.read_chain(p)
        for _ in range(_PUBLISH_ATTEMPTS):
            previous = read.version
            if previous is not None and token.epoch < previous.manifest.fencing_token:
                raise StaleFencingToken(p, token.epoch, previous.manifest.fencing_token)
            manifest = PartitionManifest(
                partition=p,
                seq=read.next_seq,
                fencing_token=token.epoch,
                node=token.node,
                generation=update.generation,
                commit_ulid=next_ulid(previous.manifest.commit_ulid if previous else None),
                parent_hash=previous.raw_hash if previous else None,
                cluster_epoch=update.cluster_epoch,
                source_offset=update.source_offset,
                snapshot=update.snapshot,
                deltas=list(update.deltas),
                outputs=list(update.outputs),
                events_applied=update.events_applied,
                note=update.note,
                committed_at=now(),
            )
            if previous is not None:
                skipped = read.next_seq - previous.manifest.seq - 1
                manifest.validate_succession(previous.manifest, previous.raw_hash, skipped=skipped)
            manifest = sign_record(manifest, key)
            raw = manifest.model_dump_json().encode()
            try:
                # The linearization point of a commit: one writer per sequence number.
                self._writable_chain(p).create(manifest.seq, raw)
            except PreconditionFailed:
                again = self.read_chain(p)
                if _same(again.version, previous):
                    read = again  # only a forged entry took the number: no genuine writer moved the chain
                    continue
                actual = again.version.manifest.fencing_token if again.version else token.epoch
                raise ConditionalPutFailed(p, token.epoch, actual) from None
            version = ManifestVersion(manifest, raw)
            self._trust(p, version)
            self._move_pointer(p, raw, read.pointer_etag)
            return version
        raise PublishContended(p, token.epoch, _PUBLISH_ATTEMPTS)

    def landed(self, token: FencingToken, update: ManifestUpdate) -> ManifestVersion | None:
        """After a publish whose outcome is unknown (its response was lost): the commit if it landed.

        It landed iff the chain's newest entry is ours: our epoch, our source offset, our outputs.
        Outputs are named per commit, so no other commit carries the same ones.
        """
        current = self.current(token.partition)
        if (
            current is not None
            and current.manifest.fencing_token == token.epoch
            and current.manifest.source_offset == update.source_offset
            and [o.key for o in current.manifest.outputs] == [o.key for o in update.outputs]
        ):
            return current
        return None


def artifact_ref(key: str, data: bytes) -> ArtifactRef:
    return ArtifactRef(key=key, size=len(data), sha256=hashlib.sha256(data).hexdigest())


def verify_artifacts(store: ObjectStore, manifest: PartitionManifest) -> None:
    """Check every artifact a manifest names by HEAD: present, right size, right checksum."""
    for ref in manifest.artifacts():
        meta = store.head(ref.key)
        if meta is None:
            raise ArtifactMissing(ref.key)
        if meta.size != ref.size:
            raise ArtifactMismatch(ref.key, "size", str(ref.size), str(meta.size))
        recorded = meta.metadata.get(SHA256_METADATA)
        if recorded != ref.sha256:
            raise ArtifactMismatch(ref.key, "sha256", ref.sha256, str(recorded))
