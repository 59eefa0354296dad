"""Figures 1, 3 and 4 of the runtime benchmark: one partition with a committed state of 1k or 2.7M keys
(seeded without Spark) run by an in-process node. Batch cost vs state size with a per-step breakdown,
checkpoint bytes per batch and per snapshot, and the restore split (a fresh node, a warm standby)."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from laminar_orchestration.dataplane.checkpoint import CheckpointStore, OutputWriter
from laminar_orchestration.dataplane.engine import SparkBatchEngine
from laminar_orchestration.dataplane.restore import CatchUp, StateReplica
from laminar_orchestration.dataplane.statestore import PartitionStateStore
from laminar_orchestration.dataplane.worker import PartitionWorker
from laminar_orchestration.processing.contract import FoldContext
from laminar_orchestration.processing.keyed import keyed_aggregation
from laminar_orchestration.protocol.capabilities import CheckpointWriter, OutputCommitter, ReadStore
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.fencing import FencingToken, PartitionGuard
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import PartitionManifest, SnapshotRef
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore

from .common import Row, median, progress, verdict
from .runtime_setup import (
    LOCAL,
    MASTER,
    NODE1,
    P0,
    SETTLE_S,
    Params,
    Report,
    close_node,
    current_manifest,
    fmt_bytes,
    fmt_list_ms,
    fmt_ms,
    fmt_size,
    history,
    in_process_node,
    new_local_cluster,
    start_worker,
    stop_worker,
    want_owner,
)

#: The batch of figure 1: events, distinct keys, and the fraction of those keys new to the state.
BATCH_EVENTS = 10_000
BATCH_KEYS = 1_000
NEW_KEY_FRACTION = 0.05
SMALL_STATE = 1_000
BIG_STATE = 2_700_000
#: Segments of the seed events (the big seed is appended in a few segments).
SEED_SEGMENT = 1_000_000

# Targets.
BATCH_TARGET_MS = 250.0
STATE_RATIO_TARGET = 1.5


# --- seeding a committed state without Spark -------------------------------------------------------


def seed_events(keys: int, seed: int) -> pa.Table:
    """One event per key, k0..k{keys-1} in order (the state they make is built directly)."""
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "key": pa.array([f"k{i}" for i in range(keys)], pa.string()),
            "value": pa.array(rng.random(keys) * 100.0),
            "ts": pa.array(np.arange(keys, dtype=np.int64)),
        }
    )


@dataclass(frozen=True)
class Seed:
    keys: int
    append_s: float
    fill_s: float
    checkpoint_s: float
    upload_s: float
    snapshot: SnapshotRef
    sst_files: int
    local_bytes: int


def seed_partition(store: ObjectStore, ledger: Ledger, workdir: Path, keys: int) -> Seed:
    """Commit a `keys`-key state at offset `keys` (the source holds one event per key), then release it."""
    events = seed_events(keys, seed=keys)
    t0 = time.perf_counter()
    SourceLog(store, segment_events=min(keys, SEED_SEGMENT)).append(P0, events)
    append_s = time.perf_counter() - t0

    db_dir, ckpt_dir = workdir / "seed-db", workdir / "seed-ckpt"
    values = events["value"]
    chunk = 200_000
    t0 = time.perf_counter()
    with PartitionStateStore(db_dir, keyed_aggregation.state_schema, partition=P0) as local:
        for lo in range(0, keys, chunk):
            n = min(chunk, keys - lo)
            v = values.slice(lo, n)
            rows = pa.table(
                {
                    "key": events["key"].slice(lo, n),
                    "count": pa.array(np.ones(n, dtype=np.int64)),
                    "sum": v,
                    "min": v,
                    "max": v,
                    "last": v,
                    "last_offset": pa.array(np.arange(lo, lo + n, dtype=np.int64)),
                }
            )
            local.apply(rows, lo + n)
        # A store that has run for a while keeps its rows in the bottom level: compact the bulk
        # load (its memtable flushes would otherwise leave L0 files that compact on the first open).
        local._db.flush()
        local._db.compact_range(None, None)
        fill_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        files = local.checkpoint(ckpt_dir)
        checkpoint_s = time.perf_counter() - t0
        if local.source_offset != keys:
            raise RuntimeError(f"seed store at offset {local.source_offset}, expected {keys}")

    token = ledger.acquire(P0, NODE1, expected_epoch=0, reason="benchmark seed")
    guard = PartitionGuard(token)
    t0 = time.perf_counter()
    snapshot = CheckpointStore(CheckpointWriter(store)).upload_snapshot(guard, files, keys, {})
    upload_s = time.perf_counter() - t0
    publisher = ManifestPublisher(OutputCommitter(store), store)
    version = publisher.publish(
        token, ManifestUpdate(source_offset=keys, snapshot=snapshot, events_applied=keys, note="benchmark seed")
    )
    ledger.release(token, commit_ulid=version.manifest.commit_ulid, source_offset=keys)
    seed = Seed(
        keys=keys,
        append_s=append_s,
        fill_s=fill_s,
        checkpoint_s=checkpoint_s,
        upload_s=upload_s,
        snapshot=snapshot,
        sst_files=sum(1 for f in files if f.name.endswith(".sst")),
        local_bytes=sum(f.stat().st_size for f in files),
    )
    shutil.rmtree(db_dir, ignore_errors=True)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    return seed


class BatchMaker:
    """Batches of `BATCH_EVENTS` events over `BATCH_KEYS` distinct keys, `NEW_KEY_FRACTION` of them new."""

    def __init__(self, state_keys: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.state_keys = state_keys
        self.next_new = state_keys  # new keys continue the k<i> key space
        self.ts = 10**12

    def delta(self) -> pa.Table:
        """A batch's delta without Spark: full new values for the keys `next()` would touch."""
        n_new = round(BATCH_KEYS * NEW_KEY_FRACTION)
        old = self.rng.choice(self.state_keys, BATCH_KEYS - n_new, replace=False)
        ids = np.concatenate([old, np.arange(self.next_new, self.next_new + n_new)])
        self.next_new += n_new
        v = pa.array(self.rng.random(BATCH_KEYS) * 100.0)
        return pa.table(
            {
                "key": pa.array([f"k{i}" for i in ids], pa.string()),
                "count": pa.array(self.rng.integers(1, 100, BATCH_KEYS)),
                "sum": v,
                "min": v,
                "max": v,
                "last": v,
                "last_offset": pa.array(self.rng.integers(0, 10**9, BATCH_KEYS)),
            }
        )

    def next(self) -> pa.Table:
        n_new = round(BATCH_KEYS * NEW_KEY_FRACTION)
        old = self.rng.choice(self.state_keys, BATCH_KEYS - n_new, replace=False)
        ids = np.concatenate([old, np.arange(self.next_new, self.next_new + n_new)])
        self.next_new += n_new
        names = pa.array([f"k{i}" for i in ids], pa.string())
        idx = self.rng.integers(0, BATCH_KEYS, size=BATCH_EVENTS)
        idx[:BATCH_KEYS] = np.arange(BATCH_KEYS)  # every key of the batch occurs
        self.rng.shuffle(idx)
        ts = np.arange(self.ts, self.ts + BATCH_EVENTS, dtype=np.int64)
        self.ts += BATCH_EVENTS
        return pa.table(
            {"key": names.take(pa.array(idx)), "value": pa.array(self.rng.random(BATCH_EVENTS) * 100.0), "ts": ts}
        )


