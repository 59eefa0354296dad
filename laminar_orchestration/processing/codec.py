"""State values as bytes: one record per key, encoded and decoded a batch of keys at a time.

Two encodings, chosen by the state schema alone (so a store's bytes always mean the same):

* every column a non-nullable fixed-width number (int64, int32, float64, float32, bool):
  a packed numpy record, one vectorised call each way (the default processor);
* anything else - strings, binary, decimals, timestamps, dates, lists, structs, maps,
  nulls: a MessagePack array of the row's values, with timestamps, dates and decimals
  carried as their integer or exact decimal-string storage, so no value loses precision.

Both cost O(keys encoded), never O(state).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from laminar_orchestration.errors import CorruptDataError, InvalidInputError

_NUMPY_TYPES: dict[pa.DataType, str] = {
    pa.int64(): "<i8",
    pa.int32(): "<i4",
    pa.float64(): "<f8",
    pa.float32(): "<f4",
    pa.bool_(): "?",
}


#: MessagePack's nil and array-32 header: `_unpack` reads a batch of records as one array.
_NIL = b"\xc0"
_ARRAY32 = b"\xdd"


class InvalidStateSchema(InvalidInputError):
    """A state column the store cannot hold, or a value that does not fit its column."""

    column: str
    type: str
    reason: str = "no state column may have this type"

    message = "state column {column!r} ({type}): {reason}"


class UndecodableStateValue(CorruptDataError):
    """A stored state record that does not decode with the processor's state schema."""

    reason: str

    message = "a state record does not decode with the processor's state schema: {reason}"


def _storage_type(t: pa.DataType, column: str) -> pa.DataType:
    """The type a value of `t` is carried as inside a record: plain ints, floats, strings, bytes, nests."""
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) or pa.types.is_time64(t):
        return pa.int64()
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    if pa.types.is_decimal(t):
        return pa.string()
    if pa.types.is_dictionary(t):
        return _storage_type(t.value_type, column)
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_storage_type(t.value_type, column))
    if pa.types.is_map(t):
        return pa.map_(_storage_type(t.key_type, column), _storage_type(t.item_type, column))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _storage_type(f.type, column)) for f in t])
    if (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_null(t)
    ):
        return t
    raise InvalidStateSchema(column, str(t))


def _is_fixed_width(schema: pa.Schema) -> bool:
    return all(f.type in _NUMPY_TYPES and not f.nullable for f in schema)


