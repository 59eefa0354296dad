"""One event loop serving a WSGI app over HTTP/1.1: socket I/O for many connections, the app one request at a time.

The S3-protocol test server (`laminar_dev.s3server`) needs both: the emulated store checks a
conditional write and then stores the object as two Python steps, so two requests must never be
inside it at once; and a client that stops in the middle of a request (a paused zombie process, a
slow upload) must hold up only its own connection. Here every connection is a coroutine that reads
its whole request without blocking anyone, and the app is then called on the loop's thread itself,
so no two calls can overlap and no lock or thread hand-off is paid per request. A thread per
connection (werkzeug's threaded server) cost about as much CPU again as the emulation itself.

What it speaks is what S3 clients send: HTTP/1.1 with keep-alive, `Content-Length` or chunked bodies,
`Expect: 100-continue`. No TLS, no pipelining beyond answering requests in order. Each request is
logged on stderr in werkzeug's format (the cost benchmarks count requests from that log).
"""

from __future__ import annotations

import asyncio
import io
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["RAW_HEADERS_KEY", "WsgiLoopServer"]

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

#: The environ key holding the request's header lines as sent (name, value), names unfolded: WSGI's
#: HTTP_* keys cannot keep a name's underscores apart from its dashes.
RAW_HEADERS_KEY = "laminar.raw_headers"

#: A request's line and headers together may not exceed this.
MAX_HEAD_BYTES = 64 * 1024

_NO_BODY_STATUSES = frozenset({204, 304})


class _BadRequest(Exception):
    """A request this server cannot parse; answered 400 and the connection closed."""


@dataclass(frozen=True)
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name]
        return ",".join(values) if values else None

    @property
    def keep_alive(self) -> bool:
        connection = (self.header("connection") or "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


def _parse_head(head: bytes) -> _Request:
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise _BadRequest(f"request line {lines[0][:80]!r}") from None
    if not version.startswith("HTTP/1."):
        raise _BadRequest(f"protocol {version[:20]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _BadRequest(f"header line {line[:80]!r}")
        headers.append((name, value.strip()))
    return _Request(method, target, version, headers)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise _BadRequest(f"chunk size {size_line[:40]!r}") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailer fields: nothing here needs them
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise _BadRequest("a chunk runs past its size")


def _wsgi_str(value: str) -> str:
    """WSGI's native strings: the UTF-8 bytes of the request, read as latin-1."""
    return value.encode("utf-8", "surrogateescape").decode("latin-1")


class WsgiLoopServer:
    """Serve `app` on `host`:`port` (0: a free port) from one asyncio loop; `serve_forever` blocks.

    `idle_timeout_s`: a connection that sends nothing for this long, between requests or in the
    middle of one, is closed.
    """

    def __init__(self, app: WsgiApp, host: str, port: int, *, idle_timeout_s: float) -> None:
        self.app = app
        self.idle_timeout_s = idle_timeout_s
        self.socket = socket.create_server((host, port))
        self.host, self.port = self.socket.getsockname()[:2]

    def serve_forever(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._connection, sock=self.socket, limit=MAX_HEAD_BYTES)
        async with server:
            await server.serve_forever()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("127.0.0.1", 0)
        try:
            while True:
                try:
                    async with asyncio.timeout(self.idle_timeout_s):
                        request = _parse_head(await reader.readuntil(b"\r\n\r\n"))
                        if (request.header("expect") or "").lower() == "100-continue":
                            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                        body = await self._read_body(reader, request)
                except _BadRequest as exc:
                    writer.write(_response(400, [("Content-Type", "text/plain")], str(exc).encode(), close=True))
                    await writer.drain()
                    return
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
                    return  # the client went away, stalled past the timeout, or sent an oversized head
                # The app runs here, on the loop's thread: no other request is inside it meanwhile.
                status, headers, payload = self._call(self._environ(request, body, peer))
                headers = [(k, v) for k, v in headers if k.lower() != "transfer-encoding"]  # sent whole
                code = int(status.split(" ", 1)[0])
                if request.method == "HEAD" or code in _NO_BODY_STATUSES:
                    payload = b""
                # Logged before the answer leaves: whoever has the answer finds the request counted.
                _log_request(peer, request, code)
                writer.write(_response(status, headers, payload, close=not request.keep_alive))
                await writer.drain()
                if not request.keep_alive:
                    return
        except ConnectionError:
            return
        finally:
            writer.close()

    async def _read_body(self, reader: asyncio.StreamReader, request: _Request) -> bytes:
        if "chunked" in (request.header("transfer-encoding") or "").lower():
            return await _read_chunked(reader)
        length = request.header("content-length")
        try:
            size = int(length) if length else 0
        except ValueError:
            raise _BadRequest(f"Content-Length {str(length)[:20]!r}") from None
        return await reader.readexactly(size) if size > 0 else b""

    def _environ(self, request: _Request, body: bytes, peer: tuple[Any, ...]) -> dict[str, Any]:
        url = urlsplit(request.target)
        environ: dict[str, Any] = {
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": False,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
            "SERVER_SOFTWARE": "laminar-wsgi-loop",
            "REQUEST_METHOD": request.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": _wsgi_str(unquote(url.path)),
            "QUERY_STRING": _wsgi_str(url.query),
            "REQUEST_URI": _wsgi_str(request.target),
            "RAW_URI": _wsgi_str(request.target),
            "REMOTE_ADDR": str(peer[0]),
            "REMOTE_PORT": int(peer[1]),
            "SERVER_NAME": str(self.host),
            "SERVER_PORT": str(self.port),
            "SERVER_PROTOCOL": request.version,
            RAW_HEADERS_KEY: request.headers,
        }
        for name, value in request.headers:
            if "_" in name:
                continue  # as werkzeug: X_Foo must not pass for X-Foo (RAW_HEADERS_KEY keeps it)
            key = name.upper().replace("-", "_")
            if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                key = "HTTP_" + key
                if key in environ:
                    value = f"{environ[key]},{value}"
            environ[key] = value
        if "HTTP_TRANSFER_ENCODING" in environ:
            environ["wsgi.input_terminated"] = True  # the body is whole: read to its end
        return environ

    def _call(self, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
        started: list[tuple[str, list[tuple[str, str]]]] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., None]:
            started[:] = [(status, list(headers))]
            return lambda data: None  # the legacy write(): nothing here uses it

        try:
            result = self.app(environ, start_response)
            try:
                payload = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        except Exception:
            text = traceback.format_exc()
            print(text, file=sys.stderr, flush=True)
            return "500 Internal Server Error", [("Content-Type", "text/plain")], text.encode()
        status, headers = started[0]
        return status, headers, payload


def _log_request(peer: tuple[Any, ...], request: _Request, code: int) -> None:
    """One line a request on stderr, as werkzeug's server writes it: the benchmarks count requests from it."""
    when = time.strftime("%d/%b/%Y %H:%M:%S")
    sys.stderr.write(f'{peer[0]} - - [{when}] "{request.method} {request.target} {request.version}" {code} -\n')


def _response(status: str | int, headers: list[tuple[str, str]], payload: bytes, *, close: bool) -> bytes:
    if isinstance(status, int):
        status = f"{status} {HTTPStatus(status).phrase}"
    names = {k.lower() for k, _ in headers}
    lines = [f"HTTP/1.1 {status}"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() != "connection"]
    if "date" not in names:
        lines.append("Date: " + formatdate(usegmt=True))
    if "content-length" not in names:  # a HEAD answer keeps the length the app gave it
        lines.append(f"Content-Length: {len(payload)}")
    lines.append("Connection: close" if close else "Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload
