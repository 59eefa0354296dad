"""Fixtures for the Dagster tests: a ledger on a local store and the `LaminarResource` pointed at it."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import LocalObjectStore
from resources import LaminarResource
from tests.ledgers import new_ledger


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return new_ledger(LocalObjectStore(tmp_path / "store"))


@pytest.fixture
def laminar(ledger: Ledger) -> LaminarResource:
    return LaminarResource(store_url=ledger.store.url)
