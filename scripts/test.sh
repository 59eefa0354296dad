#!/usr/bin/env bash
# Sets up .venv with the dev tools, then runs lint, type checks and the test suite.
# Usage: scripts/test.sh [--fast] [pytest args...]
#   --fast  only the tests that need no Spark, no Dagster instance, no subprocess and no minutes
#           (pytest -m "not spark and not dagster and not processes and not slow"); CI runs them all.
set -euo pipefail
cd "$(dirname "$0")/.."
# Keep compiled modules (in the git-ignored __pycache__ folders): with PYTHONDONTWRITEBYTECODE set, every
# pytest worker rewrites every test module's asserts again on every run (a fast-tier worker's collection
# takes 28 s instead of 12).
unset PYTHONDONTWRITEBYTECODE
marks=()
# Two workers for the whole suite: its Spark scenarios keep both cores busy, and a third would only
# stretch their heartbeat and move deadlines. The fast tier's tests mostly wait on the S3-protocol
# server and on threads: three workers keep both cores busy (4:04 against 4:49 with two, 4:13 with four).
workers=2
if [ "${1:-}" = "--fast" ]; then
  shift
  marks=(-m "not spark and not dagster and not processes and not slow")
  workers=3
fi
scripts/setup.sh dev
# The browser walkthrough test drives the Dagster UI in headless Chromium (Debian packages; CI runs as root).
if [ ${#marks[@]} -eq 0 ] && { ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; }; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing chromium and chromium-driver for the browser test (apt-get)"
    # A failed install fails the browser test alone (it names what is missing), not every other test.
    { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; } ||
      echo "could not install chromium; the browser test will fail"
  else
    echo "no chromium/chromedriver: the browser test is skipped here (fails on CI); apt-get install chromium chromium-driver"
  fi
fi
# The Dagster-on-PostgreSQL tests start a PostgreSQL server of their own (Debian's postgresql; CI runs as root).
if [ ${#marks[@]} -eq 0 ] && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && ! command -v initdb >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing postgresql for the Dagster-on-PostgreSQL tests (apt-get)"
    # A failed install fails those tests alone (they name what is missing), not every other test.
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } ||
      echo "could not install postgresql; the Dagster-on-PostgreSQL tests will fail"
  else
    echo "no PostgreSQL: the Dagster-on-PostgreSQL tests will fail; apt-get install postgresql"
  fi
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
if [ ${#marks[@]} -eq 0 ]; then
  # Once per machine: every Spark driver the suite starts then maps the classes instead of loading them.
  echo "preparing the Spark class archive (nodes then start on about half the JVM CPU)"
  .venv/bin/python -m laminar_orchestration.ops.class_archive 2>&1 | grep -v "WARN NativeCodeLoader" ||
    echo "no Spark class archive: the suite runs without it"
fi
# One test file a worker at a time: most tests wait on real processes (heartbeat timeouts, Spark,
# Dagster), so files side by side take about half the time of one after the other. Files in the
# order tests/conftest.py gives them (the costliest by their marks first), not by their number of tests.
.venv/bin/pytest -q -n "$workers" --dist loadfile --no-loadscope-reorder --durations=15 ${marks[@]+"${marks[@]}"} "$@"
