"""The stream's record: its schema and the processor every node runs, recorded beside the cluster record.

``ledger/stream.json`` is written create-only by the control plane; nodes and producers only read
it. A cluster without one predates it: it runs the default schema and processor.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, ValidationError

from laminar_orchestration.errors import CorruptDataError
from laminar_orchestration.processing.schema import StreamSchema
from laminar_orchestration.protocol.keys import LEDGER_PREFIX
from laminar_orchestration.protocol.records import Record
from laminar_orchestration.store import ObjectStore

#: Where the stream's record lives.
STREAM_KEY = f"{LEDGER_PREFIX}stream.json"


class StreamRecord(Record):
    """The stream's schema and processor, as `laminar init` recorded them."""

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


def read_stream_record(store: ObjectStore) -> StreamRecord | None:
    """The stream's record; None for a cluster initialised before streams had one."""
    found = store.get_or_none(STREAM_KEY)
    if found is None:
        return None
    try:
        return StreamRecord.model_validate_json(found.data)
    except ValidationError as exc:
        raise CorruptStreamRecord(STREAM_KEY, str(exc.errors()[0].get("msg"))) from None
