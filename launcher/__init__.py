"""`PrewarmedRunLauncher`: Dagster runs forked from a process that has the code location imported.

Dagster's default launcher asks the code server to start each run in a new
Python process, which imports Dagster and the code location (Dagster,
dagster-aws, boto3, PySpark, the laminar library) before the first op runs:
seconds of CPU on every launch, far more on a loaded machine. This launcher
keeps one pre-warmed pool process per Dagster instance (`launcher.pool`,
started by the first launcher that needs it, shared by the webserver's and
the daemon's launchers through a Unix socket) and forks it per run. The child
executes the run exactly as ``dagster api execute_run`` does, so the run, its
ops, events, logs and failure reporting are those of any Dagster run.

Whenever the pool cannot take a run (not running yet, not Linux, another code
location, the code changed on disk, any error) the run is launched the
default way, through the code server, and a pool is started for the next one.
Termination sends the run worker SIGINT (Dagster turns it into an interrupt
of the running op, as the code server's cancellation does); the daemon's run
monitoring checks the worker's pid and start time.

Configured in the repo's ``dagster.yaml``::

    run_launcher:
      module: launcher
      class: PrewarmedRunLauncher
      config:
        python_file: definitions.py   # the code location the pool preloads (relative to the working directory)

The module must be importable by the webserver and the daemon: run them from
the repo root with ``PYTHONPATH`` holding it (``laminar demo`` and ``dagster
dev`` from the root do).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster import DagsterRun
from dagster._config import Field, StringSource
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher
from dagster._serdes import ConfigurableClassData, serialize_value

from .pool import RUN_WORKER_ENV, process_start_ticks, socket_address

__all__ = ["POOL_PID_TAG", "POOL_START_TAG", "PrewarmedRunLauncher"]

#: Run tags naming the forked run worker: its pid and its start time (clock ticks since boot).
POOL_PID_TAG = "laminar/run_worker_pid"
POOL_START_TAG = "laminar/run_worker_start"
#: How long a launch waits for the pool's answer before launching the default way.
POOL_REPLY_TIMEOUT_S = 10.0


class PrewarmedRunLauncher(DefaultRunLauncher):
    """Launches each run by forking a pre-warmed pool process; falls back to `DefaultRunLauncher`."""

    def __init__(
        self,
        inst_data: ConfigurableClassData | None = None,
        python_file: str = "definitions.py",
        working_directory: str | None = None,
    ) -> None:
        super().__init__(inst_data=inst_data)
        # Resolved now: the webserver and the daemon run from the code location's root.
        self.working_directory = os.path.realpath(working_directory or os.getcwd())
        self.python_file = os.path.realpath(os.path.join(self.working_directory, python_file))
        self._pool: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @classmethod
    def config_type(cls) -> dict[str, Field]:
        """``python_file`` and ``working_directory`` of the code location the pool preloads."""
        return {
            "python_file": Field(StringSource, is_required=False, default_value="definitions.py"),
            "working_directory": Field(StringSource, is_required=False),
        }

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> PrewarmedRunLauncher:
        """Built by the Dagster instance from ``dagster.yaml``."""
        return cls(inst_data=inst_data, **config_value)

    # --- the pool ------------------------------------------------------------------------------

    @property
    def _address(self) -> str:
        return socket_address(self._instance.root_directory)

    def _can_pool(self) -> bool:
        # Abstract Unix sockets and /proc are Linux's.
        return sys.platform.startswith("linux")

    def _may_start_pool(self) -> bool:
        # A run worker may use the pool (a run launching runs) but never starts one of its own.
        return self._can_pool() and not os.environ.get(RUN_WORKER_ENV)

    def register_instance(self, instance: Any) -> None:
        """Start the pool as soon as the launcher exists, so the first launch can already use it."""
        super().register_instance(instance)
        with contextlib.suppress(Exception):  # a pool is an optimisation; never fail the instance for it
            self.ensure_pool()

    def ensure_pool(self) -> None:
        """Start a pool for this instance unless one answers already (or one this launcher started lives)."""
        if not self._may_start_pool() or not os.path.exists(self.python_file):
            return
        with self._lock:
            if self._pool is not None and self._pool.poll() is None:
                return
            if self._ask({"ping": True}, timeout_s=1.0) is not None:
                return
            cmd = [sys.executable, "-m", "launcher", "--address", self._address[1:]]
            cmd += ["--python-file", self.python_file, "--working-directory", self.working_directory]
            self._pool = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,  # the pool exits when this process does (EOF)
                cwd=self.working_directory,
                env={**os.environ, "PYTHONPATH": _with_path(self.working_directory)},
            )

    def _ask(self, request: dict[str, Any], timeout_s: float = POOL_REPLY_TIMEOUT_S) -> dict[str, Any] | None:
        """One request to the pool; None if no pool answers."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(timeout_s)
                conn.connect(self._address)
                conn.sendall(json.dumps(request).encode() + b"\n")
                raw = b""
                while not raw.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    raw += chunk
            answer = json.loads(raw) if raw else None
        except (OSError, ValueError):
            return None
        return answer if isinstance(answer, dict) else None

    def _fork_run(self, run: DagsterRun) -> str | None:
        """Have the pool fork a worker for `run`; None on success, else why the pool could not."""
        if not self._can_pool():
            return "no pool on this platform"
        origin = run.job_code_origin
        pointer = getattr(origin.repository_origin.code_pointer, "python_file", None) if origin else None
        directory = getattr(origin.repository_origin.code_pointer, "working_directory", None) if origin else None
        if pointer is None or os.path.realpath(pointer) != self.python_file:
            return f"run of another code location ({pointer})"
        answer = self._ask(
            {
                "run_id": run.run_id,
                "instance_ref": serialize_value(self._instance.get_ref()),
                "python_file": pointer,
                "working_directory": directory or self.working_directory,
            }
        )
        if answer is None:
            return "no pool answered"
        if "pid" not in answer:
            return str(answer.get("error", answer))
        self._instance.add_run_tags(
            run.run_id, {POOL_PID_TAG: str(answer["pid"]), POOL_START_TAG: str(answer.get("start") or "")}
        )
        return None

    # --- RunLauncher ---------------------------------------------------------------------------

    def launch_run(self, context: LaunchRunContext) -> None:
        """Fork the run from the pool, or launch it the default way (and start a pool for the next run)."""
        run = context.dagster_run
        refused = self._fork_run(run)
        if refused is None:
            return
        self._instance.report_engine_event(
            f"Launching the run through the code server: the pre-warmed pool could not take it ({refused}).",
            run,
        )
        super().launch_run(context)
        with contextlib.suppress(Exception):
            self.ensure_pool()

    def _worker(self, run: DagsterRun) -> tuple[int, int | None] | None:
        """The pool-forked worker of `run` (pid, start ticks), None if the run was launched the default way."""
        raw = run.tags.get(POOL_PID_TAG)
        if not raw:
            return None
        start = run.tags.get(POOL_START_TAG) or ""
        return int(raw), (int(start) if start.isdigit() else None)

    def _worker_alive(self, pid: int, start: int | None) -> bool:
        ticks = process_start_ticks(pid)
        return ticks is not None and (start is None or ticks == start)

    def terminate(self, run_id: str) -> bool:
        """Interrupt the run's worker (a pool-forked one gets SIGINT, as the code server's cancel sends)."""
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        worker = self._worker(run)
        if worker is None:
            return bool(super().terminate(run_id))  # type: ignore[no-untyped-call]
        pid, start = worker
        self._instance.report_run_canceling(run)
        if not self._worker_alive(pid, start):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
            return True
        return False

    @property
    def supports_check_run_worker_health(self) -> bool:
        """The daemon's run monitoring may ask whether a run's worker still runs."""
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        """RUNNING while the pool-forked worker lives; FAILED once it is gone without ending the run.

        A run launched the default way is reported RUNNING: the code server does not tell (the
        default launcher is not monitored either), and the monitor fails runs it cannot vouch for.
        """
        worker = self._worker(run)
        if worker is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING, "launched through the code server: not monitored")
        pid, start = worker
        if self._worker_alive(pid, start):
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker process {pid} exited")

    def dispose(self) -> None:
        """Stop the pool this launcher started (its runs keep running)."""
        pool, self._pool = self._pool, None
        if pool is None or pool.poll() is not None:
            return
        with contextlib.suppress(Exception):
            if pool.stdin is not None:
                pool.stdin.close()  # EOF: the pool exits after its current request
            deadline = time.monotonic() + 5
            while pool.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if pool.poll() is None:
                pool.terminate()
            pool.wait(5)
        super().dispose()


def _with_path(directory: str) -> str:
    rest = os.environ.get("PYTHONPATH", "")
    parts = [directory, *(p for p in rest.split(os.pathsep) if p and Path(p).resolve() != Path(directory))]
    return os.pathsep.join(parts)
