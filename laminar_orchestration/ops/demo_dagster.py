"""The demo's Dagster: where the code location is, the webserver and daemon as child processes, and readiness.

The code location (``assets/``, ``jobs/``, ``sensors/``, ``resources/``) is part
of the repository checkout, not of the installed package: `find_code_location`
looks for it. The webserver and the daemon run on it with ``DAGSTER_HOME`` in
the demo directory and ``LAMINAR_STORE`` pointing at the demo's store
(`dagster_env`), so the UI launches migrations and the failure sensor fails over
a killed node.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from laminar_orchestration.ops.demo_processes import Child
from laminar_orchestration.ops.errors import DemoError

__all__ = [
    "CODE_LOCATION_FILES",
    "WEBSERVER_START_TIMEOUT_S",
    "check_port_free",
    "dagster_env",
    "dagster_executables",
    "find_code_location",
    "start_daemon",
    "start_webserver",
    "warm_run_launcher",
    "webserver_answers",
]

#: How long the webserver gets to answer its first request.
WEBSERVER_START_TIMEOUT_S = 180.0
#: What makes a directory the Dagster code location: the workspace and the definitions beside it.
CODE_LOCATION_FILES = ("workspace.yaml", "definitions.py")


def find_code_location(start: Path | None = None) -> Path | None:
    """The repository checkout holding the Dagster code location (``workspace.yaml``, ``definitions.py``).

    The code location (``assets/``, ``jobs/``, ``sensors/``, ``resources/``) is
    part of the repository, not of the installed package: it is looked for in
    `start` (default: the working directory) and its parents, then beside the
    package (an editable install). None when neither holds it.
    """
    here = (start or Path.cwd()).resolve()
    package = Path(__file__).resolve().parents[1]  # laminar_orchestration/ (this module is in ops/)
    for root in (here, *here.parents, package.parent):
        if all((root / name).is_file() for name in CODE_LOCATION_FILES):
            return root
    return None


def _executable(name: str) -> str | None:
    # The venv's own script first: the demo may run as .venv/bin/laminar without an activated venv.
    beside = Path(sys.executable).with_name(name)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def dagster_executables(
    code_location: Path | None, base_dir: Path | None, say: Callable[[str], None]
) -> tuple[str, str] | None:
    """The webserver's and the daemon's executables; None (and a line saying why) when the demo runs
    without Dagster: no code location found from `base_dir`, or Dagster's scripts not installed."""
    if code_location is None:
        where = (base_dir or Path.cwd()).resolve()
        say(
            "  no Dagster: the Dagster code location (workspace.yaml, definitions.py, assets/, jobs/, sensors/) "
            f"is part of the repository checkout, not the installed package, and {where} is not in one. "
            "Run the demo from a checkout (scripts/demo.sh) for the Dagster UI."
        )
        return None
    web, daemon = _executable("dagster-webserver"), _executable("dagster-daemon")
    if web is None or daemon is None:
        say("  no Dagster: dagster-webserver / dagster-daemon not found; running without the UI")
        return None
    return web, daemon


def dagster_env(
    root: Path,
    demo_dir: Path,
    store_url: str,
    *,
    heartbeat_timeout_s: float,
    spark_master: str,
    metrics_port: int | None,
) -> dict[str, str]:
    """The environment of the webserver and daemon on the code location at `root`, with ``DAGSTER_HOME``
    created in `demo_dir` (the code location's instance settings copied into it)."""
    home = demo_dir / "dagster_home"
    home.mkdir()
    # The code location's instance settings: runs launch on submit, sensors run in threads.
    settings = root / "dagster.yaml"
    if settings.exists():
        shutil.copyfile(settings, home / "dagster.yaml")
    else:
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\nnux:\n  enabled: false\n")
    return {
        **os.environ,
        "DAGSTER_HOME": str(home),
        # dagster.yaml's run launcher (launcher/) is imported from the checkout.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH", "")])),
        "LAMINAR_STORE": store_url,
        # The failure sensor judges liveness with the demo's short timeout.
        "LAMINAR_FAILOVER_HEARTBEAT_TIMEOUT_S": str(heartbeat_timeout_s),
        "LAMINAR_SPARK_MASTER": spark_master,
        # The code location serves the control plane's /metrics (resources/metrics.py).
        **({"LAMINAR_METRICS_PORT": str(metrics_port)} if metrics_port is not None else {}),
    }


def start_webserver(root: Path, executable: str, port: int, env: Mapping[str, str], demo_dir: Path) -> Child:
    """The Dagster webserver on the code location at `root`, serving 127.0.0.1:`port`."""
    cmd = [executable, "-w", str(root / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)]
    return Child("dagster webserver", cmd, demo_dir / "dagster-webserver.log", env=env, cwd=root)


def start_daemon(root: Path, executable: str, env: Mapping[str, str], demo_dir: Path) -> Child:
    """The Dagster daemon (schedules, sensors, run queue) on the code location at `root`."""
    cmd = [executable, "run", "-w", str(root / "workspace.yaml")]
    return Child("dagster daemon", cmd, demo_dir / "dagster-daemon.log", env=env, cwd=root)


def webserver_answers(port: int) -> bool:
    """Whether the webserver on 127.0.0.1:`port` answers ``/server_info`` (within a second)."""
    url = f"http://127.0.0.1:{port}/server_info"
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def warm_run_launcher(port: int) -> None:
    """Ask the webserver about its run launcher: building it starts the pool the first launch forks."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": "{ instance { runLauncher { name } } }"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with contextlib.suppress(OSError, urllib.error.URLError), urllib.request.urlopen(request, timeout=10.0):
        pass


def check_port_free(port: int) -> None:
    """Raise `DemoError` when 127.0.0.1:`port` is taken (before anything is created or started)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise DemoError(f"port {port} on 127.0.0.1 is in use ({exc.strerror}): pass --port") from None
