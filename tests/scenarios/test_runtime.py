"""Nodes as real processes on a real local Spark: processing, migrations, failover, zombies.

One cluster (3 nodes, 4 partitions) serves the whole module; tests that kill or
restart nodes bring them back before they end. Every test ends with the audit
`laminar verify` runs: every produced event committed exactly once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from deltalake import DeltaTable

from laminar_dev.localcluster import HEARTBEAT_TIMEOUT_S, Cluster, wait_until
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.dataplane.restore import committed_state
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.migration_errors import MigrationEpochConflict, MigrationTimeout
from laminar_orchestration.protocol.tasks import MigrationConfig, MigrationPhase
from laminar_orchestration.store import open_store
from laminar_orchestration.table import audit_table, table_location, table_status

pytestmark = [pytest.mark.spark, pytest.mark.processes, pytest.mark.slow]

P, N = PartitionId, NodeId


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("cluster")
    node_args = ("--refresh-interval", "0.5", "--checkpoint-every-batches", "3", "--table-sync-interval", "0.5")
    c = Cluster((workdir / "store").as_uri(), workdir, partitions=4, node_args=node_args)
    for n in (1, 2, 3):
        c.start_node(n)
    try:
        c.wait_alive(1, 2, 3, timeout=180)
        c.place({0: 1, 1: 2, 2: 3, 3: 1})
        yield c
    finally:
        c.shutdown()


def assert_exactly_once(cluster: Cluster) -> None:
    cluster.wait_committed()
    audits = cluster.verify()
    problems = [(a.partition, i) for a in audits for i in a.issues]
    assert not problems, problems
    # Independent of the audit: the committed state per key matches what was produced.
    counts: dict[str, int] = {}
    sums: dict[str, float] = {}
    for p in cluster.partitions:
        state, offset = committed_state(cluster.store, p)
        assert offset == cluster.source.end_offset(p)
        for row in state.to_pylist():
            counts[row["key"]] = row["count"]
            sums[row["key"]] = row["sum"]
    assert counts == cluster.expected_counts()
    expected_sums = cluster.expected_sums()
    assert all(abs(sums[k] - expected_sums[k]) < 1e-6 * max(1.0, abs(expected_sums[k])) for k in sums)
    assert_output_table_exactly_once(cluster)


def assert_output_table_exactly_once(cluster: Cluster) -> None:
    """The Delta table the nodes keep, read with `deltalake` alone: every committed batch once, each
    key's events adding up to what was produced (no duplicate, no zombie row, nothing missing)."""
    wait_until(lambda: table_status(cluster.store).lag_batches == 0, 60, "the nodes to catch the table up")
    rows = DeltaTable(table_location(cluster.store).uri).to_pyarrow_table().to_pylist()
    batches = [(r["partition"], r["batch_seq"], r["key"]) for r in rows]
    assert len(batches) == len(set(batches)), "a batch's row landed twice"
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["key"]] = counts.get(r["key"], 0) + r["batch_count"]
    assert counts == cluster.expected_counts()
    audit = audit_table(cluster.store)  # what `laminar verify` adds for the table
    assert audit.ok and audit.exists, audit.summary_lines()


def test_processing_commits_every_event_exactly_once(cluster: Cluster) -> None:
    cluster.produce(120_000)
    assert_exactly_once(cluster)
    assert {cluster.owner(p) for p in cluster.partitions} == {1, 2, 3}
    for p in cluster.partitions:
        assert cluster.epoch(p) == 1


def test_graceful_migration_moves_state_and_bumps_epoch(cluster: Cluster) -> None:
    cluster.produce(60_000)
    cluster.wait_committed()
    before_epoch, source_owner = cluster.epoch(1), cluster.owner(1)
    target = 3 if source_owner != 3 else 1
    cluster.produce(60_000)  # in flight while the partition moves
    task = cluster.coordinator.run(P(1), N(target))
    assert task.phase == MigrationPhase.ACTIVE
    assert (cluster.owner(1), cluster.epoch(1)) == (target, before_epoch + 1)
    release = cluster.ledger.release_record(P(1), before_epoch)
    assert release is not None and release.node == source_owner
    cluster.produce(30_000)
    assert_exactly_once(cluster)
    history = [v.manifest for v in cluster.manifests.history(P(1))]
    tokens = [m.fencing_token for m in history]
    # At most one node processing: every commit of the old epoch precedes every one of the new.
    assert tokens == sorted(tokens)
    first_new = next(m for m in history if m.fencing_token == before_epoch + 1)
    # The new owner started exactly where the old one released: its grant sealed the chain there.
    assert first_new.is_seal and first_new.source_offset == release.source_offset
    assert first_new.node == target


def test_concurrent_migrations_of_two_partitions(cluster: Cluster) -> None:
    cluster.produce(40_000)
    moves = {0: 2 if cluster.owner(0) != 2 else 3, 2: 1 if cluster.owner(2) != 1 else 2}
    epochs = {p: cluster.epoch(p) for p in moves}
    errors: list[BaseException] = []

    def move(p: int, n: int) -> None:
        try:
            cluster.coordinator.run(P(p), N(n))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=move, args=item) for item in moves.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    for p, n in moves.items():
        assert (cluster.owner(p), cluster.epoch(p)) == (n, epochs[p] + 1)
    assert_exactly_once(cluster)


