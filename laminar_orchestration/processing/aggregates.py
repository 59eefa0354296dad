"""Mergeable aggregates for windows and sessions: each has a Spark expression over one batch and a
merge of two partial results, so a window's value is built a batch at a time and never re-read.

``count``, ``sum``, ``min``, ``max``, ``first`` and ``last`` (by event time, then offset) and
``collect_set`` (the distinct values, sorted). Nulls are skipped, as in SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from laminar_orchestration.processing.schema import InvalidSchema, StreamSchema

Function = Literal["count", "sum", "min", "max", "first", "last", "collect_set"]
_FUNCTIONS: tuple[str, ...] = ("count", "sum", "min", "max", "first", "last", "collect_set")


@dataclass(frozen=True)
class Agg:
    """One output column: `function` of `column` (``count`` needs no column)."""

    name: str
    function: Function
    column: str | None = None

    def __post_init__(self) -> None:
        if self.function not in _FUNCTIONS:
            raise InvalidSchema(f"aggregate {self.name!r}", f"unknown function {self.function!r}")
        if self.function != "count" and self.column is None:
            raise InvalidSchema(f"aggregate {self.name!r}", f"{self.function} needs a column")

    @staticmethod
    def count(name: str = "count") -> Agg:
        return Agg(name, "count")

    def state_fields(self, stream: StreamSchema) -> list[pa.Field]:
        """The partial result's columns in the state (a first/last carries its event time and offset)."""
        if self.function == "count":
            return [pa.field(self.name, pa.int64())]
        t = self.input_type(stream)
        if self.function == "sum":
            out = t if pa.types.is_decimal(t) else pa.int64() if pa.types.is_integer(t) else pa.float64()
            if pa.types.is_decimal(t):
                out = pa.decimal128(38, t.scale)
            return [pa.field(self.name, out)]
        if self.function in ("min", "max"):
            return [pa.field(self.name, t)]
        if self.function == "collect_set":
            return [pa.field(self.name, pa.list_(t))]
        return [
            pa.field(self.name, t),
            pa.field(f"_{self.name}_t", pa.int64()),
            pa.field(f"_{self.name}_o", pa.int64()),
        ]

    def input_type(self, stream: StreamSchema) -> pa.DataType:
        assert self.column is not None
        schema = stream.input_schema
        if self.column not in schema.names:
            raise InvalidSchema(f"aggregate {self.name!r}", f"the stream has no column {self.column!r}")
        t: pa.DataType = schema.field(self.column).type
        if self.function in ("sum",) and not (
            pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
        ):
            raise InvalidSchema(f"aggregate {self.name!r}", f"sum of {self.column!r} ({t}) is not a number")
        return t

    def spark_exprs(self, where: str) -> list[str]:
        """SQL expressions of the batch partials, over rows matching `where` (``_t`` is the event time)."""
        c = self.column
        if self.function == "count":
            return [f"count(1) FILTER (WHERE {where}) AS `{self.name}`"]
        if self.function == "sum":
            return [f"sum(`{c}`) FILTER (WHERE {where}) AS `{self.name}`"]
        if self.function in ("min", "max"):
            return [f"{self.function}(`{c}`) FILTER (WHERE {where}) AS `{self.name}`"]
        if self.function == "collect_set":
            return [f"array_sort(collect_set(`{c}`) FILTER (WHERE {where})) AS `{self.name}`"]
        pick = "min_by" if self.function == "first" else "max_by"
        order = "struct(_t, offset)"
        cond = f"{where} AND `{c}` IS NOT NULL"
        return [
            f"{pick}(`{c}`, {order}) FILTER (WHERE {cond}) AS `{self.name}`",
            f"{pick}(_t, {order}) FILTER (WHERE {cond}) AS `_{self.name}_t`",
            f"{pick}(offset, {order}) FILTER (WHERE {cond}) AS `_{self.name}_o`",
        ]

    def merge(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        """The partial of both `a` and `b` (rows as dicts holding this aggregate's state fields)."""
        n = self.name
        x, y = a.get(n), b.get(n)
        if self.function in ("count", "sum"):
            if x is None or y is None:
                return {n: y if x is None else x}
            return {n: x + y}
        if self.function in ("min", "max"):
            if x is None or y is None:
                return {n: y if x is None else x}
            return {n: min(x, y) if self.function == "min" else max(x, y)}
        if self.function == "collect_set":
            return {n: sorted(set(x or ()) | set(y or ()))} if (x is not None or y is not None) else {n: None}
        tn, on = f"_{n}_t", f"_{n}_o"
        if x is None and a.get(tn) is None:
            return {n: y, tn: b.get(tn), on: b.get(on)}
        if y is None and b.get(tn) is None:
            return {n: x, tn: a.get(tn), on: a.get(on)}
        ka, kb = (a[tn], a[on]), (b[tn], b[on])
        take_a = ka <= kb if self.function == "first" else ka >= kb
        src = a if take_a else b
        return {n: src.get(n), tn: src.get(tn), on: src.get(on)}

    def finish(self, row: dict[str, Any]) -> Any:
        """The output value of a final partial (a count of nothing is 0)."""
        value = row.get(self.name)
        return 0 if value is None and self.function == "count" else value


def merge_partials(aggs: tuple[Agg, ...], a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Every aggregate's merged partial of rows `a` and `b`."""
    merged: dict[str, Any] = {}
    for agg in aggs:
        merged.update(agg.merge(a, b))
    return merged
