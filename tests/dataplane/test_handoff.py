"""The two sides of a migration on the nodes: the decision tables shared by the worker and the simulator.

The worker and the simulator both carry out these decisions, so each rule here
is a promise the whole handoff relies on: nothing is released, taken over or
run before the coordinator recorded the phase that allows it.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from laminar_dev.faults import FaultInjectingStore
from laminar_orchestration.dataplane.errors import HandoffMismatch
from laminar_orchestration.dataplane.handoff import (
    NewOwnerAction,
    NewOwnerStep,
    OldOwnerAction,
    OldOwnerStep,
    PartitionDuty,
    asks_old_owner,
    new_owner_step,
    old_owner_step,
    partition_duty,
    seal_at,
    take_over,
)
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import OutputCommitter
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.desired_states import DesiredState
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.keys import manifest_history_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import PartitionManifest, StaleFencingToken, StaleGeneration
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.protocol.signing import SigningKey, sign_record
from laminar_orchestration.protocol.tasks import (
    FORCED_PHASES,
    GRACEFUL_PHASES,
    MigrationKind,
    MigrationPhase,
    MigrationTask,
)
from laminar_orchestration.store import ObjectStore, StoreError
from laminar_orchestration.ulid import next_ulid

OLD, NEW = NodeId(1), NodeId(2)
EPOCH = 4
MID = "p0-e4-1"


def task(phase: MigrationPhase, kind: MigrationKind = MigrationKind.GRACEFUL, *, mid: str = MID) -> MigrationTask:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return MigrationTask(
        migration_id=mid,
        partition=0,
        migration_kind=kind,
        from_node=OLD,
        to_node=NEW,
        from_epoch=EPOCH,
        to_epoch=EPOCH + 1,
        phase=phase,
        started_at=at,
        updated_at=at,
        timeout_s=60,
    )


def old_step(t: MigrationTask | None, reported: MigrationPhase | None = None, *, epoch: int = EPOCH) -> OldOwnerStep:
    return old_owner_step(t, node=OLD, epoch=epoch, reported=reported, reported_for=MID)


def new_step(
    t: MigrationTask | None,
    reported: MigrationPhase | None = None,
    *,
    restored: bool = False,
    took_over: bool = False,
) -> NewOwnerStep:
    return new_owner_step(t, migration_id=MID, reported=reported, restored=restored, took_over=took_over)


# --- the old owner -------------------------------------------------------------------------------


def test_the_old_owner_reports_drain_checkpoint_and_upload_once_and_releases_only_at_released() -> None:
    """Walking a graceful move: one report (Uploading: the drain ends the batch loop, and every
    commit already holds its delta) covers Draining, Checkpointing and Uploading; the owner then
    waits through them; it releases only once Released is recorded, and then never again."""
    reported: MigrationPhase | None = None
    actions = []
    for phase in (MigrationPhase.DRAINING, MigrationPhase.CHECKPOINTING, MigrationPhase.UPLOADING):
        step = old_step(task(phase), reported)
        if step.action == OldOwnerAction.REPORT:
            assert step.phase == MigrationPhase.UPLOADING
            reported = step.phase
        actions.append(step.action)
        assert old_step(task(phase), reported).action == OldOwnerAction.WAIT
    assert actions == [OldOwnerAction.REPORT, OldOwnerAction.WAIT, OldOwnerAction.WAIT]
    assert old_step(task(MigrationPhase.RELEASED), reported).action == OldOwnerAction.RELEASE
    assert old_step(task(MigrationPhase.RELEASED), MigrationPhase.RELEASED).action == OldOwnerAction.WAIT


@pytest.mark.parametrize(
    "phase",
    [MigrationPhase.PLANNED, MigrationPhase.DOWNLOADING, MigrationPhase.ACTIVE, MigrationPhase.FAILED],
)
def test_the_owner_runs_at_every_phase_that_asks_nothing_of_it(phase: MigrationPhase) -> None:
    """Planned (the target warms up), the new owner's phases and an ended move leave the owner
    processing: a drain aborted after it began resumes the batches."""
    assert old_step(task(phase)).action == OldOwnerAction.RUN
    assert old_step(None).action == OldOwnerAction.RUN


@pytest.mark.parametrize("phase", FORCED_PHASES)
def test_a_forced_move_never_asks_the_old_owner_anything(phase: MigrationPhase) -> None:
    """A forced move fences the old owner instead: it is never asked to drain or to release."""
    t = task(phase, MigrationKind.FORCED)
    assert not asks_old_owner(t, node=OLD, epoch=EPOCH)
    assert old_step(t).action == OldOwnerAction.RUN


def test_only_the_owner_at_the_moves_epoch_is_asked() -> None:
    """A move planned from epoch 4 asks nothing of the same node at another epoch, nor of another node."""
    t = task(MigrationPhase.RELEASED)
    assert old_step(t, epoch=EPOCH + 1).action == OldOwnerAction.RUN
    assert old_owner_step(t, node=NEW, epoch=EPOCH, reported=None, reported_for=None).action == OldOwnerAction.RUN


def test_a_report_for_an_earlier_move_counts_for_nothing_in_this_one() -> None:
    """An owner that reported Uploading for an aborted move reports it again for the next one;
    without that, the coordinator would wait on a report that never comes."""
    t = task(MigrationPhase.CHECKPOINTING, mid="p0-e4-2")
    step = old_owner_step(t, node=OLD, epoch=EPOCH, reported=MigrationPhase.UPLOADING, reported_for=MID)
    assert step == OldOwnerStep(OldOwnerAction.REPORT, MigrationPhase.UPLOADING)


# --- the new owner -------------------------------------------------------------------------------


def test_the_new_owner_walks_every_phase_in_order_and_runs_only_once_active_is_recorded() -> None:
    """Driving the target of a graceful move along the recorded phases: it warms up until
    Downloading, restores, reports each of its phases once, takes over only at Seeking and runs
    only at Active."""
    kind = MigrationKind.GRACEFUL
    phases = GRACEFUL_PHASES
    reported: MigrationPhase | None = None
    restored = took_over = False
    done: list[tuple[MigrationPhase, NewOwnerAction]] = []
    for phase in phases:
        t = task(phase, kind)
        while True:
            step = new_step(t, reported, restored=restored, took_over=took_over)
            if step.action in (NewOwnerAction.WAIT, NewOwnerAction.WARM, NewOwnerAction.RUN):
                done.append((phase, step.action))
                break
            done.append((phase, step.action))
            if step.action == NewOwnerAction.RESTORE:
                assert step.phase == MigrationPhase.RESTORING
                restored, reported = True, step.phase
            elif step.action == NewOwnerAction.TAKE_OVER:
                assert step.phase == MigrationPhase.SEEKING
                took_over, reported = True, step.phase
            elif step.action == NewOwnerAction.REPORT:
                assert step.phase == phase, f"reported {step.phase} while {phase} is recorded"
                reported = step.phase
            else:
                pytest.fail(f"unexpected {step} at {phase}")
    acting = [(p, a) for p, a in done if a not in (NewOwnerAction.WAIT, NewOwnerAction.WARM)]
    # The restore is done with the download: one report covers Downloading and Restoring.
    assert acting == [
        (MigrationPhase.DOWNLOADING, NewOwnerAction.RESTORE),
        (MigrationPhase.SEEKING, NewOwnerAction.TAKE_OVER),
        (MigrationPhase.ACTIVE, NewOwnerAction.REPORT),
        (MigrationPhase.ACTIVE, NewOwnerAction.RUN),
    ]
    before_download = [a for p, a in done if not p.reached(MigrationPhase.DOWNLOADING)]
    assert set(before_download) == {NewOwnerAction.WARM}
    assert kind == MigrationKind.GRACEFUL


@pytest.mark.parametrize("recorded", [p for p in FORCED_PHASES if p.reached(MigrationPhase.DOWNLOADING)])
def test_a_forced_moves_target_restores_takes_the_epoch_reports_active_once_and_runs(
    recorded: MigrationPhase,
) -> None:
    """The fence granted the epoch before Downloading was recorded: from Downloading on, whatever
    later phase is recorded, the target restores (no report of its own), takes the epoch and
    reports Active with it, then runs - it waits for no record in between. Before Downloading it
    only warms up."""
    for phase in FORCED_PHASES:
        if not phase.reached(MigrationPhase.DOWNLOADING):
            assert new_step(task(phase, MigrationKind.FORCED)).action == NewOwnerAction.WARM
    t = task(recorded, MigrationKind.FORCED)
    reported: MigrationPhase | None = None
    restored = took_over = False
    steps: list[NewOwnerStep] = []
    while not steps or steps[-1].action != NewOwnerAction.RUN:
        assert len(steps) < 5, steps
        step = new_step(t, reported, restored=restored, took_over=took_over)
        steps.append(step)
        if step.action == NewOwnerAction.RESTORE:
            restored = True
        elif step.action == NewOwnerAction.TAKE_OVER:
            took_over, reported = True, step.phase
    assert steps == [
        NewOwnerStep(NewOwnerAction.RESTORE),
        NewOwnerStep(NewOwnerAction.TAKE_OVER, MigrationPhase.ACTIVE),
        NewOwnerStep(NewOwnerAction.RUN),
    ]
    # A report lost with a restart is made again before running.
    assert new_step(t, None, restored=True, took_over=True) == NewOwnerStep(
        NewOwnerAction.REPORT, MigrationPhase.ACTIVE
    )


@pytest.mark.parametrize("phase", GRACEFUL_PHASES)
def test_the_new_owner_never_takes_over_or_runs_before_seeking_is_recorded(phase: MigrationPhase) -> None:
    """Whatever it already did, the target takes the epoch only once Seeking (where the control
    plane grants it) is recorded, and processes only once Active is."""
    for restored in (False, True):
        for took_over in (False, True):
            for reported in (None, *GRACEFUL_PHASES):
                action = new_step(task(phase), reported, restored=restored, took_over=took_over).action
                if action == NewOwnerAction.TAKE_OVER:
                    assert phase.reached(MigrationPhase.SEEKING)
                if action == NewOwnerAction.RUN:
                    assert phase == MigrationPhase.ACTIVE and took_over


@pytest.mark.parametrize("phase", [MigrationPhase.FAILED, MigrationPhase.CANCELLED])
def test_an_aborted_move_or_another_move_drops_the_targets_copy(phase: MigrationPhase) -> None:
    """The target of a move that ended without it, or was replaced by another, drops what it restored."""
    assert new_step(task(phase), restored=True).action == NewOwnerAction.DROP
    assert new_step(task(MigrationPhase.SEEKING, mid="p0-e4-9"), restored=True).action == NewOwnerAction.DROP
    assert new_step(None, restored=True).action == NewOwnerAction.DROP


def test_a_target_that_finds_its_move_past_downloading_restores_first() -> None:
    """A target restarted mid-move (nothing restored) restores before anything else, at any later phase."""
    for phase in (MigrationPhase.RESTORING, MigrationPhase.SEEKING, MigrationPhase.ACTIVE):
        assert new_step(task(phase)).action == NewOwnerAction.RESTORE


# --- what a node starts for a partition it runs nothing for ------------------------------------


def desired(owner: NodeId, migration: MigrationTask | None = None) -> DesiredState:
    return DesiredState(partition=0, owner=owner, migration=migration, updated_at=datetime(2026, 1, 1, tzinfo=UTC))


def owned(owner: NodeId, status: PartitionStatus = PartitionStatus.ACTIVE) -> Ownership:
    return Ownership(partition=PartitionId(0), epoch=EPOCH, owner=owner, status=status)


def duty(state: DesiredState, node: NodeId, own: Ownership | None, *, finished: str | None = None) -> PartitionDuty:
    return partition_duty(state, node=node, finished_migration=finished, ownership=lambda: own)


def test_the_target_of_a_move_in_flight_rises_unless_it_already_gave_that_move_up() -> None:
    moving = desired(OLD, task(MigrationPhase.DRAINING))
    assert duty(moving, NEW, owned(OLD)) == PartitionDuty.RISE
    assert duty(moving, NEW, owned(OLD), finished=MID) == PartitionDuty.NONE
    assert duty(moving, NEW, owned(OLD), finished="an-earlier-move") == PartitionDuty.RISE
    # The old owner, the desired owner while the move runs, starts nothing: the move decides.
    assert duty(moving, OLD, owned(OLD)) == PartitionDuty.NONE


def test_a_node_recovers_only_its_own_grant_of_a_partition_desired_on_it() -> None:
    mine = desired(OLD)
    assert duty(mine, OLD, owned(OLD)) == PartitionDuty.RECOVER
    # A finished move leaves its record: it is no move in flight.
    assert duty(desired(OLD, task(MigrationPhase.ACTIVE)), OLD, owned(OLD)) == PartitionDuty.RECOVER
    # Released, unassigned or granted elsewhere: the node never grants itself anything.
    assert duty(mine, OLD, owned(OLD, PartitionStatus.RELEASED)) == PartitionDuty.NONE
    assert duty(mine, OLD, owned(UNASSIGNED, PartitionStatus.UNASSIGNED)) == PartitionDuty.NONE
    assert duty(mine, OLD, owned(NEW)) == PartitionDuty.NONE
    assert duty(mine, OLD, None) == PartitionDuty.NONE
    # Its own grant of a partition desired elsewhere (stranded) is the control plane's to move.
    assert duty(desired(NEW), OLD, owned(OLD)) == PartitionDuty.NONE


def test_the_ledger_is_read_only_when_the_desired_state_leaves_the_question_open() -> None:
    reads: list[int] = []

    def ownership() -> Ownership | None:
        reads.append(1)
        return owned(OLD)

    for state in (desired(NEW), desired(OLD, task(MigrationPhase.DRAINING))):
        partition_duty(state, node=OLD, finished_migration=None, ownership=ownership)
    assert reads == []
    assert partition_duty(desired(OLD), node=OLD, finished_migration=None, ownership=ownership) == PartitionDuty.RECOVER
    assert reads == [1]


# --- taking over: the seal at the new owner's epoch ------------------------------------------------


def _publisher(store: ObjectStore) -> ManifestPublisher:
    return ManifestPublisher(OutputCommitter(store), store)


def _old_owner_with_a_commit(store: ObjectStore) -> tuple[Ledger, ManifestPublisher]:
    """Partition 0 held by node 1 at epoch 1, which committed offset 10."""
    ledger = Ledger(store)
    ledger.init_cluster(1)
    token = ledger.acquire(PartitionId(0), OLD, expected_epoch=0)
    publisher = _publisher(store)
    publisher.publish(token, ManifestUpdate(source_offset=10))
    return ledger, publisher


def test_a_takeover_keeps_what_was_restored_when_the_seal_sits_right_on_it(store: ObjectStore) -> None:
    ledger, publisher = _old_owner_with_a_commit(store)
    restored = publisher.current(PartitionId(0))
    ledger.fence(PartitionId(0), NEW, expected_epoch=1, reason="failover")
    token = ledger.adopt(PartitionId(0), NEW)

    result = take_over(publisher, token, generation=0, restored=restored)

    assert not result.restore_again
    assert result.sealed.manifest.is_seal and result.sealed.manifest.fencing_token == 2
    assert restored is not None and result.sealed.manifest.parent_hash == restored.raw_hash


def test_a_takeover_restores_again_when_the_old_owner_committed_after_the_read(store: ObjectStore) -> None:
    ledger, publisher = _old_owner_with_a_commit(store)
    restored = publisher.current(PartitionId(0))
    # The old owner's last commit lands after the new owner's read and before the grant's seal.
    old = ledger.adopt(PartitionId(0), OLD)
    publisher.publish(old, ManifestUpdate(source_offset=20))
    ledger.fence(PartitionId(0), NEW, expected_epoch=1, reason="failover")
    token = ledger.adopt(PartitionId(0), NEW)

    result = take_over(publisher, token, generation=0, restored=restored)

    assert result.restore_again
    assert result.sealed.manifest.source_offset == 20 and result.sealed.manifest.fencing_token == 2


def test_a_graceful_takeover_refuses_a_chain_that_does_not_continue_from_the_released_commit(
    store: ObjectStore,
) -> None:
    ledger, publisher = _old_owner_with_a_commit(store)
    released = publisher.current(PartitionId(0))
    assert released is not None
    ledger.fence(PartitionId(0), NEW, expected_epoch=1, reason="handoff")
    token = ledger.adopt(PartitionId(0), NEW)

    ok = take_over(publisher, token, generation=0, restored=released, released=released.manifest.commit_ulid)
    assert not ok.restore_again
    with pytest.raises(HandoffMismatch) as err:
        take_over(publisher, token, generation=0, restored=released, released="01SOMEOTHERCOMMIT")
    assert err.value.found_commit == released.manifest.commit_ulid


def test_a_graceful_takeover_follows_the_chain_past_an_entry_planted_between_release_and_seal(
    store: ObjectStore,
) -> None:
    """Another node's keys create an entry at the next sequence number after the old owner released:
    the grant's seal passes over it, and the handoff check must find the released commit by the
    seal's parent hash, not at the sequence number below the seal."""
    ledger, publisher = _old_owner_with_a_commit(store)
    released = publisher.current(PartitionId(0))
    assert released is not None
    planted = released.manifest.model_copy(
        update={"seq": released.manifest.seq + 1, "parent_hash": released.raw_hash, "source_offset": 999}
    )
    planted = sign_record(planted, SigningKey.generate(0, 1, int(NEW)))  # not the grant's key
    store.put_if_absent(manifest_history_key(0, planted.seq), planted.model_dump_json().encode())
    ledger.fence(PartitionId(0), NEW, expected_epoch=1, reason="handoff")
    token = ledger.adopt(PartitionId(0), NEW)

    result = take_over(publisher, token, generation=0, restored=released, released=released.manifest.commit_ulid)

    assert result.sealed.manifest.seq == planted.seq + 1 and result.sealed.manifest.parent_hash == released.raw_hash
    assert not result.restore_again and result.sealed.manifest.source_offset == 10


