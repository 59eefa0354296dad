"""laminar-orchestration: safe ownership and movement of stream partitions between worker nodes."""

from .fencing import (
    ConditionalPut,
    ConditionalPutFailed,
    EpochError,
    FencingToken,
    NotOwned,
    PartitionGuard,
    PartitionGuardSet,
    StaleEpoch,
    UnknownPartition,
)
from .identity import UNASSIGNED, NodeId, PartitionId
from .ledger import Ledger, Ownership

__all__ = [
    "UNASSIGNED",
    "ConditionalPut",
    "ConditionalPutFailed",
    "EpochError",
    "FencingToken",
    "Ledger",
    "NodeId",
    "NotOwned",
    "Ownership",
    "PartitionGuard",
    "PartitionGuardSet",
    "PartitionId",
    "StaleEpoch",
    "UnknownPartition",
]
