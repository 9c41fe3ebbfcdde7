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
  MINFER_CU_RESOLVE(cuInit)
  MINFER_CU_RESOLVE(cuDriverGetVersion)
  MINFER_CU_RESOLVE(cuGetErrorName)
  MINFER_CU_RESOLVE(cuGetErrorString)
  MINFER_CU_RESOLVE(cuDeviceGetCount)
  MINFER_CU_RESOLVE(cuDeviceGet)
  MINFER_CU_RESOLVE(cuDeviceGetName)
  MINFER_CU_RESOLVE(cuDeviceGetAttribute)
  MINFER_CU_RESOLVE(cuDeviceTotalMem)
  MINFER_CU_RESOLVE(cuDevicePrimaryCtxRetain)
  MINFER_CU_RESOLVE(cuDevicePrimaryCtxRelease)
  MINFER_CU_RESOLVE(cuCtxSetCurrent)
  MINFER_CU_RESOLVE(cuCtxSynchronize)
  MINFER_CU_RESOLVE(cuMemAlloc)
  MINFER_CU_RESOLVE(cuMemFree)
  MINFER_CU_RESOLVE(cuMemGetInfo)
  MINFER_CU_RESOLVE(cuMemHostAlloc)
  MINFER_CU_RESOLVE(cuMemFreeHost)
  MINFER_CU_RESOLVE(cuMemcpyHtoDAsync)
  MINFER_CU_RESOLVE(cuMemcpyDtoHAsync)
  MINFER_CU_RESOLVE(cuMemcpyDtoDAsync)
  MINFER_CU_RESOLVE(cuMemsetD8Async)
  MINFER_CU_RESOLVE(cuMemsetD32Async)
  MINFER_CU_RESOLVE(cuStreamCreate)
  MINFER_CU_RESOLVE(cuStreamDestroy)
  MINFER_CU_RESOLVE(cuStreamSynchronize)
  MINFER_CU_RESOLVE(cuStreamWaitEvent)
  MINFER_CU_RESOLVE(cuEventCreate)
  MINFER_CU_RESOLVE(cuEventDestroy)
  MINFER_CU_RESOLVE(cuEventRecord)
  MINFER_CU_RESOLVE(cuEventSynchronize)
  MINFER_CU_RESOLVE(cuEventElapsedTime)
  MINFER_CU_RESOLVE(cuModuleLoadDataEx)
  MINFER_CU_RESOLVE(cuModuleUnload)
  MINFER_CU_RESOLVE(cuModuleGetFunction)
  MINFER_CU_RESOLVE(cuFuncSetAttribute)
  MINFER_CU_RESOLVE(cuFuncGetAttribute)
  MINFER_CU_RESOLVE(cuLaunchKernel)
  MINFER_CU_RESOLVE(cuStreamBeginCapture)
  MINFER_CU_RESOLVE(cuStreamEndCapture)
  MINFER_CU_RESOLVE(cuGraphInstantiateWithFlags)
  MINFER_CU_RESOLVE(cuGraphLaunch)
  MINFER_CU_RESOLVE(cuGraphExecDestroy)
  MINFER_CU_RESOLVE(cuGraphDestroy)
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
