// CUDA backend, plan phase: image arch choice, module loading, step/kernel checks, weight upload.
#include "runtime/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <thread>

#include "kernels/attention.cuh"
#include "kernels/mmq.cuh"
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

std::map<std::string, int64_t> parseDefines(const fb::KernelImage& img) {
  std::map<std::string, int64_t> out;
  if (!img.options()) return out;
  for (const flatbuffers::String* o : *img.options()) {
    const std::string s = o->str();
    if (s.rfind("-D", 0) != 0) continue;
    const size_t eq = s.find('=');
    if (eq == std::string::npos) continue;
    const std::string value = s.substr(eq + 1);
    char* end = nullptr;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    if (end && *end == '\0' && !value.empty()) out[s.substr(2, eq - 2)] = v;
  }
  return out;
}

const char* opName(fb::OpKind op) {
  const char* n = fb::EnumNameOpKind(op);
  return (n && *n) ? n : "unknown";
}

// Entries a step of `op` may launch, in order (kernel_spec.h in the compiler is the producer).
bool entriesMatch(fb::OpKind op, bool prefill, const std::vector<std::string>& e) {
  auto is = [&](std::initializer_list<const char*> want) {
    if (e.size() != want.size()) return false;
    size_t i = 0;
    for (const char* w : want)
      if (e[i++] != w) return false;
    return true;
  };
  switch (op) {
    case fb::OpKind::Embed: return is({"minfer_embed"});
    case fb::OpKind::RmsNorm: return is({"minfer_rms_norm"});
    case fb::OpKind::HeadRmsNorm: return is({"minfer_head_rms_norm"});
    case fb::OpKind::QuantizeAct: return is({"minfer_quantize_act"});
    case fb::OpKind::MatMul:
      return prefill ? (is({"minfer_mmq"}) || is({"minfer_dense_mm"}))
                     : (is({"minfer_gemv"}) || is({"minfer_dense_gemv"}));
    case fb::OpKind::Rope: return is({"minfer_rope"});
    case fb::OpKind::Attention:
      return prefill ? is({"minfer_kv_store", "minfer_attn_prefill"})
                     : is({"minfer_kv_store", "minfer_attn_decode", "minfer_attn_combine"});
    case fb::OpKind::SwiGlu: return is({"minfer_swiglu"});
    case fb::OpKind::Add: return is({"minfer_add"});
  }
  return false;
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

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(const ArtifactFile& artifact,
                                                         const CudaBackendOptions& options) {
  auto st = std::make_unique<State>();
  st->artifact = &artifact;
  st->options = options;
  const fb::Artifact* m = artifact.manifest();
  const std::string path = artifact.path();

  Result<std::shared_ptr<CudaDevice>> dev = CudaDevice::open(options.device);
  if (!dev) return dev.takeStatus();
  st->dev = std::move(*dev);
  const DeviceInfo& info = st->dev->info();
  if (info.cc_major < 8)
    return Status::error("CUDA: " + info.name + " is " + info.arch() +
                         "; minfer's kernels need sm_80 or newer (cp.async, int8 mma.sync)");

  // Arch choice over the archs the images actually have.
  const auto* kernels = m->kernels();
  if (!kernels || kernels->size() == 0)
    return Status::error(path + ": the artifact has no kernel images (compiled without --target); recompile with "
                                "minfer-compile --target " + info.arch());
  std::vector<std::string> archs;
  for (const fb::KernelImage* k : *kernels)
    if (std::find(archs.begin(), archs.end(), k->arch()->str()) == archs.end()) archs.push_back(k->arch()->str());
  Result<ArchChoice> choice = chooseImageArch(info.cc_major, info.cc_minor, archs);
  if (!choice) return choice.takeStatus().withContext(path + ": ");
  st->arch = *choice;

  // Steps → images of the chosen arch, loaded once each.
  std::vector<int> slot(kernels->size(), -1);
  auto load = [&](uint32_t index, const std::string& where) -> Result<int> {
    if (slot[index] >= 0) return slot[index];
    const fb::KernelImage* k = kernels->Get(index);
    const fb::Segment* seg = st->arch.jit_ptx ? k->ptx() : k->cubin();
    if (!seg || seg->size() == 0)
      return Status::error(path + ": kernels[" + std::to_string(index) + "] '" + k->key()->str() + "' has no " +
                           (st->arch.jit_ptx ? "PTX" : "cubin") + " (" + where + ")");
    const uint8_t* data = artifact.segmentData(*seg);
    if (st->arch.jit_ptx && data[seg->size() - 1] != 0)
      return Status::error(path + ": kernels[" + std::to_string(index) + "].ptx is not NUL-terminated");
    LoadedImage img;
    img.key = k->key()->str();
    img.entry = k->entry()->str();
    img.defines = parseDefines(*k);
    Result<Module> mod = st->dev->loadModule(data, path + ": kernel " + img.key);
    if (!mod) return mod.takeStatus();
    img.module = std::move(*mod);
    MINFER_RETURN_IF_ERROR(st->dev->check(st->dev->cu().cuModuleGetFunction(&img.fn, img.module.get(), img.entry.c_str()),
                                          path + ": kernel " + img.key + ": entry " + img.entry));
    // Dynamic shared memory beyond 48 KiB needs an opt-in per function.
    unsigned smem = 0;
    if (img.entry == "minfer_attn_prefill")
      smem = kern::attnPrefillSmemBytes(static_cast<unsigned>(img.define("ATT_HEAD_DIM", 0)));
    else if (img.entry == "minfer_mmq")
      smem = kern::mmqSmemBytes(static_cast<unsigned>(img.define("MMQ_TM", 0)), static_cast<unsigned>(img.define("MMQ_TN", 0)),
                                static_cast<unsigned>(img.define("MMQ_GROUP", 32)), img.define("MMQ_HAS_MIN", 0) != 0);
    if (smem > static_cast<unsigned>(info.max_smem_optin))
      return Status::error(path + ": kernel " + img.key + " needs " + std::to_string(smem) +
                           " bytes of shared memory; " + info.name + " allows " + std::to_string(info.max_smem_optin));
    if (smem > 48 * 1024)
      MINFER_RETURN_IF_ERROR(st->dev->check(
          st->dev->cu().cuFuncSetAttribute(img.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(smem)),
          path + ": kernel " + img.key + ": cuFuncSetAttribute"));
    slot[index] = static_cast<int>(st->images.size());
    st->images.push_back(std::move(img));
    return slot[index];
  };

  for (bool prefill : {true, false}) {
    const fb::Plan* plan = prefill ? m->prefill() : m->decode();
    std::vector<StepKernels>& out = prefill ? st->prefill : st->decode;
    if (!plan || !plan->steps()) continue;
    for (uint32_t i = 0; i < plan->steps()->size(); ++i) {
      const fb::Step* step = plan->steps()->Get(i);
      StepKernels sk;
      sk.step = step;
      sk.label = std::string(prefill ? "prefill" : "decode") + " step " + std::to_string(i) + " '" +
                 (step->name() ? step->name()->str() : "") + "' (" + opName(step->op()) + ")";
      const auto* list = prefill ? step->kernels_prefill() : step->kernels_decode();
      std::vector<std::string> entries;
      if (list)
        for (uint32_t idx : *list) {
          if (kernels->Get(idx)->arch()->str() != st->arch.arch) continue;
          Result<int> s = load(idx, sk.label);
          if (!s) return s.takeStatus();
          sk.images.push_back(*s);
          entries.push_back(st->images[static_cast<size_t>(*s)].entry);
        }
      if (!entriesMatch(step->op(), prefill, entries)) {
        std::string got;
        for (const std::string& e : entries) got += (got.empty() ? "" : ", ") + e;
        return Status::error(path + ": " + sk.label + " has kernels [" + got + "] for " + st->arch.arch +
                             ", which do not implement a " + opName(step->op()) + " step");
      }
      out.push_back(std::move(sk));
    }
  }
  for (uint32_t i = 0; i < kernels->size(); ++i) {
    const fb::KernelImage* k = kernels->Get(i);
    if (k->entry()->str() == "minfer_argmax" && k->arch()->str() == st->arch.arch) {
      Result<int> s = load(i, "argmax");
      if (!s) return s.takeStatus();
      st->argmax_image = *s;
    }
  }

  // Weights: every plane into one allocation (256-byte aligned each), staged through pinned buffers.
  const auto start = std::chrono::steady_clock::now();
  uint64_t total = 0;
  if (m->tensors())
    for (const fb::Tensor* t : *m->tensors())
      if (t->planes())
        for (const fb::Plane* p : *t->planes()) total += (p->data()->size() + 255) / 256 * 256;
  Result<DeviceBuffer> weights = st->dev->alloc(total, path + ": weights");
  if (!weights) return weights.takeStatus();
  st->weights = std::move(*weights);
  st->weight_bytes = total;

  // Planes → device addresses, then the bytes as chunks spread over worker threads: each worker owns
  // two pinned staging buffers and a stream, memcpy-ing one chunk from the mapping while the DMA engine
  // drains the other (page faults and copies of the mapped file run on several cores).
  struct Chunk {
    const uint8_t* src;
    CUdeviceptr dst;
    uint64_t bytes;
  };
  constexpr uint64_t kChunkBytes = 32ull << 20;
  std::vector<Chunk> chunks;
  uint64_t offset = 0;
  if (m->tensors())
    for (const fb::Tensor* t : *m->tensors()) {
      DeviceTensor dt;
      dt.name = t->name()->str();
      if (t->planes())
        for (const fb::Plane* p : *t->planes()) {
          DevicePlane dp;
          const fb::StrideTable* l = p->layout();
          dp.table.kind = static_cast<PlaneKind>(l->kind());
          dp.table.elem = static_cast<ElemType>(l->elem());
          dp.table.rows = l->rows();
          dp.table.cols = l->cols();
          dp.table.row_pitch = l->row_pitch();
          dp.table.group_size = l->group_size();
          dp.table.group_pitch = l->group_pitch();
          dp.table.bits = l->bits();
          dp.table.q_offset = l->q_offset();
          dp.table.ggml_type = l->ggml_type();
          dp.ptr = st->weights.ptr() + offset;
          const uint8_t* src = artifact.segmentData(*p->data());
          const uint64_t size = p->data()->size();
          for (uint64_t done = 0; done < size; done += kChunkBytes)
            chunks.push_back({src + done, dp.ptr + done, std::min(kChunkBytes, size - done)});
          offset += (size + 255) / 256 * 256;
          dt.planes.push_back(dp);
        }
      st->tensors.push_back(std::move(dt));
    }
  const unsigned n_workers =
      static_cast<unsigned>(std::min<size_t>({4, chunks.size(), std::max(1u, std::thread::hardware_concurrency())}));
  std::atomic<size_t> next{0};
  std::vector<Status> worker_status(n_workers);
  auto worker = [&](unsigned w) -> Status {
    const CudaDevice& dev = *st->dev;
    const CudaDriver& cu = dev.cu();
    MINFER_RETURN_IF_ERROR(dev.makeCurrent());
    Result<Stream> stream = dev.createStream();
    if (!stream) return stream.takeStatus();
    PinnedBuffer staging[2];
    Event done[2];
    bool busy[2] = {false, false};
    for (int i = 0; i < 2; ++i) {
      Result<PinnedBuffer> b = dev.allocPinned(kChunkBytes, "weight staging");
      if (!b) return b.takeStatus();
      staging[i] = std::move(*b);
      Result<Event> e = dev.createEvent();
      if (!e) return e.takeStatus();
      done[i] = std::move(*e);
    }
    int slot = 0;
    for (size_t i = next++; i < chunks.size(); i = next++) {
      const Chunk& c = chunks[i];
      if (busy[slot])
        MINFER_RETURN_IF_ERROR(dev.check(cu.cuEventSynchronize(done[slot].get()), "weight upload: cuEventSynchronize"));
      std::memcpy(staging[slot].data(), c.src, c.bytes);
      MINFER_RETURN_IF_ERROR(dev.check(cu.cuMemcpyHtoDAsync(c.dst, staging[slot].data(), c.bytes, stream->get()),
                                       "weight upload: cuMemcpyHtoDAsync of " + std::to_string(c.bytes) + " bytes"));
      MINFER_RETURN_IF_ERROR(dev.check(cu.cuEventRecord(done[slot].get(), stream->get()), "weight upload: cuEventRecord"));
      busy[slot] = true;
      slot ^= 1;
    }
    (void)w;
    return dev.check(cu.cuStreamSynchronize(stream->get()), "weight upload: cuStreamSynchronize");
  };
  {
    std::vector<std::thread> threads;
    for (unsigned w = 1; w < n_workers; ++w) threads.emplace_back([&, w] { worker_status[w] = worker(w); });
    if (n_workers > 0) worker_status[0] = worker(0);
    for (std::thread& t : threads) t.join();
  }
  for (const Status& ws : worker_status) MINFER_RETURN_IF_ERROR(ws);
  st->upload_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  char line[512];
  std::snprintf(line, sizeof line, "%s (%s, %d SMs, %.0f GB), driver %d.%d: %zu kernel images (%s), %.2f GB of "
                "weights uploaded in %.2f s",
                info.name.c_str(), info.arch().c_str(), info.sm_count, info.total_bytes / 1e9,
                info.driver_version / 1000, info.driver_version % 1000 / 10, st->images.size(),
                st->arch.note.c_str(), total / 1e9, st->upload_seconds);
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
