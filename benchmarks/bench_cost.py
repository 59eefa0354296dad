"""What a cluster costs in store requests, counted the way S3 bills them, from the server's own log.

    python -m benchmarks.bench_cost [--only demo-idle,demo-load,shipped-idle,shipped-load,
                                     shipped-dagster-idle,scale] [--window S]
                                    [--scale-partitions 1000] [--scale-nodes 10]

Against the S3-protocol server on loopback (`laminar_dev.s3server`):

* **demo shape, idle**: 3 nodes, 4 partitions placed by `laminar rebalance`, no events;
* **demo shape, loaded**: the same with the demo's producer appending 200 events/s
  (its requests count too), and the steady lag behind the log;
* **the demo as shipped** (`shipped-*`): `laminar demo` itself, its Spark nodes, its viewer (status
  tables and phase lines) and the output table at its default interval, idle and at 200 events/s
  with ``--no-dagster``, and idle with its Dagster webserver and daemon;
* **scale**: 1,000 partitions on 10 nodes, idle; the idle rate of one node at 10 and at
  1,000 partitions; one graceful migration from launch to Active; a node holding about
  100 partitions killed with SIGKILL, then `laminar failover` until every one of its
  partitions is active elsewhere; then the Dagster daemon started on the same store and another
  node killed, its partitions failed over by the node-failure sensor (`--no-dagster` skips it).

Nodes are the real node runtime with a pyarrow fold instead of Spark
(`python -m laminar_dev.arrownode --node-defaults`, so their timing is `laminar node
run`'s): a node's requests do not depend on what aggregates its batches. Every figure
is a rate over a steady window, printed by method and key family, with the monthly
cost at S3 list prices (PUT/LIST $0.005 and GET/HEAD $0.0004 per 1,000).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from benchmarks.common import REPO_ROOT, Row, format_table, progress, verdict, write_result
from laminar_dev.localcluster import stop_processes
from laminar_dev.s3server import start_s3_server
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.ops.demo_processes import Producer
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.tasks import MigrationKind, MigrationPhase
from laminar_orchestration.store import open_store
from laminar_orchestration.store.metering import RequestPrices, key_family

BUCKET = "laminar-cost"
#: How many times the loaded run reads the worst partition's lag.
LAG_SAMPLES = 9
PYTHON = sys.executable
_LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)?(GET|PUT|HEAD|DELETE|POST) (/\S*) HTTP')


@dataclass(frozen=True)
class Window:
    """Requests the server logged over `seconds`, by method and by "METHOD family"."""

    seconds: float
    methods: Counter[str]
    families: Counter[str]

    @property
    def rate(self) -> float:
        return sum(self.methods.values()) / self.seconds

    def rates(self) -> dict[str, float]:
        return {m: n / self.seconds for m, n in self.methods.items()}

    def monthly(self) -> float:
        return RequestPrices().monthly_cost(self.rates())

    def share(self, prefix: str) -> float:
        """The fraction of the requests on keys under `prefix` (e.g. the output table's ``tables/``)."""
        total = sum(self.families.values())
        return sum(n for k, n in self.families.items() if k.split(" ", 1)[-1].startswith(prefix)) / total

    def busiest(self, top: int = 14) -> str:
        return ", ".join(f"{k} {n / self.seconds:.1f}/s" for k, n in self.families.most_common(top))


class ServerLog:
    """The S3-protocol server's request log, read from an offset: each line is one billed request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def mark(self) -> None:
        self._offset = self.path.stat().st_size

    def since_mark(self, seconds: float) -> Window:
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            text = fh.read().decode(errors="replace")
        methods: Counter[str] = Counter()
        families: Counter[str] = Counter()
        for match in _LINE.finditer(text):
            verb, path = match.groups()
            target, _, query = path.partition("?")
            # /bucket/prefix/key...: the store's key starts after the store's prefix.
            key = target.split("/", 3)[3] if target.count("/") >= 3 else ""
            method = "LIST" if verb == "GET" and "list-type" in query else verb
            methods[method] += 1
            families[f"{method} {key_family(key)}"] += 1
        return Window(seconds, methods, families)


class Cluster:
    """A store on the S3 server, and node processes with their own logs."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.workdir = workdir
        self.nodes: dict[int, subprocess.Popen[bytes]] = {}

    def laminar(self, *args: str, timeout: float = 600) -> str:
        done = subprocess.run(
            [PYTHON, "-m", "laminar_orchestration.cli", *args, "--store", self.url],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO_ROOT,
        )
        if done.returncode != 0:
            out = (done.stdout + done.stderr)[-2000:]
            raise RuntimeError(f"laminar {' '.join(args)} failed ({done.returncode}): {out}")
        return done.stdout

    def laminar_timed(self, *args: str, timeout: float = 600) -> tuple[list[tuple[float, str]], int]:
        """Run a `laminar` command, each line of its output with when it was printed (monotonic); the
        lines and the exit code."""
        proc = subprocess.Popen(
            [PYTHON, "-m", "laminar_orchestration.cli", *args, "--store", self.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO_ROOT,
        )
        assert proc.stdout is not None
        lines = [(time.monotonic(), line.rstrip("\n")) for line in proc.stdout]
        return lines, proc.wait(timeout)

    def start_node(self, node: int) -> None:
        log = open(self.workdir / f"node{node}.log", "wb")  # noqa: SIM115 - closed with the process
        self.nodes[node] = subprocess.Popen(
            [PYTHON, "-m", "laminar_dev.arrownode", "--store", self.url, "--node-id", str(node), "--node-defaults"],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
        )

    def status(self) -> Any:  # `laminar status --json`, parsed
        return json.loads(self.laminar("status", "--json"))

    def wait(self, what: str, ready: Callable[[], bool], timeout: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            with contextlib.suppress(RuntimeError):  # one failed `laminar status` (a busy store): ask again
                if ready():
                    return time.monotonic() - started
            time.sleep(0.25)
        raise TimeoutError(f"{what}: not within {timeout:.0f}s")

    def all_active(self) -> bool:
        parts = self.status()["partitions"]
        return all(p["owner"] and p["status"] == "active" and p["owner_alive"] for p in parts)

    def stop(self) -> None:
        stop_processes(self.nodes.values())


@contextlib.contextmanager
def s3_store(prefix: str) -> Iterator[tuple[str, ServerLog, Path]]:
    with tempfile.TemporaryDirectory(prefix="laminar-bench-cost-") as tmp, start_s3_server(Path(tmp) / "s3") as url:
        os.environ["AWS_ENDPOINT_URL"] = url
        client = boto3.client("s3", endpoint_url=url)
        with contextlib.suppress(Exception):
            client.create_bucket(Bucket=BUCKET)
        yield f"s3://{BUCKET}/{prefix}", ServerLog(Path(tmp) / "s3" / "server.log"), Path(tmp)


@contextlib.contextmanager
def running_cluster(
    prefix: str, partitions: int, nodes: int, *, settle_s: float = 5.0
) -> Iterator[tuple[Cluster, ServerLog, str]]:
    """A cluster of `partitions` on a fresh `s3_store(prefix)`, nodes 1..`nodes` started and given `settle_s`
    to register: the cluster, the server's request log and the store URL; the nodes are stopped after."""
    with s3_store(prefix) as (url, log, tmp):
        cluster = Cluster(url, tmp)
        try:
            cluster.laminar("init", "--partitions", str(partitions))
            for n in range(1, nodes + 1):
                cluster.start_node(n)
            time.sleep(settle_s)
            yield cluster, log, url
        finally:
            cluster.stop()


def measure(log: ServerLog, seconds: float) -> Window:
    log.mark()
    time.sleep(seconds)
    return log.since_mark(seconds)


def _rows_for(name: str, window: Window, target: float) -> list[Row]:
    return [
        Row(
            f"{name}: requests/s", "s3 server log", f"{window.rate:.1f}", f"<= {target:g}", verdict(window.rate, target)
        ),
        Row(f"{name}: $/month at S3 list prices", "s3 server log", f"{window.monthly():,.2f}"),
    ]


def demo_shape(window_s: float, *, loaded: bool) -> tuple[list[Row], list[str]]:
    name = "demo shape, 200 events/s" if loaded else "demo shape, idle"
    with running_cluster("demo", 4, 3, settle_s=3) as (cluster, log, url):
        cluster.laminar("rebalance")
        cluster.wait("placement", cluster.all_active, 120)
        producer = None
        if loaded:
            producer = Producer(url, 4, 200.0, 100, lambda line: progress(line))
            producer.start()
        time.sleep(10)  # the idle polls reach their slowest; a producer's first appends commit
        progress(f"{name}: measuring {window_s:.0f}s")
        window = measure(log, window_s)
        notes = [f"{name}: busiest {window.busiest()}"]
        rows = _rows_for(name, window, 40.0 if loaded else 10.0)
        if producer is not None:
            # After the request window (status reads count as requests): the worst partition's lag,
            # sampled at moments unrelated to the producer's once-a-second appends.
            samples = []
            for _ in range(LAG_SAMPLES):
                parts = cluster.status()["partitions"]
                samples.append(max(int(p["lag"] or 0) for p in parts))
                time.sleep(1.3)
            producer.stop()
            samples.sort()
            median, worst = samples[len(samples) // 2], samples[-1]
            per_s = 200.0 / 4  # one partition's events per second of input
            rows.append(
                Row(
                    f"{name}: lag (worst partition, median of {LAG_SAMPLES})",
                    "status",
                    f"{median} ev = {median / per_s:.1f} s",
                    "<= 1 s of input",
                    verdict(median / per_s, 1.0),
                )
            )
            notes.append(f"{name}: lag samples (events) {samples}, the largest {worst / per_s:.1f} s of input")
        return rows, notes


def demo_shipped(window_s: float, *, rate: float, dagster: bool) -> tuple[list[Row], list[str]]:
    """`laminar demo` exactly as shipped (Spark nodes, its viewer printing tables and phase lines, the
    output table at the demo's interval; with `dagster`, its webserver and daemon), on the S3-protocol
    server: the requests of everything it runs over a window once its cluster is up."""
    name = f"`laminar demo`{'' if dagster else ' --no-dagster'}, " + (f"{rate:g} events/s" if rate else "idle")
    target = (40.0 if rate else 10.0) if not dagster else 15.0
    with s3_store("shipped") as (url, log, tmp):
        settle_s = 30.0 if dagster else 15.0  # the first tables, the daemon's first sensor ticks
        duration = settle_s + window_s + 5
        args = [PYTHON, "-m", "laminar_orchestration.cli", "demo", "--store", url, "--rate", f"{rate:g}"]
        args += ["--duration", f"{duration:g}", "--port", "3077", "--metrics-port", "9377"]
        args += [] if dagster else ["--no-dagster"]
        out = open(tmp / "demo.out", "w+")  # noqa: SIM115 - closed below
        # From the checkout: the Dagster code location is found there (its demo directory too).
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT, text=True)
        try:
            # Its cluster is up once it printed its first status table (`--duration` counts from then).
            deadline = time.monotonic() + 900
            while "── status" not in (tmp / "demo.out").read_text() and time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"laminar demo exited ({proc.returncode}): {(tmp / 'demo.out').read_text()[-1500:]}"
                    )
                time.sleep(1)
            progress(f"{name}: up; settling {settle_s:.0f}s, then measuring {window_s:.0f}s")
            time.sleep(settle_s)
            window = measure(log, window_s)
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=120)
            out.close()
        notes = [f"{name}: busiest {window.busiest()}"]
        rows = _rows_for(name, window, target)
        if rate:
            share = window.share("tables/")
            rows.append(Row(f"{name}: the output table's share", "s3 server log", f"{share:.1%}", "<= 10%",
                            verdict(share, 0.10)))  # fmt: skip
        return rows, notes


#: Graceful migrations timed at scale (the median is the figure).
MIGRATIONS = 3


def _dagster_failover(
    cluster: Cluster, log: ServerLog, ledger: Ledger, *, victim: int, timeout_s: float, notes: list[str]
) -> list[Row]:
    """kill -9 of `victim` with the Dagster daemon watching (its sensors, as `laminar demo` runs them):
    until every partition it held is Active elsewhere, from the migration records' completion times."""
    # Imported here: only this step needs Dagster (and the test helpers that run its processes).
    from tests.dagster_plane import ControlPlane

    plane = ControlPlane(cluster.workdir / "dagster", cluster.url, heartbeat_timeout_s=timeout_s)
    try:
        progress("scale: starting Dagster as `laminar demo` runs it (daemon, webserver and its run pool)")
        plane.start_webserver(timeout_s=600)
        plane.wait_pool(timeout_s=600)
        plane.start_daemon()
        plane.wait_sensors_ticking(timeout_s=600)
        time.sleep(20)  # the observation sensor's first full look is over before the kill
        owners = ledger.ownerships(ledger.partitions())
        held = sorted(int(p) for p, o in owners.items() if o is not None and o.owner == victim)
        desired = DesiredStates(ledger, nudge=False)
        progress(f"scale: kill -9 node {victim} holding {len(held)} partitions, the Dagster sensor failing it over")
        log.mark()
        killed = time.time()
        cluster.nodes[victim].kill()
        done: dict[int, float] = {}
        planned: dict[int, float] = {}

        def all_active() -> bool:
            for p in held:
                if p in done:
                    continue
                task = desired.read(PartitionId(p))[0].migration
                if (
                    task is not None
                    and task.migration_kind == MigrationKind.FORCED
                    and task.from_node == victim
                    and task.phase == MigrationPhase.ACTIVE
                    and task.completed_at is not None
                ):
                    done[p] = task.completed_at.timestamp()
                    planned[p] = task.started_at.timestamp()
            return len(done) == len(held)

        # Polled slowly (its reads load the server the failover uses); the figure is the records' own.
        time.sleep(timeout_s)
        while not all_active() and time.time() - killed < 300:
            time.sleep(5)
        window = log.since_mark(time.time() - killed)
        took = max(done.values()) - killed if len(done) == len(held) else math.inf
        per_move = sum(window.methods.values()) / max(1, len(held))
        notes.append(
            f"scale Dagster failover: {len(done)}/{len(held)} active; {per_move:.0f} requests per partition moved"
            " (the sensors' and the recording runs' included, until the last was seen active)"
        )
        if planned:
            # Where the time went: the sensor's detection (its first plan) and the drive after it.
            notes.append(
                f"scale Dagster failover: the sensor planned its first move {min(planned.values()) - killed:.1f} s"
                f" after the kill, its last {max(planned.values()) - killed:.1f} s; the first Active at"
                f" {min(done.values()) - killed:.1f} s"
            )
        return [
            Row(
                f"kill -9 of a node with {len(held)} partitions -> all active elsewhere",
                "Dagster node_failure_sensor",
                f"{took:.1f} s" if math.isfinite(took) else f"{len(held) - len(done)} not active after 300 s",
                f"<= {timeout_s + 10:g} s",
                verdict(took, timeout_s + 10),
            )
        ]
    finally:
        plane.stop()


def scale(window_s: float, partitions: int, nodes: int, rows: list[Row], notes: list[str], *, dagster: bool) -> None:
    """The 1,000-partition figures, into `rows` and `notes` as they are taken (a later failure keeps them)."""
    with running_cluster("scale", partitions, nodes) as (cluster, log, _):
        progress(f"scale: placing {partitions} partitions on {nodes} nodes")
        started = time.monotonic()
        # On a loaded two-core machine some placements outlive their deadline: the next rebalance
        # places what is left, as an operator would run it again.
        for _attempt in range(3):
            with contextlib.suppress(RuntimeError):
                cluster.laminar("rebalance", "--max-concurrent", "10", "--migration-timeout", "120", timeout=3600)
                break
        cluster.wait("placement", cluster.all_active, 1800)
        notes.append(f"scale: {partitions} partitions placed in {time.monotonic() - started:.0f}s")
        time.sleep(15)
        progress(f"scale: measuring idle {window_s:.0f}s")
        window = measure(log, window_s)
        rows += _rows_for(f"{partitions} partitions on {nodes} nodes, idle", window, 50.0)
        notes.append(f"scale idle: busiest {window.busiest()}")
        per_node_large = window.rate / nodes
        rows += _status_rows(cluster, partitions, notes)
        status = cluster.status()
        per_node = {int(n["node"]): sum(n["requests_per_s"].values()) for n in status["nodes"]}
        one = per_node.get(1, 0.0)
        rows.append(Row(f"one node's idle requests/s at {partitions} partitions", "heartbeat", f"{one:.2f}"))

        owned = sorted(p["partition"] for p in status["partitions"] if p["owner"] == 2)
        times = []
        for target in owned[:MIGRATIONS]:
            progress(f"scale: migrating partition {target} from node 2 to node 3")
            log.mark()
            started = time.monotonic()
            cluster.laminar("migrate", "--partition", str(target), "--to", "3")
            times.append(time.monotonic() - started)
            moved = log.since_mark(times[-1])
            notes.append(f"scale migration: {sum(moved.methods.values())} requests; busiest {moved.busiest(8)}")
        took = statistics.median(times)
        notes.append(f"scale migrations (launch -> Active): {', '.join(f'{t:.2f}' for t in times)} s")
        rows.append(
            Row(
                f"graceful migration at {partitions} partitions (launch -> Active, median of {len(times)})",
                "laminar migrate",
                f"{took:.2f} s",
                "<= 1.5 s",
                verdict(took, 1.5),
            )
        )

        victim = 4
        status = cluster.status()
        held = [p["partition"] for p in status["partitions"] if p["owner"] == victim]
        progress(f"scale: kill -9 node {victim} holding {len(held)} partitions")
        ledger = Ledger(open_store(cluster.url))
        # The target is the victim's own heartbeat timeout (the nodes' `--heartbeat-timeout`) + 10 s.
        timeout_s = next(v.record.heartbeat_timeout_s for v in ledger.members.nodes() if v.record.node == victim)
        cluster.nodes[victim].kill()
        killed = time.monotonic()

        def seen_dead() -> bool:
            return not any(v.alive for v in ledger.members.nodes() if v.record.node == victim)

        # What an operator does: wait until the ledger shows the node dead (its heartbeat timed out),
        # then one `laminar failover`, which returns when every move ended.
        cluster.wait("the node seen dead", seen_dead, 60)
        dead_after = time.monotonic() - killed
        log.mark()
        lines, code = cluster.laminar_timed("failover", "--node", str(victim), timeout=600)
        if code != 0:  # some moves failed: the figure says how many were left behind
            notes.append(f"scale failover: `laminar failover` failed ({code}): {lines[-1][1][:200] if lines else ''}")
        returned = time.monotonic() - killed
        # The last partition active: the last move the command printed (it then reads every
        # partition's owner, for any partition the dead node's assignment did not name).
        done_at = [at for at, line in lines if line.startswith("partition ") and ": active" in line]
        took = (max(done_at) - killed) if len(done_at) >= len(held) else returned
        rows.append(
            Row(
                "`laminar failover` wall time from the kill (the command as the user waits for it)",
                "laminar failover",
                f"{returned:.1f} s",
                f"<= {timeout_s + 10:g} s",
                verdict(returned, timeout_s + 10),
            )
        )
        failed_over = log.since_mark(returned - dead_after)
        per_move = sum(failed_over.methods.values()) / max(1, len(held))
        notes.append(
            f"scale failover: {per_move:.0f} requests per partition moved, the server at "
            f"{failed_over.rate:.0f} requests/s; busiest {failed_over.busiest(8)}"
        )
        owners = ledger.ownerships([PartitionId(p) for p in held])
        live = {v.record.node for v in ledger.members.nodes() if v.alive} - {victim}
        stranded = [p for p in held if (o := owners.get(PartitionId(p))) is None or o.owner not in live]
        active = {int(p["partition"]) for p in cluster.status()["partitions"] if p.get("status") == "active"}
        stranded = sorted(set(stranded) | (set(held) - active))
        notes.append(
            f"scale failover: node seen dead after {dead_after:.1f}s; the command returned after {returned:.1f}s "
            f"(with its look at every partition's owner); not active after: {stranded or 'none'}"
        )
        rows.append(
            Row(
                f"kill -9 of a node with {len(held)} partitions -> all active elsewhere",
                "laminar failover",
                f"{took:.1f} s" + (f" ({len(stranded)} not active)" if stranded else ""),
                f"<= {timeout_s + 10:g} s",
                verdict(took if not stranded else math.inf, timeout_s + 10),
            )
        )
        if dagster:
            try:
                rows += _dagster_failover(cluster, log, ledger, victim=5, timeout_s=timeout_s, notes=notes)
            except (RuntimeError, TimeoutError) as exc:  # the figures above still print
                notes.append(f"scale Dagster failover: not measured: {str(exc)[:300]}")
                rows.append(Row("kill -9 -> all active elsewhere", "Dagster node_failure_sensor", "not measured"))
    # The same node at 10 partitions, for the "does not grow with partitions" figure.
    with running_cluster("small", nodes, nodes) as (cluster, log, _):
        cluster.wait("a rebalance with every node live", lambda: cluster.laminar("rebalance") is not None, 120)
        cluster.wait("placement", cluster.all_active, 300)
        time.sleep(15)
        status = cluster.status()
        small = {int(n["node"]): sum(n["requests_per_s"].values()) for n in status["nodes"]}
        rows.append(Row(f"one node's idle requests/s at {nodes} partitions", "heartbeat", f"{small.get(1, 0.0):.2f}"))
        # The same over the server's log (a window, not one heartbeat's interval): the cluster's idle rate a node.
        per_node_small = measure(log, window_s).rate / nodes
    ratio = per_node_large / per_node_small if per_node_small else math.inf
    rows.append(
        Row(
            f"idle requests/s a node, {partitions} vs {nodes} partitions",
            "s3 server log",
            f"{per_node_large:.2f} vs {per_node_small:.2f} (x{ratio:.2f})",
            "same +- 20 %",
            "met" if abs(ratio - 1) <= 0.2 else f"MISSED (x{ratio:.2f})",
        )
    )


#: `laminar status` runs timed at scale (the median is the figure).
STATUS_RUNS = 3


def _status_rows(cluster: Cluster, partitions: int, notes: list[str]) -> list[Row]:
    """`laminar status` (its default: the summary beyond 64 partitions) and `--json --detail`, wall time."""
    rows = []
    for label, args, target in (("", (), 5.0), (" --detail", ("--detail",), None)):
        times = []
        for _ in range(STATUS_RUNS if target is not None else 1):
            started = time.monotonic()
            cluster.laminar("status", "--json", *args)
            times.append(time.monotonic() - started)
        took = statistics.median(times)
        notes.append(f"scale: laminar status --json{label}: {', '.join(f'{t:.2f}' for t in times)} s")
        rows.append(
            Row(
                f"`laminar status --json{label}` at {partitions} partitions (wall, median of {len(times)})",
                "laminar status",
                f"{took:.2f} s",
                f"<= {target:g} s" if target is not None else "",
                verdict(took, target) if target is not None else "",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", default="demo-idle,demo-load,shipped-idle,shipped-load,shipped-dagster-idle,scale")
    parser.add_argument("--window", type=float, default=30.0, help="seconds of each steady window")
    parser.add_argument("--scale-partitions", type=int, default=1000)
    parser.add_argument("--scale-nodes", type=int, default=10)
    parser.add_argument("--no-dagster", action="store_true", help="scale: skip the failover through Dagster")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    rows: list[Row] = []
    notes: list[str] = []
    if "demo-idle" in only:
        r, n = demo_shape(args.window, loaded=False)
        rows += r
        notes += n
    if "demo-load" in only:
        r, n = demo_shape(args.window, loaded=True)
        rows += r
        notes += n
    for section, rate, dagster in (
        ("shipped-idle", 0.0, False),
        ("shipped-load", 200.0, False),
        ("shipped-dagster-idle", 0.0, True),
    ):
        if section in only:
            try:
                r, n = demo_shipped(args.window, rate=rate, dagster=dagster)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # the other figures still print
                r, n = [Row(section, "laminar demo", "not measured")], [f"{section}: {str(exc)[:300]}"]
            rows += r
            notes += n
    if "scale" in only:
        try:
            scale(args.window, args.scale_partitions, args.scale_nodes, rows, notes, dagster=not args.no_dagster)
        except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as exc:  # the figures taken still print
            notes.append(f"scale: stopped: {str(exc)[:300]}")
    text = format_table(rows, "store requests (S3 billing classes), from the S3 server's log", notes)
    print(text)
    write_result("bench_cost.txt", text)


if __name__ == "__main__":
    threading.excepthook = lambda a: progress(f"thread {a.thread}: {a.exc_value}")
    main()
