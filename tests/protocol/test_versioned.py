"""The versioned-object helper on both store backends: create-only entries, a lagging pointer, roll-forward."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import Field

from laminar_orchestration.protocol.capabilities import LedgerKey, LedgerWriter, ledger_key
from laminar_orchestration.protocol.records import CorruptLedgerObject, Record, parse_record
from laminar_orchestration.protocol.versioned import VersionedObject, VersionedReader
from laminar_orchestration.store import ObjectStore, PreconditionFailed, StoredObject


class Note(Record):
    """A test entry; `size` is how many positions it covers (like a source segment's events)."""

    text: str
    size: int = Field(default=1, ge=1)


def _decode(_position: int, obj: StoredObject) -> Note:
    return parse_record(obj.key, obj.data, Note)


def notes(
    store: ObjectStore,
    *,
    sized: bool = False,
    entry: Callable[[int], str] = lambda position: f"ledger/test/entries/{position:05d}.json",
    pointer: str = "ledger/test/pointer.json",
) -> VersionedObject[Note, LedgerKey]:
    """Notes on the ledger writer, with entries and pointer at `entry(position)` and `pointer`."""
    writer = LedgerWriter(store)
    return VersionedObject(
        writer,
        entry_key=lambda position: ledger_key(entry(position)),
        pointer_key=ledger_key(pointer),
        decode=_decode,
        create=writer.create,
        swap=writer.swap,
        successor=(lambda position, note: position + note.size) if sized else None,
    )


def _data(text: str, size: int = 1) -> bytes:
    return Note(text=text, size=size).model_dump_json().encode()


def test_an_entry_is_created_once(store: ObjectStore) -> None:
    obj = notes(store)
    obj.create(1, _data("first writer"))
    with pytest.raises(PreconditionFailed):
        obj.create(1, _data("second writer"))
    entry = obj.entry(1)
    assert entry is not None and entry.value.text == "first writer"
    assert entry.key == "ledger/test/entries/00001.json" and entry.raw == _data("first writer")
    assert obj.entry(2) is None


def test_roll_forward_passes_a_lagging_pointer_and_stops_at_the_first_gap(store: ObjectStore) -> None:
    obj = notes(store)
    for i in (1, 2, 3, 5):  # 4 missing: 5 is beyond the end
        obj.create(i, _data(f"n{i}"))
    obj.move_pointer(_data("points at 1"), None)  # its writer died before moving it further
    assert [e.value.text for e in obj.roll_forward(2)] == ["n2", "n3"]
    assert [e.position for e in obj.roll_forward(1)] == [1, 2, 3]  # the history
    assert list(obj.roll_forward(4)) == []


def test_successor_follows_entries_of_different_sizes(store: ObjectStore) -> None:
    obj = notes(store, sized=True)
    obj.create(0, _data("a", 3))
    obj.create(3, _data("b", 2))
    obj.create(4, _data("inside b: never reached", 1))
    obj.create(5, _data("c", 1))
    entries = list(obj.roll_forward(0))
    assert [(e.position, e.value.text) for e in entries] == [(0, "a"), (3, "b"), (5, "c")]
    assert obj.next_position(entries[-1]) == 6


def test_the_pointer_moves_only_from_the_version_it_was_read_at(store: ObjectStore) -> None:
    obj = notes(store)
    assert obj.pointer() is None
    first = obj.move_pointer(_data("v1"), None)
    with pytest.raises(PreconditionFailed):
        obj.move_pointer(_data("created twice"), None)
    second = obj.move_pointer(_data("v2"), first)
    with pytest.raises(PreconditionFailed):
        obj.move_pointer(_data("from a stale read"), first)
    pointer = obj.pointer()
    assert pointer is not None and pointer.etag == second and pointer.data == _data("v2")


def test_a_corrupt_entry_raises_the_owners_error_naming_its_key(store: ObjectStore) -> None:
    obj = notes(store)
    obj.create(1, _data("fine"))
    store.put_if_absent("ledger/test/entries/00002.json", b'{"text": "typo", "sise": 1}')
    with pytest.raises(CorruptLedgerObject) as info:
        list(obj.roll_forward(1))
    assert info.value.key == "ledger/test/entries/00002.json" and "sise" in info.value.reason


def test_writes_stay_inside_the_capability_prefix(store: ObjectStore) -> None:
    outside = notes(store, entry=lambda position: f"manifests/{position}", pointer="ledger/x")
    with pytest.raises(ValueError, match="outside"):
        outside.create(1, _data("x"))
    assert store.head("manifests/1") is None


def test_a_reader_reads_what_the_writer_wrote(store: ObjectStore) -> None:
    notes(store).create(1, _data("n1"))
    reader: VersionedReader[Note, str] = VersionedReader(
        LedgerWriter(store),
        entry_key=lambda position: f"ledger/test/entries/{position:05d}.json",
        pointer_key="ledger/test/pointer.json",
        decode=_decode,
    )
    assert [e.value.text for e in reader.roll_forward(1)] == ["n1"]
    assert not hasattr(reader, "create")
