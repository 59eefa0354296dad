"""A batch's cost against the state's size, for fixed-width and rich (MessagePack) state values.

Run from the repository root::

    python -m benchmarks.bench_state_types              # 1k and 2.7M keys, 5 runs each, about 4 minutes
    python -m benchmarks.bench_state_types --quick      # 1k, 30k and 300k keys, one run each
    python -m benchmarks.bench_state_types --runs 1 --batches 5 --layouts windowed
    python -m benchmarks.bench_state_types --shape wide # a batch of 10,000 distinct keys

The workload is one partition's micro-batch against its `PartitionStateStore`,
for two state layouts:

* ``keyed``: the default processor's state (``processing/keyed.py`` STATE_SCHEMA:
  int64 and float64 columns, packed numpy records);
* ``windowed``: the windowed-counts example bound to ``examples/clicks.yaml``
  (window key string, window start, ``_expires_at`` with the expiry index, a view
  count, a decimal amount, a list of pages: MessagePack rows). A window keeps
  its start and end, as the example's do; with ``--moving-expiry`` a touched
  window's end moves past every loaded one, as a TTL's expiry time moves on each
  touch (each batch then moves ~9,000 expiry index entries on the large store).

Two batch shapes (``--shape``):

* ``bar`` (the default): the data plane's bar, a batch of 10k events aggregated
  over 1,000 keys: 1,000 existing keys (random over the loaded ones; a store of
  1,000 keys lends all of them) and 50 new keys (odd ids: they land all over the
  key space). Both stores do the same work per key, so the ratio measures what the
  state's size alone costs;
* ``wide``: a batch of 10,000 distinct keys, ~90 % existing and ~10 % new. The 1k
  store lends its 1,000 keys and the rest are new (the bloom filter answers them),
  so its batch does less per-key work than the large store's ~9,000 existing keys:
  the 30k store (same mix) is the fair comparison there.

A batch is timed in three parts:

    get   - ``get_many`` of the batch's keys (multi-get + decode)
    fold  - a fold-like merge of the previous values with the batch's (Arrow compute)
    apply - ``apply(rows, offset, deleted=)`` (encode, expiry index, one write batch)

and, for ``windowed`` only, ``due`` - the expiry scan ``due(until, limit=500)``
whose keys (5 % of the batch's) go to ``apply`` as ``deleted=``, as a fold removes
the windows the watermark passed.

Each (layout, size) runs ``--runs`` times, each run in a fresh spawned process
(the store, heap and caches are its own): load the state in ``apply`` chunks of
100,000 rows, run ``--warmup`` batches, then ``--batches`` timed batches. Figures
per layout: the median batch time on the small and on the large store (median
over runs of each run's median), their ratio (target <= 1.5: the per-batch cost
is O(touched keys), not O(state)), the median split, the batch's CPU time on the
calling thread (with its ratio: other jobs on a shared machine disturb it less), and the load time.
With ``--shape wide`` a 30,000-key store runs too, for information only: the smallest whose
batch has the large store's mix of existing and new keys (~9,000 / ~1,000).
Nothing asserts on a figure. The table is also written to
``benchmarks/results/state_types.txt``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .common import REPO_ROOT, Row, TableReport, median, now_ns, progress, verdict


@dataclass(frozen=True)
class Shape:
    """A batch's keys: how many, and what share of them are new."""

    keys: int
    new_share: float

    @property
    def due_limit(self) -> int:
        return self.keys // 20  # 5 % of a batch's keys expire in it


SHAPES = {"bar": Shape(1_050, 50 / 1_050), "wide": Shape(10_000, 0.10)}
LOAD_CHUNK = 100_000
NEW_SPACE = 1_000_000  # new keys' ids are drawn from at least this many odd numbers
SMALL = 1_000
#: Information only: the smallest store that lends a batch its ~9,000 existing keys, so its batch has
#: the large store's mix (the 1k store's batch is mostly new keys, which the bloom filter answers).
MIDDLE = 30_000
FULL_LARGE = 2_700_000
QUICK_LARGE = 300_000
TARGET_RATIO = 1.5
LAYOUTS = ("keyed", "windowed")
PAGES = np.array([f"/page/{i}" for i in range(50)])
#: Expiry times of the loaded windows start here (ms); touched windows move past all of them.
T0 = 1_700_000_000_000

