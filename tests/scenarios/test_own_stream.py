"""Each example stream as a user runs it: `laminar init` with the example's schema and processor, two
Spark nodes, `laminar produce` of Parquet files, a graceful move mid-stream, a paused owner failed over
and resumed (a zombie), and a kill -9 of an owner followed by `laminar failover` - on the local store
and on the S3-protocol server. The output table, read with `deltalake` alone, must equal the example's
answer computed independently over the produced events (tests/processing/streams.py: per partition in
log order, the same lateness rule), each row exactly once; and the committed state `laminar query`
reads must hold only what is still open (closed windows and sessions evicted, expired ids gone).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from laminar_dev.localcluster import stop_processes
from laminar_orchestration.control.snapshot import ClusterSnapshot, snapshot_cluster
from laminar_orchestration.dataplane.checkpoint import download_snapshot
from laminar_orchestration.dataplane.folding import resolve_logic
from laminar_orchestration.dataplane.statestore import PartitionStateStore
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.processing.schema import StreamSchema
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.source_events import route
from laminar_orchestration.store import ObjectStore, open_store
from laminar_orchestration.table import table_location, table_status
from tests.processing import streams

pytestmark = [pytest.mark.spark, pytest.mark.processes, pytest.mark.slow(seconds=240)]

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 2


class User:
    """A shell at the repo root with LAMINAR_STORE set: commands, and the nodes in the background."""

    def __init__(self, store_url: str, logs: Path) -> None:
        self.env = {**os.environ, "LAMINAR_STORE": store_url}
        self.ledger = Ledger(open_store(store_url))
        self.logs = logs
        self.nodes: dict[int, subprocess.Popen[bytes]] = {}

    def run(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "laminar_orchestration.cli", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, f"laminar {' '.join(args)}: {done.stderr}\n{self.tails()}"
        return done.stdout

    def start_node(self, node: int) -> None:
        # No background warm-up batches: six JVMs warming at once on two cores would starve the scenario's
        # own batches, and a batch's latency is not what it checks (the warm-up has tests of its own).
        with open(self.logs / f"node{node}.log", "wb") as log:
            self.nodes[node] = subprocess.Popen(
                [sys.executable, "-m", "laminar_orchestration.cli", "node", "run", "--node-id", str(node),
                 "--spark-master", "local[1]", "--heartbeat-timeout", "4", "--table-sync-interval", "1",
                 "--spark-warm-up-batches", "0", "--checkpoint-every-batches", "3"],
                cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def status(self) -> ClusterSnapshot:
        # What `laminar status --detail` shows, read in this process: three clusters polled side by side.
        return snapshot_cluster(self.ledger)

    def wait(self, what: str, done: Callable[[ClusterSnapshot], bool], timeout_s: float = 240) -> ClusterSnapshot:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            if done(status):
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not reached in {timeout_s} s: {status}\n{self.tails()}")
            time.sleep(0.5)

    def alive(self, status: ClusterSnapshot) -> set[int]:
        return {n.node for n in status.nodes if n.alive}

    def caught_up(self, owners: set[int]) -> ClusterSnapshot:
        return self.wait(
            f"every partition active on {owners} and caught up",
            lambda s: all(p.owner in owners and p.status == "active" and p.lag == 0 for p in s.partitions),
        )

    def produce(self, events: pa.Table, name: str) -> None:
        path = self.logs / f"{name}.parquet"
        pq.write_table(events.drop_columns(["offset"]), path)
        self.run("produce", "--from-file", str(path))

    def tails(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.logs.glob("node*.log")))


@dataclass(frozen=True)
class Example:
    """An example program: its schema and processor, a generated stream, and how to compare its output."""

    processor: str
    schema: str
    events: Callable[[], pa.Table]
    answer: Callable[[pa.Table], streams.Answer]
    #: An output table row as the answer's tuple.
    row: Callable[[dict[str, Any]], tuple[Any, ...]]
    #: How many state entries a partition's committed state holds (a session row holds a user's open sessions).
    held: Callable[[list[dict[str, Any]]], int] = len

    @property
    def key(self) -> str:
        return StreamSchema.from_file(REPO / self.schema).key


EXAMPLES = {
    "windowed_counts": Example(
        "examples.windowed_counts:processor",
        "examples/clicks.yaml",
        lambda: streams.clicks(2000, seed=21),
        streams.windowed_counts,
        streams.window_row,
    ),
    "sessions": Example(
        "examples.sessions:processor",
        "examples/clicks.yaml",
        lambda: streams.clicks(2000, seed=22),
        streams.sessions,
        streams.session_row,
        held=lambda rows: sum(len(r["sessions"]) for r in rows),
    ),
    "dedup": Example(
        "examples.dedup:processor",
        "examples/orders.yaml",
        lambda: streams.orders(1000, seed=23),
        streams.dedup,
        streams.order_row,
    ),
}


def _partition_of(events: pa.Table, key: str) -> list[pa.Table]:
    """The events each partition's log holds, in log order (produce appends in file order, routed by key)."""
    routed = route(events[key], PARTITIONS)
    return [events.filter(pa.array(routed == p)) for p in range(PARTITIONS)]


