// CUDA backend, plan phase: image arch choice, module loading, step/kernel checks, weight upload
// (segment checksums hashed while staging).
#include "runtime/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <thread>

#include <unistd.h>
#include <xxhash.h>

#include <cerrno>

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

bool pagedPlanComplete(const std::vector<StepKernels>& plan) {
  if (plan.empty()) return false;
  for (const StepKernels& sk : plan) {
    bool positional = false;
    for (const BoundLaunch& bl : sk.launches)
      if (bl.record->args())
        for (const fb::KernelArg* a : *bl.record->args())
          positional |= a->kind() == fb::ArgKind::Positions || a->kind() == fb::ArgKind::KCache ||
                        a->kind() == fb::ArgKind::VCache;
    if (positional && sk.paged.empty()) return false;
  }
  return true;
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
    const std::pair<const char*, std::pair<const fb::Plan*, std::vector<StepKernels>*>> plans[] = {
        {"prefill", {m_->prefill(), &st_.prefill}}, {"decode", {m_->decode(), &st_.decode}}, {"load", {m_->load(), &st_.load}}};
    for (const auto& [name, which] : plans) {
      const auto [plan, out_ptr] = which;
      std::vector<StepKernels>& out = *out_ptr;
      if (!plan || !plan->steps()) continue;
      for (uint32_t i = 0; i < plan->steps()->size(); ++i) {
        const fb::Step* step = plan->steps()->Get(i);
        StepKernels sk;
        sk.step = step;
        sk.label = std::string(name) + " step " + std::to_string(i) + " '" +
                   (step->name() ? step->name()->str() : "") + "' (" + opName(step->op()) + ")";
        // A fused step (schema Step.fused) has none: the previous step's launches do its work.
        const bool none = !step->launches() || step->launches()->size() == 0;
        if (none && !step->fused()) return Status::error(path_ + ": " + sk.label + " has no launch records");
        for (uint32_t k = 0; !none && k < step->launches()->size(); ++k) {
          Result<BoundLaunch> b = bind(*step->launches()->Get(k), sk.label);
          if (!b) return b.takeStatus();
          sk.launches.push_back(*b);
        }
        if (step->paged_launches())
          for (uint32_t k = 0; k < step->paged_launches()->size(); ++k) {
            Result<BoundLaunch> b = bind(*step->paged_launches()->Get(k), sk.label + " (paged)");
            if (!b) return b.takeStatus();
            sk.paged.push_back(*b);
          }
        if (step->small_launches()) {  // the verifier allows them on prefill MatMul steps only
          for (uint32_t k = 0; k < step->small_launches()->size(); ++k) {
            Result<BoundLaunch> b = bind(*step->small_launches()->Get(k), sk.label + " (small batch)");
            if (!b) return b.takeStatus();
            sk.small.push_back(*b);
          }
          sk.small_rows = sk.small.empty() ? 0 : step->small_rows();
        }
        out.push_back(std::move(sk));
      }
    }
    st_.paged = pagedPlanComplete(st_.prefill);
    st_.paged_decode = st_.paged && pagedPlanComplete(st_.decode);
    if (m_->argmax()) {
      Result<BoundLaunch> b = bind(*m_->argmax(), "argmax");
      if (!b) return b.takeStatus();
      st_.argmax = *b;
    }
    if (m_->topk()) {
      Result<BoundLaunch> b = bind(*m_->topk(), "topk");
      if (!b) return b.takeStatus();
      st_.topk = *b;
    }
    return Status::ok();
  }

  Status uploadWeights();
  Status runLoadPlan();
  Status verifyRest() const;

 private:
  // Notes that `ref` (an entry of the artifact's segments()) has been hashed.
  void markVerified(const ArtifactFile::SegmentRef* ref) {
    if (verified_.empty()) verified_.assign(st_.artifact->segments().size(), false);
    verified_[static_cast<size_t>(ref - st_.artifact->segments().data())] = true;
  }

  // With verify_checksums: the XXH64 of a kernel image (cubin or PTX), before the driver sees it.
  Status verifyImage(const fb::Segment& seg) {
    if (!st_.options.verify_checksums) return Status::ok();
    const ArtifactFile::SegmentRef* ref = st_.artifact->findSegment(seg);
    if (!ref) return Status::ok();  // empty: load() refuses it
    const uint64_t hash = XXH64(st_.artifact->segmentData(seg), seg.size(), 0);
    if (hash != seg.xxh64()) return st_.artifact->checksumMismatch(*ref, hash, kChecksumHint);
    markVerified(ref);
    return Status::ok();
  }

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
    MINFER_RETURN_IF_ERROR(verifyImage(*seg));
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
      const size_t want =
          kind == fb::ArgKind::TokenCount || kind == fb::ArgKind::Int || kind == fb::ArgKind::BlockSize ? 4 : sizeof(CUdeviceptr);
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
  std::vector<bool> verified_;  // per entry of the artifact's segments(): hashed already
};

