"""The fixes a scenario can put back (`Knobs`), and how: `reverted` patches the library back to the
code before each fix for the duration of a run, so a test can show the simulation finds the bug the
fix closed. The functions named ``_..._before_fix`` are those earlier versions."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from laminar_orchestration import clock as clock_module
from laminar_orchestration.clock import current as current_clock
from laminar_orchestration.control import coordinator as migration_module
from laminar_orchestration.control import failover as failover_module
from laminar_orchestration.control import moves as moves_module
from laminar_orchestration.control import phase_records as phase_records_module
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.dataplane import log_watch as log_watch_module
from laminar_orchestration.dataplane.log_watch import LOG_ENDS_TRUST_S, LogWatch
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.ops import sweep as antientropy
from laminar_orchestration.ops.sweep import EPOCH_METADATA, PARTITION_METADATA, SweepReport
from laminar_orchestration.protocol import commit as commit_module
from laminar_orchestration.protocol import nudge as nudge_module
from laminar_orchestration.protocol import source as source_module
from laminar_orchestration.protocol import source_events as source_events_module
from laminar_orchestration.protocol.capabilities import ledger_key
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.desired_states import DesiredState, DesiredStates, NodeAssignment, StalledMoves
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.keys import (
    FENCED_OBJECT_PREFIXES,
    UnparseableObjectKey,
    assignment_key,
    parse_fenced_object_key,
)
from laminar_orchestration.protocol.ledger import EpochConflict, Ledger
from laminar_orchestration.protocol.manifest import PartitionManifest
from laminar_orchestration.protocol.migration_errors import MigrationEpochConflict, MigrationNotOwned
from laminar_orchestration.protocol.records import now
from laminar_orchestration.protocol.source_events import SourceEvent
from laminar_orchestration.protocol.tasks import MigrationTask
from laminar_orchestration.store import ObjectNotFound, ObjectStore, PreconditionFailed

from . import coordinator_actor as coordinator_actor_module


@dataclass(frozen=True)
class Knobs:
    """Reverts of fixes, so tests can show the simulation finds the bugs they fixed. All off: the code as is."""

    #: The owner skips its probe for a successor's grant right before publishing.
    skip_successor_probe: bool = False
    #: Granting an epoch does not seal the manifest chain, and the grantee reads it unsealed.
    revert_grant_seal: bool = False
    #: A forced fence that finds the epoch moved leaves its record as is, and deadlines are not enforced.
    revert_lost_fence_fix: bool = False
    #: A move that ends unfinished after its target took the epoch leaves the desired owner unchanged,
    #: and only the last migration record can tell that the ledger's owner is stranded.
    revert_aborted_owner_fix: bool = False
    #: The sweep deletes an unreferenced object once it is older than the grace period, sealed epoch or not.
    revert_sweep_sealed_only: bool = False
    #: A reader trusts an entry reached through the pointer unless a later epoch was granted: a restarted
    #: node's earlier incarnation (its generation older than the node record's) is not looked for.
    revert_generation_pointer_fix: bool = False
    #: A graceful takeover checks the entry at the sequence number below its seal for the released
    #: commit, not the one the seal's parent hash names (a forged entry may stand between them).
    revert_handoff_parent_fix: bool = False
    #: The control plane does not complete a grant whose granter died before sealing the chain.
    revert_unassigned_seal_fix: bool = False
    #: `SourceLog.append` takes a key column of Arrow strings without checking they are UTF-8.
    revert_utf8_append_check: bool = False
    #: A node learns a move's next phase only through its assignment, however long its entry stands still.
    revert_stalled_move_read: bool = False
    #: An assignment write lists the revision it was handed, older than the one listed or not.
    revert_assignment_revision_check: bool = False
    #: A granter's read of the chain on its word of the newest grant (an entry of that epoch not probed
    #: for a later one) starts its later reads unchecked, though the word was stale.
    revert_stale_word_trust: bool = False
    #: A grant back to a released partition's desired owner only nudges the owner: an assignment its
    #: last writer left out (the writer died between the state and the assignment) stays out.
    revert_reinstate_lists_owner: bool = False
    #: A nudge's timeout is per socket read (urllib's), any URL scheme is tried, and the doorbell sends
    #: every ring to every address in turn from its one thread (`doorbell`'s scenario finds it).
    revert_nudge_deadline: bool = False
    #: A worker waiting on the recorded log ends sleeps until its fallback poll however long the node
    #: has not read them, and a new worker is handed the node's last-read ends as seen now
    #: (`log_ends`' scenario finds it).
    revert_log_ends_fallback: bool = False


# --- reverted fixes ----------------------------------------------------------------------------


class _NoSeal:
    """A grant path that does not seal the manifest chain (the code before the seal was the fence point)."""

    def seal(self, *args: Any, **kwargs: Any) -> None:
        return None

    def current(self, *args: Any, **kwargs: Any) -> None:
        return None

    def read_chain(self, *args: Any, **kwargs: Any) -> None:
        return None


def _stranded_before_fix(state: DesiredState, own: Ownership) -> bool:
    """`failover.stranded` before it looked past the last record: only a just-ended move's grant counted."""
    task = state.migration
    if own.owner == UNASSIGNED or task is None or not task.phase.is_aborted or task.to_epoch != own.epoch:
        return False
    return task.to_node == own.owner or state.owner != own.owner


