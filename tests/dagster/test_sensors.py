"""The Dagster sensors and schedule against a real ledger in a temporary local store.

Nodes here are only ledger records (registered with `Membership.register_node`,
made stale by a tiny heartbeat timeout): the sensors only read them. The
run-failure sensor is fed real failed runs of the migration jobs.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    DagsterInstance,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    MetadataValue,
    RunRequest,
    SensorResult,
    SkipReason,
    build_run_status_sensor_context,
    build_schedule_context,
    build_sensor_context,
)
from dagster._core.definitions.freshness import TimeWindowFreshnessPolicy
from dagster._serdes import serialize_value

from assets import STREAM_FAIL_AFTER, STREAM_FRESHNESS, STREAM_WARN_AFTER, checkpoint_manifests
from jobs import ATTEMPT_TAG, NOT_BEFORE_TAG, RETRY_OF_TAG, failover_partition, migrate_partition
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.ownership import ownership_rows
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.desired_states import DesiredState, DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationPhase
from laminar_orchestration.store import ObjectStore
from laminar_orchestration.store.metering import RequestMeter
from resources import LaminarResource
from sensors import (
    build_node_failure_sensor,
    decide_retry,
    laminar_observation_sensor,
    migration_retry_sensor,
    node_failure_sensor,
    rebalance_schedule,
)
from sensors.node_failure import evaluate
from sensors.observation import OWNERSHIP_EVERY_S, ObservationCursor, observe
from tests.commits import commit_all
from tests.ledgers import make_alive, make_dead, new_ledger

P, N = PartitionId, NodeId


@dataclass
class Tick:
    """One sensor evaluation, normalized: what it requested, its cursor afterwards, why it skipped."""

    requests: list[RunRequest]
    cursor: str | None
    skip: str | None


def tick(sensor: Any, laminar: LaminarResource, cursor: str | None = None) -> Tick:
    """Evaluate `sensor` once as the daemon would, carrying the cursor however the sensor set it."""
    with build_sensor_context(cursor=cursor, resources={"laminar": laminar}) as context:
        result = sensor(context)
        new_cursor = context.cursor
    if isinstance(result, SensorResult):
        skip = result.skip_reason.skip_message if result.skip_reason else None
        return Tick(list(result.run_requests or []), result.cursor or new_cursor, skip)
    if isinstance(result, RunRequest):
        return Tick([result], new_cursor, None)
    assert isinstance(result, SkipReason)
    return Tick([], new_cursor, result.skip_message)


# --- node failure ----------------------------------------------------------------------------


#: The node-failure sensor as the daemon runs it, but with no watch of late nodes and a short drive
#: budget: the nodes here are ledger records only and never report a phase.
quick_failure_sensor = build_node_failure_sensor(name="quick_failure_sensor", watch_s=0, drive_budget_s=0.3)


def test_dead_owner_is_fenced_by_the_sensor_and_recorded_as_one_run_per_partition(
    ledger: Ledger, laminar: LaminarResource
) -> None:
    make_alive(ledger, 2, 3)
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.acquire(P(1), N(1), expected_epoch=0)
    ledger.acquire(P(2), N(2), expected_epoch=0)  # live owner: nothing to do; p3 stays unassigned

    first = tick(quick_failure_sensor, laminar)
    reqs = first.requests
    assert [r.run_key for r in reqs] == ["failover-p0-e1", "failover-p1-e1"]
    assert all(r.job_name == failover_partition.name for r in reqs)
    # Least load first, counting what this tick assigned: node 3 holds nothing, then 2 and 3 tie.
    assert [(r.run_config["partition"], r.run_config["to_node"]) for r in reqs] == [(0, 3), (1, 2)]
    assert reqs[0].tags["laminar/from_node"] == "1" and reqs[0].tags["laminar/from_epoch"] == "1"
    assert "laminar/epoch" not in reqs[0].tags  # the tags a user filters by, each once
    # The sensor fenced both at once: the new owners hold epoch 2 before any run starts...
    assert [(ledger.ownership(P(p)).owner, ledger.ownership(P(p)).epoch) for p in (0, 1)] == [(3, 2), (2, 2)]  # type: ignore[union-attr]
    # ...and each run gets what was done: fenced, then no node reported downloading within the budget.
    recorded = reqs[0].run_config["recorded"]
    assert recorded["migration_id"] == MigrationCoordinator(ledger).current(P(0)).migration_id  # type: ignore[union-attr]
    assert (recorded["from_node"], recorded["to_node"], recorded["from_epoch"], recorded["to_epoch"]) == (1, 3, 1, 2)
    assert [ph["phase"] for ph in recorded["phases"]] == ["planned", "released"]
    assert "epoch 1 fenced" in recorded["phases"][1]["detail"]
    assert first.cursor is not None and json.loads(first.cursor)["handled"] == [[0, 1], [1, 1]]

    second = tick(quick_failure_sensor, laminar, first.cursor)
    assert second.requests == [], "a second tick must not request the same failovers"

    # Node 3 dies too, before p0's failover finished: a new (partition, epoch), so a new run key,
    # and the failover to the dead node is superseded.
    make_dead(ledger, 3)
    third = tick(quick_failure_sensor, laminar, second.cursor)
    assert [(r.run_key, r.run_config["to_node"]) for r in third.requests] == [("failover-p0-e2", 2)]
    assert ledger.ownership(P(0)).owner == 2  # type: ignore[union-attr]


def test_the_sensor_reports_the_dead_owner_then_the_failover(ledger: Ledger, laminar: LaminarResource) -> None:
    make_alive(ledger, 2)
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    with build_sensor_context(resources={"laminar": laminar}) as context:
        result = quick_failure_sensor(context)
    assert isinstance(result, SensorResult)
    before_obs, before_check, after_obs, after_check = result.asset_events
    for event in result.asset_events:
        serialize_value(event)  # what the daemon does with them: only Dagster's own types pass
    assert isinstance(before_obs, AssetObservation) and isinstance(after_obs, AssetObservation)
    assert before_obs.metadata["on_dead_nodes"].value == 1
    rows = {r.data["partition"]: r.data for r in before_obs.metadata["ownership"].value.records}  # type: ignore[union-attr]
    assert rows[0]["health"] == "owner dead: failover pending"
    assert isinstance(before_check, AssetCheckEvaluation) and not before_check.passed
    assert after_obs.metadata["on_dead_nodes"].value == 0
    assert after_obs.metadata["migrations_in_flight"].value == 1
    assert isinstance(after_check, AssetCheckEvaluation) and not after_check.passed  # p1..p3 unassigned


def test_live_owners_need_nothing(ledger: Ledger, laminar: LaminarResource) -> None:
    make_alive(ledger, 1, 2)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.acquire(P(1), N(2), expected_epoch=0)
    result = tick(node_failure_sensor, laminar)
    assert result.requests == []
    assert result.skip == "every partition's owner is alive"


def test_sensor_heartbeat_timeout_overrides_the_nodes_own(ledger: Ledger, laminar: LaminarResource) -> None:
    make_alive(ledger, 1, 2)  # each node says 60 s
    ledger.acquire(P(0), N(1), expected_epoch=0)
    time.sleep(2.1)
    strict = build_node_failure_sensor(
        name="strict_failure_sensor", heartbeat_timeout_s=2.0, watch_s=0, drive_budget_s=0.3
    )
    # Both nodes look dead to the strict sensor, so nobody can take the partition yet...
    result = tick(strict, laminar)
    assert result.requests == [] and result.skip is not None and "no live node" in result.skip
    # ...and it is not marked handled: once node 2 heartbeats, the failover is requested.
    make_alive(ledger, 2)
    assert [r.run_key for r in tick(strict, laminar, result.cursor).requests] == ["failover-p0-e1"]
    assert tick(node_failure_sensor, laminar).requests == []  # node 1 is alive by its own timeout


def test_partition_already_failing_over_is_left_alone(ledger: Ledger, laminar: LaminarResource) -> None:
    make_alive(ledger, 2)
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    MigrationCoordinator(ledger).plan(P(0), N(2), forced=True)  # a failover in flight (phase planned)
    result = tick(quick_failure_sensor, laminar)
    assert result.requests == [] and result.skip is not None and "in flight" in result.skip


def test_a_grant_whose_granter_died_before_sealing_is_completed_within_a_tick(
    ledger: Ledger, laminar: LaminarResource, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_alive(ledger, 1, 2)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    granter = Ledger(ledger.store)

    class GranterDied(BaseException):
        """The granting process dies between its grant and its seal (nothing on the way catches it)."""

    def dies(*_args: Any, **_kwargs: Any) -> Any:
        raise GranterDied

    monkeypatch.setattr(granter.sealer, "seal", dies)
    with pytest.raises(GranterDied):
        granter.fence(P(0), N(2), expected_epoch=1, reason="move to node 2")
    assert ledger.ownership(P(0)).head_lagged  # type: ignore[union-attr]
    result = tick(quick_failure_sensor, laminar)
    assert result.requests == []  # node 2 is alive: no failover, only the grant sealed
    own = ledger.ownership(P(0))
    assert own is not None and (own.owner, own.epoch, own.head_lagged) == (2, 2, False)
    sealed = ManifestReader(ledger.store).current(P(0))
    assert sealed is not None and sealed.manifest.is_seal and sealed.manifest.fencing_token == 2


def test_uninitialized_store_is_a_skip(tmp_path: Path) -> None:
    result = tick(node_failure_sensor, LaminarResource(store_url=(tmp_path / "empty").as_uri()))
    assert result.requests == [] and result.skip is not None and "laminar init" in result.skip


def test_default_statuses() -> None:
    assert rebalance_schedule.default_status == DefaultScheduleStatus.STOPPED
    assert rebalance_schedule.description and "Off by default" in rebalance_schedule.description
    assert node_failure_sensor.default_status == DefaultSensorStatus.RUNNING
    assert migration_retry_sensor.default_status == DefaultSensorStatus.RUNNING
    when = datetime(2026, 11, 22, 7, 0, tzinfo=UTC)
    request = rebalance_schedule(build_schedule_context(scheduled_execution_time=when))
    assert isinstance(request, RunRequest) and request.run_config == {}
    assert request.run_key == "rebalance-20261122T0700"


# --- failed runs ------------------------------------------------------------------------------


def failed_run(
    job: Any, laminar: LaminarResource, run_config: dict[str, Any], tags: dict[str, str] | None = None
) -> tuple[DagsterInstance, Any]:
    instance = DagsterInstance.ephemeral()
    result = job.execute_in_process(
        run_config=run_config, instance=instance, resources={"laminar": laminar}, raise_on_error=False, tags=tags or {}
    )
    assert not result.success
    return instance, result


def evaluate_retry_sensor(instance: DagsterInstance, result: Any, laminar: LaminarResource) -> RunRequest | SkipReason:
    context = build_run_status_sensor_context(
        sensor_name=migration_retry_sensor.name,
        dagster_instance=instance,
        dagster_run=result.dagster_run,
        dagster_event=result.get_run_failure_event(),
        resources={"laminar": laminar},
    ).for_run_failure()
    with context:
        out = migration_retry_sensor(context)
    assert isinstance(out, RunRequest | SkipReason)
    return out


@pytest.mark.dagster
def test_failed_migration_is_relaunched_with_the_same_config(ledger: Ledger, laminar: LaminarResource) -> None:
    make_alive(ledger, 1, 2)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    # Node 1 is only a record, so it never reports the drain: the run fails by timeout.
    config = {"partition": 0, "to_node": 2, "tuning": {"release_wait_timeout_s": 0.05, "retry_delay_s": 7.0}}
    instance, result = failed_run(migrate_partition, laminar, config)
    before = time.time()
    out = evaluate_retry_sensor(instance, result, laminar)
    assert isinstance(out, RunRequest)
    assert out.job_name == migrate_partition.name
    assert out.run_key == f"retry-{result.run_id}"
    assert out.run_config == config
    assert out.tags[ATTEMPT_TAG] == "2" and out.tags[RETRY_OF_TAG] == result.run_id
    assert before + 6.5 < float(out.tags[NOT_BEFORE_TAG]) < time.time() + 7.5

    # The last allowed attempt failing: give up.
    config["tuning"]["max_retries"] = 1  # type: ignore[index]
    instance, result = failed_run(migrate_partition, laminar, config, tags={ATTEMPT_TAG: "2"})
    out = evaluate_retry_sensor(instance, result, laminar)
    assert isinstance(out, SkipReason) and "giving up" in str(out.skip_message)


@pytest.mark.dagster
def test_failed_migration_falls_back_to_failover_when_the_old_owner_died(
    ledger: Ledger, laminar: LaminarResource
) -> None:
    make_alive(ledger, 1, 2)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    config = {"partition": 0, "to_node": 2, "tuning": {"release_wait_timeout_s": 0.05}}
    instance, result = failed_run(migrate_partition, laminar, config)
    make_dead(ledger, 1)  # a fresh record of node 1 with a lapsed heartbeat
    out = evaluate_retry_sensor(instance, result, laminar)
    assert isinstance(out, RunRequest)
    assert out.job_name == failover_partition.name
    assert out.run_key == "failover-p0-e1"
    assert out.run_config == {"partition": 0, "to_node": 2, "tuning": {"release_wait_timeout_s": 0.05}}
    # The run's tags: what a user filters by (the partition, the dead owner and its epoch), and the lineage.
    assert out.tags == {
        "laminar/partition": "0",
        "laminar/from_node": "1",
        "laminar/from_epoch": "1",
        RETRY_OF_TAG: result.run_id,
    }


def test_decide_retry_branches(ledger: Ledger) -> None:
    make_alive(ledger, 2, 3)
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    ledger.acquire(P(1), N(2), expected_epoch=0)
    migrate, failover = migrate_partition.name, failover_partition.name
    # Old owner dead, target dead too: the failover picks its own target.
    out = decide_retry(migrate, {"partition": 0, "to_node": 9}, {}, "r1", ledger)
    assert isinstance(out, RunRequest) and out.job_name == failover and out.run_config == {"partition": 0, "tuning": {}}
    # Already where it should be.
    out = decide_retry(migrate, {"partition": 1, "to_node": 2}, {}, "r2", ledger)
    assert isinstance(out, SkipReason) and "already on node 2" in str(out.skip_message)
    # A failed failover whose target died: retried without the target.
    out = decide_retry(failover, {"partition": 0, "to_node": 9}, {ATTEMPT_TAG: "3"}, "r3", ledger, now=100.0)
    assert isinstance(out, RunRequest) and out.job_name == failover
    assert out.run_config == {"partition": 0}
    assert out.tags[ATTEMPT_TAG] == "4" and out.tags[NOT_BEFORE_TAG] == "105.000"
    # A run launched before `limits` was renamed `tuning` is retried with the new name.
    out = decide_retry(failover, {"partition": 0, "limits": {"max_retries": 9}}, {}, "r3b", ledger, now=100.0)
    assert isinstance(out, RunRequest) and out.run_config == {"partition": 0, "tuning": {"max_retries": 9}}
    out = decide_retry(failover, {"partition": 0}, {ATTEMPT_TAG: "4"}, "r4", ledger)
    assert isinstance(out, SkipReason) and "max_retries is 3" in str(out.skip_message)
    # A failover of a partition a live node owns is not retried.
    out = decide_retry(failover, {"partition": 1}, {}, "r5", ledger)
    assert isinstance(out, SkipReason) and "live node 2" in str(out.skip_message)
    assert isinstance(decide_retry("other_job", {"partition": 1}, {}, "r6", ledger), SkipReason)
    assert isinstance(decide_retry(migrate, {}, {}, "r7", ledger), SkipReason)


def test_a_failed_recording_run_is_retried_as_a_fresh_failover(ledger: Ledger) -> None:
    make_alive(ledger, 2)
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    recorded = {"migration_id": "gone", "from_node": 1, "to_node": 2, "from_epoch": 1, "to_epoch": 2, "phases": []}
    config = {"partition": 0, "to_node": 2, "recorded": recorded}
    decision = decide_retry(failover_partition.name, config, {}, "run-1", ledger)
    assert isinstance(decision, RunRequest) and decision.run_config == {"partition": 0, "to_node": 2}


@pytest.mark.dagster
def test_a_stranded_failover_is_retried(ledger: Ledger, laminar: LaminarResource) -> None:
    make_alive(ledger, 2)
    make_dead(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    # The fence succeeds (the coordinator's own part); node 2 never reports the download.
    config = {"partition": 0, "tuning": {"checkpoint_transfer_timeout_s": 0.05}}
    instance, result = failed_run(failover_partition, laminar, config)
    own = ledger.ownership(P(0))
    assert own is not None and (own.owner, own.epoch) == (2, 2)
    out = evaluate_retry_sensor(instance, result, laminar)
    assert isinstance(out, RunRequest) and out.job_name == failover_partition.name
    assert out.run_config == config


# --- observation ------------------------------------------------------------------------------


def observe_tick(laminar: LaminarResource, cursor: str | None = None) -> tuple[SensorResult | SkipReason, str | None]:
    with build_sensor_context(cursor=cursor, resources={"laminar": laminar}) as context:
        result = laminar_observation_sensor(context)
    assert isinstance(result, SensorResult | SkipReason)
    return result, result.cursor if isinstance(result, SensorResult) else cursor


def test_observation_sensor_reports_asset_events_only_on_change(ledger: Ledger, laminar: LaminarResource) -> None:
    first, cursor = observe_tick(laminar)
    assert isinstance(first, SensorResult) and not first.run_requests, "observing must launch no run"
    keys = [e.asset_key.to_user_string() for e in first.asset_events]
    assert keys == ["ownership_map", "ownership_map", "assignment_plan", "checkpoint_manifests"]
    check = first.asset_events[1]
    assert isinstance(check, AssetCheckEvaluation) and check.check_name == "partitions_on_live_nodes"
    assert not check.passed and "4 of 4 partitions not on a live node" in (check.description or "")
    (request,) = first.dynamic_partitions_requests or []
    assert list(request.partition_keys) == ["0", "1", "2", "3"]

    again, same = observe_tick(laminar, cursor)
    assert isinstance(again, SkipReason) and same == cursor

    make_alive(ledger, 1)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    changed, _ = observe_tick(laminar, cursor)
    assert isinstance(changed, SensorResult)
    assert [e.asset_key.to_user_string() for e in changed.asset_events] == [
        "ownership_map",
        "ownership_map",
        "assignment_plan",
    ]  # the manifests are observed at most once a minute
    assert not changed.dynamic_partitions_requests


def test_the_manifests_stay_fresh_only_while_every_partition_keeps_up(ledger: Ledger) -> None:
    manifests = ManifestReader(ledger.store)
    source = SourceLog(ledger.store)
    cursor, at = ObservationCursor(), 1_000_000.0

    def checkpoint_event(now: float) -> AssetMaterialization | AssetObservation | None:
        nonlocal cursor
        out = observe(ledger, manifests, cursor, now=now)
        cursor = out.cursor
        got = [e for e in out.events if e.asset_key == AssetKey("checkpoint_manifests")]
        assert len(got) <= 1
        return got[0] if got else None  # type: ignore[return-value]

    # Nothing to commit anywhere: keeping up, even with nothing committed.
    assert isinstance(checkpoint_event(at), AssetMaterialization)
    assert checkpoint_event(at + 30) is None  # at most once a minute
    # Events for partition 0 and no commit: behind; nothing changed, so nothing is reported.
    source.append(0, generate_events(20, 5, 1, 4)[0])
    assert checkpoint_event(at + 61) is None
    # Partition 0 commits: materialized again, the others have nothing to commit.
    token = ledger.acquire(P(0), N(1), expected_epoch=0)
    commit_all(ledger.store, token)
    fresh = checkpoint_event(at + 122)
    assert isinstance(fresh, AssetMaterialization)
    assert fresh.metadata["partitions_behind"] == MetadataValue.text("-")
    # Idle and caught up: still fresh a minute later, with the manifests unchanged.
    assert isinstance(checkpoint_event(at + 183), AssetMaterialization)
    # Partition 1 gets events nobody commits while partition 0 commits: observed, naming partition 1.
    stuck = generate_events(40, 8, 2, 4)[1]
    source.append(1, stuck)
    source.append(0, generate_events(20, 5, 3, 4)[0])
    commit_all(ledger.store, token)
    behind = checkpoint_event(at + 244)
    assert isinstance(behind, AssetObservation)
    assert behind.metadata["partitions_behind"] == MetadataValue.text(f"p1 ({stuck.num_rows} events)")
    assert checkpoint_event(at + 305) is None  # still behind, nothing changed: no report keeps it fresh


def test_the_stream_freshness_policy_is_on_the_manifests() -> None:
    spec = checkpoint_manifests
    assert spec.freshness_policy == STREAM_FRESHNESS
    assert isinstance(STREAM_FRESHNESS, TimeWindowFreshnessPolicy)
    assert STREAM_FRESHNESS.warn_window is not None
    assert STREAM_FRESHNESS.warn_window.to_timedelta() == STREAM_WARN_AFTER < STREAM_FAIL_AFTER
    assert STREAM_FRESHNESS.fail_window.to_timedelta() == STREAM_FAIL_AFTER


def test_the_retry_sensor_fails_a_record_past_its_deadline(ledger: Ledger) -> None:
    make_alive(ledger, 1, 2)
    ledger.acquire(P(0), N(1), expected_epoch=0)
    stale = MigrationCoordinator(ledger, MigrationConfig(migration_timeout_s=0.05)).plan(P(0), N(2))
    time.sleep(0.1)  # the run driving it died without recording anything
    out = decide_retry(migrate_partition.name, {"partition": 0, "to_node": 2}, {}, "r1", ledger)
    assert isinstance(out, RunRequest) and out.job_name == migrate_partition.name
    current = MigrationCoordinator(ledger).current(P(0))
    assert current is not None and current.migration_id == stale.migration_id
    assert current.phase == MigrationPhase.FAILED and (current.error or "").startswith("deadline exceeded")


def _owned_by(state: DesiredState, node: int) -> DesiredState:
    return state.model_copy(update={"owner": node})


def _placed_on_three_nodes(store: ObjectStore, partitions: int) -> Ledger:
    """Nodes 1-3 alive, partition p desired on and granted to node 1 + p % 3."""
    ledger = new_ledger(store, partitions)
    make_alive(ledger, 1, 2, 3)
    for p in range(partitions):
        owner = 1 + p % 3
        DesiredStates(ledger, nudge=False).update(P(p), functools.partial(_owned_by, node=owner))
        ledger.acquire(P(p), N(owner), expected_epoch=0)
    return ledger


def test_an_idle_failure_sensor_tick_reads_no_partitions_records(store: ObjectStore, meter: RequestMeter) -> None:
    """The daemon ticks the failure sensor every few seconds: once it has looked at every partition, a
    tick with no node change reads the member set, the node records and no partition's records."""
    ledger = _placed_on_three_nodes(store, 36)

    def requests_of_a_tick(cursor: str | None) -> tuple[int, str | None]:
        before = sum(meter.snapshot().by_method.values())
        result = evaluate(ledger, cursor, heartbeat_timeout_s=None, log=lambda _: None, watch_s=0.0)
        after = sum(meter.snapshot().by_method.values())
        return after - before, result.cursor if isinstance(result, SensorResult) else cursor

    full, cursor = requests_of_a_tick(None)
    idle, _ = requests_of_a_tick(cursor)
    assert full > 36 * 2, full  # the first look reads every partition's ownership
    assert idle <= 30, idle  # member set and node records a few times over: none of the 36 partitions'


