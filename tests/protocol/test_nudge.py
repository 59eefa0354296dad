"""The advisory wake-ups: a nudge sets the listener's event, a doorbell hands it the partitions' new log
ends, a request that is neither is refused; a sender never fails on an unreachable node; node addresses
are read at most every `ADDRESS_TTL_S` by the project's clock; a producer's doorbell rings are coalesced
into one request per node carrying each partition's highest end."""

from __future__ import annotations

import contextlib
import functools
import random
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from laminar_dev.sim.clock import SimClock
from laminar_orchestration.clock import use_clock
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.keys import MEMBERSHIP_KEY, node_key
from laminar_orchestration.protocol.nudge import (
    ADDRESS_TTL_S,
    NUDGE_PATH,
    NudgeAddresses,
    NudgeListener,
    SourceDoorbell,
    nudge_in_background,
    send_nudge,
)
from laminar_orchestration.protocol.records import MembershipRecord, NodeRecord, now
from laminar_orchestration.store import LocalObjectStore, StoredObject
from tests.protocol.test_records import node_record


@dataclass
class Heard:
    """What a listener was told: its event, and every doorbell's ends in order."""

    event: threading.Event = field(default_factory=threading.Event)
    ends: list[dict[int, int]] = field(default_factory=list)


@pytest.fixture(scope="module")
def _module_listener() -> Iterator[tuple[NudgeListener, Heard]]:
    # One listener for the module: closing one waits out its server's half-second poll.
    heard = Heard()
    nudges = NudgeListener(heard.event, on_source=heard.ends.append)
    yield nudges, heard
    nudges.close()


@pytest.fixture
def heard(_module_listener: tuple[NudgeListener, Heard]) -> Heard:
    """What the module's listener was told during this test."""
    _, heard = _module_listener
    heard.event.clear()
    heard.ends.clear()
    return heard


@pytest.fixture
def listener(_module_listener: tuple[NudgeListener, Heard], heard: Heard) -> NudgeListener:
    return _module_listener[0]


def _post(url: str, body: bytes = b"") -> int:
    """The HTTP status a POST of `body` to `url` gets."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as refused:
        return refused.code


def test_a_nudge_wakes_the_listener(listener: NudgeListener, heard: Heard) -> None:
    assert listener.url.startswith("http://127.0.0.1:") and listener.url.endswith(NUDGE_PATH)
    assert not heard.event.is_set()
    assert send_nudge(listener.url) is True
    assert heard.event.is_set() and heard.ends == []


def test_a_doorbell_hands_the_listener_each_partitions_log_end(listener: NudgeListener, heard: Heard) -> None:
    assert send_nudge(listener.url, body=b'{"source": {"0": 12, "7": 3}}') is True
    assert heard.ends == [{0: 12, 7: 3}]
    assert not heard.event.is_set()  # the log grew: no reason to read the assignment


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"other": {}}', b'{"source": {"0": "twelve"}}', b'{"source": [1, 2]}', b'{"source": 5}'],
)
def test_a_body_that_is_no_doorbell_is_refused(listener: NudgeListener, heard: Heard, body: bytes) -> None:
    assert _post(listener.url, body) == 400
    assert send_nudge(listener.url, body=body) is False
    assert heard.ends == [] and not heard.event.is_set()


def test_a_request_to_another_path_is_refused(listener: NudgeListener, heard: Heard) -> None:
    assert _post(listener.url.removesuffix(NUDGE_PATH) + "/other") == 404
    assert not heard.event.is_set()


def test_a_nudge_to_an_unreachable_node_fails_quietly_and_one_in_the_background_arrives(
    listener: NudgeListener, heard: Heard
) -> None:
    gone = NudgeListener(threading.Event())
    url = gone.url
    gone.close()
    assert send_nudge(url, timeout_s=1.0) is False  # no exception: the node converges at its next poll
    assert send_nudge("not a url", timeout_s=1.0) is False  # a malformed address in a node record, too
    nudge_in_background([url, listener.url])  # the unreachable one delays nothing
    assert heard.event.wait(10)


def test_node_addresses_are_read_again_only_after_their_time_to_live() -> None:
    records: dict[int, NodeRecord | None] = {1: node_record(1, "http://a/nudge"), 2: node_record(2, None), 3: None}
    reads: list[int] = []

    def read_node(n: int) -> NodeRecord | None:
        reads.append(n)
        return records[n]

    sim = SimClock(random.Random(1))
    with use_clock(sim):
        addresses = NudgeAddresses(read_node)
        # A node without an address, or without a record, is not nudged.
        assert addresses.urls([1, 2, 3]) == ["http://a/nudge"]
        records[1] = node_record(1, "http://b/nudge")  # node 1 restarted on another address
        sim.seconds = ADDRESS_TTL_S
        assert addresses.urls([1, 2, 3]) == ["http://a/nudge"] and reads == [1, 2, 3]
        sim.seconds = ADDRESS_TTL_S + 0.1
        assert addresses.urls([1]) == ["http://b/nudge"] and reads == [1, 2, 3, 1]


class _HeldReads(ReadStore):
    """Reads whose first read of the membership record waits until `resume` is set."""

    def __init__(self, store: LocalObjectStore) -> None:
        super().__init__(store)
        self.reached, self.resume = threading.Event(), threading.Event()

    def get(self, key: str) -> StoredObject | None:
        if key == MEMBERSHIP_KEY and not self.reached.is_set():
            self.reached.set()
            assert self.resume.wait(10)
        return super().get(key)


def test_doorbell_rings_are_coalesced_into_one_request_per_node_with_each_partitions_highest_end(
    local_store: LocalObjectStore,
) -> None:
    told = [Heard(), Heard()]
    listeners = [NudgeListener(h.event, on_source=h.ends.append) for h in told]
    try:
        local_store.put_if_absent(
            MEMBERSHIP_KEY,
            MembershipRecord(cluster_epoch=1, members=[1, 2], reason="", updated_at=now()).model_dump_json().encode(),
        )
        for n, nudges in enumerate(listeners, start=1):
            local_store.put_if_absent(node_key(n), node_record(n, nudges.url).model_dump_json().encode())
        reads = _HeldReads(local_store)
        doorbell = SourceDoorbell(reads)
        doorbell.ring({0: 3})
        assert reads.reached.wait(10)  # the sender holds the first ring, looking up the members
        for ends in ({0: 9}, {1: 7}, {0: 5}):  # rung meanwhile: they go out together
            doorbell.ring(ends)
        reads.resume.set()
        doorbell.close()  # sends what is pending first
    finally:
        for nudges in listeners:
            nudges.close()
    for h in told:
        # The first ring, then the three rung meanwhile (each node's sender may coalesce those too).
        assert h.ends in ([{0: 3}, {0: 9, 1: 7}], [{0: 9, 1: 7}])
        assert not h.event.is_set()


def _heard_end(heard: Heard, end: int) -> bool:
    return any(e.get(0) == end for e in heard.ends)


class _TricklingServer:
    """A loopback server that accepts, then answers one byte every 0.3 s for as long as it runs: an
    address that never finishes an answer but never times out a read either."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}{NUDGE_PATH}"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while not self._stop.wait(0.3):
                conn.sendall(b"H")

    def close(self) -> None:
        self._stop.set()
        self._socket.close()


