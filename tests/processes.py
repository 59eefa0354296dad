"""Subprocesses for tests: a command run to its end with its output as text, and the `laminar` CLI."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_text(
    argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `argv` with stdout and stderr captured as text; the exit code is the caller's to judge."""
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def laminar(
    *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`laminar ARGS...` as a user runs it: a fresh interpreter, this process's environment unless `env`."""
    return run_text([sys.executable, "-m", "laminar_orchestration.cli", *args], cwd=cwd, env=env)
