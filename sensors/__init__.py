"""Dagster sensors and schedules of the laminar code location.

* ``node_failure_sensor`` — reads node liveness from the ledger; for each
  partition whose owner stopped heartbeating it requests one
  ``failover_partition`` run, keyed ``failover-p{partition}-e{epoch}`` so one
  node death never launches two failovers of a partition (Dagster drops a
  repeated run key, and the cursor remembers what was handled).
* ``migration_retry_sensor`` — on a failed ``migrate_partition`` run,
  re-launches the same config (tag ``laminar/attempt`` counts attempts, up to
  the migration's ``max_retries``; the new run waits ``retry_delay_s``), or
  falls back to ``failover_partition`` when the old owner is dead. Failed
  ``failover_partition`` runs are retried the same way.
* ``laminar_observation_sensor`` — refreshes the asset observations whenever
  the ledger's fingerprint changes.
* ``rebalance_schedule`` — hourly rebalance, stopped by default.
"""

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunFailureSensorContext,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    run_failure_sensor,
    schedule,
    sensor,
)

from assets import checkpoint_rows, fingerprint, observe_laminar_state, ownership_rows
from jobs import (
    ATTEMPT_TAG,
    NOT_BEFORE_TAG,
    PARTITION_TAG,
    RETRY_OF_TAG,
    failover_partition,
    limits_from_run_config,
    migrate_partition,
    rebalance,
)
from laminar_orchestration.assignment import failover_target, live_node_ids, node_loads, stranded, warm_copies
from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.ledger import ClusterNotInitialized, Ledger, LedgerError
from laminar_orchestration.migration import (
    GRACEFUL_PHASES,
    DesiredStates,
    MigrationCoordinator,
    MigrationKind,
    MigrationPhase,
)
from laminar_orchestration.store import StoreError
from resources import LaminarResource

__all__ = [
    "FAILED_NODE_TAG",
    "FailoverScan",
    "build_node_failure_sensor",
    "decide_retry",
    "failover_run_key",
    "laminar_observation_sensor",
    "migration_retry_sensor",
    "node_failure_sensor",
    "rebalance_schedule",
    "scan_for_failovers",
]

FAILED_NODE_TAG = "laminar/failed_node"
EPOCH_TAG = "laminar/epoch"
#: Heartbeat timeout the failure sensor uses instead of each node's own (unset: the node's).
HEARTBEAT_TIMEOUT_ENV = "LAMINAR_FAILOVER_HEARTBEAT_TIMEOUT_S"


def failover_run_key(partition: int, epoch: int) -> str:
    """Run key of the failover of `partition` away from its owner at `epoch`: one per node death."""
    return f"failover-p{partition}-e{epoch}"


# --- node failure ---------------------------------------------------------------------


@dataclass
class FailoverScan:
    """What one evaluation of the node-failure sensor found."""

    run_requests: list[RunRequest] = field(default_factory=list)
    #: (partition, epoch) pairs a failover was requested for, still current.
    handled: set[tuple[int, int]] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)


def _decode_cursor(cursor: str | None) -> set[tuple[int, int]]:
    if not cursor:
        return set()
    try:
        data = json.loads(cursor)
        return {(int(p), int(e)) for p, e in data.get("handled", [])}
    except (ValueError, TypeError, AttributeError):
        return set()  # a mangled cursor only costs a deduplicated (run-keyed) request


def _encode_cursor(handled: set[tuple[int, int]]) -> str:
    return json.dumps({"handled": sorted([p, e] for p, e in handled)})


