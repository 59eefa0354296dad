"""The worker node actor: `NodeActor` and the per-partition `Worker` state it keeps in memory.

A node registers, heartbeats with its partitions' progress, learns what the
control plane asks of it through its assignment record as the runtime does
(`follower`), and per partition takes the production worker's decisions (`laminar_orchestration.dataplane.handoff`):
what to start for a partition it runs nothing for (`partition_duty`), recover
its own grant, drain and release for a graceful move away, restore, adopt the
granted epoch and take over at the seal for an incoming one; it processes a
batch as an in-process keyed fold and commits it as the worker does
(`laminar_orchestration.protocol.commit`).

A node that restarts under a new generation while its earlier process keeps
running (`World._split`) leaves that process as a zombie `NodeActor`: it no
longer heartbeats and skips its client-side checks (the successor probe, the
guard refresh, the publisher's succession checks), so it writes void entries
and moves the pointer to them; only what readers make of them is checked."""

from __future__ import annotations

import contextlib
import enum
import hashlib
from dataclasses import dataclass, field, replace
from typing import NoReturn

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.dataplane.checkpoint import next_checkpoint
from laminar_orchestration.dataplane.errors import HandoffMismatch
from laminar_orchestration.dataplane.handoff import (
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
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import (
    CheckpointWriter,
    LedgerWriter,
    OutputCommitter,
    ReadStore,
    checkpoint_key,
    sink_key,
)
from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate, next_manifest
from laminar_orchestration.protocol.commit import commit
from laminar_orchestration.protocol.fencing import EpochError, FencingToken, PartitionGuard
from laminar_orchestration.protocol.keys import delta_key, output_object_key, snapshot_file_key
from laminar_orchestration.protocol.ledger import Ledger, NodeIdentityConflict
from laminar_orchestration.protocol.manifest import (
    SHA256_METADATA,
    CommitUlidRegression,
    DeltaRef,
    ParentHashMismatch,
    SequenceGap,
    SnapshotFile,
    SnapshotRef,
    SourceOffsetRegression,
    StaleFencingToken,
    StaleGeneration,
    SuccessionError,
    artifact_ref,
)
from laminar_orchestration.protocol.membership import NodeHandle
from laminar_orchestration.protocol.move_reports import MoveReporter
from laminar_orchestration.protocol.records import LedgerError, NodeStatus, PartitionProgress
from laminar_orchestration.protocol.signing import sign_record
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import MigrationKind, MigrationPhase, MigrationTask
from laminar_orchestration.store import PreconditionFailed, StoreError
from laminar_orchestration.ulid import next_ulid

from .base_actor import Actor, hold
from .follower import AssignmentFollower
from .invariants import FoldState, HandoffRefused, OwnerCommitRefused, decode_delta, encode_delta
from .view import SimWorld

#: Heartbeat cadence and the timeout after which a node is judged dead (simulated seconds).
HEARTBEAT_INTERVAL_S = 0.5
HEARTBEAT_TIMEOUT_S = 1.5


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
    #: The commit a graceful move's old owner released (the takeover's seal must follow it).
    released: str | None = None
    #: The owner stopped taking batches for a graceful move away (drained, waiting for its release).
    handing_over: bool = False

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
        self.values, self.deltas, self.error, self.released = {}, [], None, None
        self.handing_over = False
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

    def __init__(self, world: SimWorld, node: int) -> None:
        super().__init__(world, f"node{node}")
        self.node = NodeId(node)
        #: An earlier process of the node, still running after the node restarted (`become_zombie`).
        self.zombie = False
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
        self.reporter: MoveReporter | None = None
        self.last_heartbeat = -1e9
        self.workers = {p: Worker(p) for p in range(self.world.config.partitions)}
        #: What the node knows of its partitions' desired states: what its assignment told it.
        self.follower = AssignmentFollower(self.coordinator.desired, self.node, self.world.config.partitions)
        #: Delta objects are immutable: a node keeps what it downloaded (its local disk).
        self.delta_cache: dict[str, FoldState] = {}

    @property
    def generation(self) -> int:
        return self.handle.generation if self.handle else 0

    def running_epoch(self, partition: int) -> int | None:
        """The epoch this node runs `partition` at, if it runs it."""
        w = self.workers[partition]
        return w.token.epoch if w.state == WorkerState.RUNNING and w.token else None

    def handing_over(self, partition: int) -> bool:
        """Whether this process drained `partition` for a move away and waits for its release."""
        w = self.workers[partition]
        return w.state == WorkerState.RUNNING and w.handing_over

    def running_epochs(self) -> dict[int, int]:
        """Partition -> epoch of every partition this process runs."""
        return {p: e for p in self.workers if (e := self.running_epoch(p)) is not None}

    def become_zombie(self, *, dies_at: float) -> None:
        """The node restarted under a new generation without this process noticing: it stops
        heartbeating, runs on what it runs, and skips its client-side checks, until `dies_at`."""
        self.zombie = self.rogue = True
        self.dies_at = dies_at
        self.name = f"{self.name}-zombie-g{self.generation}"

    def step(self) -> str:
        self.idle(0.04, 0.15)
        if self.zombie:
            return self._zombie_step()
        try:
            if self.handle is None:
                handle = self.ledger.members.register_node(
                    self.node, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, host="sim", pid=1
                )
                self.handle, self.last_heartbeat = handle, self.world.clock.seconds
                self.reporter = MoveReporter(LedgerWriter(self.ledger.store), self.node, handle.generation)
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

    def _zombie_step(self) -> str:
        """An earlier process of the node: it commits batches for what it runs, and nothing else (no
        heartbeat, no guard refresh, no migration duty), skipping its client-side checks."""
        running = sorted(self.running_epochs())
        if not running:
            return "zombie: runs nothing"
        p = self.world.rng.choice(running)
        w = self.workers[p]
        try:
            if self.world.rng.random() < 0.15 and w.snapshot_ready is None and len(w.deltas) >= SNAPSHOT_EVERY_DELTAS:
                return f"p{p}: zombie {self._take_snapshot(w)}"
            return f"p{p}: zombie {self._batch(w)}"
        except (StoreError, LedgerError, EpochError) as exc:
            if not isinstance(exc, StoreError):
                w.reset()
            return f"p{p}: zombie {type(exc).__name__}"

    def _heartbeat(self) -> str:
        assert self.handle is not None
        if self.zombie:
            return "zombie: no heartbeat"
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
        if self.reporter is not None and not self.zombie:
            # What the coordinator waits on: the partitions in a move, as the runtime reports them.
            moving = {p: x.progress() for p, x in self.workers.items() if x.migration is not None}
            try:
                self.reporter.report(moving)
            except NodeIdentityConflict:
                self._fresh()

    # -- the owner's state machine ---------------------------------------------------------

    def _work(self, w: Worker) -> str:
        p = PartitionId(w.partition)
        state = self.follower.state(w.partition, self.world.clock.seconds)
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
            w.handing_over = step.action != OldOwnerAction.RUN
            if w.handing_over:
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
        # Named but nothing to do yet (the grant comes after the state): looked at again at every poll.
        if duty == PartitionDuty.NONE and self.node in state.named_nodes():
            self.follower.pending.add(w.partition)
        else:
            self.follower.pending.discard(w.partition)
        match duty:
            case PartitionDuty.RISE:
                return self._rise(w, task)
            case PartitionDuty.RECOVER:
                return self._recover(w)
            case PartitionDuty.NONE:
                return "idle"

    def _restore(self, w: Worker, version: ManifestVersion | None) -> None:
        """Local state = the manifest's snapshot, then its deltas (each object downloaded once per node)."""
        if not self.rogue:
            hold(self.world, w.partition, version, f"{self.name} restoring")
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
        chain moved past our read. A newer epoch's seal raises StaleFencingToken: superseded; a graceful
        handoff whose seal does not follow the released commit raises HandoffMismatch.

        `then`: the state the worker is in afterwards (a migration's target runs only once Active)."""
        if not self.world.config.knobs.revert_grant_seal:
            try:
                takeover = take_over(
                    self.publisher, token, generation=self.generation, restored=w.restored, released=w.released
                )
            except HandoffMismatch as exc:
                self._handoff_refused(token.epoch, exc)
            if takeover.restore_again:
                self._restore(w, takeover.sealed)
            hold(self.world, w.partition, takeover.sealed, f"{self.name} taking over")
            # As the runtime: the seal is the commit a release names until the first batch commits.
            w.restored, w.commit_ulid = takeover.sealed, takeover.sealed.manifest.commit_ulid
        w.token, w.state, w.released = token, then, None
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
                assert task is not None
                return self._download(w, task, step.phase)
            case NewOwnerAction.REPORT:
                assert step.phase is not None
                self._report(w, step.phase)
                return f"reported {step.phase}"
            case NewOwnerAction.TAKE_OVER:
                assert task is not None and step.phase is not None
                return self._adopt_grant(w, task, step.phase)
            case NewOwnerAction.RUN:
                w.state = WorkerState.RUNNING
                return f"active at epoch {w.token.epoch if w.token else 0}"

    def _download(self, w: Worker, task: MigrationTask, done: MigrationPhase | None) -> str:
        """The new owner's download + restore: from the chain (a graceful move: the released commit)."""
        p = PartitionId(w.partition)
        current = self.publisher.current(p)
        released: str | None = None
        if task.migration_kind == MigrationKind.GRACEFUL:
            release = self.ledger.release_record(p, task.from_epoch)
            if release is None:
                return "waiting for the release"
            released = release.commit_ulid
            # As the runtime: the chain must end at the released commit.
            if released and (current is None or current.manifest.commit_ulid != released):
                found = current.manifest.commit_ulid if current else None
                self._handoff_refused(task.to_epoch, HandoffMismatch(p, released, found))
        self._restore(w, current)
        w.state, w.migration, w.finished_migration, w.released = WorkerState.RISING, task, None, released
        if done is not None:  # a forced move's target reports once, with its take-over
            self._report(w, done)
        return f"downloaded for migration {task.migration_id} (offset {w.offset})"

    def _handoff_refused(self, epoch: int, exc: HandoffMismatch) -> NoReturn:
        """Every release the sim hands over was read through `release_record` (verified: genuine), so a
        handoff that refuses it broke a promise."""
        self.world.violated(HandoffRefused(exc.partition, epoch, str(exc)))

    def _adopt_grant(self, w: Worker, task: MigrationTask, done: MigrationPhase) -> str:
        """Adopt the epoch the control plane granted (at Seeking, or with a forced move's fence), take
        over, report `done`."""
        p = PartitionId(w.partition)
        own = self.ledger.ownership(p)
        if own is None or own.epoch < task.to_epoch:
            return "rising: waiting for the grant"
        # Adopting a grant made to another node (or a later one) raises NotOwned: the move is lost.
        token = self.ledger.adopt(p, self.node)
        text = self._take_over(w, token, then=WorkerState.RISING)
        if w.state == WorkerState.RISING:
            self._report(w, done)
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
        w.state, w.token, w.handing_over = WorkerState.IDLE, None, False
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
        version = self._commit(token, update)
        w.values.update(touched)
        w.offset = batch.end_offset
        self.delta_cache[dkey] = touched
        self._committed(w, version)
        return f"committed [{batch.start_offset}, {batch.end_offset}) as seq {version.manifest.seq}"

    def _commit(self, token: FencingToken, update: ManifestUpdate) -> ManifestVersion:
        """`commit.commit`, as the worker commits; a zombie skips the successor probe and the
        publisher's succession checks. An honest owner's publish refused by a succession check (not
        a fence) read a void entry as the chain's newest: a violation."""
        if self.rogue:
            try:
                return self.publisher.publish(token, update)
            except _CHECKS_A_ZOMBIE_SKIPS:
                return _publish_unchecked(self.publisher, token, update)
            except StoreError:
                landed = self.publisher.landed(token, update)
                if landed is None:
                    raise
                return landed
        try:
            return commit(self.ledger, self.publisher, token, update)
        except (SourceOffsetRegression, ParentHashMismatch, CommitUlidRegression, SequenceGap) as exc:
            self.world.violated(OwnerCommitRefused(token.partition, token.epoch, token.node, str(exc)))

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
        version = self._commit(w.token, update)
        self._committed(w, version)
        return f"published the snapshot at offset {version.manifest.state_offset} as seq {version.manifest.seq}"


def _fenced_metadata(token: FencingToken, data: bytes) -> dict[str, str]:
    """The fencing identity and checksum on every object, as a guard's writes carry them (the sweep
    confirms a key by them)."""
    put = PartitionGuard(token).conditional_put_precondition()
    return {**put.as_metadata(), SHA256_METADATA: hashlib.sha256(data).hexdigest()}


#: The publisher's client-side checks of what a new entry follows: a zombie writes anyway.
_CHECKS_A_ZOMBIE_SKIPS = (
    StaleFencingToken,
    StaleGeneration,
    SourceOffsetRegression,
    ParentHashMismatch,
    CommitUlidRegression,
    SequenceGap,
)


def _publish_unchecked(publisher: ManifestPublisher, token: FencingToken, update: ManifestUpdate) -> ManifestVersion:
    """What a process that skips its client-side checks writes: the entry on top of the chain as it
    reads it, signed with its epoch's key (it holds it), and the pointer moved to it."""
    p = token.partition
    read = publisher.read_chain(p)
    manifest = next_manifest(token, replace(update, note="unchecked"), read)
    raw = sign_record(manifest, publisher.signing_keys.get(token.node, p, token.epoch)).model_dump_json().encode()
    chain = publisher._writable_chain(p)
    try:
        chain.create(manifest.seq, raw)
    except PreconditionFailed:
        raise StaleFencingToken(p, token.epoch, token.epoch) from None
    with contextlib.suppress(PreconditionFailed):
        chain.move_pointer(raw, read.pointer_etag)
    return ManifestVersion(manifest, raw)


class _RestoreFailed(LedgerError):
    """A delta the chain names could not be read (never expected: the checker reports it first)."""

    partition: int
    key: str

    message = "partition {partition}: delta {key} is missing"
