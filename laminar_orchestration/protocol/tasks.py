"""Partition migration: the phases, the task record and its configuration.

A migration is a `MigrationTask` stored in the partition's desired-state
record (``ledger/partitions/p/desired.json``, `desired_states`), advanced by compare-and-swap
*before* each phase takes effect. Nodes read that record in their reconcile
loop and carry out only the phase the record allows, then report completion in
their own node record; the coordinator (driven by the Dagster ops or the CLI)
waits on those reports. A crashed orchestrator therefore resumes from the
recorded phase: nothing is repeated that a node already reported done, and a
node never runs ahead of what the record allows.

Graceful:  Planned → Draining → Checkpointing → Uploading → Released →
           Downloading → Restoring → Seeking → Active
Forced:    Planned → Released (old epoch fenced by the coordinator) →
           Downloading → Restoring → Seeking → Active
Any non-terminal phase may go to Failed; phases before Seeking (where the new
owner takes the epoch) may be Cancelled. A record past its deadline
(``started_at + timeout_s``) is failed by whoever finds it, so it never blocks
the partition. The errors of carrying out a phase are in `migration_errors`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from laminar_orchestration.errors import ConflictError
from laminar_orchestration.protocol.records import (
    LedgerError,
    Record,
    new_write_id,
    now,
)


class MigrationPhase(enum.StrEnum):
    """A migration's recorded phase. The predicates below are the one place phase order is decided."""

    PLANNED = "planned"
    DRAINING = "draining"
    CHECKPOINTING = "checkpointing"
    UPLOADING = "uploading"
    RELEASED = "released"
    DOWNLOADING = "downloading"
    RESTORING = "restoring"
    SEEKING = "seeking"
    ACTIVE = "active"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def reached(self, other: MigrationPhase) -> bool:
        """Whether a move recorded at this phase has got to `other` (or past it).

        Progress follows the graceful order; a forced move skips phases but never
        reorders them, so one order serves both kinds. Failed and Cancelled are
        off that order: they reach only themselves.
        """
        mine, theirs = _PROGRESS.get(self), _PROGRESS.get(other)
        if mine is None or theirs is None:
            return self == other
        return mine >= theirs

    @property
    def needs_old_owner(self) -> bool:
        """Carried out by the old owner (drain, checkpoint, upload, release); the others by the new owner."""
        return self in (
            MigrationPhase.DRAINING,
            MigrationPhase.CHECKPOINTING,
            MigrationPhase.UPLOADING,
            MigrationPhase.RELEASED,
        )

    @property
    def is_terminal(self) -> bool:
        """Active, Failed or Cancelled: the record takes no further phase."""
        return self in (MigrationPhase.ACTIVE, MigrationPhase.FAILED, MigrationPhase.CANCELLED)

    @property
    def is_aborted(self) -> bool:
        """Failed or Cancelled: the move ended without completing."""
        return self in (MigrationPhase.FAILED, MigrationPhase.CANCELLED)

    @property
    def cancellable(self) -> bool:
        """Before Seeking, where the new owner takes the epoch: cancelling later could strand it."""
        return not self.is_terminal and not self.reached(MigrationPhase.SEEKING)


GRACEFUL_PHASES: tuple[MigrationPhase, ...] = (
    MigrationPhase.PLANNED,
    MigrationPhase.DRAINING,
    MigrationPhase.CHECKPOINTING,
    MigrationPhase.UPLOADING,
    MigrationPhase.RELEASED,
    MigrationPhase.DOWNLOADING,
    MigrationPhase.RESTORING,
    MigrationPhase.SEEKING,
    MigrationPhase.ACTIVE,
)
FORCED_PHASES: tuple[MigrationPhase, ...] = (
    MigrationPhase.PLANNED,
    MigrationPhase.RELEASED,
    MigrationPhase.DOWNLOADING,
    MigrationPhase.RESTORING,
    MigrationPhase.SEEKING,
    MigrationPhase.ACTIVE,
)
#: Position of each phase in a move's progress (`MigrationPhase.reached`).
_PROGRESS = {phase: i for i, phase in enumerate(GRACEFUL_PHASES)}


class MigrationKind(enum.StrEnum):
    GRACEFUL = "graceful"
    FORCED = "forced"

    @property
    def grant_phase(self) -> MigrationPhase:
        """The phase whose record lets the coordinator grant the new epoch to the target: the fence
        (Released) of a forced move, Seeking of a graceful one (after the old owner released).
        Once it is recorded the grant is decided: a move that ends unfinished completes it first."""
        return MigrationPhase.SEEKING if self == MigrationKind.GRACEFUL else MigrationPhase.RELEASED


def phase_sequence(kind: MigrationKind) -> tuple[MigrationPhase, ...]:
    return GRACEFUL_PHASES if kind == MigrationKind.GRACEFUL else FORCED_PHASES


