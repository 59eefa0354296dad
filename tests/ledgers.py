"""Ledgers for tests: a freshly initialized cluster, and node records left alive or to lapse (no node process)."""

from __future__ import annotations

import time

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.tasks import DesiredStates
from laminar_orchestration.store import ObjectStore


def new_ledger(store: ObjectStore, partitions: int = 4) -> Ledger:
    """A ledger on `store` whose cluster is initialized with `partitions` partitions."""
    led = Ledger(store)
    led.init_cluster(partitions)
    return led


def make_dead(ledger: Ledger, node: int) -> None:
    """A node record whose heartbeat has lapsed."""
    ledger.register_node(NodeId(node), heartbeat_timeout_s=0.05)
    time.sleep(0.1)


def make_alive(ledger: Ledger, *nodes: int) -> None:
    """Node records with a long heartbeat timeout."""
    for n in nodes:
        ledger.register_node(NodeId(n), heartbeat_timeout_s=60)


def place_on_node_1(ledger: Ledger) -> None:
    """Partition 0 desired on node 1 and granted to it at epoch 1, as the control plane places it."""
    DesiredStates(ledger).update(PartitionId(0), lambda s: s.model_copy(update={"owner": 1}))
    ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0, reason="place", generation=1)