@pytest.fixture
def trickling() -> Iterator[_TricklingServer]:
    server = _TricklingServer()
    yield server
    server.close()


def test_a_nudge_to_a_trickling_address_ends_within_its_deadline(trickling: _TricklingServer) -> None:
    results: list[bool] = []
    sender = threading.Thread(target=lambda: results.append(send_nudge(trickling.url, timeout_s=0.5)), daemon=True)
    sender.start()
    sender.join(5)  # a per-read timeout never fires: the server sends a byte every 0.3 s for ever
    assert not sender.is_alive() and results == [False]


@pytest.mark.parametrize("url", ["file:///etc/hostname", "ftp://127.0.0.1/nudge", "http:///nudge", "http://[::1"])
def test_a_nudge_to_an_address_that_is_no_http_address_fails_quietly(url: str) -> None:
    assert send_nudge(url, timeout_s=1.0) is False


def test_bad_addresses_cost_only_their_own_rings_and_other_nodes_keep_hearing_the_doorbell(
    local_store: LocalObjectStore, trickling: _TricklingServer
) -> None:
    """Members whose records name a `file:` address and a server that trickles its answer come
    first; the node after them hears every ring, each within a bound."""
    good = Heard()
    heard_ends = threading.Condition()

    def on_source(ends: dict[int, int]) -> None:
        with heard_ends:
            good.ends.append(ends)
            heard_ends.notify_all()

    listener = NudgeListener(good.event, on_source=on_source)
    urls = {1: "file:///etc/hostname", 2: trickling.url, 3: listener.url}
    doorbell: SourceDoorbell | None = None
    try:
        members = MembershipRecord(cluster_epoch=1, members=[1, 2, 3], reason="", updated_at=now())
        local_store.put_if_absent(MEMBERSHIP_KEY, members.model_dump_json().encode())
        for n, url in urls.items():
            local_store.put_if_absent(node_key(n), node_record(n, url).model_dump_json().encode())
        doorbell = SourceDoorbell(ReadStore(local_store))
        for end in range(1, 6):
            doorbell.ring({0: end})
            with heard_ends:
                # Each ring reaches the good node long before a trickle of this length would end.
                reached = heard_ends.wait_for(functools.partial(_heard_end, good, end), timeout=3)
                assert reached, f"ring {end} never reached the node: {good.ends}"
    finally:
        if doorbell is not None:
            doorbell.close()
        listener.close()
