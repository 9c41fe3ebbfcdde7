// GPU test harness: the device (or a skip), NVRTC compilation of kernel specs for it (in parallel),
// device buffers that are poisoned before each launch, and the error measures of the parity tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "compiler/codegen/kernel_spec.h"
#include "kernels/common.cuh"
#include "runtime/cuda/cuda_device.h"

namespace minfer::test::gpu {

struct Gpu {
  std::shared_ptr<cuda::CudaDevice> dev;
  cuda::Stream stream;
  std::string arch;  // "sm_90"
};

// The process-wide GPU, or nullptr (then skipReason() says why: no driver, no device, too old).
Gpu* get();
const std::string& skipReason();

// Opens the GPU or prints "SKIPPED: no usable CUDA GPU (…)" and returns from the test case.
#define MINFER_REQUIRE_GPU(g)                                                             \
  ::minfer::test::gpu::Gpu* g = ::minfer::test::gpu::get();                              \
  if (!g) {                                                                               \
    MESSAGE("SKIPPED: no usable CUDA GPU (" << ::minfer::test::gpu::skipReason() << ")"); \
    return;                                                                               \
  }

struct Kernel {
  cuda::Module module;
  CUfunction fn = nullptr;
  std::string key;
};

// Builds a spec by hand (the tests state every compile-time constant the kernel file documents).
codegen::KernelSpec spec(std::string key, const char* source, const char* entry,
                         std::vector<std::pair<std::string, std::string>> defines, std::vector<std::string> flags = {});

// Compiles the specs for the GPU's arch with NVRTC (in parallel) and loads them; fails the test on error.
std::vector<Kernel> compile(const std::vector<codegen::KernelSpec>& specs);
// The same for another target of the GPU (e.g. "sm_90a" for wgmma kernels on an sm_90 GPU).
std::vector<Kernel> compile(const std::vector<codegen::KernelSpec>& specs, const std::string& arch);

class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(uint64_t bytes);
  template <typename T>
  static DeviceArray of(const std::vector<T>& v) {
    DeviceArray a(v.size() * sizeof(T));
    a.upload(v.data(), v.size() * sizeof(T));
    return a;
  }
  CUdeviceptr ptr() const { return buf_.ptr(); }
  uint64_t size() const { return size_; }
  void upload(const void* src, uint64_t bytes, uint64_t offset = 0);
  void poison();  // every 32-bit word = 0x7FC00000 (a quiet NaN as f32)
  template <typename T>
  std::vector<T> download(size_t n, uint64_t offset = 0) const {
    std::vector<T> out(n);
    downloadBytes(out.data(), n * sizeof(T), offset);
    return out;
  }
  void downloadBytes(void* dst, uint64_t bytes, uint64_t offset) const;

 private:
  cuda::DeviceBuffer buf_;
  uint64_t size_ = 0;
};

// Launches and waits; fails the test on a launch or execution error. Arguments are pointers to the
// values (CUdeviceptr or int32), in the kernel's parameter order.
void launch(const Kernel& k, const kern::LaunchShape& shape, std::vector<void*> args);

// max|got − ref| / max|ref| over n values; NaN or inf in `got` gives +inf (so unwritten poisoned
// elements fail any tolerance).
double relError(const float* got, const float* ref, size_t n);

}  // namespace minfer::test::gpu
