"""Ledgers for tests: a freshly initialized cluster, node records left alive or to lapse (no node process),
and a grant whose granter died before its seal."""

from __future__ import annotations

import time

import pytest

from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import OutputCommitter
from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.fencing import FencingToken
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import ObjectStore


def new_ledger(store: ObjectStore, partitions: int = 4) -> Ledger:
    """A ledger on `store` whose cluster is initialized with `partitions` partitions."""
    led = Ledger(store)
    led.init_cluster(partitions)
    return led


def make_dead(ledger: Ledger, node: int) -> None:
    """A node record whose heartbeat has lapsed."""
    ledger.members.register_node(NodeId(node), heartbeat_timeout_s=0.05)
    time.sleep(0.1)


def make_alive(ledger: Ledger, *nodes: int) -> None:
    """Node records with a long heartbeat timeout."""
    for n in nodes:
        ledger.members.register_node(NodeId(n), heartbeat_timeout_s=60)


def place_on_node_1(ledger: Ledger) -> None:
    """Partition 0 desired on node 1 and granted to it at epoch 1, as the control plane places it."""
    DesiredStates(ledger).update(PartitionId(0), lambda s: s.model_copy(update={"owner": 1}))
    ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0, reason="place", generation=1)


class GranterDied(BaseException):
    """The granting process dies (a BaseException: nothing on the way catches it)."""


def _dies_at_the_seal(*_args: object, **_kwargs: object) -> ManifestVersion:
    raise GranterDied


def fence_left_unsealed(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> tuple[FencingToken, ManifestPublisher]:
    """Node 1 holds partition 0 at epoch 1 and committed; a fence to "unassigned" creates grant 2 and
    its granter dies before sealing the chain. Returns node 1's token and publisher."""
    token = ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    publisher = ManifestPublisher(OutputCommitter(ledger.store), ledger.store)
    publisher.publish(token, ManifestUpdate(source_offset=10))
    granter = Ledger(ledger.store)
    monkeypatch.setattr(granter.sealer, "seal", _dies_at_the_seal)
    with pytest.raises(GranterDied):
        granter.fence(PartitionId(0), UNASSIGNED, expected_epoch=1, reason="drain node 1")
    return token, publisher