Ids = npt.NDArray[np.int64]


def _keys(ids: Ids) -> list[str]:
    return [f"k{i:09d}" for i in ids.tolist()]


def _bound_windowed() -> tuple[pa.Schema, str | None]:
    from examples import windowed_counts
    from laminar_orchestration.processing.schema import StreamSchema

    bound = windowed_counts.processor.bind(StreamSchema.from_file(REPO_ROOT / "examples" / "clicks.yaml"))
    return bound.codec.schema, bound.expiry_column


def _layout(name: str) -> tuple[pa.Schema, str | None]:
    """The value schema and the expiry column of a layout."""
    if name == "keyed":
        from laminar_orchestration.processing.keyed import STATE_SCHEMA

        return pa.schema([f for f in STATE_SCHEMA if f.name != "key"]), None
    return _bound_windowed()


def _pages(rng: np.random.Generator, n: int) -> pa.Array:
    """1-3 pages a row, as a list<string> column."""
    lengths = rng.integers(1, 4, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(PAGES[rng.integers(0, len(PAGES), int(offsets[-1]))], pa.string())
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _values(layout: str, schema: pa.Schema, ids: Ids, rng: np.random.Generator, expires: Ids) -> pa.Table:
    """Key + value columns for `ids`: plausible values with realistic entropy."""
    n = len(ids)
    keys = pa.array(_keys(ids), pa.string())
    if layout == "keyed":
        count = rng.integers(1, 100, n)
        lo = rng.random(n) * 50.0
        cols = {
            "count": pa.array(count, pa.int64()),
            "sum": pa.array(count * (lo + 10.0), pa.float64()),
            "min": pa.array(lo, pa.float64()),
            "max": pa.array(lo + 20.0, pa.float64()),
            "last": pa.array(lo + 5.0, pa.float64()),
            "last_offset": pa.array(rng.integers(0, 1_000_000, n), pa.int64()),
        }
    else:
        cols = {
            "window_key": keys,
            "window_start": pa.array(expires - 360_000, pa.int64()),
            "_expires_at": pa.array(expires, pa.int64()),
            "views": pa.array(rng.integers(1, 100, n), pa.int64()),
            "amount": pa.array(rng.integers(0, 10_000_000, n), pa.int64()).cast(schema.field("amount").type),
            "pages": _pages(rng, n),
        }
    return pa.table({"key": keys, **{f.name: cols[f.name] for f in schema}})


def _fold(
    layout: str, schema: pa.Schema, keys: list[str], previous: pa.Table, batch: pa.Table, *, moving_expiry: bool
) -> pa.Table:
    """The new full values: the previous ones merged with the batch's (a new key takes the batch's).
    A window keeps its start and end (`moving_expiry`: its end moves to the batch's, as a TTL's does)."""
    if layout == "keyed":
        had = previous["count"].is_valid()
        count = pc.add(pc.coalesce(previous["count"], 0), batch["count"])
        cols = {
            "count": count,
            "sum": pc.add(pc.coalesce(previous["sum"], 0.0), batch["sum"]),
            "min": pc.if_else(had, pc.min_element_wise(previous["min"], batch["min"]), batch["min"]),
            "max": pc.if_else(had, pc.max_element_wise(previous["max"], batch["max"]), batch["max"]),
            "last": batch["last"],
            "last_offset": batch["last_offset"],
        }
    else:
        had = previous["views"].is_valid()
        narrow = pa.decimal128(30, 2)  # (38, 2) + (38, 2) would need precision 39
        cols = {
            "window_key": batch["window_key"],
            "window_start": pc.coalesce(previous["window_start"], batch["window_start"]),
            "_expires_at": batch["_expires_at"]
            if moving_expiry
            else pc.coalesce(previous["_expires_at"], batch["_expires_at"]),
            "views": pc.add(pc.coalesce(previous["views"], 0), batch["views"]),
            "amount": pc.if_else(
                had, pc.add(previous["amount"].cast(narrow), batch["amount"].cast(narrow)), batch["amount"]
            ),
            "pages": pc.if_else(had, previous["pages"], batch["pages"]),
        }
    return pa.table({"key": pa.array(keys, pa.string()), **{f.name: cols[f.name] for f in schema}})


# --- one (layout, size) run, in its own process --------------------------------------------


@dataclass(frozen=True)
class Case:
    layout: str
    size: int
    batches: int
    warmup: int
    seed: int
    workdir: str
    shape: Shape
    moving_expiry: bool = False


@dataclass(frozen=True)
class CaseResult:
    layout: str
    size: int
    load_s: float
    batch_ms: float
    get_ms: float
    fold_ms: float
    due_ms: float
    apply_ms: float
    #: The batch's CPU time on the calling thread (RocksDB reads and writes run on it): less
    #: sensitive than the wall time to other jobs on a shared machine.
    cpu_ms: float


def run_case(case: Case) -> CaseResult:
    from laminar_orchestration.dataplane.statestore import PartitionStateStore

    schema, expiry = _layout(case.layout)
    rng = np.random.default_rng(case.seed)
    path = Path(tempfile.mkdtemp(prefix=f"state-{case.layout}-", dir=case.workdir))
    store = PartitionStateStore(path / "store", schema, partition=0, expiry_column=expiry)
    try:
        offset = 0
        t0 = now_ns()
        for start in range(0, case.size, LOAD_CHUNK):
            ids = np.arange(start, min(case.size, start + LOAD_CHUNK), dtype=np.int64) * 2  # even ids
            offset += 1
            store.apply(_values(case.layout, schema, ids, rng, T0 + ids), offset)
        load_s = (now_ns() - t0) / 1e9
        splits: dict[str, list[float]] = {"batch": [], "get": [], "fold": [], "due": [], "apply": [], "cpu": []}
        for b in range(case.warmup + case.batches):
            shape = case.shape
            existing = min(case.size, round(shape.keys * (1 - shape.new_share)))
            ids = np.concatenate(
                [
                    rng.choice(case.size, existing, replace=False).astype(np.int64) * 2,
                    rng.choice(max(case.size, NEW_SPACE), shape.keys - existing, replace=False).astype(np.int64) * 2
                    + 1,
                ]
            )
            keys = _keys(ids)
            # New windows (and, moving, touched ones) end after every loaded one: the oldest loaded are due.
            batch = _values(case.layout, schema, ids, rng, T0 + 4 * case.size + 1000 * b + ids % 1000)
            cpu_start = time.thread_time_ns()
            t_start = now_ns()
            previous = store.get_many(keys)
            t_get = now_ns()
            rows = _fold(case.layout, schema, keys, previous, batch, moving_expiry=case.moving_expiry)
            t_fold = now_ns()
            deleted = None
            if expiry is not None:
                due = store.due(2**62, limit=shape.due_limit)["key"].to_pylist()
                deleted = pa.array(sorted(set(due) - set(keys)), pa.string())
            t_due = now_ns()
            offset += 1
            store.apply(rows, offset, deleted=deleted)
            t_end = now_ns()
            cpu_end = time.thread_time_ns()
            if b >= case.warmup:
                splits["cpu"].append((cpu_end - cpu_start) / 1e6)
                for name, ns in (
                    ("batch", t_end - t_start),
                    ("get", t_get - t_start),
                    ("fold", t_fold - t_get),
                    ("due", t_due - t_fold),
                    ("apply", t_end - t_due),
                ):
                    splits[name].append(ns / 1e6)
        m = {name: median(v) for name, v in splits.items()}
        parts = (m["batch"], m["get"], m["fold"], m["due"], m["apply"], m["cpu"])
        return CaseResult(case.layout, case.size, load_s, *parts)
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)


