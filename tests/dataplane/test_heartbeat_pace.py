"""A node's heartbeats keep their interval on a slow store: the interval counts from the start of a
write, so beats are `heartbeat_interval_s` apart however long each write takes (up to the interval),
not interval + write time. The node is the real runtime with a pyarrow fold instead of Spark."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from laminar_dev.chaos import ArrowNode
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.protocol.keys import node_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import ForwardingStore, ObjectStore

INTERVAL_S = 1.0
WRITE_S = 0.9  # each heartbeat write takes nearly the interval


class _SlowNodeRecord(ForwardingStore):
    """A store on which every write of one node's record takes `WRITE_S`; when each one started."""

    def __init__(self, inner: ObjectStore, node: int) -> None:
        super().__init__(inner)
        self.key = node_key(node)
        self.started: list[float] = []

    def put_if_match(self, key: str, data: bytes, etag: str, metadata: Mapping[str, str] | None = None) -> str:
        if key.endswith(self.key):
            self.started.append(time.monotonic())
            time.sleep(WRITE_S)
        return super().put_if_match(key, data, etag, metadata)


@pytest.mark.slow(seconds=10)
def test_heartbeats_keep_their_interval_when_each_write_is_slow(local_store: ObjectStore, tmp_path: Path) -> None:
    Ledger(local_store).init_cluster(1)
    store = _SlowNodeRecord(local_store, 1)
    config = NodeConfig(
        store_url=local_store.url,
        node_id=1,
        workdir=str(tmp_path / "node1"),
        heartbeat_interval_s=INTERVAL_S,
        heartbeat_timeout_s=6.0,
        nudge_host=None,
    )
    node = ArrowNode(config, store=store)
    runner = threading.Thread(target=node.run, kwargs={"install_signals": False}, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while len(store.started) < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        node.stop()
        runner.join(30)
    assert not runner.is_alive()
    gaps = [b - a for a, b in zip(store.started[1:-1], store.started[2:], strict=False)]
    assert len(gaps) >= 3, store.started
    # Counted from the end of each write, the beats would be INTERVAL_S + WRITE_S = 1.9 s apart.
    assert statistics.median(gaps) < INTERVAL_S + WRITE_S / 2, gaps
