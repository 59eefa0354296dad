"""Each transfer op (plan, upload, download) says what its byte count counts: three different transfers
whose figures differ by design (the target's warm-up, the old owner's snapshot, the target's remainder)."""

from __future__ import annotations

import pytest

from jobs.common import report_metadata
from laminar_orchestration.protocol.tasks import MigrationPhase, PhaseReport

pytestmark = pytest.mark.dagster


def test_each_transfer_ops_bytes_name_what_they_count() -> None:
    counted = {}
    for phase in (MigrationPhase.PLANNED, MigrationPhase.UPLOADING, MigrationPhase.DOWNLOADING):
        meta = report_metadata(PhaseReport(phase, 0.5, 3072, "done"), transfer=True)
        assert meta["bytes_moved"].value == 3072
        counted[phase] = str(meta["bytes_counted"].value)
    assert "warming up" in counted[MigrationPhase.PLANNED]
    assert "old owner" in counted[MigrationPhase.UPLOADING]
    assert "after the drain" in counted[MigrationPhase.DOWNLOADING]
    # Not a transfer: no bytes, nothing to explain.
    fence = report_metadata(PhaseReport(MigrationPhase.SEEKING, 0.1, 0, "sought"), transfer=False)
    assert "bytes_counted" not in fence and "bytes_moved" not in fence
