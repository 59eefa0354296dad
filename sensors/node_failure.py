"""``node_failure_sensor``: a dead owner's partitions are failed over by the sensor itself.

Dagster's daemon evaluates sensors every 5 s, and launching a run costs a new
process loading the code location (seconds more on a busy machine). Neither
belongs on the path of a failover, so the sensor does the failover's critical
part within its own evaluation, through the library:

1. **Detect.** Nodes whose heartbeat is late (older than a third of the
   timeout) are watched within the evaluation until they heartbeat again or
   their timeout lapses — a node is declared dead within ~0.2 s of its
   timeout, not up to 5 s later at the next tick.
2. **Fail over.** For each partition of a dead owner (target: a live node with
   a warm copy, else the least-loaded one), plan the forced migration, fence
   the old epoch and drive download → restore → seek → active with the new
   owner, all partitions at once, within `DRIVE_BUDGET_S`.
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
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetObservation,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets import live_owners_evaluation, ownership_observation, ownership_rows
from jobs import EPOCH_TAG, FAILED_NODE_TAG, PARTITION_TAG, failover_partition
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import (
    moves_on_without_old_owner,
    prepare_failover,
    record_failure,
    reinstate_all,
)
from laminar_orchestration.control.placement import failover_target, node_loads
from laminar_orchestration.control.snapshot import live_node_ids, warm_copies
from laminar_orchestration.errors import LaminarError
from laminar_orchestration.identity import UNASSIGNED, PartitionId
from laminar_orchestration.protocol.ledger import ClusterNotInitialized, Ledger
from laminar_orchestration.protocol.tasks import (
    DesiredStates,
    MigrationConfig,
    MigrationError,
    MigrationPhase,
    MigrationTimeout,
    PhaseReport,
    phase_sequence,
)
from resources import LaminarResource

__all__ = [
    "DRIVE_BUDGET_S",
    "HEARTBEAT_TIMEOUT_ENV",
    "DrivenFailover",
    "FailoverScan",
    "build_node_failure_sensor",
    "drive_failovers",
    "failover_run_key",
    "node_failure_sensor",
    "scan_for_failovers",
    "wait_for_suspects",
]

#: Heartbeat timeout the failure sensor uses instead of each node's own (unset: the node's).
HEARTBEAT_TIMEOUT_ENV = "LAMINAR_FAILOVER_HEARTBEAT_TIMEOUT_S"
#: Longest the sensor drives failovers itself; the runs drive whatever is left.
DRIVE_BUDGET_S = 20.0
#: Longest one evaluation watches late nodes (the daemon evaluates sensors every 5 s).
WATCH_S = 5.0
#: How often late nodes are re-read while watched.
WATCH_POLL_S = 0.2


def failover_run_key(partition: int, epoch: int) -> str:
    """Run key of the failover of `partition` away from its owner at `epoch`: one per node death."""
    return f"failover-p{partition}-e{epoch}"


# --- detecting ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedFailover:
    """A partition whose owner is dead, and the live node chosen to take it."""

    partition: int
    epoch: int
    failed_node: int
    to_node: int


@dataclass
class FailoverScan:
    """What one look at the ledger found."""

    failovers: list[PlannedFailover] = field(default_factory=list)
    #: (partition, epoch) pairs a failover was requested for, still current.
    handled: set[tuple[int, int]] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)


def scan_for_failovers(
    ledger: Ledger, handled: set[tuple[int, int]], *, heartbeat_timeout_s: float | None = None
) -> FailoverScan:
    """Find partitions whose owner is dead and pick a target for each new (partition, epoch).

    A partition is left alone when its owner is alive or unassigned, when a
    migration that no longer needs the old owner is in flight (a forced one,
    or a graceful one past the release) towards a live node, or when its
    (partition, epoch) is in `handled`. The target is a live node with a warm
    copy of the partition (a standby), else the least-loaded live node,
    counting the failovers planned in this scan.
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
        if task is not None and moves_on_without_old_owner(task, live):
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
        scan.failovers.append(PlannedFailover(int(p), own.epoch, int(own.owner), target))
    return scan


