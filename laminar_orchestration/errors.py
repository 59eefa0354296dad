"""The root of every error the library raises, with the kind of failure it is."""

from __future__ import annotations

import enum


class ErrorKind(enum.StrEnum):
    INVALID_INPUT = "invalid input"
    UNAVAILABLE = "unavailable"
    CONFLICT = "conflict"
    FENCED = "fenced"
    CORRUPT_DATA = "corrupt data"


class LaminarError(Exception):
    """Base of every library error; `kind` says what a caller can do about it."""

    kind: ErrorKind = ErrorKind.UNAVAILABLE
