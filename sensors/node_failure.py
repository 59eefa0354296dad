"""``node_failure_sensor``: a dead owner's partitions are failed over by the sensor itself.

Dagster's daemon evaluates sensors every 5 s, and launching a run costs a new
process loading the code location (seconds more on a busy machine). Neither
belongs on the path of a failover, so the sensor does the failover's critical
part within its own evaluation. Every decision is the library's
(`laminar_orchestration.control.dead_owners`); this module only translates
them into run requests, asset events and a cursor:

1. **Detect** (`wait_for_suspects`). Each evaluation watches the owning nodes
   for most of the daemon's 5 s between evaluations, reading a node's record
   again only when its last heartbeat would lapse (about one read a node per
   timeout): a node is declared dead within ~0.1 s of its timeout, not up to
   5 s later at the next tick.
2. **Fail over** (`plan_failovers`, `drive_failovers`). For each partition of
   a dead owner (target: a live node with a warm copy, else the least-loaded
   one), plan the forced migration, fence the old epoch and drive download →
   restore → seek → active with the new owner, all partitions at once, within
   `DRIVE_BUDGET_S`. A grant whose granter died before sealing the manifest
   chain (the ownership head lags it) is completed on the way.
3. **Record.** One ``failover_partition`` run per partition (run key
   ``failover-p{partition}-e{epoch}``, so one node death never makes two)
   shows the phases the sensor drove, with their durations, and drives any
   phase the sensor left (budget spent, error) with the migration's full
   limits. The ownership observation and the ``partitions_on_live_nodes``
   check are reported before (the dead owner) and after the failover.

A migration whose driver stops anywhere is resumed from its record by the run.
"""

import json
import os
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetObservation,
    DagsterInvariantViolationError,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets import live_owners_evaluation, ownership_observation
from jobs import (
    FROM_EPOCH_TAG,
    FROM_NODE_TAG,
    MIGRATION_ID_TAG,
    PARTITION_TAG,
    TO_EPOCH_TAG,
    TO_NODE_TAG,
    failover_partition,
)
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.dead_owners import (
    FULL_LOOK_S,
    DrivenFailover,
    LookFocus,
    PlannedFailover,
    drive_failovers,
    look_focus,
    plan_failovers,
    wait_for_suspects,
)
from laminar_orchestration.control.moves import reinstate_all
from laminar_orchestration.control.ownership import ownership_rows, ownership_rows_patched, patch_rows
from laminar_orchestration.protocol.ledger import ClusterNotInitialized, Ledger
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.protocol.tasks import MigrationPhase
from resources import LaminarResource

__all__ = [
    "DRIVE_BUDGET_S",
    "HEARTBEAT_TIMEOUT_ENV",
    "WATCH_S",
    "build_node_failure_sensor",
    "evaluate",
    "failover_run_config",
    "failover_run_key",
    "node_failure_sensor",
]

#: Heartbeat timeout the failure sensor uses instead of each node's own (unset: the node's).
HEARTBEAT_TIMEOUT_ENV = "LAMINAR_FAILOVER_HEARTBEAT_TIMEOUT_S"
#: Longest the sensor drives failovers itself; the runs drive whatever is left.
DRIVE_BUDGET_S = 20.0
#: How long one evaluation watches the nodes: the daemon starts an evaluation every 5 s if the last
#: one ended, so a watch a little shorter leaves only the evaluation's own work unwatched.
WATCH_S = 4.0


def failover_run_key(partition: int, epoch: int) -> str:
    """Run key of the failover of `partition` away from its owner at `epoch`: one per node death."""
    return f"failover-p{partition}-e{epoch}"


# --- the sensor ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Cursor:
    """What one evaluation hands the next: the failovers requested, each node's generation as seen,
    and when every partition was last looked at (unix seconds)."""

    handled: frozenset[tuple[int, int]] = frozenset()
    generations: Mapping[int, int] | None = None
    full_look_at: float = 0.0
    dead: frozenset[int] = frozenset()
    unplaced: frozenset[int] = frozenset()


def _decode_cursor(cursor: str | None) -> _Cursor:
    if not cursor:
        return _Cursor()
    try:
        data = json.loads(cursor)
        handled = frozenset((int(p), int(e)) for p, e in data.get("handled", []))
        raw = data.get("generations")
        generations = None if raw is None else {int(n): int(g) for n, g in raw.items()}
        return _Cursor(
            handled,
            generations,
            float(data.get("full_look_at", 0.0)),
            frozenset(int(n) for n in data.get("dead", [])),
            frozenset(int(p) for p in data.get("unplaced", [])),
        )
    except (ValueError, TypeError, AttributeError):
        return _Cursor()  # a mangled cursor costs a look at every partition and a deduplicated request


