#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, its own build directory) and fuzzes each for a
# bounded time; exits 1 on any finding (crash, sanitizer report, broken invariant, leak, timeout,
# out-of-memory).
#   scripts/fuzz.sh [seconds per target (default 60)] [target ...]   targets: gguf_reader artifact tokenizer
# Build directory: $MINFER_FUZZ_BUILD_DIR, else build/fuzz. Seeds: tests/fuzz/corpus/<target> and
# tests/fuzz/regressions/<target> (read only); new inputs go to <build>/corpus/<target>, findings to
# <build>/findings/<target>/, each target's log to <build>/fuzz_<target>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(gguf_reader artifact tokenizer)
dir=${MINFER_FUZZ_BUILD_DIR:-build/fuzz}
jobs=${MINFER_JOBS:-$(nproc)}
if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found (scripts/setup.sh installs clang and libclang-rt-14-dev)" >&2
  exit 1
fi
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S . -B "$dir" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DMINFER_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" \
    "-DCMAKE_C_FLAGS_DEBUG=-O1 -gline-tables-only" >/dev/null
fi
start=$(date +%s)
cmake --build "$dir" --target fuzz_targets -j "$jobs" -- --no-print-directory 2>&1 | grep -v -E '^\[ *[0-9]+%\]' || true
test "${PIPESTATUS[0]}" -eq 0
echo "fuzz: built the targets in $(($(date +%s) - start)) s"

for t in "${targets[@]}"; do
  if [ ! -x "$dir/bin/fuzz_$t" ]; then
    echo "fuzz: unknown target '$t' (expected gguf_reader, artifact or tokenizer)" >&2
    exit 2
  fi
done
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$dir/corpus/$t" "$dir/findings/$t"
  log="$dir/fuzz_$t.log"
  seeds=(tests/fuzz/corpus/fuzz_$t)
  [ -d tests/fuzz/regressions/fuzz_$t ] && seeds+=(tests/fuzz/regressions/fuzz_$t)
  status=0
  "$dir/bin/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$dir/findings/$t/" "$dir/corpus/$t" "${seeds[@]}" >"$log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
  if [ "$status" -ne 0 ]; then
    echo "fuzz: fuzz_$t: FINDING (exit $status) after ${runs:-?} runs; input in $dir/findings/$t/, log $log:" >&2
    grep -E 'ERROR|SUMMARY|invariant violated|runtime error' "$log" | head -5 >&2 || true
    failed+=("$t")
  else
    echo "fuzz: fuzz_$t: ${runs:-?} runs in $seconds s, peak RSS ${rss:-?} MB, no findings"
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: findings in: ${failed[*]}" >&2
  exit 1
fi
