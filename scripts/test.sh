#!/usr/bin/env bash
# The README's test command: a fresh virtual environment with the package (C++ core
# built in place) and every test dependency, then the whole suite.
#
# Run as root on a system with apt-get, it installs clang and ccache when they are missing
# (it says so first; NO_APT=1 skips it). Without them the fuzz test is skipped and rebuilds are slower.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==> scripts/test.sh: %s\n' "$*"; }

# System tools some tests use: clang (libFuzzer, for the bounded fuzz run of the wire parsers)
# and ccache (the image test rebuilds the core from a copy of the tree).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ -z "${NO_APT:-}" ]; then
  missing=()
  command -v clang++ >/dev/null 2>&1 || missing+=(clang)
  command -v ccache >/dev/null 2>&1 || missing+=(ccache)
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
step "[1/4] virtual environment .venv (python3 -m venv)"
python3 -m venv .venv
. .venv/bin/activate
step "[2/4] upgrading pip"
python -m pip install --upgrade pip
# torch is pinned to the CPU build (a newer torch would pull a multi-GB CUDA build).
step "[3/4] installing the package with its test dependencies and torch (CPU); compiling the C++ core takes about 2 minutes on 2 cores"
python -m pip install -e ".[test]" "torch==2.13.0"
step "[4/4] running the test suite: python -m pytest $*"
python -m pytest "$@"