def _encode_cursor(
    handled: Collection[tuple[int, int]],
    focus: LookFocus | None = None,
    full_look_at: float = 0.0,
    unplaced: Collection[int] = (),
) -> str:
    data: dict[str, Any] = {"handled": sorted([p, e] for p, e in handled)}
    if focus is not None:
        data["generations"] = {str(n): g for n, g in sorted(focus.generations.items())}
        data["full_look_at"] = full_look_at
        data["dead"] = sorted(focus.dead)
        data["unplaced"] = sorted(unplaced)
    return json.dumps(data)


def _ownership_events(
    ledger: Ledger, rows: list[dict[str, Any]] | None = None
) -> list[AssetObservation | AssetCheckEvaluation]:
    rows = ownership_rows(ledger) if rows is None else rows
    return [ownership_observation(ledger, rows), live_owners_evaluation(rows)]


def _failed_over(driven: Collection[DrivenFailover]) -> dict[int, dict[str, Any]]:
    """The ownership rows of the partitions the failovers fenced, as the failovers ended."""
    moved = {}
    for d in driven:
        fenced = any(r.phase == MigrationPhase.RELEASED for r in d.reports)
        if d.migration_id is None or not fenced:
            continue  # not fenced here (an error first): the partition's row stays as it was
        last = d.reports[-1].phase if d.reports else MigrationPhase.RELEASED
        moved[d.planned.partition] = {
            "partition": d.planned.partition,
            "epoch": d.to_epoch,
            "owner": d.to_node,
            "status": PartitionStatus.ACTIVE.value,
            "owner_alive": True,
            "migration": "" if d.done else f"{d.migration_id} ({last})",
            "failure": "",  # every row has every column of the map (a new owner has reported no failure)
        }
    return moved


def _dead_owner_rows(failovers: Collection[PlannedFailover]) -> dict[int, dict[str, Any]]:
    """The ownership rows of the dead owners' partitions, as the plan found them."""
    return {
        f.partition: {
            "partition": f.partition,
            "epoch": f.epoch,
            "owner": f.failed_node,
            "status": PartitionStatus.ACTIVE.value,
            "owner_alive": False,
            "migration": "",
            "failure": "",
        }
        for f in failovers
    }


def failover_run_config(driven: DrivenFailover) -> dict[str, Any]:
    """The ``failover_partition`` run config recording `driven` (the run drives what is left)."""
    p = driven.planned
    config: dict[str, Any] = {"partition": p.partition, "to_node": driven.to_node or p.to_node}
    if driven.migration_id is not None:
        config["recorded"] = {
            "migration_id": driven.migration_id,
            "from_node": p.failed_node,
            "to_node": driven.to_node,
            "from_epoch": driven.from_epoch,
            "to_epoch": driven.to_epoch,
            "phases": [
                {
                    "phase": str(r.phase),
                    "duration_s": round(r.duration_s, 6),
                    "bytes_moved": r.bytes_moved,
                    "detail": r.detail,
                }
                for r in driven.reports
            ],
        }
    return config


def _run_request(driven: DrivenFailover) -> RunRequest:
    p = driven.planned
    # What a user filters runs by: the partition, the move's nodes and epochs, its migration id.
    tags = {PARTITION_TAG: str(p.partition), FROM_NODE_TAG: str(p.failed_node), FROM_EPOCH_TAG: str(p.epoch)}
    if driven.migration_id is not None:
        moved = {MIGRATION_ID_TAG: driven.migration_id, TO_NODE_TAG: str(driven.to_node)}
        tags |= {**moved, TO_EPOCH_TAG: str(driven.to_epoch)}
    return RunRequest(
        run_key=failover_run_key(p.partition, p.epoch),
        job_name=failover_partition.name,
        run_config=failover_run_config(driven),
        tags=tags,
    )


