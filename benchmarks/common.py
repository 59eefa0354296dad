"""Small helpers shared by the benchmarks: timing, statistics, a moto S3 server, a results table.

Nothing here asserts: benchmarks print figures next to their targets and say
whether each target was met; judging them is the reader's business.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from laminar_dev.s3server import start_s3_server as s3_server
from laminar_orchestration.store import LocalObjectStore, ObjectStore

#: The monotonic, system-wide clock every benchmark reads (comparable across processes on Linux).
now_ns = time.perf_counter_ns

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"

# --- timing and statistics ---------------------------------------------------------


def time_ns(fn: Callable[[], object]) -> int:
    """Wall time of one call of `fn`, in nanoseconds."""
    t0 = now_ns()
    fn()
    return now_ns() - t0


def runs(fn: Callable[[], int], n: int) -> list[int]:
    """Call `fn` (which returns a measurement) `n` times; return the measurements."""
    return [fn() for _ in range(n)]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    frac = rank - lo
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * frac)


@dataclass(frozen=True)
class Latency:
    """Summary of latency samples, in nanoseconds."""

    n: int
    p50: float
    p99: float
    mean: float
    max: float

    @classmethod
    def of(cls, samples_ns: Sequence[int]) -> Latency:
        return cls(
            n=len(samples_ns),
            p50=percentile(samples_ns, 50),
            p99=percentile(samples_ns, 99),
            mean=float(statistics.fmean(samples_ns)),
            max=float(max(samples_ns)),
        )


# --- the results table ---------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One printed figure: what, on which backend, its value, the target and the verdict."""

    figure: str
    backend: str
    value: str
    target: str = "-"
    verdict: str = "info"


def verdict(value: float, target: float, *, higher_is_better: bool = False) -> str:
    """'met', or 'MISSED (x1.8)' saying how many times the target the figure is."""
    met = value >= target if higher_is_better else value <= target
    if met:
        return "met"
    ratio = target / value if higher_is_better and value > 0 else value / target if target else math.inf
    return f"MISSED (x{ratio:.1f})"


def format_table(rows: Sequence[Row], title: str = "", notes: Sequence[str] = ()) -> str:
    """A fixed-width text table of `rows`, then `notes` as a bulleted list."""
    header = Row("figure", "backend", "value", "target", "verdict")
    cols = [
        [r.figure for r in (header, *rows)],
        [r.backend for r in (header, *rows)],
        [r.value for r in (header, *rows)],
        [r.target for r in (header, *rows)],
        [r.verdict for r in (header, *rows)],
    ]
    widths = [max(len(c) for c in col) for col in cols]

    def line(r: Row) -> str:
        cells = (r.figure, r.backend, r.value, r.target, r.verdict)
        return "  ".join(
            c.ljust(w) if i != 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    out = [title, rule] if title else [rule]
    out += [line(header), rule, *(line(r) for r in rows), rule]
    if notes:
        out += ["notes:", *(f"  - {n}" for n in notes)]
    return "\n".join(out)


def write_result(name: str, text: str) -> Path:
    """Write `text` to ``benchmarks/results/<name>`` (git-ignored); return the path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / name
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path


def run_title(benchmark: str, quick: bool, load_before: Sequence[float]) -> str:
    """A results table's title: which benchmark in which mode, when, on what machine, and the load
    average before the run and now (figures are only comparable at a similar load)."""
    before, after = ("/".join(f"{x:.1f}" for x in load) for load in (load_before, os.getloadavg()))
    return (
        f"{benchmark} ({'quick' if quick else 'full'}), "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%SZ')}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"load average (1/5/15 min) {before} before, {after} after"
    )


def publish(table: str, elapsed_s: float, name: str) -> None:
    """Print a results table with the run's total time and write it to ``results/<name>``."""
    text = table + f"\ntotal benchmark time: {elapsed_s:.1f} s"
    print(text, flush=True)
    progress(f"written to {write_result(name, text)}")


@dataclass
class TableReport:
    """A benchmark's rows and notes, published as one results table."""

    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def publish(self, benchmark: str, quick: bool, load_before: Sequence[float], elapsed_s: float, name: str) -> None:
        """Print the table under its `run_title` and write it to ``results/<name>`` (`publish`)."""
        publish(format_table(self.rows, run_title(benchmark, quick, load_before), self.notes), elapsed_s, name)


def progress(msg: str) -> None:
    """A progress note on stderr, so stdout carries only the figures."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --- a moto S3 server on loopback ------------------------------------------------------


@contextlib.contextmanager
def start_s3_server() -> Iterator[str]:
    """`laminar_dev.s3server.start_s3_server` (the tests' launcher) in a temporary directory; yields its URL."""
    with tempfile.TemporaryDirectory(prefix="laminar-bench-s3-") as tmp, s3_server(Path(tmp)) as url:
        yield url


# --- stores a child process can reopen --------------------------------------------------


@dataclass(frozen=True)
class StoreSpec:
    """How to (re)open a benchmark store, picklable so spawned processes can open their own.

    ``kind`` is ``"local"`` (``path``) or ``"s3"`` (``endpoint``, ``bucket``, ``prefix``).
    S3 stores are wrapped in `RetryingStore`, as `open_store` does in production.
    """

    kind: str
    path: str = ""
    endpoint: str = ""
    bucket: str = ""
    prefix: str = ""

    def open(self) -> ObjectStore:
        if self.kind == "local":
            return LocalObjectStore(self.path)
        if self.kind == "s3":
            from laminar_orchestration.store.retry import RetryingStore
            from laminar_orchestration.store.s3 import S3ObjectStore

            return RetryingStore(S3ObjectStore(self.bucket, self.prefix, endpoint_url=self.endpoint))
        raise ValueError(f"unknown store kind {self.kind!r}")
