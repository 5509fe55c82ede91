#!/usr/bin/env bash
# Coverage-guided fuzzing of the wire parsers (csrc/fuzz/wire_fuzz.cc) with libFuzzer,
# AddressSanitizer and UBSan.
#
#   scripts/fuzz.sh [SECONDS] [libFuzzer flags...]     (default 60 s)
#
# Needs clang (Debian/Ubuntu: `apt-get install clang`; its compiler-rt ships libFuzzer).
# Builds into build/fuzz/ (never touches the Python extension), seeds build/fuzz/corpus
# with valid messages made by the reducer's own encoders, runs for SECONDS and exits
# non-zero if libFuzzer found a crash, a sanitizer report or a broken invariant; the input
# that triggered it is kept in build/fuzz/artifacts/. The corpus is kept between runs.
# RS_FUZZ_DIR overrides build/fuzz; RS_FUZZ_JOBS runs that many fuzzing processes (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
out="${RS_FUZZ_DIR:-build/fuzz}"
jobs="${RS_FUZZ_JOBS:-1}"

CXX_FUZZ="${CXX_FUZZ:-$(command -v clang++ || command -v clang++-14 || true)}"
if [[ -z "$CXX_FUZZ" ]]; then
  echo "fuzz.sh: clang++ not found (apt-get install clang)" >&2
  exit 77
fi

mkdir -p "$out/corpus" "$out/artifacts" "$out/obj"
common=(-std=c++17 -g -O1 -Icsrc -fno-omit-frame-pointer)
# The parsers' helpers (dtype table in csrc/kernels, errno text in csrc/common) are built
# with the project's compiler (g++: the SIMD kernels use GCC target attributes clang 14
# rejects) and without coverage; only the code under test is instrumented for libFuzzer.
helpers=(csrc/kernels/dispatch.cc csrc/kernels/scalar.cc csrc/kernels/avx2.cc csrc/kernels/avx512.cc
         csrc/common/common.cc csrc/common/dtype.cc)
objs=()
for src in "${helpers[@]}"; do
  obj="$out/obj/$(basename "${src%.cc}").o"
  "${CXX_HELPERS:-g++}" "${common[@]}" -c "$src" -o "$obj"
  objs+=("$obj")
done
"$CXX_FUZZ" "${common[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  csrc/fuzz/wire_fuzz.cc csrc/protocol/wire.cc csrc/protocol/plan.cc csrc/protocol/auth.cc csrc/protocol/hmac.cc \
  csrc/server/handshake.cc "${objs[@]}" -o "$out/wire_fuzz"
"$CXX_FUZZ" "${common[@]}" csrc/fuzz/make_seeds.cc csrc/protocol/wire.cc csrc/protocol/plan.cc csrc/protocol/auth.cc \
  csrc/protocol/hmac.cc "${objs[@]}" -o "$out/make_seeds"
"$out/make_seeds" "$out/corpus"

log="$out/fuzz.log"
parallel=()
if [[ "$jobs" != 1 ]]; then parallel=(-jobs="$jobs" -workers="$jobs"); fi
set +e
ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}" \
UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}" \
  "$out/wire_fuzz" -max_total_time="$seconds" -max_len=4400 -timeout=10 -rss_limit_mb=1024 \
  -print_final_stats=1 -artifact_prefix="$out/artifacts/" "${parallel[@]}" \
  "$@" "$out/corpus" >"$log" 2>&1
status=$?
set -e
if [[ "$jobs" != 1 ]]; then cat fuzz-*.log >>"$log" 2>/dev/null && rm -f fuzz-*.log; fi  # libFuzzer's job logs
# Summary: the last status line and the final stats.
grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -1 || true
grep -E '^stat::' "$log" || true
echo "corpus: $(ls "$out/corpus" | wc -l) inputs; log: $log"
if [[ $status -ne 0 ]] || grep -qE 'ERROR: (AddressSanitizer|libFuzzer|UndefinedBehaviorSanitizer)|runtime error:' "$log"; then
  echo "fuzz.sh: FAILED (status $status); inputs in $out/artifacts/:" >&2
  ls "$out/artifacts" >&2 || true
  grep -E 'ERROR:|runtime error:|SUMMARY' "$log" | head -20 >&2 || true
  exit 1
fi
echo "fuzz.sh: no crash in ${seconds}s"