def test_a_new_owner_superseded_before_its_takeover_gets_a_stale_fencing_token(store: ObjectStore) -> None:
    ledger, publisher = _old_owner_with_a_commit(store)
    ledger.fence(PartitionId(0), NEW, expected_epoch=1, reason="failover")
    superseded = ledger.adopt(PartitionId(0), NEW)
    ledger.fence(PartitionId(0), OLD, expected_epoch=2, reason="failover again")

    with pytest.raises(StaleFencingToken) as err:
        take_over(publisher, superseded, generation=0, restored=None)
    assert (err.value.expected_epoch, err.value.actual_epoch) == (2, 3)


def test_a_restarted_process_seals_its_own_grant_again_and_its_earlier_incarnation_publishes_nothing(
    store: ObjectStore,
) -> None:
    ledger, publisher = _old_owner_with_a_commit(store)
    token = ledger.adopt(PartitionId(0), OLD)
    earlier = publisher.current(PartitionId(0))

    again = seal_at(publisher, token, generation=2)

    assert earlier is not None and again.raw_hash != earlier.raw_hash
    assert again.manifest.is_seal and again.manifest.generation == 2
    assert seal_at(publisher, token, generation=2).raw == again.raw  # idempotent
    with pytest.raises(StaleGeneration):
        publisher.publish(token, ManifestUpdate(source_offset=30, generation=0))
    publisher.publish(token, ManifestUpdate(source_offset=30, generation=2))


