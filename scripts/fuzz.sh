#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser of peer input with libFuzzer, AddressSanitizer and UBSan:
#   wire            csrc/fuzz/wire_fuzz.cc: the wire decoders (challenge, hello, reply, frame
#                   headers) and the reducer's decision on a hello
#   failover        csrc/fuzz/failover_fuzz.cc: the failover exchange's rows as a worker checks
#                   them (failover::check_summaries, Limits, Table, plan)
#   reducer_frames  csrc/fuzz/reducer_frames_fuzz.cc: the worker's parsing of what a reducer sends
#                   (handshake reply, RESULT, CLEAR, ERROR, BYE) and the quoting of reducer text
#   plugin_env      csrc/fuzz/plugin_env_fuzz.cc: what the NCCL plugin parses from its environment
#                   (its JSON reader, CLUSTER_SPEC / TF_CONFIG / RS_REDUCERS discovery, RS_* and
#                   NCCL_* settings): every malformed value an rs::Error(Config), nothing else
#
#   scripts/fuzz.sh [SECONDS] [libFuzzer flags...]     (default 60 s per target)
#
# Needs clang (Debian/Ubuntu: `apt-get install clang`; its compiler-rt ships libFuzzer).
# Builds into build/fuzz/ (never touches the Python extension), seeds each target's corpus
# (build/fuzz/corpus for wire, build/fuzz/corpus-<target> for the others) with valid inputs made
# by the project's own encoders, runs each target for SECONDS and exits non-zero if libFuzzer found
# a crash, a sanitizer report or a broken invariant; the input that triggered it is kept in
# build/fuzz/artifacts/<target>-*. Corpora are kept between runs. RS_FUZZ_DIR overrides build/fuzz;
# RS_FUZZ_TARGETS picks targets (default "wire failover reducer_frames plugin_env"); RS_FUZZ_JOBS runs that
# many fuzzing processes per target (default 1). Each target's summary starts with "== <target>".
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
out="${RS_FUZZ_DIR:-build/fuzz}"
jobs="${RS_FUZZ_JOBS:-1}"
targets="${RS_FUZZ_TARGETS:-wire failover reducer_frames plugin_env}"

CXX_FUZZ="${CXX_FUZZ:-$(command -v clang++ || command -v clang++-14 || true)}"
if [[ -z "$CXX_FUZZ" ]]; then
  echo "fuzz.sh: clang++ not found (apt-get install clang)" >&2
  exit 77
fi

mkdir -p "$out/artifacts" "$out/obj"
common=(-std=c++17 -g -O1 -Icsrc -fno-omit-frame-pointer)
fuzz=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
# The parsers' helpers (dtype table in csrc/kernels, errno text in csrc/common) are built
# with the project's compiler (g++: the SIMD kernels use GCC target attributes clang 14
# rejects) and without coverage; only the code under test is instrumented for libFuzzer.
helpers=(csrc/kernels/dispatch.cc csrc/kernels/scalar.cc csrc/kernels/avx2.cc csrc/kernels/avx512.cc
         csrc/common/common.cc csrc/common/dtype.cc)
# Builds run RS_BUILD_JOBS at a time (default: the number of cores); the helper objects through
# ccache where it is installed.
build_jobs="${RS_BUILD_JOBS:-$(nproc)}"
ccache=()
if command -v ccache >/dev/null 2>&1; then ccache=(ccache); fi
throttle() { while [[ $(jobs -rp | wc -l) -ge $build_jobs ]]; do wait -n || true; done; }
objs=()
pids=()
for src in "${helpers[@]}"; do
  obj="$out/obj/$(basename "${src%.cc}").o"
  throttle
  "${ccache[@]}" "${CXX_HELPERS:-g++}" "${common[@]}" -c "$src" -o "$obj" &
  pids+=($!)
  objs+=("$obj")
done
for pid in "${pids[@]}"; do wait "$pid"; done
protocol=(csrc/protocol/wire.cc csrc/protocol/plan.cc csrc/protocol/auth.cc csrc/protocol/hmac.cc csrc/common/text.cc)

