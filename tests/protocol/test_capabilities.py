"""Capability misuse must not compile: mypy rejects each misuse snippet and accepts the allowed usage."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from laminar_dev.chaos import ArrowNode
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.identity import MAX_PARTITIONS
from laminar_orchestration.protocol import keys
from laminar_orchestration.protocol.capabilities import (
    AUDITOR_ROLE,
    CAS_PATTERNS,
    CONTROL_PLANE_ROLE,
    CREATE_ONLY_PATTERNS,
    PRODUCER_ROLE,
    CheckpointWriter,
    LedgerWriter,
    OutputCommitter,
    checkpoint_key,
    ledger_key,
    node_role,
    partition_session_policy,
    role_access,
    storage_policies,
)
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.protocol.source_errors import SourceNotWritable
from laminar_orchestration.store import LocalObjectStore
from laminar_orchestration.ulid import next_ulid
from tests.iam import (
    BUCKET,
    IF_MATCH,
    IF_NONE_MATCH,
    NODES,
    PREFIX,
    RENDERED,
    SAMPLES,
    can,
    like,
    own_keys,
    permitted,
    spanning_keys,
)

SNIPPETS = Path(__file__).resolve().parents[1] / "typecheck_snippets"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mypy_report() -> dict[str, str]:
    """One mypy run over every snippet (each file checked on its own terms); output per file."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--config-file", "/dev/null",
         *sorted(str(p) for p in SNIPPETS.glob("*.py"))],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    report: dict[str, str] = {p.name: "" for p in SNIPPETS.glob("*.py")}
    for line in result.stdout.splitlines():
        name = Path(line.split(":", 1)[0]).name
        if name in report:
            report[name] += line + "\n"
    return report


@pytest.mark.processes
@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ("ledger_writer_cannot_put_checkpoint.py", '"LedgerWriter" has no attribute "put_checkpoint"'),
        (
            "checkpoint_writer_cannot_write_ledger_key.py",
            'has incompatible type "LedgerKey"; expected "CheckpointKey"',
        ),
        ("output_committer_cannot_write_ledger.py", '"OutputCommitter" has no attribute "swap"'),
        ("fencing_token_cannot_be_forged.py", 'Unexpected keyword argument "partition" for "FencingToken"'),
    ],
)
def test_capability_misuse_is_a_type_error(mypy_report: dict[str, str], snippet: str, expected: str) -> None:
    assert expected in mypy_report[snippet], mypy_report[snippet]


@pytest.mark.processes
def test_correct_capability_use_type_checks(mypy_report: dict[str, str]) -> None:
    assert mypy_report["allowed_usage.py"] == ""


