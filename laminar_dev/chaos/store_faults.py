"""The store-faults scenario: in-process nodes, coordinator, producer and a stale writer through a faulty store.

Runs on the local store and on a real S3 protocol server (moto, on loopback).
"""

from __future__ import annotations

import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import pyarrow as pa

from laminar_dev.faults import FaultInjectingStore
from laminar_dev.localcluster import wait_until
from laminar_dev.s3server import start_s3_server
from laminar_orchestration.control.failover import prepare_failover
from laminar_orchestration.control.moves import drive
from laminar_orchestration.control.snapshot import live_node_ids
from laminar_orchestration.dataplane.checkpoint import CheckpointStore, OutputWriter
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.dataplane.worker import PartitionWorker
from laminar_orchestration.dataplane.worker_state import WorkerState
from laminar_orchestration.processing.keyed import empty_state
from laminar_orchestration.protocol.capabilities import CheckpointWriter, OutputCommitter
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.fencing import EpochError, PartitionGuard
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.tasks import MigrationConfig
from laminar_orchestration.store import LocalObjectStore, ObjectStore
from laminar_orchestration.store.retry import RetryingStore, RetryPolicy

from .arrow import ArrowNode
from .evidence import LogCounter, Measure, apply_difference, expected_counts, measure
from .migrations import (
    balance,
    coordinator_for,
    events_behind,
    outcome_issues,
    retrying,
    wait_committed,
)
from .profiles import KEYS, PARTITIONS, Profile
from .results import ScenarioResult


def _stale_writer(
    store: ObjectStore,
    ledger: Ledger,
    nodes: Mapping[int, ArrowNode],
    live: set[int],
    note: Callable[[str], None],
    config: MigrationConfig,
) -> tuple[int, int, list[str]]:
    """Fence a live owner, then write with its superseded token as a zombie that never refreshed would.

    Returns (attempts, rejections, notes) for the publish and the release; the
    output and checkpoint objects it also writes are counted by the history
    audit (they must stay invisible).
    """
    running: list[PartitionWorker] = []

    def find() -> bool:
        running[:] = [
            w
            for node in nodes.values()
            for w in list(node.workers.values())
            if w.token is not None and w.state_name == WorkerState.RUNNING
        ]
        return bool(running)

    wait_until(find, 60, "an in-process node to run a partition")
    worker = running[0]
    node = worker.node
    target = min(n for n in live if n != node.id)
    token = worker.token
    assert token is not None
    coordinator = coordinator_for(ledger, config)

    def fence() -> None:
        own = ledger.ownership(token.partition)
        desired, _ = coordinator.desired.read(token.partition)
        done = desired.owner == target and (desired.migration is None or desired.migration.phase == "active")
        if own is not None and own.epoch > token.epoch and own.owner == target and done:
            return  # an earlier attempt fenced it; only its completion report was lost
        decision = prepare_failover(coordinator, worker.partition, target, live=live, allow_live_owner=True)
        if decision.task is not None:
            drive(coordinator, decision.task)

    retrying(fence, f"fencing partition {worker.partition} of live node {node.id}", note)
    wait_until(lambda: worker.finished, 60, f"node {node.id} to stop partition {worker.partition}")
    guard = PartitionGuard(token)  # a zombie's guard whose cached epoch never saw the fence
    current = ManifestReader(store).current(token.partition)
    start = current.manifest.source_offset if current else 0
    output = pa.table({"key": ["stale"], "batch_count": [1], "count": [1], "epoch": [token.epoch]})
    ref = OutputWriter(OutputCommitter(store)).write(guard, output, start, start + 1)
    CheckpointStore(CheckpointWriter(store)).upload_delta(guard, empty_state(), start, start + 1)
    attempts = rejected = 0
    notes = []
    publisher = ManifestPublisher(OutputCommitter(store), store)
    attempts += 1
    try:
        publisher.publish(token, ManifestUpdate(source_offset=start + 1, outputs=(ref,)))
        notes.append(f"stale publish of epoch {token.epoch} was ACCEPTED")
    except EpochError as exc:
        rejected += 1
        notes.append(f"stale publish rejected: {exc}")
    attempts += 1
    try:
        ledger.release(token, commit_ulid=None, source_offset=start)
        notes.append(f"stale release of epoch {token.epoch} was ACCEPTED")
    except EpochError as exc:
        rejected += 1
        notes.append(f"stale release rejected: {exc}")
    return attempts, rejected, notes


