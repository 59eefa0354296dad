"""The fencing core: fencing tokens, `PartitionGuard`, `PartitionGuardSet`, `EpochError`.

Every partition has a strictly increasing epoch. Owning partition p at epoch e
is proven by a `FencingToken`, which only the ledger's acquisition path can
mint (`Ledger.acquire` / `Ledger.fence` / `Ledger.adopt`). A `PartitionGuard`
wraps the token with a cached "current epoch": `check()` is the cheap hot-path
test against the cache, `validate()` the authoritative one against the ledger
that also refreshes the cache.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from laminar_orchestration.errors import FencedError, LaminarError, NotFoundError
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.records import PartitionStatus

# --- errors ---------------------------------------------------------------


class EpochError(LaminarError):
    """Base of the fencing errors. Variants: StaleEpoch, UnknownPartition, NotOwned,
    ConditionalPutFailed, also reachable as ``EpochError.StaleEpoch`` etc."""

    partition: PartitionId

    message = "fencing error for partition {partition}"

    StaleEpoch: ClassVar[type[StaleEpoch]]
    UnknownPartition: ClassVar[type[UnknownPartition]]
    NotOwned: ClassVar[type[NotOwned]]
    ConditionalPutFailed: ClassVar[type[ConditionalPutFailed]]


class StaleEpoch(EpochError, FencedError):
    """Another node holds the partition at a higher epoch; abort all in-flight work."""

    partition: PartitionId
    local_epoch: int
    current_epoch: int

    message = "stale epoch for partition {partition}: local={local_epoch}, current={current_epoch}"


class UnknownPartition(EpochError, NotFoundError):
    """The partition does not exist in the ledger."""

    partition: PartitionId

    message = "unknown partition: {partition}"


class NotOwned(EpochError, FencedError):
    """This node does not own the partition (another node, or node 0: unassigned)."""

    partition: PartitionId

    message = "partition {partition} not owned by this node"


class ConditionalPutFailed(EpochError, FencedError):
    """The store rejected a fenced write because the partition's epoch moved on."""

    partition: PartitionId
    expected_epoch: int
    actual_epoch: int

    message = "conditional PUT failed for partition {partition}: expected epoch={expected_epoch}, actual={actual_epoch}"


EpochError.StaleEpoch = StaleEpoch
EpochError.UnknownPartition = UnknownPartition
EpochError.NotOwned = NotOwned
EpochError.ConditionalPutFailed = ConditionalPutFailed


# --- tokens ---------------------------------------------------------------


class _Seal:
    """Private capability: holding an instance is what lets code mint tokens."""

    __slots__ = ()


_SEAL = _Seal()


class FencingToken:
    """Proof that `node` was granted `partition` at `epoch` by the ledger.

    Not constructible by callers: only `_mint_token`, called from the ledger's
    acquisition path, creates one. Ordered by epoch.
    """

    __slots__ = ("epoch", "node", "partition")

    partition: PartitionId
    epoch: int
    node: NodeId

    def __init__(self, *, _seal: _Seal) -> None:
        if _seal is not _SEAL:
            raise TypeError("FencingToken is minted by the ledger only")

    def __repr__(self) -> str:
        return f"FencingToken(partition={self.partition}, epoch={self.epoch}, node={self.node})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FencingToken):
            return NotImplemented
        return (self.partition, self.epoch, self.node) == (other.partition, other.epoch, other.node)

    def __hash__(self) -> int:
        return hash((self.partition, self.epoch, self.node))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("FencingToken is immutable")


def _mint_token(partition: PartitionId, epoch: int, node: NodeId) -> FencingToken:
    """Create a token. Private to the ledger's acquisition path (and the fencing tests)."""
    if epoch <= 0:
        raise ValueError("epoch 0 is reserved and never granted")
    if node == UNASSIGNED:
        raise ValueError("node 0 is the 'unassigned' sentinel and cannot own a partition")
    token = FencingToken(_seal=_SEAL)
    object.__setattr__(token, "partition", partition)
    object.__setattr__(token, "epoch", epoch)
    object.__setattr__(token, "node", node)
    return token


@dataclass(frozen=True)
class ConditionalPut:
    """The fencing identity attached to every object a guard writes."""

    partition_id: PartitionId
    epoch: int
    node_id: NodeId

    def as_metadata(self) -> dict[str, str]:
        """User metadata recorded on the object (S3 ``x-amz-meta-*``)."""
        return {
            "x-laminar-partition": str(self.partition_id),
            "x-laminar-epoch": str(self.epoch),
            "x-laminar-node": str(self.node_id),
        }

    def s3_condition(self) -> str:
        """A stable label of the writer's epoch, used in object names of fenced writes."""
        return f"epoch-{self.epoch}-partition-{self.partition_id}"


@dataclass(frozen=True)
class Ownership:
    """The authoritative owner of a partition as read from the ledger."""

    partition: PartitionId
    epoch: int
    owner: NodeId
    status: PartitionStatus
    #: True when the head record lagged the grants and was rolled forward.
    head_lagged: bool = False
    #: The head record's epoch and ETag as read (a granter moves it from there without reading it again).
    head_read: tuple[int, str] | None = field(default=None, compare=False, repr=False)


class OwnershipSource(Protocol):
    """What a guard validates against: the ledger's authoritative view."""

    def ownership(self, partition: PartitionId) -> Ownership | None: ...

    def ownerships(self, partitions: list[PartitionId]) -> dict[PartitionId, Ownership | None]: ...


