// One CUDA device and RAII owners of what the runtime allocates on it (device and pinned memory,
// streams, events, modules). Shared by the CUDA backend, its sessions and the GPU tests.
//
// The device's primary context is retained at open() and released when the last owner of the
// CudaDevice goes (backends and sessions hold a shared_ptr). Every method makes the context current
// on the calling thread first, so sessions may run on any thread (one at a time each).
// Errors name the call, the CUDA error and, for allocations, the bytes asked for and the bytes free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/cuda/cuda_driver.h"

namespace minfer::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;            // "NVIDIA H200"
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  uint64_t total_bytes = 0;
  int max_smem_optin = 0;      // bytes of shared memory a block may opt in to
  double peak_bytes_per_s = 0; // DRAM: 2 (double data rate) × memory clock × bus width / 8; 0 if unknown
  int driver_version = 0;      // e.g. 13000
  std::string arch() const { return "sm_" + std::to_string(cc_major * 10 + cc_minor); }
};

class CudaDevice;

// Owned device memory (cuMemAlloc); move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer() { release(); }
  CUdeviceptr ptr() const { return ptr_; }
  uint64_t size() const { return size_; }

 private:
  void release();
  friend class CudaDevice;
  std::shared_ptr<const CudaDevice> dev_;
  CUdeviceptr ptr_ = 0;
  uint64_t size_ = 0;
};

// Owned page-locked host memory (cuMemHostAlloc), where asked also mapped into the device's address space
// (CudaDevice::allocPinned's `mapped`): kernels may then store into it directly (zero-copy). Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  ~PinnedBuffer() { release(); }
  void* data() const { return ptr_; }
  // The device address of data() (cuMemHostGetDevicePointer) of a mapped buffer, else 0; byte offsets carry over.
  CUdeviceptr device() const { return device_; }
  uint64_t size() const { return size_; }

 private:
  void release();
  friend class CudaDevice;
  std::shared_ptr<const CudaDevice> dev_;
  void* ptr_ = nullptr;
  CUdeviceptr device_ = 0;
  uint64_t size_ = 0;
};

// Owned stream, event or module (move-only handles destroyed with the right call).
template <typename H, int kKind>
class DeviceHandle {
 public:
  DeviceHandle() = default;
  DeviceHandle(DeviceHandle&& o) noexcept { *this = std::move(o); }
  DeviceHandle& operator=(DeviceHandle&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = std::move(o.dev_);
      h_ = o.h_;
      o.h_ = nullptr;
    }
    return *this;
  }
  ~DeviceHandle() { reset(); }
  H get() const { return h_; }
  void reset();

 private:
  friend class CudaDevice;
  std::shared_ptr<const CudaDevice> dev_;
  H h_ = nullptr;
};
using Stream = DeviceHandle<CUstream, 0>;
using Event = DeviceHandle<CUevent, 1>;
using Module = DeviceHandle<CUmodule, 2>;

class CudaDevice : public std::enable_shared_from_this<CudaDevice> {
 public:
  // Opens device `ordinal` (−1: $MINFER_CUDA_DEVICE, else 0). Errors: no driver (cuda_driver.h), no
  // device, ordinal out of range.
  static Result<std::shared_ptr<CudaDevice>> open(int ordinal = -1);
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  const CudaDriver& cu() const { return *cu_; }
  const DeviceInfo& info() const { return info_; }
  CUcontext context() const { return ctx_; }
  Status makeCurrent() const;
  Status check(CUresult r, const std::string& what) const { return cu_->check(r, what); }

  // `what` names the allocation in errors: "<what>: cannot allocate N bytes on <GPU> (F bytes free of T)".
  Result<DeviceBuffer> alloc(uint64_t bytes, const std::string& what) const;
  // mapped: also in the device's address space (PinnedBuffer::device(); CU_MEMHOSTALLOC_DEVICEMAP), for kernels that
  // store into it; else device() is 0.
  Result<PinnedBuffer> allocPinned(uint64_t bytes, const std::string& what, bool mapped = false) const;
  Result<Stream> createStream() const;
  Result<Event> createEvent(bool timing = false) const;
  // Loads a cubin or a NUL-terminated PTX image. PTX is JIT-compiled by the driver; its error log is
  // part of the message on failure. `what` names the image.
  Result<Module> loadModule(const void* image, const std::string& what) const;
  // (free, total) device memory in bytes.
  Result<std::pair<uint64_t, uint64_t>> memInfo() const;

 private:
  CudaDevice() = default;
  const CudaDriver* cu_ = nullptr;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  DeviceInfo info_;
};

}  // namespace minfer::cuda
