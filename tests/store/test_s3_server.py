"""The S3-protocol test server every S3 test stands on (`laminar_dev.s3server`): a client that stops in
the middle of a request holds up only its own connection, and moto still sees one request at a time,
so a conditional write stays atomic while many connections are open at once (the racing-writers
contract itself is `tests/store/test_base.py`'s, run against this server).
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from urllib.parse import urlsplit

from laminar_dev.s3server import SerializedApp
from laminar_orchestration.store.s3 import S3ObjectStore


def test_a_client_stopped_mid_request_holds_up_nobody_else(s3_endpoint: str, s3_store: S3ObjectStore) -> None:
    s3_store.put_if_absent("stalled/probe", b"answer")
    url = urlsplit(s3_endpoint)
    # A paused process's request: the headers promise a body, a tenth of it arrives, then nothing.
    stalled = socket.create_connection((url.hostname or "127.0.0.1", url.port or 80))
    try:
        stalled.sendall(
            b"PUT /nobucket/stalled HTTP/1.1\r\nHost: " + url.netloc.encode() + b"\r\n"
            b"Content-Length: 1000\r\n\r\n" + b"x" * 100
        )
        time.sleep(0.2)  # the server has accepted it and waits for the rest
        # While that request is still open, another client is answered (a server that waited for the
        # stalled body would leave this GET to the client's timeouts and retries, and it would fail).
        answer = s3_store.get("stalled/probe").data
        stalled.settimeout(0.1)
        with contextlib.suppress(TimeoutError):
            assert stalled.recv(1) == b"", "the stalled request was answered before its body arrived"
    finally:
        stalled.close()
    assert answer == b"answer"


def test_the_app_behind_the_server_never_runs_two_requests_at_once() -> None:
    inside, most = 0, 0
    count = threading.Lock()

    def app(environ: dict[str, object], start_response: object) -> list[bytes]:
        nonlocal inside, most
        with count:
            inside += 1
            most = max(most, inside)
        time.sleep(0.01)  # a check and a store with a gap between them, as moto's conditional writes
        with count:
            inside -= 1
        start_response("200 OK", [])  # type: ignore[operator]
        return [environ["wsgi.input"].read()]  # type: ignore[attr-defined]

    serialized = SerializedApp(app)
    bodies: list[bytes] = []

    def call(i: int) -> None:
        environ = {"wsgi.input": io.BytesIO(f"body-{i}".encode()), "CONTENT_LENGTH": str(len(f"body-{i}"))}
        bodies.extend(serialized(environ, lambda status, headers, exc_info=None: None))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most == 1, f"{most} requests ran in the app at once"
    assert sorted(bodies) == sorted(f"body-{i}".encode() for i in range(16))
