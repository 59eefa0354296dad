"""The simulated processes: steppable state machines over the real protocol code.

Each actor's `step` takes one decision and carries it out through the real
library (`Ledger`, `ManifestPublisher`, `MigrationCoordinator`, `SourceLog`);
every store call inside it is an interleaving point of the scheduler. Actors
keep their memory across steps (a paused actor resumes as a zombie with it)
and lose it on a crash. Nothing here reads the wall clock or sleeps.

* `NodeActor` - a worker node: registers, heartbeats with its partitions'
  progress, and per partition takes the production worker's decisions
  (`laminar_orchestration.handoff`): what to start for a partition it runs
  nothing for (`partition_duty`), recover its own grant, drain and release for
  a graceful move away, restore, adopt the granted epoch and take over at the
  seal for an incoming one; it processes a batch as an in-process keyed fold
  and commits it as the worker does (`laminar_orchestration.commit`).
* `CoordinatorActor` - the control plane: a failover sensor (places and fails
  over partitions, fails overdue records) or an operator (graceful moves,
  cancels), each driving its migrations phase by phase without blocking.
* `ProducerActor` - appends events to the source log.
* `SweeperActor` - the auditor: now and then runs the real anti-entropy sweep,
  which deletes unreferenced objects of sealed epochs, between the others' steps.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from laminar_orchestration import antientropy
from laminar_orchestration.capabilities import (
    CheckpointWriter,
    OutputCommitter,
    ReadStore,
    checkpoint_key,
    sink_key,
)
from laminar_orchestration.checkpoint import next_checkpoint
from laminar_orchestration.commit import commit
from laminar_orchestration.fencing import EpochError, FencingToken, PartitionGuard
from laminar_orchestration.handoff import (
    NewOwnerAction,
    OldOwnerAction,
    OldOwnerStep,
    PartitionDuty,
    new_owner_step,
    old_owner_step,
    partition_duty,
    seal_at,
    take_over,
)
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.keys import delta_key, output_object_key, snapshot_file_key
from laminar_orchestration.ledger import Ledger, NodeHandle, NodeIdentityConflict
from laminar_orchestration.manifest import (
    SHA256_METADATA,
    DeltaRef,
    ManifestPublisher,
    ManifestUpdate,
    ManifestVersion,
    SnapshotFile,
    SnapshotRef,
    SuccessionError,
    artifact_ref,
)
from laminar_orchestration.migration import (
    MigrationCoordinator,
    MigrationEpochConflict,
    MigrationError,
    MigrationKind,
    MigrationPhase,
    MigrationTask,
    MigrationTimeout,
    phase_sequence,
)
from laminar_orchestration.moves import (
    moves_on_without_old_owner,
    must_force,
    prepare_failover,
    record_failure,
    stranded,
)
from laminar_orchestration.records import LedgerError, NodeStatus, PartitionProgress
from laminar_orchestration.source import SourceEvent, SourceLog
from laminar_orchestration.store import StoreError
from laminar_orchestration.ulid import next_ulid

from .invariants import FoldState, decode_delta, encode_delta

if TYPE_CHECKING:
    from .world import World

#: Heartbeat cadence and the timeout after which a node is judged dead (simulated seconds).
HEARTBEAT_INTERVAL_S = 0.5
HEARTBEAT_TIMEOUT_S = 1.5


class ActorStatus(enum.Enum):
    """Whether the scheduler may step an actor."""

    UP = "up"
    CRASHED = "crashed"
    PAUSED = "paused"


class Actor:
    """One simulated process. `step` is one decision; `crash` forgets everything in memory."""

    name: str

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.status = ActorStatus.UP
        self.wake_at = 0.0
        #: When a crashed actor restarts, or a paused one resumes.
        self.back_at = 0.0
        #: On the scheduler's stack (mid-step, possibly preempted): not steppable.
        self.busy = False
        #: Crashed while preempted: dies at its next store call.
        self.crash_pending = False

    def step(self) -> str:
        """Take one decision and carry it out; returns what it did (for the trace)."""
        raise NotImplementedError

    def crash(self) -> None:
        """Lose all in-memory state (the process died)."""

    def restart(self) -> None:
        """Start again after a crash, from nothing but the store."""

    def idle(self, low: float, high: float) -> None:
        """Sleep (in simulated time) for a random while before the next step."""
        self.wake_at = self.world.clock.seconds + self.world.rng.uniform(low, high)


# --- producers -------------------------------------------------------------------------


class ProducerActor(Actor):
    """Appends a few events to a random partition per step (real `SourceLog`, retried on conflicts)."""

    def __init__(self, world: World, name: str) -> None:
        super().__init__(world, name)
        self.log = SourceLog(world.client_store(), partitions=world.config.partitions, segment_events=8)

    def step(self) -> str:
        rng = self.world.rng
        p = rng.randrange(self.world.config.partitions)
        ms = int(self.world.clock.seconds * 1000)
        events = [
            SourceEvent(partition=p, key=f"k{rng.randrange(6)}", value=float(rng.randint(1, 9)), ts=ms)
            for _ in range(rng.randint(3, 10))
        ]
        self.idle(0.2, 0.6)
        try:
            result = self.log.append(p, events)
        except (StoreError, LedgerError) as exc:
            return f"append p{p} failed: {type(exc).__name__}"
        return f"appended p{p} [{result.first_offset}, {result.next_offset})"


# --- the auditor ---------------------------------------------------------------------------

#: Simulated seconds between two sweeps while faults last, and once they stopped (the races are over;
#: the scenario's last sweep checks what is left).
SWEEP_INTERVAL_S = (0.25, 1.0)
CALM_SWEEP_INTERVAL_S = (2.0, 8.0)
#: The sweep's minimum age of an object it deletes: none, or less than a stall (age is never the reason).
SWEEP_GRACE_S = (0.0, 0.0, 0.25, 1.0)


class SweeperActor(Actor):
    """The auditor role: runs `antientropy.sweep` through its own store client, between everything else."""

    def __init__(self, world: World, name: str) -> None:
        super().__init__(world, name)
        self._fresh()

    def _fresh(self) -> None:
        self.store = self.world.client_store()

    def crash(self) -> None:
        self._fresh()

    def restart(self) -> None:
        self._fresh()

    def step(self) -> str:
        self.idle(*(SWEEP_INTERVAL_S if self.world.faults_on else CALM_SWEEP_INTERVAL_S))
        return self.sweep(self.world.rng.choice(SWEEP_GRACE_S))

    def sweep(self, grace_s: float) -> str:
        """One sweep (the module's `sweep`, so a reverted fix applies); what it did, for the trace."""
        try:
            report = antientropy.sweep(self.store, grace_s=grace_s, read_parallelism=1)
        except (StoreError, LedgerError) as exc:
            return f"sweep failed: {type(exc).__name__}"
        self.world.swept += len(report.deleted)
        return (
            f"swept (grace {grace_s:g}s): {report.scanned} scanned, {report.referenced} referenced, "
            f"deleted {report.deleted}, {len(report.kept_unsealed)} unsealed, {len(report.kept_in_grace)} in grace"
        )


# --- nodes --------------------------------------------------------------------------------


#: Deltas since the last snapshot after which an owner may snapshot its state.
SNAPSHOT_EVERY_DELTAS = 2


class WorkerState(enum.Enum):
    """A node's relation to one partition."""

    IDLE = "idle"
    #: Restored for an incoming migration, waiting for Seeking to take the epoch.
    RISING = "rising"
    RUNNING = "running"


@dataclass
class Worker:
    """One partition on one node: the owner's in-memory state (the local store, the token)."""

    partition: int
    state: WorkerState = WorkerState.IDLE
    token: FencingToken | None = None
    restored: ManifestVersion | None = None
    values: FoldState = field(default_factory=dict)
    offset: int = 0
    #: The checkpoint the last commit named: a snapshot and the deltas since it.
    snapshot: SnapshotRef | None = None
    deltas: list[DeltaRef] = field(default_factory=list)
    #: A snapshot uploaded but not named by a manifest yet (the next commit names it).
    snapshot_ready: SnapshotRef | None = None
    events_applied: int = 0
    commit_ulid: str | None = None
    migration: MigrationTask | None = None
    phase_done: MigrationPhase | None = None
    error: str | None = None
    #: The migration the last worker for this partition ended in: not risen for again.
    finished_migration: str | None = None

    def reset(self) -> None:
        """Forget the partition (fenced, released, or given up)."""
        self.finished_migration = self.migration.migration_id if self.migration else None
        self.state, self.token, self.restored, self.migration, self.phase_done = (
            WorkerState.IDLE,
            None,
            None,
            None,
            None,
        )
        self.values, self.deltas, self.error = {}, [], None
        self.snapshot = self.snapshot_ready = None

    def progress(self) -> PartitionProgress:
        """What the node's heartbeat reports about this partition."""
        return PartitionProgress(
            partition=self.partition,
            epoch=self.token.epoch if self.token else 0,
            state=self.state.value,
            migration_id=self.migration.migration_id if self.migration else None,
            phase_done=self.phase_done.value if self.phase_done else None,
            source_offset=self.offset,
            error=self.error,
        )


class NodeActor(Actor):
    """A worker node running the per-partition owner state machine through the real ledger and publisher."""

    def __init__(self, world: World, node: int) -> None:
        super().__init__(world, f"node{node}")
        self.node = NodeId(node)
        self._fresh()

    def _fresh(self) -> None:
        store = self.world.client_store()
        self.ledger = Ledger(store, read_parallelism=1)
        self.coordinator = MigrationCoordinator(self.ledger, self.world.migration_config)
        self.publisher = ManifestPublisher(OutputCommitter(store), store, signing_keys=self.ledger.signing_keys)
        self.checkpoints = CheckpointWriter(store)
        self.outputs = OutputCommitter(store)
        self.reads = ReadStore(store)
        self.source = SourceLog(store, partitions=self.world.config.partitions)
        self.handle: NodeHandle | None = None
        self.last_heartbeat = -1e9
        self.workers = {p: Worker(p) for p in range(self.world.config.partitions)}
        #: Delta objects are immutable: a node keeps what it downloaded (its local disk).
        self.delta_cache: dict[str, FoldState] = {}

    @property
    def generation(self) -> int:
        return self.handle.generation if self.handle else 0

    def crash(self) -> None:
        self._fresh()

    def restart(self) -> None:
        self._fresh()

    def running_epoch(self, partition: int) -> int | None:
        """The epoch this node runs `partition` at, if it runs it."""
        w = self.workers[partition]
        return w.token.epoch if w.state == WorkerState.RUNNING and w.token else None

    def step(self) -> str:
        self.idle(0.04, 0.15)
        try:
            if self.handle is None:
                handle = self.ledger.register_node(
                    self.node, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, host="sim", pid=1
                )
                self.handle, self.last_heartbeat = handle, self.world.clock.seconds
                return f"registered generation {handle.generation}"
            if self.world.clock.seconds - self.last_heartbeat >= HEARTBEAT_INTERVAL_S:
                return self._heartbeat()
        except (StoreError, LedgerError) as exc:
            return f"{type(exc).__name__}"
        p = self.world.rng.randrange(self.world.config.partitions)
        try:
            return f"p{p}: {self._work(self.workers[p])}"
        except EpochError as exc:
            self.workers[p].reset()
            return f"p{p}: fenced ({type(exc).__name__})"
        except SuccessionError as exc:
            # A commit the chain refuses: the worker restarts and recovers from the chain (as the runtime does).
            self.workers[p].reset()
            return f"p{p}: worker restarts ({type(exc).__name__})"
        except (StoreError, LedgerError) as exc:
            # A failed step is retried from the store on the next one; the state in memory is kept.
            return f"p{p}: {type(exc).__name__}"

    def _heartbeat(self) -> str:
        assert self.handle is not None
        try:
            self.handle.heartbeat(NodeStatus.ALIVE, {p: w.progress() for p, w in self.workers.items()})
        except NodeIdentityConflict:
            # Another process took our record (our own earlier incarnation's write): start over.
            self._fresh()
            return "lost its node record: re-registering"
        self.last_heartbeat = self.world.clock.seconds
        return "heartbeat"

    def _report(self, w: Worker, phase: MigrationPhase) -> None:
        w.phase_done = phase
        self._heartbeat()

    # -- the owner's state machine ---------------------------------------------------------

    def _work(self, w: Worker) -> str:
        p = PartitionId(w.partition)
        state = self.coordinator.desired.read(p)[0]
        task = state.migration
        if w.state == WorkerState.RUNNING:
            assert w.token is not None
            step = old_owner_step(
                task,
                node=self.node,
                epoch=w.token.epoch,
                reported=w.phase_done,
                reported_for=w.migration.migration_id if w.migration else None,
            )
            if step.action != OldOwnerAction.RUN:
                assert task is not None
                return self._set(w, task, step)
            roll = self.world.rng.random()
            if roll < 0.2:
                return self._refresh(w)
            if roll < 0.35 and w.snapshot_ready is None and len(w.deltas) >= SNAPSHOT_EVERY_DELTAS:
                return self._take_snapshot(w)
            return self._batch(w)
        if w.state == WorkerState.RISING:
            return self._rise(w, task)
        # As the node's reconcile loop decides for a partition it runs no worker for.
        duty = partition_duty(
            state,
            node=self.node,
            finished_migration=w.finished_migration,
            ownership=lambda: self.ledger.ownership(p),
        )
        match duty:
            case PartitionDuty.RISE:
                return self._rise(w, task)
            case PartitionDuty.RECOVER:
                return self._recover(w)
            case PartitionDuty.NONE:
                return "idle"

    def _restore(self, w: Worker, version: ManifestVersion | None) -> None:
        """Local state = the manifest's snapshot, then its deltas (each object downloaded once per node)."""
        values: FoldState = {}
        m = version.manifest if version else None
        snapshot = m.snapshot if m else None
        deltas = list(m.deltas) if m else []
        for f in snapshot.files if snapshot else []:
            values.update(self._download_object(w, f.ref.key))
        for d in deltas:
            values.update(self._download_object(w, d.ref.key))
        w.restored, w.values, w.snapshot, w.deltas, w.snapshot_ready = version, values, snapshot, deltas, None
        w.offset = m.source_offset if m else 0
        w.events_applied = m.events_applied if m else 0
        w.commit_ulid = m.commit_ulid if m else None

    def _download_object(self, w: Worker, key: str) -> FoldState:
        """The rows of one snapshot file or delta (immutable objects: the node's disk keeps them)."""
        cached = self.delta_cache.get(key)
        if cached is None:
            obj = self.reads.get(key)
            if obj is None:
                raise _RestoreFailed(w.partition, key)
            cached = self.delta_cache[key] = decode_delta(obj.data)
        return cached

    def _seal(self, token: FencingToken) -> ManifestVersion | None:
        """The chain sealed at our epoch (`handoff.seal_at`); before the fix, read as it stands."""
        if self.world.config.knobs.revert_grant_seal:
            return self.publisher.current(token.partition)
        return seal_at(self.publisher, token, generation=self.generation)

    def _take_over(self, w: Worker, token: FencingToken, *, then: WorkerState = WorkerState.RUNNING) -> str:
        """Install `token` once the chain is sealed at it (`handoff.take_over`); restore again if the
        chain moved past our read. A newer epoch's seal raises StaleFencingToken: superseded.

        `then`: the state the worker is in afterwards (a migration's target runs only once Active)."""
        if not self.world.config.knobs.revert_grant_seal:
            takeover = take_over(self.publisher, token, generation=self.generation, restored=w.restored)
            if takeover.restore_again:
                self._restore(w, takeover.sealed)
        w.token, w.state = token, then
        return f"took over at epoch {token.epoch} (offset {w.offset})"

    def _recover(self, w: Worker) -> str:
        """Take up this node's own grant (`PartitionDuty.RECOVER`): adopt it, seal the chain at this
        process's generation (an earlier incarnation of the node, maybe a zombie, can publish nothing
        more), restore from the seal."""
        p = PartitionId(w.partition)
        token = self.ledger.adopt(p, self.node)
        w.finished_migration = None
        self._restore(w, self._seal(token))
        w.migration, w.phase_done = None, None
        return "recovered: " + self._take_over(w, token)

    def _rise(self, w: Worker, task: MigrationTask | None) -> str:
        """A migration's target, one step of the new owner's machine (`handoff.new_owner_step`)."""
        rising = w.state == WorkerState.RISING
        if rising:
            assert w.migration is not None
            mid = w.migration.migration_id
        else:
            assert task is not None
            mid = task.migration_id
        step = new_owner_step(
            task,
            migration_id=mid,
            reported=w.phase_done if rising else None,
            restored=rising,
            took_over=w.token is not None,
        )
        match step.action:
            case NewOwnerAction.DROP:
                w.reset()
                return "migration ended: dropped the restored copy"
            case NewOwnerAction.WARM | NewOwnerAction.WAIT:
                assert task is not None
                return f"rising: waiting at {task.phase}"
            case NewOwnerAction.RESTORE:
                assert task is not None and step.phase is not None
                return self._download(w, task, step.phase)
            case NewOwnerAction.REPORT:
                assert step.phase is not None
                self._report(w, step.phase)
                return f"reported {step.phase}"
            case NewOwnerAction.TAKE_OVER:
                assert task is not None
                return self._adopt_grant(w, task)
            case NewOwnerAction.RUN:
                w.state = WorkerState.RUNNING
                return f"active at epoch {w.token.epoch if w.token else 0}"

    def _download(self, w: Worker, task: MigrationTask, done: MigrationPhase) -> str:
        """The new owner's download + restore: from the chain (a graceful move: the released commit)."""
        p = PartitionId(w.partition)
        if task.migration_kind == MigrationKind.GRACEFUL and self.ledger.release_record(p, task.from_epoch) is None:
            return "waiting for the release"
        self._restore(w, self.publisher.current(p))
        w.state, w.migration, w.finished_migration = WorkerState.RISING, task, None
        self._report(w, done)
        return f"downloaded for migration {task.migration_id} (offset {w.offset})"

    def _adopt_grant(self, w: Worker, task: MigrationTask) -> str:
        """Adopt the epoch the control plane granted when it recorded Seeking, take over, report Seeking."""
        p = PartitionId(w.partition)
        own = self.ledger.ownership(p)
        if own is None or own.epoch < task.to_epoch:
            return "rising: waiting for the grant"
        # Adopting a grant made to another node (or a later one) raises NotOwned: the move is lost.
        token = self.ledger.adopt(p, self.node)
        text = self._take_over(w, token, then=WorkerState.RISING)
        if w.state == WorkerState.RISING:
            self._report(w, MigrationPhase.SEEKING)
        return text

    def _set(self, w: Worker, task: MigrationTask, step: OldOwnerStep) -> str:
        """The old owner's side of a graceful move (`handoff.old_owner_step`): drain, checkpoint and
        upload are all committed already, then release."""
        assert w.token is not None
        w.migration = task
        if step.action == OldOwnerAction.REPORT:
            assert step.phase is not None
            self._report(w, step.phase)
            return f"drained: reported {step.phase}"
        if step.action == OldOwnerAction.WAIT:
            return f"handing over: waiting at {task.phase}"
        self.ledger.release(w.token, commit_ulid=w.commit_ulid, source_offset=w.offset)
        self._report(w, MigrationPhase.RELEASED)
        epoch = w.token.epoch
        w.state, w.token = WorkerState.IDLE, None
        return f"released epoch {epoch} at offset {w.offset}"

    def _refresh(self, w: Worker) -> str:
        """The kill-switch, as the node's refresh loop runs it: the guard refreshed from the ledger."""
        assert w.token is not None
        if not PartitionGuard(w.token).refresh(self.ledger):
            epoch = w.token.epoch
            w.reset()
            return f"revoked at epoch {epoch}"
        return "guard valid"

    def _batch(self, w: Worker) -> str:
        """Read a batch, fold it, write its delta and output, publish the fenced manifest, commit."""
        assert w.token is not None
        token, p = w.token, PartitionId(w.partition)
        batch = self.source.read(p, w.offset, self.world.rng.randint(1, 12))
        if batch is None:
            if w.snapshot_ready is not None:
                return self._publish_snapshot(w)
            return "caught up"
        touched: FoldState = {}
        for key, value in self.world.decoder.events(batch):
            count, total = touched.get(key, w.values.get(key, (0, 0.0)))
            touched[key] = (count + 1, total + value)
        data = encode_delta(touched)
        ulid = next_ulid(w.commit_ulid)
        meta = _fenced_metadata(token, data)
        dkey = checkpoint_key(delta_key(p, token.node, token.epoch, ulid))
        self.checkpoints.put_checkpoint(dkey, data, meta)
        okey = sink_key(output_object_key(p, token.node, token.epoch, batch.start_offset, batch.end_offset, ulid))
        self.outputs.put_output(okey, data, meta)
        delta = DeltaRef(
            ref=artifact_ref(dkey, data),
            start_offset=batch.start_offset,
            end_offset=batch.end_offset,
            rows=len(touched),
        )
        snapshot, deltas = next_checkpoint(w.snapshot_ready or w.snapshot, w.deltas, delta)
        update = ManifestUpdate(
            source_offset=batch.end_offset,
            snapshot=snapshot,
            deltas=deltas,
            outputs=[artifact_ref(okey, data)],
            events_applied=w.events_applied + batch.events,
            generation=self.generation,
        )
        # StaleEpoch (a successor's grant), a refused publish, or a lost one that did not land: raised.
        version = commit(self.ledger, self.publisher, token, update)
        w.values.update(touched)
        w.offset = batch.end_offset
        self.delta_cache[dkey] = touched
        self._committed(w, version)
        return f"committed [{batch.start_offset}, {batch.end_offset}) as seq {version.manifest.seq}"

    def _committed(self, w: Worker, version: ManifestVersion) -> None:
        """The checkpoint and offsets a published manifest names become the worker's."""
        m = version.manifest
        if m.snapshot == w.snapshot_ready:
            w.snapshot_ready = None
        w.snapshot, w.deltas, w.events_applied = m.snapshot, list(m.deltas), m.events_applied
        w.commit_ulid, w.restored = m.commit_ulid, version

    def _take_snapshot(self, w: Worker) -> str:
        """Upload the committed state as a snapshot. Off the batch's path, as the node's snapshot
        upload is: batches may commit before a manifest names it."""
        assert w.token is not None
        token, p = w.token, PartitionId(w.partition)
        data = encode_delta(w.values)
        key = checkpoint_key(snapshot_file_key(p, token.node, token.epoch, next_ulid(), "state"))
        offset = w.offset
        self.checkpoints.put_checkpoint(key, data, _fenced_metadata(token, data))
        self.delta_cache[key] = decode_delta(data)
        w.snapshot_ready = SnapshotRef(
            source_offset=offset, files=[SnapshotFile(name="state", ref=artifact_ref(key, data))]
        )
        return f"uploaded a snapshot at offset {offset}"

    def _publish_snapshot(self, w: Worker) -> str:
        """Name the uploaded snapshot in a manifest of its own (the node does so when it has no batch)."""
        assert w.token is not None
        snapshot, deltas = next_checkpoint(w.snapshot_ready, w.deltas)
        update = ManifestUpdate(
            source_offset=w.offset,
            snapshot=snapshot,
            deltas=deltas,
            events_applied=w.events_applied,
            generation=self.generation,
            note="snapshot",
        )
        version = commit(self.ledger, self.publisher, w.token, update)
        self._committed(w, version)
        return f"published the snapshot at offset {version.manifest.state_offset} as seq {version.manifest.seq}"


def _fenced_metadata(token: FencingToken, data: bytes) -> dict[str, str]:
    """The fencing identity and checksum on every object, as a guard's writes carry them (the sweep
    confirms a key by them)."""
    put = PartitionGuard(token).conditional_put_precondition()
    return {**put.as_metadata(), SHA256_METADATA: hashlib.sha256(data).hexdigest()}


@dataclass
class _RestoreFailed(LedgerError):
    """A delta the chain names could not be read (never expected: the checker reports it first)."""

    partition: int
    key: str

    def __str__(self) -> str:
        return f"partition {self.partition}: delta {self.key} is missing"


# --- the control plane ----------------------------------------------------------------------


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

#: Phases the coordinator completes itself: nothing to wait for from a node.
_NO_REPORT = (MigrationPhase.PLANNED,)


class CoordinatorActor(Actor):
    """Plans and drives migrations through the real `MigrationCoordinator`, one store-level decision per step."""

    def __init__(self, world: World, role: CoordinatorRole) -> None:
        super().__init__(world, role.value)
        self.role = role
        self._fresh()

    def _fresh(self, *, resume: bool = True) -> None:
        self.ledger = Ledger(self.world.client_store(), read_parallelism=1)
        self.coordinator = MigrationCoordinator(self.ledger, self.world.migration_config)
        self.driving: dict[int, Driving] = {}
        #: A restarted driver first resumes every unfinished record (a retried Dagster run).
        self.resume_pending = resume

    def crash(self) -> None:
        self._fresh()

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
        return sorted(v.record.node for v in self.ledger.nodes() if v.alive)

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
        epoch = self.coordinator.reinstate(p)
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
            epoch = self.coordinator.reinstate(p)
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
