#!/usr/bin/env bash
# Builds the GPU test binaries and tools for another machine (release, MINFER_STATIC) and packs them,
# with the fixtures, into git-ignored folders of the checkout: .bin/minfer-gpu.tar.xz and .fixtures/.
# On the GPU machine:  scripts/device-run.sh   (see there for what it runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export MINFER_BUILD_DIR=${MINFER_BUILD_DIR:-build/device}
MINFER_CMAKE_ARGS="-DMINFER_STATIC=ON" scripts/build.sh release \
  minfer-synth minfer-compile minfer-run minfer-bench minfer-bench-gemv minfer-inspect minfer-server minfer-server-bench test_cuda_arch test_cuda_kernels test_cuda_e2e test_cuda_swa
# The CUPTI kernel trace where the toolkit has CUPTI (bench/CMakeLists.txt defines the target only then).
if grep -q "minfer-kernel-trace" "$MINFER_BUILD_DIR/Makefile" 2>/dev/null; then
  MINFER_CMAKE_ARGS="-DMINFER_STATIC=ON" scripts/build.sh release minfer-kernel-trace
fi
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib" .bin
for t in minfer-synth minfer-compile minfer-run minfer-bench minfer-bench-gemv minfer-inspect minfer-server minfer-server-bench test_cuda_arch test_cuda_kernels test_cuda_e2e \
    test_cuda_swa; do
  cp "$MINFER_BUILD_DIR/bin/$t" "$stage/bin/"
done
# The CUPTI kernel trace (bench/kernel_trace.cpp; CUDA_INJECTION64_PATH=$W/lib/libminfer-kernel-trace.so).
if [ -f "$MINFER_BUILD_DIR/bin/libminfer-kernel-trace.so" ]; then
  cp "$MINFER_BUILD_DIR/bin/libminfer-kernel-trace.so" "$stage/lib/"
fi
# minfer-server and minfer-server-bench link Debian's shared cpp-httplib (cmake/MinferDeps.cmake,
# minfer_link_httplib): it and its brotli libraries go to lib/ (their rpath $ORIGIN/../lib); OpenSSL 3, zlib and
# libstdc++ come from the other machine (scripts/device-serve.sh checks).
for l in $(ldd "$MINFER_BUILD_DIR/bin/minfer-server" | awk '/libcpp-httplib|libbrotli/{print $3}'); do
  cp -L "$l" "$stage/lib/"
done
# libtinfo comes with LLVM Support; the other machine may lack this version of it.
cp -L "$(ldconfig -p | awk '/libtinfo.so.6 /{print $NF; exit}')" "$stage/lib/"
tar -C "$stage" -cJf .bin/minfer-gpu.tar.xz bin lib
rm -rf "$stage"
fixtures=${MINFER_FIXTURES:-../shared/fixtures}
if [ -d "$fixtures/models" ]; then
  rm -rf .fixtures && mkdir -p .fixtures && cp -r "$fixtures/models" "$fixtures/goldens" .fixtures/
  # The arch/ cases minfer compiles (tests/e2e/golden_support.cpp): Llama 3.1 RoPE, gemma2, gemma3, phi3 and
  # qwen3moe.
  mkdir -p .fixtures/arch/models .fixtures/arch/goldens
  for a in tiny-llama31 tiny-gemma2 tiny-gemma3 tiny-phi3 tiny-qwen3moe; do
    cp "$fixtures"/arch/models/$a* .fixtures/arch/models/
    cp "$fixtures"/arch/goldens/$a* .fixtures/arch/goldens/
  done
fi
du -sh .bin/minfer-gpu.tar.xz .fixtures 2>/dev/null
