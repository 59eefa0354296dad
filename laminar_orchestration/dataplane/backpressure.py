"""Backpressure computed from positions (the source head and the manifest), never from listing the store.

A partition's lag is the number of events written to its source log but not yet
reflected in a committed manifest: ``lag = written - committed``.
"""

from __future__ import annotations

from dataclasses import dataclass

from laminar_orchestration.dataplane.errors import Backpressure
from laminar_orchestration.store import ObjectStore


@dataclass(frozen=True)
class Accept:
    pending_lag: int


@dataclass(frozen=True)
class AcceptWithWarning:
    pending_lag: int
    soft_threshold: int


@dataclass(frozen=True)
class Reject:
    pending_lag: int
    hard_threshold: int
    retry_after_s: float


BackpressureDecision = Accept | AcceptWithWarning | Reject


@dataclass(frozen=True)
class BackpressureState:
    """Positions of one partition and the thresholds that apply to it."""

    partition: int
    last_written_position: int
    last_committed_position: int
    soft_threshold: int
    hard_threshold: int
    retry_after_s: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.soft_threshold <= self.hard_threshold:
            raise ValueError("thresholds must satisfy 0 < soft <= hard")

    @property
    def pending_lag(self) -> int:
        return max(0, self.last_written_position - self.last_committed_position)

    def evaluate(self) -> BackpressureDecision:
        lag = self.pending_lag
        if lag >= self.hard_threshold:
            return Reject(lag, self.hard_threshold, self.retry_after_s)
        if lag >= self.soft_threshold:
            return AcceptWithWarning(lag, self.soft_threshold)
        return Accept(lag)


def partition_backpressure(
    store: ObjectStore, partition: int, *, soft_threshold: int, hard_threshold: int
) -> BackpressureState:
    """Positions of `partition` read by key: the source head and the current manifest."""
    from laminar_orchestration.identity import PartitionId
    from laminar_orchestration.protocol.chain import ManifestReader
    from laminar_orchestration.protocol.source import SourceLog

    written = SourceLog(store).end_offset(partition)
    current = ManifestReader(store).current(PartitionId(partition))
    committed = current.manifest.source_offset if current else 0
    return BackpressureState(partition, written, committed, soft_threshold, hard_threshold)


def admit(states: list[BackpressureState]) -> list[AcceptWithWarning]:
    """Raise Backpressure for the first partition past its hard threshold; return the warnings."""
    warnings = []
    for state in states:
        decision = state.evaluate()
        if isinstance(decision, Reject):
            raise Backpressure(state.partition, decision.pending_lag, decision.hard_threshold, decision.retry_after_s)
        if isinstance(decision, AcceptWithWarning):
            warnings.append(decision)
    return warnings
