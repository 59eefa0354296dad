"""Figure 5 of the runtime benchmark: the Draining phase of a migration on a node running for real
(`Node.run`), with a batch in flight, a batch queued, or nothing to do.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.dataplane.worker import PartitionWorker
from laminar_orchestration.dataplane.worker_state import WorkerState
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import MigrationPhase

from .common import Row, median, progress, verdict
from .runtime_setup import (
    LOCAL,
    NODE2,
    P0,
    Report,
    events_table,
    fmt_list_ms,
    fmt_ms,
    new_local_cluster,
    new_node,
    wait_for,
    want_owner,
)

# Targets.
DRAIN_TARGET_MS = 100.0


# --- 5. drain ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DrainRun:
    scenario: str
    drain_s: float
    #: The drained owner committed the 10k batch (it finished before the drain took effect).
    committed: bool
    #: Seconds from the Draining request to that commit (None: no commit).
    commit_after_s: float | None
    #: Seconds from the Draining request until Spark gave up the batch (None: the cancel did not
    #: take effect, because no job of the batch was running when it came).
    cancelled_after_s: float | None


SCENARIOS = ("in-flight", "queued", "idle")

#: What `PartitionWorker._process` logs when the Spark run of an abandoned batch raised.
_ABANDONED_MESSAGE = "in-flight batch abandoned"


class _AbandonWatch(logging.Handler):
    """Timestamps of the node's "in-flight batch abandoned" log lines; forwards warnings to stderr."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.times: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if _ABANDONED_MESSAGE in record.getMessage():
            self.times.append(time.perf_counter())
        elif record.levelno >= logging.WARNING:
            sys.stderr.write(f"{record.levelname} {record.name}: {record.getMessage()}\n")


class DrainBench:
    """Node 1 running for real (`Node.run` in a thread) with partition 0; node 2 only registered."""

    def __init__(self, spark: Any, workroot: Path) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="drain-", dir=workroot))
        self.store, self.ledger = new_local_cluster(self.tmp)
        # The target of every migration: a live member that never runs (the drain is the
        # old owner's phase; each migration is cancelled right after it).
        self.ledger.members.register_node(NODE2, heartbeat_timeout_s=3600.0)
        self.node = new_node(self.store, spark, self.tmp / "node")  # default intervals
        want_owner(self.node)
        self.thread = threading.Thread(
            target=self.node.run, kwargs={"install_signals": False}, name="node-1", daemon=True
        )
        self.coordinator = MigrationCoordinator(self.ledger)
        self.source = SourceLog(self.store, segment_events=10_000)
        self.seed = 0
        self.watch = _AbandonWatch()
        self._logger = logging.getLogger("laminar.node")
        self._level = self._logger.level

    def start(self) -> None:
        self._logger.addHandler(self.watch)
        self._logger.setLevel(logging.INFO)
        self.thread.start()

        def running() -> bool:
            w = self.node.workers.get(P0)
            return w is not None and w.state_name == WorkerState.RUNNING

        wait_for(running, 120, "node 1 to run partition 0", interval=0.01)

    def _worker(self) -> PartitionWorker:
        w = self.node.workers.get(P0)
        if w is None:
            raise RuntimeError("node 1 runs no worker for partition 0")
        return w

    def _caught_up(self) -> None:
        end = self.source.end_offset(P0)
        w = self._worker()
        wait_for(
            lambda: w.progress().source_offset >= end and w.state_name == WorkerState.RUNNING,
            60,
            "the worker to catch up",
            interval=0.005,
        )

    def run(self, scenario: str) -> DrainRun:
        self._caught_up()
        w = self._worker()
        task = self.coordinator.plan(P0, NODE2)
        first = end = self.source.end_offset(P0)
        if scenario in ("in-flight", "queued"):
            self.seed += 1
            res = self.source.append(P0, events_table(10_000, seed=1000 + self.seed))
            first, end = res.first_offset, res.next_offset
        if scenario == "in-flight":
            # The worker read the segment and staged it for Spark (`batch-<start>-<attempt>`): in flight.
            def staged() -> bool:
                return any(w._workdir.glob(f"batch-{first}-*"))

            wait_for(lambda: staged() or w.progress().source_offset >= end, 10, "the batch to start")
        commits_before = w.progress().commits
        wall0 = datetime.now(UTC)
        t0 = time.perf_counter()
        self.coordinator.run_phase(P0, task.migration_id, MigrationPhase.DRAINING)
        drain_s = time.perf_counter() - t0
        prog = w.progress()
        commit_after: float | None = None
        if prog.commits > commits_before and prog.last_commit_at is not None:
            commit_after = (prog.last_commit_at - wall0).total_seconds()
        cancelled = [t - t0 for t in self.watch.times if t >= t0]
        self.coordinator.cancel(P0, task.migration_id)  # the worker resumes processing
        return DrainRun(
            scenario,
            drain_s,
            committed=end > first and prog.source_offset >= end,
            commit_after_s=commit_after,
            cancelled_after_s=cancelled[0] if cancelled else None,
        )

    def close(self) -> None:
        self.node.stop()
        self.thread.join(120)
        self._logger.removeHandler(self.watch)
        self._logger.setLevel(self._level)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _how(r: DrainRun) -> str:
    """c: committed by the drained owner; a: Spark cancel took effect; d: finished, then dropped."""
    if r.committed:
        return "c"
    if r.cancelled_after_s is not None:
        return "a"
    return "d" if r.scenario == "in-flight" else ""


