"""What the demo tells its user: the banner names the output table and how to read it, and the table
read downstream with plain deltalake shows each partition's committed events."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from laminar_orchestration.ops.demo_walkthrough import TableWatch, Walkthrough
from laminar_orchestration.store import LocalObjectStore
from laminar_orchestration.table import TableCommitter, TableLocation, table_location
from tests.table.cluster import Cluster


def _guide(store: LocalObjectStore, tmp_path: Path, ui: str | None = "http://127.0.0.1:3000") -> Walkthrough:
    return Walkthrough(
        store_url=store.url,
        demo_dir=tmp_path,
        load="200 events/s over 2 partitions (100 keys)",
        ui=ui,
        sensor=ui is not None,
        heartbeat_timeout_s=6.0,
        table=table_location(store),
        table_sync_interval_s=1.0,
    )


@pytest.mark.processes
def test_the_banner_names_the_table_and_a_read_that_needs_no_laminar_code(
    local_store: LocalObjectStore, tmp_path: Path
) -> None:
    cluster = Cluster(local_store, partitions=2)
    cluster.produce(200)
    for p in (0, 1):
        cluster.commit_batches(cluster.acquire(p, 1))
    TableCommitter(local_store).sync([0, 1])
    guide = _guide(local_store, tmp_path)
    owners, pids = {0: 1, 1: 2, 2: 2}, {1: 111, 2: 222, 3: 333}
    lines = guide.banner("", pids, pids, owners, ["  dagster UI   http://127.0.0.1:3000  (ready)"], {})
    text = "\n".join(lines)
    uri = table_location(local_store).uri
    assert f"  output table {uri}  (Delta Lake; nodes append every 1 s)" in lines
    assert "kill -9 222   (node 2, partitions 1, 2)" in text  # the node holding the most partitions
    assert "`to_node: 2`" in text  # partition 0 moves away from its owner
    read = next(line for line in lines if line.startswith("  read  ")).split("read", 1)[1].strip()
    python = str(Path(sys.executable).parent / "python")
    assert read.startswith(f"{python} -c ") and "laminar" not in read.replace(uri, "").replace(python, "")
    # The line as printed, run in a second shell where no venv is active: the table's rows, through
    # deltalake alone.
    bare_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    shown = subprocess.run(read, shell=True, capture_output=True, text=True, env=bare_env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    rows = DeltaTable(uri).to_pyarrow_table().num_rows
    assert rows > 0 and f"[{rows} rows x " in shown.stdout and "batch_seq" in shown.stdout
    # Without Dagster, a shell command instead of the UI.
    bare = "\n".join(_guide(local_store, tmp_path, ui=None).banner("", pids, pids, owners, [], {}))
    assert "Launchpad" not in bare and f"laminar failover --store {local_store.url} --node 2" in bare
    # Every `laminar` command printed runs as shown in that shell.
    migrate = next(line for line in bare.splitlines() if " migrate --store " in line).split()[1:]
    assert subprocess.run([*migrate[:2], "--help"], env=bare_env, capture_output=True).returncode == 0


@pytest.mark.processes
def test_the_table_read_downstream_shows_each_partitions_committed_events(
    local_store: LocalObjectStore,
) -> None:
    cluster = Cluster(local_store, partitions=2)
    watch = TableWatch(table_location(local_store))
    assert "not created yet" in watch.status_line()
    assert "no table yet" in "\n".join(watch.final_lines({0: 0, 1: 0}))
    cluster.produce(300)
    tokens = [cluster.acquire(p, 1) for p in (0, 1)]
    for token in tokens:
        cluster.commit_batches(token)
    TableCommitter(local_store).sync([0, 1])
    committed = {p: cluster.committed_offset(p) for p in (0, 1)}
    assert all(n > 0 for n in committed.values())
    read = watch.read()
    assert read is not None and read.events == committed
    lines = watch.final_lines(committed)
    for p in (0, 1):
        assert f"  partition {p}: {read.rows[p]:,} rows, {committed[p]:,} events (committed {committed[p]:,})" in lines
    assert lines[-1].endswith("each partition's events in the table are exactly the committed ones")
    assert f"output table: version {read.version} · {sum(read.rows.values()):,} rows" in watch.status_line()

    cluster.produce(100)
    cluster.commit_batches(tokens[1])  # committed, not synced yet
    behind = watch.final_lines({0: committed[0], 1: cluster.committed_offset(1)})
    assert "partitions 1 not caught up" in behind[-1] and "laminar table sync" in behind[-1]


@pytest.mark.processes
def test_a_table_the_reader_cannot_read_is_said_so_not_raised(tmp_path: Path) -> None:
    log = tmp_path / "broken" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text('{"add": {"path": truncated')
    lines = TableWatch(TableLocation(str(tmp_path / "broken"))).final_lines({0: 10})
    assert lines[1].startswith("  could not read it: reading output table ") and len(lines) == 2, lines