def scan_for_failovers(
    ledger: Ledger, handled: set[tuple[int, int]], *, heartbeat_timeout_s: float | None = None
) -> FailoverScan:
    """Find partitions whose owner is dead and build one failover request for each new (partition, epoch).

    A partition is left alone when its owner is alive or unassigned, when a
    migration that no longer needs the old owner is in flight (a forced one,
    or a graceful one past the release) towards a live node, or when its
    (partition, epoch) is in `handled`. The target is a live node with a warm
    copy of the partition (a standby), else the least-loaded live node,
    counting the failovers requested in this scan.
    """
    scan = FailoverScan()
    live = live_node_ids(ledger, heartbeat_timeout_s=heartbeat_timeout_s)
    owners = ledger.ownerships(ledger.partitions())
    current = {int(p): (int(o.owner) if o else UNASSIGNED) for p, o in owners.items()}
    loads = node_loads(current, live)
    warm = warm_copies(ledger.nodes())
    desired = DesiredStates(ledger)
    for p, own in sorted(owners.items()):
        if own is None or own.owner == UNASSIGNED or own.owner in live:
            continue
        key = (int(p), own.epoch)
        task = desired.read(PartitionId(p))[0].migration
        if (
            task is not None
            and not task.is_terminal
            and task.to_node in live
            and (
                task.migration_kind == MigrationKind.FORCED
                or GRACEFUL_PHASES.index(task.phase) >= GRACEFUL_PHASES.index(MigrationPhase.DOWNLOADING)
            )
        ):
            scan.skipped.append(f"p{p}: migration {task.migration_id} to node {task.to_node} in flight")
            scan.handled.add(key)
            continue
        if key in handled:
            scan.handled.add(key)
            continue
        target = failover_target(loads, warm=warm.get(int(p)))
        if target is None:
            # Not marked handled: retried on the next tick, when a node may be back.
            scan.skipped.append(f"p{p}: owner node {own.owner} is dead and no live node can take it")
            continue
        loads[target] += 1
        scan.handled.add(key)
        scan.run_requests.append(
            RunRequest(
                run_key=failover_run_key(int(p), own.epoch),
                job_name=failover_partition.name,
                run_config={"partition": int(p), "to_node": target},
                tags={PARTITION_TAG: str(p), FAILED_NODE_TAG: str(own.owner), EPOCH_TAG: str(own.epoch)},
            )
        )
    return scan


def build_node_failure_sensor(
    *,
    name: str = "node_failure_sensor",
    heartbeat_timeout_s: float | None = None,
    minimum_interval_seconds: int = 5,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
) -> SensorDefinition:
    """The node-failure sensor; `heartbeat_timeout_s` overrides each node's own timeout."""

    @sensor(
        name=name,
        job=failover_partition,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="Requests one failover_partition run per partition whose owner stopped "
        "heartbeating (run key failover-p{partition}-e{epoch}).",
    )
    def _sensor(context: SensorEvaluationContext, laminar: LaminarResource) -> SensorResult | SkipReason:
        try:
            scan = scan_for_failovers(
                laminar.ledger(), _decode_cursor(context.cursor), heartbeat_timeout_s=heartbeat_timeout_s
            )
        except ClusterNotInitialized as exc:
            return SkipReason(str(exc))
        for note in scan.skipped:
            context.log.info(note)
        cursor = _encode_cursor(scan.handled)
        if not scan.run_requests:
            if cursor != (context.cursor or _encode_cursor(set())):
                context.update_cursor(cursor)
            return SkipReason("; ".join(scan.skipped) or "every partition's owner is alive")
        return SensorResult(run_requests=scan.run_requests, cursor=cursor)

    return _sensor


def _timeout_from_env() -> float | None:
    raw = os.environ.get(HEARTBEAT_TIMEOUT_ENV, "").strip()
    return float(raw) if raw else None


node_failure_sensor = build_node_failure_sensor(heartbeat_timeout_s=_timeout_from_env())


# --- failed runs ------------------------------------------------------------------------


def decide_retry(
    job_name: str,
    run_config: Mapping[str, Any],
    tags: Mapping[str, str],
    run_id: str,
    ledger: Ledger,
    *,
    now: float | None = None,
) -> RunRequest | SkipReason:
    """What to do about a failed migration run (pure but for reading the ledger).

    * ``migrate_partition`` whose old owner is dead -> ``failover_partition``
      (run key ``failover-p{p}-e{epoch}``, as the node-failure sensor uses);
    * the partition already on the target (``migrate``) or owned by a live
      node (``failover``) -> nothing;
    * fewer than ``max_retries`` retries so far -> the same job and config
      again, tagged with the next attempt and a not-before time
      ``retry_delay_s`` ahead (the first op waits for it);
    * otherwise -> give up.
    """
    try:
        partition = int(run_config["partition"])
    except (KeyError, TypeError, ValueError):
        return SkipReason(f"run {run_id}: no partition in its config")
    to_node = run_config.get("to_node")
    settings = limits_from_run_config(run_config).migration_config()
    attempt = int(tags.get(ATTEMPT_TAG, "1") or 1)
    own = ledger.ownership(PartitionId(partition))
    if own is None:
        return SkipReason(f"partition {partition} does not exist")
    live = live_node_ids(ledger)
    lineage = {PARTITION_TAG: str(partition), RETRY_OF_TAG: run_id}
    # A record past its deadline would block the retry: whoever finds it fails it.
    MigrationCoordinator(ledger).expire_overdue(PartitionId(partition))
    latest = DesiredStates(ledger).read(PartitionId(partition))[0].migration
    # The owner got its epoch from a migration that then failed: not done yet.
    is_stranded = stranded(latest, own.epoch, own.owner)

    if job_name == migrate_partition.name:
        if own.owner == to_node and not is_stranded:
            return SkipReason(f"partition {partition} is already on node {to_node}")
        if own.owner != UNASSIGNED and own.owner not in live:
            config: dict[str, Any] = {"partition": partition, "limits": dict(run_config.get("limits") or {})}
            if to_node in live:
                config["to_node"] = to_node
            return RunRequest(
                run_key=failover_run_key(partition, own.epoch),
                job_name=failover_partition.name,
                run_config=config,
                tags={**lineage, FAILED_NODE_TAG: str(own.owner), EPOCH_TAG: str(own.epoch)},
            )
    elif job_name == failover_partition.name:
        if own.owner in live and not run_config.get("allow_live_owner") and not is_stranded:
            return SkipReason(f"partition {partition} is owned by live node {own.owner}: no failover needed")
    else:
        return SkipReason(f"run {run_id} of job {job_name} is not a migration")

    if attempt > settings.max_retries:
        return SkipReason(
            f"{job_name} of partition {partition} failed {attempt} time(s); max_retries is "
            f"{settings.max_retries}: giving up"
        )
    new_config = dict(run_config)
    if job_name == failover_partition.name and new_config.get("to_node") not in live:
        new_config.pop("to_node", None)  # its target died too: let the op pick the least-loaded node
    not_before = (now if now is not None else time.time()) + settings.retry_delay_s
    return RunRequest(
        run_key=f"retry-{run_id}",
        job_name=job_name,
        run_config=new_config,
        tags={**lineage, ATTEMPT_TAG: str(attempt + 1), NOT_BEFORE_TAG: f"{not_before:.3f}"},
    )


