"""The fence point is in the manifest chain: a grant seals it, readers enforce it; and restart backoff.

The interleavings are staged deterministically (a writer paused inside its
conditional write, a hook inside the new owner's restore) on both store
backends; the workers are the real runtime with a pyarrow fold instead of Spark.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa

from laminar_dev.chaos import ArrowBatchEngine, ArrowNode
from laminar_orchestration.control.snapshot import snapshot_cluster
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.dataplane.engine import BatchEvents
from laminar_orchestration.dataplane.restore import CatchUp
from laminar_orchestration.dataplane.worker import PartitionWorker
from laminar_orchestration.dataplane.worker_state import WorkerState
from laminar_orchestration.identity import UNASSIGNED, NodeId, PartitionId
from laminar_orchestration.ops.verify import audit_epoch_history
from laminar_orchestration.protocol.capabilities import OutputCommitter, manifest_key
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.fencing import EpochError, FencingToken
from laminar_orchestration.protocol.keys import manifest_history_key, manifest_pointer_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.manifest import PartitionManifest
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.records import PartitionProgress
from laminar_orchestration.protocol.signing import sign_record
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import LocalObjectStore, ObjectStore
from laminar_orchestration.ulid import next_ulid
from tests.dataplane.plane import running
from tests.ledgers import new_ledger, place_on_node_1
from tests.nodes import quick_node_config
from tests.stores import PausingStore

P, N = PartitionId, NodeId


def _node(store: ObjectStore, node_id: int, tmp_path: Path) -> ArrowNode:
    cfg = NodeConfig(store_url=store.url, node_id=node_id, workdir=str(tmp_path / f"node{node_id}"))
    node = ArrowNode(cfg, store=store)
    node.start_spark()
    return node


def _tokens(store: ObjectStore) -> list[int]:
    return [v.manifest.fencing_token for v in ManifestReader(store).history(P(0))]


def _owned_with_a_commit(store: ObjectStore) -> tuple[Ledger, FencingToken, ManifestVersion]:
    """Partition 0 held by node 1 at epoch 1, with one commit on top of the grant's seal."""
    ledger = Ledger(store)
    ledger.init_cluster(1)
    token = ledger.acquire(P(0), N(1), expected_epoch=0)
    version = ManifestPublisher(OutputCommitter(store), store).publish(
        token, ManifestUpdate(source_offset=0, note="first commit")
    )
    return ledger, token, version


def _fenced_writers_entry(ledger: Ledger, old: FencingToken, sealed: ManifestVersion) -> PartitionManifest:
    """The entry after `sealed` under the old token, with the right sequence number and parent hash,
    signed with the old epoch's key (the fenced writer holds it): the store's create-only write
    accepts it and its signature verifies, only the chain's rules can refuse it."""
    unsigned = sealed.manifest.model_copy(
        update={
            "seq": sealed.manifest.seq + 1,
            "fencing_token": old.epoch,
            "node": 1,
            "commit_ulid": next_ulid(sealed.manifest.commit_ulid),
            "parent_hash": sealed.raw_hash,
            "source_offset": 7,
            "note": "",
        }
    )
    return sign_record(unsigned, ledger.signing_keys.get(1, 0, old.epoch))


def test_a_grant_seals_the_chain_and_the_seal_carries_the_last_commit(store: ObjectStore) -> None:
    ledger, _old, last = _owned_with_a_commit(store)
    assert ledger.fence(P(0), UNASSIGNED, expected_epoch=1, reason="drain node 1") is None
    seal = ManifestReader(store).current(P(0))
    assert seal is not None
    m = seal.manifest
    assert (m.seq, m.fencing_token, m.node, m.outputs, m.parent_hash) == (3, 2, 0, [], last.raw_hash)
    assert m.is_seal and m.note.startswith("seal")
    assert (m.source_offset, m.snapshot, m.deltas, m.events_applied) == (0, None, [], 0)
    # Idempotent: sealing again at the same (or a lower) epoch writes nothing.
    again = ManifestPublisher(OutputCommitter(store), store).seal(P(0), 2, node=0)
    assert again.raw == seal.raw and _tokens(store) == [1, 1, 2]
    audit = audit_epoch_history(store, P(0), ledger=ledger)
    assert audit.issues == [] and audit.owners == {1: {1}} and audit.stale_writes == 0


