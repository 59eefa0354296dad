"""The pre-warmed run-worker pool: one process with Dagster and the code location imported, forked per run.

Started by `launcher.PrewarmedRunLauncher` as ``python -m launcher``; it
listens on a Linux abstract Unix socket named after the Dagster instance and
answers one JSON request per connection::

    {"run_id": ..., "instance_ref": <serialized InstanceRef>,
     "python_file": ..., "working_directory": ...}

by forking a child that executes the run exactly as ``dagster api
execute_run`` does (`_execute_run_command_body`: the run's own events, its
cancellation thread, failure reporting), and replies ``{"pid": ..., "start":
...}`` or ``{"error": ...}``. The pool stays single-threaded (forking a
threaded process is unsafe), reaps its children, and exits when its launcher's
process goes away (its stdin reaches EOF), when asked to stop, or after
replying "stale" once a module it imported from the code location changed on
disk (the launcher then starts a fresh one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

#: Set in every run worker, so that a launcher built there never starts a pool of its own.
RUN_WORKER_ENV = "LAMINAR_RUN_WORKER"
#: Longest the pool waits for a request's bytes once a launcher connected.
REQUEST_TIMEOUT_S = 10.0


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat``), None if it is gone.

    Stored with the pid, so a recycled pid is never taken for the run worker.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may contain spaces: fields after its closing parenthesis are fixed.
    fields = raw[raw.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] == b"Z":
        return None  # a zombie has exited already
    return int(fields[19])


def socket_address(instance_root: str) -> str:
    """The abstract socket name of the pool serving the Dagster instance at `instance_root`."""
    import hashlib

    digest = hashlib.sha256(os.path.realpath(instance_root).encode()).hexdigest()[:20]
    return f"\0laminar-run-pool-{digest}"


class Pool:
    """The listening pool: preloaded modules, the socket, the children it forked."""

    def __init__(self, address: str, python_file: str, working_directory: str) -> None:
        self.address = address
        self.python_file = os.path.realpath(python_file)
        self.working_directory = os.path.realpath(working_directory)
        self.loaded_at = time.time()
        self.code_files: list[str] = []
        self.listener: socket.socket | None = None

    def preload(self) -> None:
        """Import Dagster and the code location the way the code server does (the slow part of a run start)."""
        import dagster  # noqa: F401
        from dagster._cli.api import _execute_run_command_body  # noqa: F401
        from dagster._core.code_pointer import load_python_file
        from dagster._core.instance import DagsterInstance  # noqa: F401

        self.loaded_at = time.time()
        load_python_file(self.python_file, self.working_directory)
        # The files to watch for changes: the code location's own modules (checked before each fork).
        root = self.working_directory + os.sep
        files = (getattr(module, "__file__", None) for module in list(sys.modules.values()))
        self.code_files = sorted({os.path.realpath(f) for f in files if f and os.path.realpath(f).startswith(root)})

    def stale(self) -> str | None:
        """A code-location module changed since the pool imported it (then its runs would run old code)."""
        for path in self.code_files:
            with contextlib.suppress(OSError):
                if os.stat(path).st_mtime > self.loaded_at:
                    return f"{path} changed since the pool loaded it"
        return None

    def bind(self) -> bool:
        """Listen on the pool's address; False if another pool for the instance already does."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.address)
        except OSError:
            listener.close()
            return False
        listener.listen(16)
        self.listener = listener
        return True

    def serve(self) -> None:
        """Answer requests until stdin reaches EOF (the launcher's process is gone) or a stop request."""
        assert self.listener is not None
        watch_stdin = not sys.stdin.closed and not os.isatty(0)
        while True:
            readable = [self.listener] + ([sys.stdin] if watch_stdin else [])
            try:
                ready, _, _ = select.select(readable, [], [], 5.0)
            except InterruptedError:
                continue
            if sys.stdin in ready and not os.read(0, 4096):
                return  # the launcher's process exited
            if self.listener in ready and not self._answer_one():
                return

    def _answer_one(self) -> bool:
        """Read one request and reply; False when the pool must exit afterwards."""
        assert self.listener is not None
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(REQUEST_TIMEOUT_S)
            try:
                request = json.loads(_read_line(conn))
            except (OSError, ValueError) as exc:
                _reply(conn, {"error": f"bad request: {exc}"})
                return True
            if request.get("stop"):
                _reply(conn, {"stopped": True})
                return False
            if request.get("ping"):
                _reply(conn, {"pong": os.getpid()})
                return True
            reason = self._refuse(request)
            if reason is not None:
                _reply(conn, {"error": reason})
                # Stale code: exit, so the launcher starts a pool that imports the new code.
                return not reason.startswith("stale")
            pid = os.fork()
            if pid == 0:
                self._become_run_worker(conn, request)  # never returns
            _reply(conn, {"pid": pid, "start": process_start_ticks(pid)})
        return True

    def _refuse(self, request: dict[str, Any]) -> str | None:
        if os.path.realpath(str(request.get("python_file"))) != self.python_file:
            return f"the pool preloaded {self.python_file}, not {request.get('python_file')}"
        if os.path.realpath(str(request.get("working_directory"))) != self.working_directory:
            return f"the pool's working directory is {self.working_directory}"
        if not request.get("run_id") or not request.get("instance_ref"):
            return "bad request: run_id and instance_ref are required"
        changed = self.stale()
        return f"stale: {changed}" if changed else None

    def _become_run_worker(self, conn: socket.socket, request: dict[str, Any]) -> None:
        """In the forked child: execute the run as ``dagster api execute_run`` would, then exit."""
        code = 1
        try:
            conn.close()
            if self.listener is not None:
                self.listener.close()
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)  # the launcher's pipe belongs to the pool
            os.close(devnull)
            for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            os.environ[RUN_WORKER_ENV] = "1"
            code = run_worker(str(request["run_id"]), str(request["instance_ref"]))
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


def run_worker(run_id: str, serialized_instance_ref: str) -> int:
    """Execute the run `run_id` in this process, as ``dagster api execute_run`` does; the exit code."""
    from dagster import DagsterInstance
    from dagster._cli.api import _execute_run_command_body
    from dagster._core.instance.ref import InstanceRef
    from dagster._serdes import deserialize_value
    from dagster._utils.interrupts import capture_interrupts

    ref = deserialize_value(serialized_instance_ref, InstanceRef)
    with capture_interrupts(), DagsterInstance.from_ref(ref) as instance:
        return _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=False)


def _read_line(conn: socket.socket) -> bytes:
    chunks = []
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            break
    return b"".join(chunks)


def _reply(conn: socket.socket, answer: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(answer).encode() + b"\n")


def main(argv: list[str] | None = None) -> int:
    """``python -m launcher --address NAME --python-file FILE --working-directory DIR``."""
    parser = argparse.ArgumentParser(description="Pre-warmed Dagster run-worker pool")
    parser.add_argument("--address", required=True, help="abstract socket name (without the leading NUL)")
    parser.add_argument("--python-file", required=True)
    parser.add_argument("--working-directory", required=True)
    args = parser.parse_args(argv)
    # Ctrl-C or SIGTERM to the process group ends the pool quietly; its run workers handle their own.
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Children are reaped as they exit: the launcher checks their health through /proc, not waitpid.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    pool = Pool("\0" + args.address, args.python_file, args.working_directory)
    pool.preload()
    if not pool.bind():
        return 0  # another pool serves this instance
    pool.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
