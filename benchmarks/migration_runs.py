"""One graceful migration and one forced failover of a partition on a live local cluster, under load,
timed from the manifests, the phase reports and the new owner's log; and bringing a killed node back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from laminar_dev.localcluster import HEARTBEAT_TIMEOUT_S, Cluster, wait_until
from laminar_orchestration.control.placement import failover_target
from laminar_orchestration.control.snapshot import warm_copies
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.tasks import MigrationPhase, PhaseReport

from .migration_cluster import (
    BatchLine,
    History,
    Restore,
    first_batch,
    gaps,
    is_data,
    kill_node,
    log_mark,
    random_instant,
    restores,
    ts,
    wait_dead,
    wait_warmed_up,
)

# --- one graceful migration -----------------------------------------------------------------------------


@dataclass
class MigrationRun:
    from_node: int
    to_node: int
    total_s: float
    phases: dict[MigrationPhase, float]
    #: The DOWNLOADING phase's bytes_moved: checkpoint bytes the handoff itself transferred.
    download_bytes: int
    #: The PLANNED phase's bytes_moved: what the target's warm-up downloaded before the old owner drained.
    planned_bytes: int
    #: The PLANNED phase's report (how warm the target was when the old owner was asked to drain).
    planned_detail: str
    restores: list[Restore]
    #: Old owner's last data commit -> new owner's first data commit (manifest committed_at).
    unavailable_s: float
    #: Old owner's last data commit -> the migration's launch (negative: it committed after the launch).
    last_commit_before_launch_s: float
    #: The seal (the new owner's takeover entry) -> its first data commit.
    seal_to_data_s: float
    #: Launch -> the new owner's first data commit.
    launch_to_first_data_s: float
    #: Old owner's last data commit -> the seal.
    last_data_to_seal_s: float
    #: Gaps between the old owner's consecutive data commits just before the migration.
    normal_gaps: list[float] = field(default_factory=list)
    #: The new owner's first batch, from its log.
    first_batch: BatchLine | None = None


def graceful_run(cluster: Cluster, hist: History, target: int, *, warm_commits: int, timeout: float) -> MigrationRun:
    """Migrate `hist.partition` to `target` under load; time it from the manifests and phase reports."""
    p = hist.partition
    old_epoch, old_owner = cluster.epoch(p), cluster.owner(p)
    start_seq = hist.head_seq() + 1
    random_instant(gaps(hist.wait_data(old_epoch, start_seq, warm_commits, timeout)))
    mark = log_mark(cluster, target)
    reports: list[PhaseReport] = []
    launched = time.time()
    t0 = time.perf_counter()
    task = cluster.coordinator.run(PartitionId(p), NodeId(target), on_phase=reports.append)
    total = time.perf_counter() - t0
    if task.phase != MigrationPhase.ACTIVE:
        raise RuntimeError(f"migration ended in {task.phase}: {task.error}")
    new_epoch = cluster.epoch(p)
    first_new = hist.wait_data(new_epoch, start_seq, 1, timeout)[0]
    entries = hist.since(start_seq)
    old_data = [m for m in entries if m.fencing_token == old_epoch and is_data(m)]
    last_old = old_data[-1]
    seal = next(m for m in entries if m.fencing_token == new_epoch)
    if not seal.is_seal:
        raise RuntimeError(f"the new owner's first manifest is {seal.note!r}, not a seal")
    by_phase = {r.phase: r for r in reports}
    planned = by_phase.get(MigrationPhase.PLANNED)
    download = by_phase.get(MigrationPhase.DOWNLOADING)
    return MigrationRun(
        from_node=old_owner,
        to_node=target,
        total_s=total,
        phases={r.phase: r.duration_s for r in reports},
        download_bytes=download.bytes_moved if download else 0,
        planned_bytes=planned.bytes_moved if planned else 0,
        planned_detail=planned.detail if planned else "-",
        restores=restores(cluster, target, mark, p),
        first_batch=first_batch(cluster, target, mark, p),
        unavailable_s=ts(first_new) - ts(last_old),
        last_commit_before_launch_s=launched - ts(last_old),
        seal_to_data_s=ts(first_new) - ts(seal),
        launch_to_first_data_s=ts(first_new) - launched,
        last_data_to_seal_s=ts(seal) - ts(last_old),
        normal_gaps=gaps(old_data[-4:]),
    )


# --- one forced failover ----------------------------------------------------------------------------------


@dataclass
class FailoverRun:
    victim: int
    to_node: int
    #: What `assignment.failover_target` picks among the live nodes (the CLI, the sensor).
    library_choice: int | None
    detection_s: float
    recovery_s: float
    run_s: float
    phases: dict[MigrationPhase, float]
    download_bytes: int
    restores: list[Restore]
    launch_to_seal_s: float
    total_s: float
    unavailable_s: float
    #: Events after the committed offset at the seal that the new owner had to process first.
    seal_offset: int = 0
    #: Data commit -> kill: a random fraction of the commit interval.
    kill_delay_s: float = 0.0
    #: The new owner's first batch, from its log.
    first_batch: BatchLine | None = None


def library_failover_choice(cluster: Cluster, partition: int, victim: int) -> int | None:
    views = cluster.ledger.members.nodes()
    loads = {int(v.record.node): 0 for v in views if v.alive and int(v.record.node) != victim}
    for q in cluster.partitions:
        owner = cluster.owner(q)
        if owner in loads:
            loads[owner] += 1
    return failover_target(loads, warm=warm_copies(views).get(partition, {}), exclude={victim})


def failover_run(
    cluster: Cluster,
    hist: History,
    *,
    warm_commits: int,
    timeout: float,
    target: int | None = None,
) -> FailoverRun:
    """SIGKILL the owner of `hist.partition`, detect it, fail over (forced), time it. The victim stays dead.

    `target`: the node to fail over to; None: the one `assignment.failover_target` picks.
    """
    p = hist.partition
    victim, old_epoch = cluster.owner(p), cluster.epoch(p)
    start_seq = hist.head_seq() + 1
    delay = random_instant(gaps(hist.wait_data(old_epoch, start_seq, warm_commits, timeout)))
    t_kill = kill_node(cluster, victim)
    t_dead = wait_dead(cluster, victim, HEARTBEAT_TIMEOUT_S + 15)
    choice = library_failover_choice(cluster, p, victim)
    to_node = target if target is not None else choice
    if to_node is None:
        raise RuntimeError(f"no live node to fail partition {p} over to")
    mark = log_mark(cluster, to_node)
    reports: list[PhaseReport] = []
    t_launch = time.time()
    task = cluster.coordinator.run(PartitionId(p), NodeId(to_node), forced=True, on_phase=reports.append)
    t_active = time.time()
    if task.phase != MigrationPhase.ACTIVE:
        raise RuntimeError(f"failover ended in {task.phase}: {task.error}")
    new_epoch = cluster.epoch(p)
    first_new = hist.wait_data(new_epoch, start_seq, 1, timeout)[0]
    entries = hist.since(start_seq)
    last_old = [m for m in entries if m.fencing_token == old_epoch and is_data(m)][-1]
    seal = next(m for m in entries if m.fencing_token == new_epoch)
    download = next((r for r in reports if r.phase == MigrationPhase.DOWNLOADING), None)
    return FailoverRun(
        victim=victim,
        to_node=to_node,
        library_choice=choice,
        detection_s=t_dead - t_kill,
        recovery_s=ts(first_new) - t_launch,
        run_s=t_active - t_launch,
        phases={r.phase: r.duration_s for r in reports},
        download_bytes=download.bytes_moved if download else 0,
        restores=restores(cluster, to_node, mark, p),
        first_batch=first_batch(cluster, to_node, mark, p),
        launch_to_seal_s=ts(seal) - t_launch,
        total_s=ts(first_new) - t_kill,
        unavailable_s=ts(first_new) - ts(last_old),
        seal_offset=seal.source_offset,
        kill_delay_s=delay,
    )


def revive(cluster: Cluster, node: int, *, settle: bool = True) -> None:
    """Restart a killed node (with its standby flags) and wait until it took back what it was left owning
    and (`settle`) its Spark warm-up ended."""
    stranded = {q: cluster.epoch(q) for q in cluster.partitions_of(node)}
    cluster.start_node(node)
    cluster.wait_alive(node, timeout=300)
    # The restarted node re-fences them (a new epoch), restores them and resumes.
    wait_until(
        lambda: all(cluster.epoch(q) > e for q, e in stranded.items()),
        180,
        f"node {node} to take back partitions {sorted(stranded)}",
    )
    if settle:
        wait_warmed_up(cluster, node)
