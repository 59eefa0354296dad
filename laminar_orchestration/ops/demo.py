"""`laminar demo`: a whole laminar cluster on one machine, with Dagster's UI, until Ctrl-C.

It starts, on a fresh embedded store under ``./.laminar/demo-<timestamp>``
(or the ``--store`` given, ``s3://`` included):

* worker nodes as separate processes (``python -m laminar_orchestration.cli
  node run``, one local Spark each);
* a producer thread appending a steady load to the partitioned source log;
* the placement of every partition on the nodes, planned and carried out the
  way ``laminar rebalance`` does it;
* Dagster's webserver and daemon on the repo's code location
  (``workspace.yaml``), with ``DAGSTER_HOME`` in the demo directory and
  ``LAMINAR_STORE`` pointing at the demo's store, so the UI launches
  migrations and the failure sensor fails over a killed node.

While it runs it prints a table every few seconds: per partition the owner,
epoch and status, the committed offset, the lag and the committed throughput,
and the output table's version and rows (the nodes keep it every
``table_sync_interval_s``, the nodes' default of 5 s, so it stays a few seconds behind the
manifests). The banner says what to try (`demo_walkthrough`), reading the table
downstream with plain ``deltalake`` included.
On Ctrl-C (SIGINT), SIGTERM or after ``--duration`` it stops everything in an
order that leaves the store clean — producer, Dagster daemon (so that nodes
leaving on purpose are not failed over), nodes (they drain and release),
webserver — and prints the ``laminar verify`` audit of the store, then the
output table as a downstream reader sees it: rows and events per partition.

Every child runs in its own session (Ctrl-C in the terminal reaches only the
demo, which then stops them in order) and, on Linux, gets SIGTERM should the
demo itself die without cleaning up; whatever a child left behind in its
process group (Spark JVMs, Dagster code servers, run workers) is killed at the
end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import TextIO

from laminar_orchestration.control.moves import MoveOutcome
from laminar_orchestration.control.operations import plan_rebalance, run_rebalance
from laminar_orchestration.control.snapshot import ClusterSnapshot, live_node_ids, migrations_in_flight, ownership_map
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.errors import InvalidArgument
from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.metrics import LagClock, MetricsServer
from laminar_orchestration.ops.demo_processes import Child, Producer
from laminar_orchestration.ops.demo_status import PhaseWatch, partition_status, port_or_free
from laminar_orchestration.ops.demo_walkthrough import TableWatch, Walkthrough, program
from laminar_orchestration.ops.errors import DemoError
from laminar_orchestration.ops.ledger_metrics import serve_control_plane_metrics
from laminar_orchestration.ops.verify import audit_store
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import GrantKind
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import MigrationConfig, PhaseReport
from laminar_orchestration.store import StoreError, open_store
from laminar_orchestration.table import table_location

DEFAULT_PORT = 3000
#: How long nodes get to start Spark and join.
NODE_START_TIMEOUT_S = 240.0
#: How long the webserver gets to answer its first request.
WEBSERVER_START_TIMEOUT_S = 180.0


class _Aborted(Exception):
    """Ctrl-C, SIGTERM or the end of `--duration`: stop wherever the demo is."""


@dataclass(frozen=True)
class DemoOptions:
    """What `laminar demo` runs (the CLI flags)."""

    #: Store URL; None: a fresh local store in the demo directory.
    store: str | None = None
    partitions: int = 4
    nodes: int = 3
    #: Events per second the producer appends (over all partitions).
    rate: float = 200.0
    keys: int = 100
    port: int = DEFAULT_PORT
    #: Seconds the demo keeps running once the cluster is up, then it stops by itself (None: until Ctrl-C).
    #: Counted from then, not from the start: a slow machine's Spark start-up does not eat the demo.
    duration: float | None = None
    #: Seconds between two status tables.
    interval: float = 5.0
    #: The nodes' and the failure sensor's: `laminar node run`'s default, short enough that the sensor
    #: reacts within seconds of a `kill -9`.
    heartbeat_timeout_s: float = float(NodeConfig.model_fields["heartbeat_timeout_s"].default)
    spark_master: str = "local[1]"
    #: False: no Dagster webserver/daemon (nodes, load and table only).
    dagster: bool = True
    #: Where ``.laminar/demo-<timestamp>`` is created (default: the working directory).
    base_dir: Path | None = None
    #: Prometheus metrics: the control plane on this port, node N on this port + N (a free one if taken);
    #: None: no metrics.
    metrics_port: int | None = 9100
    #: The nodes' `--table-sync-interval`: `laminar node run`'s default, so the demo costs what users run.
    table_sync_interval_s: float = float(NodeConfig.model_fields["table_sync_interval_s"].default)

    def check(self) -> None:
        """Raise `InvalidArgument` naming the first option out of range (as its flag)."""
        if self.partitions < 1:
            raise InvalidArgument("--partitions", "must be >= 1")
        if self.nodes < 1:
            raise InvalidArgument("--nodes", "must be >= 1")
        if self.rate < 0:
            raise InvalidArgument("--rate", "must be >= 0")
        if self.keys < 1:
            raise InvalidArgument("--keys", "must be >= 1")
        if not 0 < self.port < 65536:
            raise InvalidArgument("--port", "must be in 1..65535")
        if self.duration is not None and self.duration <= 0:
            raise InvalidArgument("--duration", "must be > 0")
        if self.interval <= 0:
            raise InvalidArgument("--interval", "must be > 0")
        if self.metrics_port is not None and not 0 < self.metrics_port < 65536 - self.nodes:
            raise InvalidArgument("--metrics-port", "must leave room for a port per node below 65536")
        if self.heartbeat_timeout_s <= 0:
            raise InvalidArgument("--heartbeat-timeout", "must be > 0")
        if self.table_sync_interval_s <= 0:
            raise InvalidArgument("table_sync_interval_s", "must be > 0")


#: What makes a directory the Dagster code location: the workspace and the definitions beside it.
CODE_LOCATION_FILES = ("workspace.yaml", "definitions.py")


def find_code_location(start: Path | None = None) -> Path | None:
    """The repository checkout holding the Dagster code location (``workspace.yaml``, ``definitions.py``).

    The code location (``assets/``, ``jobs/``, ``sensors/``, ``resources/``) is
    part of the repository, not of the installed package: it is looked for in
    `start` (default: the working directory) and its parents, then beside the
    package (an editable install). None when neither holds it.
    """
    here = (start or Path.cwd()).resolve()
    package = Path(__file__).resolve().parents[1]  # laminar_orchestration/ (this module is in ops/)
    for root in (here, *here.parents, package.parent):
        if all((root / name).is_file() for name in CODE_LOCATION_FILES):
            return root
    return None


def _executable(name: str) -> str | None:
    # The venv's own script first: the demo may run as .venv/bin/laminar without an activated venv.
    beside = Path(sys.executable).with_name(name)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


# --- the demo -----------------------------------------------------------------------------


@dataclass
class _Sample:
    at: float
    committed: dict[int, int]


@dataclass
class _PartitionRow:
    partition: int
    owner: int
    epoch: int
    status: str
    committed: int
    end: int
    rate: float | None
    lag_s: float = 0.0

    @property
    def lag(self) -> int:
        return max(0, self.end - self.committed)


@dataclass
class Demo:
    """One run of `laminar demo`. `run()` blocks until Ctrl-C, SIGTERM or the duration."""

    options: DemoOptions
    out: TextIO = field(default_factory=lambda: sys.stdout)

    def __post_init__(self) -> None:
        self.options.check()
        self.started = time.monotonic()
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        base = (self.options.base_dir or Path.cwd()).resolve()
        self.demo_dir = base / ".laminar" / f"demo-{stamp}"
        n = 1
        while self.demo_dir.exists():  # two demos started within one second
            n += 1
            self.demo_dir = base / ".laminar" / f"demo-{stamp}-{n}"
        self.store_url = (
            _absolute_store_url(self.options.store) if self.options.store else ((self.demo_dir / "store").as_uri())
        )
        self.nodes: dict[int, Child] = {}
        self.webserver: Child | None = None
        self.daemon: Child | None = None
        self.producer: Producer | None = None
        self.code_location: Path | None = None
        self.ledger: Ledger | None = None
        self.partitions = self.options.partitions
        self._stop_requested = False
        self._hurry = False
        self._stop_reason = ""
        self._up_at: float | None = None  # set once the nodes run and the partitions are placed
        self._webserver_ready = False
        self._webserver_gave_up = False
        self._last_sample: _Sample | None = None
        self._last_owners: dict[int, tuple[int, int]] = {}
        self._print_lock = threading.Lock()
        self._phases = PhaseWatch()
        self._last_snapshot: ClusterSnapshot | None = None
        self._lag_clock = LagClock()
        #: Where each node (and, as node 0, the control plane) serves /metrics.
        self.metrics_ports: dict[int, int] = {}
        self._metrics_server: MetricsServer | None = None
        #: The output table, read the way a downstream consumer reads it (set once the store is open).
        self._table: TableWatch | None = None

    # -- output --------------------------------------------------------------------------

    def say(self, line: str = "") -> None:
        """Print one line of the demo's output (thread-safe, flushed)."""
        with self._print_lock:
            print(line, file=self.out, flush=True)

    def _elapsed(self) -> str:
        s = int(time.monotonic() - self.started)
        return f"+{s // 60}:{s % 60:02d}"

    # -- signals ---------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Only flags here: the main loop polls them (a handler must not take locks the loop may hold).
        if self._stop_requested:
            self._hurry = True
        else:
            self._stop_requested = True
            self._stop_reason = signal.Signals(signum).name

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop_requested and time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _duration_over(self) -> bool:
        d = self.options.duration
        return d is not None and self._up_at is not None and time.monotonic() - self._up_at >= d

    def _check_abort(self) -> None:
        if self._duration_over() and not self._stop_requested:
            self._stop_requested = True
            self._stop_reason = f"--duration {self.options.duration:g}s reached"
        if self._stop_requested:
            raise _Aborted

    # -- the whole run ----------------------------------------------------------------------

    def run(self) -> int:
        """Start everything, print status tables, stop everything; 0 when the final audit is OK."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        failure: str | None = None
        try:
            try:
                self._start()
                self._watch()
            except _Aborted:
                pass
            except DemoError as exc:
                failure = str(exc)
                self.say(f"laminar demo: error: {exc}")
            finally:
                if self._stop_reason:
                    early = "" if self._up_at is not None else ", before the cluster was up"
                    self.say(f"\nstopping ({self._stop_reason}{early}) — Ctrl-C again to hurry")
                self._stop_all()
            ok = self._final_report()
            return 0 if ok and failure is None else 1
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    # -- starting ----------------------------------------------------------------------------

    def _start(self) -> None:
        opts = self.options
        self.code_location = find_code_location(opts.base_dir) if opts.dagster else None
        dagster_bins = self._dagster_executables() if opts.dagster else None
        if self.code_location is not None and dagster_bins is not None:
            _check_port_free(opts.port)  # before anything is created or started
        self.demo_dir.mkdir(parents=True)
        store = open_store(self.store_url, create=True)
        self.ledger = ledger = Ledger(store)
        self._table = TableWatch(table_location(store))
        self.say(f"laminar demo  {self.demo_dir}")
        if ledger.is_initialized():
            self.partitions = ledger.cluster().partitions
            self.say(f"  store {self.store_url} already holds a cluster: using its {self.partitions} partitions")
        else:
            ledger.init_cluster(opts.partitions)
        if opts.metrics_port is not None:
            self.metrics_ports = {n: port_or_free(opts.metrics_port + n) for n in range(opts.nodes + 1)}
        # Every child is started before any thread of ours runs (see `_child_setup`).
        for n in range(1, opts.nodes + 1):
            self.nodes[n] = self._start_node(n)
        dagster_env = None
        if self.code_location is not None and dagster_bins is not None:
            dagster_env = self._dagster_env(self.code_location)
            self.webserver = self._start_webserver(self.code_location, dagster_bins[0], dagster_env)
        nodes = ", ".join(f"node {n} (pid {c.pid})" for n, c in self.nodes.items())
        self.say(f"starting {nodes} — one local Spark each, this takes a little while ...")
        if self.webserver is not None:
            self.say(f"starting the dagster webserver (pid {self.webserver.pid}) on http://127.0.0.1:{opts.port}")
        self._wait_nodes_alive()
        if self.code_location is not None and dagster_bins is not None and dagster_env is not None:
            # After the nodes' Spark start-up: on a small machine the daemon's first runs would slow it down.
            self.daemon = self._start_daemon(self.code_location, dagster_bins[1], dagster_env)
        if self.daemon is None and 0 in self.metrics_ports:
            # No Dagster code location to serve the control plane's metrics: the demo serves them itself.
            self._metrics_server = serve_control_plane_metrics(self.metrics_ports[0], lambda: ledger, dict)
        self.producer = Producer(self.store_url, self.partitions, opts.rate, opts.keys, self.say)
        self.producer.start()
        self._place_partitions()
        self._up_at = time.monotonic()
        self._banner()

    def _dagster_executables(self) -> tuple[str, str] | None:
        if self.code_location is None:
            where = (self.options.base_dir or Path.cwd()).resolve()
            self.say(
                "  no Dagster: the Dagster code location (workspace.yaml, definitions.py, assets/, jobs/, sensors/) "
                f"is part of the repository checkout, not the installed package, and {where} is not in one. "
                "Run the demo from a checkout (scripts/demo.sh) for the Dagster UI."
            )
            return None
        web, daemon = _executable("dagster-webserver"), _executable("dagster-daemon")
        if web is None or daemon is None:
            self.say("  no Dagster: dagster-webserver / dagster-daemon not found; running without the UI")
            return None
        return web, daemon

    def _start_node(self, node: int) -> Child:
        opts = self.options
        cmd = [
            sys.executable, "-m", "laminar_orchestration.cli", "node", "run",
            "--store", self.store_url, "--node-id", str(node),
            "--spark-master", opts.spark_master,
            "--heartbeat-timeout", str(opts.heartbeat_timeout_s),
            "--checkpoint-every-batches", "5", "--checkpoint-every-s", "10",
            "--table-sync-interval", f"{opts.table_sync_interval_s:g}",
        ]  # fmt: skip
        if node in self.metrics_ports:
            cmd += ["--metrics-port", str(self.metrics_ports[node])]
        return Child(f"node {node}", cmd, self.demo_dir / f"node{node}.log", env=os.environ)

    def _dagster_env(self, root: Path) -> dict[str, str]:
        opts = self.options
        home = self.demo_dir / "dagster_home"
        home.mkdir()
        # The code location's instance settings: runs launch on submit, sensors run in threads.
        settings = root / "dagster.yaml"
        if settings.exists():
            shutil.copyfile(settings, home / "dagster.yaml")
        else:
            (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\nnux:\n  enabled: false\n")
        return {
            **os.environ,
            "DAGSTER_HOME": str(home),
            # dagster.yaml's run launcher (launcher/) is imported from the checkout.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH", "")])),
            "LAMINAR_STORE": self.store_url,
            # The failure sensor judges liveness with the demo's short timeout.
            "LAMINAR_FAILOVER_HEARTBEAT_TIMEOUT_S": str(opts.heartbeat_timeout_s),
            "LAMINAR_SPARK_MASTER": opts.spark_master,
            # The code location serves the control plane's /metrics (resources/metrics.py).
            **({"LAMINAR_METRICS_PORT": str(self.metrics_ports[0])} if 0 in self.metrics_ports else {}),
        }

    def _start_webserver(self, root: Path, executable: str, env: Mapping[str, str]) -> Child:
        cmd = [executable, "-w", str(root / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(self.options.port)]
        return Child("dagster webserver", cmd, self.demo_dir / "dagster-webserver.log", env=env, cwd=root)

    def _start_daemon(self, root: Path, executable: str, env: Mapping[str, str]) -> Child:
        cmd = [executable, "run", "-w", str(root / "workspace.yaml")]
        return Child("dagster daemon", cmd, self.demo_dir / "dagster-daemon.log", env=env, cwd=root)

    def _wait_nodes_alive(self) -> None:
        assert self.ledger is not None
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        want = set(self.nodes)
        while True:
            self._check_abort()
            for n, child in self.nodes.items():
                if not child.running():
                    raise DemoError(
                        f"node {n} exited ({child.describe_exit()}) while starting; "
                        f"its log {child.log_path} ends:\n{child.tail()}"
                    )
            if want <= live_node_ids(self.ledger):
                return
            if time.monotonic() > deadline:
                raise DemoError(f"nodes did not join within {NODE_START_TIMEOUT_S:.0f}s; see {self.demo_dir}")
            self._poll_webserver()
            self._sleep(0.3)

    def _place_partitions(self) -> None:
        """Put every partition on a live node: `laminar rebalance`'s plan, carried out the same way."""
        assert self.ledger is not None
        plan = plan_rebalance(self.ledger)
        if not plan.moves:
            self.say("placement: every partition is already on a live node")
            return
        self.say(
            f"placing {_plural(len(plan.moves), 'partition')} on nodes {sorted(plan.live_nodes)} "
            "(as `laminar rebalance` does):"
        )

        def done(outcome: MoveOutcome[list[PhaseReport]]) -> None:
            m = outcome.move
            if outcome.ok:
                verdict = "active"
            else:
                verdict = f"FAILED: {type(outcome.error).__name__}: {outcome.error}"
            self.say(
                f"  partition {m.partition}: node {m.from_node or '-'} -> {m.to_node} "
                f"in {outcome.duration_s:.1f}s: {verdict}"
            )

        reason = f"laminar demo: {_plural(len(plan.moves), 'move')}"
        run_rebalance(self.ledger, plan, MigrationConfig(), reason=reason, on_done=done)

    def _banner(self) -> None:
        assert self.ledger is not None
        opts = self.options
        stop_by = ""
        if opts.duration and self._up_at is not None:
            end = int(self._up_at - self.started + opts.duration)
            stop_by = f"; stops by itself at +{end // 60}:{end % 60:02d}"
        dagster = ["  dagster UI   not running"]
        if self.webserver is not None and self.daemon is not None:
            state = "ready" if self._webserver_ready else "starting, a line below says when it answers"
            dagster = [
                f"  dagster UI   http://127.0.0.1:{opts.port}  ({state})",
                f"               webserver pid {self.webserver.pid}, daemon pid {self.daemon.pid}",
            ]
        pids = {n: c.pid for n, c in self.nodes.items()}
        owners = ownership_map(self.ledger)
        for line in self._guide().banner(stop_by, pids, self._live(), owners, dagster, self.metrics_ports):
            self.say(line)

    def _guide(self) -> Walkthrough:
        """Where the pieces are, for the lines telling the user what to try."""
        assert self._table is not None
        opts = self.options
        return Walkthrough(
            self.store_url, self.demo_dir,
            f"{opts.rate:g} events/s over {self.partitions} partitions ({opts.keys} keys)",
            f"http://127.0.0.1:{opts.port}" if self.webserver is not None else None, self.daemon is not None,
            opts.heartbeat_timeout_s, self._table.location, opts.table_sync_interval_s,
        )  # fmt: skip

    def _live(self) -> dict[int, int]:
        """The pid of every node whose process runs."""
        return {n: c.pid for n, c in self.nodes.items() if c.running()}

    # -- watching -------------------------------------------------------------------------

    def _watch(self) -> None:
        next_table = time.monotonic()
        while True:
            self._check_abort()
            self._check_children()
            self._poll_webserver()
            self._poll_phases()
            if time.monotonic() >= next_table:
                try:
                    self._print_table()
                except StoreError as exc:
                    self.say(f"status: store unavailable: {exc}")
                next_table = time.monotonic() + self.options.interval
            self._sleep(0.25)

    def _check_children(self) -> None:
        for n, child in self.nodes.items():
            if not child.running() and not child.exit_reported:
                child.exit_reported = True
                self.say(f"[{self._elapsed()}] node {n} (pid {child.pid}) is gone: {child.describe_exit()}")
        for proc in (self.webserver, self.daemon):
            if proc is not None and not proc.running() and not proc.exit_reported:
                proc.exit_reported = True
                self.say(
                    f"[{self._elapsed()}] {proc.name} exited ({proc.describe_exit()}); "
                    f"its log {proc.log_path} ends:\n{proc.tail(1500)}"
                )

    def _poll_phases(self) -> None:
        """A line per migration phase as the ledger records it, between the tables."""
        assert self.ledger is not None
        try:
            lines = self._phases.poll(self.ledger) if self._phases.due() else []
        except StoreError:
            return  # the next table says the store is unavailable
        for line in lines:
            self.say(f"[{self._elapsed()}] {line}")

    def _poll_webserver(self) -> None:
        web = self.webserver
        if web is None or self._webserver_ready or self._webserver_gave_up or not web.running():
            return
        url = f"http://127.0.0.1:{self.options.port}/server_info"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                answered = resp.status == 200
        except (OSError, urllib.error.URLError):
            answered = False
        if answered:
            self._webserver_ready = True
            self._warm_run_launcher()
            self.say(
                f"[{self._elapsed()}] dagster webserver ready: http://127.0.0.1:{self.options.port} "
                "(answered /server_info)"
            )
        elif time.monotonic() - self.started > WEBSERVER_START_TIMEOUT_S:
            self._webserver_gave_up = True
            self.say(f"dagster webserver did not answer within {WEBSERVER_START_TIMEOUT_S:.0f}s: see {web.log_path}")

    def _warm_run_launcher(self) -> None:
        """Ask the webserver about its run launcher: building it starts the pool the first launch forks."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.options.port}/graphql",
            data=json.dumps({"query": "{ instance { runLauncher { name } } }"}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with contextlib.suppress(OSError, urllib.error.URLError), urllib.request.urlopen(request, timeout=10.0):
            pass

    def _rows(self) -> list[_PartitionRow]:
        assert self.ledger is not None
        at = time.monotonic()
        snapshot = self._phases.watch(self.ledger).snapshot()  # the table reads what the phase lines read
        self._last_snapshot = snapshot
        committed = {p.partition: p.committed_offset or 0 for p in snapshot.partitions}
        prev = self._last_sample
        gone = {n for n, child in self.nodes.items() if not child.running()}
        rows = []
        for p in snapshot.partitions:
            rate = None
            if prev is not None and p.partition in prev.committed and at > prev.at:
                rate = (committed[p.partition] - prev.committed[p.partition]) / (at - prev.at)
            rows.append(
                _PartitionRow(
                    partition=p.partition,
                    owner=p.owner,
                    epoch=p.epoch,
                    status=partition_status(p, gone),
                    committed=committed[p.partition],
                    end=p.log_end or 0,
                    rate=rate,
                    lag_s=self._lag_clock.observe(p.partition, p.log_end or 0, committed[p.partition], at),
                )
            )
        self._last_sample = _Sample(at, committed)
        return rows

    def _ownership_changes(self, rows: list[_PartitionRow]) -> list[str]:
        assert self.ledger is not None
        lines = []
        for r in rows:
            before = self._last_owners.get(r.partition)
            now_ = (r.owner, r.epoch)
            if before is not None and before != now_ and r.epoch > before[1]:
                grant = self.ledger.grant(PartitionId(r.partition), r.epoch)
                how = "migration"
                if grant is not None and grant.grant_kind == GrantKind.FENCE:
                    how = "placement" if grant.previous_owner == UNASSIGNED else "failover: fenced"
                lines.append(
                    f"  ownership: partition {r.partition} node {before[0] or '-'} -> {r.owner or '-'}, "
                    f"epoch {before[1]} -> {r.epoch} ({how})"
                )
            self._last_owners[r.partition] = now_
        return lines

    def _print_table(self, *, final: bool = False) -> None:
        assert self.ledger is not None
        rows = self._rows()
        changes = self._ownership_changes(rows)
        committed = sum(r.committed for r in rows)
        lag = sum(r.lag for r in rows)
        rates = [r.rate for r in rows if r.rate is not None]
        rate = f"{sum(rates):,.0f} events/s committed" if rates else "throughput from the next table on"
        produced = self.producer.produced if self.producer else 0
        clock = datetime.now().strftime("%H:%M:%S")
        title = "final status" if final else "status"
        out = [f"── {title} {clock} ({self._elapsed()}) · produced {produced:,} · committed {committed:,} · "
               f"lag {lag:,} · {rate} ──"]  # fmt: skip
        out.extend(changes)
        if changes and not final:
            out.extend(self._guide().kill_hint({r.partition: r.owner for r in rows}, self._live()))  # stale now
        out.append(f"{'PARTITION':>9}  {'OWNER':>5}  {'EPOCH':>5}  {'STATUS':<34} {'COMMITTED':>10} {'LAG':>8} "
                   f"{'LAG S':>6} {'EVENTS/S':>9}")  # fmt: skip
        for r in rows:
            owner = str(r.owner) if r.owner != UNASSIGNED else "-"
            ev = f"{r.rate:,.1f}" if r.rate is not None else "-"
            out.append(
                f"{r.partition:>9}  {owner:>5}  {r.epoch:>5}  {r.status:<34} {r.committed:>10,} {r.lag:>8,} "
                f"{r.lag_s:>6.0f} {ev:>9}"
            )
        live = {n.node: n for n in (self._last_snapshot.nodes if self._last_snapshot else ())}
        nodes = []
        for n, child in sorted(self.nodes.items()):
            view = live.get(n)
            if not child.running():
                state = f"stopped ({child.describe_exit()})"
            elif view is None:
                state = "starting"
            elif view.alive:
                state = "alive"
            else:
                state = f"NO HEARTBEAT for {view.heartbeat_age_s:.0f}s"
            held = sum(1 for r in rows if r.owner == n and not r.status.startswith("released"))
            nodes.append(f"node {n} {state} ({_plural(held, 'partition')})")
        out.append("nodes: " + " · ".join(nodes))
        if self._table is not None:
            out.append(self._table.status_line())
        self.say("\n".join(out) + "\n")

    # -- stopping ------------------------------------------------------------------------------

    def _stop_all(self) -> None:
        hurry = lambda: self._hurry  # noqa: E731 - read each time: a second Ctrl-C shortens every wait
        try:
            if self.producer is not None:
                self.producer.stop()
                self.say(f"producer stopped after {self.producer.produced:,} events")
            # The daemon goes before the nodes: nodes leaving on purpose must not look like dead ones
            # to the failure sensor.
            if self.daemon is not None:
                # A migration or failover run it launched gets to finish rather than stop mid-phase
                # (it would resume from its record, but a clean store is nicer); other runs just stop.
                grace = 30.0 if self._migrations_in_flight() else 1.0
                self._stop_child(self.daemon, 20.0, hurry, group_grace=grace)
            self._catch_up(hurry)
            if self.nodes:
                self.say("nodes: leaving one at a time (each hands its partitions on; the last releases them) ...")
            # One at a time: stopped together, each would hand its partitions to a peer stopping too and
            # wait out its leave deadline before releasing them.
            for child in self.nodes.values():
                self._stop_child(child, 90.0, hurry)
            if self.webserver is not None:
                self._stop_child(self.webserver, 20.0, hurry)
        finally:
            if self._metrics_server is not None:
                self._metrics_server.close()
            # Whatever went wrong above, no child outlives the demo.
            for leftover in [*self.nodes.values(), self.webserver, self.daemon]:
                if leftover is not None and not leftover.cleaned:
                    leftover.kill_group()
                    leftover.close()

    def _stop_child(
        self,
        child: Child,
        timeout: float,
        hurry: Callable[[], bool],
        *,
        already_signalled: bool = False,
        group_grace: float = 5.0,
    ) -> None:
        if child.running() and not already_signalled:
            child.signal(signal.SIGTERM)
        code = child.wait(timeout, hurry)
        if code is None:
            self.say(f"{child.name} (pid {child.pid}) did not stop in time: killed")
        elif not child.exit_reported:
            self.say(f"{child.name} (pid {child.pid}) stopped: {child.describe_exit()}")
        child.exit_reported = True
        # What it started may still be finishing (a Dagster run, a JVM shutting down): a moment's grace.
        if code is not None and not child.wait_group(min(1.0, group_grace), hurry) and group_grace > 1.0:
            if group_grace >= 10:
                self.say(f"{child.name}: waiting up to {group_grace:.0f}s for what it started to finish ...")
            child.wait_group(group_grace - 1.0, hurry)
        # Whatever is left in its process group (Spark JVM, code servers, run workers) goes now.
        child.kill_group()
        child.close()

    def _migrations_in_flight(self) -> bool:
        if self.ledger is None:
            return False
        try:
            return bool(migrations_in_flight(self.ledger))
        except StoreError:
            return False

    def _catch_up(self, hurry: Callable[[], bool], timeout: float = 15.0) -> None:
        """Give running nodes a moment to commit the last appended events, so the audit shows everything."""
        if self.ledger is None or not self.nodes or self._hurry:
            return
        try:
            live = live_node_ids(self.ledger)
            owners = ownership_map(self.ledger)
            if not all(n in live for n in owners.values()):
                return  # a partition without a live owner will not catch up
            manifests = ManifestReader(self.ledger.store)
            source = SourceLog(self.ledger.store, partitions=self.partitions)
            ends = {p: source.end_offset(p) for p in owners}

            def caught_up() -> bool:
                for p, end in ends.items():
                    cur = manifests.current(PartitionId(p))
                    if (cur.manifest.source_offset if cur else 0) < end:
                        return False
                return True

            deadline = time.monotonic() + timeout
            while not caught_up() and time.monotonic() < deadline and not hurry():
                time.sleep(0.3)
        except StoreError:
            return

    def _final_report(self) -> bool:
        if self.ledger is None or not self.nodes:
            return False  # nothing ran: nothing to audit
        with contextlib.suppress(StoreError):
            self._print_table(final=True)
        self.say("laminar verify:")
        audits = audit_store(self.ledger.store)
        for audit in audits:
            for line in audit.summary_lines():
                self.say(line)
        ok = all(a.ok for a in audits)
        self.say("verify: OK" if ok else "verify: FAILED")
        if self._table is not None:  # the nodes' last syncs are done: they stopped
            for line in self._table.final_lines({a.partition: a.committed_offset for a in audits}):
                self.say(line)
        self.say()
        self.say(f"store  {self.store_url}")
        self.say(f"logs   {self.demo_dir}/")
        self.say(f"next   {program('laminar')} report --store {self.store_url}   # the ownership timeline as HTML")
        return ok


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _absolute_store_url(url: str) -> str:
    # Dagster runs with the repo root as its working directory: a relative path must mean the same there.
    if "://" in url:
        return url
    return Path(url).expanduser().resolve().as_uri()


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise DemoError(f"port {port} on 127.0.0.1 is in use ({exc.strerror}): pass --port") from None


def run_demo(options: DemoOptions, out: TextIO | None = None) -> int:
    """Run the demo until Ctrl-C, SIGTERM or `options.duration`; 0 when the final audit is OK."""
    return Demo(options, out or sys.stdout).run()
