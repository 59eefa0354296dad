"""A versioned object: create-only entries at increasing positions, plus a pointer that may lag them.

Three things in the store are kept this way, one per partition:

==================  ======================  ===============  ======================
object              entries (create-only)   position         pointer (CAS)
==================  ======================  ===============  ======================
ownership           epoch grants            epoch            the ownership head
manifest chain      history entries         sequence number  ``current.json``
source log          segments                start offset     the source head
==================  ======================  ===============  ======================

The entries are the truth: exactly one writer creates the entry at a position
(``If-None-Match``), and none is ever rewritten. The pointer is a hint moved by
compare-and-swap *after* its entry, so a writer that dies in between leaves it
behind; readers roll forward from where it points by probing the next entry
keys until one is missing. Nothing here lists the store.

What the pointer holds (a record of its own, a copy of the newest entry, the
next free position) and what a conflict means are the owner's business: this
class does the conditional writes and the probing, and hands back what it read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, NotRequired, TypedDict, TypeVar, Unpack

from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.store import StoredObject

E = TypeVar("E")
K = TypeVar("K", bound=str)


@dataclass(frozen=True)
class Entry(Generic[E]):
    """One entry as read: its position, its decoded value and the stored object (bytes, ETag)."""

    position: int
    value: E
    stored: StoredObject

    @property
    def key(self) -> str:
        return self.stored.key

    @property
    def raw(self) -> bytes:
        return self.stored.data


class Layout(TypedDict, Generic[E, K]):
    """Where a versioned object's entries and pointer are, and how an entry reads: the keyword
    arguments of `VersionedReader` and `VersionedObject` alike."""

    entry_key: Callable[[int], K]
    pointer_key: K
    decode: Callable[[int, StoredObject], E]
    successor: NotRequired[Callable[[int, E], int] | None]


class VersionedReader(Generic[E, K]):
    """Reads of a versioned object: entries at ``entry_key(position)``, one pointer at `pointer_key`.

    `decode` turns a stored entry (and its position) into its value and raises
    the owner's corrupt-object error, naming the key. `successor` gives the position after
    an entry (default: the next integer; a source segment is followed at its
    start plus its size).
    """

    def __init__(self, reads: ReadStore, **layout: Unpack[Layout[E, K]]) -> None:
        self._reads = reads
        self.entry_key = layout["entry_key"]
        self.pointer_key = layout["pointer_key"]
        self._decode = layout["decode"]
        self._successor = layout.get("successor")

    def entry(self, position: int) -> Entry[E] | None:
        """The entry at `position`, or None if nobody created it (yet)."""
        obj = self._reads.get(self.entry_key(position))
        return None if obj is None else Entry(position, self._decode(position, obj), obj)

    def next_position(self, entry: Entry[E]) -> int:
        """The position of the entry that follows `entry`."""
        return entry.position + 1 if self._successor is None else self._successor(entry.position, entry.value)

    def roll_forward(self, start: int) -> Iterator[Entry[E]]:
        """The entries from `start` on, in order, up to the first missing one (one GET each).

        From the pointer's successor this is the roll-forward over entries the
        pointer has not caught up with; from the first position it is the history.
        """
        position = start
        while (entry := self.entry(position)) is not None:
            yield entry
            position = self.next_position(entry)

    def pointer(self) -> StoredObject | None:
        """The pointer as stored (the owner decodes it), or None before its first write."""
        return self._reads.get(self.pointer_key)


class VersionedObject(VersionedReader[E, K]):
    """A versioned object with the writes: create an entry, move the pointer.

    `create` and `swap` are the owner's capability methods (create-only, and
    compare-and-swap on an ETag), typed by its key type `K`.
    """

    def __init__(
        self,
        reads: ReadStore,
        *,
        create: Callable[[K, bytes, Mapping[str, str] | None], str],
        swap: Callable[[K, bytes, str], str],
        **layout: Unpack[Layout[E, K]],
    ) -> None:
        super().__init__(reads, **layout)
        self._create = create
        self._swap = swap

    def create(self, position: int, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        """Create the entry at `position`; PreconditionFailed if another writer created it first."""
        return self._create(self.entry_key(position), data, metadata)

    def move_pointer(self, data: bytes, etag: str | None) -> str:
        """Write the pointer if it is still at `etag` (None: if it does not exist yet).

        PreconditionFailed if it moved since it was read at `etag`.
        """
        if etag is None:
            return self._create(self.pointer_key, data, None)
        return self._swap(self.pointer_key, data, etag)