def _assert_run_again_resumes(cluster: Cluster, partition: int, target: int) -> None:
    """The migration of `partition` to `target` was left unfinished: running it again resumes the recorded
    migration to the end instead of planning another, and every event is committed exactly once."""
    left = cluster.coordinator.current(P(partition))
    assert left is not None and not left.is_terminal
    task = cluster.coordinator.run(P(partition), N(target))
    assert task.migration_id == left.migration_id and task.phase == MigrationPhase.ACTIVE
    assert cluster.owner(partition) == target
    assert_exactly_once(cluster)


def test_two_migrations_of_one_partition_exactly_one_proceeds(cluster: Cluster) -> None:
    owner = cluster.owner(3)
    targets = [n for n in (1, 2, 3) if n != owner]
    outcomes: list[object] = []
    barrier = threading.Barrier(2)

    def plan(n: int) -> None:
        barrier.wait()
        try:
            outcomes.append(cluster.coordinator.plan(P(3), N(n)))
        except MigrationEpochConflict as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=plan, args=(n,)) for n in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    conflicts = [o for o in outcomes if isinstance(o, MigrationEpochConflict)]
    tasks = [o for o in outcomes if not isinstance(o, MigrationEpochConflict)]
    assert len(conflicts) == 1 and len(tasks) == 1
    task = cluster.coordinator.current(P(3))
    assert task is not None
    cluster.coordinator.run(P(3), N(task.to_node))
    assert cluster.owner(3) == task.to_node
    assert_exactly_once(cluster)


