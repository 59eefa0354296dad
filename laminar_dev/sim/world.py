"""The deterministic world: simulated clock, one seeded scheduler, the scenario and its verdict.

A scenario is a pure function of its seed. One `random.Random(seed)` decides
everything the scheduler does: which actor steps next, the latency of each
store call (simulated time, no sleeps), injected store faults, crashes and
restarts, pauses, and preemption. Single-threaded: an actor is preempted at a
store call by running other actors' steps on the same stack before the call
proceeds (nested, to a bounded depth), so the interleavings are those of
store calls, with the limit that a preempted actor resumes only after the
ones that preempted it finish their step.

A scenario runs `steps` protocol steps (store calls and decisions) with
faults, then stops the faults, brings every process back, and runs until
every partition is active on a live node (the liveness bound) with every
migration record terminal by its deadline; then one last sweep must leave no
object that no manifest names and whose epoch is sealed.

Half the scenarios start empty (the faults meet the first placements), half
from a cluster that ran before (`_warm_start`: every partition placed, the
nodes restarting), so the faults also meet steady commits and handoffs.
Besides crashes and pauses, the faults include a node restarting under a new
generation while its earlier process runs on as a zombie (`_split`), and a
control-plane process dying between creating a grant and sealing the chain
(`after_call`) or between a desired state's write and a node's assignment
write (`before_call`). The standby and the intruder (`actors`) read and forge all
along; like the sweeper, their store calls come on top of the protocol's.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field, fields
from typing import NoReturn

from laminar_orchestration.clock import use_clock
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.keys import ASSIGNMENTS_PREFIX
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.protocol.tasks import MigrationConfig, phase_sequence
from laminar_orchestration.store import ObjectStore
from laminar_orchestration.store.retry import RetryingStore

from . import node_actor as node_actor_module
from .actors import IntruderActor, ProducerActor, StandbyActor, SweeperActor
from .base_actor import Actor, ActorStatus
from .clock import SimClock
from .coordinator_actor import CoordinatorActor, CoordinatorRole
from .invariants import Checker, EventDecoder, InvariantViolation, MigrationWedged, PartitionNotLive
from .memo import memoized
from .node_actor import NodeActor
from .reverts import Knobs, reverted
from .store import MemoryObjectStore, SimStore
from .trace import Trace, no_cycle_collection, quiet

#: How deep preemption nests (an actor preempted by one that is preempted by another...).
MAX_DEPTH = 3
#: Slack after a migration's deadline (or after the faults stopped, if later) before an unfinished
#: record counts as wedged.
WEDGE_GRACE_S = 5.0
#: After a split (`World._split`): when the node's new process starts, and how much longer the
#: earlier one runs on as a zombie (simulated seconds).
SPLIT_RESTART_S = (0.1, 2.5)
ZOMBIE_OUTLIVES_S = (0.3, 4.0)


@dataclass(frozen=True)
class SimConfig:
    """One scenario: its seed and shape, and how hostile its fault phase is."""

    seed: int
    #: Protocol steps (store calls and decisions) with faults, before the calm phase; the sweeps come on top.
    steps: int = 300
    partitions: int = 2
    nodes: int = 3
    #: Probability that a store call fails (half of the failed writes land: lost responses).
    fault_rate: float = 0.05
    #: Per store call: the caller crashes, or is preempted (others run first, maybe after a stall).
    crash_rate: float = 0.004
    preempt_rate: float = 0.05
    #: Per scheduler tick: some process crashes, or pauses (and resumes later as a zombie).
    tick_crash_rate: float = 0.01
    pause_rate: float = 0.01
    #: Per scheduler tick: a node restarts under a new generation while its earlier process keeps
    #: running as a zombie (it stopped heartbeating, it skips its client-side checks).
    split_rate: float = 0.03
    #: Per grant a control-plane actor creates while faults last: it dies before sealing the chain.
    grant_crash_rate: float = 0.2
    #: Per assignment write a control-plane actor makes while faults last: it dies right before it,
    #: after the desired state's write (the node's record stays behind the state).
    assignment_crash_rate: float = 0.05
    #: Share of scenarios that start from a running cluster restarting (every partition placed, every
    #: node registered once), so the fault phase sees steady commits, handoffs and restarts; the others
    #: start empty and spend their faults on the first placements.
    warm_start_rate: float = 0.5
    #: Simulated seconds after the faults stop within which every partition must be active on a live node.
    liveness_bound_s: float = 90.0
    knobs: Knobs = field(default_factory=Knobs)
    #: Keep the whole trace (otherwise only its hash and the last lines).
    full_trace: bool = False


class SimCrash(BaseException):
    """Unwinds a crashing actor's step (a BaseException, so no library `except Exception` swallows it)."""


