"""Seed 003 unit tests: the migration record, its phases, config defaults and errors."""

from __future__ import annotations

import itertools

import pytest

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ledger import Ledger
from laminar_orchestration.migration import (
    FORCED_PHASES,
    GRACEFUL_PHASES,
    CheckpointFailed,
    DesiredState,
    DownloadFailed,
    InvalidTransition,
    LedgerCommitFailed,
    MigrationConfig,
    MigrationCoordinator,
    MigrationEpochConflict,
    MigrationKind,
    MigrationNotOwned,
    MigrationPhase,
    MigrationTask,
    MigrationTimeout,
    NoLiveNode,
    OldOwnerCrashed,
    RestoreFailed,
    SeekFailed,
    UploadFailed,
    check_transition,
)
from laminar_orchestration.records import ReleaseRecord, now
from laminar_orchestration.store import ObjectStore

P, N = PartitionId, NodeId
G, F = MigrationKind.GRACEFUL, MigrationKind.FORCED


def test_migration_phase_transitions_linear() -> None:
    for kind, seq in ((G, GRACEFUL_PHASES), (F, FORCED_PHASES)):
        for current, nxt in itertools.pairwise(seq):
            check_transition(kind, current, nxt)
        for i, current in enumerate(seq):
            for j, target in enumerate(seq):
                if j != i + 1:
                    with pytest.raises(InvalidTransition):
                        check_transition(kind, current, target)  # no skipping, no going back
    assert GRACEFUL_PHASES == (
        MigrationPhase.PLANNED, MigrationPhase.DRAINING, MigrationPhase.CHECKPOINTING, MigrationPhase.UPLOADING,
        MigrationPhase.RELEASED, MigrationPhase.DOWNLOADING, MigrationPhase.RESTORING, MigrationPhase.SEEKING,
        MigrationPhase.ACTIVE,
    )  # fmt: skip
    # Cancelling is possible only before the old epoch is released; terminal phases are final.
    check_transition(G, MigrationPhase.UPLOADING, MigrationPhase.CANCELLED)
    with pytest.raises(InvalidTransition):
        check_transition(G, MigrationPhase.RELEASED, MigrationPhase.CANCELLED)
    for terminal in (MigrationPhase.ACTIVE, MigrationPhase.FAILED, MigrationPhase.CANCELLED):
        with pytest.raises(InvalidTransition):
            check_transition(G, terminal, MigrationPhase.FAILED)


def test_migration_phase_failed_captures_context(store: ObjectStore) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(1)
    ledger.register_node(N(1))
    ledger.register_node(N(2))
    ledger.acquire(P(0), N(1), expected_epoch=0)
    coordinator = MigrationCoordinator(ledger)
    task = coordinator.plan(P(0), N(2))
    coordinator._transition(P(0), task.migration_id, MigrationPhase.DRAINING)
    failed = coordinator.fail(P(0), task.migration_id, "disk full")
    assert failed.phase == MigrationPhase.FAILED
    assert (failed.failed_phase, failed.error) == (MigrationPhase.DRAINING, "disk full")
    assert failed.completed_at is not None
    stored = coordinator.current(P(0))
    assert stored == failed  # persisted before anything else happens
    # A failed migration frees the partition for the next one.
    assert coordinator.plan(P(0), N(2)).migration_id != task.migration_id


def test_migration_task_creation(store: ObjectStore) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(2)
    ledger.register_node(N(1))
    ledger.register_node(N(2))
    ledger.acquire(P(1), N(1), expected_epoch=0)
    coordinator = MigrationCoordinator(ledger, MigrationConfig(migration_timeout_s=12))
    task = coordinator.plan(P(1), N(2))
    assert (task.partition, task.from_node, task.to_node) == (1, 1, 2)
    assert (task.from_epoch, task.to_epoch) == (1, 2)
    assert task.phase == MigrationPhase.PLANNED and task.migration_kind == G
    assert task.timeout_s == 12 and task.completed_at is None and task.started_at <= now()
    with pytest.raises(MigrationEpochConflict):
        coordinator.plan(P(1), N(2))  # one migration per partition at a time
    with pytest.raises(NoLiveNode):
        coordinator.plan(P(0), N(7))
    unassigned = coordinator.plan(P(0), N(2))
    assert unassigned.migration_kind == F and unassigned.from_node == 0  # placement is a forced move


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
        30.0, 15.0, 60.0,
    )  # fmt: skip
    assert (config.max_concurrent_migrations, config.max_retries, config.retry_delay_s) == (2, 3, 5.0)
    with pytest.raises(ValueError, match="max_retrys"):
        MigrationConfig.model_validate({"max_retrys": 2})
    with pytest.raises(ValueError):
        MigrationConfig(max_concurrent_migrations=0)


def test_migration_error_display() -> None:
    p = P(4)
    errors = [
        (MigrationNotOwned(p, N(2)), "partition 4 is not owned by node 2"),
        (
            MigrationTimeout(p, MigrationPhase.DRAINING, 15.0),
            "migration timeout for partition 4 at draining after 15.0s",
        ),
        (CheckpointFailed(p, "disk full"), "checkpoint failed for partition 4: disk full"),
        (UploadFailed(p, "503"), "upload failed for partition 4: 503"),
        (DownloadFailed(p, "ckpt-1", "missing"), "download failed for partition 4 (checkpoint ckpt-1): missing"),
        (RestoreFailed(p, "bad parquet"), "restore failed for partition 4: bad parquet"),
        (LedgerCommitFailed(p, "412"), "ledger commit failed for partition 4: 412"),
        (OldOwnerCrashed(p, 9), "old owner crashed for partition 4 at epoch 9"),
        (MigrationEpochConflict(p, 3, 5), "epoch conflict for partition 4: expected=3, actual=5"),
        (SeekFailed(p, "offset gone"), "source seek failed for partition 4: offset gone"),
    ]
    for error, text in errors:
        assert str(error) == text
    assert OldOwnerCrashed(p, 9).last_known_epoch == 9  # fields, not strings to parse
