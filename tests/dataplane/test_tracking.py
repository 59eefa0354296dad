"""What a partition worker keeps about itself: its kill switch (`Tracker`) stays fenced with the first
reason once any thread fences it, the errors that end a batch or a phase are of their kind, and a
committed batch's timings say where its time went."""

from __future__ import annotations

import dataclasses
import threading

from laminar_orchestration.dataplane.errors import Fenced, PhaseAborted
from laminar_orchestration.dataplane.tracking import BatchSteps, BatchTimings, Tracker, elapsed_ms
from laminar_orchestration.errors import ErrorKind, FencedError
from laminar_orchestration.identity import PartitionId


def test_a_tracker_once_fenced_stays_fenced_with_its_first_reason() -> None:
    tracker = Tracker(PartitionId(4))
    assert not tracker.is_fenced and tracker.reason is None
    # The node's kill-switch check and a refused commit fence it from their own threads.
    fencer = threading.Thread(target=tracker.fence, args=("stale epoch 3 (current 4)",))
    fencer.start()
    fencer.join(10)
    assert tracker.is_fenced and tracker.reason == "stale epoch 3 (current 4)"
    tracker.fence("manifest chain moved")
    assert tracker.is_fenced and tracker.reason == "stale epoch 3 (current 4)"


def test_fenced_says_its_reason_and_phase_aborted_is_a_failure_not_a_fence() -> None:
    fenced = Fenced("stale epoch 3 (current 4)")
    assert isinstance(fenced, FencedError) and fenced.error_kind == ErrorKind.FENCED
    assert str(fenced) == "stale epoch 3 (current 4)"
    aborted = PhaseAborted()
    assert not isinstance(aborted, FencedError) and aborted.error_kind == ErrorKind.FAILED


def test_a_batchs_timings_are_its_steps_then_its_commits_in_milliseconds() -> None:
    assert elapsed_ms(10.0, 10.25) == 250.0
    steps = BatchSteps(events=500, stage_ms=12.4, spark_ms=180.0, wait_ms=0.0, read_ms=3.0, merge_ms=9.6)
    # The worker builds the committed batch's timings from the steps known before its commit.
    timings = BatchTimings(**dataclasses.asdict(steps), output_ms=30.0, delta_ms=15.0, publish_ms=4.0, apply_ms=1.0)
    assert str(timings) == (
        "500 events: stage 12 ms, spark 180 ms (waited 0), merge 10 ms (read 3), "
        "output 30 ms, delta 15 ms, publish 4 ms, apply 1 ms"
    )
