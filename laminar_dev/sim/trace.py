"""A run's trace and the conditions a run executes under (library warnings off, cycle collector paused)."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import logging
from collections import deque
from collections.abc import Iterator

#: Trace lines kept when the whole trace is not asked for (the last ones: what led to a violation).
TAIL_LINES = 300
#: Lines hashed together: the same bytes as one update per line, for less work per line.
_HASH_BATCH = 512


class Trace:
    """Every line of a run, hashed in order (each line ending with a newline); all of them or the last
    `TAIL_LINES` kept."""

    def __init__(self, *, full: bool) -> None:
        self._hash = hashlib.blake2b(digest_size=16)
        self._unhashed: list[str] = []
        self._lines: deque[str] | list[str] = [] if full else deque(maxlen=TAIL_LINES)

    def record(self, line: str) -> None:
        """Add `line` to the trace."""
        self._unhashed.append(line)
        if len(self._unhashed) >= _HASH_BATCH:
            self._flush()
        self._lines.append(line)

    def digest(self) -> str:
        """The hash of every line so far (hex)."""
        self._flush()
        return self._hash.hexdigest()

    def lines(self) -> tuple[str, ...]:
        """The lines kept."""
        return tuple(self._lines)

    def _flush(self) -> None:
        if self._unhashed:
            self._unhashed.append("")  # the last line ends with a newline too
            self._hash.update("\n".join(self._unhashed).encode())
            self._unhashed.clear()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The library's warnings off for a run: void entries and forged records are the scenario's daily
    bread (the trace tells what happened); logging each would cost more than the run."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


@contextlib.contextmanager
def no_cycle_collection() -> Iterator[None]:
    """The cycle collector paused for a run: a run makes many objects and few cycles (its world, dropped
    whole after it), and each collection pass would walk the run's objects again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
