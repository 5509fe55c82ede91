# Shared by scripts/run-local.sh and scripts/test.sh (sourced, not run): how they install the package.
#
# rs_use_ccache: compile through ccache when it is installed, so the second set-up command (or a
#   re-run) reuses the first one's objects instead of compiling the core again.
# rs_pip_install ARGS...: `python -m pip install ARGS` that shows the C++ compile as it goes (one
#   line per source file, instead of minutes of silence) and pip's own summary; pip's whole verbose
#   log is kept in a temporary file and its last 60 lines are printed if the install fails.

rs_use_ccache() {
  if command -v ccache >/dev/null 2>&1; then
    export CC="${CC:-ccache gcc}" CXX="${CXX:-ccache g++}"
  fi
}

rs_pip_install() {
  local log status
  log=$(mktemp "${TMPDIR:-/tmp}/rs-pip-install.XXXXXX")
  set +e
  python -m pip install -v "$@" 2>&1 | tee "$log" |
    sed -un -e 's|.* -c \(csrc/[^ ]*\.cc\) .*|  compiling \1|p' -e '/^Successfully installed/p' \
      -e '/^\(ERROR\|error\):/p' -e '/^Requirement already satisfied: reduction-server/p'
  status=${PIPESTATUS[0]}
  set -e
  if [ "$status" != 0 ]; then
    echo "pip install failed (exit $status); the last lines of its log ($log):" >&2
    tail -60 "$log" >&2
    return "$status"
  fi
  rm -f "$log"
}