def run_store_faults(
    inner: ObjectStore, backend: str, profile: Profile, workdir: Path, say: Callable[[str], None]
) -> ScenarioResult:
    """Nodes, coordinator, producer and a stale writer, in-process, through a faulty store on `inner`.

    `inner` must be an empty store. Faults: a seeded random rate over every
    operation (half of the write faults are lost responses after an applied
    write), bursts of 5xx / throttling / resets / lost responses every 0.25 s,
    and added latency. The audit reads `inner` directly.
    """
    result = ScenarioResult("store-faults", backend, deterministic_stale_writes=True)
    started = time.monotonic()

    def note(msg: str) -> None:
        say(f"store-faults [{backend}]: {msg}")
        result.notes.append(msg)

    remote = backend != "local"
    # In-process handoffs take milliseconds: a phase that waits long is stuck, not slow. Against
    # the moto server (one request at a time) every request queues behind the others' (tens of ms each
    # when the machine is busy), so a phase takes seconds there.
    limit = 30.0 if remote else 10.0
    config = MigrationConfig(
        migration_timeout_s=limit, release_wait_timeout_s=limit, checkpoint_transfer_timeout_s=limit
    )
    workdir.mkdir(parents=True, exist_ok=True)
    faulty = FaultInjectingStore(inner)
    # More attempts than the default: bursts of 3 plus the random rate must not exhaust them.
    store = RetryingStore(faulty, RetryPolicy(max_attempts=10, base_delay_s=0.01, max_delay_s=0.25), seed=7)
    ledger = Ledger(store)
    ledger.init_cluster(PARTITIONS)
    source = SourceLog(store, partitions=PARTITIONS, segment_events=2_000)
    produced: list[pa.Table] = []
    counter = LogCounter()
    nodes: dict[int, ArrowNode] = {}
    threads: list[threading.Thread] = []
    stop = threading.Event()
    errors: list[str] = []

    def node_config(n: int) -> NodeConfig:
        # Against the moto server (one request at a time) every poll is a round trip: poll less.
        return NodeConfig(
            store_url=inner.url,
            node_id=n,
            heartbeat_interval_s=1.0,
            heartbeat_timeout_s=10.0,
            reconcile_interval_s=0.5 if remote else 0.05,
            idle_poll_s=0.5 if remote else 0.05,
            migration_poll_s=0.1 if remote else 0.01,
            refresh_interval_s=1.5,  # the default; the kill-switch is not what is under test here
            batch_max_events=4_000,
            checkpoint_every_batches=3,
            workdir=str(workdir / f"node{n}"),
        )

    def bursts() -> None:
        kinds = ("5xx", "throttle", "lost", "reset")
        i = 0
        while not stop.wait(0.25):
            kind = kinds[i % len(kinds)]
            if kind == "lost":
                faulty.lose_response_next(2)
            else:
                faulty.fail_next(3, kind="5xx" if kind == "5xx" else "throttle" if kind == "throttle" else "reset")
            i += 1

    def producer() -> None:
        chunk = 2_000
        try:
            for i in range(profile.fault_events // chunk):
                if stop.is_set():
                    return
                for p, table in generate_events(chunk, KEYS, 1_000 + i, PARTITIONS).items():
                    source.append(p, table)
                    produced.append(table)
                time.sleep(0.05)
        except Exception as exc:
            errors.append(f"producer: {type(exc).__name__}: {exc}")

    steps: list[str] = []
    mark = [time.monotonic()]

    def step(name: str) -> None:
        now_ = time.monotonic()
        steps.append(f"{name} {now_ - mark[0]:.1f}s")
        mark[0] = now_

    with counter.attached(workdir / "nodes.log"):
        try:
            for n in (1, 2):
                nodes[n] = ArrowNode(node_config(n), store=store)
                t = threading.Thread(
                    target=nodes[n].run, kwargs={"install_signals": False}, name=f"node-{n}", daemon=True
                )
                t.start()
                threads.append(t)
            wait_until(lambda: {1, 2} <= live_node_ids(ledger), 60, "the in-process nodes to join")
            live = {1, 2}
            result.issues += outcome_issues(balance(ledger, live, note, config=config), "placement")
            step("start and placement")
            faulty.latency(0.002 if remote else 0.004)
            faulty.random_faults(profile.fault_rate, seed=11)
            extra = [threading.Thread(target=bursts, name="bursts"), threading.Thread(target=producer, name="producer")]
            for t in extra:
                t.start()
            try:
                # Against the moto server (one request at a time) every handoff costs seconds: half the rounds.
                rounds = max(1, profile.fault_rounds // 2) if remote else profile.fault_rounds
                for round_ in range(rounds):
                    # Every partition to the other node: graceful handoffs while load and faults run.
                    weights = {1: 0.0} if round_ % 2 == 0 else {2: 0.0}
                    outcomes = balance(
                        ledger, live, note, weights=weights, bump_reason=f"chaos round {round_}", config=config
                    )
                    result.issues += outcome_issues(outcomes, "migration")
                result.issues += outcome_issues(balance(ledger, live, note, config=config), "balancing")
                step(f"{rounds} rounds of migrations")
                attempts, rejected, notes = _stale_writer(store, ledger, nodes, live, note, config)
                step("stale writer")
                result.stale_writes_attempted += attempts
                result.stale_writes_rejected += rejected
                result.notes += notes
            finally:
                extra[1].join(timeout=300)
                behind = wait_committed(store, profile.commit_timeout_s)  # still under faults
                stop.set()
                extra[0].join(timeout=10)
                faulty.clear()
                step("rest of the load committed")
            if behind:
                result.issues.append(f"{behind} events still uncommitted after {profile.commit_timeout_s:.0f}s")
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            say(f"store-faults [{backend}]: {traceback.format_exc()}")
        finally:
            stop.set()
            faulty.clear()
            for node in nodes.values():
                node.stop()
            for t in threads:
                t.join(timeout=60)
            if any(t.is_alive() for t in threads):
                result.issues.append("an in-process node did not stop within 60s")
            step("nodes stopped")
    result.issues += errors
    logs = counter.counts()
    result.revoked = logs.revoked
    result.stale_writes_attempted += logs.rejected_publishes
    result.stale_writes_rejected += logs.rejected_publishes
    behind = events_behind(inner)
    apply_difference(result, Measure(), measure(inner, expected_counts(produced) if behind == 0 else None))
    result.duration_s = time.monotonic() - started
    result.notes.append(f"steps: {', '.join(steps)}")
    result.notes.append(
        f"faults: {faulty.injected_failures} failed requests, {faulty.lost_responses} lost responses, "
        f"{faulty.delayed} delayed calls of {sum(faulty.calls.values())}; retry layer: {store.retries} retries, "
        f"{store.resolved_by_readback} outcomes resolved by read-back"
    )
    return result


def store_faults_local(profile: Profile, workdir: Path, say: Callable[[str], None]) -> ScenarioResult:
    say("store-faults [local]: running")
    result = run_store_faults(
        LocalObjectStore(workdir / "faults-local" / "store"), "local", profile, workdir / "faults-local", say
    )
    say(f"store-faults [local]: {result.verdict} in {result.duration_s:.1f}s")
    return result


def store_faults_s3(profile: Profile, workdir: Path, say: Callable[[str], None]) -> ScenarioResult:
    try:
        import moto  # noqa: F401 - only to say clearly why the S3 half cannot run
    except ImportError:
        return ScenarioResult("store-faults", "s3/moto", skipped="moto is not installed (pip install 'moto[server]')")
    from laminar_orchestration.store.s3 import S3ObjectStore, make_s3_client

    say("store-faults [s3/moto]: starting a moto server on loopback")
    with start_s3_server(workdir / "moto") as endpoint:
        client = make_s3_client(endpoint)
        bucket = f"laminar-chaos-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
        try:
            inner = S3ObjectStore(bucket, "chaos", client=client)
            say("store-faults [s3/moto]: running")
            result = run_store_faults(inner, "s3/moto", profile, workdir / "faults-s3", say)
        finally:
            client.close()
    say(f"store-faults [s3/moto]: {result.verdict} in {result.duration_s:.1f}s")
    return result
