#!/usr/bin/env bash
# Sets up .venv with the dev tools, then runs lint, type checks and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/pytest -q --durations=15 "$@"
