"""The output table's figures: its lag behind the committed manifests and its store requests at the
demo's load, and one 1M-event batch through the table committer.

    python -m benchmarks.bench_table [--quick] [--only commit,load] [--intervals 5,1]
                                     [--window S] [--repeat N] [--runs N]

* **lag** (target p95 <= 6 s at the default interval): the demo's shape (3 nodes, 4 partitions placed as `laminar
  rebalance` places them, the demo's producer at 200 events/s) on the S3-protocol server, nodes
  keeping the table every `--table-sync-interval` (the default, and each of `--intervals`). A
  batch's lag is the time from its manifest commit (the entry's ``committed_at``) to the Delta
  commit that holds it (its ``timestamp``; each commit names its batches in ``laminar.batches``),
  for every batch committed during the window; after the window the producer stops and the table
  is given one interval to catch up (a batch still missing counts with its age then, a lower bound).
* **requests** (target: the table's share <= 10 % of the cluster's requests): the same runs'
  requests, counted from the server's own log as S3 bills them (GET, HEAD, PUT, LIST). The table's
  are every request under ``tables/`` plus the manifest probes of its chain walks; printed per Delta
  commit, per second, and as a share of all the run's requests. In the full run a cluster without
  the table gives the A/B figure too. Where each commit's requests go is printed per kind. Each
  interval runs `--repeat` times (figures: the median).
* **1M events** (target >= 1M events/s): one committed batch of 1M events over 1M keys (so 1M
  output rows, the table's worst case) appended by `TableCommitter.sync` on the local store:
  remembered by the node that committed it (its path), and read back from the store (`laminar
  table sync`, a new owner catching up). Median of `--runs`.

Nodes are the real node runtime with a pyarrow fold instead of Spark (as `bench_cost` runs them,
started here so the table's interval can be set: ``python -m benchmarks.bench_table node ...``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from urllib.parse import parse_qs, unquote

import pyarrow as pa

from benchmarks.bench_cost import Cluster, s3_store
from benchmarks.common import (
    REPO_ROOT,
    Row,
    TableReport,
    median,
    now_ns,
    percentile,
    progress,
    time_ns,
    verdict,
)
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ops.demo_processes import Producer
from laminar_orchestration.processing.contract import FoldContext
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import ObjectStore, open_store

#: The demo's shape and load (`laminar demo`'s defaults).
NODES, PARTITIONS, RATE, KEYS = 3, 4, 200.0, 100
#: `laminar node run`'s interval between a node's table commits.
DEFAULT_INTERVAL_S = float(NodeConfig.model_fields["table_sync_interval_s"].default)
LAG_TARGET_S = 6.0
SHARE_TARGET = 0.10
EVENTS_PER_S_TARGET = 1_000_000.0
STORE_PREFIX = "demo"
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)?(GET|PUT|HEAD|DELETE|POST) (/\S*) HTTP')


# --- a node process whose table interval is chosen ----------------------------------------------


def node_main(argv: Sequence[str]) -> None:
    """``python -m benchmarks.bench_table node --store URL --node-id N [--table-sync-interval S | --no-table]``:
    `laminar_dev.arrownode --node-defaults` (what `bench_cost` runs) with the table's interval set."""
    import logging

    from laminar_dev.chaos.arrow import ArrowNode
    from laminar_orchestration.table import TableCommitter

    parser = argparse.ArgumentParser(prog="bench_table node")
    parser.add_argument("--store", required=True)
    parser.add_argument("--node-id", type=int, required=True)
    parser.add_argument("--table-sync-interval", type=float, default=DEFAULT_INTERVAL_S)
    parser.add_argument("--no-table", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = NodeConfig(
        store_url=args.store,
        node_id=args.node_id,
        heartbeat_timeout_s=3.0,  # as arrownode runs
        table_sync_interval_s=args.table_sync_interval,
    )
    table = None if args.no_table else TableCommitter(open_store(args.store), node=args.node_id)
    ArrowNode(config, output_table=table).run()


class TableCluster(Cluster):
    """`bench_cost`'s cluster, its nodes keeping the table every `interval` seconds (None: no table)."""

    def __init__(self, url: str, workdir: Path, interval: float | None) -> None:
        super().__init__(url, workdir)
        self.interval = interval

    def start_node(self, node: int) -> None:
        cmd = [sys.executable, "-m", "benchmarks.bench_table", "node", "--store", self.url, "--node-id", str(node)]
        cmd += ["--no-table"] if self.interval is None else ["--table-sync-interval", str(self.interval)]
        log = open(self.workdir / f"node{node}.log", "wb")  # noqa: SIM115 - closed with the process
        self.nodes[node] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)


