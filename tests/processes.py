"""Subprocesses for tests: a command run to its end with its output as text, the `laminar` CLI, a free
port to serve on, and what a process's /metrics says."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

#: Every sample of a scrape: (name, sorted labels) -> value.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def run_text(
    argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `argv` with stdout and stderr captured as text; the exit code is the caller's to judge."""
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def laminar(
    *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`laminar ARGS...` as a user runs it: a fresh interpreter, this process's environment unless `env`."""
    return run_text([sys.executable, "-m", "laminar_orchestration.cli", *args], cwd=cwd, env=env, timeout=timeout)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at this moment."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def samples(text: str) -> Samples:
    """Every sample of a scrape's text: (name, sorted labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(url: str) -> Samples:
    """Every sample at a /metrics URL."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        return samples(resp.read().decode())
