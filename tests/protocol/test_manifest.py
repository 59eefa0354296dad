"""Per-partition commit manifests: what one commit names (snapshot files, deltas, outputs), how a seal
is told apart, the stored bytes round-tripped and every malformed one refused, the succession rules an
entry must meet to follow its predecessor (each break a typed error), and the artifacts checked by HEAD."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from laminar_orchestration.errors import ErrorKind
from laminar_orchestration.protocol import manifest
from laminar_orchestration.protocol.fencing import EpochError
from laminar_orchestration.protocol.manifest import (
    SEAL_NOTE,
    SHA256_METADATA,
    ArtifactMismatch,
    ArtifactMissing,
    DeltaRef,
    PartitionManifest,
    SnapshotFile,
    SnapshotRef,
    artifact_ref,
    verify_artifacts,
)
from laminar_orchestration.protocol.records import CorruptLedgerObject, parse_record
from laminar_orchestration.store import LocalObjectStore
from laminar_orchestration.ulid import next_ulid

AT = datetime(2030, 1, 1, tzinfo=UTC)
KEY = "manifests/00002/history/00000000000000000001.json"


def _first(**fields: Any) -> PartitionManifest:
    """Partition 2's first entry: node 1 (generation 1) at epoch 1, source offset 10, nothing named."""
    values: dict[str, Any] = {
        "partition": 2,
        "seq": 1,
        "fencing_token": 1,
        "node": 1,
        "generation": 1,
        "commit_ulid": next_ulid(),
        "parent_hash": None,
        "cluster_epoch": 1,
        "source_offset": 10,
        "outputs": [],
        "events_applied": 10,
        "committed_at": AT,
        **fields,
    }
    return PartitionManifest(**values)


def _raw_hash(entry: PartitionManifest) -> str:
    return hashlib.sha256(entry.model_dump_json().encode()).hexdigest()


def _next(previous: PartitionManifest, **fields: Any) -> PartitionManifest:
    """The entry that may follow `previous`, with `fields` changed."""
    values = {
        "seq": previous.seq + 1,
        "commit_ulid": next_ulid(previous.commit_ulid),
        "parent_hash": _raw_hash(previous),
        "source_offset": previous.source_offset + 5,
        **fields,
    }
    return previous.model_copy(update=values)


def _named(data: dict[str, bytes]) -> PartitionManifest:
    """A manifest naming a snapshot file, a delta and an output with the given contents."""
    snapshot = SnapshotRef(
        source_offset=8, files=[SnapshotFile(name="000008.sst", ref=artifact_ref("c/snap.sst", data["c/snap.sst"]))]
    )
    delta = DeltaRef(ref=artifact_ref("c/d.parquet", data["c/d.parquet"]), start_offset=8, end_offset=10, rows=2)
    return _first(snapshot=snapshot, deltas=[delta], outputs=[artifact_ref("s/out.parquet", data["s/out.parquet"])])


CONTENTS = {"c/snap.sst": b"state", "c/d.parquet": b"delta!", "s/out.parquet": b"output rows"}


def test_a_manifest_names_its_snapshot_files_deltas_and_outputs_in_order() -> None:
    entry = _named(CONTENTS)
    assert [ref.key for ref in entry.artifacts()] == ["c/snap.sst", "c/d.parquet", "s/out.parquet"]
    assert entry.state_offset == 8 and entry.snapshot is not None and entry.snapshot.size == 5
    ref = entry.outputs[0]
    assert (ref.size, ref.sha256) == (11, hashlib.sha256(b"output rows").hexdigest())
    bare = _first()
    assert bare.artifacts() == [] and bare.state_offset == 0  # no snapshot: the state starts empty


def test_a_seal_is_an_entry_noted_as_one_that_names_no_outputs() -> None:
    assert _first(note=f"{SEAL_NOTE} at epoch 2").is_seal
    assert not _first(note="first commit").is_seal
    assert not _named(CONTENTS).model_copy(update={"note": SEAL_NOTE}).is_seal  # a commit with outputs


def test_a_manifest_round_trips_through_its_stored_bytes_and_malformed_bytes_are_refused() -> None:
    entry = _named(CONTENTS)
    data = entry.model_dump_json().encode()
    assert parse_record(KEY, data, PartitionManifest) == entry
    body = json.loads(data)
    for field, value in (
        ("seq", 0),
        ("fencing_token", 0),
        ("commit_ulid", "short"),
        ("outputs", [{"key": "k", "size": 1, "sha256": "ab"}]),  # not a sha256
        ("snapshot", {"source_offset": 0, "files": [{"name": "../escape", "ref": body["outputs"][0]}]}),
        ("deltas", [{**body["deltas"][0], "rows": -1}]),
        ("kind", "release"),
        ("fencing_tokn", 2),
    ):
        with pytest.raises(CorruptLedgerObject) as info:
            parse_record(KEY, json.dumps({**body, field: value}).encode(), PartitionManifest)
        assert info.value.key == KEY and info.value.reason.startswith(field), (field, info.value.reason)
    with pytest.raises(ValidationError):
        SnapshotFile(name="", ref=entry.outputs[0])


