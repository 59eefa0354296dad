"""The epoch ledger: who owns which partition at which epoch, kept in the object store.

Ownership of partition p at epoch e is the immutable record ``ledger/partitions/p/grants/e``
created with create-only semantics: whatever the interleaving, exactly one contender creates it.
Grants are never deleted, so a stalled contender can never re-create a collected name (the SlateDB
#352/#1622 hole). A CAS head record names the current owner without listing; when it lags the
grants (a grantee died between the two writes) readers roll forward by probing the next grant keys.

Granting an epoch also seals the partition's manifest chain at that epoch
(`chain_writes.ChainSealer.seal`), right after the grant is created and before
the grant call returns: every acquisition and fence goes through
`granting.Granter.grant_next`, so none can skip it. The fence point is that
seal: a publish under an older epoch that lands before it is the old owner's
last commit, none after it is accepted.
If the granter dies between the grant and the seal, the grantee's acquisition
path re-ensures the seal before it reads the chain to restore, and the control
plane's periodic look at the partition (`MigrationCoordinator.reinstate`)
completes it (`complete_grant`): a fence to "unassigned" has no grantee.

Grants are made by the control plane only (`acquire` after a release, `fence`
without one); a node takes up a grant made for it with `adopt` and writes only
its own records: its node record and its release records.

Each grant carries the public half of a keypair minted with it; the private
half is stored create-only where only the grantee and the control plane can
read it (`signing`). It is written before the grant, so a grant never names a
key that does not exist. `adopt` reads it (a node without it does not take the
partition); the seal, the grantee's manifest entries and its release record at
that epoch are signed with it, and a release record that does not verify is
no release (`release_record` passes over it).

The ledger is the only code that mints `FencingToken`s.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from laminar_orchestration.errors import InvalidArgument
from laminar_orchestration.identity import MAX_PARTITIONS, UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import (
    LedgerKey,
    LedgerWriter,
    ManifestSealer,
    ledger_key,
)
from laminar_orchestration.protocol.chain_writes import ChainSealer
from laminar_orchestration.protocol.fencing import (
    FencingToken,
    NotOwned,
    Ownership,
    StaleEpoch,
    UnknownPartition,
    _mint_token,
)
from laminar_orchestration.protocol.granting import Granter
from laminar_orchestration.protocol.keys import (
    CLUSTER_KEY,
    MEMBERSHIP_KEY,
    grant_key,
    ownership_head_key,
    release_key,
    signing_key_key,
)
from laminar_orchestration.protocol.ledger_errors import (
    ClusterAlreadyInitialized as ClusterAlreadyInitialized,
)
from laminar_orchestration.protocol.ledger_errors import (
    ClusterNotInitialized as ClusterNotInitialized,
)
from laminar_orchestration.protocol.ledger_errors import EpochConflict as EpochConflict
from laminar_orchestration.protocol.ledger_errors import NodeIdentityConflict as NodeIdentityConflict
from laminar_orchestration.protocol.ledger_errors import NotReleased as NotReleased
from laminar_orchestration.protocol.membership import Membership
from laminar_orchestration.protocol.records import (
    ClusterRecord,
    CorruptLedgerObject,
    EpochGrant,
    GrantKind,
    MembershipRecord,
    ParsedRecords,
    PartitionHead,
    PartitionStatus,
    ReleaseRecord,
    now,
)
from laminar_orchestration.protocol.signing import (
    ForgedRecord,
    GrantKeys,
    SigningKeys,
    SigningKeyUnavailable,
    sign_record,
)
from laminar_orchestration.protocol.versioned import VersionedObject
from laminar_orchestration.store import ObjectStore, PreconditionFailed, StoredObject

if TYPE_CHECKING:
    from laminar_orchestration.processing.schema import StreamSchema

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


# --- values ---------------------------------------------------------------


def _encode(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


# --- the ledger -----------------------------------------------------------


class Ledger:
    """Epoch grants and releases, the cluster and its partitions; node membership in `members`."""

    def __init__(self, store: ObjectStore, *, read_parallelism: int | None = None) -> None:
        self.store = store
        self._writer = LedgerWriter(store)
        # Remote stores answer slowly but in parallel; the local store is fastest serially.
        remote = not store.url.startswith("file:")
        self._parallelism = read_parallelism if read_parallelism is not None else (16 if remote else 1)
        self._pool: ThreadPoolExecutor | None = None
        self._records = ParsedRecords()
        self._pool_lock = threading.Lock()
        self._sealer: ChainSealer | None = None
        #: Public keys of grants, to verify release records.
        self.grant_keys = GrantKeys(self._writer)
        #: Private keys of grants: the ones this process minted (control plane) or adopted (node).
        self.signing_keys = SigningKeys(self._writer)
        #: The member set, the cluster epoch and the node records (`membership`).
        self.members = Membership(store, self._records)
        #: Makes the grants `acquire` and `fence` ask for, and completes lagging ones (`granting`).
        self._granter = Granter(self)

    @property
    def sealer(self) -> ChainSealer:
        """Seals manifest chains on grants (holds only the `ManifestSealer` capability)."""
        if self._sealer is None:
            self._sealer = ChainSealer(ManifestSealer(self.store), self.store, signing_keys=self.signing_keys)
        return self._sealer

    # -- reading -----------------------------------------------------------

    def _read(self, key: str, model: type[M]) -> tuple[M, str] | None:
        obj = self._writer.get(key)
        return None if obj is None else (self._parse(obj, model), obj.etag)

    def _parse(self, obj: StoredObject, model: type[M]) -> M:
        return self._records.parse(obj, model)

    def _ownership_of(self, partition: int) -> VersionedObject[EpochGrant, LedgerKey]:
        """A partition's ownership as a versioned object: grants by epoch, the ownership head as pointer."""
        return VersionedObject(
            self._writer,
            entry_key=lambda epoch: ledger_key(grant_key(partition, epoch)),
            pointer_key=ledger_key(ownership_head_key(partition)),
            decode=lambda _epoch, obj: self._parse(obj, EpochGrant),
            create=self._writer.create,
            swap=self._writer.swap,
        )

    def _require(self, key: str, model: type[M]) -> tuple[M, str]:
        got = self._read(key, model)
        if got is None:
            if key == CLUSTER_KEY:
                raise ClusterNotInitialized(self.store.url)
            raise CorruptLedgerObject(key, "missing")
        return got

    def read_each(self, fn: Callable[[PartitionId], T], items: list[PartitionId]) -> list[T]:
        """`fn` of each partition, in order: reads in parallel on remote stores (the ledger's pool)."""
        if self._parallelism <= 1 or len(items) <= 1:
            return [fn(i) for i in items]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._parallelism, thread_name_prefix="ledger-read")
        return list(self._pool.map(fn, items))

    # -- cluster -----------------------------------------------------------

    def cluster(self) -> ClusterRecord:
        """The cluster record; raises ClusterNotInitialized if `init` never ran."""
        return self._require(CLUSTER_KEY, ClusterRecord)[0]

    def is_initialized(self) -> bool:
        return self._writer.head(CLUSTER_KEY) is not None

    def init_cluster(
        self, partitions: int, *, force: bool = False, schema: StreamSchema | None = None, processor: str | None = None
    ) -> ClusterRecord:
        """Create the cluster record and `partitions` unassigned partitions at epoch 0.

        `partitions` must be within 1..`MAX_PARTITIONS`. Re-initialization needs `force`; it never lowers
        an epoch or removes a partition (that would hand out an epoch twice), it only adds partitions.

        Resumable: the stream record, the partition heads and the membership record are written
        first and the cluster record last, so an interrupted `init` leaves no cluster that names
        missing partitions; running it again completes it. `schema` and `processor` (either
        defaulting to the demo's) are recorded in the stream record (`protocol.stream`), checked
        before any write: `StreamAlreadyRecorded` if the store records another stream.
        """
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidArgument("partitions", f"{partitions!r} is not within 1..{MAX_PARTITIONS}")
        from laminar_orchestration.protocol.stream import check_stream, record_stream, stream_record  # pyarrow: late

        existing = self._read(CLUSTER_KEY, ClusterRecord)
        stream = None if schema is None and processor is None else stream_record(schema, processor)
        new_stream = stream is not None and check_stream(self._writer, stream, cluster_exists=existing is not None)
        if existing is not None:
            if not force:
                raise ClusterAlreadyInitialized(self.store.url, existing[0].partitions)
            if partitions < existing[0].partitions:
                raise InvalidArgument(
                    "partitions",
                    f"cannot shrink the cluster from {existing[0].partitions} to {partitions} partitions",
                )
        if stream is not None and new_stream:
            record_stream(self._writer, stream)  # first: a cluster record never lacks the stream it was given
        for p in range(partitions):
            head = PartitionHead(
                partition=p, epoch=0, owner=UNASSIGNED, status=PartitionStatus.UNASSIGNED, updated_at=now()
            )
            ownership = self._ownership_of(p)
            try:
                ownership.move_pointer(_encode(head), None)
            except PreconditionFailed:
                self._require(ownership.pointer_key, PartitionHead)  # exists (earlier run or re-init): must parse
        if self._read(MEMBERSHIP_KEY, MembershipRecord) is None:
            membership = MembershipRecord(cluster_epoch=1, members=[], reason="init", updated_at=now())
            # Losing this race is fine: someone else created the same initial record.
            with contextlib.suppress(PreconditionFailed):
                self._writer.create(ledger_key(MEMBERSHIP_KEY), _encode(membership))
        # Last: once the cluster record exists, every partition it names has a head.
        if existing is None:
            record = ClusterRecord(cluster_id=uuid.uuid4().hex, partitions=partitions, created_at=now())
            try:
                self._writer.create(ledger_key(CLUSTER_KEY), _encode(record))
            except PreconditionFailed:
                # A concurrent init finished first: its heads are ours too, report the conflict.
                raise ClusterAlreadyInitialized(self.store.url, self.cluster().partitions) from None
            return record
        previous, etag = existing
        record = previous.model_copy(update={"partitions": partitions, "reinitialized_at": now()})
        # A concurrent re-init moves the ETag: PreconditionFailed (a conflict) propagates.
        self._writer.swap(ledger_key(CLUSTER_KEY), _encode(record), etag)
        return record

    def partitions(self) -> list[PartitionId]:
        return [PartitionId(p) for p in range(self.cluster().partitions)]

    # -- ownership -----------------------------------------------------------

    def ownership(self, partition: PartitionId) -> Ownership | None:
        """The current owner: the head, rolled forward over any newer grants. None if unknown."""
        ownership = self._ownership_of(partition)
        pointer = ownership.pointer()
        if pointer is None:
            return None
        head = self._parse(pointer, PartitionHead)
        epoch, owner, status, lagged = head.epoch, NodeId(head.owner), head.status, False
        for entry in ownership.roll_forward(head.epoch + 1):
            grant = entry.value
            epoch, owner, lagged = grant.epoch, NodeId(grant.node), True
            status = PartitionStatus.ACTIVE if grant.node != UNASSIGNED else PartitionStatus.UNASSIGNED
        # The owner records its release without touching the head (the head is the control plane's);
        # only a release its grant's key signed counts.
        if status == PartitionStatus.ACTIVE and owner != UNASSIGNED and self.release_record(partition, epoch):
            status = PartitionStatus.RELEASED
        return Ownership(PartitionId(partition), epoch, owner, status, lagged, head_read=(head.epoch, pointer.etag))

    def ownerships(self, partitions: list[PartitionId]) -> dict[PartitionId, Ownership | None]:
        """`ownership` for many partitions (parallel reads on remote stores)."""
        return dict(zip(partitions, self.read_each(self.ownership, partitions), strict=True))

    def grant(self, partition: PartitionId, epoch: int) -> EpochGrant | None:
        entry = self._ownership_of(partition).entry(epoch)
        return entry.value if entry else None

    def grants(self, partition: PartitionId) -> Iterator[EpochGrant]:
        """Every grant of a partition in epoch order (probing keys, no listing)."""
        for entry in self._ownership_of(partition).roll_forward(1):
            yield entry.value

    def release_record(self, partition: PartitionId, epoch: int) -> ReleaseRecord | None:
        """The release of `partition`'s `epoch` by its owner; None if there is none or it is forged."""
        try:
            return self._verified_release(partition, epoch)
        except ForgedRecord:
            return None

    def _verified_release(self, partition: PartitionId, epoch: int) -> ReleaseRecord | None:
        """The release of `epoch`, None if absent; ForgedRecord unless the grant's key signed it."""
        key = release_key(partition, epoch)
        obj = self._writer.get(key)
        if obj is None:
            return None
        try:
            record = self._parse(obj, ReleaseRecord)
        except CorruptLedgerObject as exc:
            # Any node's credentials can write here: bytes that do not parse are no release.
            raise ForgedRecord(partition, key, epoch, f"does not parse: {exc.reason}") from exc
        if record.partition != partition or record.epoch != epoch:
            raise ForgedRecord(partition, key, epoch, f"names partition {record.partition}, epoch {record.epoch}")
        self.grant_keys.check(key, record, partition, epoch, record.node)
        return record

    # -- acquisition: the only place tokens are minted ----------------------

    def acquire(
        self,
        partition: PartitionId,
        node: NodeId,
        *,
        expected_epoch: int,
        reason: str = "",
        generation: int | None = None,
    ) -> FencingToken:
        """Graceful acquisition of epoch `expected_epoch + 1` for `node`.

        The current epoch must be `expected_epoch` and it must have been released (or be unassigned).
        Raises EpochConflict if someone else moved first. Seals the partition's manifest chain at the
        new epoch before returning.
        """
        current = self._current_or_unknown(partition)
        if current.epoch != expected_epoch:
            raise EpochConflict(partition, expected_epoch, current.epoch)
        # A release read with `current` stands (release records are create-only): not read twice.
        released = current.owner == UNASSIGNED or current.status == PartitionStatus.RELEASED
        if not released and self.release_record(partition, current.epoch) is None:
            raise NotReleased(partition, current.epoch, current.owner)
        epoch = self._granter.grant_next(partition, node, current, GrantKind.ACQUIRE, reason, generation)
        return _mint_token(partition, epoch, node)

    def fence(
        self,
        partition: PartitionId,
        node: NodeId,
        *,
        expected_epoch: int,
        reason: str,
        generation: int | None = None,
        current: Ownership | None = None,
    ) -> FencingToken | None:
        """Forced: grant `expected_epoch + 1` to `node` without the old owner's release.

        Anything the old owner still does at its epoch is rejected from here on.
        `node` may be UNASSIGNED (fence only); then no token is returned. The
        fence takes effect on manifests at the seal this call puts on the chain.
        `current`: the ownership as the caller last read it, if it did (not read again: the
        grant's create-only write fails with EpochConflict if anyone granted since).
        """
        if current is None or current.partition != partition:
            current = self._current_or_unknown(partition)
        if current.epoch != expected_epoch:
            raise EpochConflict(partition, expected_epoch, current.epoch)
        epoch = self._granter.grant_next(partition, node, current, GrantKind.FENCE, reason, generation)
        return None if node == UNASSIGNED else _mint_token(partition, epoch, node)

    def adopt(
        self,
        partition: PartitionId,
        node: NodeId,
        *,
        generation: int | None = None,
        epoch: int | None = None,
        grant: EpochGrant | None = None,
    ) -> FencingToken:
        """Mint the token for a grant the control plane already made to `node`: how a node takes up
        a placement, a hand-over, a failover, or its own grant again after a restart.

        `epoch`: the grant the node expects (a move's); it is read directly, and is current when no
        later grant exists (two reads, not the head's roll-forward and the release). `grant`: that
        grant as the caller read it and found it current (none then): a later grant made since
        fences whatever the token writes.
        Raises NotOwned if the current grant names another node, or another
        generation of it when both are known.
        """
        expected = self._expected_grant(partition, epoch, grant) if epoch is not None else None
        if expected is not None and epoch is not None:
            if expected.node != node:
                raise NotOwned(partition)
            current_epoch, grant = epoch, expected
        else:
            current = self._current_or_unknown(partition)
            if current.owner != node or current.epoch == 0:
                raise NotOwned(partition)
            current_epoch = current.epoch
            grant = self.grant(partition, current.epoch)
        if grant is None or (generation is not None and grant.generation != generation):
            raise NotOwned(partition)
        # Without the grant's private key nothing this node writes for the partition would count.
        key = self.signing_keys.get(node, partition, current_epoch)
        if key.public_key != grant.public_key:
            raise SigningKeyUnavailable(
                partition, current_epoch, node, signing_key_key(node, partition, current_epoch), "not the grant's key"
            )
        return _mint_token(partition, current_epoch, node)

    def _expected_grant(self, partition: PartitionId, epoch: int, known: EpochGrant | None) -> EpochGrant | None:
        """The grant at `epoch` if it is the current one: `known` (the caller read it and found it
        current), else read, after a probe for a later grant; None when a later grant or none exists."""
        if known is not None and (known.partition, known.epoch) == (partition, epoch):
            return known
        ownership = self._ownership_of(partition)
        if ownership.entry(epoch + 1) is not None:
            return None
        found = ownership.entry(epoch)
        return found.value if found is not None else None

    def _current_or_unknown(self, partition: PartitionId) -> Ownership:
        current = self.ownership(partition)
        if current is None:
            raise UnknownPartition(partition)
        return current

    def complete_grant(self, partition: PartitionId, ownership: Ownership | None = None) -> bool:
        """Finish a grant whose granter died between creating it and sealing the chain; True if one lagged.

        When the ownership head lags the newest grant (`Ownership.head_lagged`), the grant may
        never have been sealed: seal the manifest chain at its epoch, as `granting.Granter.grant_next`
        does (signed with the grant's stored key, at the grant's node and generation), then advance
        the head.
        A fence to "unassigned" has no grantee that would seal it, so until this runs its old
        owner's publishes under the old epoch are still accepted. `ownership` is a current read
        of it, if the caller has one (the control plane's periodic look at the partition).

        Idempotent, and safe beside a granter still finishing: the seal writes nothing when the
        chain is already sealed at the epoch (or past it), and the head only ever moves forward.
        SigningKeyUnavailable when the grant's key cannot be read.
        """
        return self._granter.complete(partition, ownership)

    def release(self, token: FencingToken, *, commit_ulid: str | None, source_offset: int) -> ReleaseRecord:
        """Record that the owner at `token.epoch` stopped after committing `commit_ulid`.

        Validates ownership first; a superseded owner gets StaleEpoch / NotOwned.
        """
        current = self._current_or_unknown(token.partition)
        if current.epoch > token.epoch:
            raise StaleEpoch(token.partition, token.epoch, current.epoch)
        if current.owner != token.node:
            raise NotOwned(token.partition)
        record = ReleaseRecord(
            partition=token.partition,
            epoch=token.epoch,
            node=token.node,
            commit_ulid=commit_ulid,
            source_offset=source_offset,
            released_at=now(),
        )
        record = sign_record(record, self.signing_keys.get(token.node, token.partition, token.epoch))
        key = release_key(token.partition, token.epoch)
        try:
            # The release record alone says it (`ownership` reads it): a node writes no head.
            self._writer.create(ledger_key(key), _encode(record))
        except PreconditionFailed:
            # Ours (a retry), or a forged one that took the name first (ForgedRecord: no release
            # is recorded, the partition can only move by a forced failover).
            existing = self._verified_release(token.partition, token.epoch)
            if existing is None:
                raise CorruptLedgerObject(key, "missing") from None
            if existing.node != token.node:
                raise NotOwned(token.partition) from None
            return existing
        return record
