"""Reading and verifying a partition's manifest chain (the records are in `protocol.manifest`, whose
docstring gives the rules this module enforces).

A reader passes over forged and superseded entries; sealing and publishing the chain are in
`protocol.chain_writes`."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.protocol.capabilities import ManifestKey, ReadStore, manifest_key
from laminar_orchestration.protocol.fencing import ConditionalPutFailed
from laminar_orchestration.protocol.keys import manifest_history_key, manifest_pointer_key, node_key
from laminar_orchestration.protocol.manifest import (
    BrokenManifestChain,
    PartitionManifest,
    StaleFencingToken,
    StaleGeneration,
    SuccessionError,
    SupersededEntry,
)
from laminar_orchestration.protocol.records import CorruptLedgerObject, NodeRecord, parse_record
from laminar_orchestration.protocol.signing import ForgedRecord, GrantKeys, SigningKeys
from laminar_orchestration.protocol.versioned import VersionedReader
from laminar_orchestration.store import ObjectStore, StoredObject

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ManifestVersion:
    """A manifest with the raw bytes it was stored as (for the parent hash)."""

    manifest: PartitionManifest
    raw: bytes

    @property
    def raw_hash(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()


@dataclass(frozen=True)
class ChainRead:
    """A chain as read: its newest genuine entry, the pointer's ETag, the first sequence number nobody took."""

    version: ManifestVersion | None
    pointer_etag: str | None
    #: Past every entry written, forged ones included: where the next entry goes.
    next_seq: int


def decode_manifest(obj: StoredObject) -> ManifestVersion:
    """A stored manifest with its raw bytes; CorruptLedgerObject if it does not parse."""
    return ManifestVersion(parse_record(obj.key, obj.data, PartitionManifest), obj.data)


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
            version = decode_manifest(obj)
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
