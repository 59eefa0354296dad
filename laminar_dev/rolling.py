"""A rolling restart of a local cluster, as Kubernetes rolls a StatefulSet: each node in turn gets
SIGTERM, leaves gracefully (its partitions moved away as planned migrations), exits, starts again and
takes its share back - with no command from anyone - while a producer appends at a steady rate.

The nodes are Spark-less node processes (`laminar_dev.arrownode`) with a graceful leave and their
/healthz; the test suite and `benchmarks.bench_rolling_restart` run it and read its report: how each
node's leave went, whether /healthz said "not ready" while it left, and every partition's
unavailability at each change of owner (its old owner's last data commit -> its new owner's first),
held against planned moves made in the same cluster, under the same load, just before the restarts.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from laminar_dev.localcluster import Cluster, NodeProcess, wait_until
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import run_migration
from laminar_orchestration.control.operations import plan_rebalance, run_rebalance
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.records import now
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationKind, MigrationPhase

HEARTBEAT_TIMEOUT_S = 3.0
#: Above the leaves' usual seconds on a loaded machine's S3-protocol test server (6-12 s alone, up to the
#: whole deadline beside the suite's other scenarios).
LEAVE_DEADLINE_S = 25.0
#: After its drain's deadline a node still finishes a move past its point of no return, releases the rest,
#: syncs the table and exits: the 10 s a pod's grace period (30 s) leaves after the default deadline (20 s).
EXIT_AFTER_DEADLINE_S = 10.0


def healthz(port: int) -> int | None:
    """The HTTP status of a node's /healthz (None: nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


