"""Runtime benchmarks: end-to-end batch throughput, checkpoint transfer, drain latency.

Run from the repository root::

    python -m benchmarks.bench_runtime           # full, ~2.5 minutes
    python -m benchmarks.bench_runtime --quick   # fewer runs, < 2 minutes
    python -m benchmarks.bench_runtime --no-s3   # skip the moto S3 backend

Figures (each printed next to its target, with whether it was met; nothing asserts):

1. End-to-end events/s of ONE node on Spark ``local[2]`` for one batch of 10k,
   100k and 1M events (produce -> commit), with fencing ON (the library's
   `PartitionWorker` plus the node's guard-refresh loop) and OFF (`UnfencedWorker`
   below, benchmark only), interleaved in the same process, and the ratio ON/OFF.
   The events are produced into the source log of a fresh local store (segment
   size = batch size, so one batch is one read) while the worker is parked; the
   clock runs from waking it until its committed offset (set right after the
   manifest publish returns; the stored manifest is checked afterwards) reaches
   the end of the log. Also: the fencing work timed directly (and the ON/OFF ratio
   it implies), and a per-step breakdown of one batch.
2. `CheckpointStore.upload_bytes` / `checkpoint.download_bytes` MB/s for a 100 MB
   state on the local store and on moto's S3 server (informational: a
   single-threaded Python server on loopback, not AWS).
3. Time to drain a partition: a node runs in-process (`Node.run`: its real
   reconcile, heartbeat and refresh loops), a second node is registered as the
   migration target, 10k events are produced, and `MigrationCoordinator.run_phase`
   asks for Draining; the figure is the wall time of that call (it persists the
   phase, then waits until the node's ledger record reports Draining done).

One SparkSession (``local[2]``) is built once, warmed up, and shared by every
node of every run. The table is also written to ``benchmarks/results/runtime.txt``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from laminar_orchestration.capabilities import CheckpointWriter, ReadStore
from laminar_orchestration.checkpoint import CheckpointStore, download_bytes
from laminar_orchestration.fencing import FencingToken, PartitionGuard
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ledger import Ledger
from laminar_orchestration.manifest import ManifestReader, ManifestUpdate, ManifestVersion
from laminar_orchestration.migration import MigrationCoordinator, MigrationPhase
from laminar_orchestration.processing import SparkBatchRunner, build_spark_session, empty_state
from laminar_orchestration.runtime import Node, NodeConfig, PartitionWorker, WorkerState
from laminar_orchestration.source import SourceLog, generate_events
from laminar_orchestration.store import LocalObjectStore, ObjectStore

from .common import Row, StoreSpec, format_table, median, progress, start_s3_server, verdict, write_result

P0 = PartitionId(0)
NODE1 = NodeId(1)
NODE2 = NodeId(2)
MASTER = "local[2]"
KEYS = 1_000
MB = 1_000_000

# Targets.
THROUGHPUT_TARGET_EPS = 300_000.0  # at 1M events per batch
FENCING_RATIO_TARGET = 0.99
UPLOAD_TARGET_MBPS = 100.0  # local store (seed 003)
DOWNLOAD_TARGET_MBPS = 200.0  # local store (seed 003)
DRAIN_TARGET_MS = 100.0

LOCAL = "local"
S3 = "s3/moto"


@dataclass(frozen=True)
class Params:
    """How much work each figure does; `--quick` scales it down."""

    #: Rounds of (10k, 100k, 1M) batches through the shared session before measuring.
    warmup_rounds: int
    #: (batch size, interleaved runs per configuration)
    sizes: tuple[tuple[int, int], ...]
    breakdown_runs: int
    state_bytes: int
    local_ckpt_runs: int
    s3_ckpt_runs: int
    drain_runs: int


FULL = Params(
    warmup_rounds=10,
    sizes=((10_000, 15), (100_000, 15), (1_000_000, 3)),
    breakdown_runs=3,
    state_bytes=100 * MB,
    local_ckpt_runs=5,
    s3_ckpt_runs=3,
    drain_runs=5,
)
QUICK = Params(
    warmup_rounds=4,
    sizes=((10_000, 3), (100_000, 3), (1_000_000, 2)),
    breakdown_runs=1,
    state_bytes=100 * MB,
    local_ckpt_runs=3,
    s3_ckpt_runs=2,
    drain_runs=3,
)


# --- the report ------------------------------------------------------------------------------


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *rows: Row) -> None:
        self.rows.extend(rows)

    def info(self, figure: str, value: str, backend: str = LOCAL) -> None:
        self.rows.append(Row(figure, backend, value, "-", "info"))

    def note(self, text: str) -> None:
        self.notes.append(text)


def _eps(eps: float) -> str:
    return f"{eps / 1000:,.1f}k ev/s"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _size(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def _list_ms(values: list[float]) -> str:
    return ", ".join(f"{v * 1000:.0f}" for v in values)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.001) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# --- fencing OFF: a benchmark-only worker ------------------------------------------------------


class _UncheckedGuard(PartitionGuard):
    """A guard whose hot-path check never raises, so the writers' own checks
    (`OutputWriter.write`, `CheckpointStore.upload_bytes`) are off too. Benchmark only."""

    def check(self) -> None:
        return None


class UnfencedWorker(PartitionWorker):
    """`PartitionWorker` with fencing switched off, to measure what fencing costs.

    * `_check` (tracker + guard, before each read and before each commit) does nothing;
    * the installed guard's `check()` does nothing (the writers' checks);
    * `_publish` calls the publisher directly (no guard, no fence-the-tracker on EpochError);
    * the node runs no guard-refresh loop for it (see `throughput_once`).

    What remains is structural: the manifest publish still compares the token's
    epoch with the previous manifest's (one int compare on the manifest it reads
    anyway for the sequence number and parent hash), and the create-only history
    entry is the commit itself.
    """

    def _check(self) -> None:
        return None

    def _install(self, token: FencingToken) -> None:
        self.token = token
        self.guard = _UncheckedGuard(token)
        self.node.guards.insert(self.guard)

    def _publish(self, update: ManifestUpdate) -> ManifestVersion:
        assert self.token is not None
        return self.node.publisher.publish(self.token, update)


# --- shared helpers ----------------------------------------------------------------------------


def new_local_cluster(root: Path) -> tuple[LocalObjectStore, Ledger]:
    """A fresh local store (fsync on, as in production) with a one-partition cluster."""
    store = LocalObjectStore(root / "store")
    ledger = Ledger(store)
    ledger.init_cluster(1)
    return store, ledger


def new_node(store: ObjectStore, spark: Any, workdir: Path, **config: Any) -> Node:
    cfg = NodeConfig(store_url=store.url, node_id=int(NODE1), spark_master=MASTER, workdir=str(workdir), **config)
    return Node(cfg, store=store, spark=spark)


def attach_runner(node: Node) -> None:
    """`Node.start_spark` minus its per-node warm-up batch (the shared session is warm already)."""
    node.runner = SparkBatchRunner(node._spark, None, str(node.workdir / "spark"))


def join_cluster(node: Node) -> None:
    """What `Node.run` does before its loops: register, read the cluster epoch."""
    node.handle = node.ledger.register_node(node.id, heartbeat_timeout_s=node.config.heartbeat_timeout_s)
    node.observe_cluster_epoch(node.ledger.membership().cluster_epoch)


def want_owner(node: Node) -> None:
    """Record in the desired state that `node` should run partition 0 (what a placement does)."""
    node.desired.update(P0, lambda s: s.model_copy(update={"owner": int(node.id)}))


def stop_worker(worker: PartitionWorker, timeout: float = 120.0) -> None:
    """request_stop(), re-notifying until the thread ends.

    `_process` waits `idle_poll_s` on `_task_changed` without re-checking the stop flag
    (or the task) under the lock, so a notify landing between its check and its wait
    is lost; with the 3600 s idle poll of figure 1 a plain request_stop() can hang.
    """
    worker.request_stop()
    deadline = time.monotonic() + timeout
    while worker.is_alive():
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker of partition {worker.partition} did not stop")
        worker.offer(None)
        worker.join(0.05)


def events_table(n: int, seed: int) -> pa.Table:
    return generate_events(n, KEYS, seed, 1)[0]


# --- 1. end-to-end throughput ------------------------------------------------------------------


def warm_up(spark: Any, workroot: Path, rounds: int) -> None:
    """Batches of each size straight through a runner, so the JVM has compiled the hot paths."""
    runner = SparkBatchRunner(spark, None, str(workroot / "warmup-spark"))
    files: dict[int, list[Path]] = {}
    for n in (10_000, 100_000, 1_000_000):
        store = LocalObjectStore(workroot / f"warmup-{n}")
        SourceLog(store, segment_events=n).append(P0, events_table(n, seed=7))
        batch = SourceLog(store).read(P0, 0, n)
        if batch is None:
            raise RuntimeError("warm-up source is empty")
        files[n] = batch.write_parquet(workroot / f"warmup-batch-{n}")
    for i in range(rounds):
        times = [runner.run(empty_state(), files[n], epoch=1, generation=0).spark_s for n in files]
        progress(f"warm-up round {i + 1}/{rounds} (10k, 100k, 1M): {_list_ms(times)} ms")


@dataclass(frozen=True)
class ThroughputRun:
    fenced: bool
    events: int
    process_s: float
    produce_s: float

    @property
    def eps(self) -> float:
        return self.events / self.process_s


#: After reporting RUNNING the worker makes one read of the (still empty) log and
#: parks in its idle wait; this is ample for that on the local store.
SETTLE_S = 0.2


def throughput_once(spark: Any, workroot: Path, table: pa.Table, fenced: bool) -> ThroughputRun:
    """One node, one partition, one batch of `table`; fencing ON or OFF."""
    n = table.num_rows
    tmp = Path(tempfile.mkdtemp(prefix="tput-", dir=workroot))
    try:
        store, _ = new_local_cluster(tmp)
        # A huge idle poll: the parked worker reads the log only when offer() wakes it,
        # so the clock starts exactly when processing does.
        node = new_node(store, spark, tmp / "node", batch_max_events=n, idle_poll_s=3600.0)
        attach_runner(node)
        join_cluster(node)
        want_owner(node)
        worker = PartitionWorker(node, P0) if fenced else UnfencedWorker(node, P0)
        # Node._start is what the reconcile loop calls for a partition this node should
        # run; calling it directly lets the OFF run use its own worker class.
        node._start(worker)
        wait_for(lambda: worker.state_name == WorkerState.RUNNING or worker.finished, 60, "the worker")
        if worker.state_name != WorkerState.RUNNING:
            raise RuntimeError(f"worker did not start: {worker.progress().error}")
        time.sleep(SETTLE_S)
        refresher: threading.Thread | None = None
        if fenced:
            refresher = threading.Thread(target=node._refresh_loop, name="guard-refresh", daemon=True)
            refresher.start()

        t0 = time.perf_counter()
        SourceLog(store, segment_events=n).append(P0, table)
        produce_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        worker.offer(None)  # wake the parked worker: it reads the one segment and processes it
        while worker.progress().source_offset < n:
            if worker.finished:
                raise RuntimeError(f"worker stopped: {worker.state_name} {worker.progress().error}")
            if time.perf_counter() - t0 > 300:
                raise TimeoutError(f"{n} events not committed after 300 s")
            time.sleep(0.001)
        process_s = time.perf_counter() - t0

        node.stop()  # ends the refresh loop
        if refresher is not None:
            refresher.join(5)
        current = ManifestReader(store).current(P0)
        if current is None or current.manifest.source_offset != n or current.manifest.events_applied != n:
            raise RuntimeError(f"unexpected manifest after the batch: {current}")
        stop_worker(worker)
        return ThroughputRun(fenced, n, process_s, produce_s)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def breakdown_once(spark: Any, workroot: Path, table: pa.Table) -> dict[str, float]:
    """One batch, step by step, with the calls `_process`/`_commit` make (fencing ON)."""
    n = table.num_rows
    tmp = Path(tempfile.mkdtemp(prefix="steps-", dir=workroot))
    try:
        store, ledger = new_local_cluster(tmp)
        node = new_node(store, spark, tmp / "node", batch_max_events=n)
        attach_runner(node)
        join_cluster(node)
        token = ledger.acquire(P0, node.id, expected_epoch=0, reason="bench", generation=node.generation)
        guard = PartitionGuard(token)
        ce, gen = node.cluster_epoch, node.generation
        takeover = ManifestUpdate(source_offset=0, cluster_epoch=ce, generation=gen, note="takeover")
        node.publisher.publish(token, takeover)
        SourceLog(store, segment_events=n).append(P0, table)
        steps: dict[str, float] = {}

        def step(name: str, fn: Callable[[], Any]) -> Any:
            t0 = time.perf_counter()
            out = fn()
            steps[name] = time.perf_counter() - t0
            return out

        batch = step("source read (get + frame/footer check)", lambda: node.source.read(P0, 0, n))
        files = step("stage the batch as local parquet", lambda: batch.write_parquet(tmp / "batch"))
        guard.check()
        sc = spark.sparkContext
        group = f"bench-{uuid.uuid4().hex}"
        sc.setJobGroup(group, "bench_runtime step breakdown")
        try:
            result = step(
                "Spark: state+batch -> Arrow (runner.run)",
                lambda: node.runner.run(empty_state(), files, epoch=token.epoch, generation=gen),
            )
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        tracker = sc.statusTracker()
        jobs = tracker.getJobIdsForGroup(group)
        infos = [tracker.getJobInfo(j) for j in jobs]
        steps["(Spark jobs)"] = float(len(jobs))
        steps["(Spark stages)"] = float(sum(len(i.stageIds) for i in infos if i is not None))
        guard.check()
        ref = step("output write (parquet zstd + put)", lambda: node.outputs.write(guard, result.output, 0, n))
        update = ManifestUpdate(
            source_offset=n, outputs=(ref,), events_applied=n, cluster_epoch=ce, generation=gen
        )
        step("manifest publish (fenced)", lambda: node.publisher.publish(token, update))
        return steps
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class FencingWork:
    check_s: float  # one PartitionWorker._check()
    refresh_s: float  # one iteration of Node._refresh_loop with one guard


def measure_fencing_work(workroot: Path) -> FencingWork:
    """The ON worker's fencing work, timed directly (no Spark involved)."""
    tmp = Path(tempfile.mkdtemp(prefix="fencing-", dir=workroot))
    try:
        store, ledger = new_local_cluster(tmp)
        node = new_node(store, None, tmp / "node")
        join_cluster(node)
        worker = PartitionWorker(node, P0)  # never started: only its guard is installed
        worker._install(ledger.acquire(P0, node.id, expected_epoch=0, generation=node.generation))
        calls = 100_000
        checks = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                worker._check()
            checks.append((time.perf_counter() - t0) / calls)
        refreshes = []
        for _ in range(50):
            # The body of Node._refresh_loop: the kill-switch refresh, then the cluster epoch.
            t0 = time.perf_counter()
            revoked = node.refresh_guards()
            node.observe_cluster_epoch(node.ledger.membership().cluster_epoch)
            refreshes.append(time.perf_counter() - t0)
            if revoked:
                raise RuntimeError("the guard was revoked")
        return FencingWork(median(checks), median(refreshes))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: Per one-batch run of the ON worker: `_check()` before the read, after Spark, and
