# Tokens are minted by the ledger only; a caller cannot build one.
from laminar_orchestration.protocol.fencing import FencingToken, PartitionGuard


def forge() -> PartitionGuard:
    return PartitionGuard(FencingToken(partition=1, epoch=99, node=1))
