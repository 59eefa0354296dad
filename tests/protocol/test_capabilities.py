"""Capability misuse must not compile: mypy rejects each misuse snippet and accepts the allowed usage."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

from laminar_dev.chaos import ArrowNode
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.protocol.capabilities import (
    CheckpointWriter,
    LedgerWriter,
    OutputCommitter,
    checkpoint_key,
    ledger_key,
    storage_policies,
)
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.segments import SourceNotWritable
from laminar_orchestration.protocol.source import SourceLog, generate_events
from laminar_orchestration.store import LocalObjectStore

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
        "ledger/partitions/?????/head.json",
        "ledger/partitions/?????/grants/*",
        "ledger/partitions/?????/desired.json",
        "ledger/assignments/?????.json",
        "manifests/?????/history/*",
        "manifests/?????/current.json",
    }
    assert writes("producer") == {"source/?????/*.seg", "source/?????/head.json", "source/ends.json"}
    # A node's data objects: under its own node of a five-character partition segment, which no `*` spans.
    assert {w for w in writes("node-1") if w.startswith(("checkpoints/", "sink/"))} == {
        "checkpoints/?????/n-00001/*",
        "sink/?????/n-00001/*",
    }
    assert writes("auditor") == set()
    # The nodes keep the output table at its default place (delta-rs's objects, not protocol state).
    assert "tables/output/*" in writes("node-1") and "tables/output/*" in reads("node-1")
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
