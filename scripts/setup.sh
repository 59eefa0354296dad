#!/usr/bin/env bash
# Creates .venv in the repo and installs laminar-orchestration into it, saying what it does.
# Usage: scripts/setup.sh [dev]   ("dev" adds the test and lint tools)
# pip's own output goes to .venv/setup.log (shown if a step fails); a later run with the same
# pyproject.toml skips the install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
extra=""
[ "${1:-}" = "dev" ] && extra="[dev]"
step() { printf 'setup: %s\n' "$*"; }
run_logged() {
  if ! "$@" >>.venv/setup.log 2>&1; then
    echo "setup: failed: $*; the end of .venv/setup.log:" >&2
    tail -n 30 .venv/setup.log >&2
    exit 1
  fi
}
if [ ! -x .venv/bin/python ]; then
  step "creating .venv with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.laminar-setup-${extra:-base}"
wanted="$(cksum <pyproject.toml)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && [ -x .venv/bin/laminar ]; then
  step "laminar-orchestration${extra} already installed in .venv (pyproject.toml unchanged)"
  exit 0
fi
: >.venv/setup.log
step "upgrading pip"
run_logged .venv/bin/python -m pip install --upgrade pip
step "installing laminar-orchestration${extra} and its dependencies (PySpark, Dagster, ...: a minute or two the first time)"
started=$SECONDS
# Editable: the demo and the Dagster code location run from this checkout. setuptools' notice
# about editable installs goes to the log with the rest of the build's output.
run_logged .venv/bin/python -m pip install --progress-bar off -e ".${extra}"
echo "$wanted" >"$stamp"
step "installed in $((SECONDS - started))s (details in .venv/setup.log)"
