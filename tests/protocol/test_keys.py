"""The key layout: persisted formats never change, every key sits in its capability's prefix and parses back."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from laminar_orchestration.identity import MAX_PARTITIONS, NodeId, PartitionId
from laminar_orchestration.protocol import keys
from laminar_orchestration.protocol.capabilities import (
    checkpoint_key,
    grant_keys_key,
    ledger_key,
    manifest_key,
    sink_key,
    source_key,
)
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore
from laminar_orchestration.ulid import next_ulid, ulid_time_ms
from tests.commits import commit_all

ULID = "01J0000000000000000000000A"


def test_persisted_key_formats_are_unchanged() -> None:
    """Existing stores hold these exact names; a change here would orphan them."""
    assert keys.CLUSTER_KEY == "ledger/cluster.json"
    assert keys.MEMBERSHIP_KEY == "ledger/membership.json"
    assert keys.node_key(3) == "ledger/nodes/00003.json"
    assert keys.ownership_head_key(42) == "ledger/partitions/00042/head.json"
    assert keys.grant_key(42, 7) == "ledger/partitions/00042/grants/00000000000000000007.json"
    assert keys.release_key(42, 7) == "ledger/partitions/00042/releases/00000000000000000007.json"
    assert keys.desired_state_key(42) == "ledger/partitions/00042/desired.json"
    assert keys.manifest_pointer_key(42) == "manifests/00042/current.json"
    assert keys.manifest_history_key(42, 9) == "manifests/00042/history/00000000000000000009.json"
    assert keys.segment_key(42, 100) == "source/00042/00000000000000000100.seg"
    assert keys.source_head_key(42) == "source/00042/head.json"
    assert keys.LOG_ENDS_KEY == "source/ends.json"
    assert keys.signing_key_key(3, 42, 7) == "grant-keys/n-00003/p-00042/e-00000000000000000007.json"
    assert keys.delta_key(42, 3, 7, ULID) == f"checkpoints/00042/n-00003/0000000007-{ULID}.delta.parquet"
    assert keys.snapshot_file_key(42, 3, 7, ULID, "000008.sst") == (
        f"checkpoints/00042/n-00003/0000000007-{ULID}.snap.000008.sst"
    )
    assert keys.output_object_key(42, 3, 7, 0, 5, ULID) == (
        f"sink/00042/n-00003/0000000007-00000000000000000000-00000000000000000005-{ULID}.parquet"
    )


def test_the_two_partition_heads_have_distinct_keys() -> None:
    """The ownership head (ledger) and the source head (producers) are different objects."""
    assert keys.ownership_head_key(1) != keys.source_head_key(1)
    assert keys.ownership_head_key(1).startswith(keys.ledger_partition_prefix(1) + "/")
    assert keys.source_head_key(1).startswith(keys.source_partition_prefix(1) + "/")


#: Every key builder with sample arguments, and the capability that may write it.
BUILDERS: list[tuple[str, Callable[[], str], Callable[[str], str]]] = [
    ("cluster", lambda: keys.CLUSTER_KEY, ledger_key),
    ("membership", lambda: keys.MEMBERSHIP_KEY, ledger_key),
    ("node", lambda: keys.node_key(5), ledger_key),
    ("ownership head", lambda: keys.ownership_head_key(3), ledger_key),
    ("grant", lambda: keys.grant_key(3, 2), ledger_key),
    ("release", lambda: keys.release_key(3, 2), ledger_key),
    ("desired state", lambda: keys.desired_state_key(3), ledger_key),
    ("manifest pointer", lambda: keys.manifest_pointer_key(3), manifest_key),
    ("manifest entry", lambda: keys.manifest_history_key(3, 4), manifest_key),
    ("segment", lambda: keys.segment_key(3, 0), source_key),
    ("source head", lambda: keys.source_head_key(3), source_key),
    ("delta", lambda: keys.delta_key(3, 5, 2, next_ulid()), checkpoint_key),
    ("snapshot file", lambda: keys.snapshot_file_key(3, 5, 2, next_ulid(), "MANIFEST-000005"), checkpoint_key),
    ("output", lambda: keys.output_object_key(3, 5, 2, 10, 20, next_ulid()), sink_key),
    ("grant signing key", lambda: keys.signing_key_key(5, 3, 2), grant_keys_key),
]


@pytest.mark.parametrize(("name", "build", "scope"), BUILDERS, ids=[b[0] for b in BUILDERS])
def test_every_key_is_inside_exactly_its_capability_prefix(
    name: str, build: Callable[[], str], scope: Callable[[str], str]
) -> None:
    key = build()
    assert scope(key) == key
    assert sum(key.startswith(prefix) for prefix in keys.PREFIXES.values()) == 1
    for other in {ledger_key, manifest_key, source_key, checkpoint_key, sink_key, grant_keys_key} - {scope}:
        with pytest.raises(ValueError, match="outside"):
            other(key)


@pytest.mark.parametrize("partition", [0, 7, MAX_PARTITIONS - 1])
def test_fenced_object_keys_parse_back(partition: int) -> None:
    ulid = next_ulid()
    built = [
        keys.delta_key(partition, 4, 12, ulid),
        keys.snapshot_file_key(partition, 4, 12, ulid, "000123.sst"),
        keys.snapshot_file_key(partition, 4, 12, ulid, "OPTIONS-000007"),
        keys.output_object_key(partition, 4, 12, 100, 250, ulid),
    ]
    for key in built:
        name = keys.parse_fenced_object_key(key)
        assert (name.key, name.partition, name.node, name.epoch, name.ulid) == (key, partition, 4, 12, ulid)
        assert name.created_ms == ulid_time_ms(ulid)
        assert any(key.startswith(p) for p in keys.fenced_object_prefixes(partition))
        assert key.startswith(keys.FENCED_OBJECT_PREFIXES)


@pytest.mark.parametrize(
    "bad",
    [
        "sink/00001/n-00001/2-01J0000000000000000000000A.parquet",  # epoch not 10 digits
        "checkpoints/00001/n-00001/0000000002-nothing.parquet",  # no ULID
        "checkpoints/00001/0000000002-01J0000000000000000000000A.parquet",  # no writer's node
        "sink/00001/n-x/0000000002-01J0000000000000000000000A.parquet",  # not a node number
        "manifests/00001/history/00000000000000000001.json",  # not a fenced object
    ],
)
def test_other_names_do_not_parse_as_fenced_objects(bad: str) -> None:
    with pytest.raises(keys.UnparseableObjectKey) as info:
        keys.parse_fenced_object_key(bad)
    assert info.value.key == bad


def test_a_workflow_writes_only_keys_the_layout_builds(store: ObjectStore) -> None:
    """Run init, join, grant, append, commit (snapshot + delta + output) and a migration record:
    every object in the store is one the key module names, so no module spells keys of its own."""
    ledger = Ledger(store)
    ledger.init_cluster(2)
    ledger.members.register_node(NodeId(1))
    token = ledger.acquire(PartitionId(0), NodeId(1), expected_epoch=0)
    SourceLog(store).append(0, generate_events(30, 5, seed=1, partitions=1)[0])
    _, _, last = commit_all(store, token)
    assert last is not None
    ledger.release(token, commit_ulid=None, source_offset=0)
    DesiredStates(ledger).update(PartitionId(1), lambda s: s.model_copy(update={"owner": 1}))

    named = {
        keys.CLUSTER_KEY,
        keys.MEMBERSHIP_KEY,
        keys.node_key(1),
        keys.desired_state_key(1),
        keys.assignment_key(1),
        keys.grant_key(0, 1),
        keys.signing_key_key(1, 0, 1),
        keys.release_key(0, 1),
        keys.segment_key(0, 0),
        keys.source_head_key(0),
        keys.LOG_ENDS_KEY,
        keys.manifest_pointer_key(0),
        *(keys.ownership_head_key(p) for p in (0, 1)),
        *(keys.manifest_history_key(0, seq) for seq in range(1, last.manifest.seq + 1)),
    }
    stored = set(store.list(""))
    assert named <= stored
    fenced = stored - named
    assert fenced, "the commit wrote output and checkpoint objects"
    for key in fenced:
        name = keys.parse_fenced_object_key(key)  # raises for a key spelled outside the layout
        assert (name.partition, name.node, name.epoch) == (0, token.node, token.epoch)
