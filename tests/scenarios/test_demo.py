"""`laminar demo`: one real run (nodes, load, Dagster webserver and daemon), and its process hygiene."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from laminar_orchestration.ops.demo_dagster import CODE_LOCATION_FILES, find_code_location
from laminar_orchestration.ops.demo_processes import Child
from tests.processes import Samples, free_port, scrape

#: The whole run must end within this: 75 s once up, plus start-up (~30 s for two nodes' Spark and the
#: webserver on an idle 2-core machine, several times that on a loaded one) and the orderly stop.
DEMO_LIMIT_S = 240.0


def processes_with_mark(mark: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries `mark`: the demo's descendants."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mark.encode() not in (proc / "environ").read_bytes():
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(proc.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def laminar(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "laminar_orchestration.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
    )


@pytest.mark.dagster
@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.spark
def test_demo_runs_nodes_load_and_dagster_then_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    mark = f"laminar-demo-test-{uuid.uuid4().hex}"
    env = {**os.environ, "LAMINAR_DEMO_TEST_MARK": mark}
    env.pop("LAMINAR_STORE", None)
    store = (tmp_path / "store").as_uri()
    cmd = [
        sys.executable, "-m", "laminar_orchestration.cli", "demo",
        "--duration", "75", "--port", str(port), "--nodes", "2", "--partitions", "2", "--store", store,
    ]  # fmt: skip
    started = time.monotonic()
    demo = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env, bufsize=1
    )
    lines: list[str] = []

    def read() -> None:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    server_info: dict[str, object] = {}
    node_metrics: Samples = {}
    plane_metrics: Samples = {}
    moved: tuple[int, int] | None = None
    try:
        # While it runs: once the demo says the webserver is ready, it must answer us too.
        while demo.poll() is None and time.monotonic() - started < DEMO_LIMIT_S:
            if not server_info and any("dagster webserver ready" in line for line in lines):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=10) as resp:
                    server_info = json.loads(resp.read())
            where = re.search(r"metrics +Prometheus: (http://\S+) \(control plane\); node 1 :(\d+)", "".join(lines))
            if where and not plane_metrics and sum(1 for line in lines if line.startswith("── status")) >= 3:
                # Under load, with the placements done: the node's figures and the moves' durations.
                node_metrics = scrape(f"http://127.0.0.1:{where[2]}/metrics")
                plane_metrics = scrape(where[1])
            if plane_metrics and moved is None:
                # A graceful move from a shell while the demo runs: the demo prints its phases.
                status = json.loads(laminar("status", "--json", "--store", store, cwd=tmp_path).stdout)
                owner = next(p["owner"] for p in status["partitions"] if p["partition"] == 0)
                moved = (owner, 3 - owner)
                migrate = laminar("migrate", "--partition", "0", "--to", str(3 - owner), "--store", store, cwd=tmp_path)
                assert migrate.returncode == 0, migrate.stderr
            time.sleep(0.5)
        code = demo.wait(timeout=max(1.0, DEMO_LIMIT_S - (time.monotonic() - started)))
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGTERM)  # the demo's own cleanup stops its children
            try:
                demo.wait(60)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait()
        reader.join(10)
    elapsed = time.monotonic() - started
    output = "".join(lines)
    print(output)  # shown by pytest on failure
    assert code == 0, output[-4000:]
    assert elapsed < DEMO_LIMIT_S

    assert "laminar demo is running" in output, "the cluster never came up:\n" + output[-3000:]
    assert f"http://127.0.0.1:{port}" in output
    assert "dagster_webserver_version" in server_info, output[-3000:]
    assert re.search(r"kill -9 \d+", output)
    assert "Launchpad" in output and "migrate_partition" in output

    # Status tables: both partitions owned by one of the two nodes, at an epoch >= 1, committing.
    tables = re.findall(r"── status .*?\n(?:.*\n)*?nodes: .*\n", output)
    assert tables, output[-3000:]
    owned = False
    for table in tables:
        rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+active\s+([\d,]+)\s", table, re.M)
        if len(rows) == 2 and all(o in ("1", "2") and int(e) >= 1 for _, o, e, _ in rows):
            owned = True
            assert {p for p, *_ in rows} == {"0", "1"}
    assert owned, "no status table showed both partitions active on a node:\n" + output[-3000:]
    assert re.search(r"[1-9][\d,]* events/s committed", output)

    # The final audit: everything produced was committed, exactly once.
    audits = re.findall(r"partition (\d): committed (\d+)/(\d+) events, \d+ manifests, \d+ epochs?: ok", output)
    assert len(audits) == 2 and all(int(c) == int(t) > 0 for _, c, t in audits), output[-2000:]
    assert "verify: OK" in output
    # The output table: named in the banner with a read that needs no laminar code, moving under the
    # status tables, and read downstream with deltalake at the end: each partition's committed events.
    table_uri = str(tmp_path.resolve() / "store" / "tables" / "output")
    assert re.search(rf"output table {re.escape(table_uri)} +\(Delta Lake; nodes append", output), output[:3000]
    assert "from deltalake import DeltaTable; print(DeltaTable(" in output
    assert re.search(r"output table: version \d+ · [1-9][\d,]* rows", output), output[-3000:]
    reads = re.findall(r"partition (\d): [\d,]+ rows, ([\d,]+) events \(committed ([\d,]+)\)", output)
    committed = {p: int(c) for p, c, _ in audits}
    assert {p: int(e.replace(",", "")) for p, e, _ in reads} == committed, reads
    assert "each partition's events in the table are exactly the committed ones" in output
    # A clean stop reads as one: every partition released, nobody dead or waiting for a failover.
    final = output[output.index("── final status") :]
    assert len(re.findall(r"released by node [12]", final)) == 2 and "dead" not in final, final
    assert "Editable installation" not in output and "Closing down clientserver" not in output
    # The move's phases, as the demo saw them in the ledger, ending active.
    assert moved is not None
    phases = re.findall(rf"partition 0: graceful {moved[0]}→{moved[1]}: (.*)", output)
    assert phases and phases[-1].split(" in ")[0].endswith("active"), phases

    # Metrics scraped while the load ran: node 1's partitions' lag, commits and batch latency, and the
    # control plane's durations of the placements (moves that ended).
    assert any(name == "laminar_partition_lag_events" for name, _ in node_metrics), node_metrics
    assert sum(v for (n, _), v in node_metrics.items() if n == "laminar_partition_commits_total") > 0
    assert sum(v for (n, _), v in node_metrics.items() if n == "laminar_batch_duration_seconds_count") > 0
    placed = plane_metrics.get(
        ("laminar_migration_duration_seconds_count", (("kind", "placement"), ("outcome", "active")))
    )
    assert placed == 2, plane_metrics
    assert f"laminar report --store {store}" in output

    # Nothing the demo started outlives it: nodes, Spark JVMs, Dagster processes, code servers, runs.
    deadline = time.monotonic() + 10
    while processes_with_mark(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_with_mark(mark) == []


@pytest.mark.processes
def test_demo_refuses_a_port_in_use_before_starting_anything(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = laminar("demo", "--port", str(port), "--store", (tmp_path / "store").as_uri(), cwd=tmp_path)
    assert run.returncode == 1
    assert f"port {port} on 127.0.0.1 is in use" in run.stdout + run.stderr
    assert not (tmp_path / ".laminar").exists() and not (tmp_path / "store").exists()


@pytest.mark.processes
def test_demo_rejects_bad_options(tmp_path: Path) -> None:
    run = laminar("demo", "--nodes", "0", cwd=tmp_path)
    assert run.returncode == 2 and "--nodes: must be >= 1" in run.stderr  # one line, as any flag error


@pytest.mark.processes
def test_children_get_sigterm_when_the_demo_is_killed(tmp_path: Path) -> None:
    """A SIGKILLed demo cannot clean up: its children must still not live on (Linux parent-death signal)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux-only")
    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from laminar_orchestration.ops.demo import Child\n"
        f"c = Child('sleeper', ['sleep', '300'], Path({str(tmp_path / 'child.log')!r}), env=os.environ)\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert alive(child_pid)
    finally:
        parent.kill()
        parent.wait(10)
    deadline = time.monotonic() + 10
    while alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child_pid)


@pytest.mark.processes
def test_child_stop_takes_its_process_group_along(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = Child("shell", ["sh", "-c", "sleep 300 & echo $!; wait"], log, env=os.environ)
    try:
        deadline = time.monotonic() + 10
        while not log.read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchild = int(log.read_text().split()[0])
        assert alive(grandchild) and child.running()
        assert os.getpgid(grandchild) == child.pid  # own session: the child leads its group
    finally:
        child.kill_group()
        child.close()
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not child.running() and not alive(grandchild)


def test_the_code_location_is_found_from_a_checkout_not_only_beside_the_package(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "sub" / "dir").mkdir(parents=True)
    for name in CODE_LOCATION_FILES:
        (checkout / name).write_text("")
    # From anywhere inside the checkout (a plain install's package lives elsewhere, in site-packages).
    assert find_code_location(checkout / "sub" / "dir") == checkout.resolve()
    # Outside one, only the package's own checkout (an editable or PYTHONPATH run) can still be found.
    repo = Path(__file__).resolve().parents[2]
    assert find_code_location(tmp_path) == repo
