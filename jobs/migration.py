"""The migration jobs: one op per protocol phase, each a thin wrapper over `run_phase`.

``migrate_partition`` (graceful):
    plan → drain → checkpoint → upload → release → download → restore → seek → activate
``failover_partition`` (forced, the old owner is dead):
    fence → download → restore → seek → activate

Each op persists its phase in the partition's desired-state record, does the
coordinator's part (the fence, for forced moves) and waits until the
responsible node reports the phase done; its output metadata carries
``duration_s``, ``bytes_moved`` (on the ops that move state: plan, where the
target warms up, upload and download, each with ``bytes_counted`` saying what it counts: the
target's warm-up downloads, the snapshot the old owner published, the target's downloads after the drain)
and the ``detail``; the migration's identity (partition, id, nodes, epochs)
is on the run as tags. The ops pass each other nothing but their order (a
phase's input is the ledger; which migration is in the run's tags), so no
step writes or loads an output. The ledger holds the whole migration state,
so a re-executed or re-launched run resumes the recorded migration instead of
starting another. A failover the node-failure sensor already drove comes with
its phases in ``recorded``: the run shows them and drives only what is left.

Launchpad config of ``migrate_partition``::

    partition: 3
    to_node: 2           # optional: the live node, other than the owner, holding the fewest partitions
    tuning:              # optional, the default timeouts and retries
      migration_timeout_s: 30

The Launchpad lists fields by name, so the optional block is named to come
after ``partition`` and ``to_node``; no field needs a value Dagster would
have to make up (an empty config's error suggests only ``partition: 0``).
``failover_partition`` takes ``partition``, an optional ``to_node`` (default:
the live node holding the fewest partitions), ``allow_live_owner`` and ``tuning``.
"""

from collections.abc import Iterable, Iterator
from typing import Any

from dagster import (
    Config,
    ConfigMapping,
    Failure,
    In,
    JobDefinition,
    MetadataValue,
    Nothing,
    OpDefinition,
    OpExecutionContext,
    Out,
    Output,
    RunConfig,
    config_mapping,
    in_process_executor,
    job,
    op,
)
from pydantic import Field

from laminar_orchestration.control.failover import prepare_failover
from laminar_orchestration.control.moves import plan_move, record_failure
from laminar_orchestration.control.ownership import ownership_rows
from laminar_orchestration.control.placement import least_loaded_node, node_loads
from laminar_orchestration.control.snapshot import live_node_ids
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.tasks import MigrationError, MigrationKind, MigrationPhase
from resources import LaminarResource

from .common import (
    EXPECTED_ERRORS,
    PARTITION_TAG,
    TRANSFER_OPS,
    MigrationHandle,
    MigrationLimits,
    RecordedFailover,
    failure,
    limits_from_run_config,
    report_metadata,
    tag_run,
    wait_for_retry_delay,
)

# --- config -----------------------------------------------------------------------


class MigratePartitionConfig(Config):
    """Launchpad config of `migrate_partition`: which partition goes to which node."""

    partition: int = Field(ge=0, description="Required: the partition to move (0 .. partitions-1).")
    to_node: int | None = Field(
        default=None,
        ge=1,
        description="The live node that takes the partition over "
        "(default: the live node, other than the owner, holding the fewest partitions).",
    )
    tuning: MigrationLimits = Field(
        default_factory=MigrationLimits, description="Optional timeouts and retries (the defaults when unset)."
    )


class FailoverPartitionConfig(Config):
    """Launchpad config of `failover_partition`."""

    partition: int = Field(ge=0, description="Required: the partition whose owner is dead.")
    to_node: int | None = Field(
        default=None, ge=1, description="The new owner (default: the live node with the fewest partitions)."
    )
    allow_live_owner: bool = Field(
        default=False,
        description="Fence the owner even though it still heartbeats (a stalled node). "
        "Without it, a failover of a partition whose owner is alive does nothing.",
    )
    tuning: MigrationLimits = Field(
        default_factory=MigrationLimits, description="Optional timeouts and retries (the defaults when unset)."
    )
    recorded: RecordedFailover | None = Field(
        default=None,
        description="Set by the node-failure sensor: the failover it already fenced and drove, phase by phase.",
    )


@config_mapping
def _migrate_config(config: MigratePartitionConfig) -> RunConfig:
    # The Launchpad shows `partition`/`to_node` at the top; only `plan` needs them,
    # the other ops get the migration from their input.
    return RunConfig(ops={"plan": config})


