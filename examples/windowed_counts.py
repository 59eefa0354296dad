"""Windowed counts per key: 5-minute tumbling windows on the event time, 1 minute of allowed lateness.

Each (key, window) is emitted once, when the watermark (largest event time seen minus one minute)
passes the window's end; a later event for it is counted as late and dropped. The stream is
page views: ``user`` (key), ``page``, ``amount`` and ``at`` (event time)::

    laminar init --partitions 4 --schema examples/clicks.yaml --processor examples.windowed_counts:processor
"""

from __future__ import annotations

from datetime import timedelta

from laminar_orchestration.processing import Agg, Tumbling, WindowedAggregation

processor = WindowedAggregation(
    name="windowed_counts",
    window=Tumbling(timedelta(minutes=5)),
    lateness=timedelta(minutes=1),
    aggregates=(
        Agg.count("views"),
        Agg("amount", "sum", "amount"),
        Agg("pages", "collect_set", "page"),
    ),
)
