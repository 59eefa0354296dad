#!/usr/bin/env bash
# Sets up .venv with the dev tools, then runs lint, type checks and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# Two workers, one test file each at a time: most tests wait on real processes (heartbeat
# timeouts, Spark, Dagster), so two files side by side take about half the time of one after the other.
# Files in the order tests/conftest.py gives them (the longest first), not by their number of tests.
.venv/bin/pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 "$@"