def test_migration_timeout_then_retry_resumes(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster.produce(40_000)
    owner = cluster.owner(0)
    target = next(n for n in (1, 2, 3) if n != owner)
    impatient = MigrationCoordinator(cluster.ledger, MigrationConfig(release_wait_timeout_s=0.001))
    # The old owner's reports reach this coordinator too late: on a busy machine the first poll
    # could otherwise already find a phase reported, and a 1 ms wait would not time out.
    monkeypatch.setattr(impatient, "phase_reported", lambda task, phase, **_: None)
    with pytest.raises(MigrationTimeout) as info:
        impatient.run(P(0), N(target))
    assert info.value.phase.needs_old_owner
    _assert_run_again_resumes(cluster, 0, target)


def test_orchestrator_killed_mid_migration_then_resumed(cluster: Cluster, tmp_path: Path) -> None:
    cluster.produce(200_000)
    owner = cluster.owner(2)
    target = next(n for n in (1, 2, 3) if n != owner)
    script = (
        "import sys\n"
        "from laminar_orchestration.store import open_store\n"
        "from laminar_orchestration.protocol.ledger import Ledger\n"
        "from laminar_orchestration.control.coordinator import MigrationCoordinator\n"
        "from laminar_orchestration.identity import PartitionId, NodeId\n"
        f"MigrationCoordinator(Ledger(open_store({cluster.store_url!r}))).run(PartitionId(2), NodeId({target}))\n"
    )
    orchestrator = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_until(
            lambda: (
                (t := cluster.coordinator.current(P(2))) is not None
                and t.to_node == target
                and t.phase in (MigrationPhase.CHECKPOINTING, MigrationPhase.UPLOADING, MigrationPhase.RELEASED)
            ),
            60,
            "the migration to reach the checkpoint phases",
            interval=0.005,
        )
    finally:
        orchestrator.send_signal(signal.SIGKILL)
        orchestrator.wait(10)
    _assert_run_again_resumes(cluster, 2, target)


def test_forced_failover_after_owner_killed(cluster: Cluster) -> None:
    victim = cluster.owner(1)
    cluster.produce(80_000)
    time.sleep(1.0)  # let it be mid-batch
    cluster.kill(victim)
    cluster.wait_dead(victim, timeout=HEARTBEAT_TIMEOUT_S + 10)
    survivors = [n for n in (1, 2, 3) if n != victim]
    moved = cluster.partitions_of(victim)
    assert moved
    for i, p in enumerate(moved):
        epoch = cluster.epoch(p)
        task = cluster.coordinator.run(P(p), N(survivors[i % 2]), forced=True)
        assert task.phase == MigrationPhase.ACTIVE
        assert cluster.epoch(p) == epoch + 1
        grant = cluster.ledger.grant(P(p), epoch + 1)
        assert grant is not None and grant.grant_kind == "fence"
    cluster.produce(20_000)
    assert_exactly_once(cluster)
    cluster.start_node(victim)
    cluster.wait_alive(victim, timeout=180)


def test_paused_zombie_cannot_commit_after_failover(cluster: Cluster) -> None:
    # Give the future zombie two partitions so we can see it keep serving the other.
    zombie = cluster.owner(0)
    cluster.produce(20_000)
    cluster.wait_committed()
    other = next(p for p in cluster.partitions if cluster.owner(p) != zombie)
    cluster.coordinator.run(P(other), N(zombie))
    victim_partition, kept_partition = 0, other
    cluster.produce(60_000)
    cluster.nodes[zombie].signal(signal.SIGSTOP)
    try:
        cluster.wait_dead(zombie, timeout=HEARTBEAT_TIMEOUT_S + 10)
        old_epoch = cluster.epoch(victim_partition)
        target = next(n for n in (1, 2, 3) if n != zombie)
        cluster.coordinator.run(P(victim_partition), N(target), forced=True)
        cluster.produce(40_000)
    finally:
        cluster.nodes[zombie].signal(signal.SIGCONT)
    # Resumed, the zombie may try to finish its in-flight batch: it must not land.
    wait_until(lambda: "REVOKED" in cluster.nodes[zombie].log(), 30, "the zombie to detect its revocation")
    history = [v.manifest for v in cluster.manifests.history(P(victim_partition))]
    takeover = next(i for i, m in enumerate(history) if m.fencing_token == old_epoch + 1)
    assert all(m.fencing_token > old_epoch for m in history[takeover:])
    assert all(m.node != zombie for m in history[takeover:])
    # The zombie keeps serving the partition it still owns.
    cluster.wait_alive(zombie, timeout=30)
    before = cluster.committed(kept_partition)
    cluster.produce(20_000)
    wait_until(lambda: cluster.committed(kept_partition) > before, 60, "the zombie's other partition to progress")
    assert cluster.owner(kept_partition) == zombie
    assert_exactly_once(cluster)


# --- the control plane against live nodes -------------------------------------------------


@pytest.mark.dagster
def test_dagster_migrate_partition_job_against_live_nodes(cluster: Cluster) -> None:
    from dagster import DagsterInstance

    from jobs import migrate_partition
    from laminar_orchestration.control.snapshot import warm_copies
    from resources import LaminarResource

    cluster.produce(30_000)
    cluster.wait_committed()  # there is state to move
    owner = cluster.owner(3)
    # A node that owned partition 3 earlier in this module may still follow it as a standby: the
    # move is asserted to transfer state, so it goes to a node without a copy where there is one.
    copies = warm_copies(cluster.ledger.members.nodes()).get(3, {})
    candidates = [n for n in (1, 2, 3) if n != owner]
    target = next((n for n in candidates if n not in copies), candidates[0])
    cold = target not in copies
    epoch = cluster.epoch(3)
    with DagsterInstance.ephemeral() as instance:
        result = migrate_partition.execute_in_process(
            run_config={"partition": 3, "to_node": target},
            instance=instance,
            resources={"laminar": LaminarResource(store_url=cluster.store_url)},
        )
    assert result.success
    ops = [e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"]
    assert ops == ["plan", "drain", "checkpoint", "upload", "release", "download", "restore", "seek", "activate"]
    outputs = {e.step_key: e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"}
    metadata = {step: e.event_specific_data.metadata for step, e in outputs.items()}  # type: ignore[union-attr]
    # The state moves while the target warms up (plan) and in the handoff (upload, download): only those
    # ops carry bytes_moved, so their sum is the move's.
    moved = {step: int(str(m["bytes_moved"].value)) for step, m in metadata.items() if "bytes_moved" in m}
    assert set(moved) == {"plan", "upload", "download"}
    assert all("duration_s" in m for m in metadata.values())
    if cold:
        assert moved["plan"] + moved["download"] > 0, moved
    assert (cluster.owner(3), cluster.epoch(3)) == (target, epoch + 1)
    assert_exactly_once(cluster)


def _logged(path: Path, text: bytes) -> bool:
    return text in path.read_bytes()


def test_sigterm_during_the_spark_warm_up_exits_cleanly(tmp_path: Path) -> None:
    """A node stopped while its background warm-up is inside a Spark call exits 0: the warm-up is
    ended and waited for before the process exits (a thread left in a Spark call makes the
    interpreter abort while it finalizes). Three nodes at once: the abort hit about two stops in three."""
    url = (tmp_path / "store").as_uri()
    Ledger(open_store(url)).init_cluster(1)
    logs = [tmp_path / f"node-{n}.log" for n in (1, 2, 3)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for n, log_path in zip((1, 2, 3), logs, strict=True):
            with open(log_path, "wb") as fh:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "laminar_orchestration.cli", "node", "run", "--store", url,
                         "--node-id", str(n)],
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                    )
                )  # fmt: skip
        for log_path in logs:
            # Three JVMs starting at once beside the rest of the suite on two cores: minutes, not seconds.
            wait_until(partial(_logged, log_path, b"spark ready"), 300, f"{log_path.name}: Spark to start")
        time.sleep(1.0)  # inside the back-to-back part of the warm-up
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for code, log_path in zip(codes, logs, strict=True):
        assert code == 0, f"{log_path.name}: exit {code}\n{log_path.read_text()[-3000:]}"
