// The CUDA driver API, loaded at run time with dlopen("libcuda.so.1"): the runtime never links libcuda
// or cudart, so one binary runs on machines without an NVIDIA driver (then only the CPU backend works).
//
// <cuda.h> is included for its types and prototypes only; every function is called through the
// pointers of CudaDriver, resolved by their versioned symbol names (cuMemAlloc → cuMemAlloc_v2, as
// the header maps them). Needs a driver that supports the CUDA version of the header (13.0): older
// drivers are reported with both versions.
//
// Thread-safety: CudaDriver::get() loads once (std::call_once); the table is immutable afterwards.
#pragma once

#include <cuda.h>

#include <string>

#include "minfer/status.h"

namespace minfer::cuda {

// Every driver function minfer calls; CudaDriver holds a pointer to each and load() resolves them all.
#define MINFER_CUDA_DRIVER_FUNCTIONS(X) \
  X(cuInit) \
  X(cuDriverGetVersion) \
  X(cuGetErrorName) \
  X(cuGetErrorString) \
  X(cuDeviceGetCount) \
  X(cuDeviceGet) \
  X(cuDeviceGetName) \
  X(cuDeviceGetAttribute) \
  X(cuDeviceTotalMem) \
  X(cuDevicePrimaryCtxRetain) \
  X(cuDevicePrimaryCtxRelease) \
  X(cuCtxSetCurrent) \
  X(cuCtxSynchronize) \
  X(cuMemAlloc) \
  X(cuMemFree) \
  X(cuMemGetInfo) \
  X(cuMemHostAlloc) \
  X(cuMemHostGetDevicePointer) \
  X(cuMemFreeHost) \
  X(cuMemcpyHtoDAsync) \
  X(cuMemcpyDtoHAsync) \
  X(cuMemcpyDtoDAsync) \
  X(cuMemsetD8Async) \
  X(cuMemsetD32Async) \
  X(cuStreamCreate) \
  X(cuStreamDestroy) \
  X(cuStreamSynchronize) \
  X(cuStreamWaitEvent) \
  X(cuEventCreate) \
  X(cuEventDestroy) \
  X(cuEventRecord) \
  X(cuEventRecordWithFlags) \
  X(cuEventSynchronize) \
  X(cuEventElapsedTime) \
  X(cuModuleLoadDataEx) \
  X(cuModuleUnload) \
  X(cuModuleGetFunction) \
  X(cuFuncSetAttribute) \
  X(cuFuncGetAttribute) \
  X(cuFuncGetParamInfo) \
  X(cuLaunchKernel) \
  X(cuLaunchKernelEx) \
  X(cuStreamBeginCapture) \
  X(cuStreamEndCapture) \
  X(cuGraphInstantiateWithFlags) \
  X(cuGraphLaunch) \
  X(cuGraphExecDestroy) \
  X(cuGraphDestroy)

struct CudaDriver {
#define MINFER_CU_FN(name) decltype(&::name) name = nullptr;
  MINFER_CUDA_DRIVER_FUNCTIONS(MINFER_CU_FN)
#undef MINFER_CU_FN
  int driver_version = 0;  // cuDriverGetVersion, e.g. 13000

  // Loads libcuda.so.1, resolves every function and runs cuInit(0). Errors: the library cannot be
  // loaded (dlerror text: "no NVIDIA driver on this machine"), a missing symbol (driver older than
  // the header), cuInit failing (e.g. no device, driver/kernel-module mismatch). The result is
  // cached: later calls return the same table or the same error.
  static Result<const CudaDriver*> get();

  // Ok, or an error "<what>: CUDA_ERROR_… (<description>)".
  Status check(CUresult r, const std::string& what) const;
};

}  // namespace minfer::cuda
