"""The stream's record: its schema and the processor every node runs, recorded beside the cluster record.

``ledger/stream.json`` (`keys.STREAM_KEY`) is created once by the control plane (`laminar init
--schema --processor`, `Ledger.init_cluster(schema=..., processor=...)`); nodes and producers only
read it (`read_stream_record`). A cluster without one was initialised without either flag, or
before streams had a record: it runs the default schema and processor.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field, ValidationError

from laminar_orchestration.errors import ConflictError, CorruptDataError, LaminarError
from laminar_orchestration.processing.schema import DEFAULT_STREAM_SCHEMA, StreamSchema
from laminar_orchestration.protocol.capabilities import LedgerWriter, ReadStore, ledger_key
from laminar_orchestration.protocol.keys import STREAM_KEY
from laminar_orchestration.protocol.records import Record, now
from laminar_orchestration.store import ObjectStore, PreconditionFailed

__all__ = [
    "STREAM_KEY",
    "CorruptStreamRecord",
    "StreamAlreadyRecorded",
    "StreamRecord",
    "read_stream_record",
    "record_stream",
    "stream_record",
]


class StreamRecord(Record):
    """The stream's schema and processor, as `laminar init` recorded them."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    kind: Literal["stream"] = "stream"
    #: The events' columns, key and event time (stored under ``schema``).
    stream_schema: StreamSchema = Field(alias="schema")
    #: The processor's reference as `init` was given it (``package.module:attribute`` or a name).
    processor: str = Field(min_length=1, max_length=1024)
    #: `processing.registry.processor_fingerprint` of the processor bound to the schema.
    processor_fingerprint: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_at: datetime

    def to_bytes(self) -> bytes:
        """The stored form (the schema under its alias, ``schema``)."""
        return self.model_dump_json(by_alias=True).encode()


class CorruptStreamRecord(CorruptDataError):
    """A stream record that does not parse: nothing runs on a stream it cannot describe."""

    key: str
    reason: str

    message = "stream record {key} is corrupt: {reason}"


class StreamAlreadyRecorded(ConflictError):
    """`init` with another schema or processor than the cluster records: a stream's logic and schema
    never change under its state."""

    recorded: str
    recorded_fingerprint: str
    asked: str
    fingerprint: str

    message = (
        "the cluster records processor {recorded!r} (fingerprint {recorded_fingerprint:.12}), "
        "init asked for {asked!r} (fingerprint {fingerprint:.12}): a stream's schema and processor never "
        "change (a new stream needs a new store)"
    )


def stream_record(schema: StreamSchema | None = None, processor: str | None = None) -> StreamRecord:
    """The record `init` creates for `schema` and `processor` (each defaulting to the demo's).

    Loads the processor by reference and binds it to the schema first, so a processor that is not
    loadable (`ProcessorNotFound`) or cannot run on the schema (an invalid-input error) is refused
    before anything is written.
    """
    from laminar_orchestration.processing.registry import DEFAULT_PROCESSOR, load_processor, processor_fingerprint

    schema = schema if schema is not None else DEFAULT_STREAM_SCHEMA
    reference = processor if processor is not None else DEFAULT_PROCESSOR
    bound = load_processor(reference).bind(schema)
    fingerprint = processor_fingerprint(bound, schema)
    return StreamRecord.model_validate(
        {"schema": schema, "processor": reference, "processor_fingerprint": fingerprint, "created_at": now()}
    )


def check_stream(store: ObjectStore | ReadStore, record: StreamRecord, *, cluster_exists: bool) -> bool:
    """Whether `record` still has to be created: False when the store already records the same stream.

    Raises `StreamAlreadyRecorded` when it records another one, or when the cluster exists without a
    record (it runs the default stream) and `record` is not the default.
    """
    existing = read_stream_record(store)
    if existing is None:
        if cluster_exists:
            default = stream_record()
            if default.processor_fingerprint != record.processor_fingerprint:
                raise StreamAlreadyRecorded(
                    f"{default.processor} (the default: no stream record)",
                    default.processor_fingerprint,
                    record.processor,
                    record.processor_fingerprint,
                )
        return True
    if existing.processor_fingerprint != record.processor_fingerprint:
        raise StreamAlreadyRecorded(
            existing.processor, existing.processor_fingerprint, record.processor, record.processor_fingerprint
        )
    return False


def record_stream(writer: LedgerWriter, record: StreamRecord) -> None:
    """Create the stream's record; an equal one (an interrupted or repeated init) is kept, another refused."""
    try:
        writer.create(ledger_key(STREAM_KEY), record.to_bytes())
    except PreconditionFailed:
        # A concurrent init recorded one first: the same stream is fine, another is a conflict.
        check_stream(writer, record, cluster_exists=False)


def read_stream_record(store: ObjectStore | ReadStore) -> StreamRecord | None:
    """The stream's record; None for a cluster that has none (it runs the default schema and processor).

    Raises `CorruptStreamRecord` naming the key when the stored object does not parse.
    """
    found = store.get_or_none(STREAM_KEY) if isinstance(store, ObjectStore) else store.get(STREAM_KEY)
    if found is None:
        return None
    try:
        return StreamRecord.model_validate_json(found.data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "<root>"
        raise CorruptStreamRecord(STREAM_KEY, f"{where}: {first.get('msg')}") from None
    except (LaminarError, ValueError) as exc:  # a schema whose types no longer parse (InvalidSchema)
        raise CorruptStreamRecord(STREAM_KEY, str(exc)) from None