@config_mapping
def _failover_config(config: FailoverPartitionConfig) -> RunConfig:
    return RunConfig(ops={"fence": config})


# --- the phase ops --------------------------------------------------------------------

#: Op name -> the phase it drives, in protocol order.
GRACEFUL_OPS: dict[str, MigrationPhase] = {
    "drain": MigrationPhase.DRAINING,
    "checkpoint": MigrationPhase.CHECKPOINTING,
    "upload": MigrationPhase.UPLOADING,
    "release": MigrationPhase.RELEASED,
    "download": MigrationPhase.DOWNLOADING,
    "restore": MigrationPhase.RESTORING,
    "seek": MigrationPhase.SEEKING,
    "activate": MigrationPhase.ACTIVE,
}
RISING_OPS = ("download", "restore", "seek", "activate")

_PHASE_DESCRIPTIONS = {
    MigrationPhase.DRAINING: "Old owner stops taking batches and finishes the one in flight.",
    MigrationPhase.CHECKPOINTING: "Old owner writes the final checkpoint at its epoch.",
    MigrationPhase.UPLOADING: "Old owner makes the checkpoint durable in the object store.",
    MigrationPhase.RELEASED: "Old owner records 'released at epoch N with checkpoint X'.",
    MigrationPhase.DOWNLOADING: "New owner downloads the released (or last committed) checkpoint.",
    MigrationPhase.RESTORING: "New owner restores state and takes epoch N+1 in the ledger.",
    MigrationPhase.SEEKING: "New owner seeks the source to the checkpoint's offset.",
    MigrationPhase.ACTIVE: "New owner starts processing; the migration is complete.",
}


#: The kind of migration each job's runs drive (a run's tags name the migration, its job the kind).
_JOB_KINDS = {"migrate_partition": "graceful", "failover_partition": "forced"}

#: The migration each run in this process drives, by run id: set by `plan`/`fence`, read by the phase ops.
_HANDLES: dict[str, MigrationHandle] = {}


def remember(context: OpExecutionContext, handle: MigrationHandle) -> None:
    """Make `handle` the run's migration: run tags (for the UI and re-executions) and this process's cache."""
    tag_run(context, handle.tags())
    _HANDLES[context.run_id] = handle
    if len(_HANDLES) > 256:  # a long-lived process (tests, execute_in_process) keeps only recent runs
        _HANDLES.pop(next(iter(_HANDLES)))


def run_handle(context: OpExecutionContext) -> MigrationHandle:
    """The migration this run drives: set by its first op, or rebuilt from the run's tags and config.

    The ops pass nothing to each other (each phase's input is the ledger), so a
    run re-executed from a failed phase rebuilds the migration from the tags its
    first op wrote, which the re-execution inherits.
    """
    cached = _HANDLES.get(context.run_id)
    if cached is not None:
        return cached
    run = context.instance.get_run_by_id(context.run_id) or context.run
    tags = run.tags
    raw: dict[str, Any] = dict(run.run_config or {})
    ops = raw.get("ops")
    for first in ("plan", "fence"):
        # Stored either as the Launchpad config or already mapped onto the first op.
        mapped = ops.get(first, {}).get("config") if isinstance(ops, dict) else None
        if isinstance(mapped, dict):
            raw = mapped
    settings = limits_from_run_config(raw).migration_config()
    try:
        if raw.get("recorded"):
            return MigrationHandle.of_recorded(int(tags[PARTITION_TAG]), RecordedFailover(**raw["recorded"]), settings)
        return MigrationHandle.from_tags(tags, settings, _JOB_KINDS.get(run.job_name, ""))
    except (KeyError, ValueError) as exc:
        raise Failure(
            description=f"this run has no migration recorded in its tags ({exc}): launch the job again",
            allow_retries=False,
        ) from exc


def run_phase_op(
    context: OpExecutionContext,
    laminar: LaminarResource,
    handle: MigrationHandle,
    phase: MigrationPhase,
    *,
    transfer: bool = False,
) -> Output[None]:
    """Drive one phase of the migration in `handle` (or report it, if the sensor drove it already).

    The phase's figures are the output's metadata (no log line: the run page
    shows them with the step). A MigrationError fails the op and the migration.
    """
    recorded = handle.recorded_report(phase)
    if recorded is not None:
        metadata = report_metadata(recorded, transfer=transfer)
        return Output(None, metadata={**metadata, "driven_by": "node_failure_sensor"})
    coordinator = laminar.coordinator(handle.migration_config())
    try:
        report = coordinator.run_phase(PartitionId(handle.partition), handle.migration_id, phase)
    except MigrationError as exc:
        # Recorded Failed so the nodes stop and a retry plans a fresh migration.
        record_failure(coordinator, handle.partition, handle.migration_id, exc)
        raise failure(
            f"migration {handle.migration_id} failed at {phase}", exc, phase=str(phase), **handle.metadata()
        ) from exc
    except EXPECTED_ERRORS as exc:
        raise failure(f"migration {handle.migration_id}: {phase}", exc, phase=str(phase), **handle.metadata()) from exc
    return Output(None, metadata=report_metadata(report, transfer=transfer))


