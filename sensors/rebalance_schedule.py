"""``rebalance_schedule``: an hourly rebalance, off until an operator turns it on.

``LAMINAR_REBALANCE_CRON`` replaces the hourly cron (e.g. ``*/5 * * * *``), in the
environment of the webserver and the daemon alike.
"""

import os

from dagster import DefaultScheduleStatus, RunRequest, ScheduleEvaluationContext, schedule

from jobs import rebalance

__all__ = ["REBALANCE_CRON", "rebalance_schedule"]

#: When the schedule ticks: hourly unless ``LAMINAR_REBALANCE_CRON`` says otherwise.
REBALANCE_CRON = os.environ.get("LAMINAR_REBALANCE_CRON") or "0 * * * *"


@schedule(
    name="rebalance_schedule",
    job=rebalance,
    cron_schedule=REBALANCE_CRON,
    default_status=DefaultScheduleStatus.STOPPED,
    description="Hourly rebalance of the partitions over the live nodes (LAMINAR_REBALANCE_CRON changes the cron). "
    "Off by default: "
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
