"""The advisory wake-up: the control plane tells a node "look at your assignment now".

A nudge carries nothing but the wish that the node read its records at once
instead of at its next slow poll. It is never needed for safety or for progress:
a node that misses one (its address unreachable, the request lost, the node
busy) converges at its next poll, and everything it acts on is read from the
store. A node listens on loopback by default and records its address in its
node record (`NodeRecord.nudge_url`).
"""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

#: How long the control plane waits on a node's nudge endpoint before it gives up (advisory only).
NUDGE_TIMEOUT_S = 0.5
NUDGE_PATH = "/nudge"


class NudgeListener:
    """A node's nudge endpoint: ``POST /nudge`` sets `event`. Runs on a daemon thread until `close`."""

    def __init__(self, event: threading.Event, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.event = event

        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != NUDGE_PATH:
                    self.send_response(404)
                    self.end_headers()
                    return
                listener.event.set()
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass  # one line per nudge would drown the node's log

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="nudge", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{NUDGE_PATH}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def send_nudge(url: str, *, timeout_s: float = NUDGE_TIMEOUT_S) -> bool:
    """Ask the node at `url` to look now; False (logged at debug) if it could not be reached."""
    request = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return bool(200 <= response.status < 300)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        log.debug("nudge to %s failed: %s (the node converges at its next poll)", url, exc)
        return False


def nudge_in_background(urls: list[str]) -> None:
    """Send each nudge from a daemon thread: the control plane never waits on a node's endpoint."""
    for url in urls:
        threading.Thread(target=send_nudge, args=(url,), name="nudge-send", daemon=True).start()
