"""The Spark Structured Streaming side of the windowed benchmark: its worker process (the baseline's
`WorkerMain` running ``groupBy(window(), user).withWatermark()`` in append mode on the RocksDB state
store), the driver's handle on it, and its run: catch-up of a backlog, the steady load, planned moves
and killed workers, its state sampled every 30 s, and its output read back.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from laminar_dev.localcluster import HEARTBEAT_TIMEOUT_S, wait_until

from .baseline_worker import DETECT_POLL_S, SS_DRIVER_MEMORY, Dirs, Worker, WorkerMain
from .common import REPO_ROOT, progress
from .migration_cluster import random_instant
from .windows_load import BACKLOG_TICKS, CLICKS, EVENTS_PER_TICK, ScheduledLoad, backlog, clicks

#: Spark's RocksDB state store, with changelog checkpointing (each batch uploads its changes, not a
#: snapshot: Spark's own recommendation for low-latency checkpoints).
ROCKSDB_CONF = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}
PROGRESS_POLL_S = 0.05


def windowed_query(spark: Any, src: str, pages: bool) -> Any:
    """The example's windowed counts in Spark's own terms: 5-minute tumbling windows, 1 minute of lateness."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    events = spark.readStream.schema(from_arrow_schema(CLICKS)).parquet(src)
    events = events.observe("input", F.count(F.lit(1)).alias("rows"))
    aggs = [F.count(F.lit(1)).alias("views"), F.sum("amount").alias("amount")]
    if pages:
        aggs.append(F.sort_array(F.collect_set("page")).alias("pages"))
    grouped = events.withWatermark("at", "1 minute").groupBy(F.window("at", "5 minutes"), F.col("user")).agg(*aggs)
    return grouped.select(
        F.col("user").alias("key"),
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        *[c for c in ("views", "amount", "pages") if pages or c != "pages"],
    )


def rocksdb(spark: Any) -> None:
    """The session's state store: RocksDB (a SQL setting, read when a query starts)."""
    for key, value in ROCKSDB_CONF.items():
        spark.conf.set(key, value)