def _phase_op(name: str, phase: MigrationPhase) -> OpDefinition:
    transfer = name in TRANSFER_OPS

    # Order only (Nothing): the migration is in the ledger and the run's tags, so no step
    # writes or reads an output through an IO manager (each would cost events and a file).
    @op(
        name=name,
        description=f"Phase `{phase}`: {_PHASE_DESCRIPTIONS[phase]}",
        ins={"after": In(Nothing)},
        out=Out(Nothing),
        tags={"laminar/phase": str(phase)},
    )
    def _op(context: OpExecutionContext, laminar: LaminarResource) -> Output[None]:
        return run_phase_op(context, laminar, run_handle(context), phase, transfer=transfer)

    return _op


PHASE_OPS: dict[str, OpDefinition] = {name: _phase_op(name, phase) for name, phase in GRACEFUL_OPS.items()}


def default_target(ledger: Ledger, partition: int) -> int:
    """Where `migrate_partition` moves `partition` when no `to_node` is given: the live node other than
    its owner holding the fewest partitions (ties: lowest id). Failure if there is none."""
    rows = ownership_rows(ledger)
    owner = next((int(r["owner"]) for r in rows if int(r["partition"]) == partition), None)
    if owner is None:
        raise Failure(description=f"partition {partition} does not exist", allow_retries=False)
    live = live_node_ids(ledger)
    loads = node_loads({int(r["partition"]): int(r["owner"]) for r in rows}, live)
    target = least_loaded_node(loads, exclude=(owner,))
    if target is None:
        raise Failure(
            description=f"no live node to move partition {partition} to (live: {sorted(live) or 'none'}, "
            f"owner: node {owner}): start a node or give to_node",
            allow_retries=False,
        )
    return target


@op(
    name="plan",
    description="Record the migration (phase `planned`) in the partition's desired state, "
    "or resume the one already in flight to the same node.",
    out=Out(Nothing, is_required=False),
)
def plan(
    context: OpExecutionContext, config: MigratePartitionConfig, laminar: LaminarResource
) -> Iterator[Output[None]]:
    """Plan (or resume) the graceful migration (the library's `plan_move`); no output (the rest
    skipped) if nothing is to move."""
    wait_for_retry_delay(context)
    settings = config.tuning.migration_config()
    coordinator = laminar.coordinator(settings)
    p = PartitionId(config.partition)
    to_node = config.to_node
    if to_node is None:
        to_node = default_target(coordinator.ledger, config.partition)
        context.log.info(
            f"to_node not given: node {to_node}, the live node other than the owner with fewest partitions"
        )
    what = f"cannot plan moving partition {p} to node {to_node}"
    try:
        decision = plan_move(coordinator, config.partition, to_node)
    except EXPECTED_ERRORS as exc:
        raise failure(what, exc, partition=config.partition, to_node=to_node) from exc
    if decision.expired is not None:
        context.log.warning(f"migration {decision.expired.migration_id} was past its deadline: recorded Failed")
    if decision.blocked_by is not None:
        raise Failure(
            description=f"{what}: {decision.reason}",
            metadata={
                "partition": config.partition,
                "to_node": to_node,
                "in_flight": decision.blocked_by.migration_id,
                "error_type": "MigrationEpochConflict",
            },
            allow_retries=False,
        )
    task = decision.task
    if task is None:
        context.log.info(decision.reason)
        return
    handle = MigrationHandle.of(task, settings)
    try:
        report = coordinator.run_phase(p, task.migration_id, MigrationPhase.PLANNED)
    except EXPECTED_ERRORS as exc:
        raise failure(what, exc, partition=config.partition, to_node=to_node) from exc
    remember(context, handle)
    metadata = {**report_metadata(report, transfer="plan" in TRANSFER_OPS), "resumed": decision.resumed}
    yield Output(None, metadata=metadata)


