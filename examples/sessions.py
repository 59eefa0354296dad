"""Sessionization of click events: a user's clicks less than 30 minutes apart form one session.

A session is emitted once the watermark (largest event time seen minus one minute) passes its
last click plus 30 minutes, with its clicks, the distinct pages (a list), and the entry and
exit pages (strings); the state holds each user's open sessions and nothing after they close::

    laminar init --partitions 4 --schema examples/clicks.yaml --processor examples.sessions:processor
"""

from __future__ import annotations

from datetime import timedelta

from laminar_orchestration.processing import Agg, SessionWindows

processor = SessionWindows(
    name="sessions",
    gap=timedelta(minutes=30),
    lateness=timedelta(minutes=1),
    aggregates=(
        Agg.count("clicks"),
        Agg("pages", "collect_set", "page"),
        Agg("entry_page", "first", "page"),
        Agg("exit_page", "last", "page"),
    ),
)
