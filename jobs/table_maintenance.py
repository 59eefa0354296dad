"""``table_maintenance``: compact, checkpoint and vacuum the output table; its schedule is off by default."""

from dagster import (
    AssetObservation,
    Config,
    DefaultScheduleStatus,
    OpExecutionContext,
    RunRequest,
    ScheduleEvaluationContext,
    job,
    op,
    schedule,
)
from pydantic import Field

from laminar_orchestration.table import compact_and_checkpoint, table_location, table_status
from laminar_orchestration.table.maintenance import DEFAULT_RETENTION_HOURS
from resources import LaminarResource

__all__ = ["TableMaintenanceConfig", "table_maintenance", "table_maintenance_schedule"]


class TableMaintenanceConfig(Config):
    """Launchpad config of a maintenance run."""

    retention_hours: int = Field(
        default=DEFAULT_RETENTION_HOURS, description="vacuum data files unreferenced for longer than this"
    )


@op(description="Sync nothing; compact small files, checkpoint the Delta log and vacuum beyond the retention.")
def maintain_output_table(
    context: OpExecutionContext, config: TableMaintenanceConfig, laminar: LaminarResource
) -> None:
    from assets.stream_output import stream_output, stream_output_metadata

    store = laminar.store()
    location = table_location(store)
    report = compact_and_checkpoint(location, retention_hours=config.retention_hours)
    for line in report.summary_lines():
        context.log.info(line)
    context.log_event(
        AssetObservation(asset_key=stream_output.key, metadata=stream_output_metadata(table_status(store, location)))
    )


@job(description="Compact, checkpoint and vacuum the output Delta table (`laminar table maintain`).")
def table_maintenance() -> None:
    maintain_output_table()


@schedule(
    name="table_maintenance_schedule",
    job=table_maintenance,
    cron_schedule="17 3 * * *",
    default_status=DefaultScheduleStatus.STOPPED,
    description="Nightly maintenance of the output table. Off by default: turn it on in the UI.",
)
def table_maintenance_schedule(context: ScheduleEvaluationContext) -> RunRequest:
    """Nightly compaction, checkpoint and vacuum of the output table; off until an operator turns it on."""
    return RunRequest(run_key=f"table-maintenance-{context.scheduled_execution_time:%Y%m%d}", run_config={})