def test_a_publish_probed_before_the_grant_is_rejected_once_the_grant_sealed_the_chain(
    store: ObjectStore, tmp_path: Path
) -> None:
    """Owner probes (no successor grant), the control plane grants epoch 2, the new owner reads the
    chain to restore, then the old owner's conditional write arrives: it must not be accepted."""
    ledger, old, last = _owned_with_a_commit(store)
    paused = PausingStore(store, manifest_history_key(0, last.manifest.seq + 1))
    worker = PartitionWorker(_node(paused, 1, tmp_path), P(0))
    worker._install(old)
    outcome: list[object] = []

    def commit() -> None:
        try:
            outcome.append(worker._publish(ManifestUpdate(source_offset=0, note="late commit")))
        except Exception as exc:
            outcome.append(exc)

    t = threading.Thread(target=commit)
    t.start()
    assert paused.reached.wait(10), "the old owner never reached its conditional write"
    assert ledger.fence(P(0), N(2), expected_epoch=1, reason="node 1 unresponsive") is not None
    restored = ManifestReader(store).current(P(0))  # what the new owner restores from
    paused.resume.set()
    t.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], EpochError), outcome
    assert worker.tracker.is_fenced
    after = ManifestReader(store).current(P(0))
    assert restored is not None and after is not None and after.raw == restored.raw
    assert _tokens(store) == [1, 1, 2]
    assert audit_epoch_history(store, P(0), ledger=ledger).stale_writes_accepted == 0


def test_readers_pass_over_an_entry_a_fenced_writer_created_without_the_publisher(store: ObjectStore) -> None:
    ledger, old, _ = _owned_with_a_commit(store)
    new = ledger.fence(P(0), N(2), expected_epoch=1, reason="node 1 unresponsive")
    assert new is not None
    sealed = ManifestReader(store).current(P(0))
    assert sealed is not None and sealed.manifest.fencing_token == 2
    forged = _fenced_writers_entry(ledger, old, sealed)
    key = manifest_history_key(0, forged.seq)
    OutputCommitter(store).create_manifest(manifest_key(key), forged.model_dump_json().encode())
    # The entry is void: readers pass over it, and the new owner's publish moves past it.
    reader = ManifestReader(store)
    assert reader.current(P(0)) == sealed
    void = reader.superseded[key]
    assert (void.epoch, void.node) == (old.epoch, 1) and "stale fencing token" in str(void) and key in str(void)
    published = ManifestPublisher(OutputCommitter(store), store).publish(new, ManifestUpdate(source_offset=7))
    assert published.manifest.seq == forged.seq + 1 and published.manifest.parent_hash == sealed.raw_hash


def test_a_granters_read_on_a_stale_word_is_not_trusted_when_it_seals_later(store: ObjectStore) -> None:
    """A granter reads the chain believing epoch 1 the newest (its read of the head lagged) while epoch 2
    is granted already and a fenced writer's entry under epoch 1 sits behind the pointer. That read may
    end on the void entry (the granter's create of grant 2 then fails), but it must not be kept as
    checked: the granter's next seal builds on the newest genuine entry, the seal of epoch 2."""
    ledger, old, _ = _owned_with_a_commit(store)
    assert ledger.fence(P(0), UNASSIGNED, expected_epoch=1, reason="node 1 unresponsive") is None
    sealed = ManifestReader(store).current(P(0))
    assert sealed is not None and sealed.manifest.fencing_token == 2
    entry = _fenced_writers_entry(ledger, old, sealed)
    void = entry.model_dump_json().encode()
    committer = OutputCommitter(store)
    committer.create_manifest(manifest_key(manifest_history_key(0, entry.seq)), void)
    pointer = manifest_key(manifest_pointer_key(0))
    committer.swap_manifest(pointer, void, store.get(manifest_pointer_key(0)).etag)

    granter = Ledger(store)  # one process: its sealer keeps what it checked between grants
    stale = granter.sealer.read_chain(0, newest_grant=1)
    assert stale.version is not None and stale.version.manifest.seq == entry.seq  # true on its word only
    assert granter.fence(P(0), N(2), expected_epoch=2, reason="place on node 2") is not None
    seal = ManifestReader(store).current(P(0))
    assert seal is not None and seal.manifest.fencing_token == 3
    assert seal.manifest.parent_hash == sealed.raw_hash, "the seal of epoch 3 continues from the void entry"
    assert seal.manifest.source_offset == sealed.manifest.source_offset


