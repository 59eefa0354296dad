"""The health paths served beside /metrics: readiness and liveness answered from a callback."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry

from laminar_orchestration.metrics import Health, serve_metrics


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def test_healthz_and_livez_follow_the_callback_and_metrics_stay_served() -> None:
    state = Health(ready=False, live=True, detail="not registered yet")
    server = serve_metrics(0, registry=CollectorRegistry(), health=lambda: state)
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert _get(f"{base}/healthz") == (503, "not ready: not registered yet\n")
        assert _get(f"{base}/livez")[0] == 200
        state = Health(ready=True, live=True, detail="node 1 generation 1")
        assert _get(f"{base}/healthz") == (200, "ok: node 1 generation 1\n")
        assert _get(f"{base}/readyz")[0] == 200
        state = Health(ready=False, live=False, detail="stuck")
        assert _get(f"{base}/livez")[0] == 503
        assert _get(f"{base}/metrics")[0] == 200
    finally:
        server.close()


def test_a_failing_check_is_unhealthy_not_an_error() -> None:
    def broken() -> Health:
        raise RuntimeError("boom")

    server = serve_metrics(0, registry=CollectorRegistry(), health=broken)
    try:
        status, body = _get(f"http://127.0.0.1:{server.port}/healthz")
        assert status == 503 and "RuntimeError: boom" in body
    finally:
        server.close()
