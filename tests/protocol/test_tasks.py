"""Unit tests of the migration record (`protocol.tasks`): the phases of each kind of move and the
transitions between them, the task and desired-state records (and a release record) as JSON, the
migration config's defaults and the migration errors' messages. The coordinator that writes these
records is tested in `tests/control/test_coordinator.py`."""

from __future__ import annotations

import itertools

import pytest

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol import migration_errors, tasks
from laminar_orchestration.protocol.desired_states import DesiredState
from laminar_orchestration.protocol.records import ReleaseRecord, now
from laminar_orchestration.protocol.tasks import (
    FORCED_PHASES,
    GRACEFUL_PHASES,
    MigrationConfig,
    MigrationKind,
    MigrationPhase,
    MigrationTask,
    check_transition,
)

P, N = PartitionId, NodeId
G, F = MigrationKind.GRACEFUL, MigrationKind.FORCED


def test_migration_phase_transitions_linear() -> None:
    for kind, seq in ((G, GRACEFUL_PHASES), (F, FORCED_PHASES)):
        for current, nxt in itertools.pairwise(seq):
            check_transition(kind, current, nxt)
        for i, current in enumerate(seq):
            for j, target in enumerate(seq):
                if j != i + 1:
                    with pytest.raises(tasks.InvalidTransition):
                        check_transition(kind, current, target)  # no skipping, no going back
    assert GRACEFUL_PHASES == (
        MigrationPhase.PLANNED, MigrationPhase.DRAINING, MigrationPhase.CHECKPOINTING, MigrationPhase.UPLOADING,
        MigrationPhase.RELEASED, MigrationPhase.DOWNLOADING, MigrationPhase.RESTORING, MigrationPhase.SEEKING,
        MigrationPhase.ACTIVE,
    )  # fmt: skip
    # Cancelling is possible until the new owner may take the epoch (Seeking); terminal phases are final.
    for kind, seq in ((G, GRACEFUL_PHASES), (F, FORCED_PHASES)):
        for phase in seq[: seq.index(MigrationPhase.SEEKING)]:
            check_transition(kind, phase, MigrationPhase.CANCELLED)
        for phase in (MigrationPhase.SEEKING, MigrationPhase.ACTIVE):
            with pytest.raises(tasks.InvalidTransition):
                check_transition(kind, phase, MigrationPhase.CANCELLED)
    for terminal in (MigrationPhase.ACTIVE, MigrationPhase.FAILED, MigrationPhase.CANCELLED):
        with pytest.raises(tasks.InvalidTransition):
            check_transition(G, terminal, MigrationPhase.FAILED)


def test_phase_predicates_follow_each_kinds_sequence() -> None:
    """`reached` agrees with the order of both sequences; the aborted phases reach only themselves."""
    for seq in (GRACEFUL_PHASES, FORCED_PHASES):
        for i, a in enumerate(seq):
            for j, b in enumerate(seq):
                assert a.reached(b) == (i >= j), (a, b)
    aborted = (MigrationPhase.FAILED, MigrationPhase.CANCELLED)
    for phase in aborted:
        assert phase.is_aborted and phase.is_terminal and not phase.cancellable
        assert phase.reached(phase)
        assert not any(phase.reached(p) for p in GRACEFUL_PHASES)
        assert not any(p.reached(phase) for p in GRACEFUL_PHASES)
    assert [p for p in MigrationPhase if p.is_terminal] == [MigrationPhase.ACTIVE, *aborted]
    # The old owner's phases are exactly those of a graceful move that a forced move skips, plus Released.
    old_owner = [p for p in GRACEFUL_PHASES if p.needs_old_owner]
    assert old_owner == [p for p in GRACEFUL_PHASES if p not in FORCED_PHASES] + [MigrationPhase.RELEASED]
    assert [p for p in GRACEFUL_PHASES if p.cancellable] == list(
        GRACEFUL_PHASES[: GRACEFUL_PHASES.index(MigrationPhase.SEEKING)]
    )


def test_task_and_desired_state_round_trip_and_reject_typos() -> None:
    ts = now()
    task = MigrationTask(
        migration_id="m", partition=3, migration_kind=G, from_node=1, to_node=2, from_epoch=4, to_epoch=5,
        phase=MigrationPhase.SEEKING, started_at=ts, updated_at=ts, timeout_s=30,
    )  # fmt: skip
    state = DesiredState(partition=3, owner=1, migration=task, updated_at=ts)
    assert DesiredState.model_validate_json(state.model_dump_json()) == state
    with pytest.raises(ValueError, match="phaze"):
        MigrationTask.model_validate({**task.model_dump(), "phaze": "active"})


def test_release_info_serialization() -> None:
    record = ReleaseRecord(
        partition=2, epoch=7, node=3, commit_ulid="01J0000000000000000000000A", source_offset=1234, released_at=now()
    )
    assert ReleaseRecord.model_validate_json(record.model_dump_json()) == record


def test_migration_config_defaults() -> None:
    config = MigrationConfig()
    assert (config.migration_timeout_s, config.release_wait_timeout_s, config.checkpoint_transfer_timeout_s) == (
        30.0, 15.0, 30.0,
    )  # fmt: skip
    assert (config.max_concurrent_migrations, config.max_retries, config.retry_delay_s) == (2, 3, 5.0)
    with pytest.raises(ValueError, match="max_retrys"):
        MigrationConfig.model_validate({"max_retrys": 2})
    with pytest.raises(ValueError):
        MigrationConfig(max_concurrent_migrations=0)


def test_migration_error_display() -> None:
    p = P(4)
    errors = [
        (migration_errors.MigrationNotOwned(p, N(2)), "partition 4 is not owned by node 2"),
        (
            migration_errors.MigrationTimeout(p, MigrationPhase.DRAINING, 15.0),
            "migration timeout for partition 4 at draining after 15.0s",
        ),
        (migration_errors.CheckpointFailed(p, "disk full"), "checkpoint failed for partition 4: disk full"),
        (migration_errors.UploadFailed(p, "503"), "upload failed for partition 4: 503"),
        (
            migration_errors.DownloadFailed(p, "ckpt-1", "missing"),
            "download failed for partition 4 (checkpoint ckpt-1): missing",
        ),
        (migration_errors.RestoreFailed(p, "bad parquet"), "restore failed for partition 4: bad parquet"),
        (migration_errors.LedgerCommitFailed(p, "412"), "ledger commit failed for partition 4: 412"),
        (migration_errors.OldOwnerCrashed(p, 9), "old owner crashed for partition 4 at epoch 9"),
        (migration_errors.MigrationEpochConflict(p, 3, 5), "epoch conflict for partition 4: expected=3, actual=5"),
        (migration_errors.SeekFailed(p, "offset gone"), "source seek failed for partition 4: offset gone"),
    ]
    for error, text in errors:
        assert str(error) == text
    assert migration_errors.OldOwnerCrashed(p, 9).last_known_epoch == 9  # fields, not strings to parse
