"""The S3-protocol test server every S3 test stands on (`laminar_dev.s3server` on `laminar_dev.wsgi_loop`): a
client that stops in the middle of a request holds up only its own connection, and moto sees one request at a time,
so a conditional write stays atomic while many connections are open at once (the racing-writers
contract itself is `tests/store/test_base.py`'s, run against this server).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import pytest

from laminar_dev.wsgi_loop import WsgiLoopServer
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


def test_the_app_behind_the_server_never_runs_two_requests_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    inside, most = 0, 0
    count = threading.Lock()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        nonlocal inside, most
        with count:
            inside += 1
            most = max(most, inside)
        time.sleep(0.01)  # a check and a store with a gap between them, as moto's conditional writes
        with count:
            inside -= 1
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return [environ["wsgi.input"].read()]

    server = WsgiLoopServer(app, "127.0.0.1", 0, idle_timeout_s=5)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.port}/echo"

    def call(i: int) -> bytes:
        body = f"body-{i}".encode()
        if i % 2:  # chunked, as a streamed upload sends it
            request = urllib.request.Request(url, data=iter([body[:3], body[3:]]), method="PUT")
            request.add_header("Transfer-Encoding", "chunked")
        else:
            request = urllib.request.Request(url, data=body, method="PUT")
        with urllib.request.urlopen(request, timeout=30) as response:
            answer: bytes = response.read()
            return answer

    with ThreadPoolExecutor(16) as pool:
        bodies = list(pool.map(call, range(32)))
    assert most == 1, f"{most} requests ran in the app at once"
    assert bodies == [f"body-{i}".encode() for i in range(32)]
    # A line a request in the log, as the cost benchmarks count billed requests from it.
    assert capsys.readouterr().err.count('"PUT /echo HTTP/1.1" 200 -') == 32


def test_metadata_names_with_underscores_come_back_as_written(s3_client: Any, s3_bucket: str) -> None:
    # WSGI's HTTP_* keys cannot tell `a_b` from `a-b`: the server passes such S3 metadata names as sent.
    s3_client.put_object(Bucket=s3_bucket, Key="meta/object", Body=b"x", Metadata={"written_by": "node-1"})
    head = s3_client.head_object(Bucket=s3_bucket, Key="meta/object")
    assert head["Metadata"] == {"written_by": "node-1"}