def test_an_entry_that_follows_its_predecessor_is_accepted() -> None:
    previous = _first()
    _next(previous).validate_succession(previous, _raw_hash(previous))
    # A later epoch, another node, an earlier generation of that node, the same offset: all may follow.
    _next(previous, fencing_token=2, node=3, generation=0, source_offset=10).validate_succession(
        previous, _raw_hash(previous)
    )
    # Forged entries that are no part of the chain may stand between the two.
    _next(previous, seq=4).validate_succession(previous, _raw_hash(previous), skipped=2)


@pytest.mark.parametrize(
    ("change", "error", "fields"),
    [
        ({"seq": 3}, manifest.SequenceGap, {"previous": 1, "attempted": 3}),
        ({"seq": 1}, manifest.SequenceGap, {"previous": 1, "attempted": 1}),
        ({"fencing_token": 2}, manifest.StaleFencingToken, {"expected_epoch": 2, "actual_epoch": 3}),
        ({"generation": 1}, manifest.StaleGeneration, {"generation": 1, "current_generation": 2}),
        ({"parent_hash": "0" * 64}, manifest.ParentHashMismatch, {"actual": "0" * 64}),
        ({"parent_hash": None}, manifest.ParentHashMismatch, {"actual": None}),
        ({"source_offset": 9}, manifest.SourceOffsetRegression, {"previous": 10, "attempted": 9}),
    ],
    ids=["seq gap", "seq repeated", "stale token", "stale generation", "wrong parent", "no parent", "offset back"],
)
def test_an_entry_that_breaks_a_succession_rule_is_refused_with_its_typed_error(
    change: dict[str, Any], error: type[Exception], fields: dict[str, Any]
) -> None:
    previous = _first(fencing_token=3, generation=2)
    with pytest.raises(error) as info:
        _next(previous, **change).validate_succession(previous, _raw_hash(previous))
    expected = {"partition": 2, **fields}
    assert {name: getattr(info.value, name) for name in expected} == expected and "partition 2" in str(info.value)


def test_a_commit_ulid_that_does_not_increase_is_refused() -> None:
    previous = _first()
    with pytest.raises(manifest.CommitUlidRegression) as info:
        _next(previous, commit_ulid=previous.commit_ulid).validate_succession(previous, _raw_hash(previous))
    assert (info.value.previous, info.value.attempted) == (previous.commit_ulid, previous.commit_ulid)


def test_a_stale_writer_is_fenced_while_a_broken_chain_is_a_conflict() -> None:
    """A stale token or generation means the writer lost the partition; the other breaks are conflicts."""
    for fenced in (manifest.StaleFencingToken, manifest.StaleGeneration):
        assert issubclass(fenced, EpochError) and fenced.error_kind is ErrorKind.FENCED
    for broken in (
        manifest.SequenceGap,
        manifest.CommitUlidRegression,
        manifest.ParentHashMismatch,
        manifest.SourceOffsetRegression,
    ):
        assert issubclass(broken, manifest.SuccessionError) and broken.error_kind is ErrorKind.CONFLICT


def test_artifacts_are_verified_by_head_size_and_checksum(local_store: LocalObjectStore) -> None:
    entry = _named(CONTENTS)
    with pytest.raises(ArtifactMissing) as missing:
        verify_artifacts(local_store, entry)
    assert missing.value.key == "c/snap.sst" and missing.value.error_kind is ErrorKind.CORRUPT_DATA
    for key, data in CONTENTS.items():
        local_store.put_if_absent(key, data, {SHA256_METADATA: hashlib.sha256(data).hexdigest()})
    verify_artifacts(local_store, entry)
    # What the store holds must be what the manifest says, by size and then by recorded checksum.
    longer = _named({**CONTENTS, "c/d.parquet": b"delta!!"})
    with pytest.raises(ArtifactMismatch) as size:
        verify_artifacts(local_store, longer)
    assert (size.value.key, size.value.field, size.value.expected, size.value.actual) == (
        "c/d.parquet",
        "size",
        "7",
        "6",
    )
    other = _named({**CONTENTS, "s/out.parquet": b"OUTPUT ROWS"})
    with pytest.raises(ArtifactMismatch) as checksum:
        verify_artifacts(local_store, other)
    assert (checksum.value.key, checksum.value.field) == ("s/out.parquet", "sha256")
    local_store.put_if_absent("s/bare.parquet", b"output rows")  # written without its checksum
    unrecorded = entry.model_copy(update={"outputs": [artifact_ref("s/bare.parquet", b"output rows")]})
    with pytest.raises(ArtifactMismatch, match="sha256 is None"):
        verify_artifacts(local_store, unrecorded)
