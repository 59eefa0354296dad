"""The signed manifest chain on the local store: what a writer without the grant's key can and cannot do.

Forged entries (no signature, another key, altered bytes, an epoch never granted) are void:
readers pass over them, publishers move past them, audits report them and count nothing they
name. A forged release is no release. A node that cannot read its grant's key does not take
the partition. The same attacks with another node's IAM keys are in tests/scenarios/test_least_privilege.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ops.verify import audit_partition
from laminar_orchestration.protocol import keys
from laminar_orchestration.protocol.capabilities import (
    LedgerWriter,
    ManifestKey,
    OutputCommitter,
    ledger_key,
    manifest_key,
)
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.fencing import FencingToken
from laminar_orchestration.protocol.ledger import Ledger, NotReleased
from laminar_orchestration.protocol.manifest import ArtifactRef, PartitionManifest, SupersededEntry
from laminar_orchestration.protocol.records import EpochGrant, PartitionStatus, ReleaseRecord, now
from laminar_orchestration.protocol.signing import ForgedRecord, SigningKey, SigningKeyUnavailable, sign_record
from laminar_orchestration.store import LocalObjectStore, ObjectStore
from laminar_orchestration.ulid import next_ulid

P, N = PartitionId, NodeId
FAKE_OUTPUT = ArtifactRef(key="sink/00000/forged.parquet", size=1, sha256="0" * 64)


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "store")


def _owned(store: ObjectStore) -> tuple[Ledger, FencingToken, ManifestPublisher, ManifestVersion]:
    """Partition 0 granted to node 1 at epoch 1 (by the control plane), adopted, one commit on top of the seal."""
    ManifestReader(store)  # nothing cached anywhere: each part below reads what it needs
    Ledger(store).init_cluster(2)
    Ledger(store).acquire(P(0), N(1), expected_epoch=0, reason="place")
    node = Ledger(store)
    token = node.adopt(P(0), N(1))
    publisher = ManifestPublisher(OutputCommitter(store), store, signing_keys=node.signing_keys)
    # No events: an audit of the genuine chain finds nothing, so any issue comes from a forgery.
    first = publisher.publish(token, ManifestUpdate(source_offset=0))
    return node, token, publisher, first


def _next(version: ManifestVersion, **update: object) -> PartitionManifest:
    """A plausible successor of `version` (right seq and parent hash), unsigned."""
    m = version.manifest
    fields: dict[str, object] = {
        "seq": m.seq + 1,
        "commit_ulid": next_ulid(m.commit_ulid),
        "parent_hash": version.raw_hash,
        "source_offset": m.source_offset + 1000,
        "outputs": [FAKE_OUTPUT],
        "note": "",
        "signature": None,
    }
    fields.update(update)
    return m.model_copy(update=fields)


def _plant(store: ObjectStore, manifest: PartitionManifest) -> str:
    """Store `manifest` as the history entry at its seq, the way any writer of ``manifests/`` can."""
    key = keys.manifest_history_key(manifest.partition, manifest.seq)
    OutputCommitter(store).create_manifest(manifest_key(key), manifest.model_dump_json().encode())
    return key


def _tampered(version: ManifestVersion) -> PartitionManifest:
    """Signed by the right key, then altered: the signature no longer covers the bytes."""
    return _next(version).model_copy(update={"signature": version.manifest.signature})


def _other_key(manifest: PartitionManifest) -> PartitionManifest:
    return sign_record(manifest, SigningKey.generate(manifest.partition, manifest.fencing_token, manifest.node))


FORGERIES: dict[str, Callable[[ManifestVersion], PartitionManifest]] = {
    "missing signature": lambda v: _next(v),
    "tampered after signing": _tampered,
    "another key": lambda v: _other_key(_next(v)),
    "a higher token never granted": lambda v: _other_key(_next(v, fencing_token=v.manifest.fencing_token + 5)),
    "another node at the owner's epoch": lambda v: _other_key(_next(v, node=2)),
}


@pytest.mark.parametrize("how", list(FORGERIES))
def test_a_forged_entry_is_passed_over_and_the_owner_commits_past_it(store: LocalObjectStore, how: str) -> None:
    node, token, publisher, first = _owned(store)
    forged_key = _plant(store, FORGERIES[how](first))

    reader = ManifestReader(store)
    assert reader.current(P(0)) == first  # nothing the forged entry names is current
    forged = reader.forged[forged_key]
    assert isinstance(forged, ForgedRecord) and forged.key == forged_key and forged.partition == 0
    assert reader.entry(P(0), first.manifest.seq + 1) is None

    # The owner's next commit collides with the forged entry on its sequence number and moves on.
    second = publisher.publish(token, ManifestUpdate(source_offset=0, note="after the forgery"))
    assert second.manifest.seq == first.manifest.seq + 2 and second.manifest.parent_hash == first.raw_hash
    fresh = ManifestReader(store)
    assert fresh.current(P(0)) == second
    assert [v.manifest.seq for v in fresh.history(P(0))] == [1, 2, 4]

    # The audit reports the forged entry and counts nothing it names.
    audit = audit_partition(store, P(0), ledger=node)
    assert [i.kind for i in audit.issues] == ["forged"], audit.issues
    assert audit.committed_offset == 0 and audit.manifests == 3  # the forged entry claimed offset 1000


def test_a_forged_pointer_is_ignored_in_favour_of_the_verified_chain(store: LocalObjectStore) -> None:
    _, token, publisher, first = _owned(store)
    forged = _other_key(_next(first, seq=first.manifest.seq + 50))
    pointer = keys.manifest_pointer_key(0)
    obj = store.get(pointer)
    OutputCommitter(store).swap_manifest(manifest_key(pointer), forged.model_dump_json().encode(), obj.etag)
    reader = ManifestReader(store)
    assert reader.current(P(0)) == first and pointer in reader.forged
    # The owner's next pointer move (once per POINTER_EVERY entries, and before a release) puts it back.
    second = publisher.publish(token, ManifestUpdate(source_offset=0))
    assert ManifestReader(store).current(P(0)) == second
    publisher.flush_pointer(P(0))
    assert store.get(pointer).data == second.raw


def _failed_over(store: ObjectStore) -> tuple[Ledger, FencingToken, ManifestPublisher, FencingToken, ManifestVersion]:
    """Node 1 owned partition 0 at epoch 1; the control plane fenced it for node 2, which adopted epoch 2.

    Returns node 1's ledger (it still holds epoch 1's key) and token, node 2's publisher and
    token, and the seal at epoch 2."""
    node1, old, _, _ = _owned(store)
    Ledger(store).fence(P(0), N(2), expected_epoch=old.epoch, reason="node 1 unresponsive")
    node2 = Ledger(store)
    new = node2.adopt(P(0), N(2))
    publisher = ManifestPublisher(OutputCommitter(store), store, signing_keys=node2.signing_keys)
    sealed = ManifestReader(store).current(P(0))
    assert sealed is not None and sealed.manifest.fencing_token == new.epoch
    return node1, old, publisher, new, sealed


def _stale_entry(node1: Ledger, old: FencingToken, after: ManifestVersion) -> PartitionManifest:
    """What the fenced node 1 can write: a successor of `after`, signed with epoch 1's genuine key."""
    return sign_record(_next(after, fencing_token=old.epoch, node=1), node1.signing_keys.get(1, 0, old.epoch))