def _earlier_incarnation_commits_past_the_reseal(store: ObjectStore) -> tuple[ManifestPublisher, ManifestVersion]:
    """Node 1 (generation 1) commits; a restarted node 1 (generation 2) seals its grant again; the
    earlier process, skipping its own generation check, signs a commit with the epoch's key (both
    processes hold it), creates the next entry and moves the pointer to it. Returns the
    restarted process's publisher and its seal."""
    ledger = Ledger(store)
    ledger.init_cluster(1)
    ledger.members.register_node(OLD)
    token = ledger.acquire(PartitionId(0), OLD, expected_epoch=0)
    zombie = _publisher(store)
    zombie.publish(token, ManifestUpdate(source_offset=10, generation=1))
    ledger.members.register_node(OLD)  # the restart: generation 2
    restarted = _publisher(store)
    reseal = seal_at(restarted, ledger.adopt(PartitionId(0), OLD), generation=2)

    void = PartitionManifest(
        partition=0,
        seq=reseal.manifest.seq + 1,
        fencing_token=token.epoch,
        node=OLD,
        generation=1,
        commit_ulid=next_ulid(reseal.manifest.commit_ulid),
        parent_hash=reseal.raw_hash,
        cluster_epoch=0,
        source_offset=50,
        outputs=[],
        events_applied=40,
        note="the earlier incarnation's commit",
        committed_at=datetime.now(UTC),
    )
    raw = sign_record(void, zombie.signing_keys.get(OLD, 0, token.epoch)).model_dump_json().encode()
    chain = zombie._writable_chain(0)
    chain.create(void.seq, raw)
    pointer = chain.pointer()
    assert pointer is not None
    chain.move_pointer(raw, pointer.etag)
    return restarted, reseal


