"""Deduplication by event id with a 24-hour time-to-live: each order is emitted once.

Producers that retry send the same order twice; an order id seen within the last 24 hours (of
event time, judged at each event's watermark) is dropped, and ids leave the state 24 hours after
their order, so the state holds a day of ids however long the stream runs::

    laminar init --partitions 4 --schema examples/orders.yaml --processor examples.dedup:processor
"""

from __future__ import annotations

from datetime import timedelta

from laminar_orchestration.processing import Deduplicate

processor = Deduplicate(
    name="unique_orders", id_column="order_id", ttl=timedelta(hours=24), lateness=timedelta(minutes=1)
)