// Device bytes of a plane (256-byte aligned): its stride table's size (stored planes: = the segment's,
// the verifier checked; derived planes have no segment).
uint64_t deviceBytes(const fb::Plane& p) { return (p.layout()->rows() * p.layout()->row_pitch() + 255) / 256 * 256; }

// Weights: every plane into one allocation (256-byte aligned each), staged through pinned buffers
// (uploadSegments), each plane's XXH64 streamed over its bytes as they are staged. Derived planes get
// their device memory here, zeroed (their row padding), and are written by runLoadPlan.
Status BackendLoader::uploadWeights() {
  const auto start = std::chrono::steady_clock::now();
  uint64_t total = 0;
  if (m_->tensors())
    for (const fb::Tensor* t : *m_->tensors())
      if (t->planes())
        for (const fb::Plane* p : *t->planes()) {
          total += deviceBytes(*p);
          if (p->derived()) st_.derived_bytes += deviceBytes(*p);
        }
  Result<DeviceBuffer> weights = st_.dev->alloc(total, path_ + ": weights");
  if (!weights) return weights.takeStatus();
  st_.weights = std::move(*weights);
  st_.weight_bytes = total;

  std::vector<UploadSegment> segments;
  std::vector<const fb::Segment*> sources;  // parallel to segments
  uint64_t offset = 0;
  if (m_->tensors())
    for (const fb::Tensor* t : *m_->tensors()) {
      DeviceTensor dt;
      dt.name = t->name()->str();
      if (t->planes())
        for (const fb::Plane* p : *t->planes()) {
          DevicePlane dp{toStrideTable(*p->layout()), st_.weights.ptr() + offset};
          if (p->derived()) {
            MINFER_RETURN_IF_ERROR(st_.dev->check(
                st_.dev->cu().cuMemsetD8Async(dp.ptr, 0, deviceBytes(*p), nullptr), path_ + ": zeroing a derived plane"));
          } else {
            segments.push_back({st_.artifact->segmentData(*p->data()), dp.ptr, p->data()->size(), st_.artifact->fd(),
                                p->data()->offset()});
            sources.push_back(p->data());
          }
          offset += deviceBytes(*p);
          dt.planes.push_back(dp);
        }
      st_.tensors.push_back(std::move(dt));
    }
  const bool verify = st_.options.verify_checksums;
  std::vector<uint64_t> hashes;
  MINFER_RETURN_IF_ERROR(uploadSegments(*st_.dev, segments, verify ? &hashes : nullptr));
  st_.upload_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!verify) return Status::ok();
  const ArtifactFile::SegmentRef* damaged = nullptr;  // the one with the lowest offset
  uint64_t damaged_hash = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const ArtifactFile::SegmentRef* ref = st_.artifact->findSegment(*sources[i]);
    if (!ref) continue;  // empty
    markVerified(ref);
    if (hashes[i] != ref->segment->xxh64() && (!damaged || ref->segment->offset() < damaged->segment->offset())) {
      damaged = ref;
      damaged_hash = hashes[i];
    }
  }
  if (damaged) return st_.artifact->checksumMismatch(*damaged, damaged_hash, kChecksumHint);
  return Status::ok();
}

