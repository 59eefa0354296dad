"""Dagster's daemon (and optionally its webserver) as real processes on a temporary instance.

Used by the end-to-end Dagster tests and ``benchmarks.bench_dagster_failover``:
the instance settings are the repo's ``dagster.yaml``, the code location is
``workspace.yaml``, the store and heartbeat timeout come from the environment,
as in `laminar demo`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dagster import AssetKey, DagsterInstance, DagsterRun, RunsFilter

from laminar_dev.localcluster import Cluster, wait_until
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.desired_states import DesiredStates
from laminar_orchestration.protocol.tasks import MigrationKind, MigrationPhase
from tests.processes import free_port

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


class ControlPlane:
    """``dagster-daemon`` (sensors, run launches) and optionally ``dagster-webserver`` on one instance."""

    def __init__(
        self, workdir: Path, store_url: str, *, heartbeat_timeout_s: float, env: Mapping[str, str] | None = None
    ) -> None:
        self.workdir = workdir
        self.home = workdir / "dagster_home"
        self.home.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "dagster.yaml", self.home / "dagster.yaml")
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(self.home),
            "LAMINAR_STORE": store_url,
            "LAMINAR_FAILOVER_HEARTBEAT_TIMEOUT_S": str(heartbeat_timeout_s),
            "LAMINAR_SPARK_MASTER": "local[1]",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
            **(env or {}),
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.port: int | None = None
        # Create the instance's databases once, before several processes race to create them.
        with self.instance():
            pass

    def _start(self, name: str, cmd: list[str]) -> None:
        log = (self.workdir / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            cmd, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def start_daemon(self) -> None:
        self._start("dagster-daemon", [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"])

    def start_webserver(self, timeout_s: float = 180.0) -> None:
        self.port = free_port()
        cmd = [str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(self.port)]
        self._start("dagster-webserver", cmd)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_running()
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/server_info", timeout=5),
            ):
                # As the demo does: the webserver builds its run launcher, which starts the run-worker pool.
                self.graphql("{ instance { runLauncher { name } } }")
                return
            time.sleep(0.5)
        raise TimeoutError(f"the webserver did not answer within {timeout_s:.0f}s:\n{self.log('dagster-webserver')}")

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")[-4000:]

    def check_running(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")

    def pool_pid(self) -> int | None:
        """The pid of the run-worker pool serving this instance (see `launcher`), None if none answers."""
        from launcher.pool import socket_address

        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(5)
                conn.connect(socket_address(str(self.home)))
                conn.sendall(b'{"ping": true}\n')
                return int(json.loads(conn.recv(4096))["pong"])
        except (OSError, ValueError, KeyError):
            return None

    def wait_pool(self, timeout_s: float = 180.0) -> int:
        """Until the webserver's launcher has its pool up (it imports the code location first); its pid."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_running()
            pid = self.pool_pid()
            if pid is not None:
                return pid
            time.sleep(0.5)
        raise TimeoutError(f"no run-worker pool within {timeout_s:.0f}s:\n{self.log('dagster-webserver')}")

    def instance(self) -> DagsterInstance:
        return DagsterInstance.from_config(str(self.home))

    def wait_sensors_ticking(self, timeout_s: float = 180.0) -> None:
        """Until the observation sensor reported the ownership map: the daemon evaluates sensors."""
        deadline = time.monotonic() + timeout_s
        with self.instance() as instance:
            while time.monotonic() < deadline:
                self.check_running()
                if instance.fetch_observations(AssetKey("ownership_map"), limit=1).records:
                    return
                time.sleep(0.5)
        raise TimeoutError(f"no sensor evaluation within {timeout_s:.0f}s:\n{self.log('dagster-daemon')}")

    def wait_finished(self, run_id: str, timeout_s: float = 120.0, *, interval: float = 0.5) -> DagsterRun:
        """Until run `run_id` finished (these processes still up); the run as it ended."""

        def finished() -> bool:
            self.check_running()
            with self.instance() as instance:
                run = instance.get_run_by_id(run_id)
                return run is not None and run.is_finished

        wait_until(finished, timeout_s, f"run {run_id} to finish", interval=interval)
        with self.instance() as instance:
            run = instance.get_run_by_id(run_id)
            assert run is not None
            return run

    def runs(self, job_name: str | None = None) -> list[DagsterRun]:
        with self.instance() as instance:
            return list(instance.get_runs(RunsFilter(job_name=job_name) if job_name else None))

    def graphql(self, query: str, variables: Mapping[str, Any] | None = None) -> Any:
        """The ``data`` of a GraphQL request to the webserver."""
        assert self.port is not None, "start_webserver() first"
        body = json.dumps({"query": query, "variables": dict(variables or {})}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            answer = json.loads(resp.read())
        if answer.get("errors"):
            raise RuntimeError(f"GraphQL errors: {answer['errors']}")
        return answer["data"]

    def launch(self, job_name: str, run_config: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> str:
        """Launch a run through the webserver's GraphQL API, as the Launchpad's button does; its run id."""
        assert self.port is not None, "start_webserver() first"
        query = """
        mutation($params: ExecutionParams!) {
          launchRun(executionParams: $params) {
            __typename
            ... on LaunchRunSuccess { run { runId } }
            ... on PythonError { message }
            ... on RunConfigValidationInvalid { errors { message } }
          }
        }"""
        params = {
            "selector": {"repositoryLocationName": "laminar", "repositoryName": "__repository__", "jobName": job_name},
            "runConfigData": dict(run_config),
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
        }
        result = self.graphql(query, {"params": params})["launchRun"]
        if result["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"launchRun failed: {result}")
        return str(result["run"]["runId"])

    def terminate(self, run_id: str) -> str:
        """Terminate a run as the UI's Terminate button does; the mutation's result type."""
        query = """
        mutation($runId: String!) {
          terminateRun(runId: $runId) { __typename ... on TerminateRunFailure { message } }
        }"""
        return str(self.graphql(query, {"runId": run_id})["terminateRun"]["__typename"])

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def bring_up(
    plane: ControlPlane,
    cluster: Cluster,
    start_node: Callable[[int], object],
    placement: Mapping[int, int],
    *,
    alive_timeout_s: float,
) -> None:
    """The daemon, nodes 1 and 2 (started by `start_node` while the daemon loads the code location), the
    webserver; `placement` placed, 400 events produced and committed, the sensors ticking, the pool up."""
    plane.start_daemon()
    for node in (1, 2):
        start_node(node)
    plane.start_webserver()
    cluster.wait_alive(1, 2, timeout=alive_timeout_s)
    cluster.place(placement)
    cluster.produce(400)
    cluster.wait_committed(120)
    plane.wait_sensors_ticking()
    plane.wait_pool()


def failed_over(cluster: Cluster, p: int, to_node: int) -> bool:
    """Partition `p` is active on `to_node` at the end of a forced migration (a failover) to it."""
    task = DesiredStates(cluster.ledger).read(PartitionId(p))[0].migration
    return (
        task is not None
        and task.migration_kind == MigrationKind.FORCED
        and task.phase == MigrationPhase.ACTIVE
        and task.to_node == to_node
        and cluster.owner(p) == to_node
    )
