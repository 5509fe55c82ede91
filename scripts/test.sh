#!/usr/bin/env bash
# The README's test command: a fresh virtual environment with the package (C++ core
# built in place) and every test dependency, then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# System tools some tests use: clang (libFuzzer, for the bounded fuzz run of the wire parsers)
# and ccache (the image test rebuilds the core from a copy of the tree). Installed when missing
# and we may (root with apt); without them the fuzz test is skipped and rebuilds are slower.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  missing=()
  command -v clang++ >/dev/null 2>&1 || missing+=(clang)
  command -v ccache >/dev/null 2>&1 || missing+=(ccache)
  if [ ${#missing[@]} -gt 0 ]; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >/dev/null 2>&1 ||
      echo "scripts/test.sh: could not install ${missing[*]}; continuing without" >&2
  fi
fi
if command -v ccache >/dev/null 2>&1; then
  export CC="${CC:-ccache gcc}" CXX="${CXX:-ccache g++}"
fi
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# torch is pinned to the CPU build (a newer torch would pull a multi-GB CUDA build).
python -m pip install --quiet -e ".[test]" "torch==2.13.0"
python -m pytest "$@"