def wait_for_suspects(
    ledger: Ledger, *, heartbeat_timeout_s: float | None, watch_s: float = WATCH_S, poll_s: float = WATCH_POLL_S
) -> float:
    """Watch owners whose heartbeat is late until each beats again or its timeout lapses (at most `watch_s`).

    Returns the seconds spent. Only owning nodes count: a late node without
    partitions needs no failover.
    """
    started = time.monotonic()
    owners = {int(o.owner) for o in ledger.ownerships(ledger.partitions()).values() if o is not None}
    while time.monotonic() - started < watch_s:
        late = False
        for view in ledger.nodes():
            if view.record.node not in owners:
                continue
            timeout = heartbeat_timeout_s if heartbeat_timeout_s is not None else view.record.heartbeat_timeout_s
            age = view.heartbeat_age_s
            if age > timeout:
                return time.monotonic() - started  # dead now: fail over at once
            late = late or age > timeout / 3
        if not late:
            break
        time.sleep(poll_s)
    return time.monotonic() - started


# --- failing over ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DrivenFailover:
    """One failover as the sensor drove it: its migration, the phases done, and what stopped it."""

    planned: PlannedFailover
    migration_id: str | None = None
    from_epoch: int = 0
    to_epoch: int = 0
    to_node: int = 0
    reports: tuple[PhaseReport, ...] = ()
    #: Why the sensor stopped before Active (budget spent, an error); None when it finished.
    left_to_run: str | None = None

    @property
    def done(self) -> bool:
        return self.left_to_run is None

    def run_config(self) -> dict[str, Any]:
        """The ``failover_partition`` run config recording this failover (the run drives what is left)."""
        config: dict[str, Any] = {"partition": self.planned.partition, "to_node": self.to_node or self.planned.to_node}
        if self.migration_id is not None:
            config["recorded"] = {
                "migration_id": self.migration_id,
                "from_node": self.planned.failed_node,
                "to_node": self.to_node,
                "from_epoch": self.from_epoch,
                "to_epoch": self.to_epoch,
                "phases": [
                    {
                        "phase": str(r.phase),
                        "duration_s": round(r.duration_s, 6),
                        "bytes_moved": r.bytes_moved,
                        "detail": r.detail,
                    }
                    for r in self.reports
                ],
            }
        return config


def _drive_one(
    ledger: Ledger, planned: PlannedFailover, deadline: float, limits: MigrationConfig, live: set[int] | None
) -> DrivenFailover:
    """Fence and drive one forced migration until Active or `deadline` (time.monotonic())."""
    coordinator = MigrationCoordinator(ledger, limits)
    started = time.monotonic()
    try:
        decision = prepare_failover(coordinator, planned.partition, planned.to_node, live=live)
    except LaminarError as exc:
        return DrivenFailover(planned, left_to_run=f"{type(exc).__name__}: {exc}")
    task = decision.task
    if task is None:
        return DrivenFailover(planned, left_to_run=decision.reason)
    result = DrivenFailover(
        planned, task.migration_id, task.from_epoch, task.to_epoch, task.to_node, left_to_run="not started"
    )
    reports: list[PhaseReport] = []
    seq = phase_sequence(task.migration_kind)
    start = seq.index(task.phase) if task.phase in seq else 0
    for phase in seq[max(start, 0) :]:
        left = deadline - time.monotonic()
        # The fence never waits for a node: it is done whatever the budget, so nothing the dead
        # owner may still do is accepted; only the waits for the new owner are bounded.
        if left <= 0 and phase not in (MigrationPhase.PLANNED, MigrationPhase.RELEASED):
            return _with(result, reports, f"the sensor's {DRIVE_BUDGET_S:g}s budget ran out before {phase}")
        # The sensor waits at most its budget; the run then resumes with the migration's own limits.
        wait = max(0.01, min(left, limits.checkpoint_transfer_timeout_s))
        bounded = MigrationCoordinator(ledger, limits.model_copy(update={"checkpoint_transfer_timeout_s": wait}))
        try:
            report = bounded.run_phase(PartitionId(task.partition), task.migration_id, phase)
        except MigrationTimeout as exc:
            return _with(result, reports, f"{type(exc).__name__}: {exc}")
        except MigrationError as exc:
            record_failure(coordinator, task.partition, task.migration_id, exc)
            return _with(result, reports, f"{type(exc).__name__}: {exc}")
        except LaminarError as exc:
            return _with(result, reports, f"{type(exc).__name__}: {exc}")
        if phase == MigrationPhase.PLANNED:
            # The fence follows at once: count the decision (ledger reads) in the first phase.
            report = PhaseReport(phase, time.monotonic() - started, report.bytes_moved, decision.reason)
        reports.append(report)
    return _with(result, reports, None)


