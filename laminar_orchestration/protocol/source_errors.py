"""The source log's errors: appends and reads it refuses, and stored segments, heads or input files it
cannot read."""

from __future__ import annotations

from laminar_orchestration.errors import CorruptDataError, InvalidInputError, LaminarError


class SourceError(LaminarError):
    """Base of source-log errors."""


class SourceNotWritable(SourceError, InvalidInputError):
    """An append through a log opened without the `SourceAppender` capability (a node's reading log)."""

    partition: int

    message = "cannot append to partition {partition}: this source log reads only (no SourceAppender)"


class OffsetNotAtSegmentBoundary(SourceError, InvalidInputError):
    """`offset` is neither the start of a segment nor the end of the log (`log_end`)."""

    partition: int
    offset: int
    log_end: int

    def _message(self) -> str:
        where = "beyond the end of" if self.offset > self.log_end else "inside a segment of"
        return (
            f"source offset {self.offset} is {where} partition {self.partition} "
            f"(log end {self.log_end}); committed offsets must be segment boundaries"
        )


class CorruptSegment(SourceError, CorruptDataError):
    """A segment object that does not decode into the expected frames and events."""

    key: str
    reason: str

    message = "corrupt source segment {key!r}: {reason}"


class CorruptSourceHead(SourceError, CorruptDataError):
    """A head pointer that does not parse (or moved backwards). Nothing overwrites it."""

    key: str
    reason: str

    message = "corrupt source head {key!r}: {reason}"


class InvalidEvents(SourceError, InvalidInputError):
    """Events handed to `SourceLog.append` that do not fit the event schema.

    `row` (0-based, in the events handed in) and `column` name the offending value when one does.
    """

    partition: int
    reason: str
    row: int | None = None
    column: str | None = None

    message = "invalid events for partition {partition}: {reason}"


class UndecodableSegment(SourceError, CorruptDataError):
    """A segment whose events cannot be decoded: a key that is not valid UTF-8, or unreadable column data.

    `append` never writes one (it validates every key); it comes from a segment written before that
    check, or by a writer that bypassed `append`. It is permanent: reading the segment again fails
    the same way, so a node does not restart the partition (`Node`), and nothing of it is skipped.
    `key` is the segment's object key, `start_offset` its first offset, `offset` the offending event's.
    """

    partition: int
    key: str
    start_offset: int
    offset: int
    reason: str

    message = (
        "undecodable source segment {key!r} (partition {partition}, segment at offset "
        "{start_offset}): event at offset {offset}: {reason}; every read of it fails the same way"
    )


class PartitionOutOfRange(SourceError, InvalidInputError):
    """A partition id below 0 or not below the configured partition count."""

    partition: int
    partitions: int | None

    def _message(self) -> str:
        limit = f"0..{self.partitions - 1}" if self.partitions is not None else ">= 0"
        return f"partition {self.partition} out of range (expected {limit})"


class BadInputLine(SourceError, InvalidInputError):
    """A JSONL input line that is not a valid `SourceEvent`; nothing of the file was appended."""

    path: str
    line_number: int
    reason: str

    message = "{path}, line {line_number}: {reason} (nothing from this file was appended)"


class InputFileError(SourceError, InvalidInputError):
    """An input file that cannot be read (missing, a directory, no permission); nothing was appended."""

    path: str
    reason: str

    message = "cannot read input file {path}: {reason} (nothing was appended)"
