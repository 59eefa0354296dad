"""The windowed-count example over the source log's default schema (``key``, ``value``, ``ts``).

The benchmark runs ``examples.windowed_counts:processor`` on the clicks schema when the source log
can hold it; until then it runs this processor: the same windows (5-minute tumbling), the same
lateness (1 minute) and the same ``views`` and ``amount`` aggregates, over the same events mapped
to the default schema (``user`` -> ``key``, ``amount`` -> ``value``, ``at`` -> ``ts`` in epoch ms).
Only the example's ``pages`` (a collect_set of the page, a column the default schema lacks) is
left out, on the Spark side too. Nodes load it by name: ``benchmarks.windows_processor:processor``.
"""

from __future__ import annotations

from datetime import timedelta

from laminar_orchestration.processing import Agg, Tumbling, WindowedAggregation

processor = WindowedAggregation(
    name="windowed_counts",
    window=Tumbling(timedelta(minutes=5)),
    lateness=timedelta(minutes=1),
    aggregates=(Agg.count("views"), Agg("amount", "sum", "value")),
)
