"""A partition's keyed state in a local RocksDB store: a cache of what the manifest chain commits.

One store per owned (or standby) partition. A batch touches only its keys:
`get_many` reads the previous values of the batch's keys in one multi-get,
`apply` writes the new values and the *applied marker* in one write batch, so
the marker always says exactly which committed source offset the store
reflects. Durability comes from the object store (snapshots + deltas), so the
store runs without a write-ahead log and never fsyncs.

Values are encoded by the processor's `ValueCodec` (packed numpy records for
fixed-width numbers, MessagePack rows for any other Arrow type), a batch of keys
at a time. A processor with an expiry column (windows, TTL) gets an *expiry
index* beside the values: entries ordered by expiry time, written in the same
write batch as the values, so `due` finds the keys whose time has come without
reading the rest of the state. `apply` takes a touched key's old time from the
batch's reads (read back only for keys no read saw) and writes nothing when the
time is unchanged. `due` checks every entry against the key's stored time: an
entry left behind (by a store written before a key both written and deleted
lost its entry) is *stale*, skipped, and removed by the next `apply`. So `due`
returns exactly the keys whose stored time has come.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rocksdict import (
    BlockBasedOptions,
    Checkpoint,
    DBCompressionType,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from laminar_orchestration.dataplane.errors import LocalStateUnusable, LocalStateWriteFailed
from laminar_orchestration.processing.codec import ValueCodec

# User keys and the store's own records never collide: every user key is stored under this prefix,
# the expiry index under another; the marker sorts between them ("k" < "m" < "t").
_KEY_PREFIX = b"k"
_MARKER_KEY = b"m:applied"
_EXPIRY_PREFIX = b"t"
#: Expiry times remembered from reads between two writes, at most (a batch or two of keys).
_SEEN_EXPIRY_CAP = 1_000_000
#: Expiry times are signed; biased by 2**63 they sort as unsigned big-endian bytes.
_EXPIRY_BIAS = 2**63
_ENTRY_KEY_AT = len(_EXPIRY_PREFIX) + 8
#: Index entries `due` checks per multi-get: at most, and at least while it needs more keys.
_DUE_CHUNK = 10_000
_DUE_MIN_CHUNK = 64


class AppliedMarker(BaseModel):
    """Which committed source offset the store reflects; written atomically with the rows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: int = Field(ge=0)
    #: Every event below this offset is folded into the store, none at or above it.
    source_offset: int = Field(ge=0)


#: Bloom filter bits per key. A batch's multi-get looks up keys spread over the whole state, most
#: absent from all but one sorted run: the filter skips those runs without reading a block (a
#: 6,000-key read of a 2.7M-key store takes less than half the time; ~1.2 bytes per key on disk).
BLOOM_BITS_PER_KEY = 10


#: The memtable's bloom filter, as a share of the memtable's size.
MEMTABLE_BLOOM_RATIO = 0.02


