"""The node's side of a processor: which one it runs (checked against the cluster's record), and
its half of a batch - the fold over the touched keys, with the batch's event time, the committed
event-time progress and the local store's expiry index (`processing.contract`)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from laminar_orchestration.dataplane.engine import BatchEngine
from laminar_orchestration.dataplane.errors import ProcessorMismatch
from laminar_orchestration.dataplane.statestore import PartitionStateStore
from laminar_orchestration.errors import LaminarError
from laminar_orchestration.processing.contract import (
    BatchFold,
    EventTimeProgress,
    FoldContext,
    Processor,
    ProcessorFailed,
)
from laminar_orchestration.processing.registry import DEFAULT_PROCESSOR, load_processor, processor_fingerprint
from laminar_orchestration.processing.schema import DEFAULT_STREAM_SCHEMA, StreamSchema
from laminar_orchestration.protocol.segments import SourceBatch
from laminar_orchestration.protocol.stream import read_stream_record
from laminar_orchestration.store import ObjectStore


def batch_max_event_time(batch: SourceBatch, stream: StreamSchema) -> int | None:
    """The largest event time (epoch ms) among `batch`'s events; None for a batch without any.

    Decodes the event-time column alone, one Parquet payload at a time.
    """
    top: int | None = None
    for payload in batch.payloads:
        column = pq.ParquetFile(pa.BufferReader(payload)).read(columns=[stream.event_time])
        millis = stream.event_time_millis(column)
        value = pc.max(millis).as_py()
        if value is not None and (top is None or value > top):
            top = int(value)
    return top


def fold_context(epoch: int, generation: int, progress: EventTimeProgress, store: PartitionStateStore) -> FoldContext:
    """The context of a batch folded now by the owner at `epoch`, on `store` committed at `progress`."""
    return FoldContext(epoch, generation, progress, store, time.time_ns() // 1_000_000)


def fold_batch(
    engine: BatchEngine, batch: SourceBatch, aggregate: pa.Table, previous: pa.Table, context: FoldContext
) -> BatchFold:
    """Fold one batch's aggregate into the touched keys' values, removing the keys whose time came."""
    top = batch_max_event_time(batch, engine.stream)
    try:
        return engine.processor.fold(aggregate, previous, dataclasses.replace(context, batch_max_event_time=top))
    except LaminarError:
        raise
    except Exception as exc:  # the user's code: whatever it raises fails the batch, the same way every time
        raise ProcessorFailed(engine.processor.name, batch.start_offset, f"{type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class StreamLogic:
    """What a node runs: the cluster's stream schema and its processor, bound to that schema."""

    stream: StreamSchema
    processor: Processor
    reference: str


def resolve_logic(store: ObjectStore, node: int, *, reference: str | None, given: Processor | None) -> StreamLogic:
    """The stream and processor a node runs, checked against the cluster's record.

    `given` (a processor object passed in code) or `reference` (``--processor``) override the
    recorded reference; either must have the recorded fingerprint. A cluster without a stream
    record runs the default schema, with any processor (it predates the record).
    """
    record = read_stream_record(store)
    stream = record.stream_schema if record is not None else DEFAULT_STREAM_SCHEMA
    chosen = reference or (record.processor if record is not None else DEFAULT_PROCESSOR)
    processor = (given if given is not None else load_processor(chosen)).bind(stream)
    name = chosen if given is None else processor.name
    if record is not None:
        fingerprint = processor_fingerprint(processor, stream)
        if fingerprint != record.processor_fingerprint:
            raise ProcessorMismatch(node, record.processor, record.processor_fingerprint, name, fingerprint)
    return StreamLogic(stream, processor, name)
