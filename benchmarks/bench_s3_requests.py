"""CPU and wall time of each S3 request: in our boto3 client and in the test suite's S3 server.

Run from the repository root::

    python -m benchmarks.bench_s3_requests                  # 5 runs of 210 requests per operation
    python -m benchmarks.bench_s3_requests --runs 3 --requests 105

Two S3 servers (`laminar_dev.s3server`) run side by side on loopback: one with
the server's per-request speed-ups switched off (``LAMINAR_S3SERVER_SPEEDUPS=0``,
"before") and one as the tests run it ("after"). The "after" store is opened
the way the product opens it (`open_store("s3://bucket/prefix")` with
``AWS_ENDPOINT_URL`` set); the "before" store is the same `RetryingStore` over
`S3ObjectStore` but on a boto3 client built with botocore's defaults (what
`make_s3_client` configured before: every body checksummed, parameters
validated, timestamps read by dateutil). Runs alternate between the two so machine load hits both alike.

Each run times the protocol's requests one kind at a time (conditional create,
conditional replace, GET of an existing key, GET and HEAD of a missing key,
LIST of a prefix of 10 keys, conditional DELETE), then a mix of all seven in
turn. Per request: the client's CPU (``time.process_time`` of this process),
the server's CPU (utime + stime of its process from ``/proc``, 10 ms ticks:
hence blocks of a couple of hundred requests) and the wall time. Figures are
medians over the runs.

The table is also written to ``benchmarks/results/s3_requests.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.config import Config

from laminar_dev.s3server import SPEEDUPS_ENV, start_s3_server
from laminar_orchestration.store import ObjectNotFound, ObjectStore, open_store
from laminar_orchestration.store.retry import RetryingStore
from laminar_orchestration.store.s3 import S3ObjectStore

from .common import Row, TableReport, median, progress

BUCKET = "laminar-bench-s3"
PREFIX = "bench"
#: Keys under the prefix the LIST requests read.
LISTED_KEYS = 10
PAYLOAD = b"x" * 600  # about a lease or a manifest
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _server_cpu_s(pid: int) -> float:
    """utime + stime of process `pid`, in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def _server_pid(endpoint: str) -> int:
    """The pid of this process's S3 server child listening at `endpoint`."""
    port = endpoint.rsplit(":", 1)[1]
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if int(stat[stat.rfind(")") + 2 :].split()[1]) == me and b"laminar_dev.s3server" in cmdline:
                port_file = Path(cmdline[cmdline.index(b"--port-file") + 1].decode())
                if port_file.read_text().strip() == port:
                    return int(entry)
    raise RuntimeError(f"no S3 server child of this process serves {endpoint}")


def _client_as_before(endpoint: str) -> object:
    """A boto3 client configured as `make_s3_client` was before its per-request savings."""
    config = Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=5.0,
        read_timeout=30.0,
        max_pool_connections=32,
        s3={"addressing_style": "path"},
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)


@dataclass(frozen=True)
class Cost:
    """What one request costs, in milliseconds."""

    client_cpu_ms: float
    server_cpu_ms: float
    wall_ms: float


@dataclass
class Setup:
    """One side of the comparison: a server, its pid, and a store on it."""

    name: str
    store: ObjectStore
    server_pid: int

    def measure(self, requests: int, op: Callable[[int], object]) -> Cost:
        """Call `op(i)` for i in 0..requests-1 (one S3 request each); the cost of one."""
        server0, cpu0, wall0 = _server_cpu_s(self.server_pid), time.process_time(), time.perf_counter()
        for i in range(requests):
            op(i)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        server = _server_cpu_s(self.server_pid) - server0
        return Cost(1e3 * cpu / requests, 1e3 * server / requests, 1e3 * wall / requests)


def _get_missing(store: ObjectStore, key: str) -> None:
    try:
        store.get(key)
    except ObjectNotFound:
        return
    raise AssertionError(f"{key} should not exist")


#: The operations, in the order one run times them (each one S3 request).
OPERATIONS = (
    "create (If-None-Match)",
    "GET existing",
    "replace (If-Match)",
    "GET missing (404)",
    "HEAD missing (404)",
    "LIST 10 keys",
    "DELETE (If-Match)",
)
MIX = "mix of all seven"


