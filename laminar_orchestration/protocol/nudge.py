"""The advisory wake-ups: "look at your assignment now" and "these partitions' logs grew".

The control plane nudges a node whose assignment it moved; a producer rings the
nodes' source doorbell after an append, with each partition's new log end. A
nudge carries nothing the node acts on without reading the store: it only says
to read now instead of at the next slow poll. It is never needed for safety or
for progress: a node that misses one (its address unreachable, the request lost,
the node busy) converges at its next poll. A node listens on loopback by default
and records its address in its node record (`NodeRecord.nudge_url`).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.keys import MEMBERSHIP_KEY, node_key
from laminar_orchestration.protocol.records import CorruptLedgerObject, MembershipRecord, NodeRecord, now, parse_record
from laminar_orchestration.store import StoreError

log = logging.getLogger(__name__)

#: How long the control plane waits on a node's nudge endpoint before it gives up (advisory only).
NUDGE_TIMEOUT_S = 0.5
NUDGE_PATH = "/nudge"


#: How long a nudge address read from a node record is used before the record is read again.
ADDRESS_TTL_S = 10.0
#: The largest source doorbell body a node reads (a partition's entry is about 20 bytes).
_MAX_BODY = 1 << 20


class NudgeListener:
    """A node's nudge endpoint. Runs on a daemon thread until `close`.

    ``POST /nudge`` with no body sets `event` (look at the assignment now); with a JSON body
    ``{"source": {"<partition>": <log end>, ...}}`` it calls `on_source` with those ends.
    """

    def __init__(
        self,
        event: threading.Event,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        on_source: Callable[[dict[int, int]], None] | None = None,
    ) -> None:
        self.event = event

        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != NUDGE_PATH:
                    self.send_response(404)
                    self.end_headers()
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length == 0:
                    listener.event.set()
                elif length > _MAX_BODY or (ends := _source_ends(self.rfile.read(length))) is None:
                    self.send_response(400)
                    self.end_headers()
                    return
                elif on_source is not None:
                    on_source(ends)
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


def _source_ends(body: bytes) -> dict[int, int] | None:
    """The log ends a doorbell body announces, or None if it is not one."""
    try:
        got = json.loads(body)
        return {int(p): int(end) for p, end in got["source"].items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def send_nudge(url: str, *, timeout_s: float = NUDGE_TIMEOUT_S, body: bytes = b"") -> bool:
    """Ask the node at `url` to look now; False (logged at debug) if it could not be reached.

    `timeout_s` bounds the whole request, from connecting to the status line: an address that
    answers slowly, or one byte at a time, costs the sender no more than that. Only ``http:``
    addresses are nudged (a node listens on plain HTTP); any other, or a malformed one (a node
    record written by hand or by another version), is unreachable too."""
    deadline = time.monotonic() + timeout_s
    try:
        host, port, target = _http_address(url)
        request = (
            f"POST {target} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode("ascii") + body
        with socket.create_connection((host, port), timeout=_left(deadline)) as sock:
            sock.settimeout(_left(deadline))
            sock.sendall(request)
            status = _read_status(sock, deadline)
        return 200 <= status < 300
    except (OSError, ValueError) as exc:
        log.debug("nudge to %s failed: %s (the node converges at its next poll)", url, exc)
        return False


#: The longest status line a nudge reads before it calls the answer malformed.
_MAX_STATUS_LINE = 1024


def _http_address(url: str) -> tuple[str, int, str]:
    """Host, port and request target of an ``http:`` nudge address (ValueError for any other)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not an http address: {url!r}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, parts.port or 80, target


