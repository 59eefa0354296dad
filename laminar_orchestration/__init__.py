"""laminar-orchestration: safe ownership and movement of stream partitions between worker nodes."""

from .fencing import (
    ConditionalPut,
    ConditionalPutFailed,
    EpochError,
    FencingToken,
    NotOwned,
    Ownership,
    PartitionGuard,
    PartitionGuardSet,
    StaleEpoch,
    UnknownPartition,
)
from .identity import UNASSIGNED, NodeId, PartitionId
from .ledger import Ledger

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