def test_an_earlier_incarnations_entry_is_void_through_the_pointer_as_in_the_audit(store: ObjectStore) -> None:
    _, reseal = _earlier_incarnation_commits_past_the_reseal(store)

    fresh = ManifestReader(store)  # starts from the pointer: no trusted entry yet
    current = fresh.current(PartitionId(0))
    assert current is not None and current.raw == reseal.raw
    assert list(ManifestReader(store).history(PartitionId(0)))[-1].raw == reseal.raw  # the audit agrees


def test_the_restarted_owner_commits_past_its_earlier_incarnations_void_entry(store: ObjectStore) -> None:
    restarted, reseal = _earlier_incarnation_commits_past_the_reseal(store)
    token = Ledger(store).adopt(PartitionId(0), OLD)

    committed = restarted.publish(token, ManifestUpdate(source_offset=20, generation=2))

    assert committed.manifest.parent_hash == reseal.raw_hash and committed.manifest.source_offset == 20
    # Restarted once more (generation 3): its seal carries the genuine chain, not the void entry.
    Ledger(store).members.register_node(OLD)
    again = seal_at(_publisher(store), token, generation=3)
    assert again.manifest.source_offset == 20 and again.manifest.parent_hash == committed.raw_hash


# --- a commit whose response was lost ---------------------------------------------------------------


def test_a_publish_whose_response_was_lost_is_found_on_the_chain_only_if_it_landed(store: ObjectStore) -> None:
    ledger, _ = _old_owner_with_a_commit(store)
    token = ledger.adopt(PartitionId(0), OLD)
    faulty = FaultInjectingStore(store)
    publisher = _publisher(faulty)

    landed_update = ManifestUpdate(source_offset=20)
    faulty.lose_response_next(op="put_if_absent")
    with pytest.raises(StoreError):
        publisher.publish(token, landed_update)
    landed = publisher.landed(token, landed_update)
    assert landed is not None and landed.manifest.source_offset == 20

    lost_update = ManifestUpdate(source_offset=30)
    faulty.fail_next(op="put_if_absent")
    with pytest.raises(StoreError):
        publisher.publish(token, lost_update)
    assert publisher.landed(token, lost_update) is None