def _fence_before_fix(self: MigrationCoordinator, task: MigrationTask) -> None:
    """`MigrationCoordinator._fence_old_owner` as it was before a lost fence failed its own record."""
    p = PartitionId(task.partition)
    own = self.ledger.ownership(p)
    if own is None:
        raise MigrationNotOwned(p, NodeId(task.from_node))
    if own.epoch == task.to_epoch and own.owner == task.to_node:
        return
    target = self.ledger.members.node(NodeId(task.to_node))
    try:
        self.ledger.fence(
            p,
            NodeId(task.to_node),
            expected_epoch=task.from_epoch,
            reason=f"migration {task.migration_id}",
            generation=target.generation if target else None,
        )
    except EpochConflict as exc:
        raise MigrationEpochConflict(p, exc.expected, exc.actual) from None


def _sweep_before_fix(
    store: ObjectStore, *, grace_s: float, dry_run: bool = False, read_parallelism: int | None = None
) -> SweepReport:
    """`antientropy.sweep` as it was before it deleted only objects of sealed epochs.

    An unreferenced object went when its epoch was below the chain's latest
    fencing token, or when it was older than `grace_s` by its name's ULID -
    whatever its epoch, so an owner stalled between upload and publish lost it.
    """
    ledger = Ledger(store, read_parallelism=read_parallelism)
    reader = ManifestReader(store)
    referenced: set[str] = set()
    tokens: dict[int, int] = {}
    for p in ledger.partitions():
        for version in reader.history(PartitionId(p)):
            m = version.manifest
            referenced.update(ref.key for ref in m.artifacts())
            tokens[p] = m.fencing_token
    report = SweepReport()
    now_ms = current_clock().now().timestamp() * 1000.0
    for prefix in FENCED_OBJECT_PREFIXES:
        for key in store.list(prefix):
            report.scanned += 1
            if key in referenced:
                report.referenced += 1
                continue
            meta = store.head(key)
            if meta is None:
                continue
            try:
                partition = int(meta.metadata.get(PARTITION_METADATA, "-1"))
                epoch = int(meta.metadata.get(EPOCH_METADATA, "-1"))
            except ValueError:
                continue
            superseded = 0 <= epoch < tokens.get(partition, 0)
            try:
                expired = now_ms - parse_fenced_object_key(key).created_ms > grace_s * 1000.0
            except UnparseableObjectKey:
                expired = False
            if not (superseded or expired):
                report.kept_in_grace.append(key)
                continue
            report.deleted.append(key)
            if not dry_run:
                try:
                    store.delete_if_match(key, meta.etag)
                except (PreconditionFailed, ObjectNotFound):
                    report.deleted.pop()
    return report


