#!/usr/bin/env bash
# The project's static checks (CI runs them before the tests: `scripts/test.sh --lint`):
#   ruff check          lint of reducer/, benchmarks/, tests/, scripts/ ([tool.ruff] in pyproject.toml)
#   ruff format --check the Python formatting
#   mypy                types of reducer/ ([tool.mypy])
#   clang-format        csrc/ C++ formatting (.clang-format), --dry-run --Werror
# `scripts/lint.sh --fix` applies what can be applied instead: ruff check --fix, ruff format,
# clang-format -i; then runs the checks, so what is left needs a hand.
#
# The tools are pinned once, in the `lint` extra of pyproject.toml; whichever is missing from the
# active virtual environment (else .venv, as scripts/test.sh makes it) or at another version is
# installed there first with pip, saying so. mypy checks against the installed dependencies
# (numpy, torch, grpc...): run it in the test environment. Exit status: 0 when every check passes, else 1.
set -euo pipefail
cd "$(dirname "$0")/.."

fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
  *) echo "usage: scripts/lint.sh [--fix]" >&2; exit 2 ;;
esac

if [ -z "${VIRTUAL_ENV:-}" ]; then
  if [ -f .venv/bin/activate ]; then
    . .venv/bin/activate
  else
    echo "scripts/lint.sh: no virtual environment active and no .venv (make one with scripts/test.sh)" >&2
    exit 2
  fi
fi

# "ruff==X.Y.Z" "mypy==..." "clang-format==..." from the lint extra (the one place they are pinned).
mapfile -t pins < <(sed -n '/^lint = \[/,/\]/p' pyproject.toml | grep -oE '"[a-z-]+==[^"]+"' | tr -d '"')
if [ ${#pins[@]} -ne 3 ]; then
  echo "scripts/lint.sh: expected 3 pinned tools in the lint extra of pyproject.toml, found: ${pins[*]:-none}" >&2
  exit 2
fi
need=()
for pin in "${pins[@]}"; do
  have=$(python -m pip show "${pin%%==*}" 2>/dev/null | sed -n 's/^Version: //p' || true)  # empty: not installed
  [ "$have" = "${pin##*==}" ] || need+=("$pin")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "==> scripts/lint.sh: installing ${need[*]} into $VIRTUAL_ENV"
  python -m pip install "${need[@]}"
fi

# C++ sources: everything under csrc/ (nothing there is vendored or generated).
mapfile -t cxx < <(find csrc -type f \( -name '*.h' -o -name '*.cc' -o -name '*.inc' \) | sort)
py=(reducer benchmarks tests scripts)

if [ "$fix" = 1 ]; then
  ruff check --fix "${py[@]}" || true
  ruff format "${py[@]}"
  clang-format -i "${cxx[@]}"
fi

failed=()
run() {
  local name=$1
  shift
  echo "==> scripts/lint.sh: $name"
  if ! "$@"; then failed+=("$name"); fi
}
run "ruff check" ruff check "${py[@]}"
run "ruff format --check" ruff format --check "${py[@]}"
run "mypy" mypy
run "clang-format (${#cxx[@]} files under csrc/)" clang-format --dry-run --Werror "${cxx[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'scripts/lint.sh: FAILED: %s\n' "${failed[@]}" >&2
  [ "$fix" = 1 ] || echo "scripts/lint.sh: \`scripts/lint.sh --fix\` applies the fixes and formatting it can" >&2
  exit 1
fi
echo "scripts/lint.sh: all checks passed"