# --- 1, 3, 4: batch cost vs state size, checkpoint bytes, restore ------------------------------------


@dataclass(frozen=True)
class BatchRun:
    e2e_s: float
    append_s: float
    end: int
    output_bytes: int
    delta_bytes: int


@dataclass
class StateResult:
    keys: int
    seed: Seed
    first_restore_s: float
    first_catch_up: CatchUp | None
    batches: list[BatchRun]
    #: Snapshots the node published, each: (bytes newly uploaded, bytes named by the manifest, files new).
    node_snapshots: list[tuple[int, int, int]]
    steps: list[dict[str, float]]
    #: Snapshots taken and uploaded directly, each after `SERIES_DELTAS` batch-sized deltas:
    #: (checkpoint s, upload s, bytes uploaded, files uploaded, bytes named).
    snapshot_series: list[tuple[float, float, int, int, int]] = field(default_factory=list)
    restores: list[tuple[float, CatchUp]] = field(default_factory=list)
    standby: list[tuple[CatchUp, CatchUp]] = field(default_factory=list)
    restore_deltas: int = 0


def run_batch(store: ObjectStore, worker: PartitionWorker, source: SourceLog, table: pa.Table) -> BatchRun:
    """Append one batch and wake the parked worker; seconds until its commit covers the log end."""
    t0 = time.perf_counter()
    res = source.append(P0, table)
    append_s = time.perf_counter() - t0
    worker.offer(None)  # wake the parked worker (its idle poll is an hour): it reads and processes
    end = res.next_offset
    while worker.progress().source_offset < end:
        if worker.finished:
            raise RuntimeError(f"worker stopped: {worker.state_name} {worker.progress().error}")
        if time.perf_counter() - t0 > 300:
            raise TimeoutError("batch not committed after 300 s")
        time.sleep(0.001)
    e2e = time.perf_counter() - t0
    # The batch's commit: the newest entry with outputs at `end` (a snapshot publish may follow it).
    reader = ManifestReader(store)
    version = reader.current(P0)
    while version is not None and not (version.manifest.outputs and version.manifest.source_offset == end):
        version = reader.entry(P0, version.manifest.seq - 1)
    if version is None:
        raise RuntimeError(f"no manifest commits offset {end}")
    m = version.manifest
    if m.deltas[-1].end_offset != end or m.events_applied != end:
        raise RuntimeError(f"unexpected manifest for the batch ending at {end}: {m}")
    return BatchRun(e2e, append_s, end, m.outputs[-1].size, m.deltas[-1].ref.size)


