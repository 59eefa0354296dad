"""The ledger's errors: what a grant, an initialization or a node's record can refuse."""

from __future__ import annotations

from laminar_orchestration.errors import ConflictError, NotFoundError
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.records import LedgerError


class ClusterNotInitialized(LedgerError, NotFoundError):
    store_url: str

    message = "no cluster in {store_url}: run `laminar init --store {store_url} --partitions N`"


class ClusterAlreadyInitialized(LedgerError, ConflictError):
    store_url: str
    partitions: int

    message = (
        "a cluster with {partitions} partitions already exists in {store_url}; "
        "pass --force to re-initialize (epochs are kept, partitions can only be added)"
    )


class EpochConflict(LedgerError, ConflictError):
    """Someone else moved the partition's epoch first: the caller's `expected` epoch is no longer current."""

    partition: PartitionId
    expected: int
    actual: int

    message = "epoch conflict for partition {partition}: expected={expected}, actual={actual}"


class NotReleased(LedgerError, ConflictError):
    """A graceful acquisition of a partition whose current owner has not released it."""

    partition: PartitionId
    epoch: int
    owner: NodeId

    message = (
        "partition {partition} is held by node {owner} at epoch {epoch} "
        "and has not been released; use a forced failover to take it"
    )


class NodeIdentityConflict(LedgerError, ConflictError):
    """Another process wrote this node's record: two processes claim one node id."""

    node: NodeId
    generation: int

    message = "node {node} (generation {generation}) lost its ledger record to another process with the same node id"
