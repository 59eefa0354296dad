"""Baseline: what a user does without laminar (Spark Structured Streaming + a checkpoint), compared in one run.

Run from the repository root::

    python -m benchmarks.bench_baseline           # full: 3 moves, 2 split-brain variants, warm+cold restart
    python -m benchmarks.bench_baseline --quick   # 1 move, 1 split-brain variant, warm restart only, 300k-key big state
    python -m benchmarks.bench_baseline --keep DIR   # keep checkpoints, outputs and logs

Roughly 4-5 min full / 3 min quick on an idle 2-CPU machine (Spark start-up of 4-5
JVMs dominates); 7.5 min full measured at a load average of ~20.

The baseline ("spark-ss") is one streaming query per partition: a file source
(a directory of parquet files, the partition's events with their offsets),
``groupBy("key").agg(count, sum, min, max, max_by(value, offset), max(offset))``
in output mode "update", a `foreachBatch` sink that appends each micro-batch's
rows (with the batch id, the worker's name and the wall-clock emission time) as
one parquet file to an output directory, and a ``checkpointLocation``. A
"worker" is a separate process (this module with ``--worker``) running one
SparkSession (``local[1]``, the same settings as a laminar node:
`build_spark_session`) that starts/stops the query on command and writes a
heartbeat file every 1 s. The checkpoint and source directories are on the
shared local disk and passed unchanged to whichever worker runs the query (a
checkpoint can only be moved after its query stopped, and the file source's
path must be identical where the query restarts).

Both systems get the same events (`generate_events`, 1,000 events every 0.25 s
over 1,000 keys, the same seeds), the same aggregation, the same Spark settings,
the same heartbeat timeout (3 s) and interval (1 s), and a 20 ms detection poll.
Scenarios, each on both systems (one after the other, never concurrently):

1. a worker is killed (SIGKILL of its whole process tree): detection by the
   heartbeat timeout, then recovery elsewhere. spark-ss: the query restarts on a
   warm standby worker (SparkSession already up), and once more on a cold one
   (a new process); laminar: forced `MigrationCoordinator.run`.
2. a planned move of the partition: spark-ss: stop the query on A (after waiting
   for the micro-batch in flight to complete, at most 5 s), then start it on B;
   laminar: graceful `MigrationCoordinator.run`.
3. split-brain: the owner is paused with SIGSTOP while a batch is in flight,
   declared dead by the heartbeat timeout, the partition is started elsewhere
   with the same checkpoint (spark-ss) / failed over (laminar, forced), more
   events arrive, then the old owner is resumed with SIGCONT. Counted: output
   emitted twice or by the zombie, final per-key counts that differ from the
   truth, query/checkpoint errors; for laminar `audit_store` duplicates.

4. the same planned moves and killed worker at ~100 MB of state: both systems
   first get the same 2.7M keys, each produced once (spark-ss: one source file,
   its first micro-batch, on workers C and D; laminar: partition 1, committed
   in batches of <= 1M events), then the same load.
5. the ratios the targets are about, from the same run: laminar's planned-move
   unavailability and kill recovery over spark-ss's warm-standby figures, at
   ~1 MB (25,000 seeded keys, for both) and ~100 MB; target <= 0.5.

laminar's two nodes both run with ``--standby-for 0,1``: the node that does not
own a partition keeps a warm copy of it (laminar's warm standby), and the
graceful and forced moves go to that copy; the no-standby figures are in
`bench_migration`. Output "first output" = spark-ss: a non-empty micro-batch file is in the output
directory; laminar: a manifest naming output is committed. The table is also
written to ``benchmarks/results/baseline.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from laminar_dev.localcluster import HEARTBEAT_TIMEOUT_S, Cluster, wait_until
from laminar_orchestration.dataplane.checkpoint import download_table
from laminar_orchestration.dataplane.restore import committed_state
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ops.verify import audit_store
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.source import SourceLog, generate_events
from laminar_orchestration.protocol.tasks import MigrationPhase
from laminar_orchestration.store import ObjectStore

from .bench_migration import (
    HEARTBEAT_INTERVAL_S,
    FailoverRun,
    History,
    MigrationRun,
    Producer,
    every_key_once,
    failover_run,
    gaps,
    graceful_run,
    log_tails,
    pick_target,
    random_instant,
    restore_summary,
    revive,
    signal_tree,
    start_cluster,
    wait_dead,
    wait_standby,
)
from .common import REPO_ROOT, Row, format_table, median, progress, publish, run_title, verdict

SPARK_MASTER = "local[1]"
KEYS = 1_000
EVENTS_PER_TICK = 1_000
TICK_S = 0.25
SEED = 2024
DETECT_POLL_S = 0.02
GRACEFUL_STOP_WAIT_S = 5.0
END_MARKER = "__end__"
BATCH_START = "paused at batch start"
AFTER_SINK = "paused after the sink"
HOLD_S = 1.0  # the split-brain hook's hold after the sink (one batch, one time)

FAILOVER_TARGET_S = 15.0
GRACEFUL_TARGET_S = 5.0
#: laminar's planned-move unavailability and kill recovery: at most this fraction of spark-ss's (warm standby).
RATIO_TARGET = 0.5
#: The seeded states: every key produced once before the load (~1 MB and ~100 MB of laminar state).
SMALL_KEYS = 25_000
BIG_KEYS = 2_700_000
SMALL_PREFIX, BIG_PREFIX = "a", "b"
SMALL_SEED, BIG_SEED = 1, 2
#: laminar nodes keep a warm standby copy of both partitions while they do not own them.
LAM_STANDBY_ARGS = ("--standby-for", "0,1")
#: The baseline's worker JVMs: the HDFS-backed state store holds a 2.7M-key state on the heap.
SS_DRIVER_MEMORY = "3g"

SS = "spark-ss"
LAMINAR = "laminar"


@dataclass(frozen=True)
class Params:
    moves: int
    cold_restart: bool
    pauses: tuple[str, ...]
    big_keys: int = BIG_KEYS


FULL = Params(moves=3, cold_restart=True, pauses=(BATCH_START, AFTER_SINK))
QUICK = Params(moves=1, cold_restart=False, pauses=(BATCH_START,), big_keys=300_000)


# =====================================================================================================
# The worker process (python -m benchmarks.bench_baseline --worker NAME --ctl DIR)
# =====================================================================================================


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def streaming_aggregate(spark: Any, src: str) -> Any:
    """The baseline query: the same per-key fold as `keyed_aggregation`, over a parquet file source."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    schema = StructType(
        [
            StructField("offset", LongType(), False),
            StructField("key", StringType(), False),
            StructField("value", DoubleType(), False),
            StructField("ts", LongType(), False),
        ]
    )
    events = spark.readStream.schema(schema).parquet(src)
    return events.groupBy("key").agg(
        F.count(F.lit(1)).alias("count"),
        F.sum("value").alias("sum"),
        F.min("value").alias("min"),
        F.max("value").alias("max"),
        F.max_by("value", "offset").alias("last"),
        F.max("offset").alias("last_offset"),
    )


