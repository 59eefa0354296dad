"""State-store backends for a partition's keyed state: RocksDB (rocksdict) vs LMDB vs SQLite.

Run from the repository root::

    python -m benchmarks.bench_statestore                  # 100k and 2.7M keys, 3 runs each, ~1-2 minutes
    python -m benchmarks.bench_statestore --quick          # 100k keys, one run, ~10 seconds
    python -m benchmarks.bench_statestore --sizes 100000,1000000 --batches 50 --backends rocksdict,lmdb
    python -m benchmarks.bench_statestore --sizes 2700000 --cache-mb 256   # cache holding the whole state

The workload is one partition's micro-batch against its local store: keys are
10-byte strings (``k`` + 9 digits; the loaded keys are the even numbers, so the
new keys of a batch, odd numbers, land all over the key space), values are
48-byte fixed-width records (int64 count, float64 sum/min/max/last, int64
last_offset: one numpy structured dtype). One batch is:

    multi-get 1,000 random existing keys + 50 new keys -> decode (numpy frombuffer)
    -> vectorised merge (add / minimum / maximum) -> encode (tobytes)
    -> write the 1,050 records back in ONE write batch / transaction.

Backends, all configured as a cache (durability comes from object storage):

* ``rocksdict``: raw bytes keys and values, WAL disabled, bloom filter 10 bits/key,
  64 MB block cache (``--cache-mb``); bulk load = write batches of 100k, then flush + full compaction.
* ``lmdb``: ``sync=False, metasync=False, readahead=False``; bulk load = ``putmulti(append=True)``.
  Reads go through the OS page cache (mmap): there is no cache of its own to size.
* ``sqlite``: ``synchronous=OFF``, ``journal_mode=OFF`` (``--sqlite-journal wal`` for WAL),
  ``locking_mode=EXCLUSIVE``, 64 MB page cache (``--cache-mb``), ``(k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID``;
  multi-get = one ``SELECT ... WHERE k IN (?, ...)``, write = ``executemany(INSERT OR REPLACE)``.

Each (backend, size) runs ``--runs`` times (default 3; 1 with ``--quick``), each run
in a fresh spawned process (heaps do not interfere, the peak RSS is its own), the
backends interleaved so a noisy neighbour hits them alike. Figures per backend and
state size: batch median (with the spread of the runs' medians) and p90 over the
pooled timed batches (after warm-up batches), the median get / merge / write
split; and, as medians over runs: bulk-load time, on-disk size (allocated
blocks), point-lookup time (median of per-lookup means over rounds of 500
lookups), peak and final RSS; then each backend's ratio to rocksdict at the same
size. For rocksdict only: a ``Checkpoint`` (hard-link snapshot) right after the
load and one after the batches, how many of the second's files are hard links and
how many bytes it adds to the first (what an incremental upload would send: the
new SSTs and the small metadata files), then copying that checkpoint and opening
the copy (cold open; the page cache is warm, nothing drops it), and the copy's
first multi-get. ``--sizes`` larger than ~2.7M keys need ~60 bytes x keys of
RAM per run for the load chunks and the store's caches; disk ~80 bytes a key.

Nothing asserts on a figure; a backend that reads back wrong values raises.
The table is also written to ``benchmarks/results/statestore.txt``.
"""

from __future__ import annotations