@pytest.mark.parametrize("move_pointer", [False, True], ids=["entry", "entry and pointer"])
def test_a_former_owners_signed_entry_after_the_seal_is_void(store: LocalObjectStore, move_pointer: bool) -> None:
    """The fenced owner still holds its epoch's key: what it signs after the seal is passed over by every
    reader (it neither becomes current nor stops them), the new owner publishes past it, and the audit
    reports it and counts nothing it names."""
    node1, old, publisher, new, sealed = _failed_over(store)
    stale = _stale_entry(node1, old, sealed)
    stale_key = _plant(store, stale)
    if move_pointer:
        pointer = keys.manifest_pointer_key(0)
        OutputCommitter(store).swap_manifest(
            manifest_key(pointer), stale.model_dump_json().encode(), store.get(pointer).etag
        )

    reader = ManifestReader(store)
    assert reader.current(P(0)) == sealed
    void = reader.superseded[stale_key]
    assert isinstance(void, SupersededEntry) and void.epoch == old.epoch and void.node == 1

    commit = publisher.publish(new, ManifestUpdate(source_offset=0, note="the new owner's first commit"))
    assert commit.manifest.seq == sealed.manifest.seq + 2 and commit.manifest.parent_hash == sealed.raw_hash
    assert ManifestReader(store).current(P(0)) == commit
    stale_seq = sealed.manifest.seq + 1
    assert [v.manifest.seq for v in ManifestReader(store).history(P(0))] == [1, 2, stale_seq - 1, stale_seq + 1]

    audit = audit_partition(store, P(0), ledger=node1)
    assert [i.kind for i in audit.issues] == ["superseded"], audit.issues
    assert audit.committed_offset == 0  # the stale entry claimed offset 1000


