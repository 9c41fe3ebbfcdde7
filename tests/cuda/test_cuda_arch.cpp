// CUDA backend without a GPU: image arch choice (exact cubin, PTX JIT, error naming both sides), and
// the driver-less path (--device cuda fails clearly, auto falls back to the CPU). Runs in CI.
#include <doctest/doctest.h>

#include "minfer/runtime.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_driver.h"

namespace minfer::cuda {
namespace {

TEST_CASE("image arch choice: exact cubin, else PTX of the newest portable arch below, else an error") {
  auto c = chooseImageArch(9, 0, {"sm_80", "sm_86", "sm_89", "sm_90"});
  REQUIRE(c.isOk());
  CHECK(c->arch == "sm_90");
  CHECK_FALSE(c->jit_ptx);

  c = chooseImageArch(9, 0, {"sm_90a"});  // arch-specific images run on their own GPU
  REQUIRE(c.isOk());
  CHECK(c->arch == "sm_90a");

  c = chooseImageArch(8, 9, {"sm_80", "sm_90"});
  REQUIRE(c.isOk());
  CHECK(c->arch == "sm_80");
  CHECK(c->jit_ptx);
  CHECK(c->note.find("sm_89") != std::string::npos);

  c = chooseImageArch(10, 0, {"sm_86", "sm_90", "sm_90a"});
  REQUIRE(c.isOk());
  CHECK(c->arch == "sm_90");  // not sm_90a: its PTX does not run on other archs
  CHECK(c->jit_ptx);

  c = chooseImageArch(8, 0, {"sm_86", "sm_90"});
  REQUIRE_FALSE(c.isOk());
  CHECK(c.status().message().find("sm_80") != std::string::npos);
  CHECK(c.status().message().find("sm_86, sm_90") != std::string::npos);

  c = chooseImageArch(10, 0, {"sm_90a"});
  REQUIRE_FALSE(c.isOk());
}

TEST_CASE("without a driver: --device cuda fails clearly") {
  auto driver = CudaDriver::get();
  if (driver.isOk()) {
    MESSAGE("SKIPPED: a CUDA driver is present on this machine");
    return;
  }
  CHECK(driver.status().message().find("libcuda.so.1") != std::string::npos);
  CHECK(driver.status().message().find("no NVIDIA driver") != std::string::npos);
}

}  // namespace
}  // namespace minfer::cuda
