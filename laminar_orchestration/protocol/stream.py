"""The stream's record: its schema and the processor every node runs, recorded beside the cluster record.

``ledger/stream.json`` is written create-only by the control plane; nodes and producers only read
it. A cluster without one predates it: it runs the default schema and processor.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field, ValidationError

from laminar_orchestration.errors import ConflictError, CorruptDataError
from laminar_orchestration.processing.schema import StreamSchema
from laminar_orchestration.protocol.capabilities import LedgerWriter, ledger_key
from laminar_orchestration.protocol.keys import LEDGER_PREFIX
from laminar_orchestration.protocol.records import Record, now
from laminar_orchestration.store import ObjectStore, PreconditionFailed

#: Where the stream's record lives.
STREAM_KEY = f"{LEDGER_PREFIX}stream.json"


class StreamRecord(Record):
    """The stream's schema and processor, as `laminar init` recorded them."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    kind: Literal["stream"] = "stream"
    stream_schema: StreamSchema = Field(alias="schema")
    processor: str
    processor_fingerprint: str
    created_at: datetime


class CorruptStreamRecord(CorruptDataError):
    """A stream record that does not parse: nothing runs on a stream it cannot describe."""

    key: str
    reason: str

    message = "stream record {key} is corrupt: {reason}"


class StreamAlreadyRecorded(ConflictError):
    """`laminar init` with another schema or processor than the cluster recorded: a stream's logic
    and schema never change under its state."""

    recorded: str
    recorded_fingerprint: str
    asked: str
    fingerprint: str

    message = (
        "the cluster records processor {recorded!r} (fingerprint {recorded_fingerprint:.12}); "
        "init asked for {asked!r} (fingerprint {fingerprint:.12}): a stream's schema and processor never change"
    )


def stream_record_bytes(schema: StreamSchema, processor: str, fingerprint: str) -> bytes:
    """The record `laminar init` creates."""
    record = StreamRecord.model_validate(
        {"schema": schema, "processor": processor, "processor_fingerprint": fingerprint, "created_at": now()}
    )
    return record.model_dump_json(by_alias=True).encode()


def record_stream(
    writer: LedgerWriter, store: ObjectStore, schema: StreamSchema, processor: str, fingerprint: str
) -> None:
    """Create the stream's record; an equal one (an interrupted init run again) is kept, another refused."""
    try:
        writer.create(ledger_key(STREAM_KEY), stream_record_bytes(schema, processor, fingerprint))
    except PreconditionFailed:
        existing = read_stream_record(store)
        if existing is None or existing.processor_fingerprint != fingerprint:
            recorded = existing.processor if existing else "?"
            found = existing.processor_fingerprint if existing else "?"
            raise StreamAlreadyRecorded(recorded, found, processor, fingerprint) from None


def read_stream_record(store: ObjectStore) -> StreamRecord | None:
    """The stream's record; None for a cluster initialised before streams had one."""
    found = store.get_or_none(STREAM_KEY)
    if found is None:
        return None
    try:
        return StreamRecord.model_validate_json(found.data)
    except ValidationError as exc:
        raise CorruptStreamRecord(STREAM_KEY, str(exc.errors()[0].get("msg"))) from None
