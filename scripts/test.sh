#!/usr/bin/env bash
# The README's test command: a fresh virtual environment with the package (C++ core
# built in place) and every test dependency, then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# torch is pinned to the CPU build (a newer torch would pull a multi-GB CUDA build).
python -m pip install --quiet -e ".[test]" "torch==2.13.0"
python -m pytest "$@"