def _writer_moved_past_before_fix(
    self: ManifestReader, partition: int, m: PartitionManifest, newest_grant: int | None = None
) -> bool:
    """`ManifestReader._writer_moved_past` before it looked at the writer's node record: only a later
    grant made a reader distrust an entry reached through the pointer."""
    return m.fencing_token != newest_grant and self.grant_keys.superseded(partition, m.fencing_token)


def _parent_before_fix(self: ManifestReader, version: ManifestVersion) -> ManifestVersion | None:
    """What `handoff.take_over` checked before it followed the seal's parent hash: the entry at the
    sequence number below the seal (None when that one is forged)."""
    return self.entry(PartitionId(version.manifest.partition), version.manifest.seq - 1)


def _complete_grant_before_fix(self: Ledger, partition: PartitionId, ownership: Ownership | None = None) -> bool:
    """Before `Ledger.complete_grant`: nothing finished a grant whose granter died before its seal."""
    return False


def _normalize_events_before_fix(
    normalize: Callable[[int, Sequence[SourceEvent] | pa.Table], pa.Table],
) -> Callable[[int, Sequence[SourceEvent] | pa.Table], pa.Table]:
    """`source_events.normalize_events` (what `SourceLog.append` validates with) as before it checked that
    a key column's Arrow strings are UTF-8; the worker's check of a batch it cannot decode stays."""

    def nothing_invalid(values: pa.Array | pa.ChunkedArray) -> int | None:
        return None

    def unchecked(partition: int, events: Sequence[SourceEvent] | pa.Table) -> pa.Table:
        check = source_events_module.invalid_utf8_row
        source_events_module.invalid_utf8_row = nothing_invalid
        try:
            return normalize(partition, events)
        finally:
            source_events_module.invalid_utf8_row = check

    return unchecked


def _write_assignment_before_fix(self: DesiredStates, node: NodeId, states: Mapping[PartitionId, DesiredState]) -> bool:
    """`DesiredStates._write_assignment` before it compared revisions: a late writer's older state
    (a driver's phase over a completed cancel) was listed over the newer one."""
    key = ledger_key(assignment_key(node))
    while True:
        current, etag = self.assignment(node)
        partitions = dict(current.partitions) if current else {}
        copies = {
            p: s
            for p, s in (current.states if current else {}).items()
            if s.migration is not None and not s.migration.is_terminal
        }
        for p, state in states.items():
            if node in state.named_nodes():
                partitions[int(p)] = state.revision
                if state.migration is not None:
                    copies[int(p)] = state
            else:
                partitions.pop(int(p), None)
                copies.pop(int(p), None)
        copies = {p: s for p, s in copies.items() if partitions.get(p) == s.revision}
        if current is not None and partitions == current.partitions:
            return False
        version = current.version + 1 if current else 1
        record = NodeAssignment(node=node, version=version, partitions=partitions, states=copies, updated_at=now())
        data = record.model_dump_json().encode()
        writer = self._writer
        try:
            writer.create(key, data) if etag is None else writer.swap(key, data, etag)
        except PreconditionFailed:
            continue
        return True


def _send_nudge_before_fix(url: str, *, timeout_s: float = nudge_module.NUDGE_TIMEOUT_S, body: bytes = b"") -> bool:
    """`nudge.send_nudge` before its whole request had one deadline: urllib's timeout is per read."""
    try:
        request = urllib.request.Request(url, data=body, method="POST")
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return bool(200 <= response.status < 300)
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _hand_out_before_fix(self: nudge_module.SourceDoorbell, ends: dict[int, int]) -> None:
    """`SourceDoorbell`'s hand-out before each address had its own sender: every ring to every address
    in turn, from the one ring thread, which any error ends."""
    body = json.dumps({"source": {str(p): end for p, end in ends.items()}}).encode()
    for url in self._addresses.urls(self._member_ids()):
        nudge_module.send_nudge(url, body=body)


