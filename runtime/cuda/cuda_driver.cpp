// dlopen-based loader of the CUDA driver API (see cuda_driver.h).
#include "runtime/cuda/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

namespace minfer::cuda {
namespace {

#define MINFER_STR2(x) #x
#define MINFER_STR(x) MINFER_STR2(x)  // expands cuda.h's versioning macros first: "cuMemAlloc_v2"

struct Loaded {
  CudaDriver driver;
  Status status;
};

Loaded load() {
  Loaded l;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    // dlerror() already names the library: "libcuda.so.1: cannot open shared object file: …".
    l.status = Status::error(std::string("CUDA: no NVIDIA driver on this machine (") +
                             (e ? e : "libcuda.so.1: unknown dlopen error") + ")");
    return l;
  }
  std::string missing;
  CudaDriver& d = l.driver;
#define MINFER_CU_RESOLVE(name)                                                         \
  d.name = reinterpret_cast<decltype(d.name)>(dlsym(lib, MINFER_STR(name)));            \
  if (!d.name) missing += std::string(missing.empty() ? "" : ", ") + MINFER_STR(name);
  MINFER_CUDA_DRIVER_FUNCTIONS(MINFER_CU_RESOLVE)
#undef MINFER_CU_RESOLVE
  if (!missing.empty()) {
    int v = 0;
    if (d.cuDriverGetVersion) d.cuDriverGetVersion(&v);
    l.status = Status::error("CUDA: the driver (CUDA " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10) +
                             ") lacks " + missing + "; minfer needs a driver for CUDA " +
                             std::to_string(CUDA_VERSION / 1000) + "." + std::to_string(CUDA_VERSION % 1000 / 10) +
                             " or newer");
    return l;
  }
  d.cuDriverGetVersion(&d.driver_version);
  if (const CUresult r = d.cuInit(0); r != CUDA_SUCCESS) {
    l.status = d.check(r, "CUDA: cuInit");
    return l;
  }
  return l;
}

}  // namespace

Result<const CudaDriver*> CudaDriver::get() {
  static std::once_flag once;
  static Loaded* loaded = nullptr;
  std::call_once(once, [] { loaded = new Loaded(load()); });  // lives for the process
  if (!loaded->status.isOk()) return loaded->status;
  return &loaded->driver;
}

Status CudaDriver::check(CUresult r, const std::string& what) const {
  if (r == CUDA_SUCCESS) return Status::ok();
  const char* name = nullptr;
  const char* desc = nullptr;
  if (cuGetErrorName) cuGetErrorName(r, &name);
  if (cuGetErrorString) cuGetErrorString(r, &desc);
  return Status::error(what + ": " + (name ? name : "CUDA error " + std::to_string(static_cast<int>(r))) + " (" +
                       (desc ? desc : "no description") + ")");
}

}  // namespace minfer::cuda
