"""``migration_retry_sensor``: failed migration runs are launched again, or turned into failovers.

On a failed ``migrate_partition`` run it re-launches the same config (tag
``laminar/attempt`` counts attempts, up to the migration's ``max_retries``;
the new run waits ``retry_delay_s``), or falls back to ``failover_partition``
when the old owner is dead. Failed ``failover_partition`` runs are retried
the same way. The policy is the library's (`laminar_orchestration.control.retry`);
this module turns its decision into a run request or a skip.
"""

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
    FROM_EPOCH_TAG,
    FROM_NODE_TAG,
    NOT_BEFORE_TAG,
    PARTITION_TAG,
    RETRY_OF_TAG,
    TUNING_KEY,
    failover_partition,
    limits_from_run_config,
    migrate_partition,
)
from laminar_orchestration.control.retry import FailedMigration, RetryAction, RetryPolicy
from laminar_orchestration.control.retry import decide_retry as decide
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import LedgerError
from laminar_orchestration.protocol.tasks import MigrationKind
from laminar_orchestration.store import StoreError
from resources import LaminarResource

from .node_failure import failover_run_key

__all__ = ["decide_retry", "migration_retry_sensor"]


#: The migration each job drives, by job name.
_KINDS = {migrate_partition.name: MigrationKind.GRACEFUL, failover_partition.name: MigrationKind.FORCED}


def decide_retry(
    job_name: str,
    run_config: Mapping[str, Any],
    tags: Mapping[str, str],
    run_id: str,
    ledger: Ledger,
    *,
    now: float | None = None,
) -> RunRequest | SkipReason:
    """What to do about a failed migration run: the library's decision (`control.retry.decide_retry`,
    with the migration's `max_retries` and `retry_delay_s`) as a run request.

    * ``migrate_partition`` whose old owner is dead -> ``failover_partition``
      (run key ``failover-p{p}-e{epoch}``, as the node-failure sensor uses);
    * a retry -> the same job and config again (without a failover the sensor
      had recorded, and without a failover's dead target), tagged with the next
      attempt and its not-before time (the first op waits for it);
    * nothing to do, or out of retries -> a skip with the reason.
    """
    try:
        partition = int(run_config["partition"])
    except (KeyError, TypeError, ValueError):
        return SkipReason(f"run {run_id}: no partition in its config")
    kind = _KINDS.get(job_name)
    if kind is None:
        return SkipReason(f"run {run_id} of job {job_name} is not a migration")
    raw_target = run_config.get("to_node")
    failed = FailedMigration(
        kind=kind,
        partition=partition,
        to_node=raw_target if isinstance(raw_target, int) else None,
        attempt=int(tags.get(ATTEMPT_TAG, "1") or 1),
        allow_live_owner=bool(run_config.get("allow_live_owner")),
        label=job_name,
    )
    policy = RetryPolicy.of(limits_from_run_config(run_config).migration_config())
    decision = decide(ledger, failed, policy, now=now)
    lineage = {PARTITION_TAG: str(partition), RETRY_OF_TAG: run_id}
    if decision.action == RetryAction.FAILOVER:
        tuning = limits_from_run_config(run_config).model_dump(exclude_none=True)
        config: dict[str, Any] = {"partition": partition, TUNING_KEY: tuning}
        if decision.to_node is not None:
            config["to_node"] = decision.to_node
        return RunRequest(
            run_key=failover_run_key(partition, decision.epoch),
            job_name=failover_partition.name,
            run_config=config,
            # The failover's run names the dead owner and its epoch as every move's run does.
            tags={**lineage, FROM_NODE_TAG: str(decision.failed_node), FROM_EPOCH_TAG: str(decision.epoch)},
        )
    if decision.action == RetryAction.STOP:
        return SkipReason(decision.reason)
    new_config = dict(run_config)
    # The sensor-driven failover the run was recording failed: the retry plans a fresh one.
    new_config.pop("recorded", None)
    if "limits" in new_config:  # a run launched before the block was renamed
        new_config[TUNING_KEY] = new_config.pop("limits")
    if decision.to_node is None:
        new_config.pop("to_node", None)  # the op picks the target
    return RunRequest(
        run_key=f"retry-{run_id}",
        job_name=job_name,
        run_config=new_config,
        tags={**lineage, ATTEMPT_TAG: str(decision.attempt), NOT_BEFORE_TAG: f"{decision.not_before:.3f}"},
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
