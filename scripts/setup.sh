#!/usr/bin/env bash
# Creates .venv in the repo and installs laminar-orchestration into it.
# Usage: scripts/setup.sh [dev]   ("dev" adds the test and lint tools)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if [ "${1:-}" = "dev" ]; then
  .venv/bin/python -m pip install --quiet -e ".[dev]"
else
  .venv/bin/python -m pip install --quiet -e .
fi