class SimAbort(BaseException):
    """Unwinds the whole run once an invariant is violated."""


@dataclass(frozen=True)
class ScenarioCounts:
    """What scenarios did, counted: one scenario's own, or the sum over a soak's (`+`)."""

    # No defaults: a scenario reports every count, and one left out is a type error, not a silent 0.
    steps: int
    #: Of `steps`, those taken while faults were on.
    fault_steps: int
    faults: int
    crashes: int
    pauses: int
    preemptions: int
    manifests: int
    #: Manifests that named a new snapshot.
    snapshots: int
    unexpected_errors: int
    #: Objects the sweeps deleted (unreachable objects of sealed epochs).
    swept: int
    #: Nodes that restarted while their earlier process ran on as a zombie.
    splits: int
    #: Void history entries written (forged, or by a writer the chain had moved past).
    void_entries: int
    #: CPU seconds taken (a measurement, not part of the trace).
    cpu_s: float

    @classmethod
    def zero(cls) -> ScenarioCounts:
        """Nothing counted yet: where a sum starts."""
        return cls(**{f.name: 0 for f in fields(cls)})

    def __add__(self, other: ScenarioCounts) -> ScenarioCounts:
        return ScenarioCounts(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def describe(self) -> str:
        """The counts of events, for a reader (the steps and CPU time are the caller's to say)."""
        return (
            f"{self.faults} store faults, {self.crashes} crashes, {self.pauses} pauses, "
            f"{self.preemptions} preemptions, {self.manifests} manifests checked "
            f"({self.snapshots} naming a new snapshot), {self.swept} objects swept, "
            f"{self.splits} zombie restarts, {self.void_entries} void entries"
        )


@dataclass(frozen=True)
class ScenarioResult:
    """What one scenario did and whether every promise held."""

    seed: int
    counts: ScenarioCounts
    simulated_s: float
    trace_hash: str
    violation: InvariantViolation | None
    trace: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when no invariant was violated."""
        return self.violation is None


class World:
    """The actors, the simulated store and clock, and the scheduler that steps them."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.clock = SimClock(random.Random(f"entropy-{config.seed}"))
        self.memory = MemoryObjectStore()
        self.decoder = EventDecoder()
        self.checker = Checker(self.memory, config.partitions, self.decoder)
        self.memory.observer = self.checker
        self.store = SimStore(self.memory, self)
        self.migration_config = MigrationConfig(
            migration_timeout_s=8.0,
            release_wait_timeout_s=4.0,
            checkpoint_transfer_timeout_s=5.0,
            warmup_timeout_s=0.0,
            drain_alignment_s=0.0,
        )
        self.faults_on = True
        self.steps = 0
        self.crashes = self.pauses = self.preemptions = self.unexpected = self.swept = self.observer_calls = 0
        self.stack: list[Actor] = []
        self._trace = Trace(full=config.full_trace)
        self._record = self._trace.record
        self.violation: InvariantViolation | None = None
        #: The current process of each node (a restart under a new generation replaces it here; the
        #: earlier process may live on as a zombie among `actors`).
        self.nodes = [NodeActor(self, n) for n in range(1, config.nodes + 1)]
        self.actors: list[Actor] = [
            *self.nodes,
            CoordinatorActor(self, CoordinatorRole.SENSOR),
            CoordinatorActor(self, CoordinatorRole.OPERATOR),
            ProducerActor(self, "producer"),
            StandbyActor(self, "standby"),
        ]
        #: What the scheduler crashes or pauses between steps. The sweeper keeps nothing between its
        #: steps, so that would change nothing; it crashes (and stalls) inside a sweep, at a store call.
        #: Neither does the intruder.
        self.processes = list(self.actors)
        self.sweeper = SweeperActor(self, "sweeper")
        self.actors += [self.sweeper, IntruderActor(self, "intruder")]
        self.splits = 0
        self.checker.rogue_writer = lambda: bool(self.stack) and self.stack[-1].rogue

    # -- what actors use ----------------------------------------------------------------

    def client_store(self) -> ObjectStore:
        """A process's view of the store: the production retry layer over the simulated store."""
        return RetryingStore(self.store, sleep=self.sleep, seed=self.rng.getrandbits(32))

    def sleep(self, seconds: float) -> None:
        """A retry backoff: simulated time passes for the caller."""
        self.clock.seconds += max(0.0, seconds)

    # -- the store's hook ----------------------------------------------------------------

    def before_call(self, op: str, key: str) -> None:
        """Every store call: time passes, then the caller may crash or be preempted."""
        rng, cfg, clock = self.rng, self.config, self.clock
        self.steps += 1
        clock.seconds += rng.uniform(0.001, 0.01) if rng.random() > 0.003 else rng.uniform(0.1, 0.5)
        actor = self.stack[-1] if self.stack else None
        if actor is not None and actor.observer:
            self.observer_calls += 1
        self._record(f"{self.steps} {clock.seconds:.3f} {actor.name if actor else '-'} {op} {key}")
        if self.violation is not None or self.checker.violation is not None:
            raise SimAbort
        if actor is None:
            return
        if actor.crash_pending:
            actor.crash_pending = False
            raise SimCrash
        if not self.faults_on:
            return
        if (
            isinstance(actor, CoordinatorActor)
            and op in ("put_if_match", "put_if_absent")
            and key.startswith(ASSIGNMENTS_PREFIX)
            and rng.random() < cfg.assignment_crash_rate
        ):
            self._record("  (the writer dies before this assignment write)")
            raise SimCrash
        r = rng.random()
        if r < cfg.crash_rate:
            raise SimCrash
        if r < cfg.crash_rate + cfg.preempt_rate and len(self.stack) < MAX_DEPTH:
            self.preemptions += 1
            if rng.random() < 0.2:
                # The caller stalls (a GC pause, a slow network): it resumes as a possible zombie.
                self.clock.seconds += rng.uniform(0.5, 3.0)
            for _ in range(rng.randint(1, 10)):
                self._tick()

    def after_call(self, op: str, key: str, outcome: str) -> None:
        """What the caller saw; the run stops at the first violated invariant.

        A control-plane process that just created a grant may die before it seals the chain."""
        self._record(f"  -> {outcome}")
        if self.checker.violation is not None:
            raise SimAbort
        actor = self.stack[-1] if self.stack else None
        if (
            actor is not None
            and isinstance(actor, CoordinatorActor)
            and outcome == "ok"
            and op == "put_if_absent"
            and self.faults_on
            and "/grants/" in key
            and (actor.crash_after_grant or self.rng.random() < self.config.grant_crash_rate)
        ):
            actor.crash_after_grant = False
            actor.crash_pending = True  # dies at its next store call: the seal's first read
            self._record(f"  (the granter dies before it seals {key})")

    def violated(self, violation: InvariantViolation) -> NoReturn:
        """An actor found a promise broken: the run ends with it."""
        if self.violation is None and self.checker.violation is None:
            self.violation = violation
        raise SimAbort

    # -- the scheduler -------------------------------------------------------------------

    def _tick(self) -> None:
        """One decision of the scheduler: bring a process back, crash or pause one, or step one."""
        rng, now, cfg = self.rng, self.clock.seconds, self.config
        for a in list(self.actors):
            if a.dies_at <= now and not a.busy:
                self._remove(a)
            elif a.status != ActorStatus.UP and a.back_at <= now and not a.busy:
                self._back(a)
        if self.faults_on:
            r = rng.random()
            if r < cfg.tick_crash_rate:
                self._crash(rng.choice(self.processes))
            elif r < cfg.tick_crash_rate + cfg.pause_rate:
                self._pause(rng.choice(self.processes))
            elif r < cfg.tick_crash_rate + cfg.pause_rate + cfg.split_rate:
                self._split()
        ready = [a for a in self.actors if a.status == ActorStatus.UP and not a.busy and a.wake_at <= now]
        if not ready:
            waiting = [a for a in self.actors if not a.busy]
            times = [a.wake_at if a.status == ActorStatus.UP else a.back_at for a in waiting]
            self.clock.seconds = max(now, min(times, default=now)) + 0.001
            return
        self._step(rng.choice(ready))

    def _step(self, actor: Actor) -> None:
        self.stack.append(actor)
        actor.busy = True
        try:
            what = actor.step()
        except SimCrash:
            what = "crashed mid-step"
        except SimAbort:
            raise
        except Exception as exc:
            # An error the process does not handle kills it (it restarts like after a crash).
            self.unexpected += 1
            what = f"died of {type(exc).__name__}: {exc}"
            actor.crash_pending = True
        finally:
            self.stack.pop()
            actor.busy = False
        self.steps += 1
        self._record(f"{self.steps} {self.clock.seconds:.3f} {actor.name} : {what}")
        if actor.crash_pending or what == "crashed mid-step":
            actor.crash_pending = False
            self._crash(actor)

    def _split(self) -> None:
        """A node that runs partitions restarts under a new generation while its earlier process keeps
        running: that one stopped heartbeating (its supervisor judged it dead) but its workers go on as
        a zombie, holding their epochs' signing keys and skipping their client-side checks, until it
        dies too (maybe after the faults stopped: it is no fault that stops)."""
        zombies = {a.node for a in self.actors if isinstance(a, NodeActor) and a.zombie}
        eligible = [
            n
            for n in self.nodes
            if n.status == ActorStatus.UP
            and not n.busy
            and n.handle is not None
            and n.node not in zombies
            and any(n.running_epoch(p) is not None for p in n.workers)
        ]
        if not eligible:
            return
        node = self.rng.choice(eligible)
        self.splits += 1
        now = self.clock.seconds
        restart_in = self.rng.uniform(*SPLIT_RESTART_S)
        node.become_zombie(dies_at=now + restart_in + self.rng.uniform(*ZOMBIE_OUTLIVES_S))
        successor = NodeActor(self, int(node.node))
        successor.status, successor.back_at = ActorStatus.CRASHED, now + restart_in
        self.nodes[self.nodes.index(node)] = successor
        self.actors.append(successor)
        self.processes.append(successor)
        self._record(
            f"{self.steps} {now:.3f} {node.name} SPLIT: a new process starts at {now + restart_in:.3f}, "
            f"this one runs on as a zombie until {node.dies_at:.3f}"
        )

    def _remove(self, actor: Actor) -> None:
        """A process that ended for good (a zombie's death)."""
        self.actors.remove(actor)
        if actor in self.processes:
            self.processes.remove(actor)
        self._record(f"{self.steps} {self.clock.seconds:.3f} {actor.name} DIES")

    def _crash(self, actor: Actor) -> None:
        if actor.status == ActorStatus.CRASHED:
            return
        if actor.busy:
            actor.crash_pending = True
            return
        if actor.dies_at < float("inf"):
            actor.dies_at = self.clock.seconds  # a zombie that crashes is gone
        self.crashes += 1
        actor.status = ActorStatus.CRASHED
        actor.back_at = self.clock.seconds + self.rng.uniform(0.5, 5.0)
        actor.crash()
        self._record(f"{self.steps} {self.clock.seconds:.3f} {actor.name} CRASH")

    def _pause(self, actor: Actor) -> None:
        if actor.status != ActorStatus.UP or actor.busy:
            return
        self.pauses += 1
        actor.status = ActorStatus.PAUSED
        actor.back_at = self.clock.seconds + self.rng.uniform(0.5, 6.0)
        self._record(f"{self.steps} {self.clock.seconds:.3f} {actor.name} PAUSE until {actor.back_at:.3f}")

    def _back(self, actor: Actor) -> None:
        if actor.status == ActorStatus.CRASHED:
            actor.restart()
        actor.status = ActorStatus.UP
        actor.wake_at = self.clock.seconds
        self._record(f"{self.steps} {self.clock.seconds:.3f} {actor.name} BACK")

    # -- the scenario ----------------------------------------------------------------------

    def run(self) -> ScenarioResult:
        """Fault phase, then calm phase until the liveness bound; the first violation ends the run."""
        cfg = self.config
        fault_steps = 0
        cpu_start = time.process_time()
        with use_clock(self.clock), reverted(cfg.knobs), memoized(), quiet(), no_cycle_collection():
            Ledger(self.memory, read_parallelism=1).init_cluster(cfg.partitions)
            if self.rng.random() < cfg.warm_start_rate:
                self._warm_start()
            self.store.random_faults(cfg.fault_rate, seed=self.rng.getrandbits(32))
            try:
                # The observers' store calls (sweeps, standby reads, intrusions) come on top: the
                # protocol gets its steps with faults.
                while self.steps - self.observer_calls < cfg.steps:
                    self._tick()
                fault_steps = self.steps
                self._calm()
            except SimAbort:
                fault_steps = fault_steps or self.steps
            except InvariantViolation as exc:
                self.violation = exc
        violation = self.checker.violation or self.violation
        if violation is not None:
            self._record(f"VIOLATED {violation.invariant}: {violation}")
        counts = ScenarioCounts(
            steps=self.steps,
            fault_steps=fault_steps,
            faults=self.store.injected_failures + self.store.lost_responses,
            crashes=self.crashes,
            pauses=self.pauses,
            preemptions=self.preemptions,
            manifests=self.checker.manifests_checked,
            snapshots=self.checker.snapshots_named,
            unexpected_errors=self.unexpected,
            swept=self.swept,
            splits=self.splits,
            void_entries=self.checker.void_entries,
            cpu_s=time.process_time() - cpu_start,
        )
        return ScenarioResult(
            seed=cfg.seed,
            counts=counts,
            simulated_s=self.clock.seconds,
            trace_hash=self._trace.digest(),
            violation=violation,
            trace=self._trace.lines(),
        )

    def _warm_start(self) -> None:
        """Before the first step: a cluster that ran before, every partition placed on a node (through a
        forced placement driven to Active) and every node registered once. The nodes' processes start
        afresh: they register a new generation and recover their partitions."""
        ledger = Ledger(self.memory, read_parallelism=1)
        for n in self.nodes:
            ledger.members.register_node(
                n.node, heartbeat_timeout_s=node_actor_module.HEARTBEAT_TIMEOUT_S, host="sim", pid=1
            )
        coordinator = MigrationCoordinator(ledger, self.migration_config)
        for p in range(self.config.partitions):
            node = self.rng.choice(self.nodes).node
            task = coordinator.plan(PartitionId(p), node, forced=True)
            for phase in phase_sequence(task.migration_kind):
                coordinator.begin_phase(PartitionId(p), task.migration_id, phase)
        self._record(f"{self.steps} {self.clock.seconds:.3f} - WARM START: every partition placed")

    def _calm(self) -> None:
        """Faults stop and every process comes back; every partition must then become live in time."""
        self.faults_on = False
        self.store.clear()
        for a in self.actors:
            if a.status != ActorStatus.UP and a.dies_at == float("inf"):
                a.back_at = self.clock.seconds
        self._record(f"{self.steps} {self.clock.seconds:.3f} - FAULTS STOP")
        calm_start = self.clock.seconds
        auditor = Ledger(self.memory, read_parallelism=1)
        while True:
            for _ in range(30):
                self._tick()
            if self._settled(auditor, calm_start):
                break
        # Garbage does not outlive a sweep: once one runs, no unreachable object of a sealed epoch is left.
        what = self.sweeper.sweep(grace_s=0.0)
        self._record(f"{self.steps} {self.clock.seconds:.3f} {self.sweeper.name} : final {what}")
        epochs = {int(p): own.epoch for p, own in auditor.ownerships(auditor.partitions()).items() if own is not None}
        self.checker.check_swept(epochs)

    def _settled(self, auditor: Ledger, calm_start: float) -> bool:
        """Raise a violation if a promise of the calm phase broke; True once every partition is live."""
        now = self.clock.now()
        waited = self.clock.seconds - calm_start
        desired = DesiredStates(auditor)
        reason: tuple[int, int, int, str] | None = None
        for p in range(self.config.partitions):
            task = desired.read(PartitionId(p))[0].migration
            if task is not None and not task.is_terminal:
                overdue = (now - task.started_at).total_seconds() - task.timeout_s
                # Bounded once faults stopped: a deadline that passed while a stalled driver could not
                # act counts from the calm phase's start.
                if min(overdue, waited) > WEDGE_GRACE_S:
                    raise MigrationWedged(p, task.migration_id, str(task.phase), overdue)
            own = auditor.ownership(PartitionId(p))
            if own is None:
                continue
            node = next((n for n in self.nodes if n.node == own.owner), None)
            if reason is None:
                if own.owner == UNASSIGNED or own.status != PartitionStatus.ACTIVE:
                    reason = (p, own.epoch, own.owner, f"status {own.status}")
                elif node is None or node.status != ActorStatus.UP:
                    reason = (p, own.epoch, own.owner, "the owner is not up")
                elif node.running_epoch(p) != own.epoch:
                    reason = (p, own.epoch, own.owner, f"the owner runs epoch {node.running_epoch(p)}")
                elif node.handing_over(p) and (task is None or task.is_terminal):
                    reason = (p, own.epoch, own.owner, "the owner hands over for a move no longer in flight")
                elif task is not None and not task.is_terminal:
                    reason = (p, own.epoch, own.owner, f"migration {task.migration_id} at {task.phase}")
        if reason is None:
            return True
        if waited > self.config.liveness_bound_s:
            raise PartitionNotLive(*reason, waited)
        return False


def run_scenario(config: SimConfig) -> ScenarioResult:
    """Run one scenario (a pure function of `config`)."""
    return World(config).run()
