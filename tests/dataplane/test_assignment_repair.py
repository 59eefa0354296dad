"""A lost assignment write never strands a move: the driver records a graceful move Active and dies
before the new owner's assignment write; the new owner, holding the epoch at Seeking, reads the
partition's desired state itself once its assignment entry has stopped moving, and processes within
seconds (not at its next full pass, 15 minutes away). The nodes are the real runtime with a pyarrow
fold instead of Spark (`ArrowNode`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from laminar_dev.chaos import ArrowNode
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import run_migration
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.keys import assignment_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.tasks import MigrationPhase
from laminar_orchestration.store import ForwardingStore, ObjectStore

P, N = PartitionId, NodeId


class _WriterDied(BaseException):
    """The driver's process dies (nothing in it catches this)."""


class _DiesBeforeAssignment(ForwardingStore):
    """The driver's store: its write of `node`'s assignment that records the move Active never happens
    (the process died between the desired state's write and that one)."""

    def __init__(self, inner: ObjectStore, node: int) -> None:
        super().__init__(inner)
        self.key = assignment_key(node)
        self.died = threading.Event()

    def _check(self, key: str, data: bytes) -> None:
        if key == self.key and b'"phase":"active"' in data:
            self.died.set()
            raise _WriterDied

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        self._check(key, data)
        return super().put_if_absent(key, data, metadata)

    def put_if_match(self, key: str, data: bytes, etag: str, metadata: Mapping[str, str] | None = None) -> str:
        self._check(key, data)
        return super().put_if_match(key, data, etag, metadata)


@contextmanager
def _running(store: ObjectStore, tmp_path: Path, node_id: int) -> Iterator[ArrowNode]:
    config = NodeConfig(
        store_url=store.url,
        node_id=node_id,
        workdir=str(tmp_path / f"node{node_id}"),
        heartbeat_interval_s=0.5,
        idle_poll_max_s=0.5,
        nudge_host=None,  # no nudge hides the lost write: the node learns through its records only
    )
    node = ArrowNode(config, store=store)
    runner = threading.Thread(target=node.run, kwargs={"install_signals": False}, daemon=True)
    runner.start()
    try:
        yield node
    finally:
        node.stop()
        runner.join(30)
        assert not runner.is_alive()


def _state_of(node: ArrowNode, partition: int) -> str | None:
    report = node._progress().get(partition)
    return None if report is None else report.state


@pytest.mark.slow(seconds=15)
def test_a_move_whose_driver_died_before_the_new_owners_assignment_write_runs_within_seconds(
    store: ObjectStore, tmp_path: Path
) -> None:
    ledger = Ledger(store)
    ledger.init_cluster(1)
    DesiredStates(ledger).update(P(0), lambda s: s.model_copy(update={"owner": 1}))
    ledger.acquire(P(0), N(1), expected_epoch=0, reason="place")
    dying = _DiesBeforeAssignment(store, node=2)
    with _running(store, tmp_path, 1) as one, _running(store, tmp_path, 2) as two:
        deadline = time.monotonic() + 60
        while _state_of(one, 0) != "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state_of(one, 0) == "running"

        with pytest.raises(_WriterDied):
            run_migration(MigrationCoordinator(Ledger(dying)), 0, 2, forced=False)
        assert dying.died.is_set()
        state, _ = DesiredStates(ledger).read(P(0))
        assert state.migration is not None and state.migration.phase == MigrationPhase.ACTIVE
        listed, _ = DesiredStates(ledger).assignment(N(2))
        assert listed is not None and listed.partitions[0] < state.revision  # the write that was lost

        # Well within seconds (the node's full pass is 15 minutes away, and no nudge comes).
        died_at = time.monotonic()
        while _state_of(two, 0) != "running" and time.monotonic() - died_at < 20:
            time.sleep(0.05)
        assert _state_of(two, 0) == "running", two._progress()
        assert ledger.ownership(P(0)) is not None