def one_run(setup: Setup, run: int, requests: int) -> dict[str, Cost]:
    """Time each operation over `requests` requests, then the mix; cost per request by operation."""
    store, etags = setup.store, {}
    key = f"run{run}/key".__add__

    def create(i: int) -> None:
        etags[i] = store.put_if_absent(key(f"{i:05d}"), PAYLOAD, {"writer": "bench"})

    def replace(i: int) -> None:
        etags[i] = store.put_if_match(key(f"{i:05d}"), PAYLOAD + b"%d" % i, etags[i], {"writer": "bench"})

    def delete(i: int) -> None:
        store.delete_if_match(key(f"{i:05d}"), etags.pop(i))

    steps: dict[str, Callable[[int], object]] = {
        "create (If-None-Match)": create,
        "GET existing": lambda i: store.get(key(f"{i:05d}")),
        "replace (If-Match)": replace,
        "GET missing (404)": lambda i: _get_missing(store, key(f"missing{i}")),
        "HEAD missing (404)": lambda i: store.head(key(f"missing{i}")),
        "LIST 10 keys": lambda i: store.list("listed/"),
        "DELETE (If-Match)": delete,
    }
    costs = {name: setup.measure(requests, steps[name]) for name in OPERATIONS}
    offset = requests  # fresh keys for the mix

    def mixed(i: int) -> None:
        rounds, step = divmod(i, len(OPERATIONS))
        steps[OPERATIONS[step]](offset + rounds)

    costs[MIX] = setup.measure(requests - requests % len(OPERATIONS), mixed)
    return costs


@contextlib.contextmanager
def _setups(workdir: Path) -> Iterator[list[Setup]]:
    """The "before" and "after" servers and stores, buckets created and the listed keys written."""
    with contextlib.ExitStack() as stack:
        os.environ[SPEEDUPS_ENV] = "0"
        try:
            before_url = stack.enter_context(start_s3_server(workdir / "before"))
        finally:
            del os.environ[SPEEDUPS_ENV]
        after_url = stack.enter_context(start_s3_server(workdir / "after"))
        before_client = _client_as_before(before_url)
        before_client.create_bucket(Bucket=BUCKET)  # type: ignore[attr-defined]
        before = RetryingStore(S3ObjectStore(BUCKET, PREFIX, client=before_client))  # type: ignore[arg-type]
        os.environ["AWS_ENDPOINT_URL"] = after_url  # restored by start_s3_server's environment
        after = open_store(f"s3://{BUCKET}/{PREFIX}")
        boto3.session.Session().client("s3", endpoint_url=after_url).create_bucket(Bucket=BUCKET)
        setups = [Setup("before", before, _server_pid(before_url)), Setup("after", after, _server_pid(after_url))]
        for setup in setups:
            stack.callback(setup.store.close)
            for i in range(LISTED_KEYS):
                setup.store.put_if_absent(f"listed/{i:02d}", PAYLOAD)
            one_run(setup, -1, 14)  # warm up both sides: imports, connection pools, moto's lazy tables
        yield setups


def _ms(value: float) -> str:
    return f"{value:.2f} ms"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per side (figures are medians)")
    parser.add_argument("--requests", type=int, default=210, help="requests per operation per run")
    args = parser.parse_args(argv)
    started, load_before = time.perf_counter(), os.getloadavg()
    results: dict[str, dict[str, list[Cost]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory(prefix="laminar-bench-s3req-") as tmp, _setups(Path(tmp)) as setups:
        for run in range(args.runs):
            for setup in setups if run % 2 == 0 else reversed(setups):
                progress(f"run {run + 1}/{args.runs}: {setup.name}")
                for name, cost in one_run(setup, run, args.requests).items():
                    results[setup.name].setdefault(name, []).append(cost)
    report = TableReport()
    for name in (*OPERATIONS, MIX):
        for label, field in (("client CPU", "client_cpu_ms"), ("server CPU", "server_cpu_ms"), ("wall", "wall_ms")):
            before, after = (median([getattr(c, field) for c in results[side][name]]) for side in ("before", "after"))
            ratio = f"after/before x{after / before:.2f}" if before > 0 else "-"
            report.rows.append(Row(f"{name}: {label} per request", "before", _ms(before)))
            report.rows.append(Row(f"{name}: {label} per request", "after", _ms(after), verdict=ratio))
    report.note(
        "before: server with LAMINAR_S3SERVER_SPEEDUPS=0; client with botocore's default checksums, parameter"
        " validation and timestamp parser"
    )
    report.note("after: the server as the tests run it, the store from open_store (make_s3_client)")
    report.note(f"median of {args.runs} runs, {args.requests} requests per operation per run; sides alternate")
    report.note("server CPU is read in 10 ms ticks from /proc: +-10 ms over a block of requests")
    report.publish("S3 request cost", False, load_before, time.perf_counter() - started, "s3_requests.txt")


if __name__ == "__main__":
    main()
