"""The one error family of laminar: every library error is a `LaminarError` with a kind.

A caller that only needs to know *what sort* of failure happened (the CLI's exit
code, a Dagster op turning an error into a one-line `Failure`) catches
`LaminarError` once and reads `error_kind`. Each concrete error declares its kind
by deriving from one of the kind bases below (``class EpochConflict(LedgerError,
ConflictError)``), so the kind is a class attribute and ``except ConflictError``
works too. The concrete errors keep their own fields and messages.

The attribute is ``error_kind``, not ``kind``: some errors already carry a
dataclass field named ``kind`` (`InvalidTransition.kind` is the migration kind).

How an error is written: like a frozen dataclass, without the decorator. Typed fields
in order, and a ``message`` template that `str.format` fills with them::

    class StaleEpoch(EpochError, FencedError):
        partition: PartitionId
        local_epoch: int
        current_epoch: int

        message = "stale epoch for partition {partition}: local={local_epoch}, current={current_epoch}"

Only where the text needs logic (a conditional, a join) does the class override
`StructuredError._message` instead. The base makes every subclass a frozen dataclass
(its fields compare, hash, and cannot be reassigned; ``__traceback__`` and notes still
can), renders ``str()`` from the template, keeps ``args`` equal to the fields, and
pickles by rebuilding from the fields, so errors cross process boundaries. An error
class defines no ``__str__``, ``__reduce__``, ``__init__`` or ``__post_init__`` of its
own; tests/test_errors.py holds that for every error of the package.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, dataclass_transform

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
    "StructuredError",
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


@dataclass_transform(eq_default=True, frozen_default=True, field_specifiers=(dataclasses.field,))
class StructuredError(Exception):
    """An exception declared as typed fields and a `message` template (see the module docstring).

    Every subclass is made a frozen dataclass when it is defined. `LaminarError` is the
    library's root; development tooling (the simulator's invariant violations) derives
    from this directly, being no library error.
    """

    #: `str.format` template of the error's text, filled with the fields by name. Unset
    #: (empty), the text lists the fields; a class whose text needs logic overrides `_message`.
    message: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(frozen=True)(cls)
        # The frozen dataclass refuses every assignment on an instance of exactly `cls`, but
        # the interpreter and contextlib assign ``__traceback__`` etc. on errors in flight:
        # only the fields are frozen (`__setattr__` below).
        del cls.__setattr__
        del cls.__delattr__

    def __post_init__(self) -> None:
        # Exception.args holds the fields, also when the error was built with keywords.
        self.args = self._field_values()

    if not TYPE_CHECKING:  # hidden from mypy, which would otherwise allow any attribute assignment

        def __setattr__(self, name: str, value: object) -> None:
            if name in _field_names(self):
                raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
            super().__setattr__(name, value)

        def __delattr__(self, name: str) -> None:
            if name in _field_names(self):
                raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
            super().__delattr__(name)

    def __str__(self) -> str:
        # The most derived class that gives the text decides how: a template, or `_message`.
        for klass in type(self).__mro__:
            if "message" in vars(klass):
                break
            if "_message" in vars(klass):
                return self._message()
        return self._fill(self.message)

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild from the fields: the default (``args`` and then ``__dict__`` by assignment)
        # would hit the frozen fields. Anything else in ``__dict__`` (notes) is state.
        names = _field_names(self)
        state = {name: value for name, value in vars(self).items() if name not in names}
        return type(self), self._field_values(), state or None

    def _message(self) -> str:
        """The error's text, where it needs logic (a conditional, a join): override this instead of `message`."""
        return self._fill(self.message)

    def _fill(self, template: str) -> str:
        values = {name: getattr(self, name) for name in _field_names(self)}
        if template:
            return template.format_map(values)
        return ", ".join(f"{name}={value!r}" for name, value in values.items())

    def _field_values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _field_names(self))


def _field_names(error: StructuredError) -> tuple[str, ...]:
    """The names of `error`'s fields, in order (its constructor's positional parameters)."""
    # Per class, once: every error built (a store's not-found on each miss) reads them.
    names = _FIELD_NAMES.get(type(error))
    if names is None:
        names = tuple(field.name for field in dataclasses.fields(error)) if dataclasses.is_dataclass(error) else ()
        _FIELD_NAMES[type(error)] = names
    return names


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


class LaminarError(StructuredError):
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


class InvalidArgument(InvalidInputError, ValueError):
    """An argument out of its documented range, named by `name` (a flag like ``--partition``).

    Also a ValueError, so callers that caught ValueError before keep working.
    """

    name: str
    reason: str

    message = "{name}: {reason}"
