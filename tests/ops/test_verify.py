"""The exactly-once audit (`laminar verify`): committed output batches must tile ``[0, committed offset)`` with
no gap (a loss) and no overlap (a duplicate), every artifact a manifest names must exist, per key the output
counts must equal the events in the source, and the committed state must be the reference fold of every
committed event. A clean chain passes, and each violation is reported with its offsets.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ops.verify import (
    PartitionAudit,
    audit_partition,
    audit_store,
    reference_batch_aggregate,
    reference_fold,
)
from laminar_orchestration.processing.keyed import STATE_SCHEMA
from laminar_orchestration.protocol.capabilities import OutputCommitter
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.fencing import FencingToken
from laminar_orchestration.protocol.manifest import ArtifactRef
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import LocalObjectStore
from tests.commits import commit_all
from tests.ledgers import new_ledger

P0 = PartitionId(0)


class Chain:
    """Partition 0 of a two-partition cluster: 100 events committed by node 1 in two batches, [0, 60) and
    [60, 100); partition 1 never committed."""

    def __init__(self, root: Path) -> None:
        self.store = LocalObjectStore(root / "store")
        ledger = new_ledger(self.store, partitions=2)
        self.token: FencingToken = ledger.acquire(P0, NodeId(1), expected_epoch=0)
        self.source = SourceLog(self.store, partitions=2)
        events = generate_events(100, 5, 1, 1)[0]
        self.source.append(0, events.slice(0, 60))
        commit_all(self.store, self.token)
        self.source.append(0, events.slice(60))
        last = commit_all(self.store, self.token)[2]
        assert last is not None
        self.last: ManifestVersion = last

    def outputs(self) -> list[ArtifactRef]:
        """The output batches the chain names, oldest first."""
        return [ref for v in ManifestReader(self.store).history(P0) for ref in v.manifest.outputs]

    def publish(self, source_offset: int, *outputs: ArtifactRef) -> None:
        """A commit by the owner on top of the chain, keeping its last snapshot."""
        update = ManifestUpdate(
            source_offset=source_offset, snapshot=self.last.manifest.snapshot, outputs=outputs, events_applied=0
        )
        ManifestPublisher(OutputCommitter(self.store), self.store).publish(self.token, update)

    def audit(self) -> PartitionAudit:
        return audit_partition(self.store, P0)


@pytest.fixture
def chain(tmp_path: Path) -> Chain:
    return Chain(tmp_path)


def _kinds(audit: PartitionAudit) -> list[tuple[str, int | None, int | None]]:
    return [(i.kind, i.start_offset, i.end_offset) for i in audit.issues]


def test_a_clean_chain_passes(chain: Chain) -> None:
    committed, never = audit_store(chain.store)
    assert committed.ok and never.ok, committed.issues + never.issues
    assert (committed.committed_offset, committed.events_in_source, committed.epochs_granted) == (100, 100, 1)
    assert (committed.duplicates, committed.losses, committed.orphan_outputs) == (0, 0, 0)
    assert committed.summary_lines() == [
        f"partition 0: committed 100/100 events, {committed.manifests} manifests, 1 epoch: ok"
    ]
    assert (never.partition, never.committed_offset, never.manifests, never.epochs_granted) == (1, 0, 0, 0)


def test_a_batch_committed_twice_is_a_duplicate_with_its_offsets(chain: Chain) -> None:
    first = chain.outputs()[0]
    chain.publish(100, first)  # the batch [0, 60) named a second time, as a broken fence would let through
    audit = chain.audit()
    assert not audit.ok and (audit.duplicates, audit.losses) == (60, 0)
    assert _kinds(audit)[0] == ("duplicate", 0, 60)
    # Every key of the batch has more events in the output than in the source.
    assert {i.kind for i in audit.issues} == {"duplicate"} and len(audit.issues) == 1 + 5
    assert "  duplicate [0, 60): output committed twice" in audit.summary_lines()


def test_a_missing_batch_is_a_loss_and_its_artifact_is_named(chain: Chain) -> None:
    first = chain.outputs()[0]
    chain.store.object_path(first.key).unlink()  # lost by an operator or a broken bucket policy
    audit = chain.audit()
    assert not audit.ok and (audit.duplicates, audit.losses) == (0, 60)
    artifact = [i for i in audit.issues if i.kind == "artifact"]
    assert len(artifact) == 1 and first.key in artifact[0].detail
    assert ("loss", 0, 60) in _kinds(audit)


def test_an_offset_committed_without_its_output_is_a_loss(chain: Chain) -> None:
    chain.source.append(0, generate_events(30, 5, 2, 1)[0])
    chain.publish(130)  # claims events [100, 130) with no output and no state for them
    audit = chain.audit()
    assert (audit.committed_offset, audit.events_in_source, audit.losses) == (130, 130, 30)
    assert ("loss", 100, 130) in _kinds(audit)
    assert any(i.kind == "state" for i in audit.issues)  # the committed state is not the fold of [0, 130)


def test_the_reference_fold_aggregates_each_key_and_keeps_its_last_value_by_offset() -> None:
    # Rows out of offset order: "last" is the value of the highest offset, not of the last row.
    events = pa.table({"offset": [2, 0, 1, 3], "key": ["a", "a", "b", "a"], "value": [5.0, 1.0, 7.0, 3.0]})
    fold = {row["key"]: row for row in reference_fold(events).to_pylist()}
    assert fold["a"] == {"key": "a", "count": 3, "sum": 9.0, "min": 1.0, "max": 5.0, "last": 3.0, "last_offset": 3}
    assert fold["b"] == {"key": "b", "count": 1, "sum": 7.0, "min": 7.0, "max": 7.0, "last": 7.0, "last_offset": 1}
    empty = reference_fold(events.slice(0, 0))
    assert empty.num_rows == 0 and empty.schema == STATE_SCHEMA
    assert reference_batch_aggregate(events).column_names == [
        "key",
        *(f"batch_{name}" for name in ("count", "sum", "min", "max", "last", "last_offset")),
    ]
