"""Identifiers shared by every layer: partitions, nodes and the reserved values."""

from __future__ import annotations

from typing import NewType

#: A partition of the input log, 0-based.
PartitionId = NewType("PartitionId", int)

#: A worker node, >= 1. Node 0 is the "unassigned" sentinel: a grant to it fences without giving ownership.
NodeId = NewType("NodeId", int)

UNASSIGNED = NodeId(0)

#: Epoch 0 is reserved: a partition at epoch 0 has never been granted to anyone.
RESERVED_EPOCH = 0

#: Most partitions a cluster may have. Keys spell partition ids with five digits
#: (``ledger/partitions/00042``), and a bound keeps `init` and full-cluster scans finite.
MAX_PARTITIONS = 65_536
