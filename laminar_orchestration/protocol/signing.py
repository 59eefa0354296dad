"""Signed records: an Ed25519 key per epoch grant, and the signature each manifest entry and release carries.

Static store policies cannot narrow a node's writes to the partitions it holds
now, so a node's credentials can create objects under any partition's
``manifests/`` and release keys. Such an object counts only if it is signed
with the private key of the grant of the epoch it claims:

* the control plane, minting the grant of (p, e) to node n, generates a
  keypair: the public key goes into the grant record (create-only, written by
  the control plane only), the private key create-only to
  ``grant-keys/n-<n>/p-<p>/e-<e>.json`` (`keys.signing_key_key`), which only
  node n and the control plane may read;
* node n takes up the grant only once it holds that key (`SigningKeys.get`:
  `SigningKeyUnavailable` otherwise, naming the object), and signs every
  manifest entry and release it writes at e with it; a seal the control plane
  writes at e is signed with the same key;
* every reader verifies against the public key of the grant of the record's
  epoch (`GrantKeys`; grants are immutable, so cached per (partition, epoch)),
  and that the grant names the record's node.

A record that does not verify (no signature, another key, altered bytes, an
epoch never granted, a grant to another node) is forged (`ForgedRecord`): it is
no part of any chain and nothing it names is read, restored or counted
(`manifest` says how a chain walk passes over it).
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Literal, TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import Field

from laminar_orchestration import clock
from laminar_orchestration.errors import CorruptDataError, UnavailableError
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.keys import grant_key, signing_key_key
from laminar_orchestration.protocol.records import (
    KEY_HEX_PATTERN,
    CorruptLedgerObject,
    EpochGrant,
    LedgerError,
    Record,
    SignedRecord,
    new_write_id,
    now,
    parse_record,
)
from laminar_orchestration.store import StoreError

R = TypeVar("R", bound=SignedRecord)

__all__ = [
    "ForgedRecord",
    "GrantKeys",
    "SigningKey",
    "SigningKeyUnavailable",
    "SigningKeys",
    "sign_record",
    "signature_problem",
]


# --- errors ---------------------------------------------------------------


class ForgedRecord(LedgerError, CorruptDataError):
    """A manifest entry, manifest pointer or release record that its claimed epoch's grant key did not sign.

    Written by someone that does not hold that key (another node's credentials,
    or bytes altered after signing). It is void: readers pass over it.
    """

    partition: PartitionId
    key: str
    claimed_epoch: int
    reason: str

    message = "forged record {key!r} of partition {partition} (claims epoch {claimed_epoch}): {reason}"


class SigningKeyUnavailable(LedgerError, UnavailableError):
    """The private key of a grant cannot be read: the node does not take up the grant."""

    partition: PartitionId
    epoch: int
    node: int
    key: str
    reason: str

    message = (
        "signing key {key!r} of the grant of partition {partition} at epoch {epoch} "
        "to node {node} is unavailable: {reason}"
    )


# --- keys -------------------------------------------------------------------


class SigningKey(Record):
    """A grant's keypair, stored create-only where only the grantee and the control plane can read it."""

    kind: Literal["grant-signing-key"] = "grant-signing-key"
    partition: int = Field(ge=0)
    epoch: int = Field(ge=1)
    node: int = Field(ge=0)
    private_key: str = Field(pattern=KEY_HEX_PATTERN)
    public_key: str = Field(pattern=KEY_HEX_PATTERN)
    created_at: datetime
    write_id: str = Field(default_factory=new_write_id)

    @classmethod
    def generate(cls, partition: int, epoch: int, node: int) -> SigningKey:
        """A fresh keypair for the grant of `partition` at `epoch` to `node` (entropy from the clock in effect)."""
        private = Ed25519PrivateKey.from_private_bytes(clock.current().random_bytes(32))
        public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return cls(
            partition=partition,
            epoch=epoch,
            node=node,
            private_key=private.private_bytes_raw().hex(),
            public_key=public.hex(),
            created_at=now(),
        )

    def sign(self, data: bytes) -> str:
        """The hex Ed25519 signature of `data`."""
        return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(self.private_key)).sign(data).hex()


