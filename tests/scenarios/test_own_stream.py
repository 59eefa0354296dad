"""A stream of one's own, as a user runs it: `laminar init` with the clicks schema and the
windowed-counts example, two Spark nodes, `laminar produce` of Parquet files, a graceful move
mid-stream and a kill -9 of an owner followed by `laminar failover`. The output table, read with
`deltalake` alone, must equal an independent pandas computation over the produced events, partition by
partition in log order (same windows, same lateness rule), each window exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from laminar_dev.localcluster import stop_processes
from laminar_orchestration.processing.schema import StreamSchema
from laminar_orchestration.protocol.source import route
from laminar_orchestration.store import open_store
from laminar_orchestration.table import table_location, table_status
from tests.processing.test_examples import _clicks

pytestmark = [pytest.mark.spark, pytest.mark.processes, pytest.mark.slow(seconds=200)]

REPO = Path(__file__).resolve().parents[2]
CLICKS = StreamSchema.from_file(REPO / "examples" / "clicks.yaml")
MINUTE = 60_000
PARTITIONS = 2


class User:
    """A shell at the repo root with LAMINAR_STORE set: commands, and the nodes in the background."""

    def __init__(self, store_url: str, logs: Path) -> None:
        self.env = {**os.environ, "LAMINAR_STORE": store_url}
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
        with open(self.logs / f"node{node}.log", "wb") as log:
            self.nodes[node] = subprocess.Popen(
                [sys.executable, "-m", "laminar_orchestration.cli", "node", "run", "--node-id", str(node),
                 "--spark-master", "local[1]", "--heartbeat-timeout", "4", "--table-sync-interval", "1"],
                cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.run("status", "--json", "--detail"))
        return result

    def wait(self, what: str, done: Any, timeout_s: float = 240) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            if done(status):
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not reached in {timeout_s} s: {status}\n{self.tails()}")
            time.sleep(1.0)

    def caught_up(self, owners: set[int]) -> dict[str, Any]:
        return self.wait(
            f"every partition active on {owners} and caught up",
            lambda s: all(p["owner"] in owners and p["status"] == "active" and p["lag"] == 0 for p in s["partitions"]),
        )

    def produce(self, events: pa.Table, name: str) -> None:
        path = self.logs / f"{name}.parquet"
        pq.write_table(events.drop_columns(["offset"]), path)
        self.run("produce", "--from-file", str(path))

    def tails(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.logs.glob("node*.log")))


@pytest.fixture
def user(store_url: str, tmp_path: Path) -> Iterator[User]:
    shell = User(store_url, tmp_path)
    yield shell
    stop_processes(shell.nodes.values())


def _reference(events: pa.Table) -> list[tuple[str, int, int, Any, list[str]]]:
    """The windowed counts of `events`, computed directly: per partition in log order, an event below the
    largest event time before it minus a minute is late; a 5-minute window is final once that
    watermark reaches its end."""
    frame = events.to_pandas()
    frame["t"] = [int(at.timestamp() * 1000) for at in events["at"].to_pylist()]
    frame["partition"] = route(events["user"], PARTITIONS)
    rows = []
    for _, part in frame.groupby("partition", sort=False):
        late = part["t"] < part["t"].cummax() - MINUTE
        watermark = int(part["t"].max()) - MINUTE
        timely = part[~late].copy()
        timely["start"] = timely["t"] - timely["t"] % (5 * MINUTE)
        for (key, start), window in timely.groupby(["user", "start"]):
            if start + 5 * MINUTE <= watermark:
                rows.append((key, int(start), len(window), window["amount"].sum(), sorted(set(window["page"]))))
    return sorted(rows)


def _table_rows(store_url: str) -> list[tuple[str, int, int, Any, list[str]]]:
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
    table = DeltaTable(uri, storage_options=options).to_pyarrow_table()
    return sorted(
        (r["key"], int(r["window_start"].timestamp() * 1000), r["views"], r["amount"], list(r["pages"]))
        for r in table.to_pylist()
    )


# On the S3-protocol server (the local store passes the same; two Spark nodes per run are the suite's cost).
@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_windowed_counts_through_a_move_and_a_kill_equal_pandas(user: User, store_url: str) -> None:
    events = _clicks(1800, seed=21)
    chunks = [events.slice(0, 600), events.slice(600, 600), events.slice(1200, 600)]
    user.run("init", "--partitions", str(PARTITIONS), "--schema", "examples/clicks.yaml",
             "--processor", "examples.windowed_counts:processor")  # fmt: skip
    user.start_node(1)
    user.start_node(2)
    user.wait("both nodes alive", lambda s: {n["node"] for n in s["nodes"] if n["alive"]} == {1, 2})
    user.run("rebalance")
    user.produce(chunks[0], "first")
    status = user.caught_up({1, 2})

    # A graceful move of partition 0 mid-stream.
    owner0 = next(p["owner"] for p in status["partitions"] if p["partition"] == 0)
    user.run("migrate", "--partition", "0", "--to", str(3 - owner0))
    user.produce(chunks[1], "second")
    status = user.caught_up({1, 2})

    # kill -9 of partition 1's owner, then the failover, then the rest of the stream.
    victim = next(p["owner"] for p in status["partitions"] if p["partition"] == 1)
    user.nodes[victim].send_signal(signal.SIGKILL)
    user.nodes[victim].wait()
    user.wait(f"node {victim} dead", lambda s: {n["node"] for n in s["nodes"] if n["alive"]} == {3 - victim})
    user.run("failover", "--node", str(victim))
    user.produce(chunks[2], "third")
    user.caught_up({3 - victim})

    store = open_store(store_url)
    deadline = time.monotonic() + 120
    while table_status(store).lag_batches and time.monotonic() < deadline:
        time.sleep(1.0)
    expected = _reference(events)
    assert len(expected) > 40
    assert _table_rows(store_url) == expected  # each final window once, exactly its timely events
    frame = pd.DataFrame(expected, columns=["user", "start", "views", "amount", "pages"])
    assert not frame.duplicated(["user", "start"]).any()
