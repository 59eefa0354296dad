"""The simulated processes: steppable state machines over the real protocol code.

Each actor's `step` takes one decision and carries it out through the real
library (`Ledger`, `ManifestPublisher`, `MigrationCoordinator`, `SourceLog`);
every store call inside it is an interleaving point of the scheduler. Actors
keep their memory across steps (a paused actor resumes as a zombie with it)
and lose it on a crash. Nothing here reads the wall clock or sleeps.

* `NodeActor` - a worker node: registers, heartbeats with its partitions'
  progress, and per partition takes the production worker's decisions
  (`laminar_orchestration.dataplane.handoff`): what to start for a partition it runs
  nothing for (`partition_duty`), recover its own grant, drain and release for
  a graceful move away, restore, adopt the granted epoch and take over at the
  seal for an incoming one; it processes a batch as an in-process keyed fold
  and commits it as the worker does (`laminar_orchestration.protocol.commit`).
* `CoordinatorActor` - the control plane: a failover sensor (places and fails
  over partitions, fails overdue records) or an operator (graceful moves,
  cancels), each driving its migrations phase by phase without blocking.
* `ProducerActor` - appends events to the source log.
* `SweeperActor` - the auditor: now and then runs the real anti-entropy sweep,
  which deletes unreferenced objects of sealed epochs, between the others' steps.
* `StandbyActor` - follows the chains like a warm standby (a long-lived
  `ManifestReader`) and with fresh readers; what it holds must be genuine, and
  at any instant a fresh reader must end on the newest genuine entry.
* `IntruderActor` - another node's credentials and keys: creates forged (or
  superseded) entries at the next sequence number, moves pointers to any entry,
  forges releases; its favourite moment is a handoff between release and seal.

A node that restarts under a new generation while its earlier process keeps
running (`World._split`) leaves that process as a zombie `NodeActor`: it no
longer heartbeats and skips its client-side checks (the successor probe, the
guard refresh, the publisher's succession checks), so it writes void entries
and moves the pointer to them; only what readers make of them is checked.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NoReturn

import pyarrow as pa

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import (
    moves_on_without_old_owner,
    must_force,
    prepare_failover,
    record_failure,
    stranded,
)
from laminar_orchestration.dataplane.checkpoint import next_checkpoint
from laminar_orchestration.dataplane.handoff import (
    HandoffMismatch,
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
from laminar_orchestration.errors import InvalidInputError
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.ops import sweep as antientropy
from laminar_orchestration.protocol.capabilities import (
    CheckpointWriter,
    LedgerWriter,
    OutputCommitter,
    ReadStore,
    checkpoint_key,
    sink_key,
)
from laminar_orchestration.protocol.chain import (
    ManifestPublisher,
    ManifestReader,
    ManifestUpdate,
    ManifestVersion,
    next_manifest,
)
from laminar_orchestration.protocol.commit import commit
from laminar_orchestration.protocol.fencing import EpochError, FencingToken, PartitionGuard
from laminar_orchestration.protocol.keys import (
    delta_key,
    manifest_history_key,
    manifest_pointer_key,
    output_object_key,
    release_key,
    snapshot_file_key,
)
from laminar_orchestration.protocol.ledger import EpochConflict, Ledger, NodeHandle, NodeIdentityConflict, NodeView
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
from laminar_orchestration.protocol.move_reports import MoveReporter
from laminar_orchestration.protocol.records import (
    LedgerError,
    NodeStatus,
    PartitionProgress,
    PartitionStatus,
    ReleaseRecord,
    new_write_id,
    now,
)
from laminar_orchestration.protocol.segments import SourceEvent
from laminar_orchestration.protocol.signing import SigningKey, SigningKeys, sign_record
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import (
    MigrationEpochConflict,
    MigrationError,
    MigrationKind,
    MigrationPhase,
    MigrationTask,
    MigrationTimeout,
    phase_sequence,
)
from laminar_orchestration.store import PreconditionFailed, StoreError
from laminar_orchestration.ulid import next_ulid

from .invariants import (
    FoldState,
    HandoffRefused,
    OwnerCommitRefused,
    ReaderDisagrees,
    VoidEntryHeld,
    decode_delta,
    encode_delta,
)

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
        #: Ends for good at this simulated time (a zombie process); never otherwise.
        self.dies_at = float("inf")
        #: May write void entries (skips its client-side checks, or holds no grant's key).
        self.rogue = False
        #: Not part of the protocol (the sweeper, the standby, the intruder): its store calls do not
        #: count towards a scenario's protocol steps.
        self.observer = False

    def step(self) -> str:
        """Take one decision and carry it out; returns what it did (for the trace)."""
        raise NotImplementedError

    def crash(self) -> None:
        """Lose all in-memory state (the process died)."""
        self._fresh()

    def restart(self) -> None:
        """Start again after a crash, from nothing but the store."""
        self._fresh()

    def _fresh(self) -> None:
        """Set up the in-memory state a new process starts with (none by default)."""

    def idle(self, low: float, high: float) -> None:
        """Sleep (in simulated time) for a random while before the next step."""
        self.wake_at = self.world.clock.seconds + self.world.rng.uniform(low, high)


class ObserverActor(Actor):
    """An actor outside the protocol that reads through a store client of its own, new after a crash."""

    def __init__(self, world: World, name: str) -> None:
        super().__init__(world, name)
        self.observer = True
        self._fresh()

    def _fresh(self) -> None:
        self.store = self.world.client_store()


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
        if rng.random() < UNDECODABLE_RATE:
            return self._append_undecodable(p, ms)
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

    def _append_undecodable(self, p: int, ms: int) -> str:
        """A table whose key column holds bytes that are not UTF-8 (Arrow strings are unchecked bytes: a
        Parquet file's, a cast's): `append` must refuse it with a typed invalid-input error."""
        rng = self.world.rng
        raw = [f"k{rng.randrange(6)}".encode(), bytes([0xFF, rng.randrange(256)])]
        keys = pa.array(raw, pa.binary()).cast(pa.string(), safe=False)
        table = pa.table({"key": keys, "value": [1.0, 2.0], "ts": pa.array([ms, ms], pa.int64())})
        self.idle(0.2, 0.6)
        try:
            result = self.log.append(p, table)
        except InvalidInputError as exc:
            return f"append p{p} of undecodable keys refused: {type(exc).__name__}"
        except (StoreError, LedgerError) as exc:
            return f"append p{p} failed: {type(exc).__name__}"
        return f"appended undecodable keys to p{p} [{result.first_offset}, {result.next_offset})"


#: Per producer step: an append of events whose keys are not valid UTF-8.
UNDECODABLE_RATE = 0.02


# --- the auditor ---------------------------------------------------------------------------

#: Simulated seconds between two sweeps while faults last, and once they stopped (the races are over;
#: the scenario's last sweep checks what is left).
SWEEP_INTERVAL_S = (0.25, 1.0)
CALM_SWEEP_INTERVAL_S = (2.0, 8.0)
#: The sweep's minimum age of an object it deletes: none, or less than a stall (age is never the reason).
SWEEP_GRACE_S = (0.0, 0.0, 0.25, 1.0)


class SweeperActor(ObserverActor):
    """The auditor role: runs `antientropy.sweep` through its own store client, between everything else."""

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


# --- readers and intruders ------------------------------------------------------------------


class StandbyActor(ObserverActor):
    """Follows the manifest chains as a warm standby does (one long-lived `ManifestReader`), and
    with fresh readers (a node restoring, a CLI). Whatever it reads must be genuine; and at any
    instant a fresh reader over the store must end on the chain's newest genuine entry."""

    def _fresh(self) -> None:
        super()._fresh()
        self.follower = ManifestReader(self.store)

    def step(self) -> str:
        rng = self.world.rng
        self.idle(*((0.1, 0.4) if self.world.faults_on else (1.0, 3.0)))
        p = rng.randrange(self.world.config.partitions)
        try:
            version = self.follower.current(PartitionId(p))
            hold(self.world, p, version, "the standby")
            if rng.random() < 0.5:
                hold(self.world, p, ManifestReader(self.store).current(PartitionId(p)), "a fresh reader")
        except (StoreError, LedgerError) as exc:
            return f"p{p}: {type(exc).__name__}"
        self._audit(p)
        return f"p{p}: follows seq {version.manifest.seq if version else 0}"

    def _audit(self, p: int) -> None:
        """A fresh reader over the store itself (no scheduling point: one instant) against the
        newest genuine entry (the checker's), which is where an audit of the whole chain ends; now
        and then the library's audit (`ManifestReader.history`, every entry from the first) too."""
        if self.world.checker.violation is not None:
            return
        tip = self.world.checker.tip(p)
        readers = [("a fresh reader", ManifestReader(self.world.memory).current(PartitionId(p)))]
        if self.world.rng.random() < AUDIT_HISTORY_RATE:
            history = list(ManifestReader(self.world.memory).history(PartitionId(p)))
            readers.append(("the audit", history[-1] if history else None))
        for reader, version in readers:
            if (version.raw_hash if version else None) != (tip[1] if tip else None):
                seq = version.manifest.seq if version else None
                self.world.violated(ReaderDisagrees(p, reader, seq, tip[0] if tip else None))