def test_a_death_is_failed_over_from_the_dead_nodes_records_and_the_next_tick_reads_every_owner(
    store: ObjectStore, meter: RequestMeter
) -> None:
    """The tick that finds a node dead fails over what its assignment names; the next tick reads
    every partition's owner (`look_focus`), and finds what the assignment missed."""
    ledger = _placed_on_three_nodes(store, 36)
    first = evaluate(ledger, None, heartbeat_timeout_s=None, log=lambda _: None, watch_s=0.0)
    assert isinstance(first, (SensorResult, SkipReason))
    cursor = first.cursor if isinstance(first, SensorResult) else None
    # Node 3 also holds p0, which neither its assignment nor its heartbeat names (only the ledger).
    own = ledger.ownership(P(0))
    assert own is not None
    ledger.fence(P(0), N(3), expected_epoch=own.epoch, reason="moved outside the control plane")
    make_dead(ledger, 3)
    # No node process here: the sensor fences and leaves each move to its run (no budget to drive it).
    death = evaluate(ledger, cursor, heartbeat_timeout_s=None, log=lambda _: None, watch_s=0.0, budget_s=0.0)
    assert isinstance(death, SensorResult)
    failed_over = {int(r.tags["laminar/partition"]) for r in death.run_requests or []}
    assert failed_over == {p for p in range(36) if p % 3 == 2}  # by node 3's assignment
    assert '"full_look_at": 0.0' in (death.cursor or "")  # the next tick looks at every partition
    following = evaluate(ledger, death.cursor, heartbeat_timeout_s=None, log=lambda _: None, watch_s=0.0, budget_s=0.0)
    assert isinstance(following, SensorResult)
    assert {int(r.tags["laminar/partition"]) for r in following.run_requests or []} == {0}