# --- the report ------------------------------------------------------------------------------


def _fmt_n(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n // 1000}k" if n >= 1000 else str(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{_fmt_n(QUICK_LARGE)} keys, one run")
    parser.add_argument("--large", type=int, default=None, help=f"keys of the large store ({_fmt_n(FULL_LARGE)})")
    parser.add_argument("--runs", type=int, default=None, help="runs per (layout, size), 5 (1 with --quick)")
    parser.add_argument("--batches", type=int, default=7, help="timed batches per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches per run, first")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated: keyed,windowed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--moving-expiry", action="store_true", help="windowed: a touched window's end moves on (as a TTL's)"
    )
    parser.add_argument("--shape", choices=sorted(SHAPES), default="bar", help="a batch's keys (see above)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    large = args.large or (QUICK_LARGE if args.quick else FULL_LARGE)
    # Five: a run's median batch moves by ~20 % between fresh processes on a shared machine.
    runs = args.runs or (1 if args.quick else 5)
    layouts = [x for x in args.layouts.split(",") if x]
    shape = SHAPES[args.shape]
    sizes = (SMALL, MIDDLE, large) if large > MIDDLE and args.shape == "wide" else (SMALL, large)
    t_start = now_ns()
    results: list[CaseResult] = []
    with tempfile.TemporaryDirectory(prefix="laminar-bench-state-types-") as workdir:
        ctx = multiprocessing.get_context("spawn")
        for run in range(runs):
            for layout in layouts:  # interleaved, so a noisy neighbour hits the layouts alike
                for size in sizes:
                    progress(f"run {run + 1}/{runs}: {layout} on {_fmt_n(size)} keys")
                    case = Case(
                        layout, size, args.batches, args.warmup, args.seed + run, workdir, shape, args.moving_expiry
                    )
                    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
                        results.append(pool.submit(run_case, case).result())
    report = TableReport()
    for layout in layouts:
        per = {s: [r for r in results if r.layout == layout and r.size == s] for s in sizes}
        small_ms = median([r.batch_ms for r in per[SMALL]])
        large_ms = median([r.batch_ms for r in per[large]])
        ratio = large_ms / small_ms
        for s in sizes:
            rs = per[s]
            spread = "/".join(f"{r.batch_ms:.0f}" for r in rs)
            report.rows.append(
                Row(
                    f"batch of {shape.keys:,} keys on {_fmt_n(s)} keys, ms (runs {spread})",
                    layout,
                    f"{median([r.batch_ms for r in rs]):.1f}",
                )
            )
            split = "  ".join(
                f"{name} {median([getattr(r, name + '_ms') for r in rs]):.1f}"
                for name in ("get", "fold", "due", "apply", "cpu")
                if name != "due" or layout == "windowed"
            )
            report.rows.append(Row(f"  split on {_fmt_n(s)} keys, ms: {split}", layout, ""))
        cpu_ratio = median([r.cpu_ms for r in per[large]]) / median([r.cpu_ms for r in per[SMALL]])
        report.rows.append(Row(f"ratio {_fmt_n(large)} / 1k keys, CPU time of the batch", layout, f"{cpu_ratio:.2f}"))
        report.rows.append(
            Row(
                f"ratio {_fmt_n(large)} / 1k keys",
                layout,
                f"{ratio:.2f}",
                f"<= {TARGET_RATIO}",
                verdict(ratio, TARGET_RATIO),
            )
        )
        if MIDDLE in per:
            middle_ms = median([r.batch_ms for r in per[MIDDLE]])
            report.rows.append(
                Row(f"ratio {_fmt_n(large)} / {_fmt_n(MIDDLE)} keys (same mix)", layout, f"{large_ms / middle_ms:.2f}")
            )
        load = median([r.load_s for r in per[large]])
        report.rows.append(Row(f"load {_fmt_n(large)} keys (apply chunks of 100k), s", layout, f"{load:.1f}"))
    existing = round(shape.keys * (1 - shape.new_share))
    report.note(
        f"a batch ({args.shape}): {shape.keys:,} keys, {existing:,} existing and the rest new; on the 1k store "
        f"its {min(existing, SMALL):,} keys and {shape.keys - min(existing, SMALL):,} new ones"
    )
    report.note(
        f"windowed: due(until, limit={shape.due_limit}) keys removed via apply(deleted=); median of "
        f"{args.batches} batches after {args.warmup} warm-up, {runs} run(s) in fresh processes"
    )
    report.note(
        "windowed: a touched window's end moves past every loaded one (--moving-expiry)"
        if args.moving_expiry
        else "windowed: a window keeps its start and end, as the example's do"
    )
    report.publish("bench_state_types", args.quick, load_before, (now_ns() - t_start) / 1e9, "state_types.txt")


if __name__ == "__main__":
    main()
