"""The migration timeouts agree with each other: the whole move's is never below a phase's, by default
and when an operator sets both (the Launchpad's `tuning`, the CLI flags); a contradiction is refused
naming both fields."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from laminar_orchestration.protocol.tasks import MigrationConfig

PHASE_TIMEOUTS = ("release_wait_timeout_s", "checkpoint_transfer_timeout_s")


def test_the_default_whole_move_timeout_covers_each_phase_timeout() -> None:
    config = MigrationConfig()
    for name in PHASE_TIMEOUTS:
        assert config.migration_timeout_s >= getattr(config, name), name


@pytest.mark.parametrize("phase", PHASE_TIMEOUTS)
def test_a_whole_move_timeout_below_a_phase_timeout_set_with_it_is_refused_naming_both(phase: str) -> None:
    with pytest.raises(ValidationError) as refused:
        MigrationConfig.model_validate({"migration_timeout_s": 20.0, phase: 60.0})
    text = str(refused.value)
    assert "migration_timeout_s" in text and phase in text and "20" in text and "60" in text
    assert MigrationConfig.model_validate({"migration_timeout_s": 60.0, phase: 60.0}).migration_timeout_s == 60.0


def test_a_short_whole_move_timeout_alone_caps_the_phases() -> None:
    # Set alone, the whole move's deadline bounds every phase (a move that must give up quickly).
    assert MigrationConfig(migration_timeout_s=0.05).migration_timeout_s == 0.05
