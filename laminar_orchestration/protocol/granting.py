"""Making the ledger's grants: mint the grant's key, create the grant, seal the manifest chain at its
epoch, move the ownership head.

`Granter` is the part of `ledger.Ledger` that does it (its `acquire` and `fence` go through
`Granter.grant_next`, its `complete_grant` through `Granter.complete`); the rules are in the
ledger's module docstring.
"""

from __future__ import annotations

import contextlib
from typing import Protocol, TypeVar

from pydantic import BaseModel

from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import LedgerKey, SigningKeyWriter, grant_keys_key
from laminar_orchestration.protocol.chain import ChainRead
from laminar_orchestration.protocol.chain_writes import ChainSealer
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.keys import signing_key_key
from laminar_orchestration.protocol.ledger_errors import EpochConflict
from laminar_orchestration.protocol.records import (
    EpochGrant,
    GrantKind,
    LedgerError,
    PartitionHead,
    PartitionStatus,
    now,
)
from laminar_orchestration.protocol.signing import SigningKey, SigningKeys, SigningKeyUnavailable
from laminar_orchestration.protocol.versioned import VersionedObject
from laminar_orchestration.store import ObjectStore, PreconditionFailed

M = TypeVar("M", bound=BaseModel)


def _encode(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


class GrantingLedger(Protocol):
    """What making a grant reads and writes through the ledger (`ledger.Ledger`)."""

    store: ObjectStore
    signing_keys: SigningKeys

    @property
    def sealer(self) -> ChainSealer: ...

    def ownership(self, partition: PartitionId) -> Ownership | None: ...

    def grant(self, partition: PartitionId, epoch: int) -> EpochGrant | None: ...

    def _ownership_of(self, partition: int) -> VersionedObject[EpochGrant, LedgerKey]: ...

    def _require(self, key: str, model: type[M]) -> tuple[M, str]: ...

    def _current_or_unknown(self, partition: PartitionId) -> Ownership: ...


class Granter:
    """Makes a ledger's grants; the ledger owns it. The seal goes through `ledger.sealer`, looked up
    at each grant (the simulator's switch that reverts the seal replaces that property)."""

    def __init__(self, ledger: GrantingLedger) -> None:
        self._ledger = ledger

    def grant_next(
        self,
        partition: PartitionId,
        node: NodeId,
        current: Ownership,
        kind: GrantKind,
        reason: str,
        generation: int | None = None,
    ) -> int:
        """Create grant `current.epoch + 1` for `node`, seal the manifest chain at it, move the head.

        Returns the epoch.
        """
        epoch = current.epoch + 1
        # Read the chain while its newest epoch is still current: the seal below then starts from an
        # entry this process checked, not from a pointer it would have to verify from the start.
        # Only a hint: a chain that cannot be read does not keep the grant (the fence) from being made.
        hint: ChainRead | None = None
        with contextlib.suppress(LedgerError):
            hint = self._ledger.sealer.read_chain(partition, newest_grant=current.epoch)
        signing_key = self._mint_signing_key(partition, epoch, node)
        grant = EpochGrant(
            partition=partition,
            epoch=epoch,
            node=node,
            grant_kind=kind,
            previous_epoch=current.epoch,
            previous_owner=current.owner,
            generation=generation,
            reason=reason,
            granted_at=now(),
            public_key=signing_key.public_key,
        )
        try:
            # The linearization point: exactly one contender creates grant (p, epoch).
            self._ledger._ownership_of(partition).create(epoch, _encode(grant))
        except PreconditionFailed:
            raise EpochConflict(partition, current.epoch, self._ledger._current_or_unknown(partition).epoch) from None
        # The fence point: from this seal on, no publish under an older epoch is accepted. A
        # failure here leaves the grant in place; the grantee seals before it restores.
        self._ledger.sealer.seal(
            partition,
            epoch,
            node=node,
            generation=generation or 0,
            reason=f"{kind.value} by the ledger",
            signing_key=signing_key,
            first_read=hint,
        )
        status = PartitionStatus.ACTIVE if node != UNASSIGNED else PartitionStatus.UNASSIGNED
        # The grant already holds; a successor may supersede it at once, which the
        # token's guard will then report on its next validate.
        self._advance_head(partition, epoch, node, status, only_if_epoch=None, read=current.head_read)
        return epoch

    def complete(self, partition: PartitionId, ownership: Ownership | None = None) -> bool:
        """`ledger.Ledger.complete_grant`: seal a lagging grant's epoch with its stored key, advance the head."""
        own = ownership if ownership is not None else self._ledger.ownership(partition)
        if own is None or not own.head_lagged:
            return False
        grant = self._ledger.grant(partition, own.epoch)
        if grant is None:
            return False
        node = NodeId(grant.node)
        key = self._ledger.signing_keys.get(node, partition, grant.epoch)
        if key.public_key != grant.public_key:
            raise SigningKeyUnavailable(
                partition, grant.epoch, node, signing_key_key(node, partition, grant.epoch), "not the grant's key"
            )
        self._ledger.sealer.seal(
            partition,
            grant.epoch,
            node=node,
            generation=grant.generation or 0,
            reason=f"{grant.grant_kind.value} completed by the control plane",
            signing_key=key,
        )
        status = PartitionStatus.ACTIVE if node != UNASSIGNED else PartitionStatus.UNASSIGNED
        self._advance_head(partition, grant.epoch, node, status, only_if_epoch=None)
        return True

    def _mint_signing_key(self, partition: PartitionId, epoch: int, node: NodeId) -> SigningKey:
        """The keypair of the grant of `partition` at `epoch` to `node`, stored create-only before the grant.

        A contender granting the same epoch to the same node may have stored one
        first: then that one is used, so whichever grant wins names a stored key.
        """
        key = SigningKey.generate(partition, epoch, node)
        name = signing_key_key(node, partition, epoch)
        try:
            SigningKeyWriter(self._ledger.store).create_signing_key(grant_keys_key(name), _encode(key))
        except PreconditionFailed:
            return self._ledger.signing_keys.get(node, partition, epoch)
        self._ledger.signing_keys.remember(key)
        return key

    def _advance_head(
        self,
        partition: PartitionId,
        epoch: int,
        owner: NodeId,
        status: PartitionStatus,
        *,
        only_if_epoch: int | None,
        read: tuple[int, str] | None = None,
    ) -> bool:
        """Move the head forward by CAS. Never moves it back; returns whether it wrote.

        `read`: the head's epoch and ETag as the caller read it: when it is behind `epoch`, the
        first swap goes from there without reading the head again (it fails if the head moved).
        """
        ownership = self._ledger._ownership_of(partition)
        if read is not None and only_if_epoch is None and read[0] < epoch:
            new = PartitionHead(partition=partition, epoch=epoch, owner=owner, status=status, updated_at=now())
            with contextlib.suppress(PreconditionFailed):
                ownership.move_pointer(_encode(new), read[1])
                return True
        while True:
            head, etag = self._ledger._require(ownership.pointer_key, PartitionHead)
            if only_if_epoch is not None and head.epoch != only_if_epoch:
                return False
            if head.epoch > epoch or (head.epoch == epoch and head.status == status and head.owner == owner):
                return False
            new = PartitionHead(partition=partition, epoch=epoch, owner=owner, status=status, updated_at=now())
            try:
                ownership.move_pointer(_encode(new), etag)
                return True
            except PreconditionFailed:
                continue  # someone else moved it; re-read and decide again
