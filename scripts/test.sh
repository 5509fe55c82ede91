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
n=$((5 + lint))  # the number of stages

# System tools some tests use: clang (libFuzzer, for the bounded fuzz run of the wire parsers),
# ccache (the image test rebuilds the core from a copy of the tree) and python3-simgrid (the
# simulator's engine; its tests skip without it).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ -z "${NO_APT:-}" ]; then
  missing=()
  command -v clang++ >/dev/null 2>&1 || missing+=(clang)
  command -v ccache >/dev/null 2>&1 || missing+=(ccache)
  # SimGrid for `reduction-server simulate` (tests/simulate/test_simulate.py; about 10 s to install)
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
. scripts/install-lib.sh
rs_use_ccache
step "[1/$n] virtual environment .venv (python3 -m venv)"
python3 -m venv .venv
. .venv/bin/activate
step "[2/$n] upgrading pip"
python -m pip install --upgrade pip
# torch: the CPU-only build, pinned (the default build on PyPI bundles CUDA: gigabytes). First as
# `torch==2.13.0+cpu`, which a local wheel cache or a configured index (pip's find-links /
# extra-index-url) answers offline; where none has it, from PyTorch's CPU-only index
# (RS_TORCH_INDEX_URL overrides it). Installed before the package so that nothing pulls another build.
torch_cpu="torch==2.13.0+cpu"
step "[3/$n] installing torch 2.13.0, CPU-only build"
if ! python -m pip install "$torch_cpu"; then
  echo "scripts/test.sh: $torch_cpu is in no local cache or configured index; trying PyTorch's CPU-only index" >&2
  python -m pip install --index-url "${RS_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" "$torch_cpu"
fi
step "[4/$n] installing the package with its test dependencies; compiling the C++ core takes about 2 minutes on 2 cores"
rs_pip_install -e ".[test]" "$torch_cpu"
if [ "$lint" = 1 ]; then
  step "[5/$n] static checks: scripts/lint.sh (ruff, mypy, clang-format)"
  bash scripts/lint.sh
fi
step "[$n/$n] running the test suite: python -m pytest $*"
python -m pytest "$@"
