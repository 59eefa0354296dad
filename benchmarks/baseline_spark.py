"""The Spark Structured Streaming side of the baseline comparison: its file source, what its output
directory shows (duplicates, stale overwrites, final counts), and its scenarios: planned moves, a
killed worker (warm standby or cold restart), the ~100 MB state, and the split-brain.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from laminar_dev.localcluster import HEARTBEAT_TIMEOUT_S, wait_until

from .baseline_load import (
    BIG_PREFIX,
    BIG_SEED,
    SEED,
    SMALL_KEYS,
    SMALL_PREFIX,
    SMALL_SEED,
    SS,
    TICK_S,
    EventStream,
    truth,
)
from .baseline_worker import Dirs, Worker, read_json
from .common import progress
from .migration_cluster import Producer, every_key_once, random_instant

END_MARKER = "__end__"
BATCH_START = "paused at batch start"
AFTER_SINK = "paused after the sink"


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
        batch = (read_json(held) or {}).get("batch_id")
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