def _with(result: DrivenFailover, reports: list[PhaseReport], left: str | None) -> DrivenFailover:
    return DrivenFailover(
        result.planned, result.migration_id, result.from_epoch, result.to_epoch, result.to_node, tuple(reports), left
    )


def drive_failovers(
    ledger: Ledger,
    failovers: Iterable[PlannedFailover],
    *,
    budget_s: float = DRIVE_BUDGET_S,
    limits: MigrationConfig | None = None,
    heartbeat_timeout_s: float | None = None,
) -> list[DrivenFailover]:
    """Drive every failover at once (one thread each) for at most `budget_s`; one result per failover.

    Liveness is judged with `heartbeat_timeout_s` (None: each node's own), as the scan judged it.
    """
    todo = list(failovers)
    if not todo:
        return []
    deadline = time.monotonic() + budget_s
    settings = limits or MigrationConfig()
    live = live_node_ids(ledger, heartbeat_timeout_s=heartbeat_timeout_s)
    with ThreadPoolExecutor(len(todo), thread_name_prefix="failover") as pool:
        return list(pool.map(lambda f: _drive_one(ledger, f, deadline, settings, live), todo))


# --- the sensor ----------------------------------------------------------------------------------


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


def _ownership_events(ledger: Ledger) -> list[AssetObservation | AssetCheckEvaluation]:
    rows = ownership_rows(ledger)
    return [ownership_observation(ledger, rows), live_owners_evaluation(rows)]


def _run_request(driven: DrivenFailover) -> RunRequest:
    p = driven.planned
    return RunRequest(
        run_key=failover_run_key(p.partition, p.epoch),
        job_name=failover_partition.name,
        run_config=driven.run_config(),
        tags={PARTITION_TAG: str(p.partition), FAILED_NODE_TAG: str(p.failed_node), EPOCH_TAG: str(p.epoch)},
    )


def evaluate(
    ledger: Ledger,
    cursor: str | None,
    *,
    heartbeat_timeout_s: float | None,
    log: Callable[[str], None],
    watch_s: float = WATCH_S,
    budget_s: float = DRIVE_BUDGET_S,
) -> SensorResult | SkipReason:
    """One evaluation of the node-failure sensor (the sensor without Dagster's context)."""
    # Only the control plane grants: a restarted node's released partitions go back to it here.
    for partition, epoch in reinstate_all(MigrationCoordinator(ledger)).items():
        log(f"p{partition}: granted back to its desired owner at epoch {epoch}")
    wait_for_suspects(ledger, heartbeat_timeout_s=heartbeat_timeout_s, watch_s=watch_s)
    handled = _decode_cursor(cursor)
    scan = scan_for_failovers(ledger, handled, heartbeat_timeout_s=heartbeat_timeout_s)
    for note in scan.skipped:
        log(note)
    new_cursor = _encode_cursor(scan.handled)
    if not scan.failovers:
        if new_cursor != (cursor or _encode_cursor(set())):
            return SensorResult(cursor=new_cursor, skip_reason="; ".join(scan.skipped) or "nothing to fail over")
        return SkipReason("; ".join(scan.skipped) or "every partition's owner is alive")
    before = _ownership_events(ledger)  # the dead owner, as the operator should see it
    driven = drive_failovers(ledger, scan.failovers, budget_s=budget_s, heartbeat_timeout_s=heartbeat_timeout_s)
    for d in driven:
        p = d.planned
        what = "active" if d.done else f"left to its run ({d.left_to_run})"
        log(f"p{p.partition}: node {p.failed_node} dead, failover to node {d.to_node or p.to_node}: {what}")
    return SensorResult(
        run_requests=[_run_request(d) for d in driven],
        cursor=new_cursor,
        asset_events=[*before, *_ownership_events(ledger)],
    )


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

    `watch_s` bounds the watch of late nodes, `drive_budget_s` the failovers the sensor drives itself.
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
            )
        except ClusterNotInitialized as exc:
            return SkipReason(str(exc))

    return _sensor


def _timeout_from_env() -> float | None:
    raw = os.environ.get(HEARTBEAT_TIMEOUT_ENV, "").strip()
    return float(raw) if raw else None


node_failure_sensor = build_node_failure_sensor(heartbeat_timeout_s=_timeout_from_env())
