// CUDA backend, plan phase: image arch choice, module loading, step/kernel checks, weight upload.
#include "runtime/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <thread>

#include "schema/op_traits.h"
#include "runtime/cuda/cuda_internal.h"

namespace minfer {
namespace cuda {
namespace {

// "sm_90a" → (90, true); (0, false) when malformed.
std::pair<int, bool> parseArch(const std::string& arch) {
  if (arch.rfind("sm_", 0) != 0) return {0, false};
  std::string digits = arch.substr(3);
  const bool specific = !digits.empty() && digits.back() == 'a';
  if (specific) digits.pop_back();
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return {0, false};
  return {std::atoi(digits.c_str()), specific};
}

std::string joinArchs(const std::vector<std::string>& archs) {
  std::string s;
  for (const std::string& a : archs) s += (s.empty() ? "" : ", ") + a;
  return s.empty() ? "none" : s;
}

}  // namespace

Result<ArchChoice> chooseImageArch(int cc_major, int cc_minor, const std::vector<std::string>& artifact_archs) {
  const int cc = cc_major * 10 + cc_minor;
  const std::string gpu = "sm_" + std::to_string(cc);
  ArchChoice c;
  for (const std::string& a : artifact_archs)  // exact match: plain arch first, then the "a" variant
    if (a == gpu) {
      c.arch = a;
      c.note = "cubins for " + a;
      return c;
    }
  for (const std::string& a : artifact_archs)
    if (a == gpu + "a") {
      c.arch = a;
      c.note = "cubins for " + a;
      return c;
    }
  int best = 0;
  for (const std::string& a : artifact_archs) {
    const auto [n, specific] = parseArch(a);
    if (!specific && n > 0 && n <= cc && n > best) {
      best = n;
      c.arch = a;
    }
  }
  if (best > 0) {
    c.jit_ptx = true;
    c.note = "no cubin for " + gpu + ": the driver JIT-compiles the " + c.arch + " PTX (slower first load)";
    return c;
  }
  return Status::error("CUDA: the GPU is " + gpu + " but the artifact holds kernel images for " +
                       joinArchs(artifact_archs) + " only; recompile with minfer-compile --target " + gpu);
}

CudaBackend::CudaBackend(std::unique_ptr<State> state) : s_(std::move(state)) {}
CudaBackend::~CudaBackend() = default;
const std::string& CudaBackend::note() const { return s_->note; }
uint64_t CudaBackend::weightBytes() const { return s_->weight_bytes; }
double CudaBackend::uploadSeconds() const { return s_->upload_seconds; }

kern::LaunchRule launchRule(const fb::Launch& record) {
  kern::LaunchRule r;
  const auto copy = [](const fb::Grid& g, kern::GridExtent (&out)[3]) {
    const fb::GridExtent* e[3] = {&g.x(), &g.y(), &g.z()};
    for (int d = 0; d < 3; ++d) out[d] = {e[d]->per_token(), e[d]->constant(), e[d]->divisor()};
  };
  copy(*record.grid(), r.grid);
  if (record.grid_large()) copy(*record.grid_large(), r.grid_large);
  r.large_from = record.large_from();
  r.block = {record.block()->x(), record.block()->y(), record.block()->z()};
  r.smem = record.smem();
  return r;
}

namespace {

// The plan phase of CudaBackend::create, one step per function: device and arch, kernel images
// bound to the plans' launch records, weights.
class BackendLoader {
 public:
  BackendLoader(CudaBackend::State& st) : st_(st), m_(st.artifact->manifest()), path_(st.artifact->path()) {}

  Status chooseArch() {
    const DeviceInfo& info = st_.dev->info();
    if (info.cc_major < 8)
      return Status::error("CUDA: " + info.name + " is " + info.arch() +
                           "; minfer's kernels need sm_80 or newer (cp.async, int8 mma.sync)");
    const auto* archs = m_->target_archs();
    if (!m_->kernels() || m_->kernels()->size() == 0 || !archs || archs->size() == 0)
      return Status::error(path_ + ": the artifact has no kernel images (compiled without --target); recompile with "
                                   "minfer-compile --target " + info.arch());
    std::vector<std::string> names;
    for (const flatbuffers::String* a : *archs) names.push_back(a->str());
    Result<ArchChoice> choice = chooseImageArch(info.cc_major, info.cc_minor, names);
    if (!choice) return choice.takeStatus().withContext(path_ + ": ");
    st_.arch = *choice;
    arch_index_ = static_cast<uint32_t>(std::find(names.begin(), names.end(), st_.arch.arch) - names.begin());
    slot_.assign(m_->kernels()->size(), -1);
    return Status::ok();
  }