def node_snapshots(chain: list[PartitionManifest]) -> list[tuple[int, int, int]]:
    """Every snapshot after the first (the seed) in the chain: bytes/files it uploaded, bytes it names."""
    out: list[tuple[int, int, int]] = []
    known: set[str] = set()
    seen: SnapshotRef | None = None
    for m in chain:
        snap = m.snapshot
        if snap is None or snap == seen:
            continue
        new = [f for f in snap.files if f.ref.key not in known]
        if seen is not None:
            out.append((sum(f.ref.size for f in new), snap.size, len(new)))
        known |= {f.ref.key for f in snap.files}
        seen = snap
    return out


def wait_snapshot_settled(worker: PartitionWorker, timeout: float = 120.0) -> None:
    """Wake the parked worker until no snapshot is uploading or waiting to be published."""
    deadline = time.monotonic() + timeout
    while not worker.snapshots.settled:
        if time.monotonic() > deadline:
            raise TimeoutError("the node's snapshot did not finish")
        worker.offer(None)
        time.sleep(0.05)


class StepTimer:
    def __init__(self) -> None:
        self.steps: dict[str, float] = {}

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = fn()
        self.steps[name] = time.perf_counter() - t0
        return out


STEP_NAMES = (
    "read source (get segment + frame/footer check)",
    "stage the batch as local parquet",
    "Spark aggregate (engine.aggregate -> Arrow)",
    "multi-get touched keys + fold (merge)",
    "output + delta upload (parquet zstd + put)",
    "publish (successor-grant probe + fenced manifest)",
    "local apply (one RocksDB write batch)",
)


