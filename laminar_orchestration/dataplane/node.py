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
import random
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pyarrow as pa

from laminar_orchestration.dataplane.batches import (
    InFlightBatch,
    ReadAhead,
)
from laminar_orchestration.dataplane.checkpoint import CheckpointStore, OutputWriter
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.dataplane.engine import (
    BatchEngine,
    SparkBatchEngine,
    build_spark_session,
)
from laminar_orchestration.dataplane.exporter import expose_node
from laminar_orchestration.dataplane.folding import resolve_logic
from laminar_orchestration.dataplane.handoff import (
    PartitionDuty,
    partition_duty,
)
from laminar_orchestration.dataplane.restore import StateReplica
from laminar_orchestration.dataplane.standby import StandbyFollower, TakeoverSpeculation
from laminar_orchestration.dataplane.table_feed import OutputTable, TableFeed
from laminar_orchestration.dataplane.worker import PartitionWorker
from laminar_orchestration.dataplane.worker_state import WorkerState as WorkerState
from laminar_orchestration.errors import CorruptDataError
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.metrics import NodeMetrics
from laminar_orchestration.processing.contract import Processor, ProcessorFailed
from laminar_orchestration.protocol.capabilities import CheckpointWriter, LedgerWriter, OutputCommitter, ReadStore
from laminar_orchestration.protocol.chain import ManifestPublisher, ManifestVersion
from laminar_orchestration.protocol.cluster_epoch import ClusterEpochWindow
from laminar_orchestration.protocol.fencing import (
    EpochError,
    PartitionGuardSet,
    StaleEpoch,
)
from laminar_orchestration.protocol.ledger import Ledger, NodeHandle, NodeIdentityConflict
from laminar_orchestration.protocol.move_reports import MoveReporter
from laminar_orchestration.protocol.nudge import NudgeListener
from laminar_orchestration.protocol.records import NodeStatus, PartitionProgress, RequestReport
from laminar_orchestration.protocol.segments import UndecodableSegment
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import (
    DesiredState,
    DesiredStates,
    MigrationKind,
    MigrationTask,
    StalledMoves,
)
from laminar_orchestration.store import ObjectStore, StoreError, open_store

log = logging.getLogger("laminar.node")

#: How long the report of a move stays in the node's move report after the node saw it Active; a
#: driver that looks later finds it in the heartbeat.
MOVE_REPORT_LINGER_S = 10.0
#: While more than one move involves this node, how long a move report waits for the other workers'
#: changes before it is written (one write for a burst, not one per phase per partition).
MOVE_REPORT_COALESCE_S = 0.02
#: The shortest time between two heartbeats when workers report more often than the interval.
HEARTBEAT_MIN_GAP_S = 1.0


@dataclass
class RestartBackoff:
    """Consecutive failures of one partition on a node, and when it may be restarted.

    A permanent failure (`UndecodableSegment`: the next segment cannot be decoded, on any retry;
    `ProcessorFailed`: the processor's code raised on the batch) has no
    delay and is not restarted: the partition stays failed, with its reason in the node's report,
    until the control plane moves it to this node again or the node restarts.
    """

    failures: int
    reason: str
    #: None: a permanent failure, not restarted.
    delay_s: float | None
    retry_at: float  # time.monotonic(); infinite for a permanent failure

    @property
    def permanent(self) -> bool:
        return self.delay_s is None


class _Nudged(threading.Event):
    """The nudge listener's event: set, it also wakes the reconcile loop."""

    def __init__(self, wake: threading.Event) -> None:
        super().__init__()
        self._wake = wake
        #: When the last nudge came (monotonic); None: never.
        self.heard_at: float | None = None

    def set(self) -> None:
        self.heard_at = time.monotonic()
        super().set()
        self._wake.set()


#: Nudges heard within this long are taken to reach the node: while a move involves it, the node
#: then reads its assignment every `nudged_reconcile_interval_s` instead of `reconcile_interval_s`.
NUDGE_TRUST_S = 30.0


