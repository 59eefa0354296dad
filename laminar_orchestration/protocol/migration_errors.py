"""The errors of carrying out a migration: one type per phase that can fail, plus the record
conflicts. Their base, `tasks.MigrationError`, and the phase machine's own `InvalidTransition`
live with the phases."""

from __future__ import annotations

from laminar_orchestration.errors import ConflictError, OperationFailedError, UnavailableError
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.tasks import MigrationError, MigrationPhase


class MigrationNotOwned(MigrationError, ConflictError):
    """The named old owner does not hold the partition (or the target already does: nothing to move)."""

    partition: PartitionId
    node: NodeId

    message = "partition {partition} is not owned by node {node}"


class MigrationTimeout(MigrationError, UnavailableError):
    partition: PartitionId
    phase: MigrationPhase
    elapsed_s: float

    message = "migration timeout for partition {partition} at {phase} after {elapsed_s:.1f}s"


class CheckpointFailed(MigrationError, OperationFailedError):
    partition: PartitionId
    source: str

    message = "checkpoint failed for partition {partition}: {source}"


class UploadFailed(MigrationError, OperationFailedError):
    partition: PartitionId
    source: str

    message = "upload failed for partition {partition}: {source}"


class DownloadFailed(MigrationError, OperationFailedError):
    partition: PartitionId
    checkpoint: str
    source: str

    message = "download failed for partition {partition} (checkpoint {checkpoint}): {source}"


class RestoreFailed(MigrationError, OperationFailedError):
    partition: PartitionId
    source: str

    message = "restore failed for partition {partition}: {source}"


class LedgerCommitFailed(MigrationError, OperationFailedError):
    """The ledger write of a release or acquisition failed (the store refused or lost it)."""

    partition: PartitionId
    source: str

    message = "ledger commit failed for partition {partition}: {source}"


class OldOwnerCrashed(MigrationError, UnavailableError):
    """The old owner stopped heartbeating mid-release; fall back to the forced path."""

    partition: PartitionId
    last_known_epoch: int

    message = "old owner crashed for partition {partition} at epoch {last_known_epoch}"


class MigrationEpochConflict(MigrationError, ConflictError):
    """Another migration of the partition is in progress, or its epoch moved."""

    partition: PartitionId
    expected: int
    actual: int
    #: The migration whose record is in the way, when known (never the caller's own).
    other_migration: str | None = None

    def _message(self) -> str:
        text = f"epoch conflict for partition {self.partition}: expected={self.expected}, actual={self.actual}"
        return text if self.other_migration is None else f"{text} (migration {self.other_migration} in the way)"


class FenceLost(MigrationError):
    """A forced migration's fence found the epoch already moved: another fence or grant landed first.

    The migration is recorded Failed before this is raised, so a new one can be planned.
    """

    partition: PartitionId
    migration_id: str
    expected: int
    actual: int

    message = (
        "migration {migration_id} lost the fence race for partition {partition}: "
        "expected epoch {expected}, found {actual}"
    )


class NothingToCancel(MigrationError):
    """`cancel` found no migration in flight for the partition."""

    partition: PartitionId
    #: The last migration of the partition and how it ended, if any.
    last_migration: str | None = None
    last_phase: MigrationPhase | None = None

    def _message(self) -> str:
        if self.last_migration is None:
            return f"no migration of partition {self.partition} to cancel"
        return (
            f"no migration of partition {self.partition} to cancel "
            f"(the last one, {self.last_migration}, ended {self.last_phase})"
        )


class CancelRefused(MigrationError):
    """The migration is past the point where cancelling is safe (the new owner may hold the epoch)."""

    partition: PartitionId
    migration_id: str
    phase: MigrationPhase

    message = (
        "cannot cancel migration {migration_id} of partition {partition} at phase {phase}: "
        "the new owner may already hold the epoch; let it finish or fail"
    )


class SeekFailed(MigrationError, OperationFailedError):
    partition: PartitionId
    source: str

    message = "source seek failed for partition {partition}: {source}"


class MigrationFailed(MigrationError, OperationFailedError):
    """A node reported a failure for the phase it was carrying out."""

    partition: PartitionId
    phase: MigrationPhase
    error: str

    message = "migration of partition {partition} failed at {phase}: {error}"


class NoLiveNode(MigrationError, UnavailableError):
    node: NodeId

    message = "node {node} is not a live member: it cannot receive a partition"