def bench_drain(report: Report, spark: Any, workroot: Path, runs: int) -> None:
    bench = DrainBench(spark, workroot)
    results: dict[str, list[DrainRun]] = {s: [] for s in SCENARIOS}
    try:
        bench.start()
        for i in range(runs):
            for scenario in SCENARIOS:
                r = bench.run(scenario)
                results[scenario].append(r)
                progress(f"5. {scenario} run {i + 1}/{runs}: {r.drain_s * 1000:.0f} ms {_how(r)}")
    finally:
        bench.close()
    target = f"<= {DRAIN_TARGET_MS:.0f} ms"

    def add_drain(title: str, drain_s: float) -> None:
        report.add(Row(f"5. drain, {title} (median of {runs})", LOCAL, fmt_ms(drain_s), target,
                       verdict(drain_s * 1000, DRAIN_TARGET_MS)))  # fmt: skip

    inflight = results["in-flight"]
    add_drain("10k-event batch in flight", median([r.drain_s for r in inflight]))
    hows = [_how(r) for r in inflight]
    report.info(
        "5.   in-flight batch: cancelled (a) / ran on, dropped (d) / committed (c)",
        f"{hows.count('a')} / {hows.count('d')} / {hows.count('c')}",
    )
    cancels = [r.cancelled_after_s for r in inflight if r.cancelled_after_s is not None]
    if cancels:
        report.info("5.   Draining asked -> Spark gave the batch up (median)", fmt_ms(median(cancels)))
    commits = [r.commit_after_s for r in inflight if r.commit_after_s is not None]
    if commits:
        report.info("5.   Draining asked -> in-flight batch committed (median)", fmt_ms(median(commits)))
    queued = results["queued"]
    add_drain("10k produced then Draining asked at once", median([r.drain_s for r in queued]))
    idle = median([r.drain_s for r in results["idle"]])
    report.info(f"5. drain, idle worker, nothing queued (median of {runs})", fmt_ms(idle))
    report.note(
        "5: drain time = wall time of MigrationCoordinator.run_phase(DRAINING): read + CAS of the "
        "migration record, then polling (every 20 ms) node 1's ledger record until it reports Draining; "
        "node 1 (Node.run: its reconcile, heartbeat and refresh loops, default intervals) sees the phase "
        "through its reconcile loop (every 50 ms), which also abandons the in-flight batch (cancelJobGroup), "
        "stops between batches, and reports through its heartbeat thread (one CAS of its record); each "
        "migration is then cancelled and the worker catches up before the next run"
    )

    report.note(
        "5: SparkBatchEngine.cancel is cancelJobGroup, which cancels only jobs already submitted; a cancel "
        "that lands while the aggregate is still building its DataFrame and plan (figure 1: 'before its "
        "Spark job was submitted') does nothing, and the drain waits for the batch to end (d)"
    )

    def each(rs: list[DrainRun]) -> str:
        return ", ".join(f"{r.drain_s * 1000:.0f}{_how(r)}" for r in rs)

    report.note(
        "5: per run (a = Spark cancel took effect, d = the batch ran to its end and was dropped, "
        f"c = committed by the drained owner): in flight {each(inflight)} ms; queued {each(queued)} ms; "
        f"idle {fmt_list_ms([r.drain_s for r in results['idle']])} ms"
    )
