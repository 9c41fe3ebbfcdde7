// GPU parity of every kernel family against the CPU reference ops (runtime/cpu/cpu_ops.h).
//
// Fresh random inputs per case, shapes that are not square (rows ≠ cols ≠ block counts), token counts
// 1, 7, 33, 512, 513, and outputs poisoned with NaN before each launch so an element a kernel fails to
// write shows as an infinite error. Weights come from random GGUF blocks of every supported type laid
// out by the compiler's own planner (and, for the matmuls, also with padded row pitches, so a kernel
// that ignores a stride reads the wrong bytes). Each family's tolerance is declared next to it, as
// max|gpu − ref| / max|ref|, and was measured on an H200 (the measured values are in the comments).
//
// The families live in kernels_*.cpp (one file each, compiled into this suite's one executable), their shared
// helpers and tolerances in kernel_test_support.h. doctest runs test cases in file-name order, so this file's
// summary, named to sort last, runs after every family.
#include <doctest/doctest.h>

#include "tests/cuda/kernel_test_support.h"

namespace minfer::test::gpu {
namespace {

TEST_CASE("zz: measured errors per family (max over this run)") {
  MINFER_REQUIRE_GPU(G);
  for (const auto& [family, err] : worst()) MESSAGE(family << ": max rel error " << err);
}

}  // namespace
}  // namespace minfer::test::gpu