build() {  # build TARGET: $out/TARGET_fuzz
  case "$1" in
    wire) "$CXX_FUZZ" "${common[@]}" "${fuzz[@]}" csrc/fuzz/wire_fuzz.cc "${protocol[@]}" csrc/server/handshake.cc \
            "${objs[@]}" -o "$out/wire_fuzz" ;;
    failover) "$CXX_FUZZ" "${common[@]}" "${fuzz[@]}" csrc/fuzz/failover_fuzz.cc csrc/client/failover.cc \
                "${objs[@]}" -o "$out/failover_fuzz" ;;
    reducer_frames) "$CXX_FUZZ" "${common[@]}" "${fuzz[@]}" csrc/fuzz/reducer_frames_fuzz.cc \
                      csrc/client/reducer_frames.cc csrc/client/peer_text.cc csrc/client/handshake.cc \
                      csrc/net/frame_io.cc csrc/net/frame_auth.cc csrc/net/socket.cc csrc/common/settings.cc \
                      "${protocol[@]}" "${objs[@]}" \
                      -lcrypto -o "$out/reducer_frames_fuzz" ;;
    plugin_env) "$CXX_FUZZ" "${common[@]}" "${fuzz[@]}" csrc/fuzz/plugin_env_fuzz.cc csrc/nccl_plugin/plugin_env.cc \
                  csrc/common/settings.cc csrc/client/client_settings.cc \
                  csrc/cluster/spec.cc csrc/cluster/job.cc csrc/cluster/repr.cc csrc/common/json.cc csrc/net/socket.cc csrc/net/address.cc "${protocol[@]}" "${objs[@]}" -o "$out/plugin_env_fuzz" ;;
    *) echo "fuzz.sh: unknown target $1 (wire, failover, reducer_frames, plugin_env)" >&2; exit 2 ;;
  esac
}

# The seed maker and every target built first, in parallel; then each target fuzzed in turn.
"$CXX_FUZZ" "${common[@]}" csrc/fuzz/make_seeds.cc "${protocol[@]}" "${objs[@]}" -o "$out/make_seeds" &
pids=($!)
for target in $targets; do
  throttle
  build "$target" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
failed=0
for target in $targets; do
  corpus="$out/corpus-$target"
  log="$out/fuzz-$target.log"
  if [[ "$target" == wire ]]; then corpus="$out/corpus"; log="$out/fuzz.log"; fi
  mkdir -p "$corpus"
  "$out/make_seeds" "$corpus" "$target"
  parallel=()
  if [[ "$jobs" != 1 ]]; then parallel=(-jobs="$jobs" -workers="$jobs"); fi
  set +e
  ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}" \
  UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}" \
    "$out/${target}_fuzz" -max_total_time="$seconds" -max_len=4400 -timeout=10 -rss_limit_mb=1024 \
    -malloc_limit_mb=256 -print_final_stats=1 -artifact_prefix="$out/artifacts/$target-" "${parallel[@]}" \
    "$@" "$corpus" >"$log" 2>&1
  status=$?
  set -e
  if [[ "$jobs" != 1 ]]; then cat fuzz-*.log >>"$log" 2>/dev/null && rm -f fuzz-*.log; fi  # libFuzzer's job logs
  # Summary: the last status line and the final stats.
  echo "== $target"
  grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -1 || true
  grep -E '^stat::' "$log" || true
  echo "corpus: $(ls "$corpus" | wc -l) inputs; log: $log"
  found='ERROR: (AddressSanitizer|libFuzzer|UndefinedBehaviorSanitizer)|runtime error:'
  if [[ $status -ne 0 ]] || grep -qE "$found" "$log"; then
    echo "fuzz.sh: $target FAILED (status $status); inputs in $out/artifacts/:" >&2
    ls "$out/artifacts" >&2 || true
    grep -E 'ERROR:|runtime error:|SUMMARY' "$log" | head -20 >&2 || true
    failed=1
  fi
done
if [[ $failed -ne 0 ]]; then exit 1; fi
echo "fuzz.sh: no crash in ${seconds}s per target ($targets)"