@contextlib.contextmanager
def demo_cluster(interval: float | None) -> Iterator[tuple[TableCluster, Path, str]]:
    """The demo's shape on a fresh S3 server: the cluster, the server's log and the store URL."""
    with s3_store(STORE_PREFIX) as (url, log, tmp):
        cluster = TableCluster(url, tmp, interval)
        try:
            cluster.laminar("init", "--partitions", str(PARTITIONS))
            for n in range(1, NODES + 1):
                cluster.start_node(n)
            # A loaded machine starts a node in seconds: place the partitions once all are alive.
            ledger = Ledger(open_store(url))
            cluster.wait("live nodes", lambda: sum(v.alive for v in ledger.members.nodes()) == NODES, 120)
            cluster.laminar("rebalance")
            cluster.wait("placement", cluster.all_active, 120)
            yield cluster, log.path, url
        finally:
            cluster.stop()


# --- the server's log: who asked for what ---------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request the server logged: its billing class and the key (or listed prefix) under the store's prefix."""

    method: str
    key: str


def parse_requests(text: str, prefix: str = STORE_PREFIX) -> list[Request]:
    found = []
    for verb, path in _REQUEST.findall(text):
        target, _, query = path.partition("?")
        params = parse_qs(query)
        if verb == "GET" and "list-type" in params:
            method, full = "LIST", params.get("prefix", [""])[0]
        else:
            method, full = verb, unquote(target).lstrip("/").partition("/")[2]
        key = full[len(prefix) + 1 :] if full.startswith(prefix + "/") else ""
        found.append(Request(method, key))
    return found


def table_kind(request: Request) -> str | None:
    """What the table asked for (None: not the table's request)."""
    method, key = request.method, request.key
    if key.startswith("tables/"):
        if method == "LIST":
            return "LIST _delta_log"
        name = key.rsplit("/", 1)[-1]
        if "/_delta_log/" not in key:
            return f"{method} data file"
        if name == "_last_checkpoint":
            return f"{method} _last_checkpoint"
        return f"{method} {'checkpoint' if 'checkpoint' in name else 'log entry'}"
    # The chain walk's probe past each partition's newest entry (nodes read no history entry otherwise).
    if key.startswith("manifests/") and "/history/" in key and method in ("GET", "HEAD"):
        return f"{method} manifest probe"
    return None


@dataclass
class Requests:
    """A window's requests: all of them, and the table's by kind."""

    seconds: float
    total: int = 0
    table: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, text: str, seconds: float) -> Requests:
        out = cls(seconds)
        for r in parse_requests(text):
            out.total += 1
            kind = table_kind(r)
            if kind is not None:
                out.table[kind] += 1
        return out

    @property
    def rate(self) -> float:
        return self.total / self.seconds

    @property
    def table_rate(self) -> float:
        return sum(self.table.values()) / self.seconds

    @property
    def commits(self) -> int:
        return self.table["PUT log entry"]

    def share(self) -> float:
        """The table's requests over all of the run's."""
        return self.table_rate / self.rate if self.rate > 0 else 0.0

    def per_commit_total(self) -> float:
        return sum(self.table.values()) / self.commits if self.commits else float("nan")

    def per_commit(self) -> str:
        if not self.commits:
            return "no commit in the window"
        return ", ".join(f"{kind} {n / self.commits:.1f}" for kind, n in self.table.most_common())


