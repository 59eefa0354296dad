"""The control-plane actor: `CoordinatorActor` in its two roles, and the migrations it drives.

A failover sensor places and fails over partitions and fails overdue records;
an operator plans graceful moves, cancels some and takes partitions off nodes.
Both drive the migrations they started or resumed phase by phase through the
real `MigrationCoordinator`, without blocking.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.failover import moves_on_without_old_owner, prepare_failover, stranded
from laminar_orchestration.control.moves import must_force, record_failure
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.ledger import EpochConflict, Ledger
from laminar_orchestration.protocol.membership import NodeView
from laminar_orchestration.protocol.migration_errors import MigrationEpochConflict, MigrationTimeout
from laminar_orchestration.protocol.records import LedgerError
from laminar_orchestration.protocol.tasks import (
    MigrationError,
    MigrationKind,
    MigrationPhase,
    MigrationTask,
    phase_sequence,
)
from laminar_orchestration.store import StoreError

from .base_actor import Actor
from .view import SimWorld


class CoordinatorRole(enum.Enum):
    """What a coordinator starts on its own; both drive whatever they started or resumed."""

    #: Places unassigned partitions, fails over dead owners, fails records past their deadline.
    SENSOR = "sensor"
    #: Plans graceful moves and cancels some.
    OPERATOR = "operator"


@dataclass
class Driving:
    """A migration this coordinator drives: the phase it is at and whether it was begun."""

    task: MigrationTask
    index: int
    begun: bool = False
    phase_started: float = 0.0


#: How often a restarted driver resumes the records it was driving (a retried Dagster run).
DRIVER_RETRY_RATE = 0.5
#: Per operator step: fence a partition to "unassigned"; and how often the operator dies between
#: that grant and its seal.
UNASSIGN_RATE = 0.3
UNASSIGN_CRASH_RATE = 0.5
#: A node whose heartbeat is older than this share of its timeout looks stuck to the operator (the
#: failure sensor waits for the whole timeout).
SUSPECT_AFTER = 0.5

#: Phases the coordinator completes itself: nothing to wait for from a node.
_NO_REPORT = (MigrationPhase.PLANNED,)


class CoordinatorActor(Actor):
    """Plans and drives migrations through the real `MigrationCoordinator`, one store-level decision per step."""

    def __init__(self, world: SimWorld, role: CoordinatorRole) -> None:
        super().__init__(world, role.value)
        self.role = role
        #: Dies right after the next grant it creates, before sealing the chain (`World.after_call`).
        self.crash_after_grant = False
        self._fresh()

    def _fresh(self, *, resume: bool = True) -> None:
        self.ledger = Ledger(self.world.client_store(), read_parallelism=1)
        self.coordinator = MigrationCoordinator(self.ledger, self.world.migration_config)
        self.driving: dict[int, Driving] = {}
        #: A restarted driver first resumes every unfinished record (a retried Dagster run).
        self.resume_pending = resume

    def restart(self) -> None:
        # Not every dead run is retried (retries run out; a killed run worker is not seen failing):
        # its records then wait for their deadline, which whoever reads them next enforces.
        self._fresh(resume=self.world.rng.random() < DRIVER_RETRY_RATE)

    def step(self) -> str:
        self.idle(0.04, 0.2)
        rng = self.world.rng
        try:
            if self.resume_pending:
                return self._resume()
            if self.role == CoordinatorRole.OPERATOR and self.world.faults_on and rng.random() < UNASSIGN_RATE:
                unassigned = self._unassign(self.ledger.members.nodes())
                if unassigned is not None:
                    return unassigned
            if self.driving and rng.random() < 0.85:
                return self._drive(rng.choice(sorted(self.driving)))
            if self.role == CoordinatorRole.SENSOR:
                return self._sense()
            if not self.world.faults_on:
                return "operator idle"
            return self._operate()
        except (StoreError, LedgerError) as exc:
            return f"failed: {type(exc).__name__}"

    def _resume(self) -> str:
        found = []
        for p in range(self.world.config.partitions):
            task = self.coordinator.current(PartitionId(p))
            if task is not None and not task.is_terminal and p not in self.driving:
                self._start(task)
                found.append(task.migration_id)
        self.resume_pending = False
        return f"resumed {found}"

    def _start(self, task: MigrationTask) -> None:
        seq = phase_sequence(task.migration_kind)
        index = seq.index(task.phase) if task.phase in seq else 0
        self.driving[task.partition] = Driving(task, index, phase_started=self.world.clock.seconds)

    def _live(self) -> list[int]:
        return sorted(v.record.node for v in self.ledger.members.nodes() if v.alive)

    def _sense(self) -> str:
        """One partition, as the node-failure sensor judges it: fail overdue records, grant released
        partitions back (`reinstate`), place unassigned ones, and fail over a dead or stranded owner
        through the production decision (`prepare_failover`)."""
        live = self._live()
        rng = self.world.rng
        p = PartitionId(rng.randrange(self.world.config.partitions))
        # A record past its deadline never blocks the partition: whoever finds it fails it.
        expired = self.coordinator.expire_overdue(p)
        if expired is not None:
            return f"p{p}: failed overdue migration {expired.migration_id}"
        # Only the control plane grants: a released partition goes back to its (live) desired owner.
        # First it completes a grant whose granter died before sealing the chain (`complete_grant`).
        epoch = self._reinstate(p)
        if epoch is not None:
            return f"p{p}: granted back to its desired owner at epoch {epoch}"
        own = self.ledger.ownership(p)
        if own is None or not live:
            return f"p{p}: nothing to do"
        state = self.coordinator.desired.read(p)[0]
        task = state.migration
        in_flight = task is not None and not task.is_terminal
        if own.owner == UNASSIGNED:
            if in_flight:
                return f"p{p}: placement in flight"
            return self._plan_failover(p, NodeId(rng.choice(live)))
        if own.owner in live and not stranded(state, own):
            return f"p{p}: owner {own.owner} alive"
        if p in self.driving or moves_on_without_old_owner(task, live):
            return f"p{p}: a move that needs no old owner is in flight"
        others = [n for n in live if n != own.owner]
        target = NodeId(rng.choice(others or live))
        try:
            decision = prepare_failover(self.coordinator, p, target, live=live)
        except MigrationError as exc:
            return f"p{p}: no failover planned ({type(exc).__name__})"
        if decision.task is None:
            return f"p{p}: {decision.reason}"
        self._start(decision.task)
        return f"p{p}: {decision.reason}"

    def _reinstate(self, p: PartitionId) -> int | None:
        """`MigrationCoordinator.reinstate`, which completes the partition's newest grant first: every
        grant made before the call is then sealed on the chain (the checker holds later entries to it)."""
        newest = self.world.checker.newest_grant(p)
        epoch = self.coordinator.reinstate(p)
        self.world.checker.grant_completed(p, newest)
        return epoch

    def _plan_failover(self, p: PartitionId, target: NodeId) -> str:
        try:
            task = self.coordinator.plan(p, target, forced=True)
        except MigrationError as exc:
            return f"p{p}: no placement planned ({type(exc).__name__})"
        self._start(task)
        return f"p{p}: planned placement {task.migration_id} on node {target}"

    def _operate(self) -> str:
        rng = self.world.rng
        p = PartitionId(rng.randrange(self.world.config.partitions))
        if rng.random() < 0.05:
            try:
                task = self.coordinator.cancel_current(p)
            except MigrationError as exc:
                return f"p{p}: nothing cancelled ({type(exc).__name__})"
            self.driving.pop(p, None)
            return f"p{p}: cancelled {task.migration_id} at {task.failed_phase}"
        if rng.random() < 0.1:
            # A rebalance first grants released partitions back (`laminar rebalance`, the schedule).
            epoch = self._reinstate(p)
            return f"p{p}: rebalance granted it back at epoch {epoch}" if epoch else f"p{p}: nothing to grant back"
        live = self._live()
        own = self.ledger.ownership(p)
        targets = [n for n in live if own is None or n != own.owner]
        if not targets or own is None or own.owner == UNASSIGNED:
            return f"p{p}: no move"
        target = NodeId(rng.choice(targets))
        try:
            # As `laminar migrate` and the Dagster job: forced when nobody can drain it.
            forced = must_force(self.coordinator, p, live=live)
            task = self.coordinator.plan_or_resume(p, target, forced=forced)
        except MigrationError as exc:
            return f"p{p}: no move planned ({type(exc).__name__})"
        self._start(task)
        return f"p{p}: planned move {task.migration_id} to node {target}"

    def _unassign(self, views: list[NodeView]) -> str | None:
        """Fence a partition to "unassigned", no migration in flight: an operator takes it off a node
        whose heartbeat is late (before the failure sensor would fail it over), or off any node now and
        then. The operator may die between the grant and the seal. None when it did not look further."""
        rng = self.world.rng
        late = {
            v.record.node
            for v in views
            if v.heartbeat_age_s > v.record.heartbeat_timeout_s * SUSPECT_AFTER or not v.alive
        }
        owned = {p: own for p, own in self.ledger.ownerships(self.ledger.partitions()).items() if own is not None}
        candidates = [p for p, own in owned.items() if own.owner in late and own.owner != UNASSIGNED]
        if not candidates and rng.random() < 0.05:
            candidates = [p for p, own in owned.items() if own.owner != UNASSIGNED]
        if not candidates:
            return None
        p = rng.choice(sorted(candidates))
        task = self.coordinator.desired.read(p)[0].migration
        if task is not None and not task.is_terminal:
            return f"p{p}: not unassigned (migration {task.migration_id} in flight)"
        self.crash_after_grant = rng.random() < UNASSIGN_CRASH_RATE
        try:
            self.ledger.fence(p, UNASSIGNED, expected_epoch=owned[p].epoch, reason="operator: unassign")
        except EpochConflict:
            return f"p{p}: not unassigned (the epoch moved)"
        finally:
            self.crash_after_grant = False
        return f"p{p}: unassigned at epoch {owned[p].epoch + 1}"

    def _phase_limit(self, phase: MigrationPhase) -> float:
        cfg = self.world.migration_config
        return cfg.release_wait_timeout_s if phase.needs_old_owner else cfg.checkpoint_transfer_timeout_s

    def _drive(self, p: int) -> str:
        d = self.driving[p]
        seq = phase_sequence(d.task.migration_kind)
        phase = seq[d.index]
        mid = d.task.migration_id
        try:
            if not d.begun:
                d.task = self.coordinator.begin_phase(PartitionId(p), mid, phase)
                d.begun, d.phase_started = True, self.world.clock.seconds
                awaited = not (
                    phase in _NO_REPORT
                    or (d.task.migration_kind == MigrationKind.FORCED and phase == MigrationPhase.RELEASED)
                )
                if awaited:
                    return f"{mid}: began {phase}"
            else:
                if self.coordinator.phase_reported(d.task, phase) is None:
                    waited = self.world.clock.seconds - d.phase_started
                    if waited > self._phase_limit(phase):
                        raise MigrationTimeout(PartitionId(p), phase, waited)
                    return f"{mid}: waiting for {phase}"
        except MigrationError as exc:
            del self.driving[p]
            if self.world.config.knobs.revert_lost_fence_fix and isinstance(exc, MigrationEpochConflict):
                return f"{mid}: {type(exc).__name__} at {phase} (left as is)"
            record_failure(self.coordinator, p, mid, exc)
            return f"{mid}: {type(exc).__name__} at {phase}"
        d.index, d.begun = d.index + 1, False
        if d.index == len(seq):
            del self.driving[p]
            return f"{mid}: done"
        return f"{mid}: {phase} done"
