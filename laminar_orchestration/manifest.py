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
decreasing), so an entry made by a writer that skipped the client-side check
is rejected with `BrokenManifestChain`, naming the object.

``manifests/p/current.json`` is a CAS pointer to the newest entry; readers roll
forward over history entries it has not caught up with, so no listing is needed
(the chain is a `versioned.VersionedObject`; its keys are spelled in `keys`).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from pydantic import Field

from .capabilities import ManifestKey, OutputCommitter, ReadStore, manifest_key
from .errors import ConflictError, CorruptDataError
from .fencing import ConditionalPutFailed, FencingToken
from .identity import PartitionId
from .keys import manifest_history_key, manifest_pointer_key
from .records import LedgerError, Record, new_write_id, now, parse_record
from .store import ObjectStore, PreconditionFailed, StoredObject
from .ulid import next_ulid
from .versioned import VersionedObject, VersionedReader

SHA256_METADATA = "x-laminar-sha256"


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


class PartitionManifest(Record):
    """One commit of one partition."""

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

    def validate_succession(self, previous: PartitionManifest, previous_raw_hash: str) -> None:
        """Raise a SuccessionError unless this manifest may follow `previous`."""
        if self.seq != previous.seq + 1:
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


def _decode_manifest(obj: StoredObject) -> ManifestVersion:
    return ManifestVersion(parse_record(obj.key, obj.data, PartitionManifest), obj.data)


class ManifestReader:
    """Reads current manifests and their history by explicit keys."""

    def __init__(self, store: ObjectStore) -> None:
        self._reads = ReadStore(store)

    def _chain(self, partition: int) -> VersionedReader[ManifestVersion, ManifestKey]:
        return VersionedReader(
            self._reads,
            entry_key=lambda seq: manifest_key(manifest_history_key(partition, seq)),
            pointer_key=manifest_key(manifest_pointer_key(partition)),
            decode=lambda _seq, obj: _decode_manifest(obj),
        )

    def entry(self, partition: PartitionId, seq: int) -> ManifestVersion | None:
        """History entry `seq` as stored (not checked against its neighbours), or None."""
        entry = self._chain(partition).entry(seq) if seq >= 1 else None
        return entry.value if entry else None

    def current(self, partition: PartitionId) -> ManifestVersion | None:
        """The newest manifest: the pointer, rolled forward over newer history entries."""
        return self._current_with_etag(partition)[0]

    def _current_with_etag(self, partition: int) -> tuple[ManifestVersion | None, str | None]:
        chain = self._chain(partition)
        pointer = chain.pointer()
        version = _decode_manifest(pointer) if pointer else None
        for entry in chain.roll_forward(version.manifest.seq + 1 if version else 1):
            if version is not None:
                # Succession is enforced here, not only by honest publishers: an entry under a
                # lower epoch than its predecessor (a write after the seal) is never rolled onto.
                try:
                    entry.value.manifest.validate_succession(version.manifest, version.raw_hash)
                except (SuccessionError, StaleFencingToken) as exc:
                    raise BrokenManifestChain(PartitionId(partition), entry.key, str(exc)) from exc
            version = entry.value
        return version, pointer.etag if pointer else None

    def history(self, partition: PartitionId) -> Iterator[ManifestVersion]:
        """Every committed manifest from seq 1, in order (an audit path: one GET per entry)."""
        for entry in self._chain(partition).roll_forward(1):
            yield entry.value


class ManifestWrites(Protocol):
    """The manifest half of a write capability (`OutputCommitter`, `ManifestSealer`)."""

    def create_manifest(self, key: ManifestKey, data: bytes, metadata: Mapping[str, str] | None = None) -> str: ...

    def swap_manifest(self, key: ManifestKey, data: bytes, etag: str) -> str: ...


#: A seal retries on top of each publish that beat it to a sequence number; only a writer
#: under the old epoch publishing in a tight loop could make it lose this often.
_SEAL_ATTEMPTS = 50


class ChainSealer(ManifestReader):
    """Seals manifest chains: the part of granting an epoch that fences the manifest history."""

    def __init__(self, writer: ManifestWrites, store: ObjectStore) -> None:
        super().__init__(store)
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
        self, partition: PartitionId, epoch: int, *, node: int, generation: int = 0, reason: str = ""
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
        commit; the seal goes on top of it.
        """
        for _ in range(_SEAL_ATTEMPTS):
            previous, pointer_etag = self._current_with_etag(partition)
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
                    seq=1,
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
                        "seq": prev.seq + 1,
                        "fencing_token": epoch,
                        "node": node,
                        "generation": generation,
                        "commit_ulid": next_ulid(prev.commit_ulid),
                        "parent_hash": previous.raw_hash,
                        "outputs": [],
                        "note": note,
                        "committed_at": now(),
                        "write_id": new_write_id(),
                    }
                )
                manifest.validate_succession(prev, previous.raw_hash)
            raw = manifest.model_dump_json().encode()
            try:
                self._writable_chain(partition).create(manifest.seq, raw)
            except PreconditionFailed:
                continue  # the old owner's last commit took this seq: seal on top of it
            self._move_pointer(partition, raw, pointer_etag)
            return ManifestVersion(manifest, raw)
        raise SealContended(partition, epoch, _SEAL_ATTEMPTS)

    def _move_pointer(self, partition: int, raw: bytes, pointer_etag: str | None) -> None:
        # The pointer is a cache; losing this CAS only means a reader rolls forward.
        with contextlib.suppress(PreconditionFailed):
            self._writable_chain(partition).move_pointer(raw, pointer_etag)


class ManifestPublisher(ChainSealer):
    """Publishes manifests. Holds the `OutputCommitter` capability."""

    def __init__(self, committer: OutputCommitter, store: ObjectStore) -> None:
        super().__init__(committer, store)

    def publish(self, token: FencingToken, update: ManifestUpdate) -> ManifestVersion:
        """Commit `update` for `token.partition`, fenced by `token.epoch`.

        Raises StaleFencingToken if the chain was sealed (or published) at a
        newer epoch, and ConditionalPutFailed if that happened concurrently
        (the seal took our sequence number).
        """
        p = token.partition
        previous, pointer_etag = self._current_with_etag(p)
        if previous is not None and token.epoch < previous.manifest.fencing_token:
            raise StaleFencingToken(p, token.epoch, previous.manifest.fencing_token)
        manifest = PartitionManifest(
            partition=p,
            seq=previous.manifest.seq + 1 if previous else 1,
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
            manifest.validate_succession(previous.manifest, previous.raw_hash)
        raw = manifest.model_dump_json().encode()
        try:
            # The linearization point of a commit: one writer per sequence number.
            self._writable_chain(p).create(manifest.seq, raw)
        except PreconditionFailed:
            winner = self.current(p)
            actual = winner.manifest.fencing_token if winner else token.epoch
            raise ConditionalPutFailed(p, token.epoch, actual) from None
        self._move_pointer(p, raw, pointer_etag)
        return ManifestVersion(manifest, raw)


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