# --- one run at the demo's load ------------------------------------------------------------------


@dataclass
class LoadRun:
    interval: float | None
    requests: Requests
    #: Per batch committed in the window: seconds from its manifest commit to the table's commit.
    lags: list[float] = field(default_factory=list)
    #: Batches not in the table when it was read (their lag is their age then: a lower bound).
    missing: int = 0

    @property
    def name(self) -> str:
        if self.interval is None:
            return "without the table"
        default = " (default)" if self.interval == DEFAULT_INTERVAL_S else ""
        return f"table every {self.interval:g} s{default}"


def load_run(interval: float | None, window_s: float, settle_s: float, catch_up_s: float) -> LoadRun:
    """The demo's shape at the demo's load, nodes keeping the table every `interval` s (None: no table)."""
    name = "no table" if interval is None else f"table every {interval:g} s"
    progress(f"demo load, {name}: starting the cluster")
    with demo_cluster(interval) as (_cluster, log_path, url):
        producer = Producer(url, PARTITIONS, RATE, KEYS, lambda line: progress(line))
        producer.start()
        time.sleep(settle_s)  # the idle polls reach their slowest, the producer's appends commit
        progress(f"demo load, {name}: measuring {window_s:.0f}s")
        offset = log_path.stat().st_size
        since = time.time()
        time.sleep(window_s)
        until = time.time()
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            requests = Requests.of(fh.read().decode(errors="replace"), until - since)
        producer.stop()
        run = LoadRun(interval, requests)
        if interval is not None:
            store = open_store(url)
            # Every batch of the window gets up to `catch_up_s` more to reach the table.
            _wait_caught_up(store, catch_up_s)
            run.lags, run.missing = batch_lags(store, since, until)
    return run


def _wait_caught_up(store: ObjectStore, timeout: float) -> None:
    from laminar_orchestration.table import table_status

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if table_status(store).lag_batches == 0:
            return
        time.sleep(1.0)


def batch_lags(store: ObjectStore, since: float, until: float) -> tuple[list[float], int]:
    """Per batch committed between `since` and `until` (wall clock): manifest commit -> table commit."""
    from deltalake import DeltaTable

    from laminar_orchestration.table import table_location

    location = table_location(store)
    landed: dict[tuple[int, int], float] = {}
    for commit in DeltaTable(location.uri, storage_options=location.options()).history():
        for p, seqs in json.loads(commit.get("laminar.batches") or "{}").items():
            for seq in seqs:
                landed[(int(p), int(seq))] = commit["timestamp"] / 1000.0
    read_at = time.time()
    lags, missing = [], 0
    reader = ManifestReader(store)
    for p in range(PARTITIONS):
        for version in reader.history(PartitionId(p)):
            m = version.manifest
            committed = m.committed_at.timestamp()
            if not m.outputs or not since <= committed <= until:
                continue
            at = landed.get((p, m.seq))
            missing += at is None
            lags.append((at if at is not None else read_at) - committed)
    return lags, missing