#: before the (empty) read after the commit; one guard check in `OutputWriter.write`.
CHECKS_PER_BATCH = 4


def bench_throughput(report: Report, spark: Any, workroot: Path, p: Params) -> None:
    work = measure_fencing_work(workroot)
    refresh_interval_s = NodeConfig(store_url="file:///unused", node_id=1).refresh_interval_s
    report.info("1. fencing work: one PartitionWorker._check()", f"{work.check_s * 1e9:.0f} ns")
    report.info("1. fencing work: one refresh-loop iteration, 1 guard", f"{work.refresh_s * 1e6:.0f} us")
    for n, runs in p.sizes:
        table = events_table(n, seed=n)
        on: list[ThroughputRun] = []
        off: list[ThroughputRun] = []
        for i in range(runs):
            # Interleaved, alternating which configuration goes first.
            for fenced in (True, False) if i % 2 == 0 else (False, True):
                run = throughput_once(spark, workroot, table, fenced)
                (on if fenced else off).append(run)
                progress(
                    f"1. {_size(n)} run {i + 1}/{runs} fencing {'ON ' if fenced else 'OFF'}: "
                    f"{run.process_s * 1000:.0f} ms = {_eps(run.eps)}, produce {run.produce_s * 1000:.0f} ms"
                )
        eps_on = median([r.eps for r in on])
        eps_off = median([r.eps for r in off])
        ratio = eps_on / eps_off
        t_off = median([r.process_s for r in off])
        # The ON worker's extra work in one batch window: its checks, and one refresh per
        # started refresh interval (the refresh loop runs on its own thread: an upper bound).
        fencing_s = CHECKS_PER_BATCH * work.check_s + (1 + int(t_off // refresh_interval_s)) * work.refresh_s
        implied = t_off / (t_off + fencing_s)
        label = f"1. {_size(n)} batch"
        if n == 1_000_000:
            target = f">= {THROUGHPUT_TARGET_EPS / 1000:.0f}k ev/s"
            report.add(
                Row(
                    f"{label}, fencing ON: events/s (median of {runs})",
                    LOCAL,
                    _eps(eps_on),
                    target,
                    verdict(eps_on, THROUGHPUT_TARGET_EPS, higher_is_better=True),
                )
            )
        else:
            report.info(f"{label}, fencing ON: events/s (median of {runs})", _eps(eps_on))
        report.info(f"{label}, fencing ON: produce->commit time", _ms(median([r.process_s for r in on])))
        report.info(f"{label}, fencing OFF: events/s (median of {runs})", _eps(eps_off))
        report.add(
            Row(
                f"{label}, ratio ON/OFF (medians)",
                LOCAL,
                f"{ratio:.3f}",
                f">= {FENCING_RATIO_TARGET}",
                verdict(ratio, FENCING_RATIO_TARGET, higher_is_better=True),
            ),
            Row(
                f"{label}, ratio implied by the fencing work",
                LOCAL,
                f"{implied:.5f}",
                f">= {FENCING_RATIO_TARGET}",
                verdict(implied, FENCING_RATIO_TARGET, higher_is_better=True),
            ),
        )
        report.info(f"{label}, produce (append; not timed above)", _ms(median([r.produce_s for r in on + off])))
        pairs = [a.eps / b.eps for a, b in zip(on, off, strict=True)]
        report.note(
            f"1 ({_size(n)}): ON times {_list_ms([r.process_s for r in on])} ms; "
            f"OFF times {_list_ms([r.process_s for r in off])} ms; "
            f"paired ON/OFF ratios {', '.join(f'{x:.2f}' for x in pairs)}"
        )
        progress(f"1. {_size(n)} step breakdown")
        runs_steps = [breakdown_once(spark, workroot, table) for _ in range(p.breakdown_runs)]
        total = 0.0
        for name in runs_steps[0]:
            if name.startswith("("):
                continue
            value = median([s[name] for s in runs_steps])
            total += value
            report.info(f"{label} step: {name}", _ms(value))
        report.info(f"{label} step: sum of the steps", _ms(total))
        counts = runs_steps[0]
        report.info(
            f"{label}: Spark jobs / stages in one runner.run",
            f"{counts['(Spark jobs)']:.0f} / {counts['(Spark stages)']:.0f}",
        )
    report.note(
        "1: one node, one partition, one batch per run on a fresh local store (fsync on), "
        f"{KEYS} keys, default keyed_aggregation, Spark {MASTER}; ON = the library's PartitionWorker + "
        "the node's guard-refresh loop (every 1.5 s); OFF = UnfencedWorker (no tracker/guard checks, "
        "no refresh loop, publish without the fence-on-error wrapper); the batch never checkpoints "
        "(every 10 batches)"
    )
    report.note(
        f"1: implied ratio = T_off / (T_off + {CHECKS_PER_BATCH} checks + one refresh-loop iteration "
        "(refresh_guards + membership read) per started refresh interval), the fencing work timed "
        "directly; both configurations keep the cluster-epoch window around the commit"
    )
    report.note(
        f"1: steps = median of {p.breakdown_runs} separate run(s) making the calls of _process/_commit "
        "one by one from an empty state"
    )


# --- 2. checkpoint transfer ---------------------------------------------------------------------


def bench_checkpoint(report: Report, store: ObjectStore, backend: str, size: int, runs: int) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(1)
    # A real token: the checkpoint writer checks the guard and stamps its identity.
    token = ledger.acquire(P0, NODE1, expected_epoch=0, reason="checkpoint benchmark")
    guard = PartitionGuard(token)
    checkpoints = CheckpointStore(CheckpointWriter(store))
    reader = ReadStore(store)
    base = bytearray(os.urandom(size))  # incompressible, like a zstd parquet snapshot
    ups: list[float] = []
    downs: list[float] = []
    for i in range(runs):
        base[:16] = uuid.uuid4().bytes  # every snapshot unique (the retry layer's read-back relies on it)
        data = bytes(base)
        t0 = time.perf_counter()
        ref = checkpoints.upload_bytes(guard, data)
        ups.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = download_bytes(reader, ref)
        downs.append(time.perf_counter() - t0)
        if len(got) != size:
            raise RuntimeError(f"downloaded {len(got)} bytes, uploaded {size}")
        del got, data
        progress(f"2. {backend} run {i + 1}/{runs}: up {ups[-1]:.2f} s, down {downs[-1]:.2f} s")
    up = size / MB / median(ups)
    down = size / MB / median(downs)
    local = backend == LOCAL
    label = f"2. checkpoint {size // MB} MB"
    report.add(
        Row(
            f"{label} upload_bytes (median of {runs})",
            backend,
            f"{up:.0f} MB/s",
            f">= {UPLOAD_TARGET_MBPS:.0f} MB/s" if local else "-",
            verdict(up, UPLOAD_TARGET_MBPS, higher_is_better=True) if local else "info",
        ),
        Row(
            f"{label} download_bytes (median of {runs})",
            backend,
            f"{down:.0f} MB/s",
            f">= {DOWNLOAD_TARGET_MBPS:.0f} MB/s" if local else "-",
            verdict(down, DOWNLOAD_TARGET_MBPS, higher_is_better=True) if local else "info",
        ),
    )
    report.info(f"{label} upload / download time", f"{_list_ms([median(ups), median(downs)])} ms", backend)


def bench_hash(report: Report, size: int) -> None:
    data = os.urandom(size)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        hashlib.sha256(data).hexdigest()
        times.append(time.perf_counter() - t0)
    report.info(f"2. one sha256 pass over {size // MB} MB (for scale)", _ms(median(times)), "-")


def run_s3_checkpoints(report: Report, p: Params) -> None:
    progress("starting the moto S3 server")
    with start_s3_server() as endpoint:
        from laminar_orchestration.store.s3 import make_s3_client

        client = make_s3_client(endpoint)
        bucket = f"laminar-bench-{uuid.uuid4().hex[:16]}"
        client.create_bucket(Bucket=bucket)
        client.close()
        # Wrapped in RetryingStore, as open_store does for s3:// URLs.
        store = StoreSpec("s3", endpoint=endpoint, bucket=bucket, prefix="runtime").open()
        try:
            bench_checkpoint(report, store, S3, p.state_bytes, p.s3_ckpt_runs)
        finally:
            store.close()


# --- 3. drain ------------------------------------------------------------------------------------


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
        self.ledger.register_node(NODE2, heartbeat_timeout_s=3600.0)
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
            staged = w._workdir / f"batch-{first}"
            # The worker read the segment and staged it for Spark: the batch is in flight.
            wait_for(lambda: staged.exists() or w.progress().source_offset >= end, 10, "the batch to start")
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
                progress(f"3. {scenario} run {i + 1}/{runs}: {r.drain_s * 1000:.0f} ms {_how(r)}")
    finally:
        bench.close()
    target = f"< {DRAIN_TARGET_MS:.0f} ms"
    inflight = results["in-flight"]
    d = median([r.drain_s for r in inflight])
    report.add(
        Row(
            f"3. drain, 10k-event batch in flight (median of {runs})",
            LOCAL,
            _ms(d),
            target,
            verdict(d * 1000, DRAIN_TARGET_MS),
        )
    )
    hows = [_how(r) for r in inflight]
    report.info(
        "3.   in-flight batch: cancelled (a) / ran on, dropped (d) / committed (c)",
        f"{hows.count('a')} / {hows.count('d')} / {hows.count('c')}",
    )
    for how, label in (("a", "cancel took effect"), ("d", "batch ran to its end, dropped")):
        times = [r.drain_s for r in inflight if _how(r) == how]
        if times:
            report.info(f"3.   drain when {label} (median of {len(times)})", _ms(median(times)))
    cancels = [r.cancelled_after_s for r in inflight if r.cancelled_after_s is not None]
    if cancels:
        report.info("3.   Draining asked -> Spark gave the batch up (median)", _ms(median(cancels)))
    commits = [(r.drain_s, r.commit_after_s) for r in inflight if r.commit_after_s is not None]
    if commits:
        report.info("3.   Draining asked -> in-flight batch committed", _ms(median([c for _, c in commits])))
    queued = results["queued"]
    q = median([r.drain_s for r in queued])
    report.add(
        Row(
            f"3. drain, 10k produced then Draining asked at once (median of {runs})",
            LOCAL,
            _ms(q),
            target,
            verdict(q * 1000, DRAIN_TARGET_MS),
        )
    )
    idle = median([r.drain_s for r in results["idle"]])
    report.info(f"3. drain, idle worker, nothing queued (median of {runs})", _ms(idle))
    report.note(
        "3: drain time = wall time of MigrationCoordinator.run_phase(DRAINING): read + CAS of the "
        "migration record, then polling (every 20 ms) node 1's ledger record until it reports Draining; "
        "node 1 sees the phase through its reconcile loop (every 50 ms), which also abandons the in-flight "
        "batch (cancelJobGroup), stops between batches, and reports through its heartbeat thread (one CAS "
        "of its record); each migration is then cancelled and the worker catches up before the next run"
    )

    def each(rs: list[DrainRun]) -> str:
        return ", ".join(f"{r.drain_s * 1000:.0f}{_how(r)}" for r in rs)

    report.note(
        "3: per run (a = Spark cancel took effect, d = the batch ran to its end and was dropped, "
        f"c = committed by the drained owner): in flight {each(inflight)} ms; queued {each(queued)} ms; "
        f"idle {_list_ms([r.drain_s for r in results['idle']])} ms"
    )


# --- driver ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (< 2 minutes)")
    parser.add_argument("--no-s3", action="store_true", help="skip the moto S3 backend")
    args = parser.parse_args(argv)
    p = QUICK if args.quick else FULL

    import pyspark

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    report = Report()
    progress(f"starting Spark ({MASTER})")
    spark = build_spark_session(MASTER, "laminar-bench-runtime")
    spark_start = time.perf_counter() - started
    try:
        with tempfile.TemporaryDirectory(prefix="laminar-bench-runtime-") as tmp:
            workroot = Path(tmp)
            t0 = time.perf_counter()
            warm_up(spark, workroot, p.warmup_rounds)
            warm_s = time.perf_counter() - t0
            bench_throughput(report, spark, workroot, p)
            progress("2. checkpoints (local)")
            bench_hash(report, p.state_bytes)
            bench_checkpoint(report, LocalObjectStore(workroot / "ckpt-store"), LOCAL, p.state_bytes, p.local_ckpt_runs)
            if not args.no_s3:
                run_s3_checkpoints(report, p)
            progress("3. drain")
            bench_drain(report, spark, workroot, p.drain_runs)
    finally:
        spark.stop()
    elapsed = time.perf_counter() - started

    report.note(
        f"Spark {pyspark.__version__}, one session {MASTER} built in {spark_start:.1f} s, warmed up with "
        f"{p.warmup_rounds} rounds of 10k/100k/1M batches ({warm_s:.1f} s) and shared by every node"
    )
    report.note("S3 = moto's single-threaded server on loopback (tests/s3server.py): not AWS throughput")
    title = (
        f"laminar runtime benchmark ({'quick' if args.quick else 'full'}), "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%SZ')}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"1-min load average {load_before:.1f} before / {os.getloadavg()[0]:.1f} after"
    )
    text = format_table(report.rows, title, report.notes) + f"\ntotal benchmark time: {elapsed:.1f} s"
    print(text, flush=True)
    progress(f"written to {write_result('runtime.txt', text)}")


if __name__ == "__main__":
    main()