def breakdown_once(
    spark: Any,
    store: ObjectStore,
    ledger: Ledger,
    replica: StateReplica,
    token: FencingToken,
    manifest: PartitionManifest,
    table: pa.Table,
    workdir: Path,
) -> tuple[dict[str, float], PartitionManifest]:
    """One batch, step by step, with the calls `_process` / `_commit` make (fencing on)."""
    guard = PartitionGuard(token)
    engine = SparkBatchEngine(spark, None, str(workdir / "spark"))
    source = SourceLog(store)
    outputs = OutputWriter(OutputCommitter(store))
    checkpoints = CheckpointStore(CheckpointWriter(store))
    publisher = ManifestPublisher(OutputCommitter(store), store)
    cluster_epoch = ledger.members.record().cluster_epoch
    start = manifest.source_offset
    SourceLog(store, segment_events=BATCH_EVENTS).append(P0, table)
    step = StepTimer()
    guard.check()
    batch = step(STEP_NAMES[0], lambda: source.read(P0, start, BATCH_EVENTS))
    if batch is None or batch.start_offset != start:
        raise RuntimeError("the breakdown batch is not at the committed offset")
    files = step(STEP_NAMES[1], lambda: batch.write_parquet(workdir / f"batch-{start}"))
    sc = spark.sparkContext
    group = f"bench-{uuid.uuid4().hex}"
    wall0 = time.time()
    try:
        aggregate = step(
            STEP_NAMES[2], lambda: engine.aggregate(files, epoch=token.epoch, generation=0, job_group=group)
        )
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        shutil.rmtree(workdir / f"batch-{start}", ignore_errors=True)
    tracker = sc.statusTracker()
    jobs = tracker.getJobIdsForGroup(group)
    infos = [tracker.getJobInfo(j) for j in jobs]
    guard.check()
    local = replica.store
    assert local is not None

    def fold() -> Any:
        previous = local.get_many(aggregate["key"].to_pylist())
        return engine.processor.fold(aggregate, previous, FoldContext.at(token.epoch, 0))

    folded = step(STEP_NAMES[3], fold)
    end = batch.end_offset

    def upload() -> Any:
        return (
            outputs.write(guard, folded.output, start, end),
            checkpoints.upload_delta(guard, folded.delta, start, end),
        )

    out_ref, delta = step(STEP_NAMES[4], upload)
    guard.check()
    update = ManifestUpdate(
        source_offset=end,
        snapshot=manifest.snapshot,
        deltas=(*manifest.deltas, delta),
        outputs=(out_ref,),
        events_applied=manifest.events_applied + (end - start),
        cluster_epoch=cluster_epoch,
    )

    def publish() -> ManifestVersion:
        if ledger.grant(P0, token.epoch + 1) is not None:
            raise RuntimeError("a successor was granted during the breakdown")
        return publisher.publish(token, update)

    version = step(STEP_NAMES[5], publish)
    step(STEP_NAMES[6], lambda: replica.apply(folded.delta, end))
    steps = dict(step.steps)
    steps["(Spark jobs)"] = float(len(jobs))
    steps["(Spark stages)"] = float(sum(len(i.stageIds) for i in infos if i is not None))
    steps["(aggregate rows)"] = float(aggregate.num_rows)
    steps["(before the job)"] = first_job_submitted(sc, jobs, wall0)
    return steps, version.manifest


def first_job_submitted(sc: Any, jobs: Sequence[int], wall0: float) -> float:
    """Seconds from `wall0` (time.time()) until the first of `jobs` was submitted (the JVM's status store)."""
    try:
        status = sc._jsc.sc().statusStore()
        return float(min(status.job(j).submissionTime().get().getTime() / 1000.0 - wall0 for j in jobs))
    except Exception:  # the status store is not public API: no figure rather than no benchmark
        return float("nan")


#: Batch-sized deltas applied between two snapshots of the series (the node's `checkpoint_every_batches`).
SERIES_DELTAS = 10


