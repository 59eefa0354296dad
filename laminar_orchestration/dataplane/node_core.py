"""A worker node's parts and state: its store capabilities, its workers and standbys, the events its
loops wait on; and how a worker gets its partition's local copy (a standby's, warm, or a new one).

`node_loops.NodeLoops` adds the background loops (heartbeat, refresh, move reports, output table, log
ends), `node.Node` the lifecycle and the reconcile loop.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laminar_orchestration.dataplane.batches import (
    InFlightBatch,
    ReadAhead,
)
from laminar_orchestration.dataplane.checkpoint import CheckpointStore, OutputWriter
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.dataplane.engine import (
    BatchEngine,
    SparkBatchEngine,
)
from laminar_orchestration.dataplane.folding import resolve_logic
from laminar_orchestration.dataplane.restore import StateReplica
from laminar_orchestration.dataplane.standby import StandbyFollower, TakeoverSpeculation
from laminar_orchestration.dataplane.table_feed import OutputTable, TableFeed
from laminar_orchestration.dataplane.worker import PartitionWorker
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.metrics import NodeMetrics
from laminar_orchestration.processing.contract import Processor
from laminar_orchestration.protocol.capabilities import CheckpointWriter, OutputCommitter, ReadStore
from laminar_orchestration.protocol.chain_writes import ManifestPublisher
from laminar_orchestration.protocol.cluster_epoch import ClusterEpochWindow
from laminar_orchestration.protocol.desired_states import DesiredStates, StalledMoves
from laminar_orchestration.protocol.fencing import (
    PartitionGuardSet,
)
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.membership import NodeHandle
from laminar_orchestration.protocol.move_reports import MoveReporter
from laminar_orchestration.protocol.nudge import NudgeListener
from laminar_orchestration.protocol.records import PartitionProgress
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore, open_store

log = logging.getLogger("laminar.node")


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


class NodeCore:
    """A worker node's parts and state (see `dataplane.node.Node`, the process)."""

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

    def stop(self) -> None:
        """Stop the node: `run` drains its partitions, releases them and leaves the cluster."""
        self.leaving.set()
        self._stop.set()
        self._wake.set()
