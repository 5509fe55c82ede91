#!/usr/bin/env bash
# The README's main-job command: install into a fresh virtual environment, then run a
# local cluster (2 reducers, 2 workers) doing all-reduces and printing results and bandwidth.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e .
reduction-server launch --workers "${WORKERS:-2}" --reducers "${REDUCERS:-2}" -- python examples/allreduce_numpy.py "$@"
