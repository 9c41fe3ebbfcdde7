#!/usr/bin/env bash
# Configures and builds minfer into a build directory.
#   scripts/build.sh [release|debug] [target...]   (debug = AddressSanitizer + UndefinedBehaviorSanitizer;
#                                                   no targets = everything)
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
shift || true
targets=()
for t in "$@"; do targets+=(--target "$t"); done
# Progress lines are dropped; warnings and errors are shown. The build's own status decides the exit.
set +e
cmake --build "$dir" -j "$jobs" "${targets[@]}" -- --no-print-directory 2>&1 | grep -v -E '^\[ *[0-9]+%\]'
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "build.sh: the $mode build failed (cmake --build exited $status)" >&2
  exit "$status"
fi
