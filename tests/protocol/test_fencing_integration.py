"""Integration tests of the fencing core against the real ledger and store."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import pytest

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.capabilities import CheckpointWriter, OutputCommitter, checkpoint_key
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.fencing import ConditionalPutFailed, PartitionGuard, PartitionGuardSet, StaleEpoch
from laminar_orchestration.protocol.keys import manifest_history_key
from laminar_orchestration.protocol.ledger import EpochConflict, Ledger
from laminar_orchestration.protocol.manifest import DeltaRef, StaleFencingToken, artifact_ref
from laminar_orchestration.store import ObjectStore, open_store
from tests.ledgers import new_ledger
from tests.stores import PausingStore

P, N = PartitionId, NodeId


@pytest.fixture
def ledger(store: ObjectStore) -> Ledger:
    return new_ledger(store, 2)


def test_end_to_end_assign_guard_validate_release(ledger: Ledger) -> None:
    token = ledger.acquire(P(0), N(1), expected_epoch=0)
    guard = PartitionGuard(token)
    guard.validate(ledger)
    guard.check()
    ledger.release(token, commit_ulid=None, source_offset=0)
    guard.validate(ledger)  # still the latest epoch; released is not revoked
    successor = ledger.acquire(P(0), N(2), expected_epoch=1)
    with pytest.raises(StaleEpoch):
        guard.validate(ledger)
    with pytest.raises(StaleEpoch):
        guard.check()
    PartitionGuard(successor).validate(ledger)


def _race(
    store_url: str,
    endpoint: str | None,
    node: int,
    rounds: int,
    start: float,
    out: mp.Queue[tuple[int, int, bool]],
) -> None:
    if endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
    ledger = Ledger(open_store(store_url))
    time.sleep(max(0.0, start - time.time()))
    for r in range(rounds):
        try:
            ledger.fence(P(1), N(node), expected_epoch=r, reason=f"round {r}")
            out.put((r, node, True))
        except EpochConflict:
            out.put((r, node, False))
        # Wait for the round to settle so every contender races for the same epoch.
        while (own := ledger.ownership(P(1))) is not None and own.epoch <= r:
            time.sleep(0.001)


def test_split_brain_prevention_across_processes(ledger: Ledger, store: ObjectStore) -> None:
    """Four processes race for the same epoch, round after round: one winner each round."""
    ctx = mp.get_context("spawn")
    out: mp.Queue[tuple[int, int, bool]] = ctx.Queue()
    rounds, procs = 10, 4
    start = time.time() + 3.0
    endpoint = getattr(store, "endpoint", None)
    workers = [
        ctx.Process(target=_race, args=(store.url, endpoint, n, rounds, start, out)) for n in range(1, procs + 1)
    ]
    for w in workers:
        w.start()
    results = [out.get(timeout=120) for _ in range(rounds * procs)]
    for w in workers:
        w.join(30)
    for r in range(rounds):
        won = [node for (rr, node, ok) in results if rr == r and ok]
        assert len(won) == 1, f"round {r}: winners {won}"
    grants = list(ledger.grants(P(1)))
    assert [g.epoch for g in grants] == list(range(1, rounds + 1))


def test_epoch_monotonicity_across_transfers(ledger: Ledger) -> None:
    epochs = []
    expected = 0
    for i in range(6):
        node = N(i % 3 + 1)
        if i % 2:
            token = ledger.fence(P(0), node, expected_epoch=expected, reason="failover")
            assert token is not None
        else:
            if expected:
                prev = ledger.adopt(P(0), N((i - 1) % 3 + 1))
                ledger.release(prev, commit_ulid=None, source_offset=0)
            token = ledger.acquire(P(0), node, expected_epoch=expected)
        epochs.append(token.epoch)
        expected = token.epoch
    assert epochs == sorted(set(epochs)) == list(range(1, 7))


def test_checkpoint_rejection_stale_node_via_conditional_put(ledger: Ledger, store: ObjectStore) -> None:
    """A zombie that read the manifest before the takeover loses at the store itself."""
    publisher = ManifestPublisher(OutputCommitter(store), store)
    old = ledger.acquire(P(0), N(1), expected_epoch=0)
    publisher.publish(old, ManifestUpdate(source_offset=10))

    # The zombie uploads its checkpoint (create-only, fenced metadata) and starts
    # publishing it, but stalls right before the conditional write of seq 3 (seq 1 is the
    # seal of epoch 1, seq 2 its commit).
    ckpt = CheckpointWriter(store)
    data = b"zombie state"
    key = checkpoint_key(f"checkpoints/00000/{old.epoch:010d}-zombie.bin")
    ckpt.put_checkpoint(key, data, PartitionGuard(old).conditional_put_precondition().as_metadata())
    paused = PausingStore(store, manifest_history_key(0, 3))
    zombie = ManifestPublisher(OutputCommitter(paused), paused)
    failure: list[BaseException] = []

    def zombie_publish() -> None:
        try:
            zombie.publish(
                old,
                ManifestUpdate(
                    source_offset=20,
                    deltas=(DeltaRef(ref=artifact_ref(key, data), start_offset=10, end_offset=20, rows=1),),
                ),
            )
        except BaseException as exc:
            failure.append(exc)

    t = threading.Thread(target=zombie_publish)
    t.start()
    assert paused.reached.wait(10)
    # Meanwhile node 2 is granted the partition: the grant seals the chain at epoch 2 (seq 3).
    new = ledger.fence(P(0), N(2), expected_epoch=1, reason="node 1 unresponsive")
    assert new is not None
    publisher.publish(new, ManifestUpdate(source_offset=10, note="takeover"))
    paused.resume.set()
    t.join(30)
    assert len(failure) == 1 and type(failure[0]) is ConditionalPutFailed
    assert (failure[0].expected_epoch, failure[0].actual_epoch) == (1, 2)
    current = publisher.current(P(0))
    assert current is not None and current.manifest.fencing_token == 2
    assert current.manifest.source_offset == 10 and not current.manifest.artifacts()


def test_stale_holder_cannot_publish_even_with_fresh_version(ledger: Ledger, store: ObjectStore) -> None:
    """A stale holder that reads the freshest manifest still loses on its token (tokens never go down)."""
    publisher = ManifestPublisher(OutputCommitter(store), store)
    holder_a = ledger.acquire(P(1), N(1), expected_epoch=0)
    publisher.publish(holder_a, ManifestUpdate(source_offset=5))
    holder_b = ledger.fence(P(1), N(2), expected_epoch=1, reason="A lost the lock")
    assert holder_b is not None
    publisher.publish(holder_b, ManifestUpdate(source_offset=7))
    fresh = publisher.current(P(1))
    assert fresh is not None and fresh.manifest.seq == 4  # seal, commit, seal, commit
    with pytest.raises(StaleFencingToken) as info:
        publisher.publish(holder_a, ManifestUpdate(source_offset=9))
    assert (info.value.expected_epoch, info.value.actual_epoch) == (1, 2)
    after = publisher.current(P(1))
    assert after is not None and after.raw == fresh.raw


def test_guard_refresh_under_load(ledger: Ledger) -> None:
    """Hot-path checks keep running while a background refresh detects the revocation."""
    token = ledger.acquire(P(0), N(1), expected_epoch=0)
    guards = PartitionGuardSet(N(1))
    guards.insert(PartitionGuard(token))
    stop = threading.Event()
    revoked_at: list[float] = []
    checks = [0]

    def hot_path() -> None:
        while not stop.is_set():
            try:
                guards.check(P(0))
                checks[0] += 1
            except StaleEpoch:
                revoked_at.append(time.monotonic())
                return

    def refresher() -> None:
        while not stop.is_set():
            guards.refresh_all(ledger)
            time.sleep(0.02)

    threads = [threading.Thread(target=hot_path), threading.Thread(target=refresher)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    assert not revoked_at and checks[0] > 0
    fenced_at = time.monotonic()
    ledger.fence(P(0), N(2), expected_epoch=1, reason="revoke")
    threads[0].join(10)
    stop.set()
    threads[1].join(10)
    assert revoked_at, "the hot path never saw the revocation"
    assert revoked_at[0] >= fenced_at