def _advanced_before_fix(self: LogWatch, end_offset: int, *, from_log_ends: bool, read_at: float | None = None) -> bool:
    """`LogWatch.advanced` before recorded ends counted as seen when the node read them: handed over is seen."""
    if from_log_ends:
        self.ends_seen_at = clock_module.current().monotonic()
    else:
        self.doorbell_at = clock_module.current().monotonic()
    if end_offset > self.known_end:
        self.known_end = end_offset
        return True
    return False


def _idle_until_before_fix(self: LogWatch, committed: int) -> float | None:
    """`LogWatch.idle_until` before it woke the worker when the ends' trust runs out."""
    clock = clock_module.current().monotonic
    seen = self.ends_seen_at
    if not self.at_end or seen is None or clock() - seen > LOG_ENDS_TRUST_S or self.known_end > committed:
        return None
    if self.probe_s <= log_watch_module.BUSY_PROBE_LAST_S and not self._doorbell_rings():
        due = self.read_at + self.probe_s
    else:
        due = self.read_at + self.fallback_s
    return due if due > clock() else None


@contextlib.contextmanager
def reverted(knobs: Knobs) -> Iterator[None]:
    """Patch the library back to before the fixes `knobs` revert, for the duration of a run."""
    saved: list[tuple[object, str, object]] = []

    def patch(owner: object, name: str, value: object) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    if knobs.skip_successor_probe:
        patch(commit_module, "successor_grant", lambda _ledger, _token: None)
    if knobs.revert_grant_seal:
        patch(Ledger, "sealer", property(lambda _self: _NoSeal()))
    if knobs.revert_lost_fence_fix:
        patch(MigrationCoordinator, "_fence_old_owner", _fence_before_fix)
        patch(migration_module, "deadline_passed", lambda _task, at=None: False)
        patch(phase_records_module, "deadline_passed", lambda _task, at=None: False)
    if knobs.revert_aborted_owner_fix:
        patch(phase_records_module, "_took_epoch", lambda _task, _own: False)
        # Both repair a desired owner the ledger's owner is not: reverting one, revert the other.
        patch(failover_module, "stranded", _stranded_before_fix)
        patch(moves_module, "stranded", _stranded_before_fix)
        patch(coordinator_actor_module, "stranded", _stranded_before_fix)
    if knobs.revert_sweep_sealed_only:
        patch(antientropy, "sweep", _sweep_before_fix)
    if knobs.revert_generation_pointer_fix:
        patch(ManifestReader, "_writer_moved_past", _writer_moved_past_before_fix)
    if knobs.revert_stale_word_trust:
        patch(ManifestReader, "_checked_for_later_reads", lambda _self, *_args: True)
    if knobs.revert_handoff_parent_fix:
        patch(ManifestReader, "parent", _parent_before_fix)
    if knobs.revert_unassigned_seal_fix:
        patch(Ledger, "complete_grant", _complete_grant_before_fix)
    if knobs.revert_stalled_move_read:
        patch(StalledMoves, "due", lambda _self, _in_flight, _listed, _at: set())
    if knobs.revert_assignment_revision_check:
        patch(DesiredStates, "_write_assignment", _write_assignment_before_fix)
    if knobs.revert_reinstate_lists_owner:
        patch(DesiredStates, "list_for_owner", lambda self, _partition, state: self.nudge([state.owner]))
    if knobs.revert_nudge_deadline:
        patch(nudge_module, "send_nudge", _send_nudge_before_fix)
        patch(nudge_module.SourceDoorbell, "_hand_out", _hand_out_before_fix)
    if knobs.revert_log_ends_fallback:
        patch(LogWatch, "advanced", _advanced_before_fix)
        patch(LogWatch, "idle_until", _idle_until_before_fix)
    if knobs.revert_utf8_append_check:
        patch(source_module, "normalize_events", _normalize_events_before_fix(source_events_module.normalize_events))
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
