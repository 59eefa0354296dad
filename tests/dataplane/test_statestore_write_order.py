"""`PartitionStateStore.apply` writes a batch's records in key order (the memtable inserts a sorted run
faster) and the result is the one the caller's order gives: a key given twice keeps its last value,
an expiry entry removed and put back in one batch stays, a key both written and deleted is gone
(with its old expiry entry).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from laminar_orchestration.dataplane.statestore import PartitionStateStore


def test_a_key_written_twice_in_one_batch_keeps_its_last_value(tmp_path: Path) -> None:
    schema = pa.schema([("n", pa.int64())])
    with PartitionStateStore(tmp_path / "state", schema, partition=0) as state:
        state.apply(pa.table({"key": ["c", "a", "b", "a", "a"], "n": [1, 2, 3, 4, 5]}), 1)
        assert state.to_table().to_pylist() == [
            {"key": "a", "n": 5},
            {"key": "b", "n": 3},
            {"key": "c", "n": 1},
        ]


def test_an_unchanged_expiry_time_keeps_its_entry(tmp_path: Path) -> None:
    """The entry's removal (old time) and its addition (new time) are the same record: the addition,
    written after the removal, must win."""
    schema = pa.schema([("n", pa.int64()), ("expires", pa.int64())])
    with PartitionStateStore(tmp_path / "state", schema, partition=0, expiry_column="expires") as state:
        state.apply(pa.table({"key": ["b", "a"], "n": [1, 1], "expires": [7, 10]}), 1)
        state.get_many(["a", "b"])
        state.apply(pa.table({"key": ["b", "a"], "n": [2, 2], "expires": [8, 10]}), 2)
        due = state.due(100)
        assert due["key"].to_pylist() == ["b", "a"]
        assert due["expires"].to_pylist() == [8, 10]


def test_a_key_written_and_deleted_in_one_batch_is_gone_with_its_old_expiry_entry(tmp_path: Path) -> None:
    schema = pa.schema([("n", pa.int64()), ("expires", pa.int64())])
    with PartitionStateStore(tmp_path / "state", schema, partition=0, expiry_column="expires") as state:
        state.apply(pa.table({"key": ["a", "z"], "n": [1, 1], "expires": [10, 11]}), 1)
        state.apply(pa.table({"key": ["z", "a"], "n": [2, 2], "expires": [20, 21]}), 2, deleted=pa.array(["a"]))
        assert state.get("a") is None
        assert state.due(15)["key"].to_pylist() == []