def _options(*, create: bool) -> Options:
    """The store's RocksDB options."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(create)
    table = BlockBasedOptions()
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
    # No block cache: mmapped plain blocks are read in place, so the default 32 MB cache only held
    # copies (a lookup, a 4 KB copy and an eviction per read of a large state). A 1,050-key
    # multi-get of a 2.7M-key store takes ~6 % less CPU (5.9 -> 5.6 ms) and a store up to 32 MB
    # less memory. Blocks of files written compressed are decompressed on each read until compacted.
    table.disable_cache()
    opts.set_block_based_table_factory(table)
    # A whole-key bloom filter on the memtable too (1.3 MB of a 64 MB memtable, ~16 bits a key):
    # a batch's keys that sit in the files skip the search of a memtable of up to ~1M entries.
    opts.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO)
    opts.set_memtable_whole_key_filtering(True)
    # Stored plain and memory-mapped, a data block is read in place, not copied, decompressed and
    # cached: a batch's read of a 2.7M-key store costs about what a 1k-key store's does
    # (`bench_state_types`). The price: MessagePack rows take ~1.9x the bytes Snappy gave them, on
    # disk and in a snapshot (packed numbers shrank by a quarter at most). Per-block settings: files
    # written compressed still read.
    opts.set_compression_type(DBCompressionType.none())
    opts.set_allow_mmap_reads(True)
    return opts


def encode_key(key: str) -> bytes:
    return _KEY_PREFIX + key.encode()


def _expiry_entry(expires_at: int, key: str) -> bytes:
    return _EXPIRY_PREFIX + (expires_at + _EXPIRY_BIAS).to_bytes(8, "big") + key.encode()


def _entry_time(entry: bytes) -> int:
    return int.from_bytes(entry[len(_EXPIRY_PREFIX) : _ENTRY_KEY_AT], "big") - _EXPIRY_BIAS


def _key_order(keys: list[bytes]) -> list[int]:
    """The indices of `keys` in key order (stable)."""
    return pc.sort_indices(pa.array(keys, pa.binary())).to_pylist() if len(keys) > 1 else list(range(len(keys)))


def _get_sorted(db: Rdict, keys: list[bytes]) -> list[bytes | None]:
    """A multi-get of `keys` in key order, answered in the caller's: RocksDB's batched lookup of a
    sorted run walks each file's index and blocks forward (a 9,000-key read of a 2.7M-key store
    takes ~25 % less CPU than the same keys in random order)."""
    order = _key_order(keys)
    found = db.get([keys[i] for i in order])
    assert found is not None
    records: list[bytes | None] = [None] * len(keys)
    for i, record in zip(order, found, strict=True):
        records[i] = record
    return records


def _add_sorted(batch: WriteBatch, keys: list[bytes], values: list[bytes] | None) -> None:
    """Put `keys` (or delete them, `values` None) in key order: the memtable's skip list inserts a
    sorted run from where the last insert ended instead of searching from the top each time: a
    batch's 30,000 random keys into a 20 MB memtable take less than half the CPU time. The sort is
    stable, so a key written twice keeps its last value, as in the caller's order."""
    order = _key_order(keys)
    if values is None:
        for i in order:
            batch.delete(keys[i])
    else:
        for i in order:
            batch.put(keys[i], values[i])


