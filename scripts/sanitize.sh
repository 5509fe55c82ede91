#!/usr/bin/env bash
# The reducer under AddressSanitizer + UndefinedBehaviorSanitizer.
#
#   scripts/sanitize.sh            protocol, fault, all-reduce, attack and integrity tests (several minutes)
#   scripts/sanitize.sh --fast     only the tests marked `sanitize` (the CI subset, ~1-2 min + build)
#   scripts/sanitize.sh [--fast] -- PYTEST_ARGS...   extra pytest arguments
#
# Builds reducer._core with -fsanitize=address,undefined in a copy of the source tree
# (build/sanitize/src; RS_SANITIZE_DIR overrides build/sanitize), so the normal in-place
# build is never touched, then runs pytest there with libasan/libubsan/libstdc++ preloaded
# (a sanitized extension inside an unsanitized Python needs the runtime loaded first).
# Leak detection is off (Python itself "leaks" at exit); any other report aborts the process
# that hit it. Reports from every process (workers, reducer subprocesses) are written to
# build/sanitize/reports/ and printed; the script exits non-zero on a test failure or on any
# report. Tests that measure RSS or CPU time are left out: the sanitizers change both.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out="${RS_SANITIZE_DIR:-$root/build/sanitize}"
fast=0
if [[ "${1:-}" == "--fast" ]]; then fast=1; shift; fi
if [[ "${1:-}" == "--" ]]; then shift; fi

# 1. A copy of the working tree (tracked and untracked-but-not-ignored files).
mkdir -p "$out/src" "$out/reports"
rm -f "$out"/reports/*
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -co --exclude-standard -z | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$out/src"
else
  cp -r csrc reducer tests setup.py pyproject.toml "$out/src/"
fi
rm -f "$out"/src/reducer/_core*.so

# 2. The sanitized build (ccache, if CC/CXX use it, keeps re-runs fast).
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
# setuptools compiles C++ with CXXFLAGS (CFLAGS alone links the runtime but instruments nothing);
# objects of an earlier build in the copy are dropped so that every one is built with the flags.
rm -rf "$out/src/build"
(cd "$out/src" && CFLAGS="$san" CXXFLAGS="$san" LDFLAGS="$san" python setup.py -q build_ext --inplace >"$out/build.log" 2>&1) || {
  tail -50 "$out/build.log" >&2
  echo "sanitize.sh: the sanitized build failed (log: $out/build.log)" >&2
  exit 1
}
# The build must really be instrumented: an ASan-compiled object calls __asan_report_* on a bad access.
# (grep reads all of nm's output: with -q it could exit first, and pipefail would count nm's SIGPIPE.)
if ! nm -D "$out"/src/reducer/_core*.so | grep "__asan_report" >/dev/null; then
  echo "sanitize.sh: the extension is not instrumented (no __asan_report_* references): check the compiler flags" >&2
  exit 1
fi
# The NCCL plugin (reducer/lib) is built by the same build_ext with the same flags: it runs inside
# the training process, so its tests (the p2p net's fault and attack tests) run sanitized too.
if ! nm -D "$out"/src/reducer/lib/libnccl-net-reduction-server.so | grep "__asan_report" >/dev/null; then
  echo "sanitize.sh: the NCCL plugin is not instrumented (no __asan_report_* references)" >&2
  exit 1
fi

# 3. The tests, with the sanitizer runtimes preloaded.
gxx="${SANITIZE_CXX:-g++}"
runtime() { readlink -f "$("$gxx" -print-file-name="$1")"; }
export LD_PRELOAD="$(runtime libasan.so) $(runtime libubsan.so) $(runtime libstdc++.so)"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=0:log_path=$out/reports/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$out/reports/ubsan"
export PYTHONPATH="$out/src${PYTHONPATH:+:$PYTHONPATH}"
tests=(tests/protocol/test_protocol.py tests/client/test_faults.py tests/client/test_allreduce.py tests/server/test_attacks.py tests/protocol/test_integrity.py
       tests/client/test_failover.py tests/server/test_tenant_budget.py tests/client/test_worker_lies.py tests/client/test_cross_group_failover.py
       tests/nccl_plugin/test_nccl_plugin_p2p_faults.py tests/nccl_plugin/test_nccl_plugin_listener.py tests/client/test_idle_waits.py tests/client/test_fork.py)
# RSS and CPU-time bounds do not hold under the sanitizers (shadow memory, quarantine, slowdown).
skip="not memory_budget and not huge_world and not never_reads and not descriptor_exhaustion"
if [[ $fast == 1 ]]; then
  select=(-m sanitize -k "$skip")
else
  select=(-k "$skip")
fi
set +e
(cd "$out/src" && python -m pytest -q -p no:cacheprovider --timeout 600 "${select[@]}" "${tests[@]}" "$@")
status=$?
set -e

reports=$(find "$out/reports" -type f -size +0 2>/dev/null | sort)
if [[ -n "$reports" ]]; then
  for f in $reports; do
    echo "==== $f" >&2
    head -60 "$f" >&2
  done
  echo "sanitize.sh: sanitizer reports found (above, in $out/reports/)" >&2
  exit 1
fi
if [[ $status -ne 0 ]]; then
  echo "sanitize.sh: tests failed under the sanitizers (pytest exit $status)" >&2
  exit "$status"
fi
echo "sanitize.sh: clean"
