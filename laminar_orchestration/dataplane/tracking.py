"""What a partition worker keeps about itself: its kill switch (`Tracker`), the errors that end
a batch or a phase, and the timing of each batch's steps."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from laminar_orchestration.identity import PartitionId


def elapsed_ms(start: float, end: float) -> float:
    return (end - start) * 1000.0


@dataclass(frozen=True)
class BatchSteps:
    """The timings of a batch known before its commit."""

    events: int
    stage_ms: float
    spark_ms: float
    wait_ms: float
    read_ms: float
    merge_ms: float


@dataclass(frozen=True)
class BatchTimings:
    """Where one committed batch's time went, in milliseconds (logged at DEBUG per commit)."""

    events: int
    stage_ms: float  # source batch written as Spark's input files
    spark_ms: float  # Spark's aggregate of the batch
    wait_ms: float  # how long the worker blocked on Spark (0 when a prefetch had finished)
    read_ms: float  # multi-get of the touched keys' previous values from the local store
    merge_ms: float  # that read + the processor's fold
    output_ms: float
    delta_ms: float
    publish_ms: float  # the manifest naming output, delta and offset
    apply_ms: float  # the delta written to the local store

    def __str__(self) -> str:
        return (
            f"{self.events} events: stage {self.stage_ms:.0f} ms, spark {self.spark_ms:.0f} ms "
            f"(waited {self.wait_ms:.0f}), merge {self.merge_ms:.0f} ms (read {self.read_ms:.0f}), "
            f"output {self.output_ms:.0f} ms, delta {self.delta_ms:.0f} ms, publish {self.publish_ms:.0f} ms, "
            f"apply {self.apply_ms:.0f} ms"
        )


class Tracker:
    """Per-partition kill-switch: once fenced, nothing of this partition is written."""

    def __init__(self, partition: PartitionId) -> None:
        self.partition = partition
        self._fenced = threading.Event()
        self.reason: str | None = None

    def fence(self, reason: str) -> None:
        if not self._fenced.is_set():
            self.reason = reason
            self._fenced.set()

    @property
    def is_fenced(self) -> bool:
        return self._fenced.is_set()
