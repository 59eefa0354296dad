"""The 32-byte frame header and the two-phase publish protocol (write, make durable, then flag published).

Wire layout (little-endian, packed, no padding)::

    offset  size  field
         0     4  magic       0x5F4E4D46 ("FMN_" on disk, "_NMF" as a u32)
         4     2  version     1
         6     4  length      payload bytes that follow the header
        10     8  epoch       monotonically increasing id
        18     8  generation  producer generation (identity injection)
        26     4  partition   partition the frame belongs to (ownership)
        30     2  flags       bit 0 = published; other bits reserved (0)

A writer publishes a frame in two phases: the header goes out with
``flags = 0``, then the payload, then (after a flush and optionally an fsync)
only the flags field is rewritten to 1. A crash at any point therefore leaves
either nothing, a truncated frame, or a complete-but-unpublished frame; never
a frame that claims to be published while its payload is missing.

Readers stop at the first frame that is not a valid, published, complete
frame and raise a typed `FrameError` naming the source and byte offset; they
never skip ahead (the next "header" could be payload bytes) or guess.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from laminar_orchestration.errors import CorruptDataError

__all__ = [
    "FLAGS_OFFSET",
    "FLAG_PUBLISHED",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_PAYLOAD",
    "VERSION",
    "BadMagic",
    "FrameError",
    "FrameHeader",
    "FrameMismatch",
    "FrameReader",
    "FrameWriter",
    "TruncatedFrame",
    "UnpublishedFrame",
    "UnsupportedVersion",
    "encode_frame",
    "iter_frames",
]

MAGIC = 0x5F4E4D46
VERSION = 1
FLAG_PUBLISHED = 0x0001
_HEADER = struct.Struct("<IHIQQIH")
HEADER_SIZE = _HEADER.size
#: Byte offset of the flags field inside the header; phase two rewrites only these bytes.
FLAGS_OFFSET = 30
_FLAGS = struct.Struct("<H")
MAX_PAYLOAD = 0xFFFF_FFFF
_U64 = 0xFFFF_FFFF_FFFF_FFFF
_U32 = 0xFFFF_FFFF
_U16 = 0xFFFF

assert HEADER_SIZE == 32  # the on-disk layout is fixed; a struct typo must not slip through


# --- errors -----------------------------------------------------------------

#: Where a frame error is, the start of every frame error's message. The messages below
#: are f-strings only to take in the module's constants: their fields are in double braces.
_AT = "frame at offset {offset} of {source!r}"


class FrameError(CorruptDataError):
    """Base of frame errors: `source` (object key or file name) and byte `offset` of the frame."""

    source: str
    offset: int

    message = f"bad {_AT}"


class BadMagic(FrameError):
    """The bytes at `offset` do not start with the frame magic: corruption or a foreign file."""

    magic: int

    message = f"{_AT}: bad magic 0x{{magic:08X}} (expected 0x{MAGIC:08X})"


class UnsupportedVersion(FrameError):
    """A frame written by a protocol version this reader does not speak."""

    version: int

    message = f"{_AT}: unsupported frame version {{version}} (this reader speaks {VERSION})"


class UnpublishedFrame(FrameError):
    """A frame whose published flag is clear: the writer died between its two phases."""

    flags: int
    length: int

    message = (
        f"{_AT}: frame is not published (flags=0x{{flags:04X}}, length={{length}}); "
        "the writer stopped before completing the two-phase publish"
    )


class TruncatedFrame(FrameError):
    """The data ends inside the header or the payload.

    `needed` bytes were required from `offset`; only `available` were there.
    """

    needed: int
    available: int

    def _message(self) -> str:
        what = "header" if self.needed == HEADER_SIZE else "payload"
        at = _AT.format(offset=self.offset, source=self.source)
        return f"{at}: truncated {what}: needs {self.needed} bytes, only {self.available} available"


class FrameMismatch(FrameError):
    """A well-formed frame whose `field` (partition/generation/epoch) is not the expected value."""

    field: str
    expected: int
    actual: int

    message = f"{_AT}: {{field}} is {{actual}}, expected {{expected}}"


# --- header -----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameHeader:
    """One decoded frame header. `pack()` produces exactly `HEADER_SIZE` bytes."""

    length: int
    epoch: int
    generation: int
    partition: int
    flags: int = 0
    version: int = VERSION
    magic: int = MAGIC

    def __post_init__(self) -> None:
        for name, limit in (
            ("magic", _U32),
            ("version", _U16),
            ("length", _U32),
            ("epoch", _U64),
            ("generation", _U64),
            ("partition", _U32),
            ("flags", _U16),
        ):
            value = getattr(self, name)
            if not 0 <= value <= limit:
                raise ValueError(f"frame header field {name}={value} out of range 0..{limit}")

    @property
    def published(self) -> bool:
        """Whether the two-phase publish completed (flags bit 0)."""
        return bool(self.flags & FLAG_PUBLISHED)

    def pack(self) -> bytes:
        """The 32 wire bytes, little-endian."""
        return _HEADER.pack(
            self.magic,
            self.version,
            self.length,
            self.epoch,
            self.generation,
            self.partition,
            self.flags,
        )

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview, offset: int = 0) -> FrameHeader:
        """Decode the header at `offset` without validating it (see `check_header`).

        Raises `struct.error` if fewer than `HEADER_SIZE` bytes are available.
        """
        magic, version, length, epoch, generation, partition, flags = _HEADER.unpack_from(data, offset)
        return cls(
            magic=magic,
            version=version,
            length=length,
            epoch=epoch,
            generation=generation,
            partition=partition,
            flags=flags,
        )


def encode_frame(payload: bytes | bytearray | memoryview, epoch: int, generation: int, partition: int) -> bytes:
    """One complete, published frame (header with flags=1 followed by the payload).

    For objects written atomically (a create-only store put) the two phases are
    unnecessary: the object appears whole or not at all.
    """
    length = len(payload)
    if length > MAX_PAYLOAD:
        raise ValueError(f"frame payload of {length} bytes exceeds the u32 length field")
    header = FrameHeader(length=length, epoch=epoch, generation=generation, partition=partition, flags=FLAG_PUBLISHED)
    return header.pack() + bytes(payload)


def check_header(
    header: FrameHeader,
    *,
    source: str,
    offset: int,
    available: int,
    expected_partition: int | None = None,
    expected_generation: int | None = None,
) -> None:
    """Validate a decoded header; `available` counts the bytes after the header.

    Order matters: magic first (else every other field is noise), then version
    (else the layout is unknown), then the published flag (a torn two-phase
    write is reported as such even when its payload is also short), then the
    length, then identity.
    """
    if header.magic != MAGIC:
        raise BadMagic(source, offset, header.magic)
    if header.version != VERSION:
        raise UnsupportedVersion(source, offset, header.version)
    if not header.published:
        raise UnpublishedFrame(source, offset, header.flags, header.length)
    if header.length > available:
        raise TruncatedFrame(source, offset, HEADER_SIZE + header.length, HEADER_SIZE + available)
    if expected_partition is not None and header.partition != expected_partition:
        raise FrameMismatch(source, offset, "partition", expected_partition, header.partition)
    if expected_generation is not None and header.generation != expected_generation:
        raise FrameMismatch(source, offset, "generation", expected_generation, header.generation)


# --- reading ----------------------------------------------------------------


def iter_frames(
    data: bytes | bytearray | memoryview,
    *,
    source: str,
    expected_partition: int | None = None,
    expected_generation: int | None = None,
) -> Iterator[tuple[FrameHeader, memoryview]]:
    """Yield `(header, payload)` for each frame in `data`; payloads are zero-copy views.

    Stops cleanly at the exact end of the data. Raises a `FrameError` at the
    first bad, torn or truncated frame, after yielding every good frame before it.
    """
    view = memoryview(data).cast("B")
    total = len(view)
    pos = 0
    while pos < total:
        if total - pos < HEADER_SIZE:
            raise TruncatedFrame(source, pos, HEADER_SIZE, total - pos)
        header = FrameHeader.unpack(view, pos)
        check_header(
            header,
            source=source,
            offset=pos,
            available=total - pos - HEADER_SIZE,
            expected_partition=expected_partition,
            expected_generation=expected_generation,
        )
        start = pos + HEADER_SIZE
        end = start + header.length
        yield header, view[start:end]
        pos = end


class FrameReader:
    """Iterate `(header, payload bytes)` over a binary file object, frame by frame.

    Reads one frame at a time, so a large file is never held in memory at once.
    Same checks and stopping rule as `iter_frames`.
    """

    def __init__(
        self,
        fileobj: BinaryIO,
        *,
        source: str,
        expected_partition: int | None = None,
        expected_generation: int | None = None,
    ) -> None:
        self._f = fileobj
        self.source = source
        self.expected_partition = expected_partition
        self.expected_generation = expected_generation
        #: Byte offset of the next frame, relative to where the reader started.
        self.offset = 0

    def __iter__(self) -> Iterator[tuple[FrameHeader, bytes]]:
        return self

    def __next__(self) -> tuple[FrameHeader, bytes]:
        raw = _read_exactly(self._f, HEADER_SIZE)
        if not raw:
            raise StopIteration
        if len(raw) < HEADER_SIZE:
            raise TruncatedFrame(self.source, self.offset, HEADER_SIZE, len(raw))
        header = FrameHeader.unpack(raw)
        # Check everything except the length before reading the payload: a garbage
        # length from a corrupt header must not make us allocate gigabytes.
        check_header(
            header,
            source=self.source,
            offset=self.offset,
            available=MAX_PAYLOAD,
            expected_partition=self.expected_partition,
            expected_generation=self.expected_generation,
        )
        payload = _read_exactly(self._f, header.length)
        if len(payload) < header.length:
            raise TruncatedFrame(self.source, self.offset, HEADER_SIZE + header.length, HEADER_SIZE + len(payload))
        self.offset += HEADER_SIZE + header.length
        return header, payload


def _read_exactly(f: BinaryIO, n: int) -> bytes:
    """Read up to `n` bytes, looping over short reads (pipes, sockets, raw files)."""
    chunks: list[bytes] = []
    remaining = n
    while remaining > 0:
        chunk = f.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


# --- writing ----------------------------------------------------------------


class FrameWriter:
    """Append frames to a seekable binary file with the two-phase publish.

    `write()` = `write_unpublished()` + `publish()`. The file must be opened for
    random-access writing (``"wb"``, ``"r+b"``, ``"w+b"``), not append mode:
    with ``O_APPEND`` the flags rewrite would land at the end of the file.
    """

    def __init__(
        self,
        fileobj: BinaryIO,
        *,
        epoch: int,
        generation: int,
        partition: int,
        fsync: bool = False,
    ) -> None:
        if "a" in getattr(fileobj, "mode", ""):
            raise ValueError("FrameWriter needs a file not in append mode (use 'r+b' or 'wb')")
        self._f = fileobj
        self.epoch = epoch
        self.generation = generation
        self.partition = partition
        self.fsync = fsync

    def write(self, payload: bytes | bytearray | memoryview) -> int:
        """Write and publish one frame; returns the byte offset of its header."""
        offset = self.write_unpublished(payload)
        self.publish(offset)
        return offset

    def write_unpublished(self, payload: bytes | bytearray | memoryview) -> int:
        """Phase one: header with flags=0, then the payload, flushed (and fsynced if asked).

        Returns the frame's offset, to be passed to `publish`.
        """
        if len(payload) > MAX_PAYLOAD:
            raise ValueError(f"frame payload of {len(payload)} bytes exceeds the u32 length field")
        header = FrameHeader(
            length=len(payload),
            epoch=self.epoch,
            generation=self.generation,
            partition=self.partition,
            flags=0,
        )
        offset = self._f.seek(0, os.SEEK_END)
        self._f.write(header.pack())
        self._f.write(payload)
        # The publish barrier: the payload must be durable before the flag says so.
        self._sync()
        return offset

    def publish(self, offset: int) -> None:
        """Phase two: set the published bit of the frame at `offset`.

        Only the low byte of the flags changes (0x00 -> 0x01), so even a torn
        write of this field cannot produce a half-valid header.
        """
        end = self._f.seek(0, os.SEEK_END)
        self._f.seek(offset + FLAGS_OFFSET)
        self._f.write(_FLAGS.pack(FLAG_PUBLISHED))
        self._sync()
        self._f.seek(end)

    def _sync(self) -> None:
        self._f.flush()
        if self.fsync:
            os.fsync(self._f.fileno())
