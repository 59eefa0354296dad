"""`laminar query`: it answers from the newest delta that holds the key, or from the snapshot when no
delta does, and names a corrupt checkpoint object with exit code 6, in process and as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from laminar_orchestration import cli
from laminar_orchestration.store import ObjectStore, open_store
from tests.dataplane.plane import build_lineage, corrupt, reference_state


def _query(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> str:
    capsys.readouterr()
    code = cli.main(["query", "--store", url, "--partition", "0", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_query_answers_from_newest_delta_or_snapshot(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(store_url)
    lineage = build_lineage(store)
    committed = lineage.manifest.source_offset
    expected = reference_state(store)
    columns = ["count", "sum", "min", "max", "last", "last_offset"]

    for key in (lineage.snapshot_only, lineage.older_delta_only, lineage.newest_delta, "c-only"):
        want = dict(zip(columns, expected[key], strict=True))
        doc = json.loads(_query(capsys, store_url, "--key", key, "--json"))
        assert doc == {"partition": 0, "committed_offset": committed, "key": key, "values": want}, key
        text = _query(capsys, store_url, "--key", key)
        assert f"committed offset {committed}" in text and repr(key) in text and f"'count': {want['count']}" in text

    # The newest delta holding the key wins over older ones (count 3 + 4 + 5 over A, B and C).
    assert expected[lineage.newest_delta][0] == 12

    text = _query(capsys, store_url, "--key", "never-seen")
    assert text.strip() == f"partition 0: committed offset {committed}, key 'never-seen' not in the state"
    doc = json.loads(_query(capsys, store_url, "--key", "never-seen", "--json"))
    assert doc["values"] is None and doc["committed_offset"] == committed

    whole = json.loads(_query(capsys, store_url, "--json"))
    assert whole["committed_offset"] == committed
    got = {row["key"]: (row["count"], row["sum"], row["min"], row["max"], row["last"]) for row in whole["keys"]}
    assert got == {k: v[:5] for k, v in expected.items()}


def test_query_reads_the_snapshot_only_when_no_delta_holds_the_key(
    local_store: ObjectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    store = local_store
    lineage = build_lineage(store)
    # Damage the snapshot: a key the deltas hold is still answered (from the newest delta) ...
    corrupt(store, lineage.manifest, "truncated-snapshot-file")
    doc = json.loads(_query(capsys, store.url, "--key", lineage.newest_delta, "--json"))
    assert doc["values"]["count"] == reference_state(store)[lineage.newest_delta][0]
    # ... while one only the snapshot holds needs it, and the damage is named.
    capsys.readouterr()
    code = cli.main(["query", "--store", store.url, "--partition", "0", "--key", lineage.snapshot_only])
    assert code == 6
    assert "checkpoints/" in capsys.readouterr().err


@pytest.mark.processes
def test_query_subprocess_exits_6_on_a_corrupt_delta(local_store: ObjectStore) -> None:
    store = local_store
    lineage = build_lineage(store)
    key = corrupt(store, lineage.manifest, "flipped-delta-byte")
    done = subprocess.run(
        [sys.executable, "-m", "laminar_orchestration.cli", "query", "--store", store.url, "--partition", "0"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=120,
    )
    assert done.returncode == 6, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and key in done.stderr
