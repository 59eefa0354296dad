"""The output table's errors: each names the table and what is wrong with it."""

from __future__ import annotations

from laminar_orchestration.errors import (
    CorruptDataError,
    InvalidInputError,
    LaminarError,
    UnavailableError,
)


class TableError(LaminarError):
    """Base of the output table's errors (each subclass declares its kind)."""


class TableMismatch(TableError, InvalidInputError):
    """The table location holds something that is not this cluster's output table."""

    uri: str
    reason: str

    message = "output table {uri!r} is not this cluster's output table: {reason}"


class TableSchemaMismatch(TableError, InvalidInputError):
    """A committed batch's output columns differ from the table's schema (fixed at its first commit)."""

    uri: str
    partition: int
    seq: int
    expected: str
    actual: str

    message = (
        "output of partition {partition} (manifest seq {seq}) does not fit the schema of table {uri!r}: "
        "table has [{expected}], batch has [{actual}]; nothing was written"
    )


class TableLogCorrupt(TableError, CorruptDataError):
    """The table's Delta log is missing or unreadable; `rebuild_table` recreates it from the manifests."""

    uri: str
    reason: str

    message = "the Delta log of output table {uri!r} is unusable ({reason}); run `laminar table rebuild`"


class TableCommitFailed(TableError, UnavailableError):
    """A table commit kept failing (store errors or concurrent commits); nothing was appended twice."""

    uri: str
    attempts: int
    reason: str

    message = "could not commit to output table {uri!r} after {attempts} attempts: {reason}"


class TableStoreFault(TableError, UnavailableError):
    """A request for one of the table's objects failed (the outcome of a write is unknown)."""

    uri: str
    name: str
    reason: str

    message = "output table {uri!r}: request for {name!r} failed: {reason}"