def _snapshot_rows(store: ObjectStore, partition: int, example: Example) -> tuple[int, list[dict[str, Any]]]:
    """The state rows of a partition's newest committed snapshot, opened alone, and its offset (0, [] if none)."""
    current = ManifestReader(store).current(PartitionId(partition))
    snapshot = current.manifest.snapshot if current is not None else None
    if snapshot is None:
        return 0, []
    schema = resolve_logic(store, 0, reference=None, given=None).processor.codec.schema
    with tempfile.TemporaryDirectory(prefix="snapshot-") as tmp:
        root = Path(tmp)
        download_snapshot(ReadStore(store), snapshot, root / "db", root / "cache")
        with PartitionStateStore.open_existing(root / "db", schema, partition=partition) as local:
            return snapshot.source_offset, local.to_table().to_pylist()


def _table_rows(store_url: str) -> list[dict[str, Any]]:
    uri = table_location(open_store(store_url)).uri
    options = None
    if uri.startswith("s3://"):
        options = {
            "AWS_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"],
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": os.environ.get("AWS_REGION", "us-east-1"),
            "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"],
        }
    rows: list[dict[str, Any]] = DeltaTable(uri, storage_options=options).to_pyarrow_table().to_pylist()
    return rows


@pytest.mark.parametrize("store_url", ["local", "s3"], indirect=True)
def test_each_example_through_a_move_a_zombie_and_a_kill_equals_its_answer(store_url: str, tmp_path: Path) -> None:
    # The three examples' clusters run side by side, each in a folder of its own in the store: on two
    # cores their nodes mostly wait (heartbeats, polls), so three at once cost little more than one.
    with ThreadPoolExecutor(len(EXAMPLES)) as pool:
        runs = {
            name: pool.submit(_scenario, example, f"{store_url}/{name}", tmp_path / name)
            for name, example in EXAMPLES.items()
        }
        for name, run in runs.items():
            try:
                run.result()
            except AssertionError as exc:
                raise AssertionError(f"{name}: {exc}") from exc


def _scenario(example: Example, store_url: str, logs: Path) -> None:
    logs.mkdir(parents=True)
    user = User(store_url, logs)
    try:
        _run_scenario(user, example, store_url)
    finally:
        stop_processes(user.nodes.values())


def _run_scenario(user: User, example: Example, store_url: str) -> None:
    events = example.events()
    chunk = events.num_rows // 5
    chunks = iter(events.slice(i * chunk, chunk if i < 4 else None) for i in range(5))
    user.run("init", "--partitions", str(PARTITIONS), "--schema", example.schema, "--processor", example.processor)
    user.start_node(1)
    user.start_node(2)
    user.wait("both nodes alive", lambda s: user.alive(s) == {1, 2})
    user.run("rebalance")
    user.produce(next(chunks), "first")
    status = user.caught_up({1, 2})

    # A graceful move of partition 0 mid-stream.
    owner0 = next(p.owner for p in status.partitions if p.partition == 0)
    user.run("migrate", "--partition", "0", "--to", str(3 - owner0))
    user.produce(next(chunks), "second")
    status = user.caught_up({1, 2})

    # A zombie: partition 1's owner is paused as events arrive, failed over, then resumed: its batch in
    # hand and its belief that it owns the partition must not reach the state or the table.
    zombie = next(p.owner for p in status.partitions if p.partition == 1)
    survivor = 3 - zombie
    user.produce(next(chunks), "third")
    user.nodes[zombie].send_signal(signal.SIGSTOP)
    try:
        user.wait(f"node {zombie} seen dead", lambda s: user.alive(s) == {survivor})
        user.run("failover", "--node", str(zombie))
    finally:
        user.nodes[zombie].send_signal(signal.SIGCONT)
    user.caught_up({survivor})
    user.wait(f"node {zombie} back", lambda s: user.alive(s) == {1, 2})
    user.produce(next(chunks), "fourth")
    user.caught_up({survivor})

    # kill -9 of the survivor, which owns everything now; the failover hands all to the resumed node.
    user.nodes[survivor].send_signal(signal.SIGKILL)
    user.nodes[survivor].wait()
    user.wait(f"node {survivor} dead", lambda s: user.alive(s) == {zombie})
    user.run("failover", "--node", str(survivor))
    user.produce(next(chunks), "fifth")
    user.caught_up({zombie})

    store = open_store(store_url)
    deadline = time.monotonic() + 120
    while table_status(store).lag_batches and time.monotonic() < deadline:
        time.sleep(1.0)
    answers = [example.answer(part) for part in _partition_of(events, example.key)]
    expected = sorted(row for answer in answers for row in answer.rows)
    assert sum(a.late for a in answers) > 0 and len(expected) > 30
    got = sorted(example.row(r) for r in _table_rows(store_url))
    assert got == expected  # every output row once, exactly what the events make
    for p, answer in enumerate(answers):
        state = json.loads(user.run("query", "--partition", str(p), "--json"))
        assert example.held(state["keys"]) == answer.held, f"partition {p} holds closed or expired state"
    # The newest snapshot alone, without the deltas after it, holds just what was open at its offset:
    # eviction and expiry reach the stored state itself, not only rows that later deltas mark deleted.
    snapshots = [(p, _snapshot_rows(store, p, example)) for p in range(PARTITIONS)]
    taken = [(p, offset, rows) for p, (offset, rows) in snapshots if offset > 0]
    assert taken, "no partition has a snapshot past offset 0: the check below would be vacuous"
    for p, offset, rows in taken:
        open_then = example.answer(_partition_of(events, example.key)[p].slice(0, offset)).held
        assert example.held(rows) == open_then, f"partition {p}'s snapshot at offset {offset} holds closed state"
