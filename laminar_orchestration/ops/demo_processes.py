"""The demo's processes: nodes and Dagster as child processes, and the producer thread."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.nudge import SourceDoorbell
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import StoreError, open_store

# --- child processes ---------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _child_setup(parent_pid: int) -> Callable[[], None]:
    """A preexec function: the child gets SIGTERM when the demo dies (Linux), even by SIGKILL."""
    libc = None
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            libc = ctypes.CDLL(None, use_errno=True)  # loaded here, in the parent: no dlopen after fork

    def setup() -> None:
        # An ignored SIGTERM survives exec: a demo started with it ignored would leave its children behind.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)  # the demo died before the death signal was armed

    return setup


class Child:
    """One process the demo started: its own session, its output in a log file."""

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str],
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 - closed by close()
        try:
            self.proc = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=cwd,
                # Own session: Ctrl-C in the terminal reaches only the demo, which stops children in order;
                # the process group collects the child's own children (Spark JVM, code servers) for cleanup.
                start_new_session=True,
                preexec_fn=_child_setup(os.getpid()),
            )
        except OSError:
            self._log.close()
            raise
        self.exit_reported = False
        #: True once `kill_group` ran: the group is gone and its id may be reused, never signal it again.
        self.cleaned = False

    @property
    def pid(self) -> int:
        """The child's process id (also its process group id)."""
        return self.proc.pid

    def running(self) -> bool:
        """True while the process has not exited."""
        return self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the process itself (not its group)."""
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def wait(self, timeout: float, hurry: Callable[[], bool] = lambda: False) -> int | None:
        """Wait up to `timeout` s for the exit (less once `hurry()`); the exit code or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not hurry():
            try:
                return self.proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.poll()

    def group_alive(self) -> bool:
        """True while any process of the child's process group (it, or what it started) is left."""
        if self.cleaned:
            return False
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def wait_group(self, timeout: float, hurry: Callable[[], bool] = lambda: False) -> bool:
        """Wait up to `timeout` s for the process group to empty; True when it did."""
        deadline = time.monotonic() + timeout
        while self.group_alive():
            if time.monotonic() >= deadline or hurry():
                return False
            time.sleep(0.2)
        return True

    def kill_group(self) -> None:
        """SIGKILL the process and anything left in its process group; reap it."""
        self.cleaned = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            if self.running():
                os.kill(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def close(self) -> None:
        """Close the log file."""
        self._log.close()

    def tail(self, chars: int = 2000) -> str:
        """The end of the child's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def describe_exit(self) -> str:
        """'exit code N' or 'killed by SIGKILL'."""
        code = self.proc.returncode
        if code is None:
            return "running"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"


# --- the load ---------------------------------------------------------------------------


class Producer(threading.Thread):
    """Appends about `rate` generated events per second to the source log, once a second."""

    def __init__(self, store_url: str, partitions: int, rate: float, keys: int, say: Callable[[str], None]) -> None:
        super().__init__(name="laminar-demo-producer", daemon=True)
        self.store_url = store_url
        self.partitions = partitions
        self.rate = rate
        self.keys = keys
        self.produced = 0
        self._say = say
        self._stop_event = threading.Event()

    def stop(self) -> None:
        """Stop after the append in progress, if any."""
        self._stop_event.set()
        self.join(30)

    def run(self) -> None:
        store = open_store(self.store_url)
        # The doorbell tells each partition's owner its log grew: it reads at once instead of polling.
        doorbell = SourceDoorbell(ReadStore(store))
        log = SourceLog(store, partitions=self.partitions, doorbell=doorbell)
        try:
            self._produce(log)
        finally:
            doorbell.close()

    def _produce(self, log: SourceLog) -> None:
        seed = int(time.time())
        owed = 0.0
        last = time.monotonic()
        failing = False
        while not self._stop_event.wait(1.0):
            t = time.monotonic()
            owed += self.rate * (t - last)
            last = t
            count = int(owed)
            if count == 0:
                continue
            try:
                # Real event times, so `laminar query` shows when things arrived.
                tables = generate_events(count, self.keys, seed, self.partitions, start_ts=int(time.time() * 1000))
                seed += 1
                appended = log.append_many({p: table for p, table in tables.items() if table.num_rows})
                self.produced += sum(r.events for r in appended.values())
                owed -= count
                if failing:
                    self._say("producer: appending again")
                failing = False
            except StoreError as exc:
                if not failing:
                    self._say(f"producer: append failed, retrying: {exc}")
                failing = True
