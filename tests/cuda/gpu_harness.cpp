// GPU test harness (see gpu_harness.h).
#include "tests/cuda/gpu_harness.h"

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <optional>
#include <thread>

#include "compiler/codegen/nvrtc_compiler.h"

namespace minfer::test::gpu {
namespace {

std::string g_reason;

Gpu* open() {
  Result<std::shared_ptr<cuda::CudaDevice>> dev = cuda::CudaDevice::open();
  if (!dev) {
    g_reason = dev.status().message();
    return nullptr;
  }
  if ((*dev)->info().cc_major < 8) {
    g_reason = (*dev)->info().name + " is " + (*dev)->info().arch() + "; the kernels need sm_80+";
    return nullptr;
  }
  Result<cuda::Stream> s = (*dev)->createStream();
  if (!s) {
    g_reason = s.status().message();
    return nullptr;
  }
  auto* g = new Gpu{std::move(*dev), std::move(*s), ""};  // lives for the process
  g->arch = g->dev->info().arch();
  return g;
}

}  // namespace

Gpu* get() {
  static Gpu* g = open();
  return g;
}
const std::string& skipReason() { return g_reason; }

codegen::KernelSpec spec(std::string key, const char* source, const char* entry,
                         std::vector<std::pair<std::string, std::string>> defines, std::vector<std::string> flags) {
  codegen::KernelSpec s;
  s.key = std::move(key);
  s.source = source;
  s.entry = entry;
  s.defines = std::move(defines);
  s.flags = std::move(flags);
  return s;
}

std::vector<Kernel> compile(const std::vector<codegen::KernelSpec>& specs) {
  Gpu* g = get();
  REQUIRE(g);
  return compile(specs, g->arch);
}

std::vector<Kernel> compile(const std::vector<codegen::KernelSpec>& specs, const std::string& arch) {
  Gpu* g = get();
  REQUIRE(g);
  std::vector<std::optional<codegen::CompiledKernel>> out(specs.size());
  std::vector<std::string> errors(specs.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < specs.size(); i = next++) {
      auto k = codegen::compileKernel(specs[i], arch);
      if (k)
        out[i] = std::move(*k);
      else
        errors[i] = llvm::toString(k.takeError());
    }
  };
  std::vector<std::thread> threads;
  const unsigned n = std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()), specs.size());
  for (unsigned t = 1; t < n; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  std::vector<Kernel> kernels;
  for (size_t i = 0; i < specs.size(); ++i) {
    REQUIRE_MESSAGE(out[i].has_value(), errors[i]);
    Result<cuda::Module> m = g->dev->loadModule(out[i]->cubin.data(), specs[i].key);
    REQUIRE_MESSAGE(m.isOk(), m.status().message());
    Kernel k;
    k.module = std::move(*m);
    k.key = specs[i].key;
    REQUIRE(g->dev->cu().cuModuleGetFunction(&k.fn, k.module.get(), specs[i].entry.c_str()) == CUDA_SUCCESS);
    kernels.push_back(std::move(k));
  }
  return kernels;
}

DeviceArray::DeviceArray(uint64_t bytes) : size_(bytes) {
  Result<cuda::DeviceBuffer> b = get()->dev->alloc(std::max<uint64_t>(bytes, 4), "test buffer");
  REQUIRE_MESSAGE(b.isOk(), b.status().message());
  buf_ = std::move(*b);
}

void DeviceArray::upload(const void* src, uint64_t bytes, uint64_t offset) {
  Gpu* g = get();
  REQUIRE(offset + bytes <= size_);
  Status s = g->dev->check(g->dev->cu().cuMemcpyHtoDAsync(ptr() + offset, src, bytes, g->stream.get()), "upload");
  if (s) s = g->dev->check(g->dev->cu().cuStreamSynchronize(g->stream.get()), "upload sync");
  REQUIRE_MESSAGE(s.isOk(), s.message());
}

void DeviceArray::poison() {
  Gpu* g = get();
  Status s = g->dev->check(g->dev->cu().cuMemsetD32Async(ptr(), 0x7FC00000u, size_ / 4, g->stream.get()), "poison");
  if (s) s = g->dev->check(g->dev->cu().cuStreamSynchronize(g->stream.get()), "poison sync");
  REQUIRE_MESSAGE(s.isOk(), s.message());
}

void DeviceArray::downloadBytes(void* dst, uint64_t bytes, uint64_t offset) const {
  Gpu* g = get();
  REQUIRE(offset + bytes <= size_);
  Status s = g->dev->check(g->dev->cu().cuMemcpyDtoHAsync(dst, ptr() + offset, bytes, g->stream.get()), "download");
  if (s) s = g->dev->check(g->dev->cu().cuStreamSynchronize(g->stream.get()), "download sync");
  REQUIRE_MESSAGE(s.isOk(), s.message());
}

void launch(const Kernel& k, const kern::LaunchShape& sh, std::vector<void*> args) {
  Gpu* g = get();
  const cuda::CudaDriver& cu = g->dev->cu();
  if (sh.smem > 48 * 1024)
    REQUIRE(cu.cuFuncSetAttribute(k.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(sh.smem)) ==
            CUDA_SUCCESS);
  Status s = g->dev->check(cu.cuLaunchKernel(k.fn, sh.grid.x, sh.grid.y, sh.grid.z, sh.block.x, sh.block.y, sh.block.z,
                                             sh.smem, g->stream.get(), args.data(), nullptr),
                           "launch " + k.key);
  if (s) s = g->dev->check(cu.cuStreamSynchronize(g->stream.get()), "run " + k.key);
  REQUIRE_MESSAGE(s.isOk(), s.message());
}

double relError(const float* got, const float* ref, size_t n) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

}  // namespace minfer::test::gpu
