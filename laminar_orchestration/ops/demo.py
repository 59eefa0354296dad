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
end. Beside this run loop: its Dagster processes (`demo_dagster`), status table
(`demo_table`) and orderly end (`demo_shutdown`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import TextIO

from laminar_orchestration.control.moves import MoveOutcome
from laminar_orchestration.control.operations import plan_rebalance, run_rebalance
from laminar_orchestration.control.snapshot import live_node_ids, ownership_map
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.errors import InvalidArgument
from laminar_orchestration.metrics import MetricsServer
from laminar_orchestration.ops.demo_dagster import (
    WEBSERVER_START_TIMEOUT_S,
    check_port_free,
    dagster_env,
    dagster_executables,
    find_code_location,
    start_daemon,
    start_webserver,
    warm_run_launcher,
    webserver_answers,
)
from laminar_orchestration.ops.demo_processes import Child, Producer
from laminar_orchestration.ops.demo_shutdown import audit_at_end, stop_in_order
from laminar_orchestration.ops.demo_status import PhaseWatch, port_or_free
from laminar_orchestration.ops.demo_table import StatusTable
from laminar_orchestration.ops.demo_walkthrough import TableWatch, Walkthrough, program
from laminar_orchestration.ops.errors import DemoError
from laminar_orchestration.ops.ledger_metrics import serve_control_plane_metrics
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.tasks import MigrationConfig, PhaseReport
from laminar_orchestration.store import StoreError, open_store
from laminar_orchestration.table import table_location

DEFAULT_PORT = 3000
#: How long nodes get to start Spark and join.
NODE_START_TIMEOUT_S = 240.0


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


# --- the demo -----------------------------------------------------------------------------


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
        self._print_lock = threading.Lock()
        self._phases = PhaseWatch()
        self._status = StatusTable(self._phases)  # its rows read what the phase lines read
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
        dagster_bins = dagster_executables(self.code_location, opts.base_dir, self.say) if opts.dagster else None
        if self.code_location is not None and dagster_bins is not None:
            check_port_free(opts.port)  # before anything is created or started
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
        env = None
        if self.code_location is not None and dagster_bins is not None:
            env = self._dagster_env(self.code_location)
            self.webserver = start_webserver(self.code_location, dagster_bins[0], opts.port, env, self.demo_dir)
        nodes = ", ".join(f"node {n} (pid {c.pid})" for n, c in self.nodes.items())
        self.say(f"starting {nodes} — one local Spark each, this takes a little while ...")
        if self.webserver is not None:
            self.say(f"starting the dagster webserver (pid {self.webserver.pid}) on http://127.0.0.1:{opts.port}")
        self._wait_nodes_alive()
        if self.code_location is not None and dagster_bins is not None and env is not None:
            # After the nodes' Spark start-up: on a small machine the daemon's first runs would slow it down.
            self.daemon = start_daemon(self.code_location, dagster_bins[1], env, self.demo_dir)
        if self.daemon is None and 0 in self.metrics_ports:
            # No Dagster code location to serve the control plane's metrics: the demo serves them itself.
            self._metrics_server = serve_control_plane_metrics(self.metrics_ports[0], lambda: ledger, dict)
        self.producer = Producer(self.store_url, self.partitions, opts.rate, opts.keys, self.say)
        self.producer.start()
        self._place_partitions()
        self._up_at = time.monotonic()
        self._banner()

    def _start_node(self, node: int) -> Child:
        opts = self.options
        cmd = [
            sys.executable, "-m", "laminar_orchestration.cli", "node", "run",
            "--store", self.store_url, "--node-id", str(node),
            "--spark-master", opts.spark_master,
            "--heartbeat-timeout", str(opts.heartbeat_timeout_s),
            # Snapshots at the node's default cadence, as users run nodes (a tighter one cost the
            # demo ~2 store requests a second for a restore with fewer deltas to replay).
            "--table-sync-interval", f"{opts.table_sync_interval_s:g}",
        ]  # fmt: skip
        if node in self.metrics_ports:
            cmd += ["--metrics-port", str(self.metrics_ports[node])]
        return Child(f"node {node}", cmd, self.demo_dir / f"node{node}.log", env=os.environ)

    def _dagster_env(self, root: Path) -> dict[str, str]:
        opts = self.options
        return dagster_env(
            root, self.demo_dir, self.store_url, heartbeat_timeout_s=opts.heartbeat_timeout_s,
            spark_master=opts.spark_master, metrics_port=self.metrics_ports.get(0),
        )  # fmt: skip

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
        if webserver_answers(self.options.port):
            self._webserver_ready = True
            warm_run_launcher(self.options.port)
            self.say(
                f"[{self._elapsed()}] dagster webserver ready: http://127.0.0.1:{self.options.port} "
                "(answered /server_info)"
            )
        elif time.monotonic() - self.started > WEBSERVER_START_TIMEOUT_S:
            self._webserver_gave_up = True
            self.say(f"dagster webserver did not answer within {WEBSERVER_START_TIMEOUT_S:.0f}s: see {web.log_path}")

    def _print_table(self, *, final: bool = False) -> None:
        assert self.ledger is not None
        table = self._status.render(
            self.ledger, self.nodes, self.producer, elapsed=self._elapsed,
            kill_hint=lambda owners: self._guide().kill_hint(owners, self._live()), table=self._table, final=final,
        )  # fmt: skip
        self.say(table)

    # -- stopping ------------------------------------------------------------------------------

    def _stop_all(self) -> None:
        stop_in_order(
            self.ledger, self.partitions, producer=self.producer, daemon=self.daemon, nodes=self.nodes,
            webserver=self.webserver, metrics_server=self._metrics_server,
            hurry=lambda: self._hurry, say=self.say,  # read each time: a second Ctrl-C shortens every wait
        )  # fmt: skip

    def _final_report(self) -> bool:
        if self.ledger is None or not self.nodes:
            return False  # nothing ran: nothing to audit
        with contextlib.suppress(StoreError):
            self._print_table(final=True)
        ok = audit_at_end(self.ledger.store, self._table, self.say)
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


def run_demo(options: DemoOptions, out: TextIO | None = None) -> int:
    """Run the demo until Ctrl-C, SIGTERM or `options.duration`; 0 when the final audit is OK."""
    return Demo(options, out or sys.stdout).run()