def sign_record(record: R, key: SigningKey) -> R:
    """`record` with its signature by `key` (over the bytes a reader re-derives from the stored JSON)."""
    # Signed as a reader will see it: parsed back from its own JSON, so the canonical bytes agree.
    stored = type(record).model_validate_json(record.model_copy(update={"signature": None}).model_dump_json())
    return stored.model_copy(update={"signature": key.sign(stored.signed_bytes())})


def signature_problem(record: SignedRecord, public_key: str | None) -> str | None:
    """Why `record`'s signature does not verify with `public_key` (hex), or None when it does."""
    if record.signature is None:
        return "it carries no signature"
    if public_key is None:
        return "its epoch's grant carries no public key"
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key)).verify(
            bytes.fromhex(record.signature), record.signed_bytes()
        )
    except InvalidSignature:
        return "its signature does not verify with the key of its epoch's grant"
    return None


class SigningKeys:
    """The private keys of grants, read by (node, partition, epoch) and kept (they never change)."""

    def __init__(self, reads: ReadStore) -> None:
        self._reads = reads
        self._keys: dict[tuple[int, int, int], SigningKey] = {}
        self._lock = threading.Lock()

    def remember(self, key: SigningKey) -> None:
        """Keep `key` (the control plane just minted it)."""
        with self._lock:
            self._keys[(key.node, key.partition, key.epoch)] = key

    def get(self, node: int, partition: int, epoch: int) -> SigningKey:
        """The key of the grant of `partition` at `epoch` to `node`; SigningKeyUnavailable if it cannot be read."""
        cached = self._keys.get((node, partition, epoch))
        if cached is not None:
            return cached
        name = signing_key_key(node, partition, epoch)

        def unavailable(reason: str) -> SigningKeyUnavailable:
            return SigningKeyUnavailable(PartitionId(partition), epoch, node, name, reason)

        try:
            obj = self._reads.get(name)
        except StoreError as exc:
            raise unavailable(str(exc)) from exc
        if obj is None:
            raise unavailable("missing")
        try:
            key = parse_record(name, obj.data, SigningKey)
        except CorruptLedgerObject as exc:
            raise unavailable(exc.reason) from exc
        if (key.node, key.partition, key.epoch) != (node, partition, epoch):
            raise unavailable(f"holds the key of node {key.node}, partition {key.partition}, epoch {key.epoch}")
        self.remember(key)
        return key


class GrantKeys:
    """Verifies signed records against the public keys of their epochs' grants (cached: grants never change)."""

    def __init__(self, reads: ReadStore) -> None:
        self._reads = reads
        self._grants: dict[tuple[int, int], EpochGrant] = {}

    def grant(self, partition: int, epoch: int) -> EpochGrant | None:
        """The grant of `partition` at `epoch`, or None if it was never made (yet)."""
        cached = self._grants.get((partition, epoch))
        if cached is not None:
            return cached
        name = grant_key(partition, epoch)
        obj = self._reads.get(name)
        if obj is None:
            return None
        grant = parse_record(name, obj.data, EpochGrant)
        if len(self._grants) >= 100_000:
            self._grants.clear()
        self._grants[(partition, epoch)] = grant
        return grant

    def known(self, partition: int, epoch: int) -> EpochGrant | None:
        """The grant of `partition` at `epoch` if this cache holds it (no read)."""
        return self._grants.get((partition, epoch))

    def superseded(self, partition: int, epoch: int) -> bool:
        """Whether a later epoch than `epoch` of `partition` has been granted."""
        return self.grant(partition, epoch + 1) is not None

    def problem(self, record: SignedRecord, partition: int, epoch: int, node: int) -> str | None:
        """Why `record`, claiming `epoch` of `partition` written by `node`, is forged; None if genuine."""
        if epoch < 1:
            return f"epoch {epoch} is never granted"
        grant = self.grant(partition, epoch)
        if grant is None:
            return f"epoch {epoch} was never granted"
        if grant.node != node:
            return f"epoch {epoch} was granted to node {grant.node}, the record names node {node}"
        return signature_problem(record, grant.public_key)

    def check(self, key: str, record: SignedRecord, partition: int, epoch: int, node: int) -> None:
        """Raise ForgedRecord unless `record` (stored at `key`) is genuine."""
        reason = self.problem(record, partition, epoch, node)
        if reason is not None:
            raise ForgedRecord(PartitionId(partition), key, epoch, reason)