def test_capabilities_refuse_foreign_prefixes_at_run_time(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    with pytest.raises(ValueError, match="outside"):
        LedgerWriter(store).create(ledger_key("checkpoints/x"), b"")
    with pytest.raises(ValueError, match="outside"):
        CheckpointWriter(store).put_checkpoint(checkpoint_key("ledger/x"), b"", {})
    with pytest.raises(ValueError, match="outside"):
        OutputCommitter(store).put_output("ledger/x", b"", {})  # type: ignore[arg-type]
    assert store.head("ledger/x") is None


def test_storage_policies_split_writes_by_role() -> None:
    """The IAM side of the split (what each role may write); the whole of it is tested on an
    authenticating S3 server in test_least_privilege."""
    policies = storage_policies("bucket", "prefix", nodes=(1, 2))

    def granted(action: str, role: str) -> set[str]:
        """The keys under the prefix that `role` may `action`."""
        out: set[str] = set()
        for st in policies.roles[role]["Statement"]:
            if action in st["Action"]:
                out |= {r.split("prefix/", 1)[1] for r in st["Resource"]}
        return out

    writes = functools.partial(granted, "s3:PutObject")
    reads = functools.partial(granted, "s3:GetObject")

    # The control plane grants with their signing keys (and seals the chain a grant fences), and records
    # where the output table is at `init` (and maintains the table); it never writes output, state or a
    # node's record.
    assert writes("control-plane") == {
        "tables/output.json",
        "tables/output/*",
        "grant-keys/*",
        "ledger/cluster.json",
        "ledger/membership.json",
        "ledger/stream.json",
        "ledger/partitions/?????/head.json",
        "ledger/partitions/?????/grants/*",
        "ledger/partitions/?????/desired.json",
        "ledger/assignments/?????.json",
        "manifests/?????/history/*",
        "manifests/?????/current.json",
    }
    assert writes("producer") == {"source/?????/*.seg", "source/?????/head.json", "source/ends.json"}
    # The stream's record: written by the control plane only, read by producers (their appends are
    # checked against its schema) and nodes (they run its processor).
    others = writes("producer") | writes("node-1") | writes("auditor")
    assert not {w for w in others if w.startswith("ledger/stream")}
    assert "ledger/stream.json" in reads("producer") and "ledger/*" in reads("node-1")
    # A node's data objects: under its own node of a five-character partition segment, which no `*` spans.
    assert {w for w in writes("node-1") if w.startswith(("checkpoints/", "sink/"))} == {
        "checkpoints/?????/n-00001/*",
        "sink/?????/n-00001/*",
    }
    assert writes("auditor") == set()
    # The nodes keep the output table at its default place (not protocol state): its log and their
    # own data folder, nothing else under tables/.
    assert {w for w in writes("node-1") if w.startswith("tables/")} == {
        "tables/output/_delta_log/*",
        "tables/output/n-00001/*",
    }
    assert "tables/output/*" in reads("node-1")
    # A node writes its own record, never another's, never a grant, a head or the source.
    assert "ledger/nodes/00001.json" in writes("node-1") and "ledger/nodes/00002.json" not in writes("node-1")
    assert not {w for w in writes("node-1") if "grants" in w or "head.json" in w or w.startswith("source/")}
    # A grant's private key is readable by its grantee and the control plane only.
    signing_key_reads = {role: {r for r in reads(role) if r.startswith("grant-keys/")} for role in policies.roles}
    assert signing_key_reads == {
        "control-plane": {"grant-keys/*"},
        "node-1": {"grant-keys/n-00001/*"},
        "node-2": {"grant-keys/n-00002/*"},
        "producer": set(),
        "auditor": set(),
    }
    deletes = {
        role
        for role, doc in policies.roles.items()
        if any("s3:DeleteObject" in st["Action"] for st in doc["Statement"])
    }
    assert deletes == {"auditor", "control-plane"}  # the sweep, and the output table's maintenance
    assert granted("s3:DeleteObject", "control-plane") == {"tables/output/*"}


def test_a_node_holds_capabilities_and_its_source_log_cannot_append(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "store")
    Ledger(store).init_cluster(1)
    node = ArrowNode(NodeConfig(store_url=store.url, node_id=1, workdir=str(tmp_path / "n1")), store=store)
    # No attribute of the node is the store itself: its parts hold capabilities.
    assert not any(value is store for value in vars(node).values())
    with pytest.raises(SourceNotWritable):
        node.source.append(0, generate_events(10, 2, seed=1, partitions=1)[0])
    assert SourceLog(store).end_offset(0) == 0
    # A producer's log (opened on the store: it holds the SourceAppender) appends.
    SourceLog(store).append(0, generate_events(10, 2, seed=1, partitions=1)[0])
    assert node.source.end_offset(0) == 10


# --- the least-privilege documents, under IAM's evaluation rules (tests/iam.py) ---------------------


def test_each_pattern_covers_exactly_its_kind_of_key() -> None:
    for pattern, sample in SAMPLES.items():
        matching = [k for k in SAMPLES.values() if like(pattern, k)]
        assert matching == [sample], (pattern, matching)
    assert like(keys.node_key(1), keys.node_key(1)) and not like(keys.node_key(1), keys.node_key(11))
    # A node's share of the grant signing keys is its own grants' keys, no other node's.
    mine = keys.node_signing_keys_pattern(1)
    assert like(mine, keys.signing_key_key(1, 3, 7))
    assert like(keys.SIGNING_KEYS_PATTERN, keys.signing_key_key(1, 3, 7))
    assert not any(like(mine, keys.signing_key_key(n, 3, 7)) for n in (0, 2, 10, 11, 10001))
    assert not any(like(mine, k) for k in SAMPLES.values())
    # Every write pattern of every role is either create-only or compare-and-swap: the bucket policy covers it.
    for access in role_access(NODES).values():
        for w in access.writes:
            assert any(like(p, SAMPLES.get(w, w)) for p in (*CREATE_ONLY_PATTERNS, *CAS_PATTERNS)), w


def test_every_write_the_code_makes_is_allowed_with_the_header_it_sends() -> None:
    for role, access in role_access(NODES).items():
        for pattern in access.writes:
            key = SAMPLES.get(pattern, pattern)
            create_only = any(like(p, key) for p in CREATE_ONLY_PATTERNS)
            assert can(role, "s3:PutObject", key, IF_NONE_MATCH), (role, key)
            assert can(role, "s3:PutObject", key, IF_MATCH) != create_only, (role, key)
        for prefix in access.reads:
            key = SAMPLES.get(prefix, prefix if not prefix.endswith("/") else prefix + "x")
            assert can(role, "s3:GetObject", key), (role, key)
            # A probe of a missing key gets 404, not 403, only with ListBucket on its prefix.
            assert can(role, "s3:ListBucket", "", {"s3:prefix": f"{PREFIX}/{key}"}), (role, key)


def test_what_only_s3_can_deny_is_denied_by_the_documents() -> None:
    nodes = [node_role(n) for n in NODES]
    everyone = [CONTROL_PLANE_ROLE, PRODUCER_ROLE, AUDITOR_ROLE, *nodes]
    for role in everyone:
        for key in (keys.grant_key(0, 1), keys.ownership_head_key(0), keys.manifest_history_key(0, 1),
                    keys.segment_key(0, 0), keys.desired_state_key(0), keys.node_key(1)):  # fmt: skip
            # No unconditional overwrite of any ledger, manifest or source object, whoever asks.
            assert not can(role, "s3:PutObject", key), (role, key)
            # And nothing is ever deleted there.
            assert not can(role, "s3:DeleteObject", key), (role, key)
    # A create-only object cannot be rewritten by the role that creates it (If-Match is not enough).
    assert not can(PRODUCER_ROLE, "s3:PutObject", keys.segment_key(0, 0), IF_MATCH)
    assert not can(CONTROL_PLANE_ROLE, "s3:PutObject", keys.grant_key(0, 1), IF_MATCH)
    assert not can(node_role(1), "s3:PutObject", keys.manifest_history_key(0, 1), IF_MATCH)
    assert not can(node_role(1), "s3:PutObject", keys.release_key(0, 1), IF_MATCH)
    # Even an identity policy allowing everything cannot delete the ledger: the bucket policy denies it.
    admin = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    grant = f"arn:aws:s3:::{BUCKET}/{PREFIX}/{keys.grant_key(0, 1)}"
    assert not permitted([admin, RENDERED.bucket_policy], "s3:DeleteObject", grant, {})
    # Listing is by prefix: a node and the producer cannot list the output, only the auditor can.
    for role in (*nodes, PRODUCER_ROLE, CONTROL_PLANE_ROLE):
        assert not can(role, "s3:ListBucket", "", {"s3:prefix": f"{PREFIX}/sink/"}), role
        assert not can(role, "s3:ListBucket", "", {}), role  # nor the whole bucket
    assert can(AUDITOR_ROLE, "s3:ListBucket", "", {"s3:prefix": f"{PREFIX}/sink/"})
    # The producer reads node records (a restarted writer's generation) but lists no other ledger prefix.
    assert not can(PRODUCER_ROLE, "s3:ListBucket", "", {"s3:prefix": f"{PREFIX}/ledger/partitions/"})
    assert not can(PRODUCER_ROLE, "s3:PutObject", keys.node_key(1), IF_MATCH)
    # Per node: its own record only, and data objects under its own node only.
    assert can(node_role(1), "s3:PutObject", keys.node_key(1), IF_MATCH)
    assert not can(node_role(1), "s3:PutObject", keys.node_key(2), IF_MATCH)
    ulid = next_ulid()
    for mine, other in (
        (keys.delta_key(0, 1, 3, ulid), keys.delta_key(0, 2, 3, ulid)),
        (keys.snapshot_file_key(0, 1, 3, ulid, "000001.sst"), keys.snapshot_file_key(0, 11, 3, ulid, "000001.sst")),
        (keys.output_object_key(0, 1, 3, 0, 1, ulid), keys.output_object_key(0, 2, 3, 0, 1, ulid)),
    ):
        assert can(node_role(1), "s3:PutObject", mine, IF_NONE_MATCH), mine
        assert not can(node_role(1), "s3:PutObject", other, IF_NONE_MATCH), other
    # Another node's committed output it reads, by the name its manifest gives (a new owner appends
    # its predecessor's last batches to the output table), and lists none of it (above).
    assert can(node_role(1), "s3:GetObject", keys.output_object_key(0, 2, 3, 0, 1, ulid), {})


def test_a_nodes_patterns_span_no_segment_into_another_prefix() -> None:
    for key in spanning_keys(1, 2):
        assert not can(node_role(1), "s3:PutObject", key, IF_NONE_MATCH), key
    for key in (*own_keys(1), keys.release_key(MAX_PARTITIONS - 1, 3), keys.manifest_history_key(0, 3)):
        assert can(node_role(1), "s3:PutObject", key, IF_NONE_MATCH), key
    # Another width than the five digits every partition id is spelled with matches no partition segment.
    assert {len(f"{p:05d}") for p in (0, MAX_PARTITIONS - 1)} == {len(keys.PARTITION_SEGMENT_PATTERN)}
    assert not can(node_role(1), "s3:PutObject", "checkpoints/1/n-00001/x", IF_NONE_MATCH)
    # The auditor can still delete whatever lands under the data prefixes (the sweep removes it).
    for key in spanning_keys(1, 2)[:5]:
        assert can(AUDITOR_ROLE, "s3:DeleteObject", key), key


def test_a_partition_session_policy_narrows_a_node_to_its_partitions() -> None:
    """What STS AssumeRole with this session policy grants is the intersection with the node's role
    (moto does not apply session policies, so this is checked on the documents)."""
    session = partition_session_policy(BUCKET, PREFIX, 1, [0])
    role = RENDERED.roles[node_role(1)]

    def effective(key: str, context: Mapping[str, str]) -> bool:
        resource = f"arn:aws:s3:::{BUCKET}/{PREFIX}/{key}"
        return all(
            permitted([doc, RENDERED.bucket_policy], "s3:PutObject", resource, context) for doc in (role, session)
        )

    assert effective(keys.manifest_history_key(0, 5), IF_NONE_MATCH)
    assert effective(keys.delta_key(0, 1, 3, next_ulid()), IF_NONE_MATCH)
    assert not effective(keys.delta_key(0, 2, 3, next_ulid()), IF_NONE_MATCH)  # another node's
    assert effective(keys.release_key(0, 3), IF_NONE_MATCH)
    assert effective(keys.node_key(1), IF_MATCH)
    assert not effective(keys.manifest_history_key(1, 5), IF_NONE_MATCH)
    assert not effective(keys.delta_key(1, 1, 3, next_ulid()), IF_NONE_MATCH)
    assert not effective(keys.output_object_key(1, 1, 3, 0, 1, next_ulid()), IF_NONE_MATCH)
    assert not effective(keys.release_key(1, 3), IF_NONE_MATCH)


def test_laminar_policies_renders_the_documents_the_tests_apply(capsys: pytest.CaptureFixture[str]) -> None:
    from laminar_orchestration.cli import main

    assert main(["policies", "--bucket", BUCKET, "--prefix", PREFIX, "--nodes", "1,2,3", "--json"]) == 0
    rendered = json.loads(capsys.readouterr().out)
    assert rendered["roles"] == RENDERED.roles and rendered["bucket_policy"] == RENDERED.bucket_policy
    assert main(["policies", "--bucket", BUCKET, "--nodes", "0"]) == 2
    assert "--nodes" in capsys.readouterr().err
    assert main(["policies", "--bucket", BUCKET]) == 0
    text = capsys.readouterr().out
    assert "# IAM policy of the node-1 role" in text and "# bucket policy of" in text
