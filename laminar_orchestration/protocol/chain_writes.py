"""Writing a partition's manifest chain: sealing it at a granted epoch and publishing an owner's commits.

`ChainSealer` seals the chain when the ledger grants an epoch; `ManifestPublisher`, an owner's, publishes
its commits. Both extend `chain.ManifestReader`: they read the chain as it does, by the rules of
`protocol.manifest`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.capabilities import ManifestKey, OutputCommitter, manifest_key
from laminar_orchestration.protocol.chain import ChainRead, ManifestReader, ManifestVersion, decode_manifest
from laminar_orchestration.protocol.fencing import ConditionalPutFailed, FencingToken
from laminar_orchestration.protocol.keys import manifest_history_key, manifest_pointer_key
from laminar_orchestration.protocol.manifest import (
    SEAL_NOTE,
    ArtifactRef,
    DeltaRef,
    EventTimeRecord,
    PartitionManifest,
    PublishContended,
    SealContended,
    SnapshotRef,
    StaleFencingToken,
)
from laminar_orchestration.protocol.records import new_write_id, now
from laminar_orchestration.protocol.signing import SigningKey, SigningKeys, sign_record
from laminar_orchestration.protocol.versioned import VersionedObject
from laminar_orchestration.store import ObjectStore, PreconditionFailed
from laminar_orchestration.ulid import next_ulid


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
    event_time: EventTimeRecord | None = None


def next_manifest(token: FencingToken, update: ManifestUpdate, read: ChainRead) -> PartitionManifest:
    """The entry `token` writes for `update` on top of the chain as `read` saw it: unsigned, unchecked."""
    previous = read.version
    return PartitionManifest(
        partition=token.partition,
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
        event_time=update.event_time,
    )


def _same(a: ManifestVersion | None, b: ManifestVersion | None) -> bool:
    return (a.raw if a else None) == (b.raw if b else None)


class ManifestWrites(Protocol):
    """The manifest half of a write capability (`OutputCommitter`, `ManifestSealer`)."""

    def create_manifest(self, key: ManifestKey, data: bytes, metadata: Mapping[str, str] | None = None) -> str: ...

    def swap_manifest(self, key: ManifestKey, data: bytes, etag: str) -> str: ...


#: A seal retries on top of each publish that beat it to a sequence number; only a writer
#: under the old epoch publishing in a tight loop could make it lose this often.
_SEAL_ATTEMPTS = 50
#: A publish moves past forged entries that take its sequence number this many times at most.
_PUBLISH_ATTEMPTS = 50
#: An owner moves the pointer once per this many of its entries (and when it releases): a reader
#: rolls forward over at most this many entries past the pointer, one GET each.
POINTER_EVERY = 8


@dataclass(frozen=True)
class _OwnTip:
    """The newest entry this publisher wrote on a chain, and where the pointer stood after its own last move."""

    version: ManifestVersion
    pointer_etag: str | None
    pointer_seq: int


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
            decode=lambda _seq, obj: decode_manifest(obj),
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
        first_read: ChainRead | None = None,
    ) -> ManifestVersion:
        """Make sure the chain's newest entry carries a fencing token >= `epoch`; return that entry.

        Idempotent: when the chain is already sealed at `epoch` (or an owner at `epoch` or later has published),
        nothing is written and the newest entry is returned, so a caller can tell it was superseded (token >
        `epoch`). At `epoch` itself, a newer `generation` of the same `node` (a restarted process re-adopting
        its grant) seals again, which fences its earlier incarnation out (`StaleGeneration`). Otherwise the seal
        is created as the next entry: a copy of the newest manifest (offset, state, events applied and any other
        field carry over) under `epoch` with no outputs, or an empty first entry. A publish under an older epoch
        that wins a sequence number first is the old owner's last commit; the seal goes on top of it (and past
        forged entries). The seal is signed with the key of the grant of `epoch` (`signing_key`, else read for
        `node`: the grantee's own, or any for the control plane). `first_read`: the chain as this process read
        it just before (the first attempt seals on top of it without reading again: an entry written since takes
        the seal's sequence number, and the create-only write then fails and the chain is read again).
        """
        for attempt in range(_SEAL_ATTEMPTS):
            read = first_read if attempt == 0 and first_read is not None else self.read_chain(partition)
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

    def _move_pointer(self, partition: int, raw: bytes, pointer_etag: str | None) -> str | None:
        """Move the pointer to `raw` if it is still at `pointer_etag`; its new ETag, None if it had moved.

        The pointer is a cache; losing this CAS only means a reader rolls forward."""
        try:
            return self._writable_chain(partition).move_pointer(raw, pointer_etag)
        except PreconditionFailed:
            return None


class ManifestPublisher(ChainSealer):
    """Publishes manifests. Holds the `OutputCommitter` capability."""

    def __init__(
        self, committer: OutputCommitter, store: ObjectStore, *, signing_keys: SigningKeys | None = None
    ) -> None:
        super().__init__(committer, store, signing_keys=signing_keys)
        #: Per partition, the entry this publisher wrote last and the pointer as it left it.
        self._tips: dict[int, _OwnTip] = {}

    def publish(self, token: FencingToken, update: ManifestUpdate) -> ManifestVersion:
        """Commit `update` for `token.partition`, fenced by `token.epoch`, signed with its grant's key.

        Raises StaleFencingToken if the chain was sealed (or published) at a
        newer epoch, and ConditionalPutFailed if that happened concurrently
        (the seal took our sequence number). A forged entry that takes our
        sequence number is passed over: the commit goes to the next one.
        SigningKeyUnavailable if this node cannot read its grant's key.

        An owner that wrote the chain's newest entry it knows of writes the next one without
        reading the chain first: the create-only write at the following sequence number is the
        check (any entry written since, a seal above all, holds that number and refuses it).
        The pointer moves once per `POINTER_EVERY` entries; `flush_pointer` catches it up.
        """
        p = token.partition
        key = self.signing_keys.get(token.node, p, token.epoch)
        tip = self._tips.get(p)
        if (
            tip is not None
            and self._trusted.get(p) is tip.version
            and tip.version.manifest.fencing_token == token.epoch
        ):
            read = ChainRead(tip.version, tip.pointer_etag, tip.version.manifest.seq + 1)
        else:
            tip = None
            read = self.read_chain(p)
        for _ in range(_PUBLISH_ATTEMPTS):
            previous = read.version
            if previous is not None and token.epoch < previous.manifest.fencing_token:
                raise StaleFencingToken(p, token.epoch, previous.manifest.fencing_token)
            manifest = next_manifest(token, update, read)
            if previous is not None:
                skipped = read.next_seq - previous.manifest.seq - 1
                manifest.validate_succession(previous.manifest, previous.raw_hash, skipped=skipped)
            manifest = sign_record(manifest, key)
            raw = manifest.model_dump_json().encode()
            try:
                # The linearization point of a commit: one writer per sequence number.
                self._writable_chain(p).create(manifest.seq, raw)
            except PreconditionFailed:
                self._tips.pop(p, None)
                again = self.read_chain(p)
                if _same(again.version, previous):
                    read, tip = again, None  # only a forged entry took the number: no genuine writer moved it
                    continue
                actual = again.version.manifest.fencing_token if again.version else token.epoch
                if tip is not None and actual > token.epoch:
                    # Written without reading first: the seal may well be older than this attempt.
                    raise StaleFencingToken(p, token.epoch, actual) from None
                raise ConditionalPutFailed(p, token.epoch, actual) from None
            version = ManifestVersion(manifest, raw)
            self._trust(p, version)
            if tip is not None and manifest.seq - tip.pointer_seq < POINTER_EVERY:
                self._tips[p] = _OwnTip(version, tip.pointer_etag, tip.pointer_seq)
            else:
                self._point_at(p, version, read.pointer_etag)
            return version
        raise PublishContended(p, token.epoch, _PUBLISH_ATTEMPTS)

    def _point_at(self, partition: int, version: ManifestVersion, pointer_etag: str | None) -> None:
        """Move the pointer to `version`, this publisher's newest entry. If someone else moved it
        since `pointer_etag` (an intruder, or a seal) and `version` is still the chain's newest
        genuine entry, the pointer is put back on it; a seal's move stands."""
        etag = self._move_pointer(partition, version.raw, pointer_etag)
        if etag is None:
            again = self.read_chain(partition)
            if again.version is not None and again.version.raw == version.raw:
                etag = self._move_pointer(partition, version.raw, again.pointer_etag)
        if etag is None:
            self._tips.pop(partition, None)  # read the chain before the next publish
        else:
            self._tips[partition] = _OwnTip(version, etag, version.manifest.seq)

    def flush_pointer(self, partition: int) -> None:
        """Move the pointer to this publisher's newest entry if it lags it (before a release or stop),
        so the next owner's first read does not roll forward over the entries since."""
        tip = self._tips.get(partition)
        if tip is not None and tip.pointer_seq < tip.version.manifest.seq:
            self._point_at(partition, tip.version, tip.pointer_etag)

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
