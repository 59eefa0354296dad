"""The deterministic simulation: its store keeps the real backends' promises, runs replay exactly,
a budget of fresh seeds finds no violation, and reverting a fix makes it find the bug the fix closed.

The budget run's seeds change every run (derived from the time, printed);
``LAMINAR_SIM_SEED=<base>`` replays a run. A failure prints the seed, the
violated invariant and the end of the trace; ``python -m laminar_dev.sim
simulate --seed <seed> --trace`` replays it step by step.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

import tests.store.test_base as conformance
from laminar_dev.sim import Knobs, SimConfig, actors, run_scenario
from laminar_dev.sim.invariants import (
    AssignmentWentBack,
    ExactlyOnceViolated,
    FencedEpochAccepted,
    GarbageNotSwept,
    HandoffRefused,
    InvariantViolation,
    ManifestArtifactDeleted,
    MigrationWedged,
    PartitionNotLive,
    StateMismatch,
    UndecodableKeyAppended,
    VoidEntryAdopted,
)
from laminar_dev.sim.soak import search, soak
from laminar_dev.sim.store import MemoryObjectStore
from laminar_dev.sim.world import ScenarioResult
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.failover import stranded
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ops import sweep as antientropy
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.tasks import MigrationPhase
from laminar_orchestration.store import ObjectStore
from tests.seeds import fresh_base_seed

REPO = Path(__file__).resolve().parents[2]
#: Wall-clock budget of the fresh-seed run (the machine is shared: it counts scenarios, not speed).
BUDGET_S = float(os.environ.get("LAMINAR_SIM_BUDGET_S", "20"))
#: Seeds a bug search tries before giving up (each scenario takes well under 0.1 s of CPU).
SEARCH_LIMIT = 800


def _failure_text(result: ScenarioResult) -> str:
    v = result.violation
    assert v is not None
    tail = "\n".join(result.trace[-40:])
    return (
        f"seed {result.seed}: {v.invariant} violated: {type(v).__name__} {v.fields()}\n{tail}\n"
        f"replay: python -m laminar_dev.sim simulate --seed {result.seed} --trace"
    )


# -- the simulated store is an ObjectStore like the others ------------------------------------

_STORE_TESTS = sorted(
    (name, fn)
    for name, fn in vars(conformance).items()
    if name.startswith("test_") and callable(fn) and list(inspect.signature(fn).parameters) == ["store"]
)


@pytest.mark.parametrize(("name", "promise"), _STORE_TESTS, ids=[n for n, _ in _STORE_TESTS])
def test_the_memory_store_passes_the_store_conformance_suite(name: str, promise: Callable[[ObjectStore], None]) -> None:
    promise(MemoryObjectStore())


def test_the_conformance_suite_is_actually_run_on_the_memory_store() -> None:
    names = {name for name, _ in _STORE_TESTS}
    assert {"test_put_if_absent_creates_once", "test_put_if_match_rejects_stale_etag", "test_delete_if_match"} <= names
    assert len(names) >= 15


# -- determinism ----------------------------------------------------------------------------


def test_a_seed_replays_its_trace_exactly() -> None:
    config = SimConfig(seed=20261123, full_trace=True)
    first, second = run_scenario(config), run_scenario(config)

    assert first.trace == second.trace and first.trace_hash == second.trace_hash
    assert first.counts.fault_steps >= 200 and first.counts.faults > 0 and first.counts.manifests > 0
    assert run_scenario(replace(config, seed=20261124)).trace_hash != first.trace_hash


def test_the_trace_hash_is_the_hash_of_every_line_of_the_trace() -> None:
    result = run_scenario(SimConfig(seed=20261125, full_trace=True))

    assert len(result.trace) > 1500  # lines are hashed in batches: several batches, a partial one last
    every_line = "".join(f"{line}\n" for line in result.trace).encode()
    assert result.trace_hash == hashlib.blake2b(every_line, digest_size=16).hexdigest()


@pytest.mark.processes
def test_a_seed_replays_in_another_process_with_another_hash_seed() -> None:
    # Dict and set order of strings change with PYTHONHASHSEED; the trace must not.
    here = run_scenario(SimConfig(seed=7, steps=250))
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "laminar_dev.sim", "simulate", "--seed", "7", "--steps", "250"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"trace {here.trace_hash}: ok" in out.stdout


# -- the budget run: fresh seeds every time ---------------------------------------------------


@pytest.mark.slow
def test_a_budget_of_fresh_seeds_violates_no_invariant() -> None:
    base = fresh_base_seed("LAMINAR_SIM_SEED", "simulation")
    report = soak(SimConfig(seed=base), base_seed=base, budget_s=BUDGET_S, workers=2)
    print(report.summary())

    assert not report.failures, _failure_text(report.failures[0])
    # Not vacuous: at the suite's load (a load average of 12 on 2 cores) the budget finishes about 15.
    assert report.scenarios >= 10, report.summary()
    assert report.totals.fault_steps >= 200 * report.scenarios and report.totals.faults > 0


# -- reverted fixes are found -------------------------------------------------------------------


def _search(
    knobs: Knobs, wanted: Callable[[InvariantViolation], bool], *, steps: int = 300, first: int = 0
) -> ScenarioResult:
    """The first seed from `first` on whose violation `wanted` accepts (bounded)."""
    found = search(
        SimConfig(seed=0, steps=steps, knobs=knobs),
        range(first, first + SEARCH_LIMIT),
        lambda r: r.violation is not None and wanted(r.violation),
        workers=1,  # in the test's process: a pool's start-up costs more than these searches
    )
    if found is None:
        pytest.fail(f"no seed below {SEARCH_LIMIT} found the bug with {knobs}")
    print(f"\nfound: {_failure_text(found).splitlines()[0]}")
    return found


def test_without_the_seal_or_the_probe_an_old_owners_late_commit_is_duplicated() -> None:
    # A fenced old owner that commits after its successor restored (the fence-to-takeover
    # window): both commits' outputs cover the same events. Closed first by the owner's probe
    # for a successor's grant right before publishing, then by the seal a grant puts on the
    # chain (the fence point); both are reverted here.
    # Rare since an owner publishes from its own last entry without reading the chain (fewer store
    # operations per commit, a narrower window): the search starts near the first seed that finds it.
    found = _search(
        Knobs(revert_grant_seal=True, skip_successor_probe=True),
        lambda v: isinstance(v, ExactlyOnceViolated) and v.kind == "duplicate",
        first=250,
    )
    assert found.counts.fault_steps >= 200


def test_without_the_wedge_fixes_a_migration_outlives_its_deadline() -> None:
    # A lost fence left its record unfinished and nothing enforced the record's deadline: with
    # both reverted, some record is still unfinished well after its deadline once faults stopped.
    # A driver that died and was not retried leaves its record the same way.
    found = _search(Knobs(revert_lost_fence_fix=True), lambda v: isinstance(v, MigrationWedged))
    assert found.counts.fault_steps >= 200


def test_without_the_aborted_owner_fix_a_partition_is_never_run_again() -> None:
    found = _search(Knobs(revert_aborted_owner_fix=True), lambda v: isinstance(v, PartitionNotLive))
    assert found.counts.fault_steps >= 200


def test_a_sweep_that_deletes_by_age_alone_deletes_what_a_manifest_names() -> None:
    # The sweep before it waited for sealed epochs: an unreferenced object went once older than
    # the grace period, whatever its epoch. An owner stalled between uploading a batch's objects
    # and publishing the manifest that names them (or a sweep that read the chain before that
    # publish and listed after it) loses them; a manifest then names a deleted object. A snapshot
    # waits longest for its manifest (the next commit names it), so it is lost the same way. Batches
    # commit under faults only after the start-up's placements: a longer fault phase.
    found = _search(
        Knobs(revert_sweep_sealed_only=True),
        lambda v: isinstance(v, ManifestArtifactDeleted),
        steps=SWEEP_FAULT_STEPS,
    )
    # Only a sweep deletes (the count of a sweep the violation stopped midway may still be 0).
    assert isinstance(found.violation, ManifestArtifactDeleted) and "was deleted" in str(found.violation)


@pytest.mark.slow(seconds=30)
def test_without_the_stalled_move_read_a_lost_assignment_write_strands_a_partition() -> None:
    # A driver died between recording a move Active and the new owner's assignment write: the new
    # owner, holding the epoch at Seeking, learns of Active only through its assignment, so nothing
    # runs the partition (the runtime's next full pass is 15 minutes away).
    found = _search(Knobs(revert_stalled_move_read=True), lambda v: isinstance(v, PartitionNotLive))
    assert found.counts.fault_steps >= 200


@pytest.mark.slow(seconds=30)
def test_without_the_revision_check_an_assignment_goes_back() -> None:
    # A driver preempted between a desired state's write and its assignment write, while another
    # coordinator wrote a later state of the partition (a cancel, a deadline's failure): the late
    # write listed the older revision, and the node would act on a state a later write replaced.
    found = _search(Knobs(revert_assignment_revision_check=True), lambda v: isinstance(v, AssignmentWentBack))
    assert isinstance(found.violation, AssignmentWentBack) and found.violation.written < found.violation.listed


#: Protocol steps with faults of the sweep's scenarios (the default phase ends before batches commit).
SWEEP_FAULT_STEPS = 1000

#: Seeds that found a bug with its fix reverted (the knobs that revert it, the fault phase's steps);
#: each passes on the code as it is.
REGRESSION_SEEDS: list[tuple[tuple[str, ...], int, int, type[InvariantViolation]]] = [
    (("revert_grant_seal", "skip_successor_probe"), 291, 300, ExactlyOnceViolated),
    (("revert_grant_seal", "skip_successor_probe"), 470, 300, ExactlyOnceViolated),
    (("revert_lost_fence_fix",), 0, 300, MigrationWedged),
    (("revert_lost_fence_fix",), 5, 300, MigrationWedged),
    (("revert_aborted_owner_fix",), 16, 300, PartitionNotLive),
    (("revert_aborted_owner_fix",), 296, 300, PartitionNotLive),
    (("revert_sweep_sealed_only",), 2, SWEEP_FAULT_STEPS, ManifestArtifactDeleted),
    (("revert_sweep_sealed_only",), 3, SWEEP_FAULT_STEPS, ManifestArtifactDeleted),
    # A node restarted while its earlier process ran on (a zombie that skips its client-side
    # generation check): the zombie's entry after the restarted process's seal, reached through the
    # pointer, was taken for the chain's newest by a reader (a restarted owner publishing from its own
    # last entry no longer reads the pointer first).
    (("revert_generation_pointer_fix",), 176, 300, VoidEntryAdopted),
    (("revert_generation_pointer_fix",), 322, 300, VoidEntryAdopted),
    # An intruder's entry between the old owner's release and the grant's seal: the takeover looked
    # for the released commit at the sequence number below the seal.
    (("revert_handoff_parent_fix",), 24, 300, HandoffRefused),
    (("revert_handoff_parent_fix",), 35, 300, HandoffRefused),
    # A granter died between a fence's grant and its seal; the control plane looked at the partition
    # afterwards, and the old owner's zombie (skipping the successor probe) still committed under the
    # fenced epoch, accepted.
    (("revert_unassigned_seal_fix",), 170, 300, FencedEpochAccepted),
    (("revert_unassigned_seal_fix",), 418, 300, FencedEpochAccepted),
    # A producer's key column of Arrow strings that are not UTF-8 entered the log.
    (("revert_utf8_append_check",), 10, 300, UndecodableKeyAppended),
    (("revert_utf8_append_check",), 12, 300, UndecodableKeyAppended),
    # A driver died between a move's Active and the new owner's assignment write, which waited at Seeking.
    (("revert_stalled_move_read",), 8, 300, PartitionNotLive),
    (("revert_stalled_move_read",), 19, 300, PartitionNotLive),
    # A driver's late assignment write of an older state over a later one (a cancel, a deadline's failure).
    (("revert_assignment_revision_check",), 47, 300, AssignmentWentBack),
    (("revert_assignment_revision_check",), 64, 300, AssignmentWentBack),
    # Found by a soak: a control-plane actor read the chain on a stale word of the newest grant (its
    # grant then failed), kept the zombie's entry behind the pointer as checked, and sealed on it later.
    (("revert_stale_word_trust",), 791100925, 300, VoidEntryAdopted),
    # Found by a soak: the control plane died between a partition's desired state and its new owner's
    # assignment; the partition, released, was granted back to that owner, which never took it up.
    (("revert_reinstate_lists_owner",), 920013, 300, PartitionNotLive),
]


@pytest.mark.parametrize(
    ("knobs", "seed", "steps", "violation"),
    REGRESSION_SEEDS,
    ids=[f"{'+'.join(k)}-{s}" for k, s, _, _ in REGRESSION_SEEDS],
)
def test_regression_seeds_fail_with_the_fix_reverted_and_pass_with_it(
    knobs: tuple[str, ...], seed: int, steps: int, violation: type[InvariantViolation]
) -> None:
    reverted = run_scenario(SimConfig(seed=seed, steps=steps, knobs=Knobs(**dict.fromkeys(knobs, True))))
    assert isinstance(reverted.violation, violation), f"seed {seed} no longer finds the bug {knobs} revert"

    fixed = run_scenario(SimConfig(seed=seed, steps=steps))
    assert fixed.ok, _failure_text(fixed)


#: A scenario whose zombies leave unreachable objects of sealed epochs, which the sweeps delete.
GARBAGE_SEED = 5


def test_garbage_of_sealed_epochs_is_swept_and_left_garbage_is_a_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SimConfig(seed=GARBAGE_SEED, steps=SWEEP_FAULT_STEPS)
    swept = run_scenario(config)
    assert swept.ok, _failure_text(swept)
    assert swept.counts.swept > 0, "the scenario no longer leaves garbage: pick another seed"

    # Sweeps that only report: the first object they would delete stays, sealed and unnamed.
    monkeypatch.setattr(antientropy, "sweep", functools.partial(antientropy.sweep, dry_run=True))
    kept = run_scenario(config)
    assert isinstance(kept.violation, GarbageNotSwept), kept.violation


def test_skipping_the_successor_probe_alone_breaks_nothing() -> None:
    # The probe is an early exit, not the fence: with the seal in place no seed finds a violation.
    found = search(SimConfig(seed=0, knobs=Knobs(skip_successor_probe=True)), range(60), lambda r: not r.ok, workers=1)
    assert found is None, _failure_text(found)


def test_a_move_that_ends_after_its_target_took_the_epoch_leaves_the_target_the_desired_owner() -> None:
    # Found by the simulation: a forced move was cancelled (or expired) after its fence landed, so
    # the ledger named a live node that never started. Only the partition's last record told
    # (`stranded`): once another move was planned and aborted, nothing ran the partition again.
    store = MemoryObjectStore()
    ledger = Ledger(store, read_parallelism=1)
    ledger.init_cluster(1)
    for node in (1, 2):
        ledger.members.register_node(NodeId(node), heartbeat_timeout_s=3600)
    coordinator = MigrationCoordinator(ledger)
    p = PartitionId(0)
    placement = coordinator.plan(p, NodeId(1), forced=True)
    for phase in (MigrationPhase.PLANNED, MigrationPhase.RELEASED):
        coordinator.begin_phase(p, placement.migration_id, phase)
    coordinator.cancel(p, placement.migration_id)
    own = ledger.ownership(p)
    assert own is not None and (own.epoch, own.owner) == (1, 1)
    assert coordinator.desired.read(p)[0].owner == 1  # node 1's reconcile takes it up

    # A move cancelled before its fence changes nothing.
    move = coordinator.plan(p, NodeId(2), forced=True)
    coordinator.cancel(p, move.migration_id)
    assert coordinator.desired.read(p)[0].owner == 1


def test_owners_snapshot_their_state_and_later_commits_name_it() -> None:
    # Snapshots are uploaded off the batch's path and named by the next commit (with the deltas
    # after it) or by a manifest of their own; restores start from them.
    found = search(SimConfig(seed=0), range(60), lambda r: r.counts.snapshots >= 2, workers=2)
    assert found is not None, "no scenario named two snapshots"
    assert found.ok, _failure_text(found)


def test_a_snapshot_that_lost_its_rows_is_a_state_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    # The checker folds snapshot + deltas against the source: a snapshot that lost rows is caught
    # when a manifest names it, unless later deltas rewrote every key. Only the upload loses them;
    # the owner's own state stays whole.
    take = actors.NodeActor._take_snapshot

    def lossy(self: actors.NodeActor, w: actors.Worker) -> str:
        kept = dict(w.values)
        w.values.clear()
        try:
            return take(self, w)
        finally:
            w.values.update(kept)

    monkeypatch.setattr(actors.NodeActor, "_take_snapshot", lossy)
    for seed in range(60):
        result = run_scenario(SimConfig(seed=seed))
        if result.violation is not None:
            assert isinstance(result.violation, StateMismatch), _failure_text(result)
            return
    pytest.fail("no scenario caught a snapshot that lost its rows")


#: Found by a CI run's fresh seeds: a placement was cancelled after its fence had landed (the cancel
#: read the ledger before the grant), then later moves of the partition were cancelled and timed out.
#: The grant's holder was live but not the desired owner, so nothing ran or moved the partition.
OUTLIVED_GRANT_SEED = 43262856


def test_a_live_owner_that_is_not_the_desired_owner_is_failed_over_whatever_moves_ended_since() -> None:
    result = run_scenario(SimConfig(seed=OUTLIVED_GRANT_SEED, steps=300))
    assert result.ok, _failure_text(result)


def test_stranded_is_decided_by_the_desired_owner_once_no_move_is_in_flight() -> None:
    store = MemoryObjectStore()
    ledger = Ledger(store, read_parallelism=1)
    ledger.init_cluster(1)
    for node in (1, 2, 3):
        ledger.members.register_node(NodeId(node), heartbeat_timeout_s=3600)
    coordinator = MigrationCoordinator(ledger)
    p = PartitionId(0)
    ledger.fence(p, NodeId(2), expected_epoch=0, reason="a placement whose record was cancelled meanwhile")
    own = ledger.ownership(p)
    assert own is not None and (own.owner, own.epoch) == (2, 1)
    # A later graceful move to node 3 planned from epoch 1, then ended unfinished: its to_epoch (2)
    # was never minted, so only the desired owner (still unassigned) says node 2 will not run it.
    task = coordinator.plan(p, NodeId(3))
    assert task.to_epoch == 2
    coordinator.fail(p, task.migration_id, "timed out at draining")
    state = coordinator.desired.read(p)[0]
    assert state.owner != own.owner
    assert stranded(state, own)
    # While a move is in flight, it decides; with none ever recorded, nothing says where it runs.
    assert not stranded(state.model_copy(update={"migration": task}), own)
    assert not stranded(state.model_copy(update={"migration": None}), own)
    # The desired owner holding its epoch is not stranded.
    assert not stranded(state.model_copy(update={"owner": own.owner}), own)