def test_a_former_owners_pointer_to_its_void_entry_behind_the_new_owners_commit_stops_no_reader(
    store: LocalObjectStore,
) -> None:
    """The fenced owner plants its signed entry, the new owner commits past it, then the fenced owner
    points the pointer back at its entry: a fresh reader starts there, finds the genuine commit does
    not follow it, and still reads the genuine chain (it does not fail on a broken chain)."""
    node1, old, publisher, new, sealed = _failed_over(store)
    stale = _stale_entry(node1, old, sealed)
    stale_key = _plant(store, stale)
    commit = publisher.publish(new, ManifestUpdate(source_offset=0, note="the new owner's commit past it"))
    assert commit.manifest.seq == stale.seq + 1 and commit.manifest.parent_hash == sealed.raw_hash
    pointer = keys.manifest_pointer_key(0)
    OutputCommitter(store).swap_manifest(
        manifest_key(pointer), stale.model_dump_json().encode(), store.get(pointer).etag
    )

    reader = ManifestReader(store)
    chain = reader.read_chain(P(0))
    assert chain.version == commit and chain.next_seq == commit.manifest.seq + 1
    assert stale_key in reader.superseded
    # The new owner's next pointer move (its reader trusts its own last entry) puts the pointer back.
    after = publisher.publish(new, ManifestUpdate(source_offset=0, note="and the next"))
    publisher.flush_pointer(P(0))
    assert ManifestReader(store).current(P(0)) == after and store.get(pointer).data == after.raw