def test_a_new_owner_superseded_before_its_takeover_takes_nothing_over(store: ObjectStore, tmp_path: Path) -> None:
    ledger, old, last = _owned_with_a_commit(store)
    ledger.release(old, commit_ulid=last.manifest.commit_ulid, source_offset=0)
    ledger.acquire(P(0), N(2), expected_epoch=1, reason="place")  # the control plane grants, node 2 adopts
    worker = PartitionWorker(_node(store, 2, tmp_path), P(0))
    restore = worker._restore

    def restore_while_superseded(version: ManifestVersion | None) -> CatchUp:
        # The control plane moves the partition on while node 2 is still restoring.
        assert ledger.fence(P(0), N(3), expected_epoch=2, reason="node 2 too slow") is not None
        return restore(version)

    worker._restore = restore_while_superseded  # type: ignore[method-assign,assignment]
    worker.start()
    # Driven without its node, nothing refreshes its kill switch: it finds the fence at its next
    # write, here its stop (a node finds it at its next refresh); meanwhile it must write nothing.
    worker.join(2)
    if worker.is_alive():
        worker.request_stop()
        worker.join(20)
    assert worker.state_name == WorkerState.REVOKED
    history = list(ManifestReader(store).history(P(0)))
    assert [v.manifest.fencing_token for v in history] == [1, 1, 2, 3]
    # Node 2's only entry is the seal its own grant made; it never published after epoch 3's.
    assert [v.manifest.is_seal for v in history if v.manifest.node == 2] == [True]
    audit = audit_epoch_history(store, P(0), ledger=ledger)
    assert audit.stale_writes_accepted == 0 and audit.max_owners_per_epoch == 1


# --- restart backoff ------------------------------------------------------------------------------


class PoisonEngine(ArrowBatchEngine):
    """Every batch fails, as a poison record would make it."""

    def aggregate(
        self, events: BatchEvents, *, epoch: int, generation: int, job_group: str | None = None, progress: object = None
    ) -> pa.Table:
        raise ValueError("poison batch")


class PoisonNode(ArrowNode):
    def start_spark(self) -> None:
        self.engine = PoisonEngine()


def test_a_failing_partition_backs_off_and_publishes_no_manifest_per_restart(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    ledger = new_ledger(store, 1)
    SourceLog(store, partitions=1).append(0, generate_events(500, 5, 1, 1)[0])
    place_on_node_1(ledger)
    node = PoisonNode(
        quick_node_config(store, tmp_path, restart_backoff_initial_s=0.2, restart_backoff_max_s=0.8), store=store
    )
    seen: list[PartitionProgress] = []
    with running(node):
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            progress = node._progress().get(0)
            failures = progress.consecutive_failures if progress is not None else 0
            if progress is not None and failures and (not seen or seen[-1].consecutive_failures != failures):
                seen.append(progress)
            time.sleep(0.02)
        reported = ledger.members.node(N(1))
        status = snapshot_cluster(ledger)
    # One seal when the partition was first acquired; the restarts at the same epoch write nothing.
    assert len(list(ManifestReader(store).history(P(0)))) <= 2
    assert [g.epoch for g in ledger.grants(P(0))] == [1]  # restarts adopt the epoch, never re-fence it
    counts = [p.consecutive_failures for p in seen]
    delays = [p.retry_delay_s for p in seen]
    assert counts == list(range(1, len(counts) + 1)) and len(counts) >= 4, counts
    assert delays[:4] == [0.2, 0.4, 0.8, 0.8], delays  # doubling, capped
    # 0.2 + 0.4 + 0.8 + 0.8 ... s of delays: far fewer restarts than the reconcile loop's 50 per second.
    assert len(counts) <= 7, counts
    assert all(p.last_failure is not None and "poison batch" in p.last_failure for p in seen)
    assert reported is not None and reported.partitions[0].consecutive_failures >= 1
    row = status.partitions[0]
    assert row.failures >= 1 and row.last_failure is not None and "poison batch" in row.last_failure
