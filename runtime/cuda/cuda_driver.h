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

struct CudaDriver {
#define MINFER_CU_FN(name) decltype(&::name) name = nullptr;
  MINFER_CU_FN(cuInit)
  MINFER_CU_FN(cuDriverGetVersion)
  MINFER_CU_FN(cuGetErrorName)
  MINFER_CU_FN(cuGetErrorString)
  MINFER_CU_FN(cuDeviceGetCount)
  MINFER_CU_FN(cuDeviceGet)
  MINFER_CU_FN(cuDeviceGetName)
  MINFER_CU_FN(cuDeviceGetAttribute)
  MINFER_CU_FN(cuDeviceTotalMem)
  MINFER_CU_FN(cuDevicePrimaryCtxRetain)
  MINFER_CU_FN(cuDevicePrimaryCtxRelease)
  MINFER_CU_FN(cuCtxSetCurrent)
  MINFER_CU_FN(cuCtxSynchronize)
  MINFER_CU_FN(cuMemAlloc)
  MINFER_CU_FN(cuMemFree)
  MINFER_CU_FN(cuMemGetInfo)
  MINFER_CU_FN(cuMemHostAlloc)
  MINFER_CU_FN(cuMemFreeHost)
  MINFER_CU_FN(cuMemcpyHtoDAsync)
  MINFER_CU_FN(cuMemcpyDtoHAsync)
  MINFER_CU_FN(cuMemcpyDtoDAsync)
  MINFER_CU_FN(cuMemsetD8Async)
  MINFER_CU_FN(cuMemsetD32Async)
  MINFER_CU_FN(cuStreamCreate)
  MINFER_CU_FN(cuStreamDestroy)
  MINFER_CU_FN(cuStreamSynchronize)
  MINFER_CU_FN(cuStreamWaitEvent)
  MINFER_CU_FN(cuEventCreate)
  MINFER_CU_FN(cuEventDestroy)
  MINFER_CU_FN(cuEventRecord)
  MINFER_CU_FN(cuEventSynchronize)
  MINFER_CU_FN(cuEventElapsedTime)
  MINFER_CU_FN(cuModuleLoadDataEx)
  MINFER_CU_FN(cuModuleUnload)
  MINFER_CU_FN(cuModuleGetFunction)
  MINFER_CU_FN(cuFuncSetAttribute)
  MINFER_CU_FN(cuFuncGetAttribute)
  MINFER_CU_FN(cuLaunchKernel)
  MINFER_CU_FN(cuStreamBeginCapture)
  MINFER_CU_FN(cuStreamEndCapture)
  MINFER_CU_FN(cuGraphInstantiateWithFlags)
  MINFER_CU_FN(cuGraphLaunch)
  MINFER_CU_FN(cuGraphExecDestroy)
  MINFER_CU_FN(cuGraphDestroy)
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
