"""What to do about a failed migration: retry it, turn it into a failover, or give up.

`RetryPolicy.decide` is the policy itself, pure: it judges a failed migration
against the partition's ownership and the live nodes. `decide_retry` reads
those from the ledger first (failing a record past its deadline, which would
block the retry). The Dagster run-failure sensor turns the decision into a run
request; nothing here imports Dagster.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Collection
from dataclasses import dataclass

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.failover import stranded
from laminar_orchestration.control.snapshot import live_node_ids
from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationKind

__all__ = ["FailedMigration", "RetryAction", "RetryDecision", "RetryPolicy", "decide_retry"]


class RetryAction(enum.StrEnum):
    """What becomes of a failed migration."""

    #: The same migration again, later (`RetryDecision.not_before`).
    RETRY = "retry"
    #: A failover instead: the old owner of a graceful move died.
    FAILOVER = "failover"
    #: Nothing: done already, not needed any more, or out of retries.
    STOP = "stop"


@dataclass(frozen=True)
class FailedMigration:
    """A migration whose driver (a run) failed, as the driver was asked to carry it out."""

    kind: MigrationKind
    partition: int
    #: The target it was given (None: the driver picks one).
    to_node: int | None = None
    #: 1-based attempt number of the failed driver.
    attempt: int = 1
    #: A failover asked to fence an owner that still heartbeats.
    allow_live_owner: bool = False
    #: How messages name it (e.g. the job's name); default: "<kind> migration".
    label: str = ""

    def name(self) -> str:
        """The name messages use."""
        return self.label or f"{self.kind} migration"


@dataclass(frozen=True)
class RetryDecision:
    """The policy's answer for one failed migration."""

    action: RetryAction
    partition: int
    #: Why (for STOP) or what (otherwise), for logs.
    reason: str
    #: RETRY: the target to keep (None: let the driver pick one); FAILOVER: the live target of the failed move.
    to_node: int | None = None
    #: FAILOVER: the dead owner and the epoch it holds (one failover per owner's epoch).
    failed_node: int = 0
    epoch: int = 0
    #: RETRY: the attempt number of the retry and the time (`time.time()`) before which it must not start.
    attempt: int = 0
    not_before: float = 0.0


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how soon a failed migration is tried again."""

    max_retries: int = 3
    retry_delay_s: float = 5.0

    @classmethod
    def of(cls, config: MigrationConfig) -> RetryPolicy:
        """The policy of a migration's limits (`max_retries`, `retry_delay_s`)."""
        return cls(max_retries=config.max_retries, retry_delay_s=config.retry_delay_s)

    def decide(
        self, failed: FailedMigration, own: Ownership, live: Collection[int], *, is_stranded: bool, now: float
    ) -> RetryDecision:
        """What to do about `failed`, given the partition's ownership `own`, the `live` nodes and whether
        the owner is `stranded` (it holds an epoch nobody will run there: not done yet).

        * graceful, the old owner dead -> FAILOVER (keeping the target if it is alive);
        * graceful and already on the target, or forced and owned by a live node
          (unless `allow_live_owner`) -> STOP, nothing left to do;
        * fewer than `max_retries` retries so far -> RETRY, `retry_delay_s` after `now`;
          a forced move whose target died is retried without it;
        * otherwise -> STOP, giving up.
        """
        p = failed.partition
        if failed.kind == MigrationKind.GRACEFUL:
            if own.owner == failed.to_node and not is_stranded:
                return RetryDecision(RetryAction.STOP, p, f"partition {p} is already on node {failed.to_node}")
            if own.owner != UNASSIGNED and own.owner not in live:
                target = failed.to_node if failed.to_node in live else None
                reason = f"old owner node {own.owner} of partition {p} is dead: failover"
                return RetryDecision(
                    RetryAction.FAILOVER, p, reason, to_node=target, failed_node=int(own.owner), epoch=own.epoch
                )
        elif own.owner in live and not failed.allow_live_owner and not is_stranded:
            return RetryDecision(
                RetryAction.STOP, p, f"partition {p} is owned by live node {own.owner}: no failover needed"
            )
        if failed.attempt > self.max_retries:
            return RetryDecision(
                RetryAction.STOP,
                p,
                f"{failed.name()} of partition {p} failed {failed.attempt} time(s); max_retries is "
                f"{self.max_retries}: giving up",
            )
        target = failed.to_node
        if failed.kind == MigrationKind.FORCED and target not in live:
            target = None  # its target died too: let the driver pick the least-loaded node
        return RetryDecision(
            RetryAction.RETRY,
            p,
            f"attempt {failed.attempt + 1} of the {failed.name()} of partition {p}",
            to_node=target,
            attempt=failed.attempt + 1,
            not_before=now + self.retry_delay_s,
        )


def decide_retry(
    ledger: Ledger, failed: FailedMigration, policy: RetryPolicy, *, now: float | None = None
) -> RetryDecision:
    """`policy.decide` for `failed`, with the partition's ownership, live nodes and desired state read now.

    A migration record past its deadline would block the retry: whoever finds
    it fails it, so this does. STOP when the partition does not exist.
    """
    p = PartitionId(failed.partition)
    own = ledger.ownership(p)
    if own is None:
        return RetryDecision(RetryAction.STOP, failed.partition, f"partition {failed.partition} does not exist")
    live = live_node_ids(ledger)
    MigrationCoordinator(ledger).expire_overdue(p)
    state = DesiredStates(ledger).read(p)[0]
    return policy.decide(failed, own, live, is_stranded=stranded(state, own), now=time.time() if now is None else now)
