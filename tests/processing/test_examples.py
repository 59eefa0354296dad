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
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]
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

pytestmark = pytest.mark.spark

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MINUTE = 60_000
START = 1_700_000_000_000


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = build_spark_session("local[1]", "laminar-test-processing")
    yield session


def _clicks(n: int, seed: int) -> pa.Table:
    """Page views of 12 users over ~3 hours: mostly in order, some minutes late, a few far too late."""
    rng = random.Random(seed)
    rows = []
    clock = START
    for i in range(n):
        clock += rng.randint(0, 40_000)
        at = clock - (rng.randint(0, 3 * MINUTE) if rng.random() < 0.15 else 0)
        if rng.random() < 0.03:
            at = clock - rng.randint(10 * MINUTE, 40 * MINUTE)  # far too late
        if rng.random() < 0.02:
            clock += 45 * MINUTE  # a pause longer than a session's gap
        rows.append(
            {
                "offset": i,
                "user": f"u{rng.randint(0, 11)}",
                "page": rng.choice(["/", "/a", "/b", "/cart", "/pay"]),
                "amount": Decimal(rng.randint(0, 999)) / 100,
                "tags": [rng.choice(["x", "y"])] if rng.random() < 0.5 else None,
                "at": datetime.fromtimestamp(at / 1000, UTC),
            }
        )
    return pa.Table.from_pylist(rows, schema=StreamSchema.from_file(EXAMPLES / "clicks.yaml").event_schema)


def _orders(n: int, seed: int) -> pa.Table:
    """Orders over ~3 days, a fifth of them sent again within minutes or days (a retrying producer)."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    clock = START
    for i in range(n):
        clock += rng.randint(0, 40 * MINUTE)
        if rows and rng.random() < 0.2:
            again = dict(rng.choice(rows[-50:]))
            again["at"] = datetime.fromtimestamp((clock - rng.randint(0, 30_000)) / 1000, UTC)
            again["offset"] = i
            rows.append(again)
            continue
        rows.append(
            {
                "offset": i,
                "customer": f"c{rng.randint(0, 7)}",
                "order_id": f"o{i}",
                "total": Decimal(rng.randint(100, 99_999)) / 100,
                "items": [{"sku": f"s{rng.randint(0, 5)}", "quantity": rng.randint(1, 3)}],
                "at": datetime.fromtimestamp((clock - rng.randint(0, 2 * MINUTE)) / 1000, UTC),
            }
        )
    return pa.Table.from_pylist(rows, schema=StreamSchema.from_file(EXAMPLES / "orders.yaml").event_schema)


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


def _frame(events: pa.Table) -> pd.DataFrame:
    """The events as pandas, with ``t``: the event time in epoch milliseconds."""
    frame = events.to_pandas()
    frame["t"] = [int(at.timestamp() * 1000) for at in events["at"].to_pylist()]
    return frame


def _ms(value: Any) -> int:
    return int(pd.Timestamp(value).timestamp() * 1000)


def test_windowed_counts_equal_pandas_over_the_same_events(spark: Any, tmp_path: Path) -> None:
    schema = StreamSchema.from_file(EXAMPLES / "clicks.yaml")
    events = _clicks(1500, seed=7)
    output, store, progress = _run(spark, windowed_counts.processor, schema, events, tmp_path, seed=3)

    frame = _frame(events)
    late = frame["t"] < frame["t"].cummax() - MINUTE
    watermark = int(frame["t"].max()) - MINUTE
    timely = frame[~late].copy()
    timely["start"] = timely["t"] - timely["t"] % (5 * MINUTE)
    expected = (
        timely.groupby(["user", "start"])
        .agg(views=("page", "size"), amount=("amount", "sum"), pages=("page", lambda p: sorted(set(p))))
        .reset_index()
    )
    expected = expected[expected["start"] + 5 * MINUTE <= watermark]
    got = output.to_pandas()
    got["start"] = [_ms(v) for v in got["window_start"]]
    got_rows = sorted((r.key, r.start, r.views, r.amount, list(r.pages)) for r in got.itertuples())
    want_rows = sorted((r.user, r.start, r.views, r.amount, r.pages) for r in expected.itertuples())
    assert late.sum() > 0 and len(want_rows) > 20
    assert got_rows == want_rows  # each window once, with exactly its timely events
    assert progress.late_events == int(late.sum())
    # Only windows still open are held: every window the watermark passed left the state.
    held = store.to_table().to_pandas()
    assert (held["_expires_at"] > watermark).all()
    assert len(held) == timely[timely["start"] + 5 * MINUTE > watermark].groupby(["user", "start"]).ngroups


def test_sessions_equal_pandas_over_the_same_events(spark: Any, tmp_path: Path) -> None:
    schema = StreamSchema.from_file(EXAMPLES / "clicks.yaml")
    events = _clicks(1200, seed=11)
    output, store, _ = _run(spark, sessions.processor, schema, events, tmp_path, seed=5)

    gap = 30 * MINUTE
    frame = _frame(events)
    late = frame["t"] < frame["t"].cummax() - MINUTE
    watermark = int(frame["t"].max()) - MINUTE
    want = []
    for user, clicks in frame[~late].groupby("user"):
        clicks = clicks.sort_values(["t", "offset"])
        current: list[Any] = []
        for row in clicks.itertuples():
            if current and row.t - current[-1].t >= gap:
                want.append((user, current))
                current = []
            current.append(row)
        want.append((user, current))
    expected = sorted(
        (u, c[0].t, c[-1].t + gap, len(c), sorted({r.page for r in c}), c[0].page, c[-1].page)
        for u, c in want
        if c[-1].t + gap <= watermark
    )
    got = output.to_pandas()
    got_rows = sorted(
        (
            r.key,
            _ms(r.session_start),
            _ms(r.session_end),
            r.clicks,
            list(r.pages),
            r.entry_page,
            r.exit_page,
        )
        for r in got.itertuples()
    )
    assert len(expected) > 10
    assert got_rows == expected
    held = store.to_table().to_pylist()
    open_sessions = [s for row in held for s in row["sessions"]]
    assert all(s["last"] + gap > watermark for s in open_sessions)
    assert len(open_sessions) == sum(1 for _, c in want if c[-1].t + gap > watermark)


def test_dedup_equals_a_direct_walk_over_the_same_events(spark: Any, tmp_path: Path) -> None:
    schema = StreamSchema.from_file(EXAMPLES / "orders.yaml")
    events = _orders(600, seed=13)
    output, store, progress = _run(spark, dedup.processor, schema, events, tmp_path, seed=9)

    ttl, top = 24 * 60 * MINUTE, None
    remembered: dict[str, int] = {}
    want, late = [], 0
    for row in events.to_pylist():
        t = int(row["at"].timestamp() * 1000)
        top = t if top is None else max(top, t)
        watermark = top - MINUTE
        if t < watermark:
            late += 1
            continue
        if remembered.get(row["order_id"], -(2**62)) > watermark:
            continue
        remembered[row["order_id"]] = t + ttl
        want.append(row["offset"])
    assert len(want) < events.num_rows - late  # some were duplicates
    assert output["offset"].to_pylist() == want
    assert progress.late_events == late
    assert top is not None
    still = {k for k, until in remembered.items() if until > top - MINUTE}
    assert set(store.to_table()["key"].to_pylist()) == still