class WorkerMain:
    """The child process: one SparkSession, at most one query, commands via files in `ctl`."""

    def __init__(self, name: str, ctl: Path) -> None:
        self.name = name
        self.ctl = ctl
        self.cmd_path = ctl / f"{name}.cmd.json"
        self.status_path = ctl / f"{name}.status.json"
        self.batches_path = ctl / f"{name}.batches.jsonl"
        self.hb_path = ctl / f"{name}.hb"
        self._batches_lock = threading.Lock()
        self.seq = 0
        self.query: Any = None
        self.query_seq = 0

    def _status(self, state: str, error: str | None = None) -> None:
        _write_json(self.status_path, {"seq": self.seq, "state": state, "error": error, "at": time.time()})

    def _heartbeat(self) -> None:
        while True:
            tmp = self.hb_path.with_name(f".{self.hb_path.name}.tmp")
            tmp.write_text(repr(time.time()))
            os.replace(tmp, self.hb_path)
            time.sleep(HEARTBEAT_INTERVAL_S)

    def _sink(self, out: Path, query_seq: int) -> Callable[[Any, int], None]:
        def write(df: Any, batch_id: int) -> None:
            table = df.toArrow()
            n = table.num_rows
            if n:
                emission = uuid.uuid4().hex[:12]
                emitted = time.time()
                table = (
                    table.append_column("batch_id", pa.array(np.full(n, batch_id, dtype=np.int64)))
                    .append_column("worker", pa.array([self.name] * n, pa.string()))
                    .append_column("emission", pa.array([emission] * n, pa.string()))
                    .append_column("emitted_at", pa.array(np.full(n, emitted)))
                )
                final = out / f"{self.name}-{batch_id:08d}-{emission}.parquet"
                tmp = out / f".{final.name}.tmp"
                pq.write_table(table, tmp)
                os.replace(tmp, final)
            line = {"batch_id": batch_id, "rows": n, "emitted_at": time.time(), "query": query_seq}
            with self._batches_lock, open(self.batches_path, "a") as fh:
                fh.write(json.dumps(line) + "\n")
            # Benchmark hook (split-brain, "after the sink"): a one-shot hold between this batch's
            # output and Spark's commit log write, so the driver's SIGSTOP lands exactly there.
            hold = self.ctl / f"{self.name}.hold-after-sink"
            if n and hold.exists():
                hold.unlink()
                _write_json(self.ctl / f"{self.name}.held.json", {"batch_id": batch_id, "at": time.time()})
                time.sleep(HOLD_S)

        return write

    def _start(self, spark: Any, cmd: dict[str, Any]) -> None:
        self.query_seq = self.seq
        agg = streaming_aggregate(spark, cmd["src"])
        self.query = (
            agg.writeStream.outputMode("update")
            .foreachBatch(self._sink(Path(cmd["out"]), self.seq))
            .option("checkpointLocation", cmd["ckpt"])
            .start()
        )

    def _stop(self) -> None:
        q = self.query
        if q is None:
            return
        # As graceful as the API allows: there is no "stop after this batch", so wait until the
        # micro-batch in flight completes (its progress is reported), then stop at once.
        last = q.lastProgress
        done = last["batchId"] if last else -1
        deadline = time.monotonic() + GRACEFUL_STOP_WAIT_S
        while q.isActive and time.monotonic() < deadline:
            progress = q.lastProgress
            if progress is not None and progress["batchId"] != done:
                break
            time.sleep(0.005)
        q.stop()
        self.query = None

    def _warm_up(self, spark: Any) -> None:
        """One tiny batch of the same query, so the first real batch does not pay for JIT and planning."""
        tmp = Path(tempfile.mkdtemp(prefix=f"warm-{self.name}-", dir=self.ctl))
        (tmp / "src").mkdir()
        events = generate_events(100, 10, 0, 1)[0]
        table = pa.table(
            {"offset": pa.array(np.arange(100, dtype=np.int64)), **{c: events[c] for c in events.column_names}}
        )
        pq.write_table(table, tmp / "src" / "0.parquet")
        q = (
            streaming_aggregate(spark, str(tmp / "src"))
            .writeStream.outputMode("update")
            .foreachBatch(lambda df, _bid: df.toArrow())
            .option("checkpointLocation", str(tmp / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(300)
        shutil.rmtree(tmp, ignore_errors=True)

    def run(self, warm_up: bool) -> None:
        from laminar_orchestration.dataplane.engine import build_spark_session

        threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()
        spark = build_spark_session(SPARK_MASTER, f"baseline-{self.name}")
        if warm_up:
            self._warm_up(spark)
        self._status("ready")
        while True:
            cmd = _read_json(self.cmd_path)
            if cmd is not None and int(cmd["seq"]) > self.seq:
                self.seq = int(cmd["seq"])
                action = cmd["action"]
                try:
                    if action == "start":
                        self._stop()
                        self._start(spark, cmd)
                        self._status("running")
                    elif action == "stop":
                        self._stop()
                        self._status("stopped")
                    elif action == "exit":
                        with contextlib.suppress(Exception):
                            self._stop()
                        self._status("exited")
                        spark.stop()
                        return
                except Exception as exc:
                    self.query = None
                    self._status("failed", f"{type(exc).__name__}: {str(exc).splitlines()[0][:400]}")
            q = self.query
            if q is not None and not q.isActive:
                failure = q.exception()
                text = str(failure).strip().splitlines()[0][:400] if failure is not None else "stopped"
                self.query = None
                self._status("failed", text)
            time.sleep(0.01)


# =====================================================================================================
# The driver side
# =====================================================================================================


@dataclass(frozen=True)
class Dirs:
    src: Path
    ckpt: Path
    out: Path

    @classmethod
    def make(cls, root: Path) -> Dirs:
        dirs = cls(root / "src", root / "ckpt", root / "out")
        dirs.src.mkdir(parents=True)
        dirs.out.mkdir(parents=True)
        return dirs

    def as_cmd(self) -> dict[str, str]:
        return {"src": str(self.src), "ckpt": str(self.ckpt), "out": str(self.out)}


class Worker:
    """A baseline worker process, driven through its command file."""

    def __init__(self, name: str, ctl: Path, *, warm_up: bool = True, start: Dirs | None = None) -> None:
        self.name = name
        self.ctl = ctl
        self.seq = 0
        self.log_path = ctl / f"{name}.log"
        if start is not None:  # cold start: the command waits for the process
            self.command("start", start)
        cmd = [sys.executable, "-m", "benchmarks.bench_baseline", "--worker", name, "--ctl", str(ctl)]
        if not warm_up:
            cmd.append("--no-warm-up")
        self.spawned_at = time.time()
        env = {**os.environ, "LAMINAR_SPARK_DRIVER_MEMORY": SS_DRIVER_MEMORY}
        with open(self.log_path, "ab") as fh:
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                cwd=REPO_ROOT,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def command(self, action: str, dirs: Dirs | None = None) -> int:
        self.seq += 1
        _write_json(
            self.ctl / f"{self.name}.cmd.json", {"seq": self.seq, "action": action, **(dirs.as_cmd() if dirs else {})}
        )
        return self.seq

    def status(self) -> dict[str, Any]:
        return _read_json(self.ctl / f"{self.name}.status.json") or {}

    def wait_status(self, seq: int, timeout: float) -> dict[str, Any]:
        got: dict[str, Any] = {}

        def done() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.log()[-3000:]}")
            got.update(self.status())
            return int(got.get("seq", -1)) >= seq and got.get("state") != "ready"

        wait_until(done, timeout, f"worker {self.name} to carry out command {seq}", 0.01)
        return got

    def wait_ready(self, timeout: float) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.log()[-3000:]}")
            return bool(self.status())

        wait_until(ready, timeout, f"worker {self.name} to start", 0.05)

    def batches(self) -> list[dict[str, Any]]:
        try:
            lines = (self.ctl / f"{self.name}.batches.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out

    def outputs(self, since: float = 0.0) -> list[dict[str, Any]]:
        """Non-empty micro-batches emitted at or after `since`."""
        return [b for b in self.batches() if b["rows"] > 0 and b["emitted_at"] >= since]

    def wait_outputs(self, since: float, count: int, timeout: float) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []

        def enough() -> bool:
            st = self.status()
            if st.get("state") == "failed":
                raise RuntimeError(f"worker {self.name}'s query failed: {st.get('error')}")
            found[:] = self.outputs(since)
            return len(found) >= count

        wait_until(enough, timeout, f"{count} output batch(es) from worker {self.name}", DETECT_POLL_S)
        return found

    def heartbeat_age(self) -> float:
        try:
            return time.time() - float((self.ctl / f"{self.name}.hb").read_text())
        except (FileNotFoundError, ValueError):
            return 0.0

    def wait_dead(self, timeout: float) -> float:
        """Poll the heartbeat file until it is older than the timeout; return that wall-clock time."""
        wait_until(
            lambda: self.heartbeat_age() > HEARTBEAT_TIMEOUT_S, timeout, f"worker {self.name} dead", DETECT_POLL_S
        )
        return time.time()

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> float:
        t = time.time()
        self.signal(signal.SIGKILL)
        self.proc.wait(30)
        return t

    def close(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.command("exit")
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class EventStream:
    """The shared load: `EVENTS_PER_TICK` events over `KEYS` keys per tick, deterministic per tick."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.tick = 0

    def next(self) -> pa.Table:
        self.tick += 1
        return generate_events(EVENTS_PER_TICK, KEYS, self.seed * 100_003 + self.tick, 1)[0]


class FileLog:
    """The baseline's source: each appended table becomes one parquet file (with offsets) in `src`."""

    def __init__(self, src: Path) -> None:
        self.src = src
        self.next_offset = 0
        self.files = 0

    def append(self, table: pa.Table) -> None:
        n = table.num_rows
        full = pa.table(
            {
                "offset": pa.array(np.arange(self.next_offset, self.next_offset + n, dtype=np.int64)),
                "key": table["key"],
                "value": table["value"],
                "ts": table["ts"],
            }
        )
        name = f"{self.files:08d}.parquet"
        tmp = self.src / f".{name}.tmp"  # Spark's file source ignores dot-files
        pq.write_table(full, tmp)
        os.replace(tmp, self.src / name)
        self.next_offset += n
        self.files += 1


def marker_table() -> pa.Table:
    return pa.table({"key": [END_MARKER], "value": [0.0], "ts": pa.array([0], pa.int64())})


def truth(tables: Sequence[pa.Table]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in tables:
        grouped = t.group_by("key").aggregate([("value", "count")])
        for k, n in zip(grouped["key"].to_pylist(), grouped["value_count"].to_pylist(), strict=True):
            counts[k] = counts.get(k, 0) + n
    return counts


@dataclass
class OutputAnalysis:
    """What the baseline's output directory shows."""

    rows: int = 0
    batches_by_worker: dict[str, int] = field(default_factory=dict)
    #: Micro-batch ids emitted more than once (by two workers, or twice).
    batches_emitted_twice: int = 0
    #: Extra (batch id, key) rows beyond the first emission: identical values / different values.
    dup_rows_identical: int = 0
    dup_rows_conflicting: int = 0
    #: Rows a worker emitted after `zombie_after` (set for the zombie only).
    zombie_rows: int = 0
    zombie_batches: int = 0
    #: Rows whose count is below one already emitted for the key: a last-writer-wins sink goes backwards.
    regressions: int = 0
    #: The latest emitted row per key (last writer wins) vs the true count.
    keys: int = 0
    final_over: int = 0
    final_under: int = 0
    final_missing: int = 0


def analyze(
    out: Path, expected: dict[str, int], *, zombie: str | None = None, zombie_after: float = 0.0
) -> OutputAnalysis:
    files = sorted(p for p in out.glob("*.parquet") if not p.name.startswith("."))
    a = OutputAnalysis()
    if not files:
        a.final_missing = len(expected)
        return a
    table = pa.concat_tables([pq.read_table(f) for f in files])
    rows = table.to_pylist()
    a.rows = len(rows)
    emissions: dict[int, set[str]] = {}
    by_worker: dict[str, set[int]] = {}
    seen: dict[tuple[int, str], tuple[object, ...]] = {}
    zombie_emissions: set[str] = set()
    latest: dict[str, tuple[float, int]] = {}
    for r in rows:
        bid, key = int(r["batch_id"]), str(r["key"])
        emissions.setdefault(bid, set()).add(r["emission"])
        by_worker.setdefault(r["worker"], set()).add(bid)
        values = (r["count"], r["sum"], r["min"], r["max"], r["last"])
        first = seen.setdefault((bid, key), values)
        if first is not values:
            if first == values:
                a.dup_rows_identical += 1
            else:
                a.dup_rows_conflicting += 1
        if zombie is not None and r["worker"] == zombie and r["emitted_at"] > zombie_after:
            a.zombie_rows += 1
            zombie_emissions.add(r["emission"])
        prev = latest.get(key)
        if prev is None or r["emitted_at"] >= prev[0]:
            latest[key] = (float(r["emitted_at"]), int(r["count"]))
    high: dict[str, int] = {}
    for r in sorted(rows, key=lambda r: float(r["emitted_at"])):
        key, count = str(r["key"]), int(r["count"])
        if count < high.get(key, 0):
            a.regressions += 1
        high[key] = max(high.get(key, 0), count)
    a.batches_by_worker = {w: len(b) for w, b in sorted(by_worker.items())}
    a.batches_emitted_twice = sum(1 for e in emissions.values() if len(e) > 1)
    a.zombie_batches = len(zombie_emissions)
    a.keys = len(expected)
    for key, n in expected.items():
        got = latest.get(key)
        if got is None:
            a.final_missing += 1
        elif got[1] > n:
            a.final_over += 1
        elif got[1] < n:
            a.final_under += 1
    return a


class SsScenario:
    """One baseline scenario: its own source, checkpoint and output directories, and its load."""

    def __init__(self, root: Path, seed: int, *, seeded: pa.Table | None = None, start: bool = True) -> None:
        self.dirs = Dirs.make(root)
        self.log = FileLog(self.dirs.src)
        #: A state built first: every key once, as the first source file.
        self.seeded = seeded
        if seeded is not None:
            self.log.append(seeded)
        stream = EventStream(seed)
        self.producer = Producer(stream.next, self.log.append, TICK_S)
        if start:
            self.producer.start()
        self.stopped = False
        self.marker_written = False

    def start_load(self) -> None:
        if not self.producer.is_alive():
            self.producer.start()

    def finish(self) -> None:
        """Stop the load and append the end marker (processed last: all files before it were read)."""
        if not self.stopped:
            self.producer.stop()
            self.stopped = True
        if not self.marker_written:
            self.log.append(marker_table())
            self.marker_written = True

    def tables(self) -> list[pa.Table]:
        seeded = [self.seeded] if self.seeded is not None else []
        return [*seeded, *self.producer.tables, *([marker_table()] if self.marker_written else [])]

    def marker_seen(self) -> bool:
        for f in self.dirs.out.glob("*.parquet"):
            if f.name.startswith("."):
                continue
            keys = pq.read_table(f, columns=["key"])["key"].to_pylist()
            if END_MARKER in keys:
                return True
        return False

    def wait_marker(self, timeout: float) -> bool:
        try:
            wait_until(self.marker_seen, timeout, "the end marker in the output", 0.2)
            return True
        except TimeoutError:
            return False


def emission_gaps(outputs: Sequence[dict[str, Any]]) -> list[float]:
    times = sorted(float(b["emitted_at"]) for b in outputs)
    return [b - a for a, b in itertools.pairwise(times)]


def last_emitted(w: Worker) -> float:
    outs = w.outputs()
    if not outs:
        raise RuntimeError(f"worker {w.name} emitted nothing")
    return max(float(b["emitted_at"]) for b in outs)


# --- spark-ss scenarios -----------------------------------------------------------------------------


@dataclass
class SsMove:
    src: str
    dst: str
    stop_s: float
    stop_to_started_s: float
    stop_to_first_s: float
    unavailable_s: float


def ss_moves(workers: Sequence[Worker], root: Path, runs: int) -> tuple[list[SsMove], OutputAnalysis, int]:
    sc = SsScenario(root, SEED + 1, seeded=every_key_once(SMALL_PREFIX, SMALL_KEYS, SMALL_SEED))
    cur, other = workers[0], workers[1]
    seq = cur.command("start", sc.dirs)
    cur.wait_status(seq, 120)
    out, cur, other = ss_move_series(sc, cur, other, runs, time.time())
    sc.finish()
    sc.wait_marker(120)
    cur.wait_status(cur.command("stop"), 60)
    expected = truth(sc.tables())
    return out, analyze(sc.dirs.out, expected), sc.log.files


def ss_move_series(
    sc: SsScenario, cur: Worker, other: Worker, runs: int, since: float
) -> tuple[list[SsMove], Worker, Worker]:
    """`runs` planned moves back and forth; returns them and the (current, other) workers after the last."""
    out: list[SsMove] = []
    for i in range(runs):
        random_instant(emission_gaps(cur.wait_outputs(since, 3, 120)))
        progress(f"  spark-ss move {i + 1}/{runs}: {cur.name} -> {other.name}")
        t_stop = time.time()
        cur.wait_status(cur.command("stop"), 60)
        t_stopped = time.time()
        other.wait_status(other.command("start", sc.dirs), 60)
        t_started = time.time()
        first = float(other.wait_outputs(t_stopped, 1, 900)[0]["emitted_at"])
        out.append(
            SsMove(
                cur.name, other.name, t_stopped - t_stop, t_started - t_stop, first - t_stop, first - last_emitted(cur)
            )
        )
        progress(f"    stop->first output {first - t_stop:.2f} s, unavailable {out[-1].unavailable_s:.2f} s")
        cur, other = other, cur
        since = first
    return out, cur, other


@dataclass
class SsBig:
    """The ~100 MB case on spark-ss: seeding, planned moves, a killed worker (warm standby)."""

    seeding_s: float
    moves: list[SsMove]
    kill: SsKill | None


def ss_big(a: Worker, b: Worker, root: Path, runs: int, keys: int) -> SsBig:
    """Seed `keys` keys (one file, the query's first micro-batch), then move the query and kill its worker."""
    sc = SsScenario(root, SEED + 4, seeded=every_key_once(BIG_PREFIX, keys, BIG_SEED), start=False)
    t0 = time.time()
    a.wait_status(a.command("start", sc.dirs), 120)
    a.wait_outputs(t0, 1, 1800)
    seeding_s = time.time() - t0
    progress(f"    seeded {keys:,} keys in {seeding_s:.1f} s")
    sc.start_load()
    try:
        moves, cur, other = ss_move_series(sc, a, b, runs, time.time())
        progress("  spark-ss (big): killed worker (warm standby)")
        kill, running = ss_kill(cur, other, sc)
        progress(f"    detection {kill.detection_s:.2f} s, recovery {kill.recovery_s:.2f} s")
        running.wait_status(running.command("stop"), 120)
    finally:
        sc.finish()
    return SsBig(seeding_s, moves, kill)


@dataclass
class SsKill:
    detection_s: float
    recovery_s: float
    total_s: float
    unavailable_s: float


def ss_kill(
    owner: Worker, standby: Worker, sc: SsScenario, *, cold: Worker | None = None, ctl: Path | None = None
) -> tuple[SsKill, Worker]:
    """Kill `owner`; once its heartbeat is stale, start the query on `standby` (or spawn a cold worker)."""
    random_instant(emission_gaps(owner.wait_outputs(time.time(), 3, 120)))
    last = last_emitted(owner)
    t_kill = owner.kill()
    t_dead = owner.wait_dead(HEARTBEAT_TIMEOUT_S + 15)
    if ctl is not None:  # cold: a new process, its start command already waiting
        t_start = time.time()
        standby = Worker(f"{owner.name}-cold", ctl, warm_up=False, start=sc.dirs)
    else:
        t_start = time.time()
        standby.command("start", sc.dirs)
    first = float(standby.wait_outputs(t_start, 1, 900)[0]["emitted_at"])
    return SsKill(t_dead - t_kill, first - t_start, first - t_kill, first - last), standby


@dataclass
class SplitBrain:
    system: str
    variant: str
    in_flight: str
    detection_s: float
    analysis: OutputAnalysis | None = None
    zombie_error: str | None = None
    newcomer_error: str | None = None
    marker_seen: bool = True
    restart_ok: bool | None = None
    restart_error: str | None = None
    # laminar only
    zombie_commits_after_takeover: int = 0
    revoked_after_s: float | None = None


def checkpoint_in_flight(ckpt: Path) -> int | None:
    """The batch id whose offsets are logged but not committed (a micro-batch in flight), if any."""

    def ids(sub: str) -> list[int]:
        try:
            return [int(n) for n in os.listdir(ckpt / sub) if n.isdigit()]
        except FileNotFoundError:
            return []

    offsets, commits = ids("offsets"), ids("commits")
    if offsets and (not commits or max(offsets) > max(commits)):
        return max(offsets)
    return None


def ss_split_brain(zombie: Worker, newcomer: Worker, root: Path, pause_at: str) -> SplitBrain:
    """Pause the query's worker at `pause_at` ("batch start" or "after the sink"), take over, resume it."""
    sc = SsScenario(root, SEED + 2)
    t0 = time.time()
    zombie.wait_status(zombie.command("start", sc.dirs), 120)
    zombie.wait_outputs(t0, 3, 120)
    if pause_at == AFTER_SINK:
        (zombie.ctl / f"{zombie.name}.hold-after-sink").touch()
        held = zombie.ctl / f"{zombie.name}.held.json"
        wait_until(held.exists, 60, "the zombie's sink hook", 0.002)
        batch = (_read_json(held) or {}).get("batch_id")
        where = f"batch {batch}'s output written, its commit log entry not yet"
    else:
        in_flight: list[int] = []

        def new_batch() -> bool:
            b = checkpoint_in_flight(sc.dirs.ckpt)
            if b is not None and in_flight and b != in_flight[0]:
                in_flight.append(b)
                return True
            if not in_flight:
                in_flight.append(-1 if b is None else b)
            return False

        try:
            wait_until(new_batch, 30, "a new micro-batch in flight", 0.001)
            where = f"batch {in_flight[-1]}'s offsets logged, its output not yet written"
        except TimeoutError:
            where = "no new batch seen within 30 s: wherever it was"
    zombie.signal(signal.SIGSTOP)
    t_pause = time.time()
    t_dead = zombie.wait_dead(HEARTBEAT_TIMEOUT_S + 15)
    t_takeover = time.time()
    newcomer.command("start", sc.dirs)
    newcomer.wait_outputs(t_takeover, 2, 180)
    zombie.signal(signal.SIGCONT)
    t_resume = time.time()
    progress(f"  spark-ss split-brain ({pause_at}): zombie resumed; watching for 8 s")
    time.sleep(8.0)
    sc.finish()
    seen = sc.wait_marker(60)
    zombie_status, newcomer_status = zombie.status(), newcomer.status()
    for w in (zombie, newcomer):
        with contextlib.suppress(Exception):
            w.wait_status(w.command("stop"), 60)
    result = SplitBrain(
        system=SS,
        variant=pause_at,
        in_flight=where,
        detection_s=t_dead - t_pause,
        zombie_error=zombie_status.get("error") if zombie_status.get("state") == "failed" else None,
        newcomer_error=newcomer_status.get("error") if newcomer_status.get("state") == "failed" else None,
        marker_seen=seen,
    )
    result.analysis = analyze(sc.dirs.out, truth(sc.tables()), zombie=zombie.name, zombie_after=t_resume - 0.001)
    # Is the checkpoint still usable? Restart the query on it once more and feed one more file.
    progress(f"  spark-ss split-brain ({pause_at}): restarting the query on the same checkpoint")
    seq = newcomer.command("start", sc.dirs)
    t_restart = time.time()
    try:
        newcomer.wait_status(seq, 60)
        sc.log.append(pa.table({"key": ["__after__"], "value": [0.0], "ts": pa.array([0], pa.int64())}))
        newcomer.wait_outputs(t_restart, 1, 60)
        result.restart_ok = True
    except (RuntimeError, TimeoutError) as exc:
        result.restart_ok = False
        st = newcomer.status()
        result.restart_error = st.get("error") or str(exc).splitlines()[0][:300]
    with contextlib.suppress(Exception):
        newcomer.wait_status(newcomer.command("stop"), 60)
    return result


# --- laminar scenarios ------------------------------------------------------------------------------


class LaminarLoad:
    """The same event stream appended to a laminar partition (one producer per scenario; all kept for truth)."""

    def __init__(self, cluster: Cluster, partition: int = 0) -> None:
        self.cluster = cluster
        self.partition = partition
        self.tables: list[pa.Table] = []
        self.producer: Producer | None = None

    def start(self, seed: int) -> None:
        stream = EventStream(seed)
        self.producer = Producer(stream.next, lambda t: self._append(t), TICK_S)
        self.producer.start()

    def _append(self, t: pa.Table) -> None:
        self.cluster.source.append(self.partition, t)

    def stop(self) -> None:
        if self.producer is not None:
            self.producer.stop()
            self.tables.extend(self.producer.tables)
            self.producer = None


def laminar_zombie(cluster: Cluster, hist: History) -> SplitBrain:
    p = hist.partition
    zombie, old_epoch = cluster.owner(p), cluster.epoch(p)
    start_seq = hist.head_seq() + 1
    commits = hist.wait_data(old_epoch, start_seq, 3, 120)
    # Pause inside a batch: 40% of the usual commit interval after a data commit, with events pending.
    gap = median(gaps(commits))
    hist.wait_data(old_epoch, start_seq, len(commits) + 1, 120)
    time.sleep(0.4 * gap)
    pending = cluster.source.end_offset(p) - cluster.committed(p)
    where = (
        f"{0.4 * gap:.2f} s after a data commit (40% of the {gap:.2f} s commit interval), "
        f"{pending} events pending: inside the next batch"
    )
    pid = cluster.nodes[zombie].proc.pid
    signal_tree(pid, signal.SIGSTOP)
    t_pause = time.time()
    t_dead = wait_dead(cluster, zombie, HEARTBEAT_TIMEOUT_S + 15)
    target = pick_target(cluster, {zombie})
    task = cluster.coordinator.run(PartitionId(p), NodeId(target), forced=True)
    if task.phase != MigrationPhase.ACTIVE:
        raise RuntimeError(f"failover ended in {task.phase}: {task.error}")
    new_epoch = cluster.epoch(p)
    hist.wait_data(new_epoch, start_seq, 2, 120)
    signal_tree(pid, signal.SIGCONT)
    t_resume = time.time()
    progress("  laminar zombie: resumed; waiting for it to see its revocation")
    revoked_after: float | None = None
    reason: str | None = None
    try:
        wait_until(lambda: "REVOKED" in cluster.nodes[zombie].log(), 60, "the zombie to see its revocation", 0.02)
        revoked_after = time.time() - t_resume
        line = next(ln for ln in cluster.nodes[zombie].log().splitlines() if "REVOKED" in ln)
        reason = line.split("REVOKED", 1)[1].strip()
    except TimeoutError:
        pass
    time.sleep(3.0)  # let any stray attempt of the zombie land (or fail)
    entries = hist.since(start_seq)
    takeover = next(i for i, m in enumerate(entries) if m.fencing_token == new_epoch)
    after = entries[takeover:]
    return SplitBrain(
        system=LAMINAR,
        variant="mid-batch",
        in_flight=where,
        detection_s=t_dead - t_pause,
        zombie_commits_after_takeover=sum(1 for m in after if m.node == zombie or m.fencing_token <= old_epoch),
        revoked_after_s=revoked_after,
        zombie_error=reason,
    )


def committed_regressions(store: ObjectStore, partition: int) -> int:
    """Committed output rows (in manifest order) whose count is below one already committed for the key."""
    read, high, n = ReadStore(store), dict[str, int](), 0
    for version in ManifestReader(store).history(PartitionId(partition)):
        for ref in version.manifest.outputs:
            out = download_table(read, ref)
            for key, count in zip(out["key"].to_pylist(), out["count"].to_pylist(), strict=True):
                if count < high.get(key, 0):
                    n += 1
                high[key] = max(high.get(key, 0), count)
    return n


# =====================================================================================================
# The comparison
# =====================================================================================================


@dataclass
class Results:
    ss_moves: list[SsMove] = field(default_factory=list)
    ss_move_analysis: OutputAnalysis | None = None
    ss_move_files: int = 0
    ss_kill_warm: SsKill | None = None
    ss_kill_cold: SsKill | None = None
    ss_kill_analysis: OutputAnalysis | None = None
    ss_splits: list[SplitBrain] = field(default_factory=list)
    lam_moves: list[MigrationRun] = field(default_factory=list)
    lam_kill: FailoverRun | None = None
    lam_split: SplitBrain | None = None
    lam_final_mismatch: int = 0
    lam_keys: int = 0
    lam_audit_duplicates: int = 0
    lam_audit_losses: int = 0
    lam_audit_issues: list[str] = field(default_factory=list)
    lam_orphans: int = 0
    lam_regressions: int = 0
    ss_big: SsBig | None = None
    lam_big_seeding_s: float = 0.0
    lam_big_moves: list[MigrationRun] = field(default_factory=list)
    lam_big_kill: FailoverRun | None = None
    big_keys: int = 0
    notes: list[str] = field(default_factory=list)


def run_spark_ss(p: Params, workdir: Path, res: Results) -> None:
    ctl = workdir / "ctl"
    ctl.mkdir()
    progress("spark-ss: starting workers A, B and (for the ~100 MB case) C, D (SparkSession + warm-up query)")
    t0 = time.perf_counter()
    a, b, c, d = Worker("A", ctl), Worker("B", ctl), Worker("C", ctl), Worker("D", ctl)
    workers = [a, b, c, d]
    try:
        for w in workers:
            w.wait_ready(600)
        res.notes.append(f"spark-ss: 4 warm workers ready in {time.perf_counter() - t0:.1f} s")
        progress("spark-ss: planned moves")
        res.ss_moves, res.ss_move_analysis, res.ss_move_files = ss_moves([a, b], workdir / "ss-move", p.moves)
        progress("spark-ss: split-brain")
        for i, pause_at in enumerate(p.pauses):
            res.ss_splits.append(ss_split_brain(a, b, workdir / f"ss-split-{i}", pause_at))
        progress("spark-ss: killed worker (warm standby)")
        sc = SsScenario(workdir / "ss-kill", SEED + 3, seeded=every_key_once(SMALL_PREFIX, SMALL_KEYS, SMALL_SEED))
        # A may have lost its query in the split-brain run; its process (and session) are reused.
        a.wait_status(a.command("start", sc.dirs), 120)
        res.ss_kill_warm, running = ss_kill(a, b, sc)
        progress(f"    detection {res.ss_kill_warm.detection_s:.2f} s, recovery {res.ss_kill_warm.recovery_s:.2f} s")
        if p.cold_restart:
            progress("spark-ss: killed worker (cold restart: a new process)")
            res.ss_kill_cold, cold = ss_kill(running, running, sc, ctl=ctl)
            workers.append(cold)
            running = cold
            progress(
                f"    detection {res.ss_kill_cold.detection_s:.2f} s, recovery {res.ss_kill_cold.recovery_s:.2f} s"
            )
        sc.finish()
        sc.wait_marker(120)
        running.wait_status(running.command("stop"), 60)
        res.ss_kill_analysis = analyze(sc.dirs.out, truth(sc.tables()))
        with contextlib.suppress(Exception):
            running.close()
        progress(f"spark-ss (~100 MB): seeding {p.big_keys:,} keys, planned moves, killed worker (C, D)")
        res.ss_big = ss_big(c, d, workdir / "ss-big", p.moves, p.big_keys)
    except BaseException:
        for w in workers:
            progress(f"--- worker {w.name} log tail ---\n{w.log()[-3000:]}")
        raise
    finally:
        for w in workers:
            with contextlib.suppress(Exception):
                w.close()


def seed_partition(cluster: Cluster, partition: int, table: pa.Table, timeout: float) -> float:
    """Append `table` (every key once) to `partition` and wait until it is committed; the seconds it took."""
    t0 = time.perf_counter()
    SourceLog(cluster.store, segment_events=250_000).append(partition, table)
    end = cluster.source.end_offset(partition)
    wait_until(lambda: cluster.committed(partition) >= end, timeout, f"partition {partition} to commit {end}", 0.2)
    return time.perf_counter() - t0


def standby_of(cluster: Cluster, partition: int) -> int:
    """The live node that does not own `partition` (the cluster has two)."""
    return pick_target(cluster, {cluster.owner(partition)})


def laminar_moves(
    cluster: Cluster,
    hist: History,
    moves: int,
    what: str,
    into: list[MigrationRun],
    *,
    warm_commits: int,
    timeout: float,
    standby_wait: float,
) -> None:
    """`moves` planned moves of `hist.partition`, each to the other node once its standby copy is caught
    up; every run is appended to `into` as it ends (a later failure keeps the earlier ones)."""
    for i in range(moves):
        target = standby_of(cluster, hist.partition)
        wait_standby(cluster, target, hist.partition, standby_wait)
        progress(f"  laminar {what} {i + 1}/{moves}: {cluster.owner(hist.partition)} -> {target}")
        into.append(graceful_run(cluster, hist, target, warm_commits=warm_commits, timeout=timeout))
        progress(f"    launch->Active {into[-1].total_s:.2f} s, unavailable {into[-1].unavailable_s:.2f} s")


def run_laminar(p: Params, workdir: Path, res: Results) -> None:
    progress("laminar: starting nodes 1 and 2 (both --standby-for 0,1)")
    t0 = time.perf_counter()
    cluster = start_cluster(workdir, (1, 2), 2, per_node_args={1: LAM_STANDBY_ARGS, 2: LAM_STANDBY_ARGS})
    load = LaminarLoad(cluster, 0)
    big_load = LaminarLoad(cluster, 1)
    try:
        cluster.wait_alive(1, 2, timeout=300)
        cluster.place({0: 1, 1: 2})
        res.notes.append(
            f"laminar: 2 nodes up in {time.perf_counter() - t0:.1f} s, both with {' '.join(LAM_STANDBY_ARGS)} "
            "(the node not owning a partition keeps a warm copy of it)"
        )
        small_seed = every_key_once(SMALL_PREFIX, SMALL_KEYS, SMALL_SEED)
        small_s = seed_partition(cluster, 0, small_seed, 300)
        progress(f"laminar: seeding {p.big_keys:,} keys into partition 1")
        res.lam_big_seeding_s = seed_partition(cluster, 1, every_key_once(BIG_PREFIX, p.big_keys, BIG_SEED), 1800)
        progress(f"    seeded in {res.lam_big_seeding_s:.1f} s")
        res.notes.append(
            f"laminar: seeded {SMALL_KEYS:,} keys into partition 0 in {small_s:.1f} s, {p.big_keys:,} keys into "
            f"partition 1 in {res.lam_big_seeding_s:.1f} s"
        )
        hist = History(cluster.store, 0)
        load.start(SEED + 1)
        laminar_moves(cluster, hist, p.moves, "move", res.lam_moves, warm_commits=3, timeout=120, standby_wait=300)
        load.stop()
        progress("laminar: zombie (SIGSTOP owner, forced failover, SIGCONT)")
        load.start(SEED + 2)
        res.lam_split = laminar_zombie(cluster, hist)
        load.stop()
        cluster.wait_alive(1, 2, timeout=60)
        progress("laminar: killed node (forced failover to the warm standby)")
        wait_standby(cluster, standby_of(cluster, 0), 0, 300)
        load.start(SEED + 3)
        res.lam_kill = failover_run(cluster, hist, warm_commits=3, timeout=120)
        progress(f"    detection {res.lam_kill.detection_s:.2f} s, recovery {res.lam_kill.recovery_s:.2f} s")
        load.stop()
        progress(f"laminar: restarting node {res.lam_kill.victim}")
        revive(cluster, res.lam_kill.victim)

        progress("laminar (~100 MB): planned moves, killed node")
        big = History(cluster.store, 1)
        big_load.start(SEED + 4)
        laminar_moves(
            cluster, big, p.moves, "big move", res.lam_big_moves, warm_commits=2, timeout=300, standby_wait=600
        )
        wait_standby(cluster, standby_of(cluster, 1), 1, 600)
        res.lam_big_kill = failover_run(cluster, big, warm_commits=2, timeout=300)
        k = res.lam_big_kill
        progress(f"    detection {k.detection_s:.2f} s, recovery {k.recovery_s:.2f} s")
        big_load.stop()
        progress(f"laminar: restarting node {k.victim}")
        revive(cluster, k.victim)

        cluster.wait_committed(timeout=600)
        progress("laminar: audit")
        t_audit = time.perf_counter()
        audits = audit_store(cluster.store)
        res.notes.append(f"laminar: audit_store of both partitions took {time.perf_counter() - t_audit:.1f} s")
        res.lam_audit_duplicates = sum(a.duplicates for a in audits)
        res.lam_audit_losses = sum(a.losses for a in audits)
        res.lam_audit_issues = [f"{i.kind}: {i.detail}" for a in audits for i in a.issues]
        res.lam_orphans = sum(a.orphan_outputs for a in audits)
        res.lam_regressions = committed_regressions(cluster.store, 0)
        state, _ = committed_state(cluster.store, 0)
        expected = truth([small_seed, *load.tables])
        got = dict(zip(state["key"].to_pylist(), state["count"].to_pylist(), strict=True))
        res.lam_keys = len(expected)
        res.lam_final_mismatch = sum(1 for k, n in expected.items() if got.get(k) != n)
    except BaseException:
        progress("laminar FAILED; node log tails:\n" + log_tails(cluster))
        raise
    finally:
        for ld in (load, big_load):
            with contextlib.suppress(Exception):
                ld.stop()
        cluster.shutdown()


# --- the table --------------------------------------------------------------------------------------


def s(x: float) -> str:
    return f"{x:.2f} s"


def lst(xs: Sequence[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


def build_rows(res: Results) -> tuple[list[Row], list[str]]:
    """The comparison table (spark-ss and laminar rows side by side) and its notes."""
    rows: list[Row] = []
    hb = f"heartbeat timeout {HEARTBEAT_TIMEOUT_S:.0f} s, interval {HEARTBEAT_INTERVAL_S:.0f} s"
    lk, kw, kc = res.lam_kill, res.ss_kill_warm, res.ss_kill_cold
    gt, ft = f"<= {GRACEFUL_TARGET_S:.0f} s", "5-15 s"

    def add(fig: str, system: str, value: str, target: str = "-", verdict_: str = "info") -> None:
        rows.append(Row(fig, system, value, target, verdict_))

    def zero(fig: str, system: str, n: int, shown: str | None = None) -> None:
        add(fig, system, shown if shown is not None else str(n), "0", "met" if n == 0 else "FAILED")

    # 1. killed worker
    fig = "1. killed worker: detection, kill -> seen dead"
    if kw is not None:
        add(f"{fig} ({hb})", SS, s(kw.detection_s))
    if lk is not None:
        add(f"{fig} ({hb})", LAMINAR, s(lk.detection_s))
    if kw is not None:
        add("1. killed worker: recovery, start query on warm standby -> first output", SS, s(kw.recovery_s))
    if kc is not None:
        add("1. killed worker: recovery, spawn a new worker (cold) -> first output", SS, s(kc.recovery_s))
    if lk is not None:
        add("1. killed worker: recovery, forced failover launch -> first data commit", LAMINAR, s(lk.recovery_s))
    if kw is not None:
        add("1. killed worker: total, kill -> first output elsewhere (warm standby)", SS, s(kw.total_s))
    if kc is not None:
        add("1. killed worker: total, kill -> first output elsewhere (cold)", SS, s(kc.total_s))
    if lk is not None:
        total = lk.total_s
        add("1. killed worker: total, kill -> first data commit elsewhere", LAMINAR, s(total), ft,
            verdict(total, FAILOVER_TARGET_S))  # fmt: skip
    fig = "1. killed worker: unavailability, old owner's last output -> new owner's first"
    if kw is not None:
        add(f"{fig} (warm)", SS, s(kw.unavailable_s))
    if kc is not None:
        add(f"{fig} (cold)", SS, s(kc.unavailable_s))
    if lk is not None:
        add(fig, LAMINAR, s(lk.unavailable_s))
    if res.ss_kill_analysis is not None:
        a = res.ss_kill_analysis
        add("1. killed worker: batches emitted twice / duplicated rows: identical, conflicting", SS,
            f"{a.batches_emitted_twice} / {a.dup_rows_identical}, {a.dup_rows_conflicting}")  # fmt: skip
        add("1. killed worker: rows moving a key's count backwards (stale overwrite)", SS, str(a.regressions))

    # 2. planned move
    sm, lm = res.ss_moves, res.lam_moves
    if sm:
        add(f"2. planned move: stop on A -> query started on B (median of {len(sm)})", SS,
            s(median([m.stop_to_started_s for m in sm])))  # fmt: skip
    if lm:
        total = median([m.total_s for m in lm])
        add(f"2. planned move: MigrationCoordinator.run, launch -> Active (median of {len(lm)})", LAMINAR, s(total),
            gt, verdict(total, GRACEFUL_TARGET_S))  # fmt: skip
    if sm:
        add(f"2. planned move: stop on A -> first output on B (median of {len(sm)})", SS,
            s(median([m.stop_to_first_s for m in sm])))  # fmt: skip
    if lm:
        add(f"2. planned move: launch -> new owner's first data commit (median of {len(lm)})", LAMINAR,
            s(median([m.launch_to_first_data_s for m in lm])))  # fmt: skip
    fig = "2. planned move: unavailability, old owner's last output -> new owner's first"
    if sm:
        add(f"{fig} (median of {len(sm)})", SS, s(median([m.unavailable_s for m in sm])))
    if lm:
        u = median([m.unavailable_s for m in lm])
        add(f"{fig} (median of {len(lm)})", LAMINAR, s(u), gt, verdict(u, GRACEFUL_TARGET_S))
    if res.ss_move_analysis is not None:
        a = res.ss_move_analysis
        add("2. planned move: batches emitted twice / duplicated rows: identical, conflicting", SS,
            f"{a.batches_emitted_twice} / {a.dup_rows_identical}, {a.dup_rows_conflicting}")  # fmt: skip
        add("2. planned move: rows moving a key's count backwards (stale overwrite)", SS, str(a.regressions))
        add("2. planned move: final per-key count wrong: over / under / missing", SS,
            f"{a.final_over} / {a.final_under} / {a.final_missing} of {a.keys}")  # fmt: skip

    # 3. split-brain
    lz = res.lam_split
    fig = "3. split-brain: paused owner seen dead (detection)"
    for sb in res.ss_splits:
        if sb.analysis is None:
            continue
        a, v = sb.analysis, f"[{sb.variant}]"
        add(f"{fig} {v}", SS, s(sb.detection_s))
        zero(f"3. split-brain: output by the resumed zombie after takeover, batches / rows {v}", SS, a.zombie_rows,
             f"{a.zombie_batches} / {a.zombie_rows}")  # fmt: skip
        add(f"3. split-brain: micro-batches emitted twice {v}", SS, str(a.batches_emitted_twice))
        add(f"3. split-brain: duplicated (batch, key) rows: identical / conflicting {v}", SS,
            f"{a.dup_rows_identical} / {a.dup_rows_conflicting}")  # fmt: skip
        add(f"3. split-brain: rows moving a key's count backwards (stale overwrite) {v}", SS, str(a.regressions))
        add(f"3. split-brain: final per-key count (last write wins) over / under / missing {v}", SS,
            f"{a.final_over} / {a.final_under} / {a.final_missing} of {a.keys}")  # fmt: skip
        add(f"3. split-brain: query failed: zombie / newcomer {v}", SS,
            f"{'yes' if sb.zombie_error else 'no'} / {'yes' if sb.newcomer_error else 'no'}")  # fmt: skip
        add(f"3. split-brain: checkpoint usable afterwards (restart + one more file) {v}", SS,
            "yes" if sb.restart_ok else "NO")  # fmt: skip
    if lz is not None:
        add(fig, LAMINAR, s(lz.detection_s))
        zero("3. split-brain: manifests committed by the zombie after the takeover", LAMINAR,
             lz.zombie_commits_after_takeover)  # fmt: skip
        add("3. split-brain: zombie saw its revocation, after SIGCONT", LAMINAR,
            s(lz.revoked_after_s) if lz.revoked_after_s is not None else "not within 60 s")  # fmt: skip
    # 4. ~100 MB of state
    bg, lbm, lbk = res.ss_big, res.lam_big_moves, res.lam_big_kill
    big = f"{res.big_keys / 1e6:.1f}M keys"
    if bg is not None:
        add(f"4. ~100 MB: seeding {big} (produced once) -> first output", SS, s(bg.seeding_s))
    if res.lam_big_seeding_s:
        add(f"4. ~100 MB: seeding {big} (produced once) -> committed", LAMINAR, s(res.lam_big_seeding_s))
    fig = "4. ~100 MB planned move: unavailability, old owner's last output -> new owner's first"
    if bg is not None and bg.moves:
        add(f"{fig} (median of {len(bg.moves)})", SS, s(median([m.unavailable_s for m in bg.moves])))
        add(f"4. ~100 MB planned move: stop on A -> first output on B (median of {len(bg.moves)})", SS,
            s(median([m.stop_to_first_s for m in bg.moves])))  # fmt: skip
    if lbm:
        add(f"{fig} (median of {len(lbm)})", LAMINAR, s(median([m.unavailable_s for m in lbm])))
        total = median([m.total_s for m in lbm])
        add(f"4. ~100 MB planned move: launch -> Active (median of {len(lbm)})", LAMINAR, s(total), gt,
            verdict(total, GRACEFUL_TARGET_S))  # fmt: skip
        add("4. ~100 MB planned move: checkpoint bytes moved (DOWNLOADING bytes_moved, median)", LAMINAR,
            f"{median([m.download_bytes for m in lbm]) / 1e6:.2f} MB")  # fmt: skip
    if bg is not None and bg.kill is not None:
        add(f"4. ~100 MB killed worker: detection ({hb})", SS, s(bg.kill.detection_s))
        add("4. ~100 MB killed worker: recovery, start query on warm standby -> first output", SS,
            s(bg.kill.recovery_s))  # fmt: skip
        add("4. ~100 MB killed worker: total, kill -> first output elsewhere", SS, s(bg.kill.total_s))
    if lbk is not None:
        add(f"4. ~100 MB killed worker: detection ({hb})", LAMINAR, s(lbk.detection_s))
        add("4. ~100 MB killed worker: recovery, forced failover launch -> first data commit", LAMINAR,
            s(lbk.recovery_s))  # fmt: skip
        add("4. ~100 MB killed worker: total, kill -> first data commit elsewhere", LAMINAR, s(lbk.total_s), ft,
            verdict(lbk.total_s, FAILOVER_TARGET_S))  # fmt: skip
        add("4. ~100 MB killed worker: checkpoint bytes moved (DOWNLOADING bytes_moved)", LAMINAR,
            f"{lbk.download_bytes / 1e6:.2f} MB")  # fmt: skip

    # 5. the ratios (same run)
    def ratio(fig: str, lam: float | None, ss: float | None) -> None:
        if lam is None or ss is None or ss <= 0:
            add(fig, "ratio", "n/a", f"<= {RATIO_TARGET:.1f}", "not measured")
            return
        r = lam / ss
        add(fig, "ratio", f"{r:.2f} ({lam:.2f} / {ss:.2f} s)", f"<= {RATIO_TARGET:.1f}", verdict(r, RATIO_TARGET))

    def med(values: Sequence[float]) -> float | None:
        return median(values) if values else None

    ratio("5. ~1 MB planned move unavailability: laminar / spark-ss (warm standby)",
          med([m.unavailable_s for m in lm]), med([m.unavailable_s for m in sm]))  # fmt: skip
    ratio("5. ~1 MB kill recovery: laminar / spark-ss (warm standby)",
          lk.recovery_s if lk else None, kw.recovery_s if kw else None)  # fmt: skip
    ratio("5. ~100 MB planned move unavailability: laminar / spark-ss (warm standby)",
          med([m.unavailable_s for m in lbm]), med([m.unavailable_s for m in bg.moves]) if bg else None)  # fmt: skip
    ratio("5. ~100 MB kill recovery: laminar / spark-ss (warm standby)",
          lbk.recovery_s if lbk else None, bg.kill.recovery_s if bg and bg.kill else None)  # fmt: skip

    zero("3. audit_store duplicates (events), whole laminar run", LAMINAR, res.lam_audit_duplicates)
    add("3. audit_store losses / other issues, whole laminar run", LAMINAR,
        f"{res.lam_audit_losses} / {len(res.lam_audit_issues)}")  # fmt: skip
    add("3. final per-key count wrong (committed state vs truth)", LAMINAR,
        f"{res.lam_final_mismatch} of {res.lam_keys}")  # fmt: skip
    zero("3. committed rows moving a key's count backwards, whole laminar run", LAMINAR, res.lam_regressions)
    add("3. orphan output files (by a fenced owner; named by no manifest)", LAMINAR, str(res.lam_orphans))
    return rows, build_notes(res)


def build_notes(res: Results) -> list[str]:
    notes: list[str] = []
    sm, lm, lk, lz = res.ss_moves, res.lam_moves, res.lam_kill, res.lam_split
    if sm:
        notes.append(
            f"2 spark-ss: unavailability {lst([m.unavailable_s for m in sm])} s; stop -> first output "
            f"{lst([m.stop_to_first_s for m in sm])} s; the graceful stop itself {lst([m.stop_s for m in sm])} s "
            f"(waits <= {GRACEFUL_STOP_WAIT_S:.0f} s for the micro-batch in flight to complete, then query.stop()); "
            "moves " + ", ".join(f"{m.src}->{m.dst}" for m in sm)
        )
    if lm:
        phases = ", ".join(f"{ph.value} {median([m.phases.get(ph, 0.0) for m in lm]):.2f}" for ph in lm[0].phases)
        notes.append(
            f"2 laminar: unavailability {lst([m.unavailable_s for m in lm])} s; launch -> Active "
            f"{lst([m.total_s for m in lm])} s; phases (median, s): {phases}; DOWNLOADING bytes_moved "
            f"{median([m.download_bytes for m in lm]) / 1e6:.2f} MB; PLANNED: "
            f"{' | '.join(m.planned_detail for m in lm)}; new owner's restore: "
            f"{restore_summary([m.restores for m in lm])}"
        )
    if lk is not None:
        restoring = lk.phases.get(MigrationPhase.RESTORING, 0.0)
        notes.append(
            f"1 laminar: {lk.victim} -> {lk.to_node} (failover_target's pick: the warm standby); forced run launch -> "
            f"Active {lk.run_s:.2f} s (restoring {restoring:.2f} s), launch -> seal {lk.launch_to_seal_s:.2f} s; "
            f"new owner's restore: {restore_summary([lk.restores])}"
        )
    if res.ss_big is not None:
        bg = res.ss_big
        notes.append(
            f"4 spark-ss (~100 MB): unavailability {lst([m.unavailable_s for m in bg.moves])} s; stop -> first output "
            f"{lst([m.stop_to_first_s for m in bg.moves])} s; the first batch on the new worker loads the state "
            "from the checkpoint (HDFS-backed state store, the default; worker driver memory "
            f"{SS_DRIVER_MEMORY})"
        )
    if res.lam_big_moves:
        lbm = res.lam_big_moves
        notes.append(
            f"4 laminar (~100 MB): unavailability {lst([m.unavailable_s for m in lbm])} s; launch -> Active "
            f"{lst([m.total_s for m in lbm])} s; PLANNED bytes_moved {', '.join(str(m.planned_bytes) for m in lbm)}, "
            f"{' | '.join(m.planned_detail for m in lbm)}; new owner's "
            f"restore: {restore_summary([m.restores for m in lbm])}"
        )
    if res.lam_big_kill is not None:
        k = res.lam_big_kill
        notes.append(
            f"4 laminar (~100 MB) kill: {k.victim} -> {k.to_node} (failover_target's pick), launch -> Active "
            f"{k.run_s:.2f} s, unavailability {k.unavailable_s:.2f} s; new owner's restore: "
            f"{restore_summary([k.restores])}"
        )
    for sb in res.ss_splits:
        if sb.analysis is None:
            continue
        notes.append(
            f"3 spark-ss [{sb.variant}]: {sb.in_flight}; non-empty micro-batches per worker "
            f"{sb.analysis.batches_by_worker}; end marker processed: {'yes' if sb.marker_seen else 'NO'}; "
            f"zombie's error: {sb.zombie_error}; newcomer's error: {sb.newcomer_error}; restart on the checkpoint "
            f"afterwards: {'ok' if sb.restart_ok else sb.restart_error}"
        )
    if lz is not None:
        notes.append(f"3 laminar: paused {lz.in_flight}; the zombie's log after SIGCONT: REVOKED {lz.zombie_error}")
    if res.lam_audit_issues:
        notes.append("laminar audit issues: " + "; ".join(res.lam_audit_issues[:5]))
    notes.extend(res.notes)
    notes.append(
        "both: SIGKILL/SIGSTOP/SIGCONT go to the whole process tree (Python + its Spark JVM); checkpoint, source "
        "and output live on the shared local disk (with node-local checkpoints the baseline cannot recover a "
        "killed worker at all); times are wall-clock (time.time(), manifest committed_at)"
    )
    notes.append(
        "moves and kills happen at a uniformly random point (fixed seed) of the current owner's output interval, "
        "after >= 3 outputs under load; the split-brain pauses at the named points on purpose"
    )
    notes.append(
        "first output: spark-ss = a non-empty micro-batch file in the output dir; laminar = a manifest naming "
        "output. The warm standby is the fair comparison (laminar nodes are always up); cold adds JVM + "
        "SparkSession start-up"
    )
    notes.append(
        "final per-key count: spark-ss = the latest emitted row per key (a last-writer-wins upsert sink); "
        "laminar = the committed state (`committed_state`); both against the counts of the events produced"
    )
    return notes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="one run per scenario")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--ctl", help=argparse.SUPPRESS)
    parser.add_argument("--no-warm-up", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keep", metavar="DIR", help="keep the work directory (logs, checkpoints) here")
    parser.add_argument("--big-keys", type=int, help="keys of the big state (default 2.7M; quick 300k)")
    args = parser.parse_args(argv)
    if args.worker:
        WorkerMain(args.worker, Path(args.ctl)).run(warm_up=not args.no_warm_up)
        return
    p = QUICK if args.quick else FULL
    if args.big_keys:
        p = Params(p.moves, p.cold_restart, p.pauses, args.big_keys)
    load_before = os.getloadavg()
    started = time.perf_counter()
    res = Results(big_keys=p.big_keys)
    with contextlib.ExitStack() as stack:
        if args.keep:
            workdir = Path(args.keep)
            workdir.mkdir(parents=True, exist_ok=False)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="laminar-bench-baseline-")))
        (workdir / "ss").mkdir()
        (workdir / "laminar").mkdir()
        run_spark_ss(p, workdir / "ss", res)
        run_laminar(p, workdir / "laminar", res)
    elapsed = time.perf_counter() - started
    rows, notes = build_rows(res)
    title = run_title("laminar vs Spark Structured Streaming baseline", args.quick, load_before)
    publish(format_table(rows, title, notes), elapsed, "baseline.txt")


if __name__ == "__main__":
    main()
