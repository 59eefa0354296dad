"""What a partition worker may use of the node process that hosts it (`WorkerHost`)."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from laminar_orchestration.dataplane.batches import (
    InFlightBatch,
    ReadAhead,
)
from laminar_orchestration.dataplane.checkpoint import CheckpointStore, OutputWriter
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.dataplane.engine import BatchEngine
from laminar_orchestration.dataplane.restore import StateReplica
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.metrics import NodeMetrics
from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestPublisher
from laminar_orchestration.protocol.cluster_epoch import ClusterEpochWindow
from laminar_orchestration.protocol.fencing import (
    PartitionGuardSet,
)
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.source import SourceLog


class WorkerHost(Protocol):
    """What a partition worker uses of the node process that hosts it, and nothing more.

    The node (`dataplane.node.Node`) is the one implementation; the worker never
    reaches past this interface into the node's own state.
    """

    id: NodeId
    config: NodeConfig
    ledger: Ledger
    engine: BatchEngine
    source: SourceLog
    publisher: ManifestPublisher
    outputs: OutputWriter
    checkpoints: CheckpointStore
    guards: PartitionGuardSet
    epoch_window: ClusterEpochWindow
    snapshot_pool: ThreadPoolExecutor
    scratch: Path
    cluster_epoch: int
    metrics: NodeMetrics

    @property
    def generation(self) -> int:
        """This process's generation in its node record."""
        ...

    def report_now(self) -> None:
        """Heartbeat at once (a migration phase reported)."""

    def note_committed(self, version: ManifestVersion, outputs: Mapping[str, pa.Table]) -> None:
        """A batch was committed: its entry and output rows, for the output table (kept in memory)."""

    def observe_cluster_epoch(self, epoch: int) -> None:
        """Slide the node's cluster-epoch window to `epoch` if it is newer."""

    def take_over_copy(self, partition: PartitionId) -> tuple[StateReplica, InFlightBatch | None, ReadAhead | None]:
        """The local copy of `partition` to take over (a standby's, warm, if there is one)."""
        ...

    def follow_as_standby(self, replica: StateReplica) -> bool:
        """Keep following `replica`'s partition as a standby; False if this node is not one for it."""
        ...
