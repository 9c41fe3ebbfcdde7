#!/usr/bin/env bash
# Configures and builds minfer into a build directory.
#   scripts/build.sh [release|debug]   (debug = AddressSanitizer + UndefinedBehaviorSanitizer)
# Build directory: $MINFER_BUILD_DIR, else build/release or build/debug in the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-release}
case "$mode" in
  release) type=Release; sanitize=OFF ;;
  debug) type=Debug; sanitize=ON ;;
  *) echo "usage: scripts/build.sh [release|debug]" >&2; exit 2 ;;
esac
dir=${MINFER_BUILD_DIR:-build/$mode}
jobs=${MINFER_JOBS:-$(nproc)}
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=$type -DMINFER_SANITIZE=$sanitize ${MINFER_CMAKE_ARGS:-} >/dev/null
fi
cmake --build "$dir" -j "$jobs" -- --no-print-directory 2>&1 | grep -v -E '^\[ *[0-9]+%\]' || true
test "${PIPESTATUS[0]}" -eq 0
