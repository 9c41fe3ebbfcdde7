#!/usr/bin/env bash
# Installs what is missing, builds the sanitized debug build and runs the whole test suite via ctest.
# GPU tests (label "gpu") skip with a message where no usable GPU is present. Then, under CI=true or
# when MINFER_FUZZ_SECONDS is set, scripts/fuzz.sh runs each fuzz target for that many seconds (60).
# Ends with one line naming the suites ctest skipped and why.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh debug
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
build=${MINFER_BUILD_DIR:-build/debug}
ctest_out=$(mktemp)
trap 'rm -f "$ctest_out"' EXIT

# The last line: the suites ctest reported as Skipped, each with the reason it printed ("SKIPPED: …",
# found in ctest's log of every test's output).
skipped_summary() {
  local names summary="" name why
  names=$(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$/\1/p' "$ctest_out")
  for name in $names; do
    why=$(awk -v t="$name" '$0 ~ ("Test: " t "$") {f = 1} f && /^SKIPPED:/ {sub(/^SKIPPED: */, ""); print; exit}
                                   f && /^<end of output>/ {exit}' \
          "$build/Testing/Temporary/LastTest.log" 2>/dev/null)
    summary+="${summary:+; }$name: ${why:-no reason printed}"
  done
  echo "test.sh: skipped suites: ${summary:-none}"
}

set +e
ctest --test-dir "$build" --output-on-failure -j "${MINFER_JOBS:-$(nproc)}" "$@" | tee "$ctest_out"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  skipped_summary
  exit "$status"
fi
if [ "${CI:-}" = "true" ] || [ -n "${MINFER_FUZZ_SECONDS:-}" ]; then
  scripts/fuzz.sh "${MINFER_FUZZ_SECONDS:-60}"
fi
skipped_summary