@run_failure_sensor(
    name="migration_retry_sensor",
    monitored_jobs=[migrate_partition, failover_partition],
    request_jobs=[migrate_partition, failover_partition],
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=5,
    description="Re-launches failed migrations up to max_retries (after retry_delay_s), "
    "or falls back to failover_partition when the old owner is dead.",
)
def migration_retry_sensor(context: RunFailureSensorContext, laminar: LaminarResource) -> RunRequest | SkipReason:
    run = context.dagster_run
    try:
        decision = decide_retry(run.job_name, run.run_config, run.tags, run.run_id, laminar.ledger())
    except (LedgerError, StoreError) as exc:
        return SkipReason(f"cannot read the ledger: {exc}")
    if isinstance(decision, RunRequest):
        context.log.info(f"run {run.run_id} failed: launching {decision.job_name} ({decision.run_key})")
    return decision


# --- observation ----------------------------------------------------------------------------


@sensor(
    name="laminar_observation_sensor",
    job=observe_laminar_state,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="Observes the laminar assets when the ownership map or the manifests changed.",
)
def laminar_observation_sensor(context: SensorEvaluationContext, laminar: LaminarResource) -> RunRequest | SkipReason:
    ledger = laminar.ledger()
    if not ledger.is_initialized():
        return SkipReason(f"no cluster in {ledger.store.url}")
    state = fingerprint(
        {
            "owners": ownership_rows(ledger),
            "manifests": [(r["partition"], r["seq"]) for r in checkpoint_rows(ledger, laminar.manifests())],
        }
    )
    if state == context.cursor:
        return SkipReason("nothing changed since the last observation")
    context.update_cursor(state)
    return RunRequest(tags={"laminar/fingerprint": state})


# --- schedules -------------------------------------------------------------------------------


@schedule(
    name="rebalance_schedule",
    job=rebalance,
    cron_schedule="0 * * * *",
    default_status=DefaultScheduleStatus.STOPPED,
    description="Hourly rebalance of the partitions over the live nodes. Off by default: "
    "turn it on in the UI (each move costs a short unavailability).",
)
def rebalance_schedule(context: ScheduleEvaluationContext) -> RunRequest:
    """Hourly rebalance of the partitions over the live nodes.

    Off by default (``DefaultScheduleStatus.STOPPED``): moving partitions costs
    a short unavailability each, so an operator turns it on deliberately in
    the UI (Automation → rebalance_schedule). Each tick runs ``rebalance`` with
    its defaults: the sticky planner moves nothing when the cluster is
    already balanced, and at most 2 migrations run per node at a time.
    """
    return RunRequest(run_key=f"rebalance-{context.scheduled_execution_time:%Y%m%dT%H%M}", run_config={})


SCHEDULES: list[ScheduleDefinition] = [rebalance_schedule]
SENSORS: list[SensorDefinition] = [node_failure_sensor, migration_retry_sensor, laminar_observation_sensor]
