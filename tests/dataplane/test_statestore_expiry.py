"""The expiry index of `PartitionStateStore`: `apply` takes a key's old time from the batch's reads
(read back only for keys no read saw) and writes no entry for an unchanged time; `due` checks each
entry against the key's stored time. `due` returns exactly the keys whose stored time has come, oldest
first, whatever reads came before the writes; the index holds one entry per key with a time, however
often times move; a stale entry (as an older version left for a key both written and deleted) is
skipped and goes with the next write; a key both written and deleted in one batch is never due.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa

from laminar_orchestration.dataplane.statestore import PartitionStateStore

SCHEMA = pa.schema([("n", pa.int64()), ("expires", pa.int64())])


def _store(path: Path) -> PartitionStateStore:
    return PartitionStateStore(path, SCHEMA, partition=0, expiry_column="expires")


def _put(state: PartitionStateStore, offset: int, times: dict[str, int], deleted: list[str] | None = None) -> None:
    rows = pa.table({"key": list(times), "n": [offset] * len(times), "expires": list(times.values())})
    state.apply(rows, offset, deleted=pa.array(deleted or [], pa.string()))


def _index_entries(state: PartitionStateStore) -> int:
    it = state._db.iter()
    it.seek(b"t")
    n = 0
    while it.valid() and it.key().startswith(b"t"):
        n += 1
        it.next()
    return n


def _leave_stale_entry(state: PartitionStateStore, expires_at: int, key: str) -> None:
    """An index entry no stored time matches, as an older version left behind."""
    state._db[b"t" + (expires_at + 2**63).to_bytes(8, "big") + key.encode()] = b""


def test_a_key_written_and_deleted_in_one_batch_is_never_due(tmp_path: Path) -> None:
    with _store(tmp_path / "state") as state:
        _put(state, 1, {"a": 10, "z": 11})
        _put(state, 2, {"z": 20, "a": 21}, deleted=["a"])
        due = state.due(100)
        assert due["key"].to_pylist() == ["z"]
        assert due["n"].to_pylist() == [2]
        assert _index_entries(state) == 1


def test_a_time_moved_without_a_read_is_due_at_its_new_time_only(tmp_path: Path) -> None:
    with _store(tmp_path / "state") as state:
        _put(state, 1, {"a": 10, "b": 30})
        _put(state, 2, {"a": 50})  # no read: the old time is read back
        assert state.due(20)["key"].to_pylist() == []
        assert state.due(40)["key"].to_pylist() == ["b"]
        due = state.due(100)
        assert due["key"].to_pylist() == ["b", "a"] and due["expires"].to_pylist() == [30, 50]
        assert _index_entries(state) == 2


def test_stale_entries_are_skipped_and_go_with_the_next_write(tmp_path: Path) -> None:
    with _store(tmp_path / "state") as state:
        _put(state, 1, {"a": 50})
        _leave_stale_entry(state, 10, "a")  # a moved time
        _leave_stale_entry(state, 11, "b")  # a deleted key
        assert _index_entries(state) == 3
        assert state.due(20)["key"].to_pylist() == []
        _put(state, 2, {})
        assert _index_entries(state) == 1
        assert state.due(100)["key"].to_pylist() == ["a"]


def test_a_limited_due_skips_stale_entries_and_fills_its_limit(tmp_path: Path) -> None:
    with _store(tmp_path / "state") as state:
        _put(state, 1, {f"k{i}": i for i in range(5, 10)})
        for i in range(5):
            _leave_stale_entry(state, i, f"k{i}")
        assert state.due(50, limit=3)["key"].to_pylist() == ["k5", "k6", "k7"]
        assert state.due(50, limit=3)["key"].to_pylist() == ["k5", "k6", "k7"]  # again, before the write
        _put(state, 2, {"k5": 0})  # back below the stale entries' times
        assert state.due(50, limit=2)["key"].to_pylist() == ["k5", "k6"]


def test_a_time_set_back_to_a_stale_entry_keeps_that_entry(tmp_path: Path) -> None:
    """A stale entry `due` noted and the same entry written again in the next batch: it must stay."""
    with _store(tmp_path / "state") as state:
        _put(state, 1, {"a": 50})
        _leave_stale_entry(state, 10, "a")
        assert state.due(20)["key"].to_pylist() == []  # the entry at 10 is noted stale
        _put(state, 2, {"a": 10})
        assert state.due(20)["key"].to_pylist() == ["a"]


def test_due_answers_as_a_model_whatever_the_reads(tmp_path: Path) -> None:
    """Random batches (writes, moves, deletes, keys both written and deleted) on two stores: one that
    reads each batch's keys first, as a processor does, and one that only applies, as a restore or a
    standby does. Both answer every `due` as the model of the state does, and hold one index entry
    per key however often its time moves."""
    rng = random.Random(7)
    keys = [f"k{i:02d}" for i in range(40)]
    model: dict[str, int] = {}
    reading, applying = _store(tmp_path / "reading"), _store(tmp_path / "applying")
    for offset in range(1, 200):
        touched = rng.sample(keys, rng.randint(0, 12))
        times = {k: rng.randint(0, 60) for k in touched}
        deleted = rng.sample(keys, rng.randint(0, 4))
        if rng.random() < 0.5:
            reading.get_many(touched + deleted)
        for state in (reading, applying):
            _put(state, offset, times, deleted)
        model.update(times)
        for key in deleted:
            model.pop(key, None)
        for state in (reading, applying):
            assert _index_entries(state) == len(model)
        for _ in range(2):
            until = rng.randint(-1, 70)
            limit = rng.choice([None, 1, 3, 10])
            expected = sorted((t, k) for k, t in model.items() if t <= until)[:limit]
            for state in (reading, applying):
                due = state.due(until, limit=limit)
                assert list(zip(due["expires"].to_pylist(), due["key"].to_pylist(), strict=True)) == expected
                assert due["n"].null_count == 0
    reading.close()
    applying.close()