def _left(deadline: float) -> float:
    """Seconds until `deadline`; TimeoutError once it passed (every socket call waits at most this)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("nudge deadline passed")
    return left


def _read_status(sock: socket.socket, deadline: float) -> int:
    """The status code of the answer on `sock`, read before `deadline` (a socket's own timeout is
    per read: a server trickling bytes would hold the sender for ever)."""
    answer = b""
    while b"\r\n" not in answer:
        if len(answer) > _MAX_STATUS_LINE:
            raise ValueError("no status line in the answer")
        sock.settimeout(_left(deadline))
        chunk = sock.recv(256)
        if not chunk:
            raise ConnectionError("the node closed the connection before answering")
        answer += chunk
    fields = answer.split(b"\r\n", 1)[0].split()
    if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
        raise ValueError(f"not an HTTP status line: {answer[:80]!r}")
    return int(fields[1])


def nudge_in_background(urls: list[str]) -> None:
    """Send each nudge from a daemon thread: the control plane never waits on a node's endpoint, and
    each thread ends within `NUDGE_TIMEOUT_S` whatever its address does."""
    for url in urls:
        threading.Thread(target=send_nudge, args=(url,), name="nudge-send", daemon=True).start()


class NudgeAddresses:
    """Nodes' nudge addresses, each read from its node record at most every `ADDRESS_TTL_S`
    (the project's clock, which the simulator drives). A node that restarted on another address
    meanwhile misses its nudges until then and converges at its next poll."""

    def __init__(self, read_node: Callable[[int], NodeRecord | None]) -> None:
        self._read_node = read_node
        self._cached: dict[int, tuple[str | None, datetime]] = {}

    def urls(self, nodes: Iterable[int]) -> list[str]:
        at = now()
        urls = []
        for n in nodes:
            cached = self._cached.get(n)
            if cached is None or (at - cached[1]).total_seconds() > ADDRESS_TTL_S:
                record = self._read_node(n)
                cached = (record.nudge_url if record is not None else None, at)
                self._cached[n] = cached
            if cached[0]:
                urls.append(cached[0])
        return urls


class _EndsQueue:
    """Log ends waiting to be handed on, coalesced per partition (the highest end wins), and the daemon
    thread that hands them to `handle` one batch at a time. `close` hands on what is pending, then stops."""

    def __init__(self, handle: Callable[[dict[int, int]], None], name: str) -> None:
        self._handle = handle
        self._pending: dict[int, int] = {}
        self._lock = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def add(self, ends: Mapping[int, int]) -> None:
        with self._lock:
            for p, end in ends.items():
                self._pending[p] = max(end, self._pending.get(p, 0))
            self._lock.notify()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._lock.wait()
                if not self._pending:
                    return
                ends, self._pending = self._pending, {}
            self._handle(ends)


def _address_sender(url: str) -> _EndsQueue:
    """One node address's doorbell: its rings sent one request at a time, so a slow or bad address
    delays only its own rings."""

    def send(ends: dict[int, int]) -> None:
        send_nudge(url, body=json.dumps({"source": {str(p): end for p, end in ends.items()}}).encode())

    return _EndsQueue(send, "source-doorbell-send")


class SourceDoorbell:
    """A producer's side of the source doorbell: after an append, tell every member node the
    partition's new log end, so the partition's owner reads it at once instead of polling for it.

    Advisory only: the owner reads the segments from the store, and a node that misses a ring
    finds them at its next poll. Rings are coalesced: one background thread hands them to one
    sender per node address, which sends one request at a time carrying every partition rung
    since its last send, so a node that answers slowly (or not at all) costs only its own rings.
    The members and their addresses are read at most every `ADDRESS_TTL_S` (a GET of the
    membership record and one per node record).
    """

    def __init__(self, reads: ReadStore) -> None:
        self._reads = reads
        self._addresses = NudgeAddresses(self._node_record)
        self._members: tuple[tuple[int, ...], datetime] | None = None
        self._senders: dict[str, _EndsQueue] = {}
        self._rings = _EndsQueue(self._hand_out, "source-doorbell")

    def ring(self, ends: Mapping[int, int]) -> None:
        """Announce each partition's new log end (returns at once; sent in the background)."""
        self._rings.add(ends)

    def close(self) -> None:
        """Send what is pending, then stop the senders."""
        self._rings.close()
        self._rings.join(5)
        for sender in self._senders.values():
            sender.close()
        for sender in self._senders.values():
            sender.join(NUDGE_TIMEOUT_S + 1)

    def _node_record(self, node: int) -> NodeRecord | None:
        obj = self._reads.get(node_key(node))
        return None if obj is None else parse_record(obj.key, obj.data, NodeRecord)

    def _member_ids(self) -> tuple[int, ...]:
        at = now()
        if self._members is None or (at - self._members[1]).total_seconds() > ADDRESS_TTL_S:
            obj = self._reads.get(MEMBERSHIP_KEY)
            members = () if obj is None else tuple(parse_record(obj.key, obj.data, MembershipRecord).members)
            self._members = (members, at)
        return self._members[0]

    def _hand_out(self, ends: dict[int, int]) -> None:
        """Give `ends` to the sender of each member's address (a node's earlier address stops)."""
        try:
            urls = self._addresses.urls(self._member_ids())
        except (StoreError, CorruptLedgerObject) as exc:
            log.debug("source doorbell: cannot read the members (%s); the nodes poll instead", exc)
            return
        except Exception:
            # The doorbell is advisory: one bad record or address must not silence it for every node.
            log.exception("source doorbell: a ring was dropped (the nodes poll instead)")
            return
        for url in set(self._senders) - set(urls):
            self._senders.pop(url).close()
        for url in urls:
            sender = self._senders.get(url)
            if sender is None:
                sender = self._senders[url] = _address_sender(url)
            sender.add(ends)
