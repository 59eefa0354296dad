"""Pieces shared by the migration jobs: config, the handle passed between ops, failures, tags."""

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagster import Config, Failure, MetadataValue, OpExecutionContext
from pydantic import Field

from laminar_orchestration.errors import LaminarError
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationPhase, MigrationTask, PhaseReport
from laminar_orchestration.sizes import human_size

#: Run tags (the sensors read and write them).
PARTITION_TAG = "laminar/partition"
MIGRATION_ID_TAG = "laminar/migration_id"
#: 1-based attempt number of a migration launched again by the run-failure sensor.
ATTEMPT_TAG = "laminar/attempt"
RETRY_OF_TAG = "laminar/retry_of"
#: Unix time before which a retried run must not start its migration (the retry delay).
NOT_BEFORE_TAG = "laminar/not_before"
#: What a migration run moves, set by its first op (so runs can be filtered by them); a failover's
#: run gets them from the sensor that requests it (from: the dead owner and the epoch it held).
FROM_NODE_TAG = "laminar/from_node"
TO_NODE_TAG = "laminar/to_node"
FROM_EPOCH_TAG = "laminar/from_epoch"
TO_EPOCH_TAG = "laminar/to_epoch"
#: The run config key of a migration job's optional limits (named to sort after the required fields,
#: as the Launchpad lists fields by name).
TUNING_KEY = "tuning"
#: Ops that move state between nodes, the only ones whose metadata carries `bytes_moved`: the
#: target's warm-up (plan), the old owner's final upload and the new owner's download. Their sum is the move's.
TRANSFER_OPS = frozenset({"plan", "upload", "download"})
#: Longest a run waits for NOT_BEFORE_TAG, whatever the tag says (a typo must not hang a run).
MAX_RETRY_WAIT_S = 600.0

#: Errors an op turns into a Dagster `Failure` with a one-line message.
EXPECTED_ERRORS: tuple[type[Exception], ...] = (LaminarError,)


class MigrationLimits(Config):
    """Optional MigrationConfig overrides (unset: the default), `tuning` in the Launchpad."""

    migration_timeout_s: float | None = Field(
        default=None, gt=0, description="Maximum time of the whole migration (default 30 s)."
    )
    release_wait_timeout_s: float | None = Field(
        default=None, gt=0, description="Maximum wait for each old-owner phase (default 15 s)."
    )
    checkpoint_transfer_timeout_s: float | None = Field(
        default=None, gt=0, description="Maximum wait for each new-owner phase (default 30 s)."
    )
    max_retries: int | None = Field(
        default=None, ge=0, description="Failed runs the retry sensor re-launches (default 3)."
    )
    retry_delay_s: float | None = Field(
        default=None, ge=0, description="Delay before a re-launched run starts (default 5 s)."
    )

    def migration_config(self, **overrides: Any) -> MigrationConfig:
        """The MigrationConfig these limits (and `overrides`) describe."""
        values = {k: v for k, v in {**self.model_dump(), **overrides}.items() if v is not None}
        return MigrationConfig(**values)


def limits_from_run_config(run_config: Mapping[str, Any]) -> MigrationLimits:
    """The `tuning` section of a job's run config (as stored on the run; `limits` before it was renamed),
    defaults if absent."""
    raw = run_config.get(TUNING_KEY) or run_config.get("limits") or {}
    return MigrationLimits(**raw) if isinstance(raw, Mapping) else MigrationLimits()


class RecordedPhase(Config):
    """One phase another driver (the node-failure sensor) already carried out, as it reported it."""

    phase: str = Field(description="The migration phase (planned, released, downloading, ...).")
    duration_s: float = Field(ge=0, description="How long the phase took, in seconds.")
    bytes_moved: int = Field(default=0, ge=0, description="Bytes of state the phase moved.")
    detail: str = Field(default="", description="What the phase did, as its driver reported it.")


class RecordedFailover(Config):
    """A failover the node-failure sensor fenced and drove: the run shows these phases and drives the rest."""

    migration_id: str = Field(description="The failover's migration id in the ledger.")
    from_node: int = Field(description="The dead owner.")
    to_node: int = Field(description="The node the partition was failed over to.")
    from_epoch: int = Field(description="The dead owner's epoch (fenced).")
    to_epoch: int = Field(description="The new owner's epoch.")
    phases: list[RecordedPhase] = Field(
        default_factory=list, description="The phases the sensor drove, in order (the run drives the rest)."
    )


