"""Reading, sealing and publishing a partition's manifest chain (the records are in
`protocol.manifest`, whose docstring gives the rules this module enforces)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.protocol.capabilities import ManifestKey, OutputCommitter, ReadStore, manifest_key
from laminar_orchestration.protocol.fencing import ConditionalPutFailed, FencingToken
from laminar_orchestration.protocol.keys import manifest_history_key, manifest_pointer_key, node_key
from laminar_orchestration.protocol.manifest import (
    SEAL_NOTE,
    ArtifactRef,
    BrokenManifestChain,
    DeltaRef,
    EventTimeRecord,
    PartitionManifest,
    PublishContended,
    SealContended,
    SnapshotRef,
    StaleFencingToken,
    StaleGeneration,
    SuccessionError,
    SupersededEntry,
)
from laminar_orchestration.protocol.records import (
    CorruptLedgerObject,
    NodeRecord,
    new_write_id,
    now,
    parse_record,
)
from laminar_orchestration.protocol.signing import ForgedRecord, GrantKeys, SigningKey, SigningKeys, sign_record
from laminar_orchestration.protocol.versioned import VersionedObject, VersionedReader
from laminar_orchestration.store import ObjectStore, PreconditionFailed, StoredObject
from laminar_orchestration.ulid import next_ulid

log = logging.getLogger(__name__)

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
    event_time: EventTimeRecord | None = None


@dataclass(frozen=True)
class ChainRead:
    """A chain as read: its newest genuine entry, the pointer's ETag, the first sequence number nobody took."""

    version: ManifestVersion | None
    pointer_etag: str | None
    #: Past every entry written, forged ones included: where the next entry goes.
    next_seq: int


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
        #: (node, generation) of the process reading, when it is a node: its own generation is known.
        self.own_writer: tuple[int, int] | None = None

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

    def read_chain(self, partition: int, *, newest_grant: int | None = None) -> ChainRead:
        """The chain's newest genuine entry, the pointer's ETag and the next free sequence number.

        `newest_grant`: the newest epoch granted, as the caller has just read it (a granter about to
        create the next): an entry of that epoch is not probed for a later grant.
        """
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
            version, next_seq = self._walk_from_pointer(partition, start, trusted, newest_grant)
        if version is not None and self._checked_for_later_reads(version, from_trust, newest_grant):
            self._trust(partition, version)
        return ChainRead(version, pointer.etag if pointer else None, next_seq)

    def _checked_for_later_reads(self, version: ManifestVersion, from_trust: bool, newest_grant: int | None) -> bool:
        """Whether later reads may start from `version` unchecked. Not an entry of the epoch the caller
        named the newest, reached through the pointer: it was not probed for a later grant, so it holds
        for this read alone (a granter's create fails if a later grant exists)."""
        return from_trust or version.manifest.fencing_token != newest_grant

    def _walk_from_pointer(
        self, partition: int, pointed: ManifestVersion | None, trusted: ManifestVersion | None, newest_grant: int | None
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
        if version is not None and self._writer_moved_past(partition, version.manifest, newest_grant):
            return self._walk(partition, trusted)
        return version, next_seq

    def _writer_moved_past(self, partition: int, m: PartitionManifest, newest_grant: int | None = None) -> bool:
        """Whether the ledger shows that the chain may have moved past `m`'s writer: a later epoch was
        granted, or the writing node has restarted since (its record carries a newer generation, and
        the restarted process seals the chain at it before it commits). Either way an entry reached
        through the pointer alone is not trusted: the walk from a trusted start decides."""
        if m.fencing_token != newest_grant and self.grant_keys.superseded(partition, m.fencing_token):
            return True
        if m.node == UNASSIGNED:
            return False
        if self.own_writer is not None and m.node == self.own_writer[0]:
            return self.own_writer[1] > m.generation
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
