"""The example processors on Spark, checked against an independent pandas computation.

Each stream is generated with out-of-order and late events, cut into batches of random sizes,
and folded batch by batch on a real local store; halfway through, the state is restored on a
new store from the uploaded-style deltas alone (what a new owner does after a move). The
output must equal the reference computed over the same events in plain pandas - same windows,
same lateness rule (an event below the largest event time before it, minus the lateness, is
late) - each window exactly once, and the state must hold only what is still open.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from examples import dedup, sessions, windowed_counts
from laminar_orchestration.dataplane.engine import (
    SparkBatchEngine,
    build_spark_session,
    parquet_bytes_to_table,
    table_to_parquet_bytes,
)
from laminar_orchestration.dataplane.statestore import PartitionStateStore
from laminar_orchestration.processing.contract import (
    EventTimeProgress,
    FoldContext,
    Processor,
    delta_with_removals,
    split_delta,
)
from laminar_orchestration.processing.schema import StreamSchema
from tests.processing import streams

pytestmark = pytest.mark.spark

EXAMPLES = streams.EXAMPLES


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = build_spark_session("local[1]", "laminar-test-processing")
    yield session


def _run(
    spark: Any, processor: Processor, schema: StreamSchema, events: pa.Table, tmp: Path, seed: int
) -> tuple[pa.Table, PartitionStateStore, EventTimeProgress]:
    """Fold `events` in random batches; halfway, restore the state on a new store from the deltas alone."""
    engine = SparkBatchEngine(spark, processor, str(tmp / "spark"), stream=schema)
    bound = engine.processor
    rng = random.Random(seed)

    def new_store(name: str) -> PartitionStateStore:
        return PartitionStateStore(tmp / name, bound.codec.schema, partition=0, expiry_column=bound.expiry_column)

    store, progress, outputs, deltas = new_store("a"), EventTimeProgress(), [], []
    offset, moved = 0, False
    while offset < events.num_rows:
        end = min(events.num_rows, offset + rng.randint(1, 60))
        aggregate = engine.aggregate(events.slice(offset, end - offset), epoch=1, generation=0, progress=progress)
        previous = store.get_many(aggregate["key"].to_pylist())
        top = int(pa.compute.max(schema.event_time_millis(events.slice(offset, end - offset))).as_py())
        context = FoldContext(1, 0, progress, store, 0, batch_max_event_time=top)
        fold = bound.fold(aggregate, previous, context)
        outputs.append(fold.output)
        # As a commit uploads it: the delta's Parquet bytes, read back on restore.
        deltas.append((parquet_bytes_to_table(table_to_parquet_bytes(delta_with_removals(fold))), end))
        store.apply(fold.delta, end, deleted=fold.deleted)
        progress, offset = fold.progress, end
        if not moved and offset >= events.num_rows // 2:
            # A move: the new owner has only the committed deltas and the progress in the manifest.
            moved, store = True, new_store("b")
            for delta, at in deltas:
                upserts, removed = split_delta(delta)
                store.apply(upserts, at, deleted=removed)
    return pa.concat_tables(outputs), store, progress


def test_windowed_counts_equal_pandas_over_the_same_events(spark: Any, tmp_path: Path) -> None:
    schema = StreamSchema.from_file(EXAMPLES / "clicks.yaml")
    events = streams.clicks(1500, seed=7)
    output, store, progress = _run(spark, windowed_counts.processor, schema, events, tmp_path, seed=3)

    expected = streams.windowed_counts(events)
    got = sorted(streams.window_row(r) for r in output.to_pylist())
    assert expected.late > 0 and len(expected.rows) > 20
    assert got == expected.rows  # each window once, with exactly its timely events
    assert progress.late_events == expected.late
    # Only windows still open are held: every window the watermark passed left the state.
    held = store.to_table()
    assert held.num_rows == expected.held
    assert min(held["_expires_at"].to_pylist()) > progress.watermark(streams.LATENESS)


def test_sessions_equal_pandas_over_the_same_events(spark: Any, tmp_path: Path) -> None:
    schema = StreamSchema.from_file(EXAMPLES / "clicks.yaml")
    events = streams.clicks(1200, seed=11)
    output, store, progress = _run(spark, sessions.processor, schema, events, tmp_path, seed=5)

    expected = streams.sessions(events)
    got = sorted(streams.session_row(r) for r in output.to_pylist())
    assert len(expected.rows) > 10
    assert got == expected.rows
    open_sessions = [s for row in store.to_table().to_pylist() for s in row["sessions"]]
    assert len(open_sessions) == expected.held
    assert all(s["last"] + 30 * streams.MINUTE > progress.watermark(streams.LATENESS) for s in open_sessions)


def test_dedup_equals_a_direct_walk_over_the_same_events(spark: Any, tmp_path: Path) -> None:
    schema = StreamSchema.from_file(EXAMPLES / "orders.yaml")
    events = streams.orders(600, seed=13)
    output, store, progress = _run(spark, dedup.processor, schema, events, tmp_path, seed=9)

    expected = streams.dedup(events)
    got = sorted(streams.order_row(r) for r in output.to_pylist())
    assert len(expected.rows) < events.num_rows - expected.late  # some were duplicates
    assert got == expected.rows
    assert progress.late_events == expected.late
    assert store.to_table().num_rows == expected.held  # ids leave the state a day after their order
