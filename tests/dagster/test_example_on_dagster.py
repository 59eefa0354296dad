"""An example program run from Dagster: the sessions example's stream, processed by a ``worker_node``
run whose Launchpad config names the processor, as a user launches it.

The cluster is initialised with the clicks schema and the sessions processor (`laminar init`), the
clicks are produced from a Parquet file (`laminar produce`), and one ``worker_node`` run (``dagster
job execute`` on a real instance) processes both partitions on Spark. The output table, read with
`deltalake` alone, must equal the sessions computed independently over the produced clicks; a run
config naming another processor than the recorded one must fail without committing anything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import PartitionStatus
from laminar_orchestration.protocol.source_events import route
from laminar_orchestration.store import open_store
from laminar_orchestration.table import table_location, table_status
from tests.processing import streams

pytestmark = [pytest.mark.spark, pytest.mark.dagster, pytest.mark.processes, pytest.mark.slow(seconds=120)]

REPO = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).with_name("dagster")
PARTITIONS = 2


def _wait(what: str, check: object, timeout_s: float, run: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        if run.poll() is not None:
            raise AssertionError(f"the run exited ({run.returncode}) waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}:\n{log.read_text()[-3000:]}")


def _worker_node_run(
    tmp_path: Path, env: dict[str, str], processor: str, name: str
) -> tuple[subprocess.Popen[bytes], Path]:
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        "ops:\n  run_node:\n    config:\n      node_id: 1\n      heartbeat_timeout_s: 30\n"
        f"      processor: {processor}\n"
    )
    log = tmp_path / f"{name}.log"
    with log.open("wb") as out:
        run = subprocess.Popen(
            [str(DAGSTER), "job", "execute", "-f", "definitions.py", "-j", "worker_node", "-c", str(config)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    return run, log


def _stop(run: subprocess.Popen[bytes]) -> None:
    if run.poll() is None:
        run.send_signal(signal.SIGINT)  # as Dagster terminates a run
        try:
            run.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


def test_the_sessions_example_runs_from_dagster_and_its_table_equals_the_answer(tmp_path: Path) -> None:
    store_url = (tmp_path / "store").as_uri()
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "LAMINAR_STORE": store_url, "LAMINAR_SPARK_MASTER": "local[1]"}
    cli = [sys.executable, "-m", "laminar_orchestration.cli"]
    subprocess.run(
        [*cli, "init", "--partitions", str(PARTITIONS), "--schema", "examples/clicks.yaml",
         "--processor", "examples.sessions:processor"],
        check=True, env=env, cwd=REPO, capture_output=True,
    )  # fmt: skip
    events = streams.clicks(900, seed=31)
    pq.write_table(events.drop_columns(["offset"]), tmp_path / "clicks.parquet")
    subprocess.run([*cli, "produce", "--from-file", str(tmp_path / "clicks.parquet")], check=True, env=env, cwd=REPO)
    ledger = Ledger(open_store(store_url))

    # A run naming another processor than the cluster's refuses to take a partition.
    wrong, wrong_log = _worker_node_run(tmp_path, env, "examples.windowed_counts:processor", "wrong")
    try:
        assert wrong.wait(180) != 0, wrong_log.read_text()[-3000:]
    finally:
        _stop(wrong)
    assert "examples.sessions:processor" in wrong_log.read_text()  # the error names the recorded processor
    for p in range(PARTITIONS):  # nothing granted, nothing committed
        own = ledger.ownership(PartitionId(p))
        assert own is not None and (own.epoch, own.status) == (0, PartitionStatus.UNASSIGNED), own
    assert not ledger.members.nodes()  # it never joined

    run, log = _worker_node_run(tmp_path, env, "examples.sessions:processor", "run")
    try:
        _wait("node 1 to join", lambda: any(v.alive for v in ledger.members.nodes()), 180, run, log)
        coordinator = MigrationCoordinator(ledger)
        for p in range(PARTITIONS):  # place both partitions on the node, as `laminar rebalance` would
            coordinator.run(PartitionId(p), NodeId(1), forced=True)
        reader = ManifestReader(ledger.store)

        def committed() -> bool:
            current = [reader.current(PartitionId(p)) for p in range(PARTITIONS)]
            done = sum(m.manifest.source_offset for m in current if m is not None)  # each log's committed end
            return done == events.num_rows and not table_status(ledger.store).lag_batches

        _wait("every click committed and in the table", committed, 180, run, log)
    finally:
        _stop(run)

    routed = route(events["user"], PARTITIONS)
    answers = [streams.sessions(events.filter(pa.array(routed == p))) for p in range(PARTITIONS)]
    expected = sorted(row for answer in answers for row in answer.rows)
    table = DeltaTable(table_location(ledger.store).uri).to_pyarrow_table().to_pylist()
    got = sorted(streams.session_row(r) for r in table)
    assert len(expected) > 10
    assert got == expected
