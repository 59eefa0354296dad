"""Where the source log ends: each partition's head pointer, which producers move (`SourceHead`), and the
log ends the nodes watch (`LogEnds`), which producers merge after their appends (`RecordedEnds`)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from laminar_orchestration.protocol.capabilities import ReadStore, SourceAppender, source_key
from laminar_orchestration.protocol.keys import LOG_ENDS_KEY
from laminar_orchestration.protocol.source_errors import CorruptSourceHead
from laminar_orchestration.store import ConcurrentModification, PreconditionFailed

log = logging.getLogger(__name__)

#: A producer merges its log ends over this many concurrent producers' writes at most.
_ENDS_ATTEMPTS = 20


class SourceHead(BaseModel):
    """The producers' CAS pointer: offsets below `next_offset` are all covered by segments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    next_offset: int = Field(ge=0)
    segments: int = Field(ge=0)
    updated_at: datetime
    #: Makes every head write's bytes unique, so a retry layer's read-back can tell
    #: our write from an equal-looking one (and S3 ETags, MD5s, never repeat).
    write_id: str = Field(default_factory=lambda: secrets.token_hex(8))


class LogEnds(BaseModel):
    """Each partition's log end as producers recorded it after their appends (`keys.LOG_ENDS_KEY`).

    A hint merged by compare-and-swap, never ahead of the segments: a producer records an end
    only after the segments below it exist. It may lag (a producer that died before recording),
    so a node that waits on it still polls each log now and then.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    ends: dict[int, int]
    updated_at: datetime
    write_id: str = Field(default_factory=lambda: secrets.token_hex(8))


def parse_log_ends(data: bytes, *, replace: bool = False) -> dict[int, int]:
    """The ends in a stored object; with `replace`, a corrupt one counts as empty (it is a hint)."""
    try:
        return dict(LogEnds.model_validate_json(data).ends)
    except ValidationError as exc:
        if replace:
            log.warning("replacing the corrupt log ends %s: %s", LOG_ENDS_KEY, exc.errors()[0].get("msg"))
            return {}
        raise CorruptSourceHead(LOG_ENDS_KEY, str(exc.errors()[0].get("msg"))) from exc


class RecordedEnds:
    """One producer's side of the log ends: it merges the new ends of its appends in by compare-and-swap."""

    def __init__(self, reads: ReadStore) -> None:
        self._reads = reads
        #: The log ends object as this producer last wrote it (ETag, ends): the next merge starts there.
        self._known: tuple[str | None, dict[int, int]] | None = None

    def merge(self, appender: SourceAppender, ends: Mapping[int, int]) -> None:
        """Merge `ends` into the stored log ends (each partition keeps the larger end); a corrupt object is
        replaced. Raises `ConcurrentModification` when `_ENDS_ATTEMPTS` writes in a row lose their race."""
        key = source_key(LOG_ENDS_KEY)
        known = self._known
        for _attempt in range(_ENDS_ATTEMPTS):
            if known is None:
                obj = self._reads.get(LOG_ENDS_KEY)
                known = (None, {}) if obj is None else (obj.etag, parse_log_ends(obj.data, replace=True))
            etag, current = known
            merged = dict(current)
            for p, end in ends.items():
                merged[p] = max(end, merged.get(p, 0))
            data = LogEnds(ends=merged, updated_at=datetime.now(UTC)).model_dump_json().encode()
            try:
                written = appender.create_source(key, data) if etag is None else appender.swap_source(key, data, etag)
            except (PreconditionFailed, ConcurrentModification):
                known = None  # another producer recorded ends meanwhile: merge with theirs
                continue
            self._known = (written, merged)
            return
        self._known = None
        raise ConcurrentModification(LOG_ENDS_KEY)