def load_rows(runs: Sequence[LoadRun], report: TableReport) -> None:
    groups: dict[float | None, list[LoadRun]] = {}
    for run in runs:
        groups.setdefault(run.interval, []).append(run)
    baseline = groups.get(None)
    base_rate = median([r.requests.rate for r in baseline]) if baseline else None
    for interval, group in groups.items():
        name = group[0].name
        of = f", median of {len(group)} runs" if len(group) > 1 else ""
        rate = median([r.requests.rate for r in group])
        if interval is None:
            report.rows.append(Row(f"demo load, {name}: requests/s{of}", "s3 server log", f"{rate:.1f}"))
            continue
        p95s = [percentile(r.lags, 95) for r in group if r.lags]
        if p95s:
            lags = [lag for r in group for lag in r.lags]
            missing = sum(r.missing for r in group)
            bound = f" (>=: {missing} not in the table)" if missing else ""
            at_default = interval == DEFAULT_INTERVAL_S
            report.rows.append(
                Row(
                    f"demo load, {name}: table lag p95{of} (runs {_fmt(p95s)} s; p50 {percentile(lags, 50):.1f} s, "
                    f"max {max(lags):.1f} s, {len(lags)} batches){bound}",
                    "manifests/table",
                    f"{median(p95s):.2f} s",
                    f"<= {LAG_TARGET_S:g} s" if at_default else "-",
                    verdict(median(p95s), LAG_TARGET_S) if at_default else "-",
                )
            )
        per_commit = [r.requests.per_commit_total() for r in group if r.requests.commits]
        if per_commit:
            report.rows.append(
                Row(
                    f"demo load, {name}: the table's requests per Delta commit{of}",
                    "s3 server log",
                    f"{median(per_commit):.1f}",
                )
            )
        report.rows.append(
            Row(
                f"demo load, {name}: requests/s, all / the table's{of}",
                "s3 server log",
                f"{rate:.1f} / {median([r.requests.table_rate for r in group]):.2f}",
            )
        )
        share = median([r.requests.share() for r in group])
        report.rows.append(
            Row(
                f"demo load, {name}: the table's share of the cluster's requests{of}",
                "s3 server log",
                f"{100 * share:.1f} %",
                f"<= {100 * SHARE_TARGET:g} %",
                verdict(share, SHARE_TARGET),
            )
        )
        if base_rate is not None:
            report.rows.append(
                Row(
                    f"demo load, {name}: requests/s vs without the table ({base_rate:.1f}/s, A/B){of}",
                    "s3 server log",
                    f"{(rate / base_rate - 1.0) * 100:+.1f} %",
                )
            )
        for r in group:
            req = r.requests
            report.note(f"{name}: {req.commits} Delta commits in {req.seconds:.0f}s; per commit: {req.per_commit()}")


# --- one 1M-event batch through the committer ----------------------------------------------------


def _big_output(events: int) -> pa.Table:
    """The default processor's output for `events` events over as many keys (one row each)."""
    import pyarrow.compute as pc

    from laminar_orchestration.processing.keyed import STATE_SCHEMA, keyed_aggregation

    n = events
    values = pc.multiply(pa.array(range(n), pa.float64()), 0.5)
    aggregate = pa.table(
        {
            "key": pa.array([f"k{i:07d}" for i in range(n)]),
            "batch_count": pa.array([1] * n, pa.int64()),
            "batch_sum": values,
            "batch_min": values,
            "batch_max": values,
            "batch_last": values,
            "batch_last_offset": pa.array(range(n), pa.int64()),
        }
    )
    previous = pa.table({f.name: pa.nulls(n, f.type) for f in STATE_SCHEMA if f.name != "key"})
    return keyed_aggregation.fold(aggregate, previous, FoldContext.at(1, 1)).output