@dataclass(frozen=True)
class MigrationHandle:
    """What each op passes to the next: which migration, the limits to drive it with, phases already done."""

    partition: int
    migration_id: str
    kind: str
    from_node: int
    to_node: int
    from_epoch: int
    to_epoch: int
    config: dict[str, Any]
    #: Phase -> (duration_s, bytes_moved, detail) of phases driven before the run (by the sensor).
    recorded: tuple[tuple[str, float, int, str], ...] = ()

    @classmethod
    def of(cls, task: MigrationTask, config: MigrationConfig) -> "MigrationHandle":
        """The handle of `task`, driven with `config`."""
        return cls(
            partition=task.partition,
            migration_id=task.migration_id,
            kind=str(task.migration_kind),
            from_node=task.from_node,
            to_node=task.to_node,
            from_epoch=task.from_epoch,
            to_epoch=task.to_epoch,
            config=config.model_dump(exclude_unset=True),
        )

    @classmethod
    def of_recorded(cls, partition: int, recorded: RecordedFailover, config: MigrationConfig) -> "MigrationHandle":
        """The handle of a failover the sensor drove (its phases are reported, not driven again)."""
        return cls(
            partition=partition,
            migration_id=recorded.migration_id,
            kind="forced",
            from_node=recorded.from_node,
            to_node=recorded.to_node,
            from_epoch=recorded.from_epoch,
            to_epoch=recorded.to_epoch,
            config=config.model_dump(exclude_unset=True),
            recorded=tuple((r.phase, r.duration_s, r.bytes_moved, r.detail) for r in recorded.phases),
        )

    def migration_config(self) -> MigrationConfig:
        """The limits the migration is driven with."""
        return MigrationConfig(**self.config)

    def recorded_report(self, phase: MigrationPhase) -> PhaseReport | None:
        """The report of `phase` if it was driven before the run, else None."""
        for name, duration, moved, detail in self.recorded:
            if name == str(phase):
                return PhaseReport(phase, duration, moved, detail)
        return None

    def metadata(self) -> dict[str, Any]:
        """Identifying fields (for failure metadata; a run shows them as tags)."""
        return {
            "partition": self.partition,
            "migration_id": self.migration_id,
            "migration_kind": self.kind,
            "from_node": self.from_node,
            "to_node": self.to_node,
            "from_epoch": self.from_epoch,
            "to_epoch": self.to_epoch,
        }

    def tags(self) -> dict[str, str]:
        """The run tags naming this migration."""
        return {
            PARTITION_TAG: str(self.partition),
            MIGRATION_ID_TAG: self.migration_id,
            FROM_NODE_TAG: str(self.from_node),
            TO_NODE_TAG: str(self.to_node),
            FROM_EPOCH_TAG: str(self.from_epoch),
            TO_EPOCH_TAG: str(self.to_epoch),
        }

    @classmethod
    def from_tags(cls, tags: Mapping[str, str], config: MigrationConfig, kind: str = "") -> "MigrationHandle":
        """The handle whose `tags` a run (of a `kind` migration) carries; KeyError or ValueError if one is
        missing or malformed."""
        return cls(
            partition=int(tags[PARTITION_TAG]),
            migration_id=tags[MIGRATION_ID_TAG],
            kind=kind,
            from_node=int(tags[FROM_NODE_TAG]),
            to_node=int(tags[TO_NODE_TAG]),
            from_epoch=int(tags[FROM_EPOCH_TAG]),
            to_epoch=int(tags[TO_EPOCH_TAG]),
            config=config.model_dump(exclude_unset=True),
        )


#: What each transfer op's `bytes_moved` counts: three different transfers, so their figures differ.
BYTES_COUNTED = {
    MigrationPhase.PLANNED: "state the target node downloaded while warming up, before the drain",
    MigrationPhase.UPLOADING: "state snapshot the old owner published at the drain, a background upload "
    "that had finished (0 when none had: each commit's state delta is in the store already)",
    MigrationPhase.DOWNLOADING: "state the target node downloaded after the drain, beyond what its warm-up had",
}


def report_metadata(report: PhaseReport, *, transfer: bool) -> dict[str, Any]:
    """Op output metadata for one phase: duration in seconds first, then (on a transfer op only) the
    bytes moved as a size and as the exact count, then the detail (what the phase did) and, on a
    transfer op, what its bytes count."""
    # Milliseconds are what a phase's time is read in; more digits are noise on the run page.
    metadata: dict[str, Any] = {"duration_s": MetadataValue.float(round(report.duration_s, 3))}
    if transfer:
        metadata["bytes_moved"] = MetadataValue.int(report.bytes_moved)
        metadata["size_moved"] = MetadataValue.text(human_size(report.bytes_moved))
    metadata["detail"] = MetadataValue.text(report.detail)
    if transfer and report.phase in BYTES_COUNTED:
        metadata["bytes_counted"] = MetadataValue.text(BYTES_COUNTED[report.phase])
    return metadata


def failure(what: str, exc: BaseException, **metadata: Any) -> Failure:
    """A Dagster Failure naming the step and the cause in one line, with the details as metadata.

    allow_retries=False: retrying is the run-failure sensor's job, with the
    migration's own retry budget and delay, not a blind op-level retry.
    """
    return Failure(
        description=f"{what}: {type(exc).__name__}: {exc}",
        metadata={
            **{k: v for k, v in metadata.items() if v is not None},
            "error_type": type(exc).__name__,
            "error": str(exc),
        },
        allow_retries=False,
    )


def wait_for_retry_delay(context: OpExecutionContext) -> None:
    """Sleep until the run's NOT_BEFORE_TAG time (set by the retry sensor), if any."""
    raw = context.run.tags.get(NOT_BEFORE_TAG)
    if not raw:
        return
    try:
        delay = float(raw) - time.time()
    except ValueError:
        context.log.warning(f"ignoring malformed {NOT_BEFORE_TAG} tag {raw!r}")
        return
    if delay > 0:
        delay = min(delay, MAX_RETRY_WAIT_S)
        context.log.info(f"retry delay: waiting {delay:.1f}s before starting")
        time.sleep(delay)


def tag_run(context: OpExecutionContext, tags: dict[str, str]) -> None:
    """Add tags to the running run (so the UI can filter runs by migration id)."""
    try:
        context.instance.add_run_tags(context.run_id, tags)
    except Exception as exc:  # a cosmetic feature must never fail a migration
        context.log.warning(f"could not tag the run: {exc}")