class PartitionStateStore:
    """The local keyed state of one partition (RocksDB, raw bytes, no WAL)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        schema: pa.Schema,
        *,
        partition: int,
        create: bool = True,
        expiry_column: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.partition = partition
        self.codec = ValueCodec(schema)
        #: The int64 value column indexed by expiry time (`due`), or None.
        self.expiry_column = expiry_column
        # rocksdict objects refuse concurrent use from two threads ("Already mutably borrowed"):
        # the worker writes while the heartbeat reads the offset and a snapshot checkpoints.
        self._lock = threading.RLock()
        #: Writes so far, and the stored expiry times the reads since the last write saw: `apply`
        #: removes those keys' old entries (or keeps an unchanged one) without reading them back.
        self._writes = 0
        self._seen_expiry: dict[str, int | None] = {}
        #: Index entries `due` found stale since the last write: the next `apply` removes them.
        self._stale_entries: set[bytes] = set()
        try:
            self._db = Rdict(str(self.path), _options(create=create))
        except Exception as exc:  # rocksdict raises plain exceptions carrying RocksDB's status text
            raise LocalStateUnusable(str(self.path), str(exc)) from exc
        write = WriteOptions()
        # The object store is the durable copy. (The stub types this property as a method.)
        write.disable_wal = True  # type: ignore[method-assign,assignment]
        self._db.set_write_options(write)
        self._closed = False
        marker = self.marker()
        #: The applied offset, kept in memory: readers on other threads (the heartbeat) never touch
        #: the database, which may be closed and replaced under them.
        self._offset = marker.source_offset if marker else 0
        if create and marker is None:
            # A new store holds the empty state: offset 0, so it can be checked like any other.
            self.apply(pa.table([pa.array([], pa.string())], names=["key"]), 0)

    @classmethod
    def open_existing(
        cls, path: str | os.PathLike[str], schema: pa.Schema, *, partition: int, expiry_column: str | None = None
    ) -> PartitionStateStore:
        """Open a store directory that must already exist and carry a readable marker."""
        store = cls(path, schema, partition=partition, create=False, expiry_column=expiry_column)
        if store.marker() is None:
            store.close()
            raise LocalStateUnusable(str(path), "no applied marker")
        return store

    # -- reading -------------------------------------------------------------------

    def marker(self) -> AppliedMarker | None:
        with self._lock:
            raw = self._db.get(_MARKER_KEY)
        if raw is None:
            return None
        try:
            marker = AppliedMarker.model_validate_json(raw)
        except ValidationError as exc:
            raise LocalStateUnusable(str(self.path), f"applied marker: {exc.errors()[0].get('msg')}") from exc
        if marker.partition != self.partition:
            raise LocalStateUnusable(str(self.path), f"holds partition {marker.partition}, not {self.partition}")
        return marker

    @property
    def source_offset(self) -> int:
        """The source offset the store holds the state of (its marker's, as last written or read)."""
        return self._offset

    def get_many(self, keys: Sequence[str]) -> pa.Table:
        """Previous values of `keys`, row-aligned, null for keys the state does not hold."""
        with self._lock:
            records = _get_sorted(self._db, [encode_key(k) for k in keys]) if keys else []
            writes = self._writes
        assert records is not None
        values = self.codec.decode(records)
        if self.expiry_column is not None and keys:
            self._note_expiry(keys, values[self.expiry_column].to_pylist(), writes)
        return values

    def _note_expiry(self, keys: Sequence[str], expiry: list[int | None], writes: int) -> None:
        with self._lock:
            if writes != self._writes:  # a write came between the read and now: the values are old
                return
            if len(self._seen_expiry) + len(keys) > _SEEN_EXPIRY_CAP:
                self._seen_expiry.clear()
            self._seen_expiry.update(zip(keys, expiry, strict=True))

    def get_many_at(self, keys: Sequence[str], source_offset: int) -> pa.Table | None:
        """`get_many`, if the store holds the state at `source_offset` throughout the read; else None.

        The check and the read are one step under the store's lock, so values read ahead on one
        thread can never be those of a later offset a write on another thread just applied.
        """
        with self._lock:  # re-entrant: `get_many` takes it again
            return self.get_many(keys) if self._offset == source_offset else None

    def get(self, key: str) -> dict[str, object] | None:
        rows = self.get_many([key])
        return None if rows.column(0).null_count else {name: rows[name][0].as_py() for name in rows.column_names}

    def scan(self, *, rows_per_batch: int = 65_536) -> Iterator[pa.Table]:
        """Every key and its values, in key order, as tables of up to `rows_per_batch` rows."""
        keys: list[str] = []
        records: list[bytes] = []
        with self._lock:
            it = self._db.iter()
            it.seek(_KEY_PREFIX)
        while True:
            with self._lock:  # one step at a time: a consumer may take long between batches
                if not it.valid():
                    break
                raw_key = it.key()
                if not raw_key.startswith(_KEY_PREFIX):
                    break
                keys.append(raw_key[len(_KEY_PREFIX) :].decode())
                records.append(it.value())
                it.next()
            if len(keys) >= rows_per_batch:
                yield self._table(keys, records)
                keys, records = [], []
        if keys or not records:
            yield self._table(keys, records)

    def _table(self, keys: list[str], records: Sequence[bytes | None]) -> pa.Table:
        values = self.codec.decode(records)
        return pa.table([pa.array(keys, pa.string()), *values.columns], names=["key", *values.column_names])

    def to_table(self) -> pa.Table:
        """The whole state (audits and queries of small partitions)."""
        return pa.concat_tables(list(self.scan()))

    # -- writing -------------------------------------------------------------------

    def due(self, until: int, *, limit: int | None = None) -> pa.Table:
        """Key and value columns of the keys whose expiry time is at or before `until`, oldest first."""
        if self.expiry_column is None:
            return self._keyed([], self.get_many([]))
        end = _EXPIRY_PREFIX + (until + 1 + _EXPIRY_BIAS).to_bytes(8, "big") if until < 2**63 - 1 else b"u"
        found: list[pa.Table] = []
        count = 0
        # One lock hold: the entries found stale must still be stale when the next write removes them.
        with self._lock:
            it = self._db.iter()
            it.seek(_EXPIRY_PREFIX)
            more = True
            while more and (limit is None or count < limit):
                # At least a few dozen at a time: stale entries may come between the live ones.
                want = _DUE_CHUNK if limit is None else min(_DUE_CHUNK, max(limit - count, _DUE_MIN_CHUNK))
                entries: list[bytes] = []
                while len(entries) < want:
                    if not it.valid() or (entry := it.key()) >= end:
                        more = False
                        break
                    if entry not in self._stale_entries:
                        entries.append(entry)
                    it.next()
                if entries:
                    live = self._live(entries)
                    if limit is not None and live.num_rows > limit - count:
                        live = live.slice(0, limit - count)
                    count += live.num_rows
                    found.append(live)
        return pa.concat_tables(found) if found else self._keyed([], self.get_many([]))

    def _live(self, entries: list[bytes]) -> pa.Table:
        """Key and values of the entries whose key's stored expiry time is the entry's; the others
        (a moved time, a deleted key) are noted for the next write to remove."""
        assert self.expiry_column is not None
        keys = [e[_ENTRY_KEY_AT:].decode() for e in entries]
        values = self.get_many(keys)
        stored = values[self.expiry_column].to_pylist()
        live = [i for i, (entry, t) in enumerate(zip(entries, stored, strict=True)) if t == _entry_time(entry)]
        if len(live) < len(entries):
            live_at = set(live)
            self._stale_entries.update(e for i, e in enumerate(entries) if i not in live_at)
        table = self._keyed(keys, values)
        return table if len(live) == len(entries) else table.take(pa.array(live, pa.int64()))

    @staticmethod
    def _keyed(keys: list[str], values: pa.Table) -> pa.Table:
        return pa.Table.from_arrays([pa.array(keys, pa.string()), *values.columns], names=["key", *values.column_names])

    def apply(self, rows: pa.Table, source_offset: int, *, deleted: pa.Array | None = None) -> None:
        """Write `rows` (key + value columns: full new values), remove the `deleted` keys, and write
        the marker, all in one write batch; the expiry index follows the values (a key both written
        and deleted is deleted)."""
        batch = WriteBatch(raw_mode=True)
        keys: list[str] = rows["key"].to_pylist() if rows.num_rows else []
        gone: list[str] = deleted.to_pylist() if deleted is not None and len(deleted) else []
        if self.expiry_column is not None:
            self._index_expiry(batch, rows, keys, gone)
        if keys:
            _add_sorted(batch, [encode_key(k) for k in keys], self.codec.encode(rows))
        if gone:
            _add_sorted(batch, [encode_key(k) for k in gone], None)
        marker = AppliedMarker(partition=self.partition, source_offset=source_offset)
        batch.put(_MARKER_KEY, marker.model_dump_json().encode())
        try:
            with self._lock:
                self._writes += 1
                self._seen_expiry.clear()
                self._stale_entries.clear()
                self._db.write(batch)
                self._offset = source_offset  # with the write: `get_many_at` sees both or neither
        except Exception as exc:
            raise LocalStateWriteFailed(str(self.path), str(exc)) from exc

    def _index_expiry(self, batch: WriteBatch, rows: pa.Table, keys: list[str], gone: list[str]) -> None:
        """The batch's expiry index changes: the stale entries `due` found out, each touched key's old
        entry out unless its time stays, each written key's new entry in unless it is already there.
        Removals go first: an entry both removed and added (a time set back to a stale entry's) stays."""
        assert self.expiry_column is not None
        if keys and self.expiry_column not in rows.column_names:
            raise LocalStateWriteFailed(str(self.path), f"rows lack the expiry column {self.expiry_column!r}")
        # The last value of a key given twice, as for the values; a deleted key keeps no entry.
        fresh = dict(zip(keys, rows[self.expiry_column].to_pylist() if keys else [], strict=True))
        for key in gone:
            fresh.pop(key, None)
        touched = list(dict.fromkeys(keys + gone))
        with self._lock:
            seen = {k: self._seen_expiry[k] for k in touched if k in self._seen_expiry}
            removed = list(self._stale_entries)
            # Keys no read saw (a restore's or a standby's deltas): their old times read back, so an
            # index that `due` never sweeps grows with the keys, not with the moves.
            unseen = [k for k in touched if k not in seen]
            records = _get_sorted(self._db, [encode_key(k) for k in unseen]) if unseen else []
        if unseen:
            seen.update(zip(unseen, self.codec.decode_column(records, self.expiry_column).to_pylist(), strict=True))
        removed += [_expiry_entry(t, k) for k, t in seen.items() if t is not None and (k not in fresh or fresh[k] != t)]
        _add_sorted(batch, removed, None)
        added = [_expiry_entry(int(t), k) for k, t in fresh.items() if t is not None and seen.get(k) != t]
        _add_sorted(batch, added, [b""] * len(added))

    def checkpoint(self, destination: str | os.PathLike[str]) -> list[Path]:
        """A consistent copy of the store in `destination` (hard links to the immutable SST files).

        Returns the files of the copy. The memtable is flushed first: with no WAL
        it holds the only copy of the newest rows.
        """
        dest = Path(destination)
        try:
            with self._lock:
                self._db.flush()
                Checkpoint(self._db).create_checkpoint(str(dest))
        except Exception as exc:
            shutil.rmtree(dest, ignore_errors=True)
            raise LocalStateWriteFailed(str(dest), str(exc)) from exc
        return sorted(p for p in dest.iterdir() if p.is_file())

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    def destroy(self) -> None:
        """Close and delete the directory (a revoked or released partition's cache)."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> PartitionStateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
