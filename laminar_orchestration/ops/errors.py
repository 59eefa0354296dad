"""The operator tools' errors: the demo that cannot go on, its downstream read of the output table,
and the sweep's grace period."""

from __future__ import annotations

from laminar_orchestration.errors import InvalidInputError, OperationFailedError

__all__ = ["DemoError", "InvalidGracePeriod", "TableReadFailed"]


class DemoError(OperationFailedError):
    """The demo cannot go on (a port in use, a node that exited, ...)."""

    reason: str

    message = "{reason}"


class TableReadFailed(OperationFailedError):
    """The downstream read of the output table failed (the reader's stderr, in its last words)."""

    uri: str
    reason: str

    message = "reading output table {uri!r} with deltalake failed: {reason}"


class InvalidGracePeriod(InvalidInputError, ValueError):
    """The sweep's grace period is not a number of seconds >= 0."""

    grace_s: float

    message = "grace period must be a number of seconds >= 0, got {grace_s!r}"