// The load plan (ExpandBlocks steps): each launch reads a stored kBlocks plane and writes derived
// planes (the verifier checked which planes each argument binds and that every derived plane is
// written once). Runs after uploadWeights, which zeroed the derived planes on the same (null) stream.
Status BackendLoader::runLoadPlan() {
  if (st_.load.empty()) return Status::ok();
  const auto start = std::chrono::steady_clock::now();
  const CudaDriver& cu = st_.dev->cu();
  for (const StepKernels& sk : st_.load)
    for (const BoundLaunch& b : sk.launches) {
      const fb::Launch& l = *b.record;
      CUdeviceptr args[kArtifactMaxKernelArgs] = {};
      void* argp[kArtifactMaxKernelArgs] = {};
      const uint32_t n = l.args() ? l.args()->size() : 0;
      for (uint32_t i = 0; i < n; ++i) {
        const fb::KernelArg* a = l.args()->Get(i);
        if (a->kind() == fb::ArgKind::Weight)
          args[i] = st_.tensors[a->tensor()].plane(static_cast<PlaneKind>(a->plane()->kind()));
        else if (a->kind() != fb::ArgKind::Null)
          return Status::error(path_ + ": " + sk.label + ": argument " + std::to_string(i) + " is a " +
                               fb::EnumNameArgKind(a->kind()) + "; load-plan kernels take weight planes only");
        argp[i] = &args[i];
      }
      const kern::LaunchShape s = launchRule(l).at(1);
      MINFER_RETURN_IF_ERROR(st_.dev->check(cu.cuLaunchKernel(st_.images[b.image].fn, s.grid.x, s.grid.y, s.grid.z,
                                                              s.block.x, s.block.y, s.block.z, s.smem, nullptr, argp,
                                                              nullptr),
                                            path_ + ": " + sk.label + ": launch of " + st_.images[b.image].entry));
    }
  MINFER_RETURN_IF_ERROR(st_.dev->check(cu.cuCtxSynchronize(), path_ + ": the load plan (plane expansion)"));
  st_.expand_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::ok();
}

// Segments neither uploaded nor loaded (kernel images of other archs, images no launch uses): small,
// hashed in one pass so that every data segment of the artifact has been checked.
Status BackendLoader::verifyRest() const {
  if (!st_.options.verify_checksums) return Status::ok();
  const ArtifactFile::SegmentRef* first = st_.artifact->segments().data();
  return st_.artifact->verifySegments([&](const ArtifactFile::SegmentRef& ref) {
    return verified_.empty() || !verified_[static_cast<size_t>(&ref - first)];
  });
}

}  // namespace

