"""The example streams and their answers computed independently of the processors.

Generators make click and order events with out-of-order, late and (for orders) retried sends.
Each reference takes one partition's events in log order and computes the example's output
with plain pandas or a direct walk, by the same lateness rule the processors promise: an event
below the largest event time before it (in log order) minus the lateness is late and dropped,
and a window or session is final once that watermark reaches its end. Each also says how much
state must still be held afterwards (what is open), so a test can check eviction.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]
import pyarrow as pa

from laminar_orchestration.processing.schema import StreamSchema

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MINUTE = 60_000
LATENESS = MINUTE  # every example allows one minute
START = 1_700_000_000_000


@dataclass(frozen=True)
class Answer:
    """An example's output rows over one partition, and how many state rows must remain held."""

    rows: list[tuple[Any, ...]]
    held: int
    late: int


def clicks(n: int, seed: int) -> pa.Table:
    """Page views of 12 users over ~n/90 hours: mostly in order, some minutes late, a few far too late."""
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


def orders(n: int, seed: int) -> pa.Table:
    """Orders over ~n/70 days, a fifth of them sent again within minutes or days (a retrying producer),
    a few hours late."""
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
        if rng.random() < 0.03:  # a till that was offline for hours: far too late
            rows[-1]["at"] = datetime.fromtimestamp((clock - rng.randint(MINUTE * 90, MINUTE * 300)) / 1000, UTC)
    return pa.Table.from_pylist(rows, schema=StreamSchema.from_file(EXAMPLES / "orders.yaml").event_schema)


def millis(value: Any) -> int:
    """A timestamp (datetime, pandas or numpy) in epoch milliseconds."""
    return int(pd.Timestamp(value).timestamp() * 1000)


def _frame(events: pa.Table) -> tuple[pd.DataFrame, pd.Series, int]:
    """One partition's events as pandas with ``t`` (event time in ms), which are late, and the final watermark."""
    frame = events.to_pandas()
    frame["t"] = [millis(at) for at in events["at"].to_pylist()]
    late = frame["t"] < frame["t"].cummax() - LATENESS
    return frame, late, int(frame["t"].max()) - LATENESS


def windowed_counts(events: pa.Table, window_ms: int = 5 * MINUTE) -> Answer:
    """Per (user, 5-minute window) whose end the watermark reached: views, amount, distinct pages."""
    frame, late, watermark = _frame(events)
    timely = frame[~late].copy()
    timely["start"] = timely["t"] - timely["t"] % window_ms
    rows = []
    for (user, start), window in timely.groupby(["user", "start"]):
        if start + window_ms <= watermark:
            rows.append((user, int(start), len(window), window["amount"].sum(), sorted(set(window["page"]))))
    held = timely[timely["start"] + window_ms > watermark].groupby(["user", "start"]).ngroups
    return Answer(sorted(rows), held, int(late.sum()))


def sessions(events: pa.Table, gap_ms: int = 30 * MINUTE) -> Answer:
    """Per user, runs of timely clicks less than 30 minutes apart (in event time), closed by the watermark:
    start, end (last click + gap), clicks, distinct pages, entry and exit page."""
    frame, late, watermark = _frame(events)
    runs = []
    for user, clicks_of_user in frame[~late].groupby("user"):
        current: list[Any] = []
        for row in clicks_of_user.sort_values(["t", "offset"]).itertuples():
            if current and row.t - current[-1].t >= gap_ms:
                runs.append((user, current))
                current = []
            current.append(row)
        runs.append((user, current))
    rows = sorted(
        (u, c[0].t, c[-1].t + gap_ms, len(c), sorted({r.page for r in c}), c[0].page, c[-1].page)
        for u, c in runs
        if c[-1].t + gap_ms <= watermark
    )
    held = sum(1 for _, c in runs if c[-1].t + gap_ms > watermark)
    return Answer(rows, held, int(late.sum()))


def dedup(events: pa.Table, ttl_ms: int = 24 * 60 * MINUTE) -> Answer:
    """The timely orders whose id was not seen within the TTL before (judged at each event's watermark), as
    (customer, order_id, event time); held: the ids whose TTL outlasts the final watermark."""
    top: int | None = None
    remembered: dict[str, int] = {}
    rows, late = [], 0
    for row in events.to_pylist():
        t = millis(row["at"])
        top = t if top is None else max(top, t)
        watermark = top - LATENESS
        if t < watermark:
            late += 1
            continue
        if remembered.get(row["order_id"], -(2**62)) > watermark:
            continue
        remembered[row["order_id"]] = t + ttl_ms
        rows.append((row["customer"], row["order_id"], t))
    final = (top or 0) - LATENESS
    return Answer(sorted(rows), sum(1 for until in remembered.values() if until > final), late)


def window_row(r: dict[str, Any]) -> tuple[Any, ...]:
    """A windowed-counts output row (as the processor or the table gives it) as `windowed_counts`' tuple."""
    return (r["key"], millis(r["window_start"]), r["views"], r["amount"], list(r["pages"]))


def session_row(r: dict[str, Any]) -> tuple[Any, ...]:
    """A sessions output row as `sessions`' tuple."""
    return (
        r["key"],
        millis(r["session_start"]),
        millis(r["session_end"]),
        r["clicks"],
        list(r["pages"]),
        r["entry_page"],
        r["exit_page"],
    )


def order_row(r: dict[str, Any]) -> tuple[Any, ...]:
    """A deduplicated order as `dedup`'s tuple."""
    return (r["customer"], r["order_id"], millis(r["at"]))
