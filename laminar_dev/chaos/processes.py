"""The scenarios on node processes: kill, pause, restart nodes and the orchestrator on one local cluster."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from laminar_dev.localcluster import Cluster, NodeProcess, wait_until
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.failover import prepare_failover
from laminar_orchestration.control.moves import drive, record_failure, run_migration, run_moves
from laminar_orchestration.control.placement import Move
from laminar_orchestration.control.snapshot import live_node_ids, ownership_map
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.tasks import (
    MigrationError,
    MigrationKind,
    MigrationPhase,
    MigrationTask,
    phase_sequence,
)
from laminar_orchestration.store import StoreError

from .evidence import LogCounts, Measure, apply_difference, count_revocations, measure
from .migrations import balance, fail_over, migrate_unless_there, outcome_issues, retrying, wait_committed
from .profiles import KEYS, MIGRATION_CONFIG, NODE_IDS, PARTITIONS, Profile
from .results import ScenarioResult

P, N = PartitionId, NodeId


class ProcessChaos:
    """The node-process scenarios, sharing one `Cluster` of 3 nodes and 4 partitions."""

    def __init__(self, store_url: str, workdir: Path, profile: Profile, say: Callable[[str], None]) -> None:
        self.profile = profile
        self.say = say
        self.workdir = workdir
        # Nodes make their per-partition staging directories under TMPDIR: knowing
        # where lets us see a batch in flight (its directory exists only while Spark runs it).
        self.tmp = workdir / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.cluster = Cluster(store_url, workdir, partitions=PARTITIONS, env={"TMPDIR": str(self.tmp)})
        self.ledger = self.cluster.ledger
        self.store = self.cluster.store
        self.backend = "local" if store_url.startswith("file:") else "s3"
        self.procs: list[NodeProcess] = []
        self._produce_lock = threading.Lock()
        self._audited = Measure()
        self._subprocesses: list[subprocess.Popen[bytes]] = []
        self._current: ScenarioResult | None = None

    def note(self, msg: str) -> None:
        """Say it, and keep it in the running scenario's notes."""
        self.say(msg)
        if self._current is not None:
            self._current.notes.append(msg)

    # -- nodes ----------------------------------------------------------------------------------

    def start_nodes(self) -> None:
        for n in NODE_IDS:
            self._start(n)

    def _start(self, n: int) -> None:
        self.procs.append(self.cluster.start_node(n))

    def _running(self, n: int) -> bool:
        node = self.cluster.nodes.get(n)
        return node is not None and node.proc.poll() is None

    def live(self) -> set[int]:
        return live_node_ids(self.ledger) & {n for n in NODE_IDS if self._running(n)}

    def close(self) -> None:
        for proc in self._subprocesses:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.cluster.shutdown()
        for node in self.procs:  # earlier incarnations too
            if node.proc.poll() is None:
                node.signal(signal.SIGCONT)
                node.signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(30)

    def _log_counts(self) -> LogCounts:
        total = LogCounts()
        for node in self.procs:
            with contextlib.suppress(OSError):
                c = count_revocations(node.log().splitlines())
                total = LogCounts(total.revoked + c.revoked, total.rejected_publishes + c.rejected_publishes)
        return total

    def _batch_dirs(self, n: int) -> set[Path]:
        return set(self.tmp.glob(f"laminar-node{n}-*/batches/p*-*/batch-*"))

    def _wait_mid_batch(self, n: int, before: set[Path], timeout: float = 30.0) -> tuple[int, int] | None:
        """Wait until node `n` is running a batch it was not running before; (partition, batch start)."""
        found: list[Path] = []

        def in_batch() -> bool:
            found[:] = sorted(self._batch_dirs(n) - before)
            return bool(found)

        try:
            wait_until(in_batch, timeout, f"node {n} to start a batch", interval=0.01)
        except TimeoutError:
            return None
        d = found[0]
        return int(d.parent.name.split("-")[0][1:]), int(d.name.split("-")[1])

    # -- data -----------------------------------------------------------------------------------

    def produce(self, count: int) -> None:
        with self._produce_lock:
            self.cluster.produce(count, keys=KEYS)

    @contextlib.contextmanager
    def load(self) -> Iterator[None]:
        """Produce a chunk every `load_interval_s` in the background while inside."""
        stop = threading.Event()
        failures: list[BaseException] = []

        def run() -> None:
            while not stop.is_set():
                try:
                    self.produce(self.profile.load_events)
                except BaseException as exc:
                    failures.append(exc)
                    return
                stop.wait(self.profile.load_interval_s)

        t = threading.Thread(target=run, name="chaos-load", daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join(60)
            if failures:
                raise RuntimeError(f"background load failed: {failures[0]!r}")

    # -- scenario frame ---------------------------------------------------------------------------

    def prepare(self, min_live: int, *, all_nodes: bool = False) -> None:
        """Bring dead nodes back, wait for enough live ones, finish leftover moves, balance."""
        for n in NODE_IDS:
            if not self._running(n):
                self.say(f"restarting node {n}")
                self._start(n)
        want = len(NODE_IDS) if all_nodes else min_live
        wait_until(lambda: len(self.live()) >= want, 240, f"{want} live nodes", interval=0.5)
        coordinator = MigrationCoordinator(self.ledger, MIGRATION_CONFIG)
        live = self.live()
        for p in self.cluster.partitions:
            task = coordinator.current(p)
            if task is None or task.is_terminal:
                continue
            try:
                if task.from_node in live and task.to_node in live:
                    drive(coordinator, task)
                else:  # resumes it if it can do without the dead node, supersedes it otherwise
                    decision = prepare_failover(coordinator, p, live=live)
                    if decision.task is not None:
                        drive(coordinator, decision.task)
            except (MigrationError, StoreError) as exc:
                record_failure(coordinator, p, task.migration_id, exc)
        issues = outcome_issues(balance(self.ledger, live, self.note), "balancing")
        if issues:
            raise RuntimeError("; ".join(issues))
        behind = wait_committed(self.store, self.profile.commit_timeout_s)
        if behind:
            raise RuntimeError(f"{behind} events still uncommitted before the scenario")

    def scenario(
        self,
        name: str,
        body: Callable[[ScenarioResult], None],
        *,
        min_live: int = 2,
        all_nodes: bool = False,
    ) -> ScenarioResult:
        """Prepare, run `body`, wait for everything to be committed, audit, and report the difference."""
        result = ScenarioResult(name, self.backend)
        self._current = result
        self.say(f"{name}: preparing")
        before = self._audited
        try:
            self.prepare(min_live, all_nodes=all_nodes)
        except Exception as exc:
            result.error = f"preparation failed: {type(exc).__name__}: {exc}"
        # Counted from here: what preparing did (restarts, balancing) is not the scenario's.
        counts = self._cheap_measure()
        logs = self._log_counts()
        started = time.monotonic()
        if result.error is None:
            self.say(f"{name}: running")
            try:
                body(result)
            except Exception as exc:
                result.error = f"{type(exc).__name__}: {exc}"
                self.say(f"{name}: {traceback.format_exc()}")
        behind = wait_committed(self.store, self.profile.commit_timeout_s)
        result.duration_s = time.monotonic() - started
        if behind:
            result.issues.append(f"{behind} events still uncommitted after {self.profile.commit_timeout_s:.0f}s")
        self.say(f"{name}: auditing")
        after = measure(self.store, self.cluster.expected_counts() if behind == 0 else None)
        self._audited = after
        apply_difference(result, before, after)
        result.events_produced = after.produced - counts.produced
        result.events_committed = after.committed - counts.committed
        result.epochs_granted = after.epochs - counts.epochs
        delta = self._log_counts() - logs
        result.revoked += delta.revoked
        result.stale_writes_attempted += delta.rejected_publishes
        result.stale_writes_rejected += delta.rejected_publishes
        self.say(f"{name}: {result.verdict} in {result.duration_s:.1f}s")
        return result

    def _cheap_measure(self) -> Measure:
        source, reader = self.cluster.source, self.cluster.manifests
        produced = committed = epochs = 0
        for p in self.cluster.partitions:
            produced += source.end_offset(p)
            current = reader.current(p)
            committed += current.manifest.source_offset if current else 0
            own = self.ledger.ownership(p)
            epochs += own.epoch if own else 0
        return Measure(produced=produced, committed=committed, epochs=epochs)

    def _victim(self, live: set[int]) -> int:
        """The live node holding the most partitions."""
        return max(sorted(live), key=lambda n: len(self.cluster.partitions_of(n)))

    def _fail_over(self, node: int, result: ScenarioResult) -> float:
        started = time.monotonic()
        outcomes = fail_over(self.ledger, node, self.live() | {node}, self.note)
        result.issues += outcome_issues(outcomes, "failover")
        elapsed = time.monotonic() - started
        moved = [f"p{o.move.partition}->node {o.move.to_node}" for o in outcomes if o.ok]
        result.notes.append(f"failover of node {node} in {elapsed:.1f}s: {', '.join(moved) or 'nothing to move'}")
        return elapsed

    # -- the scenarios -------------------------------------------------------------------------------

    def kill9_mid_batch(self, result: ScenarioResult) -> None:
        victim = self._victim(self.live())
        before = self._batch_dirs(victim)
        killed_at = time.monotonic()
        self.produce(self.profile.batch_events)
        batch = self._wait_mid_batch(victim, before)
        self.cluster.kill(victim)
        killed_at = time.monotonic()
        if batch is None:
            result.issues.append(f"node {victim} never started a batch: killed without one in flight")
        else:
            p, start = batch
            committed = self.cluster.committed(p)
            result.notes.append(
                f"node {victim} SIGKILLed while Spark ran partition {p}'s batch from offset {start} "
                f"(committed offset {committed}, {self.cluster.source.end_offset(p) - committed} events uncommitted)"
            )
            if committed > start:
                result.issues.append(f"the batch at {start} was committed before the kill: not mid-batch")
        self.cluster.wait_dead(victim, timeout=30)
        self._fail_over(victim, result)
        result.notes.append(f"{time.monotonic() - killed_at:.1f}s from SIGKILL to every partition active again")
        self.produce(self.profile.load_events)
        self._start(victim)  # boots while the next scenarios run

    def zombie(self, result: ScenarioResult) -> None:
        live = self.live()
        zombie = self._victim(live)
        node = self.cluster.nodes[zombie]
        moved = self.cluster.partitions_of(zombie)
        epochs = {p: self.cluster.epoch(p) for p in moved}
        before = self._batch_dirs(zombie)
        self.produce(self.profile.batch_events)
        batch = self._wait_mid_batch(zombie, before)
        node.signal(signal.SIGSTOP)
        paused_at = datetime.now(UTC)
        revocations_before = count_revocations(node.log().splitlines())
        try:
            result.notes.append(
                f"node {zombie} SIGSTOPped "
                + (f"while Spark ran partition {batch[0]}'s batch from {batch[1]}" if batch else "(no batch seen)")
            )
            self.cluster.wait_dead(zombie, timeout=30)
            self._fail_over(zombie, result)
            self.produce(self.profile.load_events)
        finally:
            node.signal(signal.SIGCONT)
        try:
            wait_until(
                lambda: (count_revocations(node.log().splitlines()) - revocations_before).revoked >= len(moved),
                60,
                f"the zombie to report the revocation of {moved}",
            )
        except TimeoutError as exc:
            result.issues.append(str(exc))
        self.cluster.wait_alive(zombie, timeout=60)
        zombie_commits = 0
        for p in moved:
            for v in self.cluster.manifests.history(P(p)):
                m = v.manifest
                if m.node == zombie and m.fencing_token <= epochs[p] and m.committed_at > paused_at:
                    zombie_commits += 1
        if zombie_commits:
            result.issues.append(f"the zombie committed {zombie_commits} manifest(s) after it was fenced")
        result.notes.append(f"zombie resumed after failover of {moved}: {zombie_commits} commits after the pause")

    def kill9_mid_release(self, result: ScenarioResult, repetition: int) -> None:
        live = self.live()
        old = self._victim(live)
        p = self.cluster.partitions_of(old)[0]
        target = min(n for n in live if n != old)
        kill_phase = MigrationPhase.RELEASED if repetition % 2 == 0 else MigrationPhase.UPLOADING
        coordinator = MigrationCoordinator(self.ledger, MIGRATION_CONFIG)
        self.produce(self.profile.load_events)
        task = coordinator.plan(P(p), N(target))
        outcome: list[BaseException | None] = []
        with self.load():
            for phase in (MigrationPhase.PLANNED, MigrationPhase.DRAINING, MigrationPhase.CHECKPOINTING):
                if phase == kill_phase:
                    break
                coordinator.run_phase(P(p), task.migration_id, phase)

            def run_kill_phase() -> None:
                try:
                    coordinator.run_phase(P(p), task.migration_id, kill_phase)
                    outcome.append(None)
                except BaseException as exc:
                    outcome.append(exc)

            if kill_phase == MigrationPhase.RELEASED:
                coordinator.run_phase(P(p), task.migration_id, MigrationPhase.UPLOADING)
            waiter = threading.Thread(target=run_kill_phase, name="chaos-release")
            waiter.start()
            wait_until(
                lambda: (t := coordinator.current(P(p))) is not None and t.phase == kill_phase,
                30,
                f"phase {kill_phase} to be recorded",
                interval=0.001,
            )
            self.cluster.kill(old)
            waiter.join(120)
        released = self.ledger.release_record(P(p), task.from_epoch) is not None
        error = outcome[0] if outcome else None
        result.notes.append(
            f"node {old} SIGKILLed with partition {p}'s migration to node {target} recorded at {kill_phase}; "
            f"release {'written' if released else 'not written'}; coordinator: "
            + (f"{type(error).__name__}" if error else "phase completed")
        )
        current = coordinator.current(P(p))
        if current is not None and not current.is_terminal:
            with contextlib.suppress(MigrationError):
                drive(coordinator, current)  # needs the dead old owner unless it released: recorded Failed
        self.cluster.wait_dead(old, timeout=30)
        self._fail_over(old, result)
        final = coordinator.current(P(p))
        if self.cluster.owner(p) == old or final is None:
            result.issues.append(f"partition {p} still on the dead node {old}")
        else:
            result.notes.append(
                f"partition {p}: {final.migration_kind} migration {final.phase}, now node {self.cluster.owner(p)} "
                f"at epoch {self.cluster.epoch(p)}"
            )
        self._start(old)

    def orchestrator_killed(self, result: ScenarioResult, repetition: int) -> None:
        live = self.live()
        old = self._victim(live)
        p = self.cluster.partitions_of(old)[0]
        target = min(n for n in live if n != old)
        epoch = self.cluster.epoch(p)
        early = (MigrationPhase.CHECKPOINTING, MigrationPhase.UPLOADING, MigrationPhase.RELEASED)
        late = (MigrationPhase.DOWNLOADING, MigrationPhase.RESTORING, MigrationPhase.SEEKING)
        wanted = early if repetition % 2 == 0 else late
        self.produce(self.profile.batch_events // 2)  # a batch in flight makes the drain take a while
        cmd = [
            sys.executable, "-m", "laminar_orchestration.cli", "migrate",
            "--store", self.cluster.store_url, "--partition", str(p), "--to", str(target),
        ]  # fmt: skip
        with open(self.workdir / f"orchestrator-{p}-{int(time.time() * 1000)}.log", "wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.cluster.env)
        self._subprocesses.append(proc)
        seq = phase_sequence(MigrationKind.GRACEFUL)
        first = min(seq.index(w) for w in wanted)
        seen: list[MigrationPhase] = []

        def mid_way() -> bool:
            t = coordinator_view.current(P(p))
            if t is None or t.to_node != target or t.from_epoch != epoch:
                return proc.poll() is not None
            seen[:] = [t.phase]
            return t.is_terminal or (t.phase in seq and seq.index(t.phase) >= first) or proc.poll() is not None

        coordinator_view = MigrationCoordinator(self.ledger, MIGRATION_CONFIG)
        try:
            wait_until(mid_way, 90, f"the orchestrator to reach {wanted[0]}", interval=0.002)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        interrupted = coordinator_view.current(P(p))
        if interrupted is None or interrupted.is_terminal or interrupted.from_epoch != epoch:
            result.error = f"the orchestrator finished (or never planned) before it could be killed: {seen}"
            return
        result.notes.append(
            f"orchestrator SIGKILLed with partition {p}'s migration {old}->{target} at {interrupted.phase}"
        )
        # No retry: resuming the recorded migration must work the first time.
        task = run_migration(coordinator_view, p, target)
        if task.migration_id != interrupted.migration_id:
            result.issues.append(
                f"the resumed run planned migration {task.migration_id}, not {interrupted.migration_id}"
            )
        if task.phase != MigrationPhase.ACTIVE or self.cluster.owner(p) != target or self.cluster.epoch(p) != epoch + 1:
            result.issues.append(
                f"after resuming: {task.phase}, owner {self.cluster.owner(p)} at epoch {self.cluster.epoch(p)}"
            )
        else:
            result.notes.append(f"resumed migration {task.migration_id}: active on node {target} at epoch {epoch + 1}")

    def migrations_rebalance(self, result: ScenarioResult) -> None:
        live = self.live()
        moves_done = 0
        with self.load():
            # Two partitions of different owners, each to another node, at the same time.
            chosen: list[Move] = []
            owners_used: set[int] = set()
            for p, owner in sorted(ownership_map(self.ledger).items()):
                if owner in owners_used or len(chosen) == 2:
                    continue
                target = min((n for n in live if n != owner), key=lambda n: len(self.cluster.partitions_of(n)))
                chosen.append(Move(p, owner, target))
                owners_used.add(owner)

            def migrate(m: Move) -> MigrationTask | None:
                return retrying(
                    lambda: migrate_unless_there(self.ledger, m, live, MIGRATION_CONFIG),
                    f"migration of partition {m.partition}",
                    self.note,
                )

            outcomes = run_moves(chosen, migrate, 2, live_nodes=live)
            result.issues += outcome_issues(outcomes, "migration")
            moves_done += len(outcomes)
            epochs = [self.ledger.members.record().cluster_epoch]
            for round_ in range(self.profile.rebalance_rounds):
                drained = sorted(live)[round_ % len(live)]
                for weights in ({drained: 0.0}, None):
                    outcomes = balance(
                        self.ledger, live, self.note, weights=weights, bump_reason=f"chaos rebalance {round_}"
                    )
                    result.issues += outcome_issues(outcomes, "rebalance")
                    moves_done += len(outcomes)
            epochs.append(self.ledger.members.record().cluster_epoch)
        result.notes.append(
            f"{len(chosen)} concurrent migrations and {2 * self.profile.rebalance_rounds} rebalances under load: "
            f"{moves_done} moves, cluster epoch {epochs[0]} -> {epochs[-1]}"
        )

    def rolling_restart(self, result: ScenarioResult) -> None:
        # The busiest nodes first: a lighter profile restarts fewer nodes, but the ones that matter most.
        order = sorted(NODE_IDS, key=lambda n: (-len(self.cluster.partitions_of(n)), n))
        for n in order[: self.profile.rolling_nodes]:
            owned = self.cluster.partitions_of(n)
            epochs = {p: self.cluster.epoch(p) for p in owned}
            self.produce(self.profile.load_events)
            t0 = time.monotonic()
            code = self.cluster.stop(n)
            if code != 0:
                result.issues.append(f"node {n} exited with {code} on SIGTERM")
            # SIGTERM is a graceful leave: each partition is handed to a live node by a planned move, or,
            # if the leave's deadline passed first (a loaded machine), released at its epoch - never held.
            for p in owned:
                own = self.ledger.ownership(P(p))
                handed = own is not None and own.status == "active" and own.owner != n and own.epoch > epochs[p]
                released = own is not None and own.status == "released" and own.epoch == epochs[p]
                if not (handed or released):
                    result.issues.append(f"node {n} neither handed over nor released partition {p} on SIGTERM: {own}")
            self._start(n)
            self.cluster.wait_alive(n, timeout=240)
            # Back up, the node takes its share again by itself (it rejoins): no operator command.
            share = len(self.cluster.partitions) // len(NODE_IDS)

            def has_share(n: int = n, share: int = share) -> bool:
                return len(self.cluster.partitions_of(n)) >= share

            wait_until(has_share, 90, f"node {n} to take its share ({share} partitions) back")
            result.notes.append(
                f"node {n}: left, restarted, took {self.cluster.partitions_of(n)} in {time.monotonic() - t0:.1f}s"
            )