def check_transition(kind: MigrationKind, current: MigrationPhase, target: MigrationPhase) -> None:
    """The one function that decides which phase changes are allowed.

    Linear and non-reversible: only the next phase of the kind's sequence,
    Failed from any non-terminal phase, Cancelled before Seeking. Up to
    Restoring the new owner has taken no epoch (it adopts only once Seeking is
    recorded). A move that ends at or after its kind's `grant_phase` has its
    grant completed first, so the target it names always holds the new epoch
    and becomes the desired owner.
    """
    if current.is_terminal:
        raise InvalidTransition(kind, current, target)
    if target == MigrationPhase.FAILED:
        return
    if target == MigrationPhase.CANCELLED:
        if current.cancellable:
            return
        raise InvalidTransition(kind, current, target)
    seq = phase_sequence(kind)
    if current in seq and target in seq and seq.index(target) == seq.index(current) + 1:
        return
    raise InvalidTransition(kind, current, target)


# --- records ------------------------------------------------------------------


class MigrationConfig(BaseModel):
    """Timeouts and limits of migrations; the defaults keep a planned move within seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    migration_timeout_s: float = Field(default=30.0, gt=0)
    release_wait_timeout_s: float = Field(default=15.0, gt=0)
    checkpoint_transfer_timeout_s: float = Field(default=30.0, gt=0)
    max_concurrent_migrations: int = Field(default=2, ge=1)
    #: A node's failover asks nothing of the dead node: each target restores this many partitions at once
    #: (a forced move mostly waits on the store's round trips, so more at once finish sooner).
    max_concurrent_failovers: int = Field(default=16, ge=1)
    max_retries: int = Field(default=3, ge=0)
    retry_delay_s: float = Field(default=5.0, ge=0)
    #: A graceful move asks the old owner to drain once the target's warm copy is within this many
    #: committed events (or after `warmup_timeout_s`), so the handoff applies only a few deltas.
    warm_lag_events: int = Field(default=10_000, ge=0)
    warmup_timeout_s: float = Field(default=10.0, ge=0)
    #: Then the drain is asked for right after the old owner's next data commit (waiting at most this
    #: long, and at most three of its commit intervals; 0 = at once): its output stops as late as possible
    #: and the batch the drain abandons has barely begun. A partition with no commit due drains at once.
    drain_alignment_s: float = Field(default=1.0, ge=0)

    @model_validator(mode="after")
    def _whole_move_covers_a_phase(self) -> MigrationConfig:
        # Set alone, a timeout is capped by the other; set together, a phase longer than the move contradicts it.
        for phase in ("release_wait_timeout_s", "checkpoint_transfer_timeout_s"):
            whole, part = self.migration_timeout_s, getattr(self, phase)
            if {"migration_timeout_s", phase} <= self.model_fields_set and whole < part:
                raise ValueError(
                    f"migration_timeout_s ({whole:g} s, the whole move) is below {phase} ({part:g} s, one phase): "
                    f"raise migration_timeout_s to at least {part:g} or lower {phase}"
                )
        return self


class MigrationTask(Record):
    """One partition move, persisted in the partition's desired-state record."""

    kind: Literal["migration-task"] = "migration-task"
    migration_id: str
    partition: int = Field(ge=0)
    migration_kind: MigrationKind
    from_node: int = Field(ge=0)
    to_node: int = Field(ge=1)
    from_epoch: int = Field(ge=0)
    to_epoch: int = Field(ge=1)
    phase: MigrationPhase
    #: For Failed (and Cancelled): the phase it ended in, and why.
    failed_phase: MigrationPhase | None = None
    error: str | None = None
    commit_ulid: str | None = None
    source_offset: int | None = None
    started_at: datetime
    updated_at: datetime
    completed_at: datetime | None = None
    timeout_s: float = Field(gt=0)
    #: What the target downloaded while warming up, before the drain (the plan's share of the move).
    warm_bytes: int = Field(default=0, ge=0)
    attempt: int = Field(default=1, ge=1)
    write_id: str = Field(default_factory=new_write_id)

    @property
    def is_terminal(self) -> bool:
        return self.phase.is_terminal


# --- errors of the phase machine ----------------------------------------------


class MigrationError(LedgerError):
    """Base of migration errors: one type per phase that can fail, plus the record conflicts."""


class InvalidTransition(MigrationError, ConflictError):
    kind: MigrationKind
    current: MigrationPhase
    target: MigrationPhase

    message = "{kind} migration cannot go from {current} to {target}"


@dataclass(frozen=True)
class PhaseReport:
    """What one phase did, for the Dagster op's metadata."""

    phase: MigrationPhase
    duration_s: float
    bytes_moved: int
    detail: str


def new_migration_id(partition: int, from_epoch: int) -> str:
    return f"p{partition}-e{from_epoch}-{int(now().timestamp() * 1000)}"


def deadline_passed(task: MigrationTask, at: datetime | None = None) -> bool:
    """True when `task`'s overall deadline (``started_at + timeout_s``) is behind `at` (default now)."""
    return (at or now()) - task.started_at > timedelta(seconds=task.timeout_s)


def seconds_left(task: MigrationTask, at: datetime | None = None) -> float:
    """Seconds until `task`'s overall deadline (negative once it passed)."""
    return task.timeout_s - ((at or now()) - task.started_at).total_seconds()