class ValueCodec:
    """Packs the value columns of a state schema into one record per row, and back."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.fixed_width = _is_fixed_width(schema)
        if self.fixed_width:
            self.dtype = np.dtype([(f.name, _NUMPY_TYPES[f.type]) for f in schema])
            self.width = self.dtype.itemsize
        else:
            self._storage = pa.schema([pa.field(f.name, _storage_type(f.type, f.name)) for f in schema])

    # -- encoding ----------------------------------------------------------------------

    def encode(self, values: pa.Table) -> list[bytes]:
        """One record per row of `values` (the schema's columns, by name)."""
        if self.fixed_width:
            return self._encode_fixed(values)
        columns = []
        for f, storage in zip(self.schema, self._storage, strict=True):
            column = values[f.name]
            if column.type != f.type:
                column = self._cast(column, f.type, f.name)
            if not f.nullable and column.null_count:
                raise InvalidStateSchema(f.name, str(f.type), f"{column.null_count} null(s) in a non-nullable column")
            columns.append(column.cast(storage.type) if storage.type != f.type else column)
        if not columns:
            return [msgpack.packb([])] * values.num_rows
        rows = zip(*(c.to_pylist() for c in columns), strict=True)
        pack = msgpack.Packer(use_bin_type=True).pack
        return [pack(list(row)) for row in rows]

    def _cast(self, column: pa.ChunkedArray | pa.Array, to: pa.DataType, name: str) -> pa.ChunkedArray | pa.Array:
        try:
            return pc.cast(column, to)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidStateSchema(name, str(to), f"values of type {column.type} do not fit: {exc}") from None

    def _encode_fixed(self, values: pa.Table) -> list[bytes]:
        records = np.empty(values.num_rows, dtype=self.dtype)
        for f in self.schema:
            column = values[f.name]
            if column.null_count:
                raise InvalidStateSchema(f.name, str(f.type), f"{column.null_count} null(s) in a non-nullable column")
            if column.type != f.type:
                column = self._cast(column, f.type, f.name)
            records[f.name] = column.to_numpy()
        raw = records.tobytes()
        w = self.width
        return [raw[i : i + w] for i in range(0, len(raw), w)]

    # -- decoding ----------------------------------------------------------------------

    def decode(self, records: Sequence[bytes | None]) -> pa.Table:
        """The value columns for `records`, every column null where a record is missing (a new key)."""
        if self.fixed_width:
            return self._decode_fixed(records)
        with _collector_paused():
            columns = self._transpose(self._unpack(records))
            arrays = [self._column(columns[i], i) for i in range(len(self.schema))]
        return pa.Table.from_arrays(arrays, schema=_nullable(self.schema))

    def decode_column(self, records: Sequence[bytes | None], name: str) -> pa.Array | pa.ChunkedArray:
        """One value column for `records` (null where a record is missing): the expiry index reads
        only its column, without building the others' arrays."""
        if self.fixed_width:
            return self._decode_fixed(records)[name]
        i = self.schema.get_field_index(name)
        with _collector_paused():
            return self._column(self._transpose(self._unpack(records))[i], i)

    def _unpack(self, records: Sequence[bytes | None]) -> tuple[Any, ...]:
        """The records' rows (None for a missing record), unpacked in one call: the records are
        joined into one MessagePack array, a missing one as nil (per-record calls cost 1.5x more)."""
        n = len(records)
        joined = b"".join([r if r is not None else _NIL for r in records])
        try:
            # Tuples, not lists: a map's entries must come back as (key, value) pairs.
            rows = msgpack.unpackb(
                _ARRAY32 + n.to_bytes(4, "big") + joined, raw=False, strict_map_key=False, use_list=False
            )
        except (ValueError, msgpack.UnpackException) as exc:
            raise UndecodableStateValue(str(exc)) from None
        assert isinstance(rows, tuple)
        return rows

    def _transpose(self, rows: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Rows to columns; a missing record (or a row of another width) is a row of nulls."""
        n = len(self.schema)
        nulls = (None,) * n
        filled = [row if isinstance(row, tuple) and len(row) == n else nulls for row in rows]
        return list(zip(*filled, strict=True)) if filled else [() for _ in range(n)]

    def _column(self, values: tuple[Any, ...], i: int) -> pa.Array:
        f, storage = self.schema.field(i), self._storage.field(i)
        try:
            raw = pa.array(values, storage.type)
            return raw.cast(f.type) if storage.type != f.type else raw
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise UndecodableStateValue(f"column {f.name!r}: {exc}") from None

    def _decode_fixed(self, records: Sequence[bytes | None]) -> pa.Table:
        present = np.fromiter((r is not None for r in records), dtype=bool, count=len(records))
        decoded = np.zeros(len(records), dtype=self.dtype)
        if present.any():
            decoded[present] = np.frombuffer(b"".join(r for r in records if r is not None), dtype=self.dtype)
        missing = ~present
        mask = missing if missing.any() else None
        columns = {f.name: pa.array(decoded[f.name], type=f.type, mask=mask) for f in self.schema}
        return pa.table(columns, schema=_nullable(self.schema))


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a batch's rows exist as objects: ~10,000 row tuples that
    live through the decode are promoted and trigger full collections of the process's whole heap
    (a third of a 10,000-row decode's time); they form no cycles. Left as it was if already off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, f.type, nullable=True) for f in schema])
