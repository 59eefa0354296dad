"""laminar-orchestration: safe ownership and movement of stream partitions between worker nodes."""

from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.fencing import (
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
from laminar_orchestration.protocol.ledger import Ledger

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
