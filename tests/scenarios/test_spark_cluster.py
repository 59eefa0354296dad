"""Worker nodes on a real Spark standalone cluster: a master and a worker started from the pyspark installation.

Everything runs on loopback with small resources (one worker: 2 cores, 1 GiB;
each node's application: 1 core, a 512 MiB executor), so it fits a 2-core CI
machine. Two nodes run with ``--spark-master spark://127.0.0.1:PORT``; a
graceful migration and a failover after ``kill -9`` must keep every event
exactly once (``laminar verify``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest

from laminar_dev.localcluster import Cluster, wait_until
from laminar_orchestration.identity import NodeId, PartitionId
from tests.processes import free_port, laminar

pytestmark = [pytest.mark.spark, pytest.mark.processes, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent
#: What each node's application may take from the cluster (a spark-defaults.conf, as a deployment would ship).
SPARK_DEFAULTS = """\
spark.cores.max 1
spark.executor.cores 1
spark.executor.memory 512m
"""


def _daemon(cls: str, *args: str, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), cls, *args],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _master_state(web_port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=5) as resp:
        state: dict[str, object] = json.loads(resp.read())
        return state


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[tuple[str, int, dict[str, str]]]:
    """A standalone master and one worker on loopback; yields (master URL, master web port, env for clients)."""
    conf = tmp_path / "spark-conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(SPARK_DEFAULTS)
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_CONF_DIR": str(conf),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_WORKER_DIR": str(tmp_path / "spark-work"),
    }
    port, web, worker_web = free_port(), free_port(), free_port()
    master = _daemon(
        "org.apache.spark.deploy.master.Master",
        *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(web)),
        log=tmp_path / "spark-master.log",
        env=env,
    )
    worker = _daemon(
        "org.apache.spark.deploy.worker.Worker",
        f"spark://127.0.0.1:{port}",
        *("--host", "127.0.0.1", "--cores", "2", "--memory", "1g", "--webui-port", str(worker_web)),
        log=tmp_path / "spark-worker.log",
        env=env,
    )
    try:

        def worker_registered() -> bool:
            with contextlib.suppress(OSError, ValueError):
                alive: Any = _master_state(web).get("aliveworkers", 0)
                return int(alive) >= 1
            return False

        wait_until(worker_registered, 120, "the Spark worker to register with the master", interval=0.5)
        yield f"spark://127.0.0.1:{port}", web, env
    finally:
        for proc in (worker, master):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in (worker, master):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_nodes_on_a_spark_standalone_cluster_move_and_fail_over_exactly_once(
    tmp_path: Path, spark_cluster: tuple[str, int, dict[str, str]]
) -> None:
    master_url, web, env = spark_cluster
    store_url = (tmp_path / "store").as_uri()
    cluster = Cluster(store_url, tmp_path, partitions=2, env=env, spark_master=master_url)
    try:
        cluster.start_node(1)
        cluster.start_node(2)
        # Each node's first Spark job waits for an executor on the worker: slow on a loaded machine.
        cluster.wait_alive(1, 2, timeout=300)
        apps = _master_state(web).get("activeapps")
        assert isinstance(apps, list) and {a["name"] for a in apps} == {"laminar-node-1", "laminar-node-2"}
        cluster.place({0: 1, 1: 2})
        cluster.produce(400)
        cluster.wait_committed(120)

        # Graceful: partition 0 from node 1 to node 2, under load.
        cluster.coordinator.run(PartitionId(0), NodeId(2))
        assert (cluster.owner(0), cluster.epoch(0)) == (2, 2)
        cluster.produce(300)
        cluster.wait_committed(120)

        # Forced: node 2 (both partitions) is killed; both restore on node 1 from their last commits.
        started = time.monotonic()
        cluster.kill(2)
        cluster.wait_dead(2)
        for p in (0, 1):
            cluster.coordinator.run(PartitionId(p), NodeId(1), forced=True)
        assert [cluster.owner(p) for p in (0, 1)] == [1, 1]
        print(f"kill -9 -> both partitions active on node 1: {time.monotonic() - started:.1f}s")
        cluster.produce(300)
        cluster.wait_committed(120)
    finally:
        cluster.shutdown()
    verify = laminar("verify", "--store", store_url, env=env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "verify: OK" in verify.stdout, verify.stdout