@op(
    name="fence",
    description="Plan the forced migration and fence the dead owner's epoch "
    "(grant epoch N+1 to the new owner), so anything the old owner still does is rejected.",
    out=Out(Nothing, is_required=False),
)
def fence(
    context: OpExecutionContext, config: FailoverPartitionConfig, laminar: LaminarResource
) -> Iterator[Output[None]]:
    """Forced phases `planned` + `released`; no output (the rest skipped) if the owner is alive."""
    wait_for_retry_delay(context)
    settings = config.tuning.migration_config()
    if config.recorded is not None:
        # The sensor fenced (and most likely finished) this failover: report it, drive what is left.
        handle = MigrationHandle.of_recorded(config.partition, config.recorded, settings)
        remember(context, handle)
        outputs = [
            run_phase_op(context, laminar, handle, phase) for phase in (MigrationPhase.PLANNED, MigrationPhase.RELEASED)
        ]
        note = _recorded_note(laminar, config.partition, config.recorded.migration_id)
        context.log.info(note)
        yield Output(None, metadata=_fence_metadata(outputs, note))
        return
    coordinator = laminar.coordinator(settings)
    p = PartitionId(config.partition)
    try:
        decision = prepare_failover(
            coordinator, config.partition, config.to_node, allow_live_owner=config.allow_live_owner
        )
    except EXPECTED_ERRORS as exc:
        raise failure(
            f"cannot fail over partition {p}", exc, partition=config.partition, to_node=config.to_node
        ) from exc
    for superseded in decision.superseded:
        context.log.warning(f"migration {superseded} depended on a dead node: recorded Failed")
    task = decision.task
    if task is None:
        context.log.info(f"partition {p}: {decision.reason}")
        return
    handle = MigrationHandle.of(task, settings)
    remember(context, handle)
    context.log.info(decision.reason)
    phases = [MigrationPhase.PLANNED]
    # A graceful move already past the release only needs its rising phases.
    before_release = not task.phase.reached(MigrationPhase.DOWNLOADING)
    if task.migration_kind == MigrationKind.FORCED or before_release:
        phases.append(MigrationPhase.RELEASED)
    outputs = [run_phase_op(context, laminar, handle, phase) for phase in phases]
    metadata = _fence_metadata(outputs, decision.reason)
    metadata["superseded"] = ", ".join(decision.superseded) or "-"
    yield Output(None, metadata=metadata)


def _recorded_note(laminar: LaminarResource, partition: int, migration_id: str) -> str:
    """What a recorded failover run is: a record of the sensor's work, with when the sensor did it."""
    task = laminar.coordinator().current(PartitionId(partition))
    when = ""
    if task is not None and task.migration_id == migration_id:
        end = task.completed_at or task.updated_at
        when = f" from {task.started_at:%H:%M:%S.%f}"[:-3] + f" to {end:%H:%M:%S.%f}"[:-3] + " UTC"
    return (
        f"records failover {migration_id}, which node_failure_sensor drove{when}, before this run started: "
        "the phase ops show the sensor's figures; this run drives only a phase the sensor left"
    )


def _fence_metadata(outputs: list[Output[None]], decision: str) -> dict[str, Any]:
    """The fence op's metadata: its phases' durations summed, the last phase's detail, the decision."""
    total = 0.0
    for out in outputs:
        value: Any = (out.metadata or {}).get("duration_s")
        total += float(value.value if isinstance(value, MetadataValue) else value or 0.0)
    last = outputs[-1].metadata or {}
    return {"duration_s": MetadataValue.float(round(total, 6)), "detail": last.get("detail", ""), "decision": decision}


# --- the jobs -----------------------------------------------------------------------------


def _migration_job(
    name: str, description: str, config: ConfigMapping, first: OpDefinition, phase_ops: Iterable[str]
) -> JobDefinition:
    """A migration job: `first` plans the move, then one op per phase in `phase_ops`, in order."""

    @job(
        name=name,
        description=description,
        config=config,
        executor_def=in_process_executor,
    )
    def _job() -> None:
        after = first()
        for op_name in phase_ops:
            after = PHASE_OPS[op_name](after)

    return _job


migrate_partition = _migration_job(
    "migrate_partition",
    "Graceful migration of one partition to another node: "
    "plan → drain → checkpoint → upload → release → download → restore → seek → activate.",
    _migrate_config,
    plan,
    GRACEFUL_OPS,
)
failover_partition = _migration_job(
    "failover_partition",
    "Forced migration of a partition whose owner is dead: "
    "fence → download → restore → seek → activate (from the last committed manifest).",
    _failover_config,
    fence,
    RISING_OPS,
)