  // Every step's launch records → the images of the chosen arch, loaded once each.
  Status bindPlans() {
    for (bool prefill : {true, false}) {
      const fb::Plan* plan = prefill ? m_->prefill() : m_->decode();
      std::vector<StepKernels>& out = prefill ? st_.prefill : st_.decode;
      if (!plan || !plan->steps()) continue;
      for (uint32_t i = 0; i < plan->steps()->size(); ++i) {
        const fb::Step* step = plan->steps()->Get(i);
        StepKernels sk;
        sk.step = step;
        sk.label = std::string(prefill ? "prefill" : "decode") + " step " + std::to_string(i) + " '" +
                   (step->name() ? step->name()->str() : "") + "' (" + opName(step->op()) + ")";
        if (!step->launches() || step->launches()->size() == 0)
          return Status::error(path_ + ": " + sk.label + " has no launch records");
        for (const fb::Launch* l : *step->launches()) {
          Result<BoundLaunch> b = bind(*l, sk.label);
          if (!b) return b.takeStatus();
          sk.launches.push_back(*b);
        }
        out.push_back(std::move(sk));
      }
    }
    if (m_->argmax()) {
      Result<BoundLaunch> b = bind(*m_->argmax(), "argmax");
      if (!b) return b.takeStatus();
      st_.argmax = *b;
    }
    return Status::ok();
  }

  Status uploadWeights();

 private:
  Result<BoundLaunch> bind(const fb::Launch& l, const std::string& where) {
    Result<int> image = load(l.images()->Get(arch_index_), where);
    if (!image) return image.takeStatus();
    MINFER_RETURN_IF_ERROR(checkParams(l, st_.images[*image], where));
    MINFER_RETURN_IF_ERROR(optIn(st_.images[*image], l.smem()));
    return BoundLaunch{&l, *image};
  }

  Result<int> load(uint32_t index, const std::string& where) {
    if (slot_[index] >= 0) return slot_[index];
    const fb::KernelImage* k = m_->kernels()->Get(index);
    const fb::Segment* seg = st_.arch.jit_ptx ? k->ptx() : k->cubin();
    if (!seg || seg->size() == 0)
      return Status::error(path_ + ": kernels[" + std::to_string(index) + "] '" + k->key()->str() + "' has no " +
                           (st_.arch.jit_ptx ? "PTX" : "cubin") + " (" + where + ")");
    const uint8_t* data = st_.artifact->segmentData(*seg);
    if (st_.arch.jit_ptx && data[seg->size() - 1] != 0)
      return Status::error(path_ + ": kernels[" + std::to_string(index) + "].ptx is not NUL-terminated");
    LoadedImage img;
    img.key = k->key()->str();
    img.entry = k->entry()->str();
    Result<Module> mod = st_.dev->loadModule(data, path_ + ": kernel " + img.key);
    if (!mod) return mod.takeStatus();
    img.module = std::move(*mod);
    MINFER_RETURN_IF_ERROR(st_.dev->check(
        st_.dev->cu().cuModuleGetFunction(&img.fn, img.module.get(), img.entry.c_str()),
        path_ + ": kernel " + img.key + ": entry " + img.entry));
    slot_[index] = static_cast<int>(st_.images.size());
    st_.images.push_back(std::move(img));
    return slot_[index];
  }