namespace {

// Reads exactly n bytes of fd at `offset` into dst (pread, retried on EINTR and short reads).
Status readFull(int fd, uint8_t* dst, uint64_t n, uint64_t offset) {
  for (uint64_t done = 0; done < n;) {
    const ssize_t r = ::pread(fd, dst + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      return Status::error("weight upload: reading " + std::to_string(n - done) + " bytes at file offset " +
                           std::to_string(offset + done) + " failed: " +
                           (r < 0 ? std::string(std::strerror(errno)) : std::string("end of file")));
    done += static_cast<uint64_t>(r);
  }
  return Status::ok();
}

// One upload worker: a stream, two pinned staging buffers and their events.
class StagingWorker {
 public:
  explicit StagingWorker(const CudaDevice& dev) : dev_(dev) {}
  // After a failed send() copies may still read the staging buffers: wait before freeing them.
  ~StagingWorker() {
    if (stream_.get()) dev_.cu().cuStreamSynchronize(stream_.get());
  }
  StagingWorker(const StagingWorker&) = delete;
  StagingWorker& operator=(const StagingWorker&) = delete;

  Status init() {
    MINFER_RETURN_IF_ERROR(dev_.makeCurrent());
    Result<Stream> stream = dev_.createStream();
    if (!stream) return stream.takeStatus();
    stream_ = std::move(*stream);
    for (int i = 0; i < 2; ++i) {
      Result<PinnedBuffer> b = dev_.allocPinned(kUploadChunkBytes, "weight staging");
      if (!b) return b.takeStatus();
      staging_[i] = std::move(*b);
      Result<Event> e = dev_.createEvent();
      if (!e) return e.takeStatus();
      done_[i] = std::move(*e);
    }
    return Status::ok();
  }

  // Sends `seg` chunk by chunk, in order; with `state`, XXH64_update over each staged piece.
  Status send(const UploadSegment& seg, XXH64_state_t* state) {
    const CudaDriver& cu = dev_.cu();
    for (uint64_t done = 0; done < seg.bytes; done += kUploadChunkBytes) {
      const uint64_t bytes = std::min(kUploadChunkBytes, seg.bytes - done);
      if (busy_[slot_])
        MINFER_RETURN_IF_ERROR(dev_.check(cu.cuEventSynchronize(done_[slot_].get()), "weight upload: cuEventSynchronize"));
      uint8_t* staged = static_cast<uint8_t*>(staging_[slot_].data());
      for (uint64_t at = 0; at < bytes; at += kHashPieceBytes) {
        const uint64_t n = std::min(kHashPieceBytes, bytes - at);
        if (seg.fd >= 0)
          MINFER_RETURN_IF_ERROR(readFull(seg.fd, staged + at, n, seg.file_offset + done + at));
        else
          std::memcpy(staged + at, seg.src + done + at, n);
        if (state) XXH64_update(state, staged + at, n);  // the bytes the DMA sends, still in L2
      }
      MINFER_RETURN_IF_ERROR(dev_.check(cu.cuMemcpyHtoDAsync(seg.dst + done, staged, bytes, stream_.get()),
                                        "weight upload: cuMemcpyHtoDAsync of " + std::to_string(bytes) + " bytes"));
      MINFER_RETURN_IF_ERROR(dev_.check(cu.cuEventRecord(done_[slot_].get(), stream_.get()), "weight upload: cuEventRecord"));
      busy_[slot_] = true;
      slot_ ^= 1;
    }
    return Status::ok();
  }

  Status finish() { return dev_.check(dev_.cu().cuStreamSynchronize(stream_.get()), "weight upload: cuStreamSynchronize"); }

 private:
  const CudaDevice& dev_;
  Stream stream_;
  PinnedBuffer staging_[2];
  Event done_[2];
  bool busy_[2] = {false, false};
  int slot_ = 0;
};

}  // namespace

Status uploadSegments(const CudaDevice& dev, const std::vector<UploadSegment>& segments, std::vector<uint64_t>* hashes) {
  std::vector<size_t> order(segments.size());  // largest first, so the workers finish together
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return segments[a].bytes > segments[b].bytes; });
  if (hashes) hashes->assign(segments.size(), 0);
  // Measured on an H200 host, the 7B's 4.76 GB of compact planes read with pread, hashed: 8 workers with
  // 4 MiB staging buffers 0.22 s; 8 MB 0.26 s, 16 MB 0.33-0.37 s, 32 MB 0.48-0.50 s (pinning the
  // buffers is part of the cost); 4 workers 0.30-0.55 s; 12 and 16 workers (32 MB) slower than 8.
  const size_t max_workers = 8;
  const unsigned n_workers =
      static_cast<unsigned>(std::min<size_t>({max_workers, segments.size(), std::max(1u, std::thread::hardware_concurrency())}));
  std::atomic<size_t> next{0};
  std::vector<Status> worker_status(n_workers);
  auto worker = [&]() -> Status {
    StagingWorker w(dev);
    MINFER_RETURN_IF_ERROR(w.init());
    std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> state(hashes ? XXH64_createState() : nullptr,
                                                                           XXH64_freeState);
    if (hashes && !state) return Status::error("weight upload: cannot allocate an XXH64 state");
    for (size_t k = next++; k < order.size(); k = next++) {
      if (state) XXH64_reset(state.get(), 0);
      MINFER_RETURN_IF_ERROR(w.send(segments[order[k]], state.get()));
      if (state) (*hashes)[order[k]] = XXH64_digest(state.get());
    }
    return w.finish();
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
  MINFER_RETURN_IF_ERROR(loader.runLoadPlan());
  MINFER_RETURN_IF_ERROR(loader.verifyRest());

  const DeviceInfo& info = st->dev->info();
  char line[512];
  std::snprintf(line, sizeof line, "%s (%s, %d SMs, %.0f GB), driver %d.%d: %zu kernel images (%s), %.2f GB of "
                "weights uploaded in %.2f s",
                info.name.c_str(), info.arch().c_str(), info.sm_count, info.total_bytes / 1e9,
                info.driver_version / 1000, info.driver_version % 1000 / 10, st->images.size(),
                st->arch.note.c_str(), (st->weight_bytes - st->derived_bytes) / 1e9, st->upload_seconds);
  if (st->derived_bytes > 0)
    std::snprintf(line + std::strlen(line), sizeof line - std::strlen(line), ", %.2f GB expanded from them in %.3f s",
                  st->derived_bytes / 1e9, st->expand_seconds);
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
