"""The one error family of laminar: every library error is a `LaminarError` with a kind.

A caller that only needs to know *what sort* of failure happened (the CLI's exit
code, a Dagster op turning an error into a one-line `Failure`) catches
`LaminarError` once and reads `error_kind`. Each concrete error declares its kind
by deriving from one of the kind bases below (``class EpochConflict(LedgerError,
ConflictError)``), so the kind is a class attribute and ``except ConflictError``
works too. The concrete errors keep their own fields and messages.

The attribute is ``error_kind``, not ``kind``: some errors already carry a
dataclass field named ``kind`` (`InvalidTransition.kind` is the migration kind).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

__all__ = [
    "EXIT_CODES",
    "EXIT_ISSUES_FOUND",
    "ConflictError",
    "CorruptDataError",
    "ErrorKind",
    "FencedError",
    "InvalidArgument",
    "InvalidInputError",
    "LaminarError",
    "NotFoundError",
    "OperationFailedError",
    "UnavailableError",
    "exit_code",
]


class ErrorKind(enum.Enum):
    """What sort of failure an error is; decides the CLI exit code."""

    #: The operation could not complete for another reason (a migration phase failed, ...).
    FAILED = "failed"
    #: A flag, a URL, an input line or an argument is wrong; retrying the same call fails again.
    INVALID_INPUT = "invalid input"
    #: The store is unreachable or misconfigured, or a wait timed out; retrying later may work.
    UNAVAILABLE = "unavailable"
    #: Someone else changed the object first (lost conditional write, epoch moved, already exists).
    CONFLICT = "conflict"
    #: This writer lost ownership: a higher epoch exists, its writes are rejected.
    FENCED = "fenced"
    #: A stored object does not parse or does not match what names it. Nothing overwrites it.
    CORRUPT_DATA = "corrupt data"
    #: The cluster, store or object the call needs does not exist (yet).
    NOT_FOUND = "not found"


#: `laminar` exit codes by kind. 0 is success, 1 is also `verify` finding issues.
EXIT_CODES: Mapping[ErrorKind, int] = MappingProxyType(
    {
        ErrorKind.FAILED: 1,
        ErrorKind.INVALID_INPUT: 2,
        ErrorKind.UNAVAILABLE: 3,
        ErrorKind.CONFLICT: 4,
        ErrorKind.FENCED: 5,
        ErrorKind.CORRUPT_DATA: 6,
        ErrorKind.NOT_FOUND: 7,
    }
)
#: Exit code of `laminar verify` when the audit finds losses or duplicates.
EXIT_ISSUES_FOUND = 1


def exit_code(kind: ErrorKind) -> int:
    """The process exit code the CLI uses for an error of `kind`."""
    return EXIT_CODES[kind]


class LaminarError(Exception):
    """Root of every error laminar raises on purpose. `error_kind` says what sort it is."""

    error_kind: ClassVar[ErrorKind] = ErrorKind.FAILED


class InvalidInputError(LaminarError):
    """Base of errors caused by the caller's input (flags, URLs, input files, arguments)."""

    error_kind: ClassVar[ErrorKind] = ErrorKind.INVALID_INPUT


class UnavailableError(LaminarError):
    """Base of errors where the store or a peer did not answer in time."""

    error_kind: ClassVar[ErrorKind] = ErrorKind.UNAVAILABLE


class ConflictError(LaminarError):
    """Base of errors where a concurrent writer got there first."""

    error_kind: ClassVar[ErrorKind] = ErrorKind.CONFLICT


class FencedError(LaminarError):
    """Base of errors telling a writer it no longer owns what it writes."""

    error_kind: ClassVar[ErrorKind] = ErrorKind.FENCED


class CorruptDataError(LaminarError):
    """Base of errors about stored bytes that are unusable."""

    error_kind: ClassVar[ErrorKind] = ErrorKind.CORRUPT_DATA


class NotFoundError(LaminarError):
    """Base of errors about something that does not exist (yet)."""

    error_kind: ClassVar[ErrorKind] = ErrorKind.NOT_FOUND


class OperationFailedError(LaminarError):
    """Base of errors where an operation failed for a reason none of the other kinds names."""

    error_kind: ClassVar[ErrorKind] = ErrorKind.FAILED


@dataclass(eq=False)
class InvalidArgument(InvalidInputError, ValueError):
    """An argument out of its documented range, named by `name` (a flag like ``--partition``).

    Also a ValueError, so callers that caught ValueError before keep working.
    """

    name: str
    reason: str

    def __post_init__(self) -> None:
        # Keep args == fields so the error pickles across processes.
        self.args = (self.name, self.reason)

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"
