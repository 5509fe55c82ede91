#!/usr/bin/env bash
# The README's main-job command: install into a fresh virtual environment, then run a
# local cluster (2 reducers, 2 workers) doing all-reduces and printing results and bandwidth.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==> scripts/run-local.sh: %s\n' "$*"; }
. scripts/install-lib.sh
rs_use_ccache
step "[1/4] virtual environment .venv (python3 -m venv)"
python3 -m venv .venv
. .venv/bin/activate
step "[2/4] upgrading pip"
python -m pip install --upgrade pip
step "[3/4] installing the package and its dependencies; compiling the C++ core takes about 2 minutes on 2 cores"
rs_pip_install -e .
step "[4/4] reduction-server launch --workers ${WORKERS:-2} --reducers ${REDUCERS:-2} -- python examples/allreduce_numpy.py $*"
reduction-server launch --workers "${WORKERS:-2}" --reducers "${REDUCERS:-2}" -- python examples/allreduce_numpy.py "$@"