def evaluate(
    ledger: Ledger,
    cursor: str | None,
    *,
    heartbeat_timeout_s: float | None,
    log: Callable[[str], None],
    watch_s: float = WATCH_S,
    budget_s: float = DRIVE_BUDGET_S,
    report: Callable[[AssetObservation | AssetCheckEvaluation], None] | None = None,
) -> SensorResult | SkipReason:
    """One evaluation of the node-failure sensor (the sensor without Dagster's context).

    `report` records an asset event at once (the instance's `report_runless_asset_event`): the dead
    owner and the failing check are recorded when the death is detected, before the failover, rather
    than with the sensor's result after it. None: they come with the result.
    """
    previous = _decode_cursor(cursor)
    wait_for_suspects(ledger, heartbeat_timeout_s=heartbeat_timeout_s, watch_s=watch_s, known_dead=previous.dead)
    # Every partition now and then; in between only those of the nodes that joined, restarted or died.
    full = time.time() - previous.full_look_at >= FULL_LOOK_S
    focus = look_focus(
        ledger,
        previous.generations,
        full=full,
        heartbeat_timeout_s=heartbeat_timeout_s,
        seen_dead=previous.dead,
        unplaced=previous.unplaced,
    )
    # A death seen: the next look reads every partition (what its records did not name).
    full_look_at = time.time() if focus.full else (0.0 if focus.full_next else previous.full_look_at)
    # Only the control plane grants: a restarted node's released partitions go back to it here.
    for partition, epoch in reinstate_all(MigrationCoordinator(ledger), focus.grant_back).items():
        log(f"p{partition}: granted back to its desired owner at epoch {epoch}")
    plan = plan_failovers(ledger, previous.handled, heartbeat_timeout_s=heartbeat_timeout_s, partitions=focus.fail_over)
    for partition, epoch in plan.completed_grants.items():
        log(f"p{partition}: completed the grant at epoch {epoch}, whose granter died before sealing it")
    for note in plan.skipped:
        log(note)
    # The failovers requested for partitions this look did not read stay requested.
    unread = {h for h in previous.handled if focus.fail_over is not None and h[0] not in focus.fail_over}
    new_cursor = _encode_cursor(plan.handled | unread, focus, full_look_at, plan.unplaced)
    if not plan.failovers:
        if new_cursor == cursor:
            return SkipReason("; ".join(plan.skipped) or "every partition's owner is alive")
        reason = (
            "nothing to fail over" if plan.handled | unread != previous.handled else "every partition's owner is alive"
        )
        return SensorResult(cursor=new_cursor, skip_reason="; ".join(plan.skipped) or reason)
    # The dead owner, as an operator sees it: from the rows this process read last. Never a read of
    # every partition before the failovers: with none kept, the map is read after them.
    dead = _dead_owner_rows(plan.failovers)
    known = ownership_rows_patched(ledger, dead)
    before = _ownership_events(ledger, known) if known is not None else []
    if report is not None:
        for event in before:
            report(event)
        before = []
    driven = drive_failovers(ledger, plan.failovers, budget_s=budget_s, heartbeat_timeout_s=heartbeat_timeout_s)
    if known is None:
        after_rows = ownership_rows(ledger)
        before = _ownership_events(ledger, patch_rows(after_rows, dead))
        if report is not None:
            for event in before:
                report(event)
            before = []
    else:
        after_rows = patch_rows(known, _failed_over(driven))  # as the failovers ended: nothing read
    for d in driven:
        p = d.planned
        what = "active" if d.done else f"left to its run ({d.left_to_run})"
        log(f"p{p.partition}: node {p.failed_node} dead, failover to node {d.to_node or p.to_node}: {what}")
    return SensorResult(
        run_requests=[_run_request(d) for d in driven],
        cursor=new_cursor,
        asset_events=[*before, *_ownership_events(ledger, after_rows)],
    )


def _reporter(context: SensorEvaluationContext) -> Callable[[AssetObservation | AssetCheckEvaluation], None] | None:
    """The instance's way to record an asset event now; None for a context without an instance (tests)."""
    try:
        return context.instance.report_runless_asset_event
    except DagsterInvariantViolationError:
        return None


def build_node_failure_sensor(
    *,
    name: str = "node_failure_sensor",
    heartbeat_timeout_s: float | None = None,
    minimum_interval_seconds: int = 1,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    watch_s: float = WATCH_S,
    drive_budget_s: float = DRIVE_BUDGET_S,
) -> SensorDefinition:
    """The node-failure sensor; `heartbeat_timeout_s` overrides each node's own timeout.

    `watch_s` bounds the watch of the nodes, `drive_budget_s` the failovers the sensor drives itself.
    """

    @sensor(
        name=name,
        job=failover_partition,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="Fails over each partition whose owner stopped heartbeating — fence, download, restore, "
        "seek, active, driven by the sensor itself — and records it as a failover_partition run "
        "(run key failover-p{partition}-e{epoch}).",
    )
    def _sensor(context: SensorEvaluationContext, laminar: LaminarResource) -> SensorResult | SkipReason:
        try:
            return evaluate(
                laminar.ledger(),
                context.cursor,
                heartbeat_timeout_s=heartbeat_timeout_s,
                log=context.log.info,
                watch_s=watch_s,
                budget_s=drive_budget_s,
                report=_reporter(context),
            )
        except ClusterNotInitialized as exc:
            return SkipReason(str(exc))

    return _sensor


def _timeout_from_env() -> float | None:
    raw = os.environ.get(HEARTBEAT_TIMEOUT_ENV, "").strip()
    return float(raw) if raw else None


node_failure_sensor = build_node_failure_sensor(heartbeat_timeout_s=_timeout_from_env())
