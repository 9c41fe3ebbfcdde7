// main() of the gpu-labelled suites: runs doctest when a usable CUDA GPU is present; otherwise prints
// why and exits with the skip code, so ctest reports the suite as Skipped rather than Passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "tests/cuda/gpu_harness.h"

int main(int argc, char** argv) {
  if (::minfer::test::gpu::get() == nullptr) {
    std::printf("SKIPPED: no usable CUDA GPU (%s)\n", ::minfer::test::gpu::skipReason().c_str());
    return MINFER_SKIP_RETURN_CODE;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
