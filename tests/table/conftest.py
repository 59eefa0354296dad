"""The output table's tests find the table where the store says, whatever the caller's environment."""

from __future__ import annotations

import pytest

from laminar_orchestration.table.location import TABLE_URI_ENV


@pytest.fixture(autouse=True)
def _no_table_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # ``$LAMINAR_TABLE_URI`` overrides the recorded and the default location (`table_location`).
    monkeypatch.delenv(TABLE_URI_ENV, raising=False)
