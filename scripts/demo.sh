#!/usr/bin/env bash
# Sets up .venv, then runs the demo on the embedded local store: 3 nodes, 4
# partitions, a steady load, Dagster's webserver and daemon. Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "setup: starting the demo (.venv/bin/laminar demo $*)"
exec .venv/bin/laminar demo "$@"