def snapshot_series(
    store: ObjectStore, replica: StateReplica, token: FencingToken, maker: BatchMaker, count: int
) -> list[tuple[float, float, int, int, int]]:
    """`count` snapshots as the node takes them (`_start_snapshot` + upload + adopt on publish),
    each after `SERIES_DELTAS` batch-sized deltas written straight to the local store.

    Nothing is published: the replica's marker stays put (it is thrown away afterwards).
    """
    guard = PartitionGuard(token)
    checkpoints = CheckpointStore(CheckpointWriter(store))
    local = replica.store
    assert local is not None
    offset = local.source_offset
    out = []
    for _ in range(count):
        for _ in range(SERIES_DELTAS):
            local.apply(maker.delta(), offset)
        known = replica.lineage_files
        t0 = time.perf_counter()
        files, at, directory = replica.snapshot_files()
        ckpt_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        snap = checkpoints.upload_snapshot(guard, files, at, known)
        up_s = time.perf_counter() - t0
        shutil.rmtree(directory, ignore_errors=True)
        replica.adopt_snapshot(snap)
        new = [f for f in snap.files if known.get(f.name) != f]
        out.append((ckpt_s, up_s, sum(f.ref.size for f in new), len(new), snap.size))
    return out


class StateBench:
    """One partition with a seeded state of `keys` keys, run by an in-process node (figures 1, 3, 4)."""

    def __init__(self, spark: Any, workroot: Path, keys: int, p: Params) -> None:
        self.spark, self.keys, self.p = spark, keys, p
        self.big = keys == BIG_STATE
        self.tmp = Path(tempfile.mkdtemp(prefix=f"state{keys}-", dir=workroot))
        self.store, self.ledger = new_local_cluster(self.tmp)
        self.maker = BatchMaker(keys, seed=keys + 1)
        self.source = SourceLog(self.store, segment_events=BATCH_EVENTS)
        self.batches: list[BatchRun] = []

    def start(self) -> None:
        """Seed the committed state, then a node takes the partition (a full restore, no deltas)."""
        progress(f"1. {fmt_size(self.keys)} keys: seeding the committed state")
        self.seed = seed_partition(self.store, self.ledger, self.tmp, self.keys)
        progress(
            f"1. {fmt_size(self.keys)} keys: seeded (append {self.seed.append_s:.1f} s, fill {self.seed.fill_s:.1f} s, "
            f"upload {self.seed.upload_s:.1f} s, {fmt_bytes(self.seed.snapshot.size)})"
        )
        # Snapshots every 10 deltas (or when the deltas reach 25 % of the snapshot); none by time,
        # so the 2.7M run ends with exactly one series of deltas after the node's snapshot.
        self.node = in_process_node(
            self.store,
            self.spark,
            self.tmp / "node-a",
            batch_max_events=BATCH_EVENTS,
            idle_poll_s=3600.0,
            checkpoint_every_s=3600.0,
        )
        want_owner(self.node)
        self.worker = PartitionWorker(self.node, P0)
        self.first_restore_s = start_worker(self.node, self.worker)
        self.first_catch_up = self.worker.last_catch_up
        time.sleep(SETTLE_S)

    def batch(self) -> None:
        run = run_batch(self.store, self.worker, self.source, self.maker.next())
        self.batches.append(run)
        progress(
            f"1. {fmt_size(self.keys)} keys batch {len(self.batches)}: {run.e2e_s * 1000:.0f} ms "
            f"(append {run.append_s * 1000:.0f} ms)"
        )
        time.sleep(0.05)  # the worker parks again (and starts a due snapshot) before the next

    def settle(self) -> None:
        wait_snapshot_settled(self.worker)

    def finish(self) -> StateResult:
        """Stop the node (it releases), then restores, standby catch-up, step breakdown, snapshot series."""
        try:
            return self._finish()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _finish(self) -> StateResult:
        p, store, ledger, tmp = self.p, self.store, self.ledger, self.tmp
        stop_worker(self.worker)  # releases; a snapshot started after the last batch is abandoned
        close_node(self.node)
        shutil.rmtree(tmp / "node-a", ignore_errors=True)
        chain = history(store)
        result = StateResult(
            keys=self.keys,
            seed=self.seed,
            first_restore_s=self.first_restore_s,
            first_catch_up=self.first_catch_up,
            batches=self.batches,
            node_snapshots=node_snapshots(chain),
            steps=[],
        )
        result.restore_deltas = len(chain[-1].deltas)

        if self.big:
            for r in range(p.restore_runs):
                fresh = in_process_node(
                    store, self.spark, tmp / f"node-r{r}", batch_max_events=BATCH_EVENTS, idle_poll_s=3600.0
                )
                want_owner(fresh)
                w = PartitionWorker(fresh, P0)
                wall = start_worker(fresh, w)
                assert w.last_catch_up is not None
                result.restores.append((wall, w.last_catch_up))
                progress(
                    f"4. full restore {r + 1}/{p.restore_runs}: {wall * 1000:.0f} ms to RUNNING, "
                    f"{w.last_catch_up.deltas_applied} deltas"
                )
                stop_worker(w)
                close_node(fresh)
                shutil.rmtree(tmp / f"node-r{r}", ignore_errors=True)

        # A replica holding the snapshot catches up on the deltas (warm standby); the last one
        # then serves the step breakdown.
        final_version = current_manifest(store)
        base = next(m for m in history(store) if m.snapshot == final_version.snapshot)
        replica: StateReplica | None = None
        for s in range(p.standby_runs if self.big else 1):
            if replica is not None:
                replica.destroy()
            replica = StateReplica(tmp / f"standby-{s}", P0, keyed_aggregation.state_schema, ReadStore(store))
            full = replica.catch_up(base)
            deltas_only = replica.catch_up(final_version)
            result.standby.append((full, deltas_only))
            progress(
                f"4. standby {s + 1}: holds the snapshot after {full.total_s * 1000:.0f} ms; "
                f"{deltas_only.deltas_applied} deltas in {deltas_only.total_s * 1000:.0f} ms"
            )
        assert replica is not None and replica.store is not None

        own = ledger.ownership(P0)
        assert own is not None
        token = ledger.acquire(P0, NODE1, expected_epoch=own.epoch, reason="benchmark breakdown")
        manifest = current_manifest(store)  # the seal our grant put on the chain
        replica.catch_up(manifest)
        for b in range(p.breakdown_runs):
            steps, manifest = breakdown_once(
                self.spark, store, ledger, replica, token, manifest, self.maker.next(), tmp
            )
            result.steps.append(steps)
            progress(f"1. {fmt_size(self.keys)} keys step breakdown {b + 1}/{p.breakdown_runs}")
        result.snapshot_series = snapshot_series(store, replica, token, self.maker, p.snapshot_series)
        ledger.release(token, commit_ulid=manifest.commit_ulid, source_offset=manifest.source_offset)
        replica.destroy()
        return result