def test_an_idle_observation_reads_no_partitions_records_and_a_move_is_seen_at_the_next_one(
    store: ObjectStore, meter: RequestMeter
) -> None:
    """The observation sensor ticks every 5 s: it reads every partition's records only when the
    nodes' records, assignments or move reports moved (a grant always moves an assignment)."""
    ledger = _placed_on_three_nodes(store, 36)
    manifests, at = ManifestReader(ledger.store), 1_000_000.0
    first = observe(ledger, manifests, ObservationCursor(), now=at)
    before = sum(meter.snapshot().by_method.values())
    idle = observe(ledger, manifests, first.cursor, now=at + 5)
    read = sum(meter.snapshot().by_method.values()) - before
    assert not idle.events and read <= 1 + 3 * 3 + 2, read  # the member set, 3 reads a node, the partition count
    # The control plane moves p5 to node 1: its desired state moves node 1's assignment first.
    DesiredStates(ledger, nudge=False).update(P(5), functools.partial(_owned_by, node=1))
    own = ledger.ownership(P(5))
    assert own is not None
    ledger.fence(P(5), N(1), expected_epoch=own.epoch, reason="moved by the control plane")
    moved = observe(ledger, manifests, idle.cursor, now=at + 10)
    assert [e.asset_key.to_user_string() for e in moved.events][:1] == ["ownership_map"]
    # Written by hand, behind the control plane's back: seen at the periodic full read.
    own = ledger.ownership(P(6))
    assert own is not None
    ledger.fence(P(6), N(2), expected_epoch=own.epoch, reason="by hand")
    assert not observe(ledger, manifests, moved.cursor, now=at + 15).events
    assert observe(ledger, manifests, moved.cursor, now=at + 10 + OWNERSHIP_EVERY_S).events