import abc
import argparse
import importlib.util
import multiprocessing
import os
import resource
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import numpy.typing as npt
from rocksdict import (
    BlockBasedOptions,
    Cache,
    Checkpoint,
    CompactOptions,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from .common import Row, format_table, median, now_ns, percentile, progress, publish, run_title

#: The value record: 48 bytes, little-endian, no padding.
RECORD = np.dtype(
    [
        ("count", "<i8"),
        ("sum", "<f8"),
        ("min", "<f8"),
        ("max", "<f8"),
        ("last", "<f8"),
        ("last_offset", "<i8"),
    ]
)
RECORD_BYTES = RECORD.itemsize
assert RECORD_BYTES == 48

KEY_DIGITS = 9  # key = b"k" + 9 digits: 10 bytes
EXISTING_PER_BATCH = 1000
NEW_PER_BATCH = 50
LOAD_CHUNK = 100_000
LOOKUP_ROUNDS = 10
LOOKUPS_PER_ROUND = 500
DEFAULT_CACHE_MB = 64  # RocksDB block cache and SQLite page cache, each

ALL_BACKENDS = ("rocksdict", "lmdb", "sqlite")
REFERENCE = "rocksdict"
DEFAULT_SIZES = (100_000, 2_700_000)
QUICK_SIZES = (100_000,)

Records = npt.NDArray[np.void]
Ids = npt.NDArray[np.int64]


def _fmt_n(n: int) -> str:
    if n >= 1_000_000 and n % 100_000 == 0:
        return f"{n / 1e6:g}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def _encode_keys(ids: Ids) -> list[bytes]:
    """``b"k%09d" % id`` for each id, vectorised (fixed width, so byte order = numeric order)."""
    n = len(ids)
    out = np.empty((n, 1 + KEY_DIGITS), dtype=np.uint8)
    out[:, 0] = ord("k")
    x = ids.astype(np.int64, copy=True)
    for j in range(KEY_DIGITS, 0, -1):
        out[:, j] = ord("0") + x % 10
        x //= 10
    return cast(list[bytes], out.view(f"S{1 + KEY_DIGITS}").ravel().tolist())


def _split_records(buf: bytes) -> list[bytes]:
    return [buf[i : i + RECORD_BYTES] for i in range(0, len(buf), RECORD_BYTES)]


def _initial_records(rng: np.random.Generator, n: int) -> Records:
    """Plausible aggregates (distinct fields, so compression sees realistic entropy)."""
    rec = np.empty(n, dtype=RECORD)
    count = rng.integers(1, 100, n)
    lo = rng.random(n) * 50.0
    hi = lo + rng.random(n) * 50.0
    rec["count"] = count
    rec["sum"] = count * (lo + (hi - lo) * rng.random(n))
    rec["min"] = lo
    rec["max"] = hi
    rec["last"] = lo + (hi - lo) * rng.random(n)
    rec["last_offset"] = rng.integers(0, 1_000_000, n)
    return rec


def _dir_bytes(path: Path) -> int:
    """Bytes allocated on disk by the files under `path` (sparse files count what they use)."""
    total = 0
    for p in path.rglob("*"):
        if p.is_file():
            total += p.stat().st_blocks * 512
    return total


def _rss_mb() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# --- the backends ------------------------------------------------------------------------


class Store(abc.ABC):
    """One partition's local store: bytes keys, 48-byte bytes values."""

    name: ClassVar[str]

    @abc.abstractmethod
    def load(self, items: list[tuple[bytes, bytes]]) -> None:
        """Write one chunk of the initial state (keys ascending, above all loaded so far)."""

    def finish_load(self) -> None:  # noqa: B027 - optional hook
        """Bring the store to its steady state after the last `load` chunk."""

    @abc.abstractmethod
    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of `keys`, in order; None where a key is absent."""

    @abc.abstractmethod
    def write(self, items: list[tuple[bytes, bytes]]) -> None:
        """Put all of `items` in one write batch / transaction."""

    @abc.abstractmethod
    def lookups(self, keys: list[bytes]) -> int:
        """One point lookup per key, in a tight loop; the number found."""

    @abc.abstractmethod
    def close(self) -> None: ...


def _count_found(get: Callable[[bytes], object], keys: list[bytes]) -> int:
    """`Store.lookups` over a backend's point lookup `get`: a plain loop, one call per key."""
    found = 0
    for k in keys:
        if get(k) is not None:
            found += 1
    return found


def _rocks_options(cache_bytes: int) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_max_background_jobs(2)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    table.set_block_cache(Cache(cache_bytes))
    opts.set_block_based_table_factory(table)
    return opts


def _no_wal() -> WriteOptions:
    write = WriteOptions()
    # The stub (rocksdict 0.3.29) declares `disable_wal(self, disable)` a method; at
    # runtime it is a bool property (calling it raises TypeError: 'bool' object is not callable).
    write.disable_wal = True  # type: ignore[method-assign, assignment]
    return write


class RocksStore(Store):
    name = "rocksdict"

    def __init__(self, path: Path, cache_bytes: int) -> None:
        self.path = path
        self.cache_bytes = cache_bytes
        self.db = Rdict(str(path), _rocks_options(cache_bytes))
        self.db.set_write_options(_no_wal())

    def load(self, items: list[tuple[bytes, bytes]]) -> None:
        self.write(items)

    def finish_load(self) -> None:
        self.db.flush(True)
        self.db.compact_range(None, None, CompactOptions())

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        return cast(list[bytes | None], self.db.get(cast(list[str | int | float | bytes | bool], keys)))

    def write(self, items: list[tuple[bytes, bytes]]) -> None:
        wb = WriteBatch(raw_mode=True)
        put = wb.put
        for k, v in items:
            put(k, v)
        self.db.write(wb)

    def lookups(self, keys: list[bytes]) -> int:
        return _count_found(self.db.get, keys)

    def close(self) -> None:
        self.db.close()


class LmdbStore(Store):
    name = "lmdb"

    def __init__(self, path: Path, size: int) -> None:
        import lmdb  # optional: the parent skips this backend when it is not installed

        # ~70 bytes a record in a full page, ~1.5x after random inserts split pages; the map is sparse.
        self.env = lmdb.open(
            str(path),
            map_size=max(256 << 20, size * 400),
            sync=False,
            metasync=False,
            readahead=False,
            lock=True,
        )

    def load(self, items: list[tuple[bytes, bytes]]) -> None:
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items, append=True)

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        with self.env.begin() as txn:
            get = txn.get
            return [get(k) for k in keys]

    def write(self, items: list[tuple[bytes, bytes]]) -> None:
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items)

    def lookups(self, keys: list[bytes]) -> int:
        with self.env.begin() as txn:  # one read transaction per round, as a batch would hold one
            return _count_found(txn.get, keys)

    def close(self) -> None:
        self.env.close()


