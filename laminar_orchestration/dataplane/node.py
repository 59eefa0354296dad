"""The worker node: heartbeat, reconcile loop, and one fenced batch loop per owned partition.

A node is a long-running process with one SparkSession. It

* heartbeats its own ledger record (with a progress report per partition);
* reconciles the desired state the control plane recorded in the ledger:
  carries out the migration phase a task allows (drain, checkpoint, upload,
  release on the old owner; download, restore, seek, active on the new one),
  or recovers a partition it is meant to run after a restart;
* runs micro-batches for the partitions it owns: guard check → read the
  source from the committed offset → Spark aggregates the batch → the
  processor merges the touched keys with their values in the partition's
  local store → fenced commit (output file + state delta + manifest naming
  output, delta and offset) → the delta is applied to the local store;
  snapshots of the local store are uploaded off the batch's critical path;
* refreshes its guards every `refresh_interval_s`; a revoked partition's
  `Tracker` is fenced: the source stops, the in-flight batch is dropped with
  no side effect and its offset is not committed, the local state is
  discarded, and the node keeps serving its other partitions.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import signal
import threading
import time
from collections.abc import Mapping
from types import FrameType

from laminar_orchestration.dataplane.engine import (
    SparkBatchEngine,
    build_spark_session,
)
from laminar_orchestration.dataplane.exporter import expose_node
from laminar_orchestration.dataplane.handoff import (
    PartitionDuty,
    partition_duty,
)
from laminar_orchestration.dataplane.node_core import NUDGE_TRUST_S, RestartBackoff
from laminar_orchestration.dataplane.node_loops import NodeLoops
from laminar_orchestration.dataplane.worker import PartitionWorker
from laminar_orchestration.dataplane.worker_state import WorkerState
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.processing.contract import ProcessorFailed
from laminar_orchestration.protocol.capabilities import LedgerWriter
from laminar_orchestration.protocol.desired_states import DesiredState
from laminar_orchestration.protocol.fencing import (
    EpochError,
)
from laminar_orchestration.protocol.ledger import NodeIdentityConflict
from laminar_orchestration.protocol.move_reports import MoveReporter
from laminar_orchestration.protocol.nudge import NudgeListener
from laminar_orchestration.protocol.records import NodeStatus
from laminar_orchestration.protocol.source_errors import UndecodableSegment
from laminar_orchestration.protocol.tasks import MigrationKind, MigrationTask
from laminar_orchestration.store import StoreError

log = logging.getLogger("laminar.node")


class Node(NodeLoops):
    """A worker node process. `run()` blocks until `stop()` (or SIGTERM/SIGINT)."""

    def start_spark(self) -> None:
        started = time.monotonic()
        if self._spark is None:
            self._spark = build_spark_session(
                self.config.spark_master, f"laminar-node-{self.id}", ui=self.config.spark_ui
            )
        engine = SparkBatchEngine(self._spark, self._processor, str(self.workdir / "spark"), stream=self.logic.stream)
        self.engine = self._spark_engine = engine
        warm = engine.warm_up()
        log.info("node %s: spark ready in %.1fs (warm-up %.1fs)", self.id, time.monotonic() - started, warm)
        if self.config.spark_warm_up_batches:
            engine.keep_warming(self.config.spark_warm_up_batches)

    def run(self, *, install_signals: bool = True) -> None:
        if install_signals:
            self._install_signal_handlers()
        self.ledger.cluster()  # fail fast with a clear error if the store has no cluster
        port = self.config.metrics_port
        exporter = None if port is None else expose_node(self, port, self.config.metrics_host)
        self.start_spark()
        if self.config.nudge_host is not None:
            self._nudges = NudgeListener(self._nudged, host=self.config.nudge_host, on_source=self._source_rang)
        self.handle = self.ledger.members.register_node(
            self.id,
            heartbeat_timeout_s=self.config.heartbeat_timeout_s,
            nudge_url=self._nudges.url if self._nudges else None,
        )
        # This process's own entries need no read of its node record to tell its generation.
        self.publisher.own_writer = (int(self.id), self.generation)
        self._move_reporter = MoveReporter(LedgerWriter(self.ledger.store), self.id, self.generation)
        # An empty report at once: a driver reads this record from the first move on, never the heartbeat.
        self._move_reporter.report({})
        self.observe_cluster_epoch(self.ledger.members.record().cluster_epoch)
        log.info("node %s: joined as generation %s (store %s)", self.id, self.generation, self.store_url)
        threads = [
            threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
            threading.Thread(target=self._refresh_loop, name="guard-refresh", daemon=True),
            threading.Thread(target=self._log_ends_loop, name="log-ends", daemon=True),
            threading.Thread(target=self._move_reports_loop, name="move-reports", daemon=True),
        ]
        if self.table_feed is not None:
            threads.append(threading.Thread(target=self._table_loop, name="output-table", daemon=True))
        for t in threads:
            t.start()
        try:
            while not self._stop.is_set():
                # Fast while a move involves this node, slow when idle: a nudge or a worker's report
                # wakes the loop at once, and a missed nudge costs at most one slow poll.
                self._wake.clear()
                self._nudged.clear()
                self._worker_reported.clear()
                interval = self._moving_interval() if self._moving() else self.config.assignment_poll_s
                next_pass_at = min(time.monotonic() + interval, self._next_restart_at())
                try:
                    self._reconcile()
                except NodeIdentityConflict:
                    raise
                except (StoreError, EpochError) as exc:
                    log.warning("node %s: reconcile failed: %s", self.id, exc)
                self._wait_for_next_pass(next_pass_at)
        finally:
            if self._nudges is not None:
                self._nudges.close()
            self._drain_all()
            if self.table_feed is not None:
                # After the last commits: a clean stop leaves the table caught up with them.
                self.table_feed.note(self.workers)
                self.table_feed.flush(self.id)
            self.snapshot_pool.shutdown(wait=False, cancel_futures=True)
            self.speculation.shutdown()
            if self._spark_engine is not None:
                self._spark_engine.stop_warming()
            for t in threads:
                t.join(timeout=5)
            if self.handle is not None:
                try:
                    self.handle.leave()
                except (StoreError, NodeIdentityConflict) as exc:
                    log.warning("node %s: could not mark itself left: %s", self.id, exc)
            if self._owns_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
            if exporter is not None:
                exporter.close()
            log.info("node %s: stopped", self.id)

    def _wait_for_next_pass(self, next_pass_at: float) -> None:
        """Until the next pass is due or a nudge asks for one; a worker's report meanwhile only has the
        ended workers reaped (a failed one's restart is scheduled from then), with no read."""
        while self._wake.wait(max(0.0, next_pass_at - time.monotonic())) and not self._stop.is_set():
            if self._nudged.is_set() or not self._worker_reported.is_set():
                return
            self._wake.clear()
            self._worker_reported.clear()
            self._reap()
            next_pass_at = min(next_pass_at, self._next_restart_at())
            if self._moving():  # a worker still on its way out (or a move): look again soon
                next_pass_at = min(next_pass_at, time.monotonic() + self._moving_interval())

    def _moving_interval(self) -> float:
        """How often the node reads its assignment while a move involves it. The control plane nudges
        it after each phase it records: while nudges arrive, the poll is only their fallback, and a
        slow one keeps a failover of many partitions from spending the store's requests on it."""
        heard = self._nudged.heard_at
        if heard is not None and time.monotonic() - heard <= NUDGE_TRUST_S:
            return max(self.config.reconcile_interval_s, self.config.nudged_reconcile_interval_s)
        return self.config.reconcile_interval_s

    def _install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: FrameType | None) -> None:
            log.info("node %s: %s received, draining", self.id, signal.Signals(signum).name)
            self.leaving.set()
            (self.on_leave or self.stop)()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _drain_all(self) -> None:
        if self.handle is not None:
            # Best effort: the final `leave()` follows; a lost "leaving" is harmless.
            with contextlib.suppress(StoreError, NodeIdentityConflict):
                self.handle.heartbeat(NodeStatus.LEAVING, partitions=self._progress())
        for follower in list(self.standbys.values()):
            follower.stop().close()
            follower.drop_speculative()
        for worker in list(self.workers.values()):
            worker.request_stop()
        for worker in list(self.workers.values()):
            worker.join(timeout=120)

    def _next_restart_at(self) -> float:
        """When the earliest failed partition may be restarted (`math.inf` if none waits)."""
        with self._lock:
            return min((b.retry_at for b in self._backoff.values() if not b.permanent), default=math.inf)

    def _moving(self) -> bool:
        """Whether a migration involves this node, or a worker just ended: the loop then looks fast."""
        return any(w.migrating or w.finished for w in list(self.workers.values()))

    def _states_to_read(self) -> dict[PartitionId, DesiredState]:
        """The desired states this pass looks at: those whose revision moved in this node's
        assignment, those it no longer appears in, and those whose worker may be restarted now.

        One GET of the assignment when nothing changed. Every `full_reconcile_interval_s` (and
        while the control plane has written no assignment for this node yet) every partition's
        state is read instead: a repair path, never the steady state.
        """
        assignment, _ = self.desired.assignment(self.id)
        at = time.monotonic()
        if assignment is None and self._assignment_version is None and at < self._next_full_pass:
            return {}
        if (assignment is None and self._assignment_version is None) or at >= self._next_full_pass:
            self._next_full_pass = at + self.config.full_reconcile_interval_s
            states = self.desired.all()
            self._assignment_version = assignment.version if assignment else None
            listed = assignment.partitions if assignment else {}
            # The assignment's revision, not the state's: a write that does not concern this node
            # leaves its assignment behind the state, and that is no reason to read the state again.
            self._seen_revisions = {
                p: listed.get(int(p), s.revision) for p, s in states.items() if self.id in s.named_nodes()
            }
            return states
        assert assignment is not None
        named = {PartitionId(p): r for p, r in assignment.partitions.items()}
        wanted = {p for p, r in named.items() if self._seen_revisions.get(p) != r}
        wanted |= {p for p in self._seen_revisions if p not in named}
        if assignment.version != self._assignment_version:
            self._assignment_version = assignment.version
        wanted |= {p for p, b in self._backoff.items() if not b.permanent and at >= b.retry_at and p in named}
        wanted |= self._pending & set(named)
        # A move whose entry stopped moving (its writer died before the assignment) has its state read itself.
        stalled = self._stalled_moves.due(dict(self._in_flight), assignment.partitions, at)
        # A state in a move comes with the assignment (a copy at the listed revision): no read.
        states = {p: assignment.state(int(p)) or self.desired.read(p)[0] for p in sorted(wanted - stalled)}
        states |= {p: self.desired.read(p)[0] for p in sorted(stalled)}
        self._check_revoked(states)
        for p, state in states.items():
            if self.id in state.named_nodes():
                self._seen_revisions[p] = named.get(p, state.revision)
            else:
                self._seen_revisions.pop(p, None)
        return states

    def _check_revoked(self, states: Mapping[PartitionId, DesiredState]) -> None:
        """Check against the ledger the guards of the partitions these new states take from this node
        (another desired owner, or a forced move away from it): a fence moves the assignment then."""
        leaving = {
            p
            for p, state in states.items()
            if self.guards.get(p) is not None
            and (
                state.owner != self.id
                or (
                    state.migration is not None
                    and not state.migration.is_terminal
                    and state.migration.migration_kind == MigrationKind.FORCED
                    and state.migration.from_node == self.id
                )
            )
        }
        if leaving:
            self.refresh_guards(leaving)

    def _reconcile(self) -> None:
        desired = self._states_to_read()
        self._reap()
        for p, state in desired.items():
            self._reconcile_partition(p, state)
        self._reconcile_standbys()

    def _reap(self) -> None:
        """Take the workers that ended out of `workers`, and schedule the restart of those that failed."""
        with self._lock:
            for p, w in list(self.workers.items()):
                if w.finished and not w.is_alive():
                    if w.state_name == WorkerState.FAILED:
                        self._note_failure(p, w)
                    else:
                        self._backoff.pop(p, None)
                    self._finished[p] = w.progress()
                    del self.workers[p]
                elif w.commits and p in self._backoff:
                    del self._backoff[p]  # it made progress again

    def _reconcile_partition(self, p: PartitionId, state: DesiredState) -> None:
        task = state.migration
        self._note_move(p, task)
        worker = self.workers.get(p)
        if worker is not None:
            self._pending.discard(p)
            worker.offer(task)
            return
        if self._stop.is_set() or self._backing_off(p, task):
            return
        done = self._finished.get(p)
        duty = partition_duty(
            state,
            node=self.id,
            finished_migration=done.migration_id if done else None,
            ownership=lambda: self.ledger.ownership(p),
        )
        if duty == PartitionDuty.RISE:
            self._start(PartitionWorker(self, p, rising=task))
        elif duty == PartitionDuty.RECOVER:
            self._start(PartitionWorker(self, p))
        elif self.id in state.named_nodes():
            # Asked of this node but not yet possible (the grant comes after the state): look again
            # at every poll until it is, since the grant itself moves no assignment.
            self._pending.add(p)
            return
        self._pending.discard(p)

    def _note_move(self, p: PartitionId, task: MigrationTask | None) -> None:
        """Keep `_in_flight` in line with `task`, the partition's migration as just read. A move recorded
        Active stays for `MOVE_REPORT_LINGER_S` after this node saw it so: its driver waits for this node's
        report of Active. One first seen (or seen again) only once it ended is not reported: a state read
        again later must not put a long-finished move back in the report."""
        in_move = task is not None and not task.phase.is_aborted and self.id in (task.from_node, task.to_node)
        with self._lock:
            before = self._in_flight.get(p)
            tracked = before is not None and task is not None and before[0] == task.migration_id
            if task is None or not in_move or (task.is_terminal and not tracked):
                self._in_flight.pop(p, None)
            elif not tracked:
                self._in_flight[p] = (task.migration_id, None)
            elif task.is_terminal and before is not None and before[1] is None:
                self._in_flight[p] = (task.migration_id, time.monotonic())
            changed = before != self._in_flight.get(p)
        if changed:
            self._moves_changed.set()

    def _note_failure(self, p: PartitionId, worker: PartitionWorker) -> None:
        """Count a failed worker and schedule its restart: doubling delays, capped. Caller holds `_lock`."""
        previous = self._backoff.get(p)
        failures = 1 if previous is None or worker.commits else previous.failures + 1
        reason = worker.progress().error or "unknown"
        if isinstance(worker.failure, (UndecodableSegment, ProcessorFailed)):
            # Every restart would fail on the same immutable segment: the partition stays failed, its reason
            # reported, and nothing of the segment is skipped.
            reason = f"{reason} (permanent: not restarted)"
            self._backoff[p] = RestartBackoff(failures, reason, None, math.inf)
            log.error("node %s: partition %s failed: %s", self.id, p, reason, exc_info=worker.failure)
            return
        cfg = self.config
        delay = min(cfg.restart_backoff_initial_s * 2.0 ** min(failures - 1, 32), cfg.restart_backoff_max_s)
        self._backoff[p] = RestartBackoff(failures, reason, delay, time.monotonic() + delay)
        self.metrics.count_restart(int(p))
        log.error(
            "node %s: partition %s failed (%s in a row): %s; restarting in %.1fs",
            self.id,
            p,
            failures,
            reason,
            delay,
            # The traceback once per run of failures: a poison batch must not flood the log.
            exc_info=worker.failure if failures == 1 else None,
        )

    def _backing_off(self, p: PartitionId, task: MigrationTask | None) -> bool:
        """Whether `p` failed here and may not start yet: until its restart delay has passed or, after a
        permanent failure, until a migration (`task`) moves it to this node again."""
        backoff = self._backoff.get(p)
        if backoff is None:
            return False
        if backoff.permanent:
            return task is None or task.is_terminal or task.to_node != self.id
        return time.monotonic() < backoff.retry_at

    def _start(self, worker: PartitionWorker) -> None:
        with self._lock:
            self._finished.pop(worker.partition, None)
            self.workers[worker.partition] = worker
        if self._log_ends is not None:
            # The ends last read, as old as they are: a new worker waits for its log to move instead
            # of polling it only while they are trusted.
            end = self._log_ends.get(int(worker.partition), 0)
            worker.source_advanced(end, from_log_ends=True, read_at=self._log_ends_at)
        worker.start()