class Node:
    """A worker node process. `run()` blocks until `stop()` (or SIGTERM/SIGINT)."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        store: ObjectStore | None = None,
        processor: Processor | None = None,
        spark: Any = None,
        output_table: OutputTable | None = None,
    ) -> None:
        self.config = config
        self.id = NodeId(config.node_id)
        #: Catches the output table up with this node's commits (None: no table is kept).
        self.table_feed = TableFeed(output_table) if output_table is not None else None
        # No attribute holds the store: each part gets only its capability, and the source reads only.
        opened = store or open_store(config.store_url)
        self.store_url = opened.url
        #: Where this process's store requests are counted (reported with each heartbeat).
        self._meter = opened.meter
        self._last_requests = self._meter.snapshot()
        #: This node's Prometheus metrics (its own registry); served when `config.metrics_port` is set.
        self.metrics = NodeMetrics(config.node_id)
        self.ledger = Ledger(opened)
        self.desired = DesiredStates(self.ledger)
        self.reader = ReadStore(opened)
        self.publisher = ManifestPublisher(OutputCommitter(opened), opened, signing_keys=self.ledger.signing_keys)
        self.outputs = OutputWriter(OutputCommitter(opened))
        self.checkpoints = CheckpointStore(CheckpointWriter(opened))
        #: The cluster's stream schema and the processor this node runs on it (checked against the record).
        self.logic = resolve_logic(opened, config.node_id, reference=config.processor, given=processor)
        self.source = SourceLog(self.reader, schema=self.logic.stream)
        self.guards = PartitionGuardSet(self.id)
        self._owns_workdir = config.workdir is None
        self.workdir = Path(config.workdir or tempfile.mkdtemp(prefix=f"laminar-node{config.node_id}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        #: The workers' batch files. An earlier run's are left over only when it exited within the
        #: grace of an abandoned batch (`remove_after_grace`); nothing in them outlives a run.
        self.scratch = self.workdir / "batches"
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.scratch.mkdir()
        self._processor = self.logic.processor
        self._spark = spark
        self.engine: BatchEngine
        #: The Spark engine this node built (None when another engine was given): its warm-up ends with the node.
        self._spark_engine: SparkBatchEngine | None = None
        #: Snapshot uploads run here, off the batch loops.
        self.snapshot_pool = ThreadPoolExecutor(2, thread_name_prefix=f"node{config.node_id}-snapshot")
        self.handle: NodeHandle | None = None
        self.workers: dict[PartitionId, PartitionWorker] = {}
        self.standbys: dict[PartitionId, StandbyFollower] = {}
        self._finished: dict[PartitionId, PartitionProgress] = {}
        #: Partitions whose worker failed: restarted only after an exponential delay.
        self._backoff: dict[PartitionId, RestartBackoff] = {}
        self._stop = threading.Event()
        #: Set at the first SIGTERM/SIGINT: /healthz answers "not ready" from then on.
        self.leaving = threading.Event()
        #: Called at every SIGTERM/SIGINT instead of `stop` when set: a graceful leave, which stops the node.
        self.on_leave: Callable[[], None] | None = None
        self._report_now = threading.Event()
        #: Set by a worker's report: the move report is written at once (`_move_reports_loop`).
        self._moves_changed = threading.Event()
        self._move_reporter: MoveReporter | None = None
        #: The migration of each partition whose move this node takes part in, as last read, and when
        #: it was seen Active (None while in flight): the report of a finished move lingers a while.
        self._in_flight: dict[PartitionId, tuple[str, float | None]] = {}
        #: The log ends this node read last (None before its first read), and when it read them
        #: (monotonic): a worker trusts them only for a while after that read.
        self._log_ends: dict[int, int] | None = None
        self._log_ends_at = 0.0
        #: Set by a nudge, a worker's report or a stop: the reconcile loop looks at once.
        self._wake = threading.Event()
        #: Set by a worker's report (with `_wake`): the loop reaps ended workers without reading anything.
        self._worker_reported = threading.Event()
        #: Set by a nudge (with `_wake`): the loop reads the records now.
        self._nudged = _Nudged(self._wake)
        #: The assignment version this node last acted on, and the revision of each desired state it
        #: last read: a pass reads only the states whose revision moved (`_states_to_read`).
        self._assignment_version: int | None = None
        self._seen_revisions: dict[PartitionId, int] = {}
        self._next_full_pass = 0.0
        self._stalled_moves = StalledMoves()  # moves whose assignment entry stopped moving: their states are read
        #: Partitions whose state names this node while it can do nothing for them yet.
        self._pending: set[PartitionId] = set()
        self._nudges: NudgeListener | None = None
        self._lock = threading.Lock()
        self.cluster_epoch = 0
        #: Commits are accepted for the last two cluster epochs, so a rebalance
        #: that does not move a partition never fails its in-flight batch.
        self.epoch_window = ClusterEpochWindow()
        #: Standbys start a forced takeover's first batch here while the owner looks dead.
        self.speculation = TakeoverSpeculation(
            node=int(self.id),
            ledger=self.ledger,
            source=self.source,
            engine=lambda: self.engine,
            generation=lambda: self.generation,
            cluster_epoch=lambda: self.cluster_epoch,
            batch_max_events=config.batch_max_events,
            workdir=self.scratch,
        )

    @property
    def generation(self) -> int:
        return self.handle.generation if self.handle else 0

    def take_over_copy(self, partition: PartitionId) -> tuple[StateReplica, InFlightBatch | None, ReadAhead | None]:
        """The local copy of `partition` for a worker (the standby's, warm, if there is one), the
        takeover batch that standby started, if any, and that batch's keys' values if it read them.

        Whatever the copy holds is checked against the manifest before use, and the batch is
        committed only if it starts at the restored offset with the granted epoch.
        """
        with self._lock:
            follower = self.standbys.pop(partition, None)
        if follower is not None:
            return follower.stop(), follower.speculative, follower.read_ahead
        return self._new_replica(partition), None, None

    def _new_replica(self, partition: PartitionId) -> StateReplica:
        root = self.workdir / "state" / f"p{int(partition):05d}"
        processor = self.logic.processor
        return StateReplica(root, partition, processor.codec.schema, self.reader, expiry_column=processor.expiry_column)

    def _source_rang(self, ends: dict[int, int]) -> None:
        """A producer's doorbell: wake the workers of the partitions whose logs grew."""
        for p, end in ends.items():
            worker = self.workers.get(PartitionId(p))
            if worker is not None:
                worker.source_advanced(end)

    def _reconcile_standbys(self) -> None:
        """Follow every `standby_for` partition this node does not run."""
        for p in self.config.standby_for:
            pid = PartitionId(p)
            if pid not in self.workers and pid not in self.standbys:
                self.follow_as_standby(self._new_replica(pid))

    def follow_as_standby(self, replica: StateReplica) -> bool:
        """Keep following `replica`'s partition if this node is a standby for it; False if it is not."""
        pid = PartitionId(replica.partition)
        if replica.partition not in self.config.standby_for or self._stop.is_set():
            return False
        follower = StandbyFollower(
            replica, self.publisher, poll_s=self.config.standby_poll_s, node=self.id, speculation=self.speculation
        )
        with self._lock:
            if pid in self.standbys:
                return False
            self.standbys[pid] = follower
        follower.start()
        log.info("node %s: following partition %s as a warm standby", self.id, replica.partition)
        return True

    # -- lifecycle -------------------------------------------------------------------

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
        self.handle = self.ledger.register_node(
            self.id,
            heartbeat_timeout_s=self.config.heartbeat_timeout_s,
            nudge_url=self._nudges.url if self._nudges else None,
        )
        # This process's own entries need no read of its node record to tell its generation.
        self.publisher.own_writer = (int(self.id), self.generation)
        self._move_reporter = MoveReporter(LedgerWriter(self.ledger.store), self.id, self.generation)
        # An empty report at once: a driver reads this record from the first move on, never the heartbeat.
        self._move_reporter.report({})
        self.observe_cluster_epoch(self.ledger.membership().cluster_epoch)
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

    def stop(self) -> None:
        self.leaving.set()
        self._stop.set()
        self._wake.set()

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

    # -- background loops ---------------------------------------------------------------

    def report_now(self) -> None:
        """A worker changed phase, ended or failed: its report goes out now, and the reconcile loop
        reaps it if it ended (no read: what the control plane asks next comes by nudge)."""
        self._moves_changed.set()
        self._report_now.set()
        self._worker_reported.set()
        self._wake.set()

    def _move_progress(self) -> dict[int, PartitionProgress]:
        """The reports on the partitions in a move this node takes part in (the move it last read)."""
        at = time.monotonic()
        with self._lock:
            for p, (_, ended) in list(self._in_flight.items()):
                if ended is not None and at - ended > MOVE_REPORT_LINGER_S:
                    del self._in_flight[p]
            in_flight = dict(self._in_flight)
        progress = self._progress()
        return {
            int(p): report
            for p, (migration_id, _) in in_flight.items()
            if (report := progress.get(int(p))) is not None and report.migration_id == migration_id
        }

    def _move_reports_loop(self) -> None:
        """Write the move report as soon as a worker reports (and look again every heartbeat interval,
        for the moves that ended): a move's driver polls this small record, not the heartbeat."""
        assert self._move_reporter is not None
        while not self._stop.is_set():
            self._moves_changed.wait(self.config.heartbeat_interval_s)
            with self._lock:
                moving = sum(1 for _, ended in self._in_flight.values() if ended is None)
            if moving > 1:
                # Several moves at once (a failover's burst): their reports go out together.
                self._stop.wait(MOVE_REPORT_COALESCE_S)
            self._moves_changed.clear()
            try:
                self._move_reporter.report(self._move_progress())
            except NodeIdentityConflict as exc:
                log.error("node %s: %s (its heartbeat stops the node)", self.id, exc)
                return
            except StoreError as exc:
                log.warning("node %s: move report failed: %s", self.id, exc)
                self._moves_changed.set()  # try again at the next look
                self._stop.wait(0.1)

    def _progress(self) -> dict[int, PartitionProgress]:
        with self._lock:
            report: dict[int, PartitionProgress] = {int(p): pr for p, pr in self._finished.items()}
            for p, f in self.standbys.items():
                report[int(p)] = PartitionProgress(
                    partition=int(p),
                    epoch=0,
                    state="standby",
                    source_offset=f.replica.source_offset,
                    lag=f.lag,
                    error=f.error,
                )
            for p, w in self.workers.items():
                report[int(p)] = w.progress()
            for p, b in self._backoff.items():
                if int(p) in report:
                    failing = {"consecutive_failures": b.failures, "last_failure": b.reason, "retry_delay_s": b.delay_s}
                    report[int(p)] = report[int(p)].model_copy(update=failing)
        return report

    def _requests_report(self) -> RequestReport:
        """The store requests this process sent since the previous report (and in all)."""
        current = self._meter.snapshot()
        previous, self._last_requests = self._last_requests, current
        return RequestReport(
            total=dict(current.by_method),
            per_s={m: round(r, 3) for m, r in current.rates_since(previous).items()},
            top_families=current.family_rates_since(previous),
            interval_s=round(current.at - previous.at, 3),
        )

    def _heartbeat_loop(self) -> None:
        assert self.handle is not None
        while not self._stop.is_set():
            try:
                self.handle.heartbeat(partitions=self._progress(), requests=self._requests_report())
            except NodeIdentityConflict as exc:
                log.error("node %s: %s; fencing every partition and stopping", self.id, exc)
                for w in list(self.workers.values()):
                    w.tracker.fence(str(exc))
                self.stop()
                return
            except StoreError as exc:
                log.warning("node %s: heartbeat failed: %s", self.id, exc)
            except Exception:
                # The heartbeat is what keeps this node alive in the ledger: it never dies of one bad report.
                log.exception("node %s: heartbeat failed unexpectedly", self.id)
            written = time.monotonic()
            reported = self._report_now.wait(self.config.heartbeat_interval_s)
            if reported and not any(w.finished for w in list(self.workers.values())):
                # A worker's report: sooner than the interval, but a node moving many partitions at once
                # does not rewrite its whole record per phase (the drivers read the move report). A
                # worker that failed or was revoked is reported at once.
                gap = min(HEARTBEAT_MIN_GAP_S, self.config.heartbeat_interval_s)
                self._stop.wait(max(0.0, written + gap - time.monotonic()))
            self._report_now.clear()

    def _refresh_loop(self) -> None:
        """The cluster epoch every `refresh_interval_s`; every guard once per full pass. A fence
        reaches this node sooner through its assignment (`_check_revoked`), and a committing
        partition looks for a successor's grant itself: this pass is the repair path."""
        next_guard_pass = time.monotonic() + self.config.full_reconcile_interval_s
        while not self._stop.wait(self.config.refresh_interval_s):
            if time.monotonic() >= next_guard_pass:
                next_guard_pass = time.monotonic() + self.config.full_reconcile_interval_s
                self.refresh_guards()
            try:
                self.observe_cluster_epoch(self.ledger.membership().cluster_epoch)
            except StoreError as exc:
                log.warning("node %s: cluster epoch refresh failed: %s", self.id, exc)

    def note_committed(self, version: ManifestVersion, outputs: Mapping[str, pa.Table]) -> None:
        """A worker committed a batch: the output table's next sync takes it from memory."""
        if self.table_feed is not None:
            self.table_feed.committed(version, outputs)

    def _table_loop(self) -> None:
        """One output-table sync per `table_sync_interval_s` for the partitions that committed."""
        assert self.table_feed is not None
        # Nodes started together would commit to the table together, and all but one retry: spread them.
        if self._stop.wait(self.config.table_sync_interval_s * random.random()):
            return
        while not self._stop.wait(self.config.table_sync_interval_s):
            self.table_feed.note(self.workers)
            self.table_feed.flush(self.id)

    def _log_ends_loop(self) -> None:
        """Read the log ends producers record (one GET) and hand each worker its partition's: at
        once, then every `log_ends_poll_s`."""
        while not self._stop.is_set():
            read_at = time.monotonic()
            try:
                # None: no producer appended yet (every append records its end), so every log is empty.
                ends = self.source.log_ends() or {}
            except (StoreError, CorruptDataError) as exc:
                log.warning("node %s: could not read the log ends (its partitions poll their logs): %s", self.id, exc)
            else:
                self._log_ends, self._log_ends_at = ends, read_at
                for p, worker in list(self.workers.items()):
                    worker.source_advanced(ends.get(int(p), 0), from_log_ends=True, read_at=read_at)
            self._stop.wait(self.config.log_ends_poll_s)

    def observe_cluster_epoch(self, epoch: int) -> None:
        """Slide the acceptance window to a newer cluster epoch (waits for commits in flight)."""
        if epoch > self.cluster_epoch:
            with self.epoch_window.fence(epoch):
                self.cluster_epoch = epoch

    def refresh_guards(self, partitions: set[PartitionId] | None = None) -> list[PartitionId]:
        """The kill-switch check of `partitions`' guards (default: all): fence the tracker of every
        revoked partition."""
        try:
            revoked = self.guards.refresh_all(self.ledger, partitions)
        except StoreError as exc:
            log.warning("node %s: guard refresh failed: %s", self.id, exc)
            return []
        for p in revoked:
            worker = self.workers.get(p)
            guard = self.guards.get(p)
            # Only the guard the refresh judged carries the newer epoch; a successor guard
            # installed meanwhile (a new epoch for this node) is not revoked.
            if worker is not None and guard is not None and guard.cached_current_epoch > guard.epoch:
                worker.tracker.fence(str(StaleEpoch(p, guard.epoch, guard.cached_current_epoch)))
                worker.abandon_batch()
        return revoked

    # -- reconcile ------------------------------------------------------------------------

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
