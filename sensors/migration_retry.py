"""``migration_retry_sensor``: failed migration runs are launched again, or turned into failovers.

On a failed ``migrate_partition`` run it re-launches the same config (tag
``laminar/attempt`` counts attempts, up to the migration's ``max_retries``;
the new run waits ``retry_delay_s``), or falls back to ``failover_partition``
when the old owner is dead. Failed ``failover_partition`` runs are retried
the same way.
"""

import time
from collections.abc import Mapping
from typing import Any

from dagster import (
    DefaultSensorStatus,
    RunFailureSensorContext,
    RunRequest,
    SkipReason,
    run_failure_sensor,
)

from jobs import (
    ATTEMPT_TAG,
    EPOCH_TAG,
    FAILED_NODE_TAG,
    NOT_BEFORE_TAG,
    PARTITION_TAG,
    RETRY_OF_TAG,
    failover_partition,
    limits_from_run_config,
    migrate_partition,
)
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import stranded
from laminar_orchestration.control.snapshot import live_node_ids
from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import LedgerError
from laminar_orchestration.protocol.tasks import DesiredStates
from laminar_orchestration.store import StoreError
from resources import LaminarResource

from .node_failure import failover_run_key

__all__ = ["decide_retry", "migration_retry_sensor"]


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
    state = DesiredStates(ledger).read(PartitionId(partition))[0]
    # The owner holds an epoch nobody will run there (its migration failed after the fence): not done yet.
    is_stranded = stranded(state, own)

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
    # The sensor-driven failover the run was recording failed: the retry plans a fresh one.
    new_config.pop("recorded", None)
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
