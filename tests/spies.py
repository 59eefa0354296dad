"""Spies for tests that count what a node does: each wraps a library method, records, and calls through."""

from __future__ import annotations

from typing import Any

import pytest

from laminar_orchestration.protocol.segments import SourceBatch
from laminar_orchestration.protocol.source import SourceLog


def spy_source_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the `from_offset` of every `SourceLog.read` (every node of this process), in order."""
    reads: list[int] = []
    read = SourceLog.read

    def spy_read(self: SourceLog, partition: int, from_offset: int, *args: Any, **kwargs: Any) -> SourceBatch | None:
        reads.append(from_offset)
        return read(self, partition, from_offset, *args, **kwargs)

    monkeypatch.setattr(SourceLog, "read", spy_read)
    return reads
