"""The control plane's own failovers: every dead owner's partitions, found and moved by its periodic
look (the Dagster failure sensor's).

A look watches the owning nodes until one's heartbeat lapses (`wait_for_suspects`: is a late owner
dead?), picks the partitions it reads (`look_focus`: every partition now and then, in between those of
the nodes that changed), plans a failover of each partition whose owner is dead (`plan_failovers`)
and drives them all at once within a budget (`drive_failovers`); a run drives what is left. A node's
failover an operator asks for is `operations.fail_over_node`.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.failover import moves_on_without_old_owner, prepare_failover
from laminar_orchestration.control.moves import drive_with_deadline
from laminar_orchestration.control.operations import assigned_partitions, take_failover_target
from laminar_orchestration.control.placement import node_loads
from laminar_orchestration.control.snapshot import is_alive, live_node_ids, warm_copies
from laminar_orchestration.errors import LaminarError
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.protocol.desired_states import DesiredState, DesiredStates
from laminar_orchestration.protocol.fencing import Ownership
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import NodeRecord, now
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationPhase, PhaseReport

__all__ = [
    "FULL_LOOK_S",
    "LAPSE_MARGIN_S",
    "DrivenFailover",
    "FailoverPlan",
    "LookFocus",
    "PlannedFailover",
    "drive_failover",
    "drive_failovers",
    "look_focus",
    "plan_failovers",
    "wait_for_suspects",
]


#: How long after a heartbeat's lapse `wait_for_suspects` reads the node again (a heartbeat written
#: just before the lapse is visible by then).
LAPSE_MARGIN_S = 0.05


def wait_for_suspects(
    ledger: Ledger,
    *,
    heartbeat_timeout_s: float | None,
    watch_s: float,
    known_dead: Collection[int] = (),
    margin_s: float = LAPSE_MARGIN_S,
) -> float:
    """Watch the owning nodes for up to `watch_s`, until one's heartbeat timeout lapses; the seconds spent.

    Every node is read once; after that a node's record is read again only when its last heartbeat
    would lapse (its time plus the timeout: `heartbeat_timeout_s`, else the node's own). A node that
    beat since is watched on to its next lapse; one that did not is dead, and the watch ends at
    once (fail over now) - within `margin_s` of the timeout, whenever the watch began, for about one
    read a node per timeout. Only owning nodes end the watch: a node whose last heartbeat and
    assignment name no partition needs no failover, and one the caller already found dead
    (`known_dead`: its failovers are planned) is not news.
    """
    started = time.monotonic()
    records = {v.record.node: v.record for v in ledger.members.nodes()}
    owning: dict[int, bool] = {}
    desired = DesiredStates(ledger, nudge=False)

    def owns(record: NodeRecord) -> bool:
        if record.node not in owning:
            assignment, _ = desired.assignment(NodeId(record.node))
            owning[record.node] = bool(record.partitions) or bool(assignment and assignment.partitions)
        return owning[record.node]

    while True:
        at = now()
        lapses: list[tuple[float, int]] = []
        for node, record in records.items():
            if node in known_dead:  # never news, so never read again
                continue
            timeout = heartbeat_timeout_s if heartbeat_timeout_s is not None else record.heartbeat_timeout_s
            left = timeout - (at - record.heartbeat_at).total_seconds()
            if left >= 0:
                lapses.append((left, node))
            elif owns(record):
                return time.monotonic() - started
        if not lapses:
            return time.monotonic() - started
        left, node = min(lapses)
        wake = time.monotonic() + left + margin_s
        if wake > started + watch_s:
            return time.monotonic() - started
        time.sleep(max(0.0, wake - time.monotonic()))
        fresh = ledger.members.node(NodeId(node))
        if fresh is None:
            del records[node]
        else:
            records[node] = fresh


@dataclass(frozen=True)
class PlannedFailover:
    """A partition whose owner is dead, and the live node chosen to take it."""

    partition: int
    epoch: int
    failed_node: int
    to_node: int
    #: The ownership as the plan read it: the failover plans and fences from it (its grant's
    #: create-only write checks it) instead of reading it again.
    ownership: Ownership | None = field(default=None, compare=False, repr=False)
    #: The desired state and its ETag as the plan read them: the failover's record is written on
    #: them (a compare-and-swap: a write since makes it read again).
    state: tuple[DesiredState, str | None] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class FailoverPlan:
    """The failovers one look at the ledger found due: every dead owner's partitions, with a target each."""

    failovers: tuple[PlannedFailover, ...] = ()
    #: (partition, epoch) pairs whose failover is planned or under way (in this plan or before it).
    handled: frozenset[tuple[int, int]] = frozenset()
    #: Why partitions of dead owners were left alone, one line each.
    skipped: tuple[str, ...] = ()
    #: partition -> epoch of the grants completed on the way (their granter died before sealing).
    completed_grants: Mapping[int, int] = field(default_factory=dict)
    #: Partitions of dead owners that no live node could take: the next look tries them again.
    unplaced: frozenset[int] = frozenset()


#: The control plane's periodic look reads every partition's records this often (the repair of what no
#: node change points at: a grant its granter left unsealed, a grant that outlived its move); in
#: between, only the partitions of the nodes that joined, restarted or died since.
FULL_LOOK_S = 300.0


@dataclass(frozen=True)
class LookFocus:
    """Which partitions one periodic look of the control plane reads (the failure sensor's): None for
    every partition. Its request count follows the nodes that changed, not the partitions."""

    #: The partitions that may wait for a grant back (`reinstate_all`): those of nodes that joined or restarted.
    grant_back: frozenset[PartitionId] | None
    #: The partitions that may need a failover (`plan_failovers`): those of nodes that are not alive.
    fail_over: frozenset[PartitionId] | None
    #: Each node's generation as this look saw it, and the nodes it found not alive: the next look
    #: compares with them.
    generations: Mapping[int, int]
    dead: frozenset[int] = frozenset()
    #: A node died since the previous look: this one reads what its records name, the next one every
    #: partition (the ledger's owner is the truth; an assignment may lag behind its state).
    full_next: bool = False

    @property
    def full(self) -> bool:
        return self.grant_back is None


def look_focus(
    ledger: Ledger,
    seen: Mapping[int, int] | None,
    *,
    full: bool,
    heartbeat_timeout_s: float | None = None,
    seen_dead: Collection[int] = (),
    unplaced: Collection[int] = (),
) -> LookFocus:
    """What this look reads, given the previous look's node generations (`seen`; None at the first),
    the nodes it found dead (`seen_dead`) and the partitions it could not fail over (`unplaced`).

    Every partition at the first look and when `full` (every `FULL_LOOK_S`). Otherwise, for grants
    back, the partitions the assignment records of the nodes that joined or restarted since name (a
    node that left cleanly released its partitions); for failovers, those the dead nodes' assignments
    name or their last heartbeats report, and `unplaced`. When a node died since the previous look
    the next look reads every partition (`full_next`: the ledger's owner is the truth, not the
    assignment), after this one has failed over what the node's records name at once.
    """
    views = ledger.members.nodes()
    generations = {int(v.record.node): v.record.generation for v in views}
    # Judged from the records just read: no second read of every node.
    dead = frozenset(int(v.record.node) for v in views if not is_alive(v, heartbeat_timeout_s))
    if seen is None or full:
        return LookFocus(None, None, generations, dead)

    def named(nodes: Iterable[int]) -> frozenset[PartitionId]:
        return frozenset().union(*assigned_partitions(ledger, nodes).values())

    changed = [n for n, g in generations.items() if seen.get(n) != g]
    # A last heartbeat tells what a node held when it died; once that death was looked at, the
    # node's assignment (its moves away end there) and the full looks say the rest.
    newly_dead = dead - set(seen_dead)
    reported = {PartitionId(p) for v in views if int(v.record.node) in newly_dead for p in v.record.partitions}
    fail_over = named(dead) | reported | {PartitionId(p) for p in unplaced}
    return LookFocus(named(changed), frozenset(fail_over), generations, dead, full_next=bool(newly_dead))


def plan_failovers(
    ledger: Ledger,
    handled: Collection[tuple[int, int]] = (),
    *,
    heartbeat_timeout_s: float | None = None,
    partitions: Collection[PartitionId] | None = None,
) -> FailoverPlan:
    """Find the partitions whose owner is dead and pick a target for each new (partition, epoch).

    A partition is left alone when its owner is alive, unassigned or draining (a leaving node's final
    drain releases it), when a migration that no longer needs the old owner is in flight towards a
    live node (a forced one, or a graceful one past the release), or when its (partition, epoch) is
    in `handled` (a failover already requested). The target is a live node with a warm copy of the
    partition (a standby), else the least-loaded live node, counting the failovers planned here. A
    partition no live node can take is not marked handled: the next look plans it again. Liveness is
    judged with `heartbeat_timeout_s` (None: each node's own timeout).

    On the way, every grant the ownership head lags (`Ownership.head_lagged`) is completed
    (`Ledger.complete_grant`): its granter died before sealing the manifest chain, and nothing else
    would seal it. Only `partitions` are looked at (None: every partition; see `LookFocus`).
    """
    views = ledger.members.nodes()
    live = {view.record.node for view in views if is_alive(view, heartbeat_timeout_s)}
    draining = {view.record.node for view in views if view.draining(heartbeat_timeout_s)}
    owners = ledger.ownerships(ledger.partitions() if partitions is None else sorted(partitions))
    loads = node_loads({int(p): (int(o.owner) if o else UNASSIGNED) for p, o in owners.items()}, live)
    warm = warm_copies(views)
    # The records of the dead owners' partitions, read at once (not one after the other).
    orphaned = [p for p, o in owners.items() if o is not None and o.owner not in {UNASSIGNED, *live, *draining}]
    states = DesiredStates(ledger).read_many(sorted(orphaned))
    failovers: list[PlannedFailover] = []
    done: set[tuple[int, int]] = set()
    skipped: list[str] = []
    unplaced: set[int] = set()
    completed: dict[int, int] = {}
    for p, own in sorted(owners.items()):
        if own is not None and own.head_lagged:
            try:
                if ledger.complete_grant(p, own):
                    completed[int(p)] = own.epoch
            except LaminarError as exc:
                skipped.append(f"p{p}: the grant at epoch {own.epoch} is not sealed: {type(exc).__name__}: {exc}")
        if p not in states:
            continue  # its owner is alive, or nobody owns it
        assert own is not None
        key = (int(p), own.epoch)
        task = states[p][0].migration
        if task is not None and moves_on_without_old_owner(task, live):
            skipped.append(f"p{p}: migration {task.migration_id} to node {task.to_node} in flight")
            done.add(key)
            continue
        if key in handled:
            done.add(key)
            continue
        target = take_failover_target(loads, warm.get(int(p)))
        if target is None:
            skipped.append(f"p{p}: owner node {own.owner} is dead and no live node can take it")
            unplaced.add(int(p))
            continue
        done.add(key)
        failovers.append(PlannedFailover(int(p), own.epoch, int(own.owner), target, ownership=own, state=states[p]))
    return FailoverPlan(tuple(failovers), frozenset(done), tuple(skipped), completed, frozenset(unplaced))


@dataclass(frozen=True)
class DrivenFailover:
    """One planned failover as `drive_failovers` left it: its migration, the phases done, what stopped it."""

    planned: PlannedFailover
    migration_id: str | None = None
    from_epoch: int = 0
    to_epoch: int = 0
    to_node: int = 0
    reports: tuple[PhaseReport, ...] = ()
    #: Why the drive stopped before Active (budget spent, an error); None when it finished.
    left_to_run: str | None = None

    @property
    def done(self) -> bool:
        """True when the failover is complete (the new owner is active)."""
        return self.left_to_run is None


def drive_failover(
    ledger: Ledger, planned: PlannedFailover, deadline: float, limits: MigrationConfig, live: Collection[int] | None
) -> DrivenFailover:
    """Fence and drive one planned failover until Active or `deadline` (`time.monotonic()`).

    The fence never waits for a node, so it is done whatever the deadline: nothing the dead owner may
    still do is accepted; only the waits for the new owner are bounded (`drive_with_deadline`). The
    first phase's report counts the decision's ledger reads too. Errors are returned, not raised.
    """
    coordinator = MigrationCoordinator(ledger, limits)
    started = time.monotonic()
    try:
        decision = prepare_failover(
            coordinator, planned.partition, planned.to_node, live=live, own=planned.ownership, read=planned.state
        )
    except LaminarError as exc:
        return DrivenFailover(planned, left_to_run=f"{type(exc).__name__}: {exc}")
    task = decision.task
    if task is None:
        return DrivenFailover(planned, left_to_run=decision.reason)
    deciding_s = time.monotonic() - started
    driven = drive_with_deadline(coordinator, task, deadline, always=(MigrationPhase.PLANNED, MigrationPhase.RELEASED))
    reports = list(driven.reports)
    if reports and reports[0].phase == MigrationPhase.PLANNED:
        # The fence follows the decision at once: its ledger reads count in the first phase.
        first = reports[0]
        reports[0] = PhaseReport(first.phase, deciding_s + first.duration_s, first.bytes_moved, decision.reason)
    left: str | None = None
    if driven.error is not None:
        left = f"{type(driven.error).__name__}: {driven.error}"
    elif driven.out_of_time_before is not None:
        left = f"the budget ran out before {driven.out_of_time_before}"
    return DrivenFailover(
        planned, task.migration_id, task.from_epoch, task.to_epoch, task.to_node, tuple(reports), left
    )


def drive_failovers(
    ledger: Ledger,
    failovers: Iterable[PlannedFailover],
    *,
    budget_s: float,
    limits: MigrationConfig | None = None,
    heartbeat_timeout_s: float | None = None,
) -> list[DrivenFailover]:
    """Drive every failover at once (one thread each) for at most `budget_s`; one result per failover, in order.

    Liveness is judged with `heartbeat_timeout_s` (None: each node's own), as
    `plan_failovers` judged it. What is left undone is for a driver with the
    migration's full limits (a run) to resume from the record.
    """
    todo = list(failovers)
    if not todo:
        return []
    deadline = time.monotonic() + budget_s
    settings = limits or MigrationConfig()
    live = live_node_ids(ledger, heartbeat_timeout_s=heartbeat_timeout_s)
    with ThreadPoolExecutor(len(todo), thread_name_prefix="failover") as pool:
        return list(pool.map(lambda f: drive_failover(ledger, f, deadline, settings, live), todo))
