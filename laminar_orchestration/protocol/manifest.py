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

import hashlib
import json
from datetime import datetime
from typing import Literal

from pydantic import Field

from laminar_orchestration.errors import ConflictError, CorruptDataError
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.fencing import ConditionalPutFailed
from laminar_orchestration.protocol.records import (
    LedgerError,
    Record,
    SignedRecord,
    new_write_id,
)
from laminar_orchestration.store import ObjectStore

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


class EventTimeRecord(Record):
    """A partition's event-time progress, committed with its offset so it moves exactly once."""

    #: The largest event time (epoch ms) of any event below the commit's offset.
    max_event_time: int
    #: Events found late (below the watermark) and not applied, since the partition began.
    late_events: int = Field(ge=0)


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
    #: The event-time progress at `source_offset` (None until an event with an event time was committed).
    event_time: EventTimeRecord | None = None

    def signed_bytes(self) -> bytes:
        # A manifest without event time signs exactly the bytes it did before the field existed.
        body = self.model_dump(
            mode="json", exclude={"signature"} | ({"event_time"} if self.event_time is None else set())
        )
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

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


class StaleFencingToken(ConditionalPutFailed):
    """Publish with a fencing token below the current manifest's: the writer lost ownership."""

    message = "stale fencing token for partition {partition}: attempted {expected_epoch} < current {actual_epoch}"


class StaleGeneration(ConditionalPutFailed):
    """Publish by an earlier incarnation of the owner: a restarted process of the same node re-adopted
    the epoch and sealed the chain at its newer generation."""

    generation: int
    current_generation: int

    message = (
        "stale generation for partition {partition} at epoch {actual_epoch}: "
        "attempted generation {generation} < current {current_generation}"
    )


class SequenceGap(SuccessionError):
    partition: PartitionId
    previous: int
    attempted: int

    message = "manifest seq of partition {partition} must follow {previous}, got {attempted}"


class CommitUlidRegression(SuccessionError):
    partition: PartitionId
    previous: str
    attempted: str

    message = "commit_ulid regression on partition {partition}: {previous} -> {attempted}"


class ParentHashMismatch(SuccessionError):
    partition: PartitionId
    expected: str
    actual: str | None

    message = "parent hash mismatch on partition {partition}: expected {expected}, got {actual}"


class SourceOffsetRegression(SuccessionError):
    partition: PartitionId
    previous: int
    attempted: int

    message = "source offset regression on partition {partition}: {previous} -> {attempted}"


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

    message = "superseded entry {key!r} of partition {partition} (node {node}, epoch {epoch}): {reason}"


class BrokenManifestChain(SuccessionError):
    """A stored history entry that may not follow its predecessor: readers refuse to roll past it.

    Only a writer that bypassed the publisher's fencing (or a corrupted store)
    can create one; nothing overwrites it, an operator must look at `key`.
    """

    partition: PartitionId
    key: str
    reason: str

    message = "manifest chain of partition {partition} is broken at {key!r}: {reason}"


class SealContended(SuccessionError):
    """The seal kept losing its sequence number to concurrent publishes under the old epoch."""

    partition: PartitionId
    epoch: int
    attempts: int

    message = (
        "could not seal the manifest chain of partition {partition} at epoch {epoch}: "
        "lost the next sequence number {attempts} times"
    )


class PublishContended(SuccessionError):
    """A publish kept losing its sequence number to forged entries (a writer without the grant's key)."""

    partition: PartitionId
    epoch: int
    attempts: int

    message = (
        "could not publish to the manifest chain of partition {partition} at epoch {epoch}: "
        "forged entries took the next sequence number {attempts} times"
    )


class ArtifactMissing(LedgerError, CorruptDataError):
    key: str

    message = "artifact {key!r} named by a manifest does not exist"


class ArtifactMismatch(LedgerError, CorruptDataError):
    key: str
    field: str
    expected: str
    actual: str

    message = "artifact {key!r}: {field} is {actual}, manifest says {expected}"


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
