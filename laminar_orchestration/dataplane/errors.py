"""The data plane's errors: a fenced worker, an aborted phase, a state machine misused, backpressure,
unusable checkpoints and local state, a handoff whose chain does not follow the release, and a
processor the cluster did not record."""

from __future__ import annotations

from laminar_orchestration.errors import (
    ConflictError,
    CorruptDataError,
    FencedError,
    InvalidInputError,
    OperationFailedError,
    UnavailableError,
)
from laminar_orchestration.identity import PartitionId

__all__ = [
    "Backpressure",
    "CheckpointCorrupt",
    "Fenced",
    "HandoffMismatch",
    "IllegalWorkerTransition",
    "LocalStateUnusable",
    "LocalStateWriteFailed",
    "PhaseAborted",
    "ProcessorMismatch",
    "SnapshotCancelled",
    "StateGap",
]


class Fenced(FencedError):
    """Raised inside a worker when its tracker is fenced; unwinds without side effects."""

    reason: str

    message = "{reason}"


class PhaseAborted(OperationFailedError):
    """The migration this worker was carrying out was cancelled or failed."""


class IllegalWorkerTransition(OperationFailedError):
    """A partition worker was moved from `old` to a state that may not follow it (a bug in the node);
    `allowed` holds the states that may follow `old` (`worker_state.TRANSITIONS`)."""

    old: str
    new: str
    allowed: tuple[str, ...]

    def _message(self) -> str:
        allowed = ", ".join(self.allowed) or "nothing"
        return f"partition worker cannot go from {self.old} to {self.new} (allowed: {allowed})"


class Backpressure(UnavailableError):
    """Raised to a producer when a partition's lag is past the hard threshold."""

    partition: int
    pending_lag: int
    hard_threshold: int
    retry_after_s: float

    message = (
        "partition {partition} is {pending_lag} events behind "
        "(hard limit {hard_threshold}); retry after {retry_after_s:.1f}s"
    )


class CheckpointCorrupt(CorruptDataError):
    """A checkpoint or output object whose bytes do not match its manifest entry."""

    key: str
    reason: str

    message = "checkpoint object {key!r} is unusable: {reason}"


class SnapshotCancelled(ConflictError):
    """A snapshot upload stopped because its partition is moving or stopping (nothing was published)."""

    partition: int

    message = "snapshot upload of partition {partition} cancelled"


class ProcessorMismatch(InvalidInputError):
    """A node whose processor is not the one the cluster recorded: it refuses to take partitions,
    since mixed logic (or a changed state layout) would corrupt state silently."""

    node: int
    recorded: str
    recorded_fingerprint: str
    running: str
    fingerprint: str

    message = (
        "node {node} runs processor {running!r} (fingerprint {fingerprint:.12}), but the cluster records "
        "{recorded!r} (fingerprint {recorded_fingerprint:.12}); start it with the cluster's processor"
    )


class StateGap(CorruptDataError):
    """A manifest whose snapshot and deltas do not add up to its source offset."""

    partition: int
    seq: int
    reason: str

    message = "manifest seq {seq} of partition {partition} names an unusable checkpoint: {reason}"


class LocalStateUnusable(CorruptDataError):
    """A local store directory that cannot be opened or does not hold a valid applied marker."""

    path: str
    reason: str

    message = "local state store {path} is unusable: {reason}"


class LocalStateWriteFailed(UnavailableError):
    """Writing the local store failed (disk full, I/O error): the batch is not applied."""

    path: str
    reason: str

    message = "cannot write local state store {path}: {reason}"


class HandoffMismatch(CorruptDataError):
    """A graceful handoff whose manifest chain does not continue from the commit the old owner released."""

    partition: PartitionId
    released_commit: str
    found_commit: str | None

    def _message(self) -> str:
        return (
            f"partition {self.partition}: the old owner released commit {self.released_commit}, "
            f"but the manifest chain continues from {self.found_commit or 'nothing'}"
        )