# --- guards ---------------------------------------------------------------


class PartitionGuard:
    """Exclusive-ownership proof for one partition, with a cached current epoch.

    `check()` costs one attribute compare; `validate()` reads the ledger. The
    cached epoch only ever moves up, so a revoked guard can never look valid again.
    """

    __slots__ = ("_current", "_epoch", "_node", "_partition", "token")

    def __init__(self, token: FencingToken) -> None:
        if not isinstance(token, FencingToken):
            raise TypeError("a PartitionGuard needs a FencingToken minted by the ledger")
        self.token = token
        self._partition = token.partition
        self._epoch = token.epoch
        self._node = token.node
        # A plain int attribute: reads and writes are atomic under the GIL.
        self._current = token.epoch

    @property
    def partition_id(self) -> PartitionId:
        return self._partition

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def node_id(self) -> NodeId:
        return self._node

    @property
    def cached_current_epoch(self) -> int:
        return self._current

    def check(self) -> None:
        """Hot-path check against the cached epoch. Raises StaleEpoch if revoked."""
        if self._current > self._epoch:
            raise StaleEpoch(self._partition, self._epoch, self._current)

    def observe_epoch(self, current_epoch: int) -> None:
        """Record an epoch seen elsewhere (e.g. in a rejected write). Never lowers the cache."""
        if current_epoch > self._current:
            self._current = current_epoch

    def validate(self, source: OwnershipSource) -> None:
        """Authoritative check: both epoch and owner must match the ledger.

        Always refreshes the cache. Raises UnknownPartition, StaleEpoch or NotOwned.
        """
        self._validate_against(source.ownership(self._partition))

    def _validate_against(self, ownership: Ownership | None) -> None:
        if ownership is None:
            raise UnknownPartition(self._partition)
        self.observe_epoch(ownership.epoch)
        if ownership.epoch > self._epoch:
            raise StaleEpoch(self._partition, self._epoch, ownership.epoch)
        # Same epoch, different owner (or node 0: unassigned) is defence in depth:
        # the ledger never grants one epoch twice.
        if ownership.owner != self._node:
            raise NotOwned(self._partition)

    def refresh(self, source: OwnershipSource) -> bool:
        """Refresh the cache; True while still the owner, False once revoked."""
        return self._refresh_from(source.ownership(self._partition))

    def _refresh_from(self, ownership: Ownership | None) -> bool:
        if ownership is None:
            return False
        self.observe_epoch(ownership.epoch)
        return ownership.epoch <= self._epoch

    def conditional_put_precondition(self) -> ConditionalPut:
        """The identity to attach to fenced writes (checkpoints, outputs)."""
        return ConditionalPut(self._partition, self._epoch, self._node)

    def __repr__(self) -> str:
        return (
            f"PartitionGuard(partition={self._partition}, epoch={self._epoch}, "
            f"node={self._node}, cached_current={self._current})"
        )


class PartitionGuardSet:
    """The guards of every partition one node owns, with bulk refresh/validate."""

    __slots__ = ("_guards", "node_id")

    def __init__(self, node_id: NodeId) -> None:
        self.node_id = node_id
        self._guards: dict[PartitionId, PartitionGuard] = {}

    def insert(self, guard: PartitionGuard) -> None:
        """Add a guard; it must belong to this set's node."""
        if guard.node_id != self.node_id:
            raise ValueError(f"guard of node {guard.node_id} inserted into the set of node {self.node_id}")
        self._guards[guard.partition_id] = guard

    def remove(self, partition: PartitionId) -> PartitionGuard | None:
        """Drop a guard (on release); later checks of it raise NotOwned."""
        return self._guards.pop(partition, None)

    def get(self, partition: PartitionId) -> PartitionGuard | None:
        return self._guards.get(partition)

    def check(self, partition: PartitionId) -> None:
        """Hot-path check of one partition. Raises NotOwned or StaleEpoch."""
        guard = self._guards.get(partition)
        if guard is None:
            raise NotOwned(partition)
        if guard._current > guard._epoch:
            raise StaleEpoch(partition, guard._epoch, guard._current)

    def validate_all(self, source: OwnershipSource) -> list[tuple[PartitionId, EpochError]]:
        """Validate every guard against one batched ledger read; returns the failures."""
        # Judge exactly the guards the read was made for: one inserted meanwhile is not in it.
        guards = list(self._guards.items())
        snapshot = source.ownerships([pid for pid, _ in guards])
        failures: list[tuple[PartitionId, EpochError]] = []
        for pid, guard in guards:
            try:
                guard._validate_against(snapshot.get(pid))
            except EpochError as exc:
                failures.append((pid, exc))
        return failures

    def refresh_all(
        self, source: OwnershipSource, partitions: Collection[PartitionId] | None = None
    ) -> list[PartitionId]:
        """Refresh every cached epoch (or those of `partitions`) from one batched ledger read;
        returns revoked partitions."""
        # Judge exactly the guards the read was made for: one inserted meanwhile is not in it.
        guards = [(p, g) for p, g in self._guards.items() if partitions is None or p in partitions]
        snapshot = source.ownerships([pid for pid, _ in guards])
        return [pid for pid, guard in guards if not guard._refresh_from(snapshot.get(pid))]

    def __len__(self) -> int:
        return len(self._guards)

    def is_empty(self) -> bool:
        return not self._guards

    def partition_ids(self) -> Iterator[PartitionId]:
        return iter(list(self._guards))