def bench_states(spark: Any, workroot: Path, p: Params) -> tuple[StateResult, StateResult]:
    """Both state sizes side by side, their batches interleaved so load drifts hit both alike."""
    small = StateBench(spark, workroot, SMALL_STATE, p)
    big = StateBench(spark, workroot, BIG_STATE, p)
    try:
        small.start()
        big.start()
        for series in range(2):
            for i in range(p.series_batches):
                # Alternating which state goes first.
                for bench in (small, big) if i % 2 == 0 else (big, small):
                    bench.batch()
            if series == 0:
                small.settle()
                big.settle()
        return small.finish(), big.finish()
    finally:
        shutil.rmtree(small.tmp, ignore_errors=True)
        shutil.rmtree(big.tmp, ignore_errors=True)


def report_states(report: Report, small: StateResult, big: StateResult) -> None:
    target = f"<= {BATCH_TARGET_MS:.0f} ms"
    meds: dict[int, float] = {}
    for r in (small, big):
        timed = r.batches[1:]
        med = median([b.e2e_s for b in timed])
        meds[r.keys] = med
        label = f"1. 10k-event batch, {fmt_size(r.keys)}-key state"
        report.add(
            Row(
                f"{label}: append -> committed (median of {len(timed)})",
                LOCAL,
                fmt_ms(med),
                target,
                verdict(med * 1000, BATCH_TARGET_MS),
            )
        )
        report.info(f"{label}: of which the append", fmt_ms(median([b.append_s for b in timed])))
        report.info(f"{label}: first batch after the restore", fmt_ms(r.batches[0].e2e_s))
        report.note(
            f"1 ({fmt_size(r.keys)} keys): every batch in order, ms: {fmt_list_ms([b.e2e_s for b in r.batches])}"
        )
    ratio = meds[BIG_STATE] / meds[SMALL_STATE]
    report.add(
        Row(
            "1. batch time ratio, 2.7M-key / 1k-key state (medians, same run)",
            LOCAL,
            f"{ratio:.2f}x",
            f"<= {STATE_RATIO_TARGET}x",
            verdict(ratio, STATE_RATIO_TARGET),
        )
    )
    for r in (small, big):
        label = f"1. step ({fmt_size(r.keys)} keys)"
        total = 0.0
        for name in STEP_NAMES:
            value = median([s[name] for s in r.steps])
            total += value
            report.info(f"{label}: {name}", fmt_ms(value))
            if name == STEP_NAMES[2]:
                before = median([s["(before the job)"] for s in r.steps])
                report.info(f"{label}:   of which before its Spark job was submitted", fmt_ms(before))
        report.info(f"{label}: sum of the steps", fmt_ms(total))
        s0 = r.steps[0]
        report.info(
            f"{label}: Spark jobs / stages per aggregate, aggregate rows",
            f"{s0['(Spark jobs)']:.0f} / {s0['(Spark stages)']:.0f}, {s0['(aggregate rows)']:.0f}",
        )
    report.note(
        "1: the two state sizes run side by side (two stores, two nodes), their batches interleaved; "
        "end to end = SourceLog.append of the batch (one 10k segment), then the parked worker is woken "
        "(offer; its idle poll is set to an hour so no poll read competes) and the clock stops when its "
        "committed offset (set after publish + local apply) reaches the log end; the library's "
        f"PartitionWorker on an in-process Node, {MASTER}, local store with fsync; {BATCH_KEYS} keys per batch, "
        f"{NEW_KEY_FRACTION:.0%} new; 50 ms pause between batches; snapshots every 10 deltas or at 25 % of the "
        "snapshot size (none by time), uploaded in the background as the node does; with the default "
        "idle_poll_s (50 ms) a batch would wait ~25 ms more on average before it is read"
    )
    report.note(
        f"1: steps = median of {len(small.steps)} batch(es) per state size, the calls of _process/_commit "
        "made one by one on a StateReplica under a real token (no worker thread, no polling)"
    )
    big_seed = big.seed
    report.info(
        "1. seeding 2.7M keys: append / fill + compact store / checkpoint / upload",
        f"{big_seed.append_s * 1000:.0f} / {big_seed.fill_s * 1000:.0f} / {big_seed.checkpoint_s * 1000:.0f} / "
        f"{big_seed.upload_s * 1000:.0f} ms",
    )