class SqliteStore(Store):
    name = "sqlite"

    def __init__(self, path: Path, journal: str, cache_bytes: int) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(path / "state.db"), isolation_level=None)  # explicit BEGIN/COMMIT
        for pragma in (
            f"journal_mode={journal}",
            "synchronous=OFF",
            "locking_mode=EXCLUSIVE",
            f"cache_size=-{cache_bytes // 1024}",
            "temp_store=MEMORY",
        ):
            self.conn.execute(f"PRAGMA {pragma}")
        self.conn.execute("CREATE TABLE IF NOT EXISTS state (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
        self._select: dict[int, str] = {}

    def _in_sql(self, n: int) -> str:
        sql = self._select.get(n)
        if sql is None:
            sql = self._select[n] = f"SELECT k, v FROM state WHERE k IN ({','.join('?' * n)})"
        return sql

    def load(self, items: list[tuple[bytes, bytes]]) -> None:
        self.write(items)

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        found: dict[bytes, bytes] = dict(self.conn.execute(self._in_sql(len(keys)), keys).fetchall())
        return [found.get(k) for k in keys]

    def write(self, items: list[tuple[bytes, bytes]]) -> None:
        self.conn.execute("BEGIN")
        self.conn.executemany("INSERT OR REPLACE INTO state (k, v) VALUES (?, ?)", items)
        self.conn.execute("COMMIT")

    def lookups(self, keys: list[bytes]) -> int:
        execute = self.conn.execute
        sql = "SELECT v FROM state WHERE k = ?"
        found = 0
        for k in keys:
            if execute(sql, (k,)).fetchone() is not None:
                found += 1
        return found

    def close(self) -> None:
        self.conn.close()


def _open_store(case: Case, path: Path) -> Store:
    backend, cache_bytes = case.backend, case.cache_mb << 20
    if backend == "rocksdict":
        return RocksStore(path, cache_bytes)
    if backend == "lmdb":
        return LmdbStore(path, case.size)
    if backend == "sqlite":
        return SqliteStore(path, case.sqlite_journal, cache_bytes)
    raise ValueError(f"unknown backend {backend!r}")


# --- one (backend, size) case, run in its own process ----------------------------------------


@dataclass(frozen=True)
class Case:
    backend: str
    size: int
    batches: int
    warmup: int
    seed: int
    workdir: str
    sqlite_journal: str
    cache_mb: int
    run: int


@dataclass(frozen=True)
class CheckpointFigures:
    after_load_ms: float
    after_batches_ms: float
    files: int
    hardlinked_files: int
    checkpoint_mb: float
    upload_files: int
    upload_mb: float
    copy_ms: float
    open_ms: float
    first_get_ms: float
    wal_bytes: int


@dataclass(frozen=True)
class CaseResult:
    backend: str
    size: int
    load_s: float
    batch_ms: list[float]
    get_ms: list[float]
    merge_ms: list[float]
    write_ms: list[float]
    lookup_us: float
    disk_mb: float
    rss_before_mb: float
    rss_peak_mb: float
    rss_end_mb: float
    checkpoint: CheckpointFigures | None = None


@dataclass(frozen=True)
class BatchInput:
    keys: list[bytes]
    update: Records


def _make_batches(rng: np.random.Generator, size: int, n: int) -> list[BatchInput]:
    """`n` batches: 1000 distinct existing keys (even ids) + 50 never-seen keys (odd ids), and their updates."""
    new_ids = rng.choice(size, size=n * NEW_PER_BATCH, replace=False).astype(np.int64) * 2 + 1
    out: list[BatchInput] = []
    for b in range(n):
        existing = rng.choice(size, size=EXISTING_PER_BATCH, replace=False).astype(np.int64) * 2
        ids = np.concatenate([existing, new_ids[b * NEW_PER_BATCH : (b + 1) * NEW_PER_BATCH]])
        m = len(ids)
        upd = np.empty(m, dtype=RECORD)
        upd["count"] = rng.integers(1, 10, m)
        upd["sum"] = rng.random(m) * 100.0 * upd["count"]
        lo = rng.random(m) * 50.0
        upd["min"] = lo
        upd["max"] = lo + rng.random(m) * 50.0
        upd["last"] = rng.random(m) * 100.0
        upd["last_offset"] = (b + 1) * 10_000 + np.arange(m, dtype=np.int64)
        out.append(BatchInput(_encode_keys(ids), upd))
    return out


def _merge(prev: Records, present: npt.NDArray[np.bool_], upd: Records) -> Records:
    out = np.empty(len(upd), dtype=RECORD)
    out["count"] = prev["count"] + upd["count"]  # absent rows of `prev` are zeros
    out["sum"] = prev["sum"] + upd["sum"]
    out["min"] = np.where(present, np.minimum(prev["min"], upd["min"]), upd["min"])
    out["max"] = np.where(present, np.maximum(prev["max"], upd["max"]), upd["max"])
    out["last"] = upd["last"]
    out["last_offset"] = upd["last_offset"]
    return out


def _decode(values: list[bytes | None]) -> tuple[Records, npt.NDArray[np.bool_]]:
    present = np.fromiter((v is not None for v in values), dtype=np.bool_, count=len(values))
    prev = np.zeros(len(values), dtype=RECORD)
    if present.any():
        prev[present] = np.frombuffer(b"".join([v for v in values if v is not None]), dtype=RECORD)
    return prev, present


def _run_batch(store: Store, batch: BatchInput) -> tuple[int, int, int, Records]:
    """One micro-batch; (get, merge, write) ns and the records written."""
    t0 = now_ns()
    values = store.multi_get(batch.keys)
    t1 = now_ns()
    prev, present = _decode(values)
    merged = _merge(prev, present, batch.update)
    items = list(zip(batch.keys, _split_records(merged.tobytes()), strict=True))
    t2 = now_ns()
    store.write(items)
    t3 = now_ns()
    return t1 - t0, t2 - t1, t3 - t2, merged


def _checkpoint_ms(db: Rdict, dest: Path) -> float:
    t0 = now_ns()
    Checkpoint(db).create_checkpoint(str(dest))
    return (now_ns() - t0) / 1e6


def _restore_figures(
    store: RocksStore, cp_load: Path, cp_batches: Path, after_load_ms: float, after_batches_ms: float, probe: BatchInput
) -> CheckpointFigures:
    files = [p for p in cp_batches.iterdir() if p.is_file()]
    # SST files are immutable and uniquely numbered: one already uploaded with the earlier
    # checkpoint need not go again; MANIFEST, CURRENT, OPTIONS are small and always go.
    load_ssts = {p.name for p in cp_load.glob("*.sst")}
    upload = [p for p in files if p.suffix != ".sst" or p.name not in load_ssts]
    restore = cp_batches.parent / "restore"
    t0 = now_ns()
    shutil.copytree(cp_batches, restore)  # stands in for the download: a separate copy, no hard links
    copy_ms = (now_ns() - t0) / 1e6
    t0 = now_ns()
    db = Rdict(str(restore), _rocks_options(store.cache_bytes))
    open_ms = (now_ns() - t0) / 1e6
    t0 = now_ns()
    got = db.get(cast(list[str | int | float | bytes | bool], probe.keys))
    first_get_ms = (now_ns() - t0) / 1e6
    if got != store.multi_get(probe.keys):
        raise RuntimeError("the reopened checkpoint copy does not hold the live store's values")
    db.close()
    return CheckpointFigures(
        after_load_ms=after_load_ms,
        after_batches_ms=after_batches_ms,
        files=len(files),
        hardlinked_files=sum(1 for p in files if p.stat().st_nlink > 1),
        checkpoint_mb=sum(p.stat().st_size for p in files) / 1e6,
        upload_files=len(upload),
        upload_mb=sum(p.stat().st_size for p in upload) / 1e6,
        copy_ms=copy_ms,
        open_ms=open_ms,
        first_get_ms=first_get_ms,
        wal_bytes=sum(p.stat().st_size for p in store.path.glob("*.log")),
    )


def run_case(case: Case) -> CaseResult:
    """Load, run the batches, measure lookups (and checkpoints, for rocksdict); remove the store."""
    rng = np.random.default_rng([case.seed, case.size, case.run])  # the same workload for every backend
    root = Path(case.workdir) / f"{case.backend}-{case.size}-{case.run}"
    root.mkdir(parents=True)
    db_path = root / "db"
    batches = _make_batches(rng, case.size, case.warmup + case.batches)
    rss_before = _rss_mb()
    store = _open_store(case, db_path)
    try:
        load_ns = 0
        for start in range(0, case.size, LOAD_CHUNK):
            stop = min(start + LOAD_CHUNK, case.size)
            keys = _encode_keys(np.arange(start, stop, dtype=np.int64) * 2)
            items = list(zip(keys, _split_records(_initial_records(rng, stop - start).tobytes()), strict=True))
            t0 = now_ns()
            store.load(items)
            load_ns += now_ns() - t0
        t0 = now_ns()
        store.finish_load()
        load_ns += now_ns() - t0

        cp_load_ms = 0.0
        if isinstance(store, RocksStore):
            cp_load_ms = _checkpoint_ms(store.db, root / "cp-load")

        get_ms: list[float] = []
        merge_ms: list[float] = []
        write_ms: list[float] = []
        merged = np.empty(0, dtype=RECORD)
        for i, batch in enumerate(batches):
            g, m, w, merged = _run_batch(store, batch)
            if i >= case.warmup:
                get_ms.append(g / 1e6)
                merge_ms.append(m / 1e6)
                write_ms.append(w / 1e6)
        last = batches[-1]
        if store.multi_get(last.keys) != _split_records(merged.tobytes()):
            raise RuntimeError(f"{case.backend}: the last batch does not read back as written")

        per_lookup_us: list[float] = []
        for _ in range(LOOKUP_ROUNDS):
            ids = rng.integers(0, case.size, LOOKUPS_PER_ROUND, dtype=np.int64) * 2
            keys = _encode_keys(ids)
            t0 = now_ns()
            found = store.lookups(keys)
            per_lookup_us.append((now_ns() - t0) / 1e3 / len(keys))
            if found != len(keys):
                raise RuntimeError(f"{case.backend}: {len(keys) - found} loaded keys not found")

        checkpoint = None
        if isinstance(store, RocksStore):
            cp_batches_ms = _checkpoint_ms(store.db, root / "cp-batches")
            checkpoint = _restore_figures(
                store, root / "cp-load", root / "cp-batches", cp_load_ms, cp_batches_ms, batches[0]
            )
        disk_mb = _dir_bytes(db_path) / 1e6
        rss_peak = _peak_rss_mb()
        rss_end = _rss_mb()
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    return CaseResult(
        backend=case.backend,
        size=case.size,
        load_s=load_ns / 1e9,
        batch_ms=[g + m + w for g, m, w in zip(get_ms, merge_ms, write_ms, strict=True)],
        get_ms=get_ms,
        merge_ms=merge_ms,
        write_ms=write_ms,
        lookup_us=median(per_lookup_us),
        disk_mb=disk_mb,
        rss_before_mb=rss_before,
        rss_peak_mb=rss_peak,
        rss_end_mb=rss_end,
        checkpoint=checkpoint,
    )


def _run_isolated(case: Case) -> CaseResult:
    """`run_case` in a fresh spawned process (clean heap, its own peak RSS)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_case, case).result()


# --- the report -----------------------------------------------------------------------------


class Summary:
    """One (backend, size) over its runs: batch samples pooled, the other figures' medians over runs."""

    def __init__(self, runs: list[CaseResult]) -> None:
        self.backend = runs[0].backend
        self.runs = len(runs)
        batch = [x for r in runs for x in r.batch_ms]
        self.p50 = median(batch)
        self.p90 = percentile(batch, 90)
        run_p50 = [median(r.batch_ms) for r in runs]
        self.p50_lo, self.p50_hi = min(run_p50), max(run_p50)
        self.get = median([x for r in runs for x in r.get_ms])
        self.merge = median([x for r in runs for x in r.merge_ms])
        self.write = median([x for r in runs for x in r.write_ms])
        self.load_s = median([r.load_s for r in runs])
        self.disk_mb = median([r.disk_mb for r in runs])
        self.lookup_us = median([r.lookup_us for r in runs])
        self.rss_before_mb = median([r.rss_before_mb for r in runs])
        self.rss_peak_mb = median([r.rss_peak_mb for r in runs])
        self.rss_end_mb = median([r.rss_end_mb for r in runs])
        cps = [r.checkpoint for r in runs if r.checkpoint is not None]
        self.checkpoint: CheckpointFigures | None = None
        if cps:
            values: dict[str, Any] = {}
            for f in fields(CheckpointFigures):
                m = median([getattr(c, f.name) for c in cps])
                values[f.name] = round(m) if isinstance(getattr(cps[0], f.name), int) else m
            self.checkpoint = CheckpointFigures(**values)


#: (figure, format of its value given s=Summary), printed for every backend.
_FIGURES = (
    ("batch p50 (1000 get + 50 new) [run p50s min-max]", "{s.p50:.2f} ms [{s.p50_lo:.2f}-{s.p50_hi:.2f}]"),
    ("batch p90", "{s.p90:.2f} ms"),
    ("batch p50 split get/merge/write", "{s.get:.2f} / {s.merge:.2f} / {s.write:.2f} ms"),
    ("bulk load", "{s.load_s:.2f} s"),
    ("on-disk size", "{s.disk_mb:.1f} MB"),
    ("point lookup p50", "{s.lookup_us:.2f} us"),
    ("RSS peak / at end (before open)", "{s.rss_peak_mb:.0f} / {s.rss_end_mb:.0f} MB ({s.rss_before_mb:.0f})"),
)


def _checkpoint_rows(s: Summary, at: str) -> list[Row]:
    c = s.checkpoint
    if c is None:
        return []
    b = s.backend
    return [
        Row(f"checkpoint right after load {at}", b, f"{c.after_load_ms:.1f} ms"),
        Row(f"checkpoint after the batches (flushes memtable) {at}", b, f"{c.after_batches_ms:.1f} ms"),
        Row(
            f"checkpoint files hard-linked / total {at}",
            b,
            f"{c.hardlinked_files} / {c.files} ({c.checkpoint_mb:.1f} MB)",
        ),
        Row(f"incremental upload: new SSTs + metadata {at}", b, f"{c.upload_files} files, {c.upload_mb:.2f} MB"),
        Row(f"copy the checkpoint (stands in for download) {at}", b, f"{c.copy_ms:.1f} ms"),
        Row(f"cold open of the copy {at}", b, f"{c.open_ms:.1f} ms"),
        Row(f"first multi-get on the copy (1050 keys) {at}", b, f"{c.first_get_ms:.2f} ms"),
        Row(f"WAL bytes in the live store {at}", b, f"{c.wal_bytes}"),
    ]


@dataclass
class Report:
    results: dict[tuple[str, int], list[CaseResult]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, r: CaseResult) -> None:
        self.results.setdefault((r.backend, r.size), []).append(r)

    def summary(self, backend: str, size: int) -> Summary | None:
        runs = self.results.get((backend, size))
        return Summary(runs) if runs else None

    def rows(self, backends: list[str], sizes: list[int]) -> list[Row]:
        rows: list[Row] = []
        for size in sizes:
            at = f"@{_fmt_n(size)}"
            sums = [s for b in backends if (s := self.summary(b, size)) is not None]
            for figure, fmt in _FIGURES:
                rows += [Row(f"{figure} {at}", s.backend, fmt.format(s=s)) for s in sums]
            for s in sums:
                rows += _checkpoint_rows(s, at)
            ref = self.summary(REFERENCE, size)
            if ref is None:
                continue
            for s in sums:
                if s.backend == REFERENCE:
                    continue
                ratios = [s.p50 / ref.p50, s.p90 / ref.p90, s.load_s / ref.load_s, s.disk_mb / ref.disk_mb]
                ratios += [s.lookup_us / ref.lookup_us, s.rss_peak_mb / ref.rss_peak_mb]
                rows.append(
                    Row(
                        f"vs {REFERENCE}: p50 / p90 / load / disk / lookup / peak RSS {at}",
                        s.backend,
                        " / ".join(f"x{x:.2f}" for x in ratios),
                    )
                )
        return rows


def _sizes(text: str) -> list[int]:
    sizes = [int(s.replace("_", "")) for s in text.split(",") if s.strip()]
    if any(s < 10_000 for s in sizes):
        raise argparse.ArgumentTypeError("sizes must be at least 10000 keys")
    return sizes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="100k keys only, one run (seconds)")
    parser.add_argument(
        "--sizes", type=_sizes, default=list(DEFAULT_SIZES), help="state sizes in keys, comma-separated"
    )
    parser.add_argument("--batches", type=int, default=20, help="timed batches per run (default 20)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed batches first (default 10)")
    parser.add_argument("--runs", type=int, default=3, help="fresh-process runs per case, interleaved (default 3)")
    parser.add_argument(
        "--backends", default=",".join(ALL_BACKENDS), help="comma-separated subset of " + ",".join(ALL_BACKENDS)
    )
    parser.add_argument("--sqlite-journal", choices=["off", "wal"], default="off")
    parser.add_argument(
        "--cache-mb", type=int, default=DEFAULT_CACHE_MB, help="RocksDB block cache and SQLite page cache (MB)"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sizes: list[int] = list(QUICK_SIZES) if args.quick else args.sizes
    n_runs: int = 1 if args.quick else args.runs
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(ALL_BACKENDS)
    if unknown:
        parser.error(f"unknown backends: {', '.join(sorted(unknown))}")

    report = Report()
    if "lmdb" in backends and importlib.util.find_spec("lmdb") is None:
        backends.remove("lmdb")
        report.notes.append("lmdb SKIPPED: the `lmdb` package is not installed (pip install lmdb)")
        progress("lmdb is not installed: skipping it")

    load_before = os.getloadavg()
    t0 = now_ns()
    with tempfile.TemporaryDirectory(prefix="laminar-bench-statestore-") as tmp:
        for size in sizes:
            for run in range(n_runs):
                for backend in backends:
                    progress(f"{backend} @ {_fmt_n(size)} keys, run {run + 1}/{n_runs}")
                    case = Case(
                        backend=backend,
                        size=size,
                        batches=args.batches,
                        warmup=args.warmup,
                        seed=args.seed,
                        workdir=tmp,
                        sqlite_journal=args.sqlite_journal,
                        cache_mb=args.cache_mb,
                        run=run,
                    )
                    try:
                        report.add(_run_isolated(case))
                    except Exception as exc:  # one broken backend must not cost the others' figures
                        report.notes.append(f"{backend} @ {_fmt_n(size)} run {run + 1} FAILED: {exc!r}")
                        progress(f"{backend} @ {_fmt_n(size)} failed: {exc!r}")
    elapsed = (now_ns() - t0) / 1e9

    report.notes += [
        f"batch = multi-get {EXISTING_PER_BATCH} random existing + {NEW_PER_BATCH} new keys, decode, merge, "
        f"encode, one write batch; {args.batches} timed after {args.warmup} warm-up batches, per run",
        f"{n_runs} run(s) per (backend, size), each in a fresh spawned process, backends interleaved; batch "
        "samples pooled over runs, other figures are medians over runs",
        f"keys 10 bytes, values {RECORD_BYTES}-byte records; the state grows by {NEW_PER_BATCH} keys a batch",
    ]
    backend_notes = {
        "rocksdict": f"rocksdict: WAL off, bloom 10 bits/key, {args.cache_mb} MB block cache, default write buffer; "
        "load = write batches + flush + full compaction (all counted in load)",
        "lmdb": "lmdb: sync/metasync off, mmap'd: its RSS counts the file pages it touched (reclaimable page cache)",
        "sqlite": f"sqlite {sqlite3.sqlite_version}: synchronous=OFF, journal_mode={args.sqlite_journal.upper()}, "
        f"EXCLUSIVE locking, {args.cache_mb} MB page cache, WITHOUT ROWID",
    }
    report.notes += [backend_notes[b] for b in backends]
    report.notes += [
        f"point lookup = median over rounds of the mean of {LOOKUPS_PER_ROUND} single-key gets "
        "(lmdb: one read txn per round)",
        "cold open: the page cache is warm (the copy was just written); a real restore also downloads",
    ]
    title = run_title("laminar state-store benchmark", args.quick, load_before)
    publish(format_table(report.rows(backends, sizes), title, report.notes), elapsed, "statestore.txt")


if __name__ == "__main__":
    main()
