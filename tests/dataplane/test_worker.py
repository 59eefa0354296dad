"""A segment the node cannot decode (a key that is not UTF-8, written around `SourceLog.append`), or a
processor whose code raises, fails its partition once, for good, with the reason in the node's report,
`laminar status` and the ownership map; the partition is not restarted in a loop and nothing of the
batch is committed or skipped.

The node is the real runtime with a pyarrow fold instead of Spark (`ArrowNode`).
"""

from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path

import pyarrow as pa

from laminar_dev.chaos import ArrowBatchEngine, ArrowNode
from laminar_orchestration.cli.output import ConsoleOutput
from laminar_orchestration.control.ownership import ownership_health, ownership_rows
from laminar_orchestration.control.snapshot import snapshot_cluster
from laminar_orchestration.dataplane.worker import PartitionWorker
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.processing.keyed import keyed_aggregation
from laminar_orchestration.protocol.keys import segment_key
from laminar_orchestration.protocol.segments import encode_segment
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore
from tests.dataplane.plane import running
from tests.ledgers import new_ledger, place_on_node_1
from tests.nodes import quick_node_config

P, N = PartitionId, NodeId


class CountingNode(ArrowNode):
    """Counts the partition workers it starts: the first start and every restart."""

    starts = 0

    def _start(self, worker: PartitionWorker) -> None:
        self.starts += 1
        super()._start(worker)


def _poison_segment(store: ObjectStore, partition: int, start: int) -> None:
    """A segment at `start` whose second key is not UTF-8, stored as a writer bypassing `append` would."""
    keys = pa.array([b"d", b"\xff\xfe"], pa.binary()).cast(pa.string(), safe=False)
    table = pa.table({"key": keys, "value": [4.0, 5.0], "ts": pa.array([4, 5], pa.int64())})
    store.put_if_absent(segment_key(partition, start), encode_segment(partition, start, table))


def test_an_undecodable_segment_fails_its_partition_once_and_is_reported(store: ObjectStore, tmp_path: Path) -> None:
    ledger = new_ledger(store, 1)
    log = SourceLog(store, partitions=1)
    log.append(0, pa.table({"key": ["a", "b", "c"], "value": [1.0, 2.0, 3.0]}))
    _poison_segment(store, 0, 3)
    assert log.roll_forward(0) == 5
    place_on_node_1(ledger)
    node = CountingNode(
        quick_node_config(
            store,
            tmp_path,
            # One segment per batch: the good segment commits, then the poison one is met on its own.
            batch_max_events=3,
            # A restart loop would restart the partition a dozen times in the second watched below.
            restart_backoff_initial_s=0.05,
            restart_backoff_max_s=0.1,
        ),
        store=store,
    )
    with running(node):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            progress = node._progress().get(0)
            if progress is not None and progress.consecutive_failures:
                break
            time.sleep(0.02)
        time.sleep(1.2)
        progress = node._progress().get(0)
        reported = ledger.members.node(N(1))
        status = snapshot_cluster(ledger)
    assert node.starts == 1  # never restarted
    assert progress is not None and progress.state == "failed"
    assert (progress.consecutive_failures, progress.retry_delay_s) == (1, None)
    row = status.partitions[0]
    assert row.failures == 1
    # Nothing skipped: the good segment is committed, the partition stops at the poison segment's start.
    assert (row.committed_offset, row.log_end) == (3, 5)
    assert reported is not None
    printed = io.StringIO()
    ConsoleOutput(printed).status(status)
    json_reason = status.to_json()["partitions"][0]["last_failure"]
    for reason in (progress.last_failure, reported.partitions[0].last_failure, row.last_failure, json_reason):
        assert reason is not None
        assert reason.startswith("UndecodableSegment: undecodable source segment")
        assert segment_key(0, 3) in reason and "event at offset 4" in reason and "not valid UTF-8" in reason
        assert "not restarted" in reason
    assert segment_key(0, 3) in printed.getvalue()


def test_a_worker_starting_from_a_fresh_seal_alone_does_not_probe_its_log_as_a_busy_one(
    store: ObjectStore, tmp_path: Path
) -> None:
    """A seal is no batch: a partition whose chain holds only the seal its grant just wrote (a
    placement, a failover of an idle partition) is not busy, so its empty first read is followed by
    no probes of the log (at a failover of 100 idle partitions, 600 reads on a loaded store)."""
    ledger = new_ledger(store, 1)
    place_on_node_1(ledger)  # the grant seals the chain at epoch 1: a manifest written moments ago
    node = ArrowNode(quick_node_config(store, tmp_path), store=store)
    with running(node):
        deadline = time.monotonic() + 30
        while (worker := node.workers.get(P(0))) is None or worker.log_watch.read_at == 0.0:
            assert time.monotonic() < deadline, "the worker never read its log"
            time.sleep(0.02)
        assert worker.log_watch.probe_s == float("inf"), worker.log_watch


def _explode(batch: pa.Table, previous: pa.Table) -> pa.Table:
    raise ZeroDivisionError("the user's merge divided by zero")


class ExplodingNode(CountingNode):
    """The default aggregate, and a merge of the user's that raises on every batch."""

    def start_spark(self) -> None:
        super().start_spark()
        engine = self.engine
        assert isinstance(engine, ArrowBatchEngine)
        engine.processor = dataclasses.replace(keyed_aggregation, name="exploding", merge=_explode)


def test_a_processor_raising_fails_its_partition_once_commits_nothing_and_says_so(
    store: ObjectStore, tmp_path: Path
) -> None:
    ledger = new_ledger(store, 1)
    log = SourceLog(store, partitions=1)
    log.append(0, pa.table({"key": ["a", "b", "c"], "value": [1.0, 2.0, 3.0]}))
    place_on_node_1(ledger)
    node = ExplodingNode(
        quick_node_config(store, tmp_path, restart_backoff_initial_s=0.05, restart_backoff_max_s=0.1), store=store
    )
    with running(node):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            progress = node._progress().get(0)
            if progress is not None and progress.consecutive_failures:
                break
            time.sleep(0.02)
        time.sleep(1.2)  # a restart loop would restart it a dozen times meanwhile
        progress = node._progress().get(0)
        status = snapshot_cluster(ledger)
        rows = ownership_rows(ledger)
    assert node.starts == 1
    assert progress is not None and progress.state == "failed"
    assert (progress.consecutive_failures, progress.retry_delay_s) == (1, None)
    row = status.partitions[0]
    assert (row.committed_offset, row.log_end) == (0, 3)  # nothing of the batch committed
    assert row.last_failure is not None
    assert row.last_failure.startswith("ProcessorFailed: processor 'exploding' raised on the batch at offset 0")
    assert "ZeroDivisionError: the user's merge divided by zero" in row.last_failure
    # The ownership map (the Dagster asset's rows) says it too.
    health = ownership_health(rows[0])
    assert health.startswith("failed: ProcessorFailed") and "not restarted" in health