def report_bytes(report: Report, small: StateResult, big: StateResult) -> None:
    for r in (small, big):
        label = f"3. {fmt_size(r.keys)}-key state"
        timed = r.batches[1:]
        out = median([b.output_bytes for b in timed])
        delta = median([b.delta_bytes for b in timed])
        report.info(
            f"{label}: bytes per batch, output + delta (median)",
            f"{fmt_bytes(out)} + {fmt_bytes(delta)} = {fmt_bytes(out + delta)}",
        )
        s = r.seed
        report.info(
            f"{label}: full first snapshot (seed: {len(s.snapshot.files)} files, {s.sst_files} SST)",
            f"{fmt_bytes(s.snapshot.size)} in {s.upload_s * 1000:.0f} ms",
        )
        if r.node_snapshots:
            up = median([n[0] for n in r.node_snapshots])
            named = median([n[1] for n in r.node_snapshots])
            files = median([n[2] for n in r.node_snapshots])
            report.info(
                f"{label}: incremental snapshots by the node ({len(r.node_snapshots)}): uploaded (median)",
                f"{fmt_bytes(up)} ({files:.0f} files) of {fmt_bytes(named)}",
            )
        else:
            report.info(f"{label}: incremental snapshots by the node", "none published")
        series = r.snapshot_series
        if series:
            report.info(
                f"{label}: snapshot series ({len(series)}), each after {SERIES_DELTAS} deltas: uploaded (median)",
                f"{fmt_bytes(median([x[2] for x in series]))} ({median([x[3] for x in series]):.0f} files)",
            )
            report.info(
                f"{label}: snapshot series: uploaded, mean / max / total",
                f"{fmt_bytes(sum(x[2] for x in series) / len(series))} / {fmt_bytes(max(x[2] for x in series))} / "
                f"{fmt_bytes(sum(x[2] for x in series))}",
            )
            report.info(
                f"{label}: snapshot series: checkpoint + upload (medians)",
                f"{median([x[0] for x in series]) * 1000:.0f} + {median([x[1] for x in series]) * 1000:.0f} ms",
            )
            report.note(
                f"3 ({fmt_size(r.keys)} keys): snapshot series, KB uploaded per snapshot: "
                + ", ".join(f"{x[2] / 1000:.0f}" for x in series)
                + "; KB named: "
                + ", ".join(f"{x[4] / 1000:.0f}" for x in series)
            )
    report.note(
        "3: per-batch bytes from each batch's manifest; node snapshots from the manifest chain (bytes = "
        "files whose object the previous snapshots did not name); the seed snapshot is a fully compacted "
        "store; snapshot series = on the caught-up replica, "
        f"{SERIES_DELTAS} batch-sized deltas (1,000 keys, 5 % new) written to the store, then "
        "StateReplica.snapshot_files (flush + RocksDB checkpoint) + CheckpointStore.upload_snapshot with the "
        "lineage files + adopt_snapshot, as the node does every 10 batches"
    )