def test_the_death_tick_reports_the_dead_owner_from_the_rows_it_knows_without_reading_every_partition(
    store: ObjectStore, meter: RequestMeter
) -> None:
    """At a death the sensor reports the dead owner before the failover: from the ownership rows this
    process last read (the observation sensor's), patched with what the plan found, not from a read
    of every partition on the failover's path."""
    ledger = _placed_on_three_nodes(store, 36)
    first = evaluate(ledger, None, heartbeat_timeout_s=None, log=lambda _: None, watch_s=0.0)
    cursor = first.cursor if isinstance(first, SensorResult) else None
    primed = sum(meter.snapshot().by_method.values())
    ownership_rows(ledger)  # what the observation sensor read last, in this process
    full_read = sum(meter.snapshot().by_method.values()) - primed
    make_dead(ledger, 3)
    start = sum(meter.snapshot().by_method.values())
    reported: list[tuple[int, AssetObservation | AssetCheckEvaluation]] = []

    def report(event: AssetObservation | AssetCheckEvaluation) -> None:
        reported.append((sum(meter.snapshot().by_method.values()) - start, event))

    death = evaluate(
        ledger, cursor, heartbeat_timeout_s=None, log=lambda _: None, watch_s=0.0, budget_s=0.0, report=report
    )
    assert isinstance(death, SensorResult) and len(death.run_requests or []) == 12
    (read_by_then, observation), (_, check) = reported
    for event in [observation, check, *death.asset_events]:
        serialize_value(event)  # what the daemon does with them: only Dagster's own types pass
    assert isinstance(observation, AssetObservation) and isinstance(check, AssetCheckEvaluation)
    # The look at node 3's partitions for the plan, and no read of every partition's records on top.
    assert read_by_then < full_read, (read_by_then, full_read)
    rows = {r.data["partition"]: r.data for r in observation.metadata["ownership"].value.records}  # type: ignore[union-attr]
    assert {p for p, r in rows.items() if r["health"] == "owner dead: failover pending"} == {
        p for p in range(36) if p % 3 == 2
    }
    assert not check.passed