  // The kernel's own parameters (cuFuncGetParamInfo) against the record's argument kinds: each of the
  // size the binder passes (8-byte pointers, 4-byte ints), and no argument past the kernel's last
  // parameter. (A record with fewer arguments than the kernel takes would need a failing probe call
  // to see, which compute-sanitizer reports; tests/codegen checks every image's PTX signature instead.)
  Status checkParams(const fb::Launch& l, const LoadedImage& img, const std::string& where) const {
    const uint32_t n = l.args() ? l.args()->size() : 0;
    const CudaDriver& cu = st_.dev->cu();
    for (uint32_t i = 0; i < n; ++i) {
      size_t offset = 0, size = 0;
      if (cu.cuFuncGetParamInfo(img.fn, i, &offset, &size) != CUDA_SUCCESS)
        return Status::error(path_ + ": " + where + ": kernel " + img.key + " takes " + std::to_string(i) +
                             " arguments; its launch record has " + std::to_string(n));
      const fb::ArgKind kind = l.args()->Get(i)->kind();
      const size_t want = kind == fb::ArgKind::TokenCount || kind == fb::ArgKind::Int ? 4 : sizeof(CUdeviceptr);
      if (size != want)
        return Status::error(path_ + ": " + where + ": kernel " + img.key + " argument " + std::to_string(i) + " is " +
                             std::to_string(size) + " bytes; the launch record passes a " +
                             fb::EnumNameArgKind(kind) + " of " + std::to_string(want));
    }
    return Status::ok();
  }

  // Dynamic shared memory beyond 48 KiB needs an opt-in per function.
  Status optIn(LoadedImage& img, unsigned smem) const {
    const DeviceInfo& info = st_.dev->info();
    if (smem > static_cast<unsigned>(info.max_smem_optin))
      return Status::error(path_ + ": kernel " + img.key + " needs " + std::to_string(smem) +
                           " bytes of shared memory; " + info.name + " allows " + std::to_string(info.max_smem_optin));
    if (smem <= 48 * 1024 || smem <= img.smem_optin) return Status::ok();
    MINFER_RETURN_IF_ERROR(st_.dev->check(
        st_.dev->cu().cuFuncSetAttribute(img.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(smem)),
        path_ + ": kernel " + img.key + ": cuFuncSetAttribute"));
    img.smem_optin = smem;
    return Status::ok();
  }

