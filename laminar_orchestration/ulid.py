"""ULIDs: 128-bit ids that sort by creation time (48 bits of ms, 80 random bits), 26 Crockford characters.

Commit ids and the names of fenced objects end in one, so an audit can read
when (by the writer's clock) an object was written.
"""

from __future__ import annotations

import re
import threading

from laminar_orchestration import clock

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_lock = threading.Lock()

#: A well-formed ULID (the first character carries only 3 bits).
ULID_PATTERN = re.compile(r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$")


def _encode(value: int) -> str:
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def decode_ulid(text: str) -> int:
    """The 128-bit value of `text`; ValueError if it holds a character outside Crockford base32."""
    value = 0
    for ch in text:
        value = (value << 5) | _CROCKFORD.index(ch)
    return value


def ulid_time_ms(text: str) -> int:
    """The creation time of ULID `text`, in ms since the Unix epoch by its writer's clock."""
    return decode_ulid(text) >> 80


def next_ulid(after: str | None = None) -> str:
    """A ULID (ms timestamp + randomness) strictly greater than `after`."""
    with _lock:
        source = clock.current()
        millis = int(source.now().timestamp() * 1000)
        value = (millis << 80) | int.from_bytes(source.random_bytes(10), "big")
        if after is not None:
            floor = decode_ulid(after)
            if value <= floor:
                value = floor + 1
        return _encode(value)
