"""Capability misuse must not compile: mypy rejects each misuse snippet and accepts the allowed usage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from laminar_orchestration.capabilities import (
    CheckpointWriter,
    LedgerWriter,
    OutputCommitter,
    checkpoint_key,
    ledger_key,
    storage_policies,
)
from laminar_orchestration.store import LocalObjectStore

SNIPPETS = Path(__file__).parent / "typecheck_snippets"
ROOT = Path(__file__).parent.parent


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


def test_storage_policies_split_prefixes_by_principal() -> None:
    policies = storage_policies("bucket", "prefix")

    def writes(principal: str) -> set[str]:
        out: set[str] = set()
        for st in policies[principal]["Statement"]:  # type: ignore[attr-defined]
            if "s3:PutObject" in st["Action"]:
                out |= {r.split("prefix/")[1].rstrip("*") for r in st["Resource"]}
        return out

    # The control plane seals manifest chains when it grants an epoch; it never writes output or state.
    assert writes("control-plane") == {"ledger/", "manifests/"}
    assert writes("producer") == {"source/"}
    assert "source/" not in writes("node")
    lists = [p for p, doc in policies.items() if any("s3:ListBucket" in st["Action"] for st in doc["Statement"])]  # type: ignore[attr-defined]
    assert lists == ["auditor"]  # the fast path never lists
