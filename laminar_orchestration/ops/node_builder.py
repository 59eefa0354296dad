"""One way to build a worker node from its `NodeConfig`, whoever runs it.

`laminar node run`, the Dagster ``worker_node`` job and the demo's nodes (which
run `laminar node run`) all build their node here, so each keeps the output
table and the same heartbeat timing.
"""

from __future__ import annotations

from typing import Any

from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.dataplane.node import Node
from laminar_orchestration.processing.contract import Processor
from laminar_orchestration.store import ObjectStore, open_store
from laminar_orchestration.table import TableCommitter

__all__ = ["build_node", "heartbeat_clamped"]

#: Heartbeats that fit in one heartbeat timeout at least.
HEARTBEATS_PER_TIMEOUT = 3


def heartbeat_clamped(config: NodeConfig) -> NodeConfig:
    """`config` with its heartbeat interval at most a third of its timeout: several heartbeats fit in
    a timeout, so one lost PUT never makes a live node look dead."""
    interval = min(config.heartbeat_interval_s, config.heartbeat_timeout_s / HEARTBEATS_PER_TIMEOUT)
    if interval == config.heartbeat_interval_s:
        return config
    return config.model_copy(update={"heartbeat_interval_s": interval})


def build_node(
    config: NodeConfig,
    *,
    store: ObjectStore | None = None,
    spark: Any = None,
    processor: Processor | None = None,
) -> Node:
    """The worker node `config` describes: on `store` (else the one `config.store_url` names), its
    batches on `spark` (else a session of its own), its commits appended to the output table, its
    metrics served when `config.metrics_port` is set, its heartbeats clamped (`heartbeat_clamped`)."""
    opened = store if store is not None else open_store(config.store_url)
    # The committed output is also a Delta table beside the store (`laminar table`).
    committer = TableCommitter(opened, node=config.node_id)
    return Node(heartbeat_clamped(config), store=opened, spark=spark, processor=processor, output_table=committer)
