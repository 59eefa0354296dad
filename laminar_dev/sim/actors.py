"""The simulated processes: steppable state machines over the real protocol code.

Each actor's `step` takes one decision and carries it out through the real
library (`Ledger`, `ManifestPublisher`, `MigrationCoordinator`, `SourceLog`);
every store call inside it is an interleaving point of the scheduler. Actors
keep their memory across steps (a paused actor resumes as a zombie with it)
and lose it on a crash. Nothing here reads the wall clock or sleeps.

* `NodeActor` (`node_actor`) - a worker node: registers, heartbeats, and per
  partition takes the production worker's decisions, from placement and
  recovery to a graceful handoff; an earlier process of a restarted node runs
  on as a zombie.
* `CoordinatorActor` (`coordinator_actor`) - the control plane: a failover
  sensor (places and fails over partitions, fails overdue records) or an
  operator (graceful moves, cancels), each driving its migrations phase by
  phase without blocking.
* `ProducerActor` - appends events to the source log.
* `SweeperActor` - the auditor: now and then runs the real anti-entropy sweep,
  which deletes unreferenced objects of sealed epochs, between the others' steps.
* `StandbyActor` - follows the chains like a warm standby (a long-lived
  `ManifestReader`) and with fresh readers; what it holds must be genuine, and
  at any instant a fresh reader must end on the newest genuine entry.
* `IntruderActor` - another node's credentials and keys: creates forged (or
  superseded) entries at the next sequence number, moves pointers to any entry,
  forges releases; its favourite moment is a handoff between release and seal.

This module holds the producer, the sweeper, the standby and the intruder
(with `ObserverActor`, the base of those outside the protocol). The base of
every actor (`Actor`) is in `base_actor`, what the actors see of the world in
`view`; the node and coordinator actors are importable from here too.
"""

from __future__ import annotations

import contextlib

import pyarrow as pa

from laminar_orchestration.errors import InvalidInputError
from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.ops import sweep as antientropy
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.keys import manifest_history_key, manifest_pointer_key, release_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import LedgerError, PartitionStatus, ReleaseRecord, new_write_id, now
from laminar_orchestration.protocol.signing import SigningKey, SigningKeys, sign_record
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.source_events import SourceEvent
from laminar_orchestration.store import PreconditionFailed, StoreError
from laminar_orchestration.ulid import next_ulid

from .base_actor import Actor as Actor
from .base_actor import ActorStatus as ActorStatus
from .base_actor import hold
from .coordinator_actor import CoordinatorActor as CoordinatorActor
from .coordinator_actor import CoordinatorRole as CoordinatorRole
from .coordinator_actor import Driving as Driving
from .invariants import ReaderDisagrees
from .node_actor import NodeActor as NodeActor
from .node_actor import Worker as Worker
from .node_actor import WorkerState as WorkerState
from .view import SimWorld


class ObserverActor(Actor):
    """An actor outside the protocol that reads through a store client of its own, new after a crash."""

    def __init__(self, world: SimWorld, name: str) -> None:
        super().__init__(world, name)
        self.observer = True
        self._fresh()

    def _fresh(self) -> None:
        self.store = self.world.client_store()


# --- producers -------------------------------------------------------------------------


class ProducerActor(Actor):
    """Appends a few events to a random partition per step (real `SourceLog`, retried on conflicts)."""

    def __init__(self, world: SimWorld, name: str) -> None:
        super().__init__(world, name)
        self.log = SourceLog(world.client_store(), partitions=world.config.partitions, segment_events=8)

    def step(self) -> str:
        rng = self.world.rng
        p = rng.randrange(self.world.config.partitions)
        ms = int(self.world.clock.seconds * 1000)
        if rng.random() < UNDECODABLE_RATE:
            return self._append_undecodable(p, ms)
        # Trusted values of the field types (the append checks the events again): no validation per event.
        events = [
            SourceEvent.model_construct(partition=p, key=f"k{rng.randrange(6)}", value=float(rng.randint(1, 9)), ts=ms)
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

    def __init__(self, world: SimWorld, name: str) -> None:
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