#: Per standby step: also walk the whole chain as an audit does (one GET and one verification per entry).
AUDIT_HISTORY_RATE = 0.1


#: Per intruder step (while faults last): forge an entry (more often during a handoff), move a
#: pointer to any entry, forge a release.
FORGE_ENTRY_RATE = 0.35
REPLAY_POINTER_RATE = 0.2
FORGE_RELEASE_RATE = 0.03


class IntruderActor(Actor):
    """Another node's credentials, which the store's policies let write under any partition's
    ``manifests/`` and release keys, and that node's own grants' keys: it creates entries at the next
    sequence number (signed with a key that is not the grant's, or with a former owner's key under its
    old epoch), moves pointers to any entry, and forges releases. All of it is void; its favourite
    moment is a graceful handoff between the old owner's release and the grant's seal."""

    def __init__(self, world: World, name: str) -> None:
        super().__init__(world, name)
        self.observer = True
        self.rogue = True
        self.store = world.client_store()
        self.ledger = Ledger(self.store, read_parallelism=1)
        self.reader = ManifestReader(self.store)
        self.keys = SigningKeys(ReadStore(self.store))

    def step(self) -> str:
        rng = self.world.rng
        if not self.world.faults_on:
            # The races it exploits are over (the zombies' void entries are still checked as they come).
            self.idle(5.0, 10.0)
            return "intruder idle"
        self.idle(0.15, 0.6)
        p = PartitionId(rng.randrange(self.world.config.partitions))
        try:
            own = self.ledger.ownership(p)
            if own is None or own.epoch == 0:
                return f"p{p}: nothing to forge"
            r = rng.random()
            # Released and not granted again yet: between the old owner's release and the grant's seal.
            if own.status == PartitionStatus.RELEASED or r < FORGE_ENTRY_RATE:
                return self._forge_entry(p, own.epoch, own.owner)
            if r < FORGE_ENTRY_RATE + REPLAY_POINTER_RATE:
                return self._replay_pointer(p)
            if r < FORGE_ENTRY_RATE + REPLAY_POINTER_RATE + FORGE_RELEASE_RATE:
                return self._forge_release(p, own.epoch, own.owner)
        except (StoreError, LedgerError) as exc:
            return f"p{p}: {type(exc).__name__}"
        return f"p{p}: lurking"

    def _forge_entry(self, p: PartitionId, epoch: int, owner: int) -> str:
        rng = self.world.rng
        read = self.reader.read_chain(p)
        if read.version is None:
            return f"p{p}: no chain to forge into"
        tip = read.version.manifest
        # A former owner's key under its old epoch (superseded), or a key that is not the grant's (forged).
        former = [g for g in self.ledger.grants(p) if g.epoch < tip.fencing_token and g.node != UNASSIGNED]
        if former and rng.random() < 0.3:
            grant = rng.choice(former)
            key = self.keys.get(grant.node, p, grant.epoch)
            claims, node, what = grant.epoch, grant.node, f"with node {grant.node}'s key of epoch {grant.epoch}"
        else:
            key = SigningKey.generate(p, epoch, owner)
            claims, node, what = tip.fencing_token, tip.node, "with a key that is not the grant's"
        forged = tip.model_copy(
            update={
                "seq": read.next_seq,
                "fencing_token": claims,
                "node": node,
                "commit_ulid": next_ulid(tip.commit_ulid),
                "parent_hash": read.version.raw_hash,
                "source_offset": tip.source_offset + rng.randint(0, 40),
                "outputs": [],
                "note": "forged",
                "committed_at": now(),
                "write_id": new_write_id(),
                "signature": None,
            }
        )
        raw = sign_record(forged, key).model_dump_json().encode()
        if rng.random() < 0.05:
            raw, what = b'{"kind": "partition-manifest", "garbage', "that does not parse"
        try:
            self.store.put_if_absent(manifest_history_key(p, read.next_seq), raw)
        except PreconditionFailed:
            return f"p{p}: lost seq {read.next_seq} to a writer"
        moved = rng.random() < 0.5
        if moved:
            self._point(p, raw, read.pointer_etag)
        return f"p{p}: forged seq {read.next_seq} {what}{' and pointed at it' if moved else ''}"

    def _replay_pointer(self, p: PartitionId) -> str:
        read = self.reader.read_chain(p)
        if read.next_seq <= 1:
            return f"p{p}: no entry to point at"
        seq = self.world.rng.randrange(1, read.next_seq)
        obj = self.store.get_or_none(manifest_history_key(p, seq))
        if obj is None:
            return f"p{p}: no entry {seq}"
        self._point(p, obj.data, read.pointer_etag)
        return f"p{p}: pointed at seq {seq}"

    def _point(self, p: PartitionId, raw: bytes, etag: str | None) -> None:
        key = manifest_pointer_key(p)
        with contextlib.suppress(PreconditionFailed):
            if etag is None:
                self.store.put_if_absent(key, raw)
            else:
                self.store.put_if_match(key, raw, etag)

    def _forge_release(self, p: PartitionId, epoch: int, owner: int) -> str:
        if owner == UNASSIGNED:
            return f"p{p}: no owner to forge a release of"
        record = ReleaseRecord(
            partition=p, epoch=epoch, node=owner, commit_ulid=None, source_offset=0, released_at=now()
        )
        raw = sign_record(record, SigningKey.generate(p, epoch, owner)).model_dump_json().encode()
        try:
            self.store.put_if_absent(release_key(p, epoch), raw)
        except PreconditionFailed:
            return f"p{p}: epoch {epoch} released already"
        return f"p{p}: forged the release of epoch {epoch}"


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
    #: The commit a graceful move's old owner released (the takeover's seal must follow it).
    released: str | None = None

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
        #: Delta objects are immutable: a node keeps what it downloaded (its local disk).
        self.delta_cache: dict[str, FoldState] = {}

    @property
    def generation(self) -> int:
        return self.handle.generation if self.handle else 0

    def running_epoch(self, partition: int) -> int | None:
        """The epoch this node runs `partition` at, if it runs it."""
        w = self.workers[partition]
        return w.token.epoch if w.state == WorkerState.RUNNING and w.token else None

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
                handle = self.ledger.register_node(
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


def hold(world: World, partition: int, version: ManifestVersion | None, reader: str) -> None:
    """`reader` takes `version` for the newest entry of `partition`'s chain: it must not be a void one."""
    if version is not None:
        seq = world.checker.is_void(partition, version.raw)
        if seq is not None:
            world.violated(VoidEntryHeld(partition, seq, reader))


class _RestoreFailed(LedgerError):
    """A delta the chain names could not be read (never expected: the checker reports it first)."""

    partition: int
    key: str

    message = "partition {partition}: delta {key} is missing"


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

    def __init__(self, world: World, role: CoordinatorRole) -> None:
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
                unassigned = self._unassign(self.ledger.nodes())
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