  CudaBackend::State& st_;
  const fb::Artifact* m_;
  const std::string path_;
  uint32_t arch_index_ = 0;
  std::vector<int> slot_;  // kernel index → index into st_.images, −1 before loading
};

// Weights: every plane into one allocation (256-byte aligned each), staged through pinned buffers.
// Planes → device addresses, then the bytes as chunks spread over worker threads: each worker owns
// two pinned staging buffers and a stream, memcpy-ing one chunk from the mapping while the DMA engine
// drains the other (page faults and copies of the mapped file run on several cores).
Status BackendLoader::uploadWeights() {
  const auto start = std::chrono::steady_clock::now();
  uint64_t total = 0;
  if (m_->tensors())
    for (const fb::Tensor* t : *m_->tensors())
      if (t->planes())
        for (const fb::Plane* p : *t->planes()) total += (p->data()->size() + 255) / 256 * 256;
  Result<DeviceBuffer> weights = st_.dev->alloc(total, path_ + ": weights");
  if (!weights) return weights.takeStatus();
  st_.weights = std::move(*weights);
  st_.weight_bytes = total;

  std::vector<UploadChunk> chunks;
  uint64_t offset = 0;
  if (m_->tensors())
    for (const fb::Tensor* t : *m_->tensors()) {
      DeviceTensor dt;
      dt.name = t->name()->str();
      if (t->planes())
        for (const fb::Plane* p : *t->planes()) {
          DevicePlane dp{toStrideTable(*p->layout()), st_.weights.ptr() + offset};
          const uint8_t* src = st_.artifact->segmentData(*p->data());
          const uint64_t size = p->data()->size();
          for (uint64_t done = 0; done < size; done += kUploadChunkBytes)
            chunks.push_back({src + done, dp.ptr + done, std::min(kUploadChunkBytes, size - done)});
          offset += (size + 255) / 256 * 256;
          dt.planes.push_back(dp);
        }
      st_.tensors.push_back(std::move(dt));
    }
  MINFER_RETURN_IF_ERROR(uploadChunks(*st_.dev, chunks));
  st_.upload_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::ok();
}

}  // namespace

Status uploadChunks(const CudaDevice& dev, const std::vector<UploadChunk>& chunks) {
  const unsigned n_workers =
      static_cast<unsigned>(std::min<size_t>({4, chunks.size(), std::max(1u, std::thread::hardware_concurrency())}));
  std::atomic<size_t> next{0};
  std::vector<Status> worker_status(n_workers);
  auto worker = [&]() -> Status {
    const CudaDriver& cu = dev.cu();
    MINFER_RETURN_IF_ERROR(dev.makeCurrent());
    Result<Stream> stream = dev.createStream();
    if (!stream) return stream.takeStatus();
    PinnedBuffer staging[2];
    Event done[2];
    bool busy[2] = {false, false};
    for (int i = 0; i < 2; ++i) {
      Result<PinnedBuffer> b = dev.allocPinned(kUploadChunkBytes, "weight staging");
      if (!b) return b.takeStatus();
      staging[i] = std::move(*b);
      Result<Event> e = dev.createEvent();
      if (!e) return e.takeStatus();
      done[i] = std::move(*e);
    }
    int slot = 0;
    for (size_t i = next++; i < chunks.size(); i = next++) {
      const UploadChunk& c = chunks[i];
      if (busy[slot])
        MINFER_RETURN_IF_ERROR(dev.check(cu.cuEventSynchronize(done[slot].get()), "weight upload: cuEventSynchronize"));
      std::memcpy(staging[slot].data(), c.src, c.bytes);
      MINFER_RETURN_IF_ERROR(dev.check(cu.cuMemcpyHtoDAsync(c.dst, staging[slot].data(), c.bytes, stream->get()),
                                       "weight upload: cuMemcpyHtoDAsync of " + std::to_string(c.bytes) + " bytes"));
      MINFER_RETURN_IF_ERROR(dev.check(cu.cuEventRecord(done[slot].get(), stream->get()), "weight upload: cuEventRecord"));
      busy[slot] = true;
      slot ^= 1;
    }
    return dev.check(cu.cuStreamSynchronize(stream->get()), "weight upload: cuStreamSynchronize");
  };
  {
    std::vector<std::thread> threads;
    for (unsigned w = 1; w < n_workers; ++w) threads.emplace_back([&, w] { worker_status[w] = worker(); });
    if (n_workers > 0) worker_status[0] = worker();
    for (std::thread& t : threads) t.join();
  }
  for (const Status& ws : worker_status) MINFER_RETURN_IF_ERROR(ws);
  return Status::ok();
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(const ArtifactFile& artifact,
                                                         const CudaBackendOptions& options) {
  auto st = std::make_unique<State>();
  st->artifact = &artifact;
  st->options = options;
  Result<std::shared_ptr<CudaDevice>> dev = CudaDevice::open(options.device);
  if (!dev) return dev.takeStatus();
  st->dev = std::move(*dev);
  BackendLoader loader(*st);
  MINFER_RETURN_IF_ERROR(loader.chooseArch());
  MINFER_RETURN_IF_ERROR(loader.bindPlans());
  MINFER_RETURN_IF_ERROR(loader.uploadWeights());

  const DeviceInfo& info = st->dev->info();
  char line[512];
  std::snprintf(line, sizeof line, "%s (%s, %d SMs, %.0f GB), driver %d.%d: %zu kernel images (%s), %.2f GB of "
                "weights uploaded in %.2f s",
                info.name.c_str(), info.arch().c_str(), info.sm_count, info.total_bytes / 1e9,
                info.driver_version / 1000, info.driver_version % 1000 / 10, st->images.size(),
                st->arch.note.c_str(), st->weight_bytes / 1e9, st->upload_seconds);
  st->note = line;
  return std::make_unique<CudaBackend>(std::move(st));
}

}  // namespace cuda

Result<std::unique_ptr<Backend>> createCudaBackend(const ArtifactFile& artifact, const CudaBackendOptions& options) {
  Result<std::unique_ptr<cuda::CudaBackend>> b = cuda::CudaBackend::create(artifact, options);
  if (!b) return b.takeStatus();
  return std::unique_ptr<Backend>(std::move(*b));
}

}  // namespace minfer