def commit_1m(runs: int, events: int) -> tuple[list[Row], list[str]]:
    """Seconds `TableCommitter.sync` takes to append one committed batch of `events` output rows."""
    from laminar_orchestration.dataplane.checkpoint import OutputWriter
    from laminar_orchestration.protocol.capabilities import OutputCommitter
    from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
    from laminar_orchestration.protocol.commit import commit
    from laminar_orchestration.protocol.fencing import PartitionGuard
    from laminar_orchestration.protocol.ledger import Ledger
    from laminar_orchestration.store import LocalObjectStore
    from laminar_orchestration.table import TableCommitter, TableLocation

    progress(f"1M events: building a batch of {events:,} output rows")
    big = _big_output(events)
    small = big.slice(0, 10)
    remembered: list[float] = []
    read_back: list[float] = []
    with tempfile.TemporaryDirectory(prefix="laminar-bench-table-") as tmp:
        store = LocalObjectStore(Path(tmp) / "store")
        ledger = Ledger(store)
        ledger.init_cluster(runs)
        writer = OutputWriter(OutputCommitter(store))
        publisher = ManifestPublisher(OutputCommitter(store), store)
        for r in range(runs):
            token = ledger.acquire(PartitionId(r), NodeId(1), expected_epoch=0)
            node = TableCommitter(store, TableLocation(str(Path(tmp) / f"node-{r}")))
            catch_up = TableCommitter(store, TableLocation(str(Path(tmp) / f"sync-{r}")))
            offset = 0
            for output, timed in ((small, False), (big, True)):
                ref = writer.write(PartitionGuard(token), output, offset, offset + output.num_rows)
                offset += output.num_rows
                update = ManifestUpdate(source_offset=offset, outputs=(ref,), events_applied=offset)
                version = commit(ledger, publisher, token, update)
                node.remember(version, {ref.key: output})
                if not timed:  # the tables exist before the timed append, as a running node's does
                    node.sync([r])
                    catch_up.sync([r])
            progress(f"1M events: run {r + 1}/{runs}")
            remembered.append(time_ns(partial(node.sync, [r])) / 1e9)
            read_back.append(time_ns(partial(catch_up.sync, [r])) / 1e9)
    rows = []
    for name, samples in (("remembered by its node", remembered), ("read back from the store", read_back)):
        rate = events / median(samples)
        rows.append(
            Row(
                f"1M-event batch ({events:,} rows) through the table committer, {name}",
                "local",
                f"{rate / 1e6:.2f} M events/s ({median(samples):.2f} s)",
                ">= 1 M events/s",
                verdict(rate, EVENTS_PER_S_TARGET, higher_is_better=True),
            )
        )
    notes = [f"1M events: sync seconds, remembered {_fmt(remembered)}, read back {_fmt(read_back)}"]
    return rows, notes


def _fmt(samples: Sequence[float]) -> str:
    return "[" + ", ".join(f"{s:.2f}" for s in samples) + "]"


# --- main -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["node"]:
        node_main(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows, no A/B baseline (< 2 min)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per interval at the demo's load (median)")
    parser.add_argument("--only", default="commit,load", help="comma-separated: commit, load")
    parser.add_argument(
        "--intervals",
        default=None,
        help=f"table sync intervals at the demo's load, seconds (default {DEFAULT_INTERVAL_S:g},1)",
    )
    parser.add_argument("--window", type=float, default=None, help="seconds of each measured window")
    parser.add_argument("--runs", type=int, default=None, help="1M-event runs (default 3; quick 1)")
    parser.add_argument("--events", type=int, default=1_000_000, help="events (= rows) of the big batch")
    args = parser.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    chosen = args.intervals or f"{DEFAULT_INTERVAL_S:g},1"
    intervals = list(dict.fromkeys(float(s) for s in chosen.split(",") if s.strip()))
    load_before = os.getloadavg()
    t0 = now_ns()
    report = TableReport()
    if "commit" in only:
        rows, notes = commit_1m(args.runs or (1 if args.quick else 3), args.events)
        report.rows += rows
        report.notes += notes
    if "load" in only:
        runs: list[LoadRun] = []
        for _ in range(max(1, args.repeat)):
            if not args.quick:
                runs.append(load_run(None, args.window or 60.0, settle_s=10.0, catch_up_s=0.0))
            for interval in intervals:
                # A window holds several of the slowest interval's commits per node; after it, one
                # interval for the window's last batches to land (quick: a few seconds, then lower bounds).
                window = args.window or (max(20.0, interval) if args.quick else max(60.0, 4 * interval))
                catch_up = min(interval, 3.0) + 2.0 if args.quick else interval + 10.0
                runs.append(load_run(interval, window, settle_s=5.0 if args.quick else 10.0, catch_up_s=catch_up))
        load_rows(runs, report)
        report.note(
            "lag: manifest commit (committed_at) -> the Delta commit holding the batch (its timestamp), "
            "every batch committed in the window; the table's requests: those under tables/ plus the chain "
            "walks' manifest probes, as the S3-protocol server logged them (LIST, GET, HEAD, PUT)"
        )
    report.publish("bench_table", args.quick, load_before, (now_ns() - t0) / 1e9, "bench_table.txt")


if __name__ == "__main__":
    main()