def report_restore(report: Report, big: StateResult) -> None:
    if big.restores:
        n = len(big.restores)
        walls = [w for w, _ in big.restores]
        cus = [c for _, c in big.restores]
        report.info(
            f"4. full restore 2.7M keys, fresh node, {big.restore_deltas} deltas: start -> RUNNING (median of {n})",
            fmt_ms(median(walls)),
        )
        split = [median([c.download_s for c in cus]), median([c.open_s for c in cus]), median([c.apply_s for c in cus])]
        report.info("4.   download / open / delta apply (CatchUp, medians)", f"{fmt_list_ms(split)} ms")
        report.info(
            "4.   bytes downloaded, deltas applied",
            f"{fmt_bytes(median([c.bytes_downloaded for c in cus]))}, {cus[0].deltas_applied}",
        )
    if big.first_catch_up is not None:
        c = big.first_catch_up
        report.info(
            "4. full restore 2.7M keys, 0 deltas (the first node): download / open / apply",
            f"{fmt_list_ms([c.download_s, c.open_s, c.apply_s])} ms ({fmt_bytes(c.bytes_downloaded)})",
        )
    if big.standby:
        n = len(big.standby)
        only = [d for _, d in big.standby]
        report.info(
            f"4. replica holding the snapshot: catch-up on deltas only (median of {n})",
            fmt_ms(median([d.total_s for d in only])),
        )
        report.info(
            "4.   deltas applied, bytes downloaded, full restore?",
            f"{only[0].deltas_applied}, {fmt_bytes(median([d.bytes_downloaded for d in only]))}, "
            f"{only[0].full_restore}",
        )
    report.note(
        "4: full restore = a fresh Node (new workdir) takes the released partition: acquire + seal, "
        "StateReplica.catch_up (download every snapshot file + sha256, open RocksDB, apply the deltas), "
        "takeover; start -> RUNNING is its wall time; the standby is a StateReplica caught up to the "
        "snapshot's first manifest, then to the current one"
    )
