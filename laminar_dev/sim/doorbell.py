"""The doorbell scenario: a producer's source doorbell among member nodes some of whose addresses are bad.

A seed decides the members and what each address is: a node listening as a real one does, a
``file:`` address, a server that trickles its answer one byte every 0.3 s, a port that refuses
connections, or a server that answers something that is no HTTP. The producer rings a few times;
every listening node must hear every ring within `RING_BOUND_S`, whatever the other addresses do.
Real threads and loopback sockets: the seed decides the shape, not the timing.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import random
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from laminar_orchestration.protocol import nudge as nudge_module
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.keys import MEMBERSHIP_KEY, node_key
from laminar_orchestration.protocol.nudge import NudgeListener
from laminar_orchestration.protocol.records import MembershipRecord, NodeRecord, NodeStatus, now
from laminar_orchestration.store import ObjectStore

from .reverts import Knobs, reverted
from .store import MemoryObjectStore

#: How long a listening node may wait for a ring (the nudge's own deadline is half a second).
RING_BOUND_S = 3.0
RINGS = 4


class Address(enum.Enum):
    """What a member's recorded nudge address is."""

    LISTENING = "listening"
    FILE = "file"
    TRICKLING = "trickling"
    REFUSING = "refusing"
    GARBAGE = "garbage"


@dataclass(frozen=True)
class DoorbellResult:
    """The members' addresses in membership order, and the rings a listening node did not hear in time."""

    seed: int
    addresses: tuple[Address, ...]
    #: (member's position, the log end rung) of every ring a listening member missed.
    missed: tuple[tuple[int, int], ...]

    @property
    def ok(self) -> bool:
        return not self.missed


class _Server:
    """A loopback server that answers every connection with `answer` (b"" trickles one byte every 0.3 s)."""

    def __init__(self, answer: bytes) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}/nudge"
        self._answer = answer
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            if self._answer:
                conn.recv(4096)
                conn.sendall(self._answer)
                return
            while not self._stop.wait(0.3):
                conn.sendall(b"H")

    def close(self) -> None:
        self._stop.set()
        self._socket.close()


def _heard(ends: list[int], rung: dict[int, int]) -> None:
    ends.append(rung.get(0, 0))


def _refused_url() -> str:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return f"http://127.0.0.1:{s.getsockname()[1]}/nudge"


@contextlib.contextmanager
def _members(store: ObjectStore, addresses: tuple[Address, ...]) -> Iterator[list[list[int] | None]]:
    """Record the members and their addresses; yields, per member, the ends it heard (None: not listening)."""
    heard: list[list[int] | None] = []
    closers: list[NudgeListener | _Server] = []
    try:
        for n, kind in enumerate(addresses, start=1):
            url: str
            if kind == Address.LISTENING:
                ends: list[int] = []
                listener = NudgeListener(threading.Event(), on_source=functools.partial(_heard, ends))
                closers.append(listener)
                heard.append(ends)
                url = listener.url
            else:
                heard.append(None)
                if kind == Address.FILE:
                    url = "file:///etc/hostname"
                elif kind == Address.REFUSING:
                    url = _refused_url()
                else:
                    server = _Server(b"" if kind == Address.TRICKLING else b"SSH-2.0-not-http\r\n")
                    closers.append(server)
                    url = server.url
            at = now()
            record = NodeRecord(
                node=n, generation=1, status=NodeStatus.ALIVE, host="sim", pid=1, started_at=at, heartbeat_at=at,
                heartbeat_timeout_s=10.0, nudge_url=url,
            )  # fmt: skip
            store.put_if_absent(node_key(n), record.model_dump_json().encode())
        members = MembershipRecord(
            cluster_epoch=1, members=list(range(1, len(addresses) + 1)), reason="", updated_at=now()
        )
        store.put_if_absent(MEMBERSHIP_KEY, members.model_dump_json().encode())
        yield heard
    finally:
        for closer in closers:
            closer.close()


def run_doorbell_scenario(seed: int, knobs: Knobs | None = None) -> DoorbellResult:
    """Ring a doorbell among the members `seed` shapes (with the fixes `knobs` revert put back)."""
    rng = random.Random(seed)
    kinds = list(Address)
    addresses = tuple(rng.choice(kinds) for _ in range(rng.randint(2, 5)))
    if Address.LISTENING not in addresses:
        addresses = (*addresses, Address.LISTENING)
    missed: list[tuple[int, int]] = []
    store = MemoryObjectStore()
    with reverted(knobs or Knobs()), _members(store, addresses) as heard:
        doorbell = nudge_module.SourceDoorbell(ReadStore(store))
        try:
            for end in range(1, RINGS + 1):
                doorbell.ring({0: end})
                for i, ends in enumerate(heard):
                    if ends is not None and not _wait_for(ends, end):
                        missed.append((i, end))
                if missed:
                    break
        finally:
            doorbell.close()
    return DoorbellResult(seed, addresses, tuple(missed))


def _wait_for(ends: list[int], end: int) -> bool:
    """Whether `end` reaches `ends` within `RING_BOUND_S` (polled: the listener appends from its own thread)."""
    done = threading.Event()
    for _ in range(int(RING_BOUND_S / 0.01)):
        if end in ends:
            return True
        done.wait(0.01)
    return end in ends