def test_a_former_owner_racing_the_new_owners_publish_never_lands(store: LocalObjectStore) -> None:
    """Threads: the new owner's publish is held (by an injected hook) between reading the chain and
    creating its entry while the fenced owner appends its signed entry at that very sequence number.
    The publish moves past it, and readers see only the new owner's chain."""
    node1, old, publisher, new, sealed = _failed_over(store)
    read_done, planted = threading.Event(), threading.Event()
    original = OutputCommitter.create_manifest
    errors: list[BaseException] = []

    def held_create(
        self: OutputCommitter, key: ManifestKey, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> str:
        if threading.current_thread().name == "new-owner" and not read_done.is_set():
            read_done.set()
            assert planted.wait(10), "the former owner never wrote"
        return original(self, key, data, metadata)

    def former_owner() -> None:
        try:
            assert read_done.wait(10)
            _plant(store, _stale_entry(node1, old, sealed))
        except BaseException as exc:
            errors.append(exc)
        finally:
            planted.set()

    results: list[ManifestVersion] = []

    def new_owner() -> None:
        try:
            results.append(publisher.publish(new, ManifestUpdate(source_offset=0, note="racing")))
        except BaseException as exc:
            errors.append(exc)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(OutputCommitter, "create_manifest", held_create)
        threads = [threading.Thread(target=former_owner), threading.Thread(target=new_owner, name="new-owner")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert errors == [], errors
    (commit,) = results
    assert commit.manifest.seq == sealed.manifest.seq + 2 and commit.manifest.fencing_token == new.epoch
    reader = ManifestReader(store)
    assert reader.current(P(0)) == commit
    assert all(v.manifest.fencing_token == new.epoch for v in reader.history(P(0)) if v.manifest.seq > 2)
    assert list(reader.superseded) == [keys.manifest_history_key(0, sealed.manifest.seq + 1)]


def test_a_forged_release_is_no_release(store: LocalObjectStore) -> None:
    node, token, _, first = _owned(store)
    forged = ReleaseRecord(
        partition=0, epoch=token.epoch, node=1, commit_ulid=first.manifest.commit_ulid, source_offset=0,
        released_at=now(),
    )  # fmt: skip
    key = keys.release_key(0, token.epoch)
    signed_elsewhere = sign_record(forged, SigningKey.generate(0, token.epoch, 1))
    LedgerWriter(store).create(ledger_key(key), signed_elsewhere.model_dump_json().encode())

    control_plane = Ledger(store)
    assert control_plane.release_record(P(0), token.epoch) is None
    own = control_plane.ownership(P(0))
    assert own is not None and own.status == PartitionStatus.ACTIVE
    with pytest.raises(NotReleased):
        control_plane.acquire(P(0), N(2), expected_epoch=token.epoch, reason="graceful move")
    # The owner's own release collides with it: a typed error, and still no release.
    with pytest.raises(ForgedRecord) as info:
        node.release(token, commit_ulid=first.manifest.commit_ulid, source_offset=0)
    assert info.value.key == key and info.value.claimed_epoch == token.epoch
    assert control_plane.release_record(P(0), token.epoch) is None


def test_a_genuine_release_verifies(store: LocalObjectStore) -> None:
    node, token, _, first = _owned(store)
    record = node.release(token, commit_ulid=first.manifest.commit_ulid, source_offset=0)
    assert record.signature is not None
    assert Ledger(store).release_record(P(0), token.epoch) == record
    granted = Ledger(store).acquire(P(0), N(2), expected_epoch=token.epoch, reason="graceful move")
    assert granted.epoch == token.epoch + 1


def test_without_its_grants_key_a_node_does_not_take_the_partition(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    Ledger(store).init_cluster(1)
    Ledger(store).acquire(P(0), N(1), expected_epoch=0, reason="place")
    key = keys.signing_key_key(1, 0, 1)
    store.delete_if_match(key, store.get(key).etag)  # gone (an S3 403 reads the same way: the object is named)
    with pytest.raises(SigningKeyUnavailable) as info:
        Ledger(store).adopt(P(0), N(1))
    assert info.value.key == key and info.value.node == 1 and info.value.epoch == 1 and key in str(info.value)
    store.put_if_absent(key, b"not a key")
    with pytest.raises(SigningKeyUnavailable):
        Ledger(store).adopt(P(0), N(1))


def test_a_key_that_is_not_the_grants_is_refused(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    Ledger(store).init_cluster(1)
    Ledger(store).acquire(P(0), N(1), expected_epoch=0, reason="place")
    key = keys.signing_key_key(1, 0, 1)
    store.delete_if_match(key, store.get(key).etag)
    store.put_if_absent(key, SigningKey.generate(0, 1, 1).model_dump_json().encode())
    with pytest.raises(SigningKeyUnavailable, match="not the grant's key"):
        Ledger(store).adopt(P(0), N(1))


def test_every_entry_and_release_is_signed_by_its_grants_key(store: LocalObjectStore) -> None:
    node, token, _, _ = _owned(store)
    node.release(token, commit_ulid=None, source_offset=0)
    Ledger(store).acquire(P(0), N(2), expected_epoch=token.epoch, reason="graceful move")
    reader = ManifestReader(store)
    history = list(reader.history(P(0)))
    assert [v.manifest.fencing_token for v in history] == [1, 1, 2] and not reader.forged
    for version in history:
        grant = Ledger(store).grant(P(0), version.manifest.fencing_token)
        assert grant is not None and grant.public_key is not None and version.manifest.signature is not None


def test_a_chain_whose_grant_carries_no_key_stops_readers(store: LocalObjectStore) -> None:
    """A grant from before grants carried keys: nothing at its epoch verifies, and passing over the
    whole chain would restore nothing, so readers stop with the typed error instead."""
    _owned(store)
    key = keys.grant_key(0, 1)
    old = store.get(key)
    grant = EpochGrant.model_validate_json(old.data).model_copy(update={"public_key": None})
    store.delete_if_match(key, old.etag)
    store.put_if_absent(key, grant.model_dump_json().encode())
    with pytest.raises(ForgedRecord, match="no public key") as info:
        ManifestReader(store).current(P(0))
    assert info.value.claimed_epoch == 1
