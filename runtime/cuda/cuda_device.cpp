// CUDA device and RAII owners (see cuda_device.h).
#include "runtime/cuda/cuda_device.h"

#include <cstdlib>
#include <vector>

namespace minfer::cuda {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    dev_ = std::move(o.dev_);
    ptr_ = o.ptr_;
    size_ = o.size_;
    o.ptr_ = 0;
    o.size_ = 0;
  }
  return *this;
}

void DeviceBuffer::release() {
  if (ptr_ && dev_) {
    (void)dev_->makeCurrent();
    dev_->cu().cuMemFree(ptr_);
  }
  ptr_ = 0;
  dev_.reset();
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    dev_ = std::move(o.dev_);
    ptr_ = o.ptr_;
    device_ = o.device_;
    size_ = o.size_;
    o.ptr_ = nullptr;
    o.device_ = 0;
    o.size_ = 0;
  }
  return *this;
}

void PinnedBuffer::release() {
  if (ptr_ && dev_) {
    (void)dev_->makeCurrent();
    dev_->cu().cuMemFreeHost(ptr_);
  }
  ptr_ = nullptr;
  device_ = 0;
  dev_.reset();
}

template <typename H, int kKind>
void DeviceHandle<H, kKind>::reset() {
  if (h_ && dev_) {
    (void)dev_->makeCurrent();
    if constexpr (kKind == 0) dev_->cu().cuStreamDestroy(h_);
    if constexpr (kKind == 1) dev_->cu().cuEventDestroy(h_);
    if constexpr (kKind == 2) dev_->cu().cuModuleUnload(h_);
  }
  h_ = nullptr;
  dev_.reset();
}
template class DeviceHandle<CUstream, 0>;
template class DeviceHandle<CUevent, 1>;
template class DeviceHandle<CUmodule, 2>;

Result<std::shared_ptr<CudaDevice>> CudaDevice::open(int ordinal) {
  Result<const CudaDriver*> cu = CudaDriver::get();
  if (!cu) return cu.takeStatus();
  const CudaDriver& d = **cu;
  if (ordinal < 0) {
    const char* env = std::getenv("MINFER_CUDA_DEVICE");
    ordinal = (env && *env) ? std::atoi(env) : 0;
  }
  int count = 0;
  MINFER_RETURN_IF_ERROR(d.check(d.cuDeviceGetCount(&count), "CUDA: cuDeviceGetCount"));
  if (count == 0) return Status::error("CUDA: the driver reports no GPU");
  if (ordinal >= count)
    return Status::error("CUDA: device " + std::to_string(ordinal) + " requested, but only " + std::to_string(count) +
                         " GPU(s) present");
  std::shared_ptr<CudaDevice> dev(new CudaDevice());
  dev->cu_ = &d;
  MINFER_RETURN_IF_ERROR(d.check(d.cuDeviceGet(&dev->dev_, ordinal), "CUDA: cuDeviceGet"));
  MINFER_RETURN_IF_ERROR(d.check(d.cuDevicePrimaryCtxRetain(&dev->ctx_, dev->dev_), "CUDA: cuDevicePrimaryCtxRetain"));
  DeviceInfo& info = dev->info_;
  info.ordinal = ordinal;
  char name[256] = {};
  d.cuDeviceGetName(name, sizeof name, dev->dev_);
  info.name = name;
  d.cuDeviceGetAttribute(&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev->dev_);
  d.cuDeviceGetAttribute(&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev->dev_);
  d.cuDeviceGetAttribute(&info.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev->dev_);
  d.cuDeviceGetAttribute(&info.max_smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev->dev_);
  int mem_khz = 0, bus_bits = 0;
  if (d.cuDeviceGetAttribute(&mem_khz, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, dev->dev_) == CUDA_SUCCESS &&
      d.cuDeviceGetAttribute(&bus_bits, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, dev->dev_) == CUDA_SUCCESS)
    info.peak_bytes_per_s = 2.0 * mem_khz * 1e3 * bus_bits / 8;
  size_t total = 0;
  d.cuDeviceTotalMem(&total, dev->dev_);
  info.total_bytes = total;
  info.driver_version = d.driver_version;
  return dev;
}