class RollingCluster(Cluster):
    """`localcluster.Cluster` whose nodes are Spark-less processes with a graceful leave and /healthz."""

    def __init__(self, store_url: str, workdir: Path, *, partitions: int, ports: dict[int, int]) -> None:
        super().__init__(store_url, workdir, partitions=partitions, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
        self.ports = ports

    def start_node(self, node_id: int, *extra: str) -> NodeProcess:
        log_path = self.workdir / f"node{node_id}-{int(time.time() * 1000)}.log"
        cmd = [
            sys.executable, "-m", "laminar_dev.arrownode", "--store", self.store_url, "--node-id", str(node_id),
            "--node-defaults", "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S), "--heartbeat-interval", "0.5",
            "--metrics-port", str(self.ports[node_id]), "--table-sync-interval", "1",
            "--leave-deadline", str(LEAVE_DEADLINE_S), *extra,
        ]  # fmt: skip
        with open(log_path, "wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env)
        node = NodeProcess(node_id, proc, log_path)
        self.nodes[node_id] = node
        return node


class SteadyProducer(threading.Thread):
    """Appends `per_tick` generated events over every partition each `interval_s` until stopped."""

    def __init__(self, cluster: Cluster, per_tick: int, interval_s: float) -> None:
        super().__init__(name="producer", daemon=True)
        self.cluster, self.per_tick, self.interval_s = cluster, per_tick, interval_s
        self._stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        seed = itertools.count(1_000)
        try:
            while not self._stop_event.wait(self.interval_s):
                events = generate_events(self.per_tick, 50, next(seed), len(self.cluster.partitions))
                for p, table in events.items():
                    self.cluster.source.append(p, table)
                    self.cluster.produced.append(table)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)
        if self.error is not None:
            raise RuntimeError(f"producer failed: {self.error}") from self.error


@dataclass
class NodeRestart:
    """One node's turn: what it owned, how its leave and return went."""

    node: int
    owned: list[int]
    exit_code: int | None = None
    #: When the node was sent SIGTERM and when it exited (the ledger's clock: UTC).
    signalled_at: datetime | None = None
    exited_at: datetime | None = None
    #: SIGTERM -> the process exited.
    leave_s: float = 0.0
    #: /healthz answered 503 between the signal and the exit.
    not_ready_while_leaving: bool = False
    #: partition -> how it left: "graceful" (a migration from this node that ended Active), else what the ledger says.
    left_by: dict[int, str] = field(default_factory=dict)
    #: Start -> /healthz 200, and start -> owning a partition again.
    ready_s: float = 0.0
    took_back_s: float = 0.0


@dataclass(frozen=True)
class Handoff:
    """One change of a partition's owner epoch: its old owner's last data commit -> its new owner's first."""

    partition: int
    #: The epoch of the new owner's first data commit.
    epoch: int
    gap_s: float


@dataclass
class RollingReport:
    restarts: list[NodeRestart]
    #: Every change of owner of the run, the planned moves' before the restarts included.
    handoffs: list[Handoff]
    events: int = 0
    #: (partition, epoch) of the planned moves made before the first restart (the yardstick).
    planned: frozenset[tuple[int, int]] = frozenset()

    @property
    def gaps(self) -> list[float]:
        """The restarts' handoffs (the leaves' and the returns'), sorted."""
        return sorted(h.gap_s for h in self.handoffs if (h.partition, h.epoch) not in self.planned)

    @property
    def planned_gaps(self) -> list[float]:
        """The planned moves' handoffs, in the same cluster under the same load, sorted."""
        return sorted(h.gap_s for h in self.handoffs if (h.partition, h.epoch) in self.planned)

    def gaps_by_kind(self, ledger: Ledger) -> dict[str, list[float]]:
        """The restarts' handoffs split by their grant: "leave" (granted away from a node while it
        left) and "return" (the rest: a restarted node taking its share back), each sorted."""
        kinds: dict[str, list[float]] = {"leave": [], "return": []}
        for h, kind, _ in self.restart_handoffs(ledger):
            kinds[kind].append(h.gap_s)
        return {k: sorted(v) for k, v in kinds.items()}

    def restart_handoffs(self, ledger: Ledger) -> list[tuple[Handoff, str, str]]:
        """Each of the restarts' handoffs with its kind ("leave" or "return") and its grant's move
        ("node 1 -> 3"), partition by partition."""
        out = []
        for h in self.handoffs:
            if (h.partition, h.epoch) in self.planned:
                continue
            grant = ledger.grant(PartitionId(h.partition), h.epoch)
            leaving = grant is not None and any(
                t.node == grant.previous_owner
                and t.signalled_at is not None
                and t.exited_at is not None
                and t.signalled_at <= grant.granted_at <= t.exited_at
                for t in self.restarts
            )
            move = f"node {grant.previous_owner} -> {grant.node}" if grant is not None else "no grant"
            out.append((h, "leave" if leaving else "return", move))
        return out


def place(cluster: Cluster) -> None:
    """The initial placement (what `laminar rebalance` does once at setup)."""
    plan = plan_rebalance(cluster.ledger)
    run_rebalance(cluster.ledger, plan, MigrationConfig(), reason="initial placement")


def _leave_kinds(cluster: Cluster, node: int, owned: list[int]) -> dict[int, str]:
    out = {}
    for p in owned:
        task = cluster.coordinator.current(PartitionId(p))
        own = cluster.ledger.ownership(PartitionId(p))
        graceful = (
            task is not None
            and task.migration_kind == MigrationKind.GRACEFUL
            and task.from_node == node
            and task.phase == MigrationPhase.ACTIVE
            and own is not None
            and own.owner == task.to_node
        )
        out[p] = "graceful" if graceful else f"{own.status if own else 'none'} on node {own.owner if own else 0}"
    return out


def restart_node(cluster: RollingCluster, node: int, *, timeout_s: float = 60.0) -> NodeRestart:
    """SIGTERM `node`, watch its /healthz until it exits, start it again and wait until it is ready
    and owns a partition again (its own rejoin: no command from anyone)."""
    turn = NodeRestart(node, cluster.partitions_of(node))
    port = cluster.ports[node]
    started = time.monotonic()
    turn.signalled_at = now()
    cluster.nodes[node].signal(signal.SIGTERM)
    proc = cluster.nodes[node].proc
    while proc.poll() is None and time.monotonic() - started < timeout_s:
        if healthz(port) == 503:
            turn.not_ready_while_leaving = True
        time.sleep(0.05)
    turn.exit_code = proc.wait(5)
    turn.leave_s = time.monotonic() - started
    turn.exited_at = now()
    turn.left_by = _leave_kinds(cluster, node, turn.owned)
    started = time.monotonic()
    cluster.start_node(node)
    wait_until(lambda: healthz(port) == 200, timeout_s, f"node {node}'s /healthz to answer 200", 0.05)
    turn.ready_s = time.monotonic() - started
    wait_until(lambda: bool(cluster.partitions_of(node)), timeout_s, f"node {node} to take its share back", 0.1)
    turn.took_back_s = time.monotonic() - started
    return turn


def handoffs(cluster: Cluster) -> list[Handoff]:
    """Every partition's changes of owner epoch: its last data commit before -> the first after."""
    reader = ManifestReader(cluster.store)
    out: list[Handoff] = []
    for p in cluster.partitions:
        data = [v.manifest for v in reader.history(PartitionId(p)) if v.manifest.outputs]
        out += [
            Handoff(int(p), b.fencing_token, (b.committed_at - a.committed_at).total_seconds())
            for a, b in itertools.pairwise(data)
            if b.fencing_token != a.fencing_token
        ]
    return out


def planned_moves(cluster: Cluster, nodes: list[int], *, rounds: int = 1) -> frozenset[tuple[int, int]]:
    """Move every partition `rounds` times to the next node of `nodes`, one after the other, as `laminar
    migrate` does; the (partition, epoch) of each move. The restarts' handoffs are held against these."""
    coordinator = MigrationCoordinator(cluster.ledger)
    reader = ManifestReader(cluster.store)
    moved = set()
    for p in [p for _ in range(rounds) for p in cluster.partitions]:
        own = cluster.ledger.ownership(p)
        assert own is not None

        def committed_here(p: PartitionId = p, epoch: int = own.epoch) -> bool:
            current = reader.current(p)
            return current is not None and current.manifest.fencing_token == epoch and bool(current.manifest.outputs)

        # A gap is measured from the owner's last data commit: the move waits for its first one.
        wait_until(committed_here, 30, f"partition {p}'s first data commit at epoch {own.epoch}")
        target = nodes[(nodes.index(int(own.owner)) + 1) % len(nodes)]
        task = run_migration(coordinator, int(p), target)
        assert task.phase == MigrationPhase.ACTIVE, task
        moved.add((int(p), task.to_epoch))
    return frozenset(moved)


def rolling_restart(
    cluster: RollingCluster,
    nodes: list[int],
    *,
    per_tick: int = 20,
    interval_s: float = 0.1,
    settle_s: float = 2.0,
    planned_first: bool = True,
    planned_rounds: int = 1,
) -> RollingReport:
    """Place the partitions, run a steady producer, move each partition `planned_rounds` times as planned
    (with `planned_first`: the yardstick), restart every node of `nodes` in turn, wait until everything
    produced is committed; the report. The cluster's nodes must be up."""
    cluster.wait_alive(*nodes, timeout=60)
    place(cluster)
    producer = SteadyProducer(cluster, per_tick, interval_s)
    producer.start()
    restarts = []
    try:
        time.sleep(settle_s)
        planned = planned_moves(cluster, nodes, rounds=planned_rounds) if planned_first else frozenset()
        time.sleep(settle_s if planned_first else 0.0)
        for n in nodes:
            restarts.append(restart_node(cluster, n))
            time.sleep(settle_s)
    finally:
        producer.stop()
    cluster.wait_committed(timeout=120)
    events = sum(t.num_rows for t in cluster.produced)
    return RollingReport(restarts, handoffs(cluster), events, planned)


def produced_table(cluster: Cluster) -> pa.Table:
    return pa.concat_tables(cluster.produced)
