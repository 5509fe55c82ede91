#!/usr/bin/env bash
# The README's test command: a fresh virtual environment with the package (C++ core
# built in place) and every test dependency, then the whole suite.
#
# `scripts/test.sh --lint [PYTEST ARGS]` (what CI runs) also runs scripts/lint.sh once the
# environment is ready, before the tests, and stops there if a check fails. Other arguments go to pytest.
#
# Run as root on a system with apt-get, it installs clang and ccache when they are missing
# (it says so first; NO_APT=1 skips it). Without them the fuzz test is skipped and rebuilds are slower.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==> scripts/test.sh: %s\n' "$*"; }
lint=0
if [ "${1:-}" = "--lint" ]; then lint=1; shift; fi
n=$((4 + lint))  # the number of stages

# System tools some tests use: clang (libFuzzer, for the bounded fuzz run of the wire parsers),
# ccache (the image test rebuilds the core from a copy of the tree) and python3-simgrid (the
# simulator's engine; its tests skip without it).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ -z "${NO_APT:-}" ]; then
  missing=()
  command -v clang++ >/dev/null 2>&1 || missing+=(clang)
  command -v ccache >/dev/null 2>&1 || missing+=(ccache)
  # SimGrid for `reduction-server simulate` (tests/test_simulate.py; about 10 s to install)
  compgen -G "/usr/lib/python3/dist-packages/simgrid.cpython-*.so" >/dev/null || missing+=(python3-simgrid)
  if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]} system-wide with apt-get (running as root; NO_APT=1 skips this)"
    if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >/dev/null 2>&1; then
      echo "installed: ${missing[*]}"
    else
      echo "scripts/test.sh: could not install ${missing[*]}; continuing without" >&2
    fi
  fi
fi
if command -v ccache >/dev/null 2>&1; then
  export CC="${CC:-ccache gcc}" CXX="${CXX:-ccache g++}"
fi
step "[1/$n] virtual environment .venv (python3 -m venv)"
python3 -m venv .venv
. .venv/bin/activate
step "[2/$n] upgrading pip"
python -m pip install --upgrade pip
# torch is pinned to the CPU build (a newer torch would pull a multi-GB CUDA build).
step "[3/$n] installing the package with its test dependencies and torch (CPU); compiling the C++ core takes about 2 minutes on 2 cores"
python -m pip install -e ".[test]" "torch==2.13.0"
if [ "$lint" = 1 ]; then
  step "[4/$n] static checks: scripts/lint.sh (ruff, mypy, clang-format)"
  bash scripts/lint.sh
fi
step "[$n/$n] running the test suite: python -m pytest $*"
python -m pytest "$@"