CudaDevice::~CudaDevice() {
  if (ctx_) cu_->cuDevicePrimaryCtxRelease(dev_);
}

Status CudaDevice::makeCurrent() const { return check(cu_->cuCtxSetCurrent(ctx_), "CUDA: cuCtxSetCurrent"); }

Result<std::pair<uint64_t, uint64_t>> CudaDevice::memInfo() const {
  MINFER_RETURN_IF_ERROR(makeCurrent());
  size_t free_b = 0, total_b = 0;
  MINFER_RETURN_IF_ERROR(check(cu_->cuMemGetInfo(&free_b, &total_b), "CUDA: cuMemGetInfo"));
  return std::pair<uint64_t, uint64_t>(free_b, total_b);
}

Result<DeviceBuffer> CudaDevice::alloc(uint64_t bytes, const std::string& what) const {
  MINFER_RETURN_IF_ERROR(makeCurrent());
  DeviceBuffer b;
  if (bytes == 0) return b;
  CUdeviceptr p = 0;
  const CUresult r = cu_->cuMemAlloc(&p, bytes);
  if (r != CUDA_SUCCESS) {
    size_t free_b = 0, total_b = 0;
    cu_->cuMemGetInfo(&free_b, &total_b);
    return check(r, what + ": cannot allocate " + std::to_string(bytes) + " bytes on " + info_.name + " (" +
                        std::to_string(free_b) + " bytes free of " + std::to_string(total_b) + ")");
  }
  b.dev_ = shared_from_this();
  b.ptr_ = p;
  b.size_ = bytes;
  return b;
}

Result<PinnedBuffer> CudaDevice::allocPinned(uint64_t bytes, const std::string& what, bool mapped) const {
  MINFER_RETURN_IF_ERROR(makeCurrent());
  PinnedBuffer b;
  if (bytes == 0) return b;
  void* p = nullptr;
  MINFER_RETURN_IF_ERROR(check(cu_->cuMemHostAlloc(&p, bytes, mapped ? CU_MEMHOSTALLOC_DEVICEMAP : 0),
                               what + ": cannot allocate " + std::to_string(bytes) + " bytes of pinned host memory"));
  b.dev_ = shared_from_this();
  b.ptr_ = p;
  b.size_ = bytes;
  if (mapped)
    MINFER_RETURN_IF_ERROR(check(cu_->cuMemHostGetDevicePointer(&b.device_, p, 0), what + ": no device address for " +
                                                                                       std::to_string(bytes) +
                                                                                       " bytes of pinned host memory"));
  return b;
}

Result<Stream> CudaDevice::createStream() const {
  MINFER_RETURN_IF_ERROR(makeCurrent());
  Stream s;
  CUstream h = nullptr;
  MINFER_RETURN_IF_ERROR(check(cu_->cuStreamCreate(&h, CU_STREAM_NON_BLOCKING), "CUDA: cuStreamCreate"));
  s.dev_ = shared_from_this();
  s.h_ = h;
  return s;
}

Result<Event> CudaDevice::createEvent(bool timing) const {
  MINFER_RETURN_IF_ERROR(makeCurrent());
  Event e;
  CUevent h = nullptr;
  MINFER_RETURN_IF_ERROR(
      check(cu_->cuEventCreate(&h, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING), "CUDA: cuEventCreate"));
  e.dev_ = shared_from_this();
  e.h_ = h;
  return e;
}

Result<Module> CudaDevice::loadModule(const void* image, const std::string& what) const {
  MINFER_RETURN_IF_ERROR(makeCurrent());
  std::vector<char> log(8192, '\0');
  CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* vals[] = {log.data(), reinterpret_cast<void*>(static_cast<uintptr_t>(log.size() - 1))};
  CUmodule m = nullptr;
  const CUresult r = cu_->cuModuleLoadDataEx(&m, image, 2, opts, vals);
  if (r != CUDA_SUCCESS) {
    Status s = check(r, what + ": cuModuleLoadDataEx");
    if (log[0]) return Status::error(s.message() + "\n" + log.data());
    return s;
  }
  Module mod;
  mod.dev_ = shared_from_this();
  mod.h_ = m;
  return mod;
}

}  // namespace minfer::cuda
