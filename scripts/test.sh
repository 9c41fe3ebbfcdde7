#!/usr/bin/env bash
# Installs what is missing, builds the sanitized debug build and runs the whole test suite via ctest.
# GPU tests (label "gpu") skip with a message where no usable GPU is present. Then, under CI=true or
# when MINFER_FUZZ_SECONDS is set, scripts/fuzz.sh runs each fuzz target for that many seconds (60).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh debug
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "${MINFER_BUILD_DIR:-build/debug}" --output-on-failure -j "${MINFER_JOBS:-$(nproc)}" "$@"
if [ "${CI:-}" = "true" ] || [ -n "${MINFER_FUZZ_SECONDS:-}" ]; then
  scripts/fuzz.sh "${MINFER_FUZZ_SECONDS:-60}"
fi
