"""Foundation benchmarks: the fencing hot path, ledger reads and writes, split-brain contention.

Run from the repository root::

    python -m benchmarks.bench_foundation           # full, ~1.5 minutes
    python -m benchmarks.bench_foundation --quick   # fewer runs and rounds, < 1 minute
    python -m benchmarks.bench_foundation --no-s3   # local store only

Figures (each printed next to its target, with whether it was met; nothing asserts):

1. ``PartitionGuard.check()`` ns/call, raw and net of the loop's own overhead;
2. ``PartitionGuardSet.check(p)`` ns/call with 1000 guards in the set;
3. ``PartitionGuardSet.refresh_all`` for 1000 partitions (local; S3 for information);
4. ``Ledger.acquire`` / ``Ledger.fence`` and raw compare-and-swap latency, p50/p99;
5. 8 processes racing ``Ledger.fence`` for one partition: rounds with exactly one winner.

The S3 figures come from moto's server (one request at a time) on loopback (the one the
tests use): they show protocol round trips, not AWS latency.
The table is also written to ``benchmarks/results/foundation.txt``.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import multiprocessing
import os
import random
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.synchronize import Barrier
from pathlib import Path

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.fencing import PartitionGuard, PartitionGuardSet
from laminar_orchestration.protocol.ledger import EpochConflict, Ledger
from laminar_orchestration.store import LocalObjectStore, ObjectStore

from .common import (
    Latency,
    Row,
    StoreSpec,
    format_table,
    median,
    now_ns,
    progress,
    publish,
    run_title,
    runs,
    start_s3_server,
    time_ns,
    verdict,
)

NODE = NodeId(1)
CONTENDERS = 8

# Targets.
CHECK_TARGET_NS = 50.0
SET_CHECK_TARGET_NS = 100.0
REFRESH_TARGET_MS = 10.0
LOCAL_CAS_P50_TARGET_MS = 2.0

LOCAL = "local"
S3 = "s3/moto"


@dataclass(frozen=True)
class StoreWork:
    """How much work the store figures (3 to 5) do on one backend."""

    partitions: int
    refresh_runs: int
    fence_n: int
    cas_n: int
    race_rounds: int


@dataclass(frozen=True)
class Params:
    """How much work each figure does; `--quick` scales it down."""

    micro_runs: int
    micro_calls: int
    acquire_samples: int
    local: StoreWork
    s3: StoreWork


FULL = Params(
    micro_runs=7,
    micro_calls=1_000_000,
    acquire_samples=300,
    local=StoreWork(partitions=1000, refresh_runs=9, fence_n=500, cas_n=1000, race_rounds=500),
    s3=StoreWork(partitions=300, refresh_runs=3, fence_n=100, cas_n=200, race_rounds=30),
)
QUICK = replace(
    FULL,
    micro_runs=5,
    acquire_samples=100,
    local=StoreWork(partitions=1000, refresh_runs=5, fence_n=200, cas_n=300, race_rounds=100),
    s3=StoreWork(partitions=60, refresh_runs=2, fence_n=30, cas_n=50, race_rounds=8),
)


@dataclass
class Report:
    """Rows grouped by figure number (printed in that order, whatever order they ran in), and notes."""

    rows: dict[int, list[Row]] = field(default_factory=lambda: {i: [] for i in range(1, 6)})
    notes: list[tuple[int, str]] = field(default_factory=list)

    def add(self, figure: int, *rows: Row) -> None:
        self.rows[figure].extend(rows)

    def note(self, figure: int, text: str) -> None:
        self.notes.append((figure, text))

    def table(self, title: str) -> str:
        rows = [r for i in sorted(self.rows) for r in self.rows[i]]
        notes = [text for _, text in sorted(self.notes, key=lambda n: n[0])]  # stable: run order within
        return format_table(rows, title, notes)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


# --- 1 and 2: the hot-path checks -------------------------------------------------------


def _loop_empty(n: int) -> int:
    rep = itertools.repeat(None, n)
    t0 = now_ns()
    for _ in rep:
        pass
    return now_ns() - t0


def _loop_check(guard: PartitionGuard, n: int) -> int:
    rep = itertools.repeat(None, n)
    t0 = now_ns()
    for _ in rep:
        guard.check()  # attribute lookup + call, as at a real call site
    return now_ns() - t0


def _loop_check_bound(guard: PartitionGuard, n: int) -> int:
    check = guard.check
    rep = itertools.repeat(None, n)
    t0 = now_ns()
    for _ in rep:
        check()
    return now_ns() - t0


def _loop_ids_empty(ids: list[PartitionId]) -> int:
    t0 = now_ns()
    for _p in ids:
        pass
    return now_ns() - t0


def _loop_set_check(guards: PartitionGuardSet, ids: list[PartitionId]) -> int:
    t0 = now_ns()
    for p in ids:
        guards.check(p)
    return now_ns() - t0


def _per_call(n_runs: int, n: int, empty: Callable[[], int], body: Callable[[], int]) -> tuple[float, float, float]:
    """(raw, empty-loop, net) ns per iteration: medians over `n_runs` runs, both loops in each run."""
    raws: list[float] = []
    empties: list[float] = []
    nets: list[float] = []
    for _ in range(n_runs):
        e = empty() / n
        r = body() / n
        raws.append(r)
        empties.append(e)
        nets.append(r - e)
    return median(raws), median(empties), median(nets)


def bench_check(report: Report, guard: PartitionGuard, p: Params) -> None:
    n = p.micro_calls
    raw, empty, net = _per_call(p.micro_runs, n, lambda: _loop_empty(n), lambda: _loop_check(guard, n))
    bound_raw, _, bound_net = _per_call(p.micro_runs, n, lambda: _loop_empty(n), lambda: _loop_check_bound(guard, n))
    target = f"<= {CHECK_TARGET_NS:.0f} ns"
    report.add(
        1,
        Row("1. guard.check() raw", "-", f"{raw:.1f} ns", target, verdict(raw, CHECK_TARGET_NS)),
        Row("1. empty loop overhead", "-", f"{empty:.1f} ns", "-", "info"),
        Row("1. guard.check() net of loop", "-", f"{net:.1f} ns", target, verdict(net, CHECK_TARGET_NS)),
        Row("1. check = guard.check; check() raw", "-", f"{bound_raw:.1f} ns", "-", "info"),
        Row("1. check = guard.check; check() net", "-", f"{bound_net:.1f} ns", "-", "info"),
    )
    report.note(1, f"1, 2: median of {p.micro_runs} runs of {n:,} calls; each run times the empty loop too")


def bench_set_check(report: Report, guards: PartitionGuardSet, p: Params) -> None:
    rng = random.Random(42)
    ids = rng.choices(list(guards.partition_ids()), k=p.micro_calls)
    n = len(ids)
    raw, empty, net = _per_call(p.micro_runs, n, lambda: _loop_ids_empty(ids), lambda: _loop_set_check(guards, ids))
    target = f"<= {SET_CHECK_TARGET_NS:.0f} ns"
    report.add(
        2,
        Row(
            f"2. guard_set.check(p), {len(guards)} guards, raw",
            "-",
            f"{raw:.1f} ns",
            target,
            verdict(raw, SET_CHECK_TARGET_NS),
        ),
        Row("2. empty loop over the id list", "-", f"{empty:.1f} ns", "-", "info"),
        Row(
            "2. guard_set.check(p) net of loop",
            "-",
            f"{net:.1f} ns",
            target,
            verdict(net, SET_CHECK_TARGET_NS),
        ),
    )


# --- 3 and 4: a cluster whose partitions node 1 acquires --------------------------------


@dataclass
class Cluster:
    ledger: Ledger
    guards: PartitionGuardSet
    acquire: Latency


def build_cluster(store: ObjectStore, partitions: int, samples: int, setup_store: ObjectStore | None = None) -> Cluster:
    """`partitions` partitions, each acquired by node 1 with a real graceful `Ledger.acquire`.

    The first `samples` acquisitions go through `store` and are timed. Cluster
    creation and the other acquisitions go through `setup_store` if given (the
    same directory without fsync: same files, faster setup).
    """
    ledger = Ledger(store)
    setup = Ledger(setup_store) if setup_store is not None else ledger
    setup.init_cluster(partitions)
    guards = PartitionGuardSet(NODE)
    timed: list[int] = []
    for pid in ledger.partitions():
        by = ledger if pid < samples else setup
        t0 = now_ns()
        token = by.acquire(pid, NODE, expected_epoch=0, reason="bench")
        if pid < samples:
            timed.append(now_ns() - t0)
        guards.insert(PartitionGuard(token))
    return Cluster(ledger, guards, Latency.of(timed))


def bench_refresh(report: Report, cluster: Cluster, n_runs: int, backend: str) -> None:
    guards, ledger = cluster.guards, cluster.ledger
    revoked = guards.refresh_all(ledger)  # warm-up, and a sanity check: nothing is revoked
    med = median(runs(lambda: time_ns(lambda: guards.refresh_all(ledger)), n_runs))
    n = len(guards)
    detail = f"median of {n_runs}, {med / n / 1e3:.1f} us/partition"
    if backend == LOCAL:
        report.add(
            3,
            Row(
                f"3. refresh_all, {n} partitions",
                backend,
                _ms(med),
                f"<= {REFRESH_TARGET_MS:.0f} ms",
                verdict(med / 1e6, REFRESH_TARGET_MS),
            ),
        )
    else:
        report.add(3, Row(f"3. refresh_all, {n} partitions", backend, _ms(med), "-", "info"))
        if n != 1000:
            report.add(
                3,
                Row("3. refresh_all, 1000 partitions (linear est.)", backend, _ms(med * 1000 / n), "-", "info"),
            )
    report.note(
        3,
        f"3 ({backend}): {detail}; {len(revoked)} revoked; read parallelism "
        f"{'1 (serial)' if backend == LOCAL else '16 threads'}",
    )


def _latency_rows(figure: str, backend: str, lat: Latency, target_p50_ms: float | None = None) -> list[Row]:
    p50_target, p50_verdict = "-", "info"
    if target_p50_ms is not None:
        p50_target = f"<= {target_p50_ms:g} ms"
        p50_verdict = verdict(lat.p50 / 1e6, target_p50_ms)
    return [
        Row(f"{figure} p50 (n={lat.n})", backend, _ms(lat.p50), p50_target, p50_verdict),
        Row(f"{figure} p99", backend, _ms(lat.p99), "-", "info"),
    ]


def bench_fence(store: ObjectStore, n: int) -> Latency:
    """`Ledger.fence` of one partition on successive epochs: ownership read, grant create, head CAS."""
    ledger = Ledger(store)
    ledger.init_cluster(1)
    pid = PartitionId(0)
    samples: list[int] = []
    for epoch in range(n):
        t0 = now_ns()
        ledger.fence(pid, NodeId(1 + epoch % 2), expected_epoch=epoch, reason="bench")
        samples.append(now_ns() - t0)
    return Latency.of(samples)


def bench_cas(store: ObjectStore, n: int) -> tuple[Latency, Latency]:
    """Read-modify-write of one key: (put_if_match alone, the whole get + put_if_match cycle)."""
    key = f"bench/cas-{uuid.uuid4().hex}"
    store.put_if_absent(key, b"0")
    cas: list[int] = []
    cycle: list[int] = []
    for i in range(n):
        t0 = now_ns()
        obj = store.get(key)
        data = f"{i} {uuid.uuid4().hex}".encode()  # unique payloads: no ABA on S3's MD5 ETags
        t1 = now_ns()
        store.put_if_match(key, data, obj.etag)
        t2 = now_ns()
        cas.append(t2 - t1)
        cycle.append(t2 - t0)
    return Latency.of(cas), Latency.of(cycle)


def bench_latencies(report: Report, spec: StoreSpec, fence_n: int, cas_n: int, backend: str) -> None:
    store = spec.open()
    fence = bench_fence(store, fence_n)
    cas, cycle = bench_cas(store, cas_n)
    local = spec.kind == "local"
    report.add(
        4,
        *_latency_rows("4. Ledger.fence, successive epochs", backend, fence),
        *_latency_rows("4. raw CAS put_if_match", backend, cas, LOCAL_CAS_P50_TARGET_MS if local else None),
        Row("4. raw CAS get + put_if_match cycle p50", backend, _ms(cycle.p50), "-", "info"),
    )
    if local:
        # The same directory without fsync: how much of a CAS the two fsyncs are.
        cas_nf, _ = bench_cas(LocalObjectStore(spec.path, fsync=False), cas_n)
        report.add(4, Row("4. raw CAS put_if_match p50, fsync OFF", backend, _ms(cas_nf.p50), "-", "info"))
    store.close()


# --- 5: split-brain contention --------------------------------------------------------------

WON, LOST, ERROR = 1, 2, 3


def _contender(
    spec: StoreSpec,
    index: int,
    rounds: int,
    barrier: Barrier,
    outcomes: ctypes.Array[ctypes.c_int8],
    epochs: ctypes.Array[ctypes.c_int64],
    clock: ctypes.Array[ctypes.c_int64],
    errors: ctypes.Array[ctypes.c_int64],
) -> None:
    """One racer. Each round: read the epoch, wait for all, race `fence`, record, wait for all."""
    store = spec.open()
    ledger = Ledger(store)
    node = NodeId(index + 1)
    pid = PartitionId(0)
    barrier.wait()  # every contender has its store open
    if index == 0:
        clock[0] = now_ns()
    for r in range(rounds):
        # Between the previous round's closing barrier and this round's opening one
        # nobody writes, so every contender reads the same epoch.
        current = ledger.ownership(pid)
        expected = current.epoch if current is not None else -1
        slot = r * CONTENDERS + index
        epochs[slot] = expected
        barrier.wait()
        try:
            token = ledger.fence(pid, node, expected_epoch=expected, reason=f"race {r}")
            outcomes[slot] = WON if token is not None and token.epoch == expected + 1 else ERROR
        except EpochConflict:
            outcomes[slot] = LOST
        except Exception:
            outcomes[slot] = ERROR
            errors[index] += 1
        barrier.wait()
    if index == 0:
        clock[1] = now_ns()
    store.close()


def bench_race(report: Report, spec: StoreSpec, rounds: int, backend: str) -> None:
    store = spec.open()
    ledger = Ledger(store)
    ledger.init_cluster(1)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(CONTENDERS, timeout=120)
    outcomes = ctx.RawArray(ctypes.c_int8, rounds * CONTENDERS)
    epochs = ctx.RawArray(ctypes.c_int64, rounds * CONTENDERS)
    clock = ctx.RawArray(ctypes.c_int64, 2)
    errors = ctx.RawArray(ctypes.c_int64, CONTENDERS)
    procs = [
        ctx.Process(
            target=_contender,
            args=(spec, i, rounds, barrier, outcomes, epochs, clock, errors),
            name=f"contender-{i + 1}",
        )
        for i in range(CONTENDERS)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)
        if proc.is_alive():
            proc.kill()
            proc.join()
    exit_codes = sorted({proc.exitcode for proc in procs}, key=str)

    one_winner = same_epoch = grants_match = 0
    for r in range(rounds):
        row = [outcomes[r * CONTENDERS + i] for i in range(CONTENDERS)]
        seen = {epochs[r * CONTENDERS + i] for i in range(CONTENDERS)}
        winners = [i for i, o in enumerate(row) if o == WON]
        same_epoch += len(seen) == 1
        if len(winners) == 1 and row.count(LOST) == CONTENDERS - 1:
            one_winner += 1
            # Cross-check with the ledger: the grant of that round's epoch names the winner.
            grant = ledger.grant(PartitionId(0), min(seen) + 1)
            grants_match += grant is not None and grant.node == winners[0] + 1
    final = ledger.ownership(PartitionId(0))
    final_epoch = final.epoch if final is not None else -1
    elapsed_s = (clock[1] - clock[0]) / 1e9 if clock[1] > clock[0] else float("nan")
    store.close()

    ok = one_winner == rounds == same_epoch == grants_match == final_epoch
    report.add(
        5,
        Row(
            f"5. race: rounds with exactly 1 winner of {CONTENDERS}",
            backend,
            f"{one_winner}/{rounds}",
            f"{rounds}/{rounds}",
            "met" if ok else "MISSED",
        ),
        Row("5. race: rounds/s", backend, f"{rounds / elapsed_s:.1f}/s", "-", "info"),
    )
    report.note(
        5,
        f"5 ({backend}): {CONTENDERS} spawned processes, {rounds} rounds in {elapsed_s:.2f} s; "
        f"same expected epoch in {same_epoch}/{rounds} rounds; ledger grant names the winner in "
        f"{grants_match}/{rounds}; final epoch {final_epoch}; contender errors {sum(errors)}; "
        f"exit codes {exit_codes}",
    )


# --- driver ---------------------------------------------------------------------------------


def run_local(report: Report, p: Params, workdir: Path) -> None:
    progress(f"local: cluster of {p.local.partitions} partitions, acquired by node {NODE}")
    path = str(workdir / "cluster")
    cluster = build_cluster(
        LocalObjectStore(path), p.local.partitions, p.acquire_samples, LocalObjectStore(path, fsync=False)
    )
    report.add(4, *_latency_rows("4. Ledger.acquire, graceful, epoch 0->1", LOCAL, cluster.acquire))
    report.note(
        4,
        f"4 (local): acquire timed on the first {p.acquire_samples} partitions; cluster setup and "
        f"the other acquisitions used the same directory with fsync off",
    )
    progress("1. guard.check()")
    first = cluster.guards.get(PartitionId(0))
    assert first is not None
    bench_check(report, first, p)
    progress("2. guard_set.check(p)")
    bench_set_check(report, cluster.guards, p)
    progress("3. refresh_all (local)")
    bench_refresh(report, cluster, p.local.refresh_runs, LOCAL)
    progress("4. fence / CAS latency (local)")
    bench_latencies(report, StoreSpec("local", str(workdir / "latency")), p.local.fence_n, p.local.cas_n, LOCAL)
    progress(f"5. race, {p.local.race_rounds} rounds (local)")
    bench_race(report, StoreSpec("local", str(workdir / "race")), p.local.race_rounds, LOCAL)


def run_s3(report: Report, p: Params) -> None:
    progress("starting the moto S3 server")
    with start_s3_server() as endpoint:
        from laminar_orchestration.store.s3 import make_s3_client

        client = make_s3_client(endpoint)
        bucket = f"laminar-bench-{uuid.uuid4().hex[:16]}"
        client.create_bucket(Bucket=bucket)
        client.close()

        def spec(prefix: str) -> StoreSpec:
            return StoreSpec("s3", endpoint=endpoint, bucket=bucket, prefix=prefix)

        progress(f"s3: cluster of {p.s3.partitions} partitions")
        cluster = build_cluster(spec("cluster").open(), p.s3.partitions, p.s3.partitions)
        report.add(4, *_latency_rows("4. Ledger.acquire, graceful, epoch 0->1", S3, cluster.acquire))
        progress("3. refresh_all (s3)")
        bench_refresh(report, cluster, p.s3.refresh_runs, S3)
        cluster.ledger.store.close()
        progress("4. fence / CAS latency (s3)")
        bench_latencies(report, spec("latency"), p.s3.fence_n, p.s3.cas_n, S3)
        progress(f"5. race, {p.s3.race_rounds} rounds (s3)")
        bench_race(report, spec("race"), p.s3.race_rounds, S3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs and rounds (< 1 minute)")
    parser.add_argument("--no-s3", action="store_true", help="skip the moto S3 backend")
    args = parser.parse_args(argv)
    p = QUICK if args.quick else FULL

    load_before = os.getloadavg()
    t0 = now_ns()
    report = Report()
    with tempfile.TemporaryDirectory(prefix="laminar-bench-") as tmp:
        run_local(report, p, Path(tmp))
    if not args.no_s3:
        run_s3(report, p)
    report.note(6, "S3 = moto's server (one request at a time) on loopback (laminar_dev/s3server.py): not AWS latency")
    elapsed = (now_ns() - t0) / 1e9

    publish(report.table(run_title("laminar foundation benchmark", args.quick, load_before)), elapsed, "foundation.txt")


if __name__ == "__main__":
    main()
