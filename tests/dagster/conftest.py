"""Fixtures for the Dagster tests: a ledger on a local store and the `LaminarResource` pointed at it."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import LocalObjectStore
from resources import LaminarResource
from tests.ledgers import make_alive, new_ledger


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return new_ledger(LocalObjectStore(tmp_path / "store"))


@pytest.fixture
def laminar(ledger: Ledger) -> LaminarResource:
    return LaminarResource(store_url=ledger.store.url)


@pytest.fixture
def partition_0_on_node_1(ledger: Ledger) -> None:
    """Nodes 1 and 2 alive and partition 0 granted to node 1: a move of it to node 2 can be planned."""
    make_alive(ledger, 1, 2)
    ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
