"""The control plane's Prometheus metrics, served by the code location when ``LAMINAR_METRICS_PORT`` is set.

Several processes load the code location (the webserver's and the daemon's code
servers, the run launcher's pool); the first to bind the port serves it, and
the others go on without it. Every one of them would serve the same figures:
they are read from the ledger at each scrape (`ops.ledger_metrics`), not
counted where a move runs.
"""

import logging
import os

from laminar_orchestration.metrics import MetricsPortUnavailable, MetricsServer
from laminar_orchestration.ops.ledger_metrics import serve_control_plane_metrics
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store.metering import PROCESS_METER

log = logging.getLogger("laminar.metrics")

PORT_ENV = "LAMINAR_METRICS_PORT"
HOST_ENV = "LAMINAR_METRICS_HOST"

_served: MetricsServer | None = None


def start_control_plane_metrics() -> MetricsServer | None:
    """Serve /metrics on ``$LAMINAR_METRICS_PORT`` once per process; None when unset or served elsewhere."""
    global _served
    raw = os.environ.get(PORT_ENV, "").strip()
    if _served is not None or not raw:
        return _served
    try:
        port = int(raw)
    except ValueError:
        log.warning("%s=%r is not a port number: no control-plane metrics", PORT_ENV, raw)
        return None
    host = os.environ.get(HOST_ENV, "").strip() or "127.0.0.1"
    # The store is opened at the first scrape, not while Dagster loads the definitions.
    from resources import laminar_resource_from_env

    resource = laminar_resource_from_env()
    ledger: list[Ledger] = []

    def open_ledger() -> Ledger:
        if not ledger:
            ledger.append(Ledger(resource.store()))
        return ledger[0]

    try:
        _served = serve_control_plane_metrics(
            port, open_ledger, lambda: dict(PROCESS_METER.snapshot().by_method), host=host
        )
    except MetricsPortUnavailable as exc:
        log.debug("control-plane metrics served by another process of the code location: %s", exc)
        return None
    return _served