class WindowsWorkerMain(WorkerMain):
    """The baseline worker with the windowed query; it also logs each micro-batch's progress."""

    def __init__(self, name: str, ctl: Path, pages: bool) -> None:
        super().__init__(name, ctl)
        self.pages = pages
        self.progress_path = ctl / f"{name}.progress.jsonl"

    def _start(self, spark: Any, cmd: dict[str, Any]) -> None:
        self.query_seq = self.seq
        rocksdb(spark)
        self.query = (
            windowed_query(spark, cmd["src"], self.pages)
            .writeStream.outputMode("append")
            .foreachBatch(self._sink(Path(cmd["out"]), self.seq))
            .option("checkpointLocation", cmd["ckpt"])
            .start()
        )

    def _warm_up(self, spark: Any) -> None:
        tmp = Path(tempfile.mkdtemp(prefix=f"warm-{self.name}-", dir=self.ctl))
        (tmp / "src").mkdir()
        rocksdb(spark)
        pq.write_table(pa.concat_tables([clicks(i, salt=7) for i in range(60)]), tmp / "src" / "0.parquet")
        q = (
            windowed_query(spark, str(tmp / "src"), self.pages)
            .writeStream.outputMode("append")
            .foreachBatch(lambda df, _bid: df.toArrow())
            .option("checkpointLocation", str(tmp / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(300)
        shutil.rmtree(tmp, ignore_errors=True)

    def _watch_progress(self) -> None:
        """Append every new micro-batch's progress (input rows, end time, state rows and memory)."""
        seen: set[tuple[int, int, str]] = set()
        while True:
            time.sleep(PROGRESS_POLL_S)
            q, seq = self.query, self.query_seq
            if q is None:
                continue
            try:
                self._log_progress(q, seq, seen)
            except Exception as exc:  # the query stopping under it: logged, polled again
                print(f"progress watch: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def _log_progress(self, q: Any, seq: int, seen: set[tuple[int, int, str]]) -> None:
        for pr in q.recentProgress:
            mark = (seq, int(pr["batchId"]), str(pr["timestamp"]))
            if mark in seen:
                continue
            seen.add(mark)
            started = datetime.fromisoformat(pr["timestamp"].replace("Z", "+00:00")).timestamp()
            ops = pr.get("stateOperators") or [{}]
            sources = pr.get("sources") or [{}]
            durations = dict(pr.get("durationMs") or {})
            line = {
                "query": seq,
                "batch_id": int(pr["batchId"]),
                # The file source's offsets moved: the batch read new files (its numInputRows stays 0
                # when foreachBatch runs the batch's plan as a new execution).
                "data": sources[0].get("startOffset") != sources[0].get("endOffset"),
                "input_rows": int(pr["numInputRows"]),
                "started_at": started,
                "ended_at": started + durations.get("triggerExecution", 0) / 1000.0,
                "durations": durations,
                "observed": {k: v.asDict() for k, v in (pr.get("observedMetrics") or {}).items()},
                "state_rows": int(ops[0].get("numRowsTotal", 0)),
                "state_memory": int(ops[0].get("memoryUsedBytes", 0)),
            }
            with open(self.progress_path, "a") as fh:
                fh.write(json.dumps(line) + "\n")

    def run(self, warm_up: bool) -> None:
        threading.Thread(target=self._watch_progress, name="progress", daemon=True).start()
        super().run(warm_up)


class WindowsWorker(Worker):
    """A windowed worker process (``python -m benchmarks.bench_windows --worker NAME``)."""

    def __init__(self, name: str, ctl: Path, pages: bool, *, warm_up: bool = True) -> None:
        self.name = name
        self.ctl = ctl
        self.seq = 0
        self.log_path = ctl / f"{name}.log"
        cmd = [sys.executable, "-m", "benchmarks.bench_windows", "--worker", name, "--ctl", str(ctl)]
        cmd += ["--pages"] if pages else []
        cmd += [] if warm_up else ["--no-warm-up"]
        self.spawned_at = time.time()
        env = {**os.environ, "LAMINAR_SPARK_DRIVER_MEMORY": SS_DRIVER_MEMORY}
        with open(self.log_path, "ab") as fh:
            self.proc = subprocess.Popen(
                cmd, env=env, cwd=REPO_ROOT, stdout=fh, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    def progress_lines(self) -> list[dict[str, Any]]:
        try:
            lines = (self.ctl / f"{self.name}.progress.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out

    def data_batches(self, since: float = 0.0) -> list[dict[str, Any]]:
        """Micro-batches that processed events and ended at or after `since`."""
        return [b for b in self.progress_lines() if b["input_rows"] > 0 and b["ended_at"] >= since]

    def wait_data(self, since: float, count: int, timeout: float) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []

        def enough() -> bool:
            st = self.status()
            if st.get("state") == "failed":
                raise RuntimeError(f"worker {self.name}'s query failed: {st.get('error')}")
            found[:] = self.data_batches(since)
            return len(found) >= count

        wait_until(enough, timeout, f"{count} data batch(es) from worker {self.name}", DETECT_POLL_S)
        return found


class FileSource:
    """The Spark side's source: each appended table one parquet file in `src` (renamed into place)."""

    def __init__(self, src: Path) -> None:
        self.src = src
        self.files = 0

    def append(self, table: pa.Table) -> None:
        name = f"{self.files:08d}.parquet"
        tmp = self.src / f".{name}.tmp"  # Spark's file source ignores dot-files
        pq.write_table(table, tmp)
        os.replace(tmp, self.src / name)
        self.files += 1


@dataclass
class Outage:
    """One planned move or killed worker, timed from the micro-batches' progress."""

    what: str
    src: str
    dst: str
    #: Planned move: last data batch on the old worker -> first on the new. Kill: the same.
    unavailable_s: float
    #: Planned move: stop command -> first data batch on the new worker. Kill: start on the standby -> it.
    recovery_s: float
    detection_s: float = 0.0


@dataclass
class StateSample:
    elapsed_s: float
    rows: int
    bytes: int


@dataclass
class SideRun:
    """One system's run, as the report reads it (both sides fill the same fields)."""

    catch_up_events: int = 0
    catch_up_s: float = 0.0
    steady_s: float = 0.0
    steady_events_in: int = 0
    steady_events_done: int = 0
    cpu_s: float = 0.0
    window_emitted: dict[int, float] = field(default_factory=dict)
    #: (key, window start ms, views) of every emitted row, in emission order.
    rows: list[tuple[str, int, int]] = field(default_factory=list)
    moves: list[Outage] = field(default_factory=list)
    kills: list[Outage] = field(default_factory=list)
    states: list[StateSample] = field(default_factory=list)
    appended_at: dict[int, float] = field(default_factory=dict)
    steady_window: tuple[float, float] = (0.0, 0.0)
    late_events: int | None = None
    notes: list[str] = field(default_factory=list)


def tree_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes and their descendants (from /proc)."""
    from .migration_cluster import process_tree

    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for root in pids:
        for p in process_tree(root):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
    return total


def dir_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


class Sampler(threading.Thread):
    """Calls `sample()` every `interval_s` from the start; keeps the samples."""

    def __init__(self, sample: Any, interval_s: float) -> None:
        super().__init__(name="state-sampler", daemon=True)
        self._sample = sample
        self._interval_s = interval_s
        self._stop_event = threading.Event()
        self.samples: list[StateSample] = []
        self.errors: list[str] = []

    def run(self) -> None:
        t0 = time.monotonic()
        i = 0
        while not self._stop_event.wait(max(0.0, t0 + i * self._interval_s - time.monotonic())):
            try:
                rows, size = self._sample()
                self.samples.append(StateSample(time.monotonic() - t0, rows, size))
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            i += 1

    def stop(self) -> None:
        self._stop_event.set()
        self.join(120)


@dataclass(frozen=True)
class Plan:
    minutes: float
    moves: int
    kills: int
    sample_s: float = 30.0
    #: Between two disturbances, so each starts from a settled partition.
    settle_s: float = 15.0


def read_outputs(out: Path) -> tuple[dict[int, float], list[tuple[str, int, int]]]:
    """Per window end (ms): when its last row was emitted; and every (key, start ms, views) row."""
    files = sorted(p for p in out.glob("*.parquet") if not p.name.startswith("."))
    if not files:
        return {}, []
    table = pa.concat_tables([pq.read_table(f, columns=["key", "window_start", "window_end", "views",
                                                             "emitted_at"]) for f in files])  # fmt: skip
    emitted: dict[int, float] = {}
    rows = []
    ends = table["window_end"].cast(pa.timestamp("ms", "UTC")).cast(pa.int64()).to_pylist()
    starts = table["window_start"].cast(pa.timestamp("ms", "UTC")).cast(pa.int64()).to_pylist()
    for key, start, end, views, at in zip(
        table["key"].to_pylist(), starts, ends, table["views"].to_pylist(), table["emitted_at"].to_pylist(),
        strict=True,
    ):  # fmt: skip
        emitted[end] = max(emitted.get(end, 0.0), at)
        rows.append((key, start, views))
    return emitted, rows


def run_spark(plan: Plan, root: Path, pages: bool) -> SideRun:
    """Spark SS: catch-up, steady load, moves and kills (warm standby), state sampled, output read."""
    ctl = root / "ctl"
    ctl.mkdir(parents=True)
    res = SideRun()
    progress("spark-ss: starting workers A and B (SparkSession + a warm-up windowed query each)")
    t0 = time.perf_counter()
    workers = {"A": WindowsWorker("A", ctl, pages), "B": WindowsWorker("B", ctl, pages)}
    spawned = 2
    dirs = Dirs.make(root / "query")
    source = FileSource(dirs.src)
    load = ScheduledLoad(source.append)
    sampler: Sampler | None = None
    try:
        for w in workers.values():
            w.wait_ready(600)
        res.notes.append(f"spark-ss: 2 warm workers ready in {time.perf_counter() - t0:.1f} s")
        cur, other = workers["A"], workers["B"]
        cur.wait_status(cur.command("start", dirs), 120)
        progress(f"spark-ss: catch-up of a {BACKLOG_TICKS}-tick backlog")
        first = backlog()
        t_backlog = time.time()
        source.append(first)

        def caught_up() -> bool:
            done: int = sum(int(b["input_rows"]) for b in cur.data_batches(t_backlog))
            return done >= int(first.num_rows)

        wait_until(caught_up, 900, "spark-ss to process the backlog", 0.05)
        res.catch_up_events = first.num_rows
        res.catch_up_s = max(b["ended_at"] for b in cur.data_batches(t_backlog)) - t_backlog
        progress(f"    {first.num_rows:,} events in {res.catch_up_s:.2f} s")

        def sample() -> tuple[int, int]:
            lines = [b for w in workers.values() for b in w.progress_lines()]
            latest = max(lines, key=lambda b: b["ended_at"]) if lines else {"state_rows": 0}
            state_dir = dirs.ckpt / "state"
            return int(latest["state_rows"]), dir_bytes(state_dir) if state_dir.exists() else 0

        sampler = Sampler(sample, plan.sample_s)
        run_s = plan.minutes * 60.0
        load.start()
        t_start = time.time()
        sampler.start()
        steady_end = t_start + run_s / 2
        cpu0 = tree_cpu_s([w.proc.pid for w in workers.values()])
        progress(f"spark-ss: steady load for {run_s / 2:.0f} s (no disturbance)")
        time.sleep(max(0.0, steady_end - time.time()))
        res.cpu_s = tree_cpu_s([w.proc.pid for w in workers.values()]) - cpu0
        res.steady_window = (t_start, steady_end)
        res.steady_s = steady_end - t_start
        res.steady_events_in = sum(1 for at in load.appended_at.values() if at <= steady_end) * EVENTS_PER_TICK
        res.steady_events_done = sum(
            b["input_rows"] for w in workers.values() for b in w.data_batches(t_start) if b["ended_at"] <= steady_end
        )
        for i in range(plan.moves):
            progress(f"  spark-ss move {i + 1}/{plan.moves}: {cur.name} -> {other.name}")
            res.moves.append(ss_move(cur, other, dirs))
            progress(f"    unavailable {res.moves[-1].unavailable_s:.2f} s, stop -> first batch "
                     f"{res.moves[-1].recovery_s:.2f} s")  # fmt: skip
            cur, other = other, cur
            time.sleep(plan.settle_s)
        for i in range(plan.kills):
            progress(f"  spark-ss kill {i + 1}/{plan.kills}: {cur.name} (standby {other.name})")
            res.kills.append(ss_kill(cur, other, dirs))
            k = res.kills[-1]
            progress(f"    detection {k.detection_s:.2f} s, recovery {k.recovery_s:.2f} s")
            spawned += 1
            name = f"{cur.name[0]}{spawned}"
            fresh = WindowsWorker(name, ctl, pages)
            workers[name] = fresh
            fresh.wait_ready(600)
            cur, other = other, fresh
            time.sleep(plan.settle_s)
        time.sleep(max(0.0, t_start + run_s - time.time()))
        sampler.stop()
        load.stop()
        res.appended_at = dict(load.appended_at)
        last_append = max(load.appended_at.values())

        def drained() -> bool:
            # A batch (or an idle trigger's report) that started after the last append: it read every
            # file, or found nothing new.
            return any(b["started_at"] > last_append for b in cur.progress_lines())

        wait_until(drained, 300, "spark-ss to process the load", 0.2)
        cur.wait_status(cur.command("stop"), 120)
        res.states = sampler.samples
        res.notes += [f"spark-ss sampler: {e}" for e in sampler.errors[:3]]
        res.window_emitted, res.rows = read_outputs(dirs.out)
    except BaseException:
        for w in workers.values():
            progress(f"--- worker {w.name} log tail ---\n{w.log()[-3000:]}")
        raise
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stop()
        if load.is_alive():
            with contextlib.suppress(Exception):
                load.stop()
        for w in workers.values():
            with contextlib.suppress(Exception):
                w.close()
    return res


def batch_gaps(batches: list[dict[str, Any]]) -> list[float]:
    times = sorted(float(b["ended_at"]) for b in batches)
    return [b - a for a, b in itertools.pairwise(times)]


def last_batch(w: WindowsWorker) -> float:
    """When `w`'s last data batch ended: its logged progress, or the sink call (made inside the batch)
    of a batch whose progress was never logged (the worker stopped or died first)."""
    lines = w.progress_lines()
    last = max((b for b in lines if b["input_rows"] > 0), key=lambda b: b["ended_at"])
    logged = max(b["batch_id"] for b in lines if b["query"] == last["query"])
    later = [float(b["emitted_at"]) for b in w.batches() if b["query"] == last["query"] and b["batch_id"] > logged]
    return max([float(last["ended_at"]), *later])


def ss_move(cur: WindowsWorker, other: WindowsWorker, dirs: Dirs) -> Outage:
    """Stop the query on `cur` (after the batch in flight), start it on `other` with the same checkpoint."""
    random_instant(batch_gaps(cur.wait_data(time.time(), 3, 120)))
    t_stop = time.time()
    cur.wait_status(cur.command("stop"), 60)
    last = last_batch(cur)
    other.wait_status(other.command("start", dirs), 60)
    first = min(b["ended_at"] for b in other.wait_data(t_stop, 1, 900))
    return Outage("move", cur.name, other.name, first - last, first - t_stop)


def ss_kill(cur: WindowsWorker, standby: WindowsWorker, dirs: Dirs) -> Outage:
    """SIGKILL `cur`'s process tree; once its heartbeat is stale, start the query on the warm `standby`."""
    random_instant(batch_gaps(cur.wait_data(time.time(), 3, 120)))
    t_kill = cur.kill()
    last = last_batch(cur)
    t_dead = cur.wait_dead(HEARTBEAT_TIMEOUT_S + 15)
    t_start = time.time()
    standby.command("start", dirs)
    first = min(b["ended_at"] for b in standby.wait_data(t_start, 1, 900))
    return Outage("kill", cur.name, standby.name, first - last, first - t_start, t_dead - t_kill)
