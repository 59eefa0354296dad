"""The baseline's Spark Structured Streaming worker: the child process (one SparkSession, at most one
streaming query per command, a heartbeat file) and the driver's handle on it (`Worker`).
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from laminar_dev.localcluster import HEARTBEAT_TIMEOUT_S, wait_until
from laminar_orchestration.protocol.producers import generate_events

from .common import REPO_ROOT
from .migration_cluster import HEARTBEAT_INTERVAL_S

SPARK_MASTER = "local[1]"
DETECT_POLL_S = 0.02
GRACEFUL_STOP_WAIT_S = 5.0
HOLD_S = 1.0  # the split-brain hook's hold after the sink (one batch, one time)
#: The baseline's worker JVMs: the HDFS-backed state store holds a 2.7M-key state on the heap.
SS_DRIVER_MEMORY = "3g"


# =====================================================================================================
# The worker process (python -m benchmarks.bench_baseline --worker NAME --ctl DIR)
# =====================================================================================================


def write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
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
        write_json(self.status_path, {"seq": self.seq, "state": state, "error": error, "at": time.time()})

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
                write_json(self.ctl / f"{self.name}.held.json", {"batch_id": batch_id, "at": time.time()})
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
            cmd = read_json(self.cmd_path)
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
        write_json(
            self.ctl / f"{self.name}.cmd.json", {"seq": self.seq, "action": action, **(dirs.as_cmd() if dirs else {})}
        )
        return self.seq

    def status(self) -> dict[str, Any]:
        return read_json(self.ctl / f"{self.name}.status.json") or {}

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
