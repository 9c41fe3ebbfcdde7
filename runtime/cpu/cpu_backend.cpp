// CPU backend: interprets the artifact's execution plan with the float32 reference ops (cpu_ops.h).
//
// Creation (plan phase) resolves every weight a step uses into plane views of the mapped artifact,
// materializes norm weights and biases as float vectors, and checks every step's buffers, weights and
// parameters against each other (one op family per op: ops/<family>.cpp, see cpu_step.h). A session
// (allocate phase) then owns the activation buffers (max_batch rows of each F32/I32 buffer the CPU
// uses; GPU-only I8 buffers are not allocated), an f32 KV cache of n_ctx positions per attention
// layer (a sliding-window layer with a ring, schema Step.kv_ring: min(n_ctx, kv_ring) positions, position p
// in slot p % kv_ring), per-thread scratch and a thread pool (CpuExecutor, shared with the batched sessions of
// cpu_batch_session.cpp); forward() (execute phase) allocates nothing. Skipped
// on the CPU: QuantizeAct steps, kPacked planes, and the 2nd+ inputs of MatMul (GPU-side quantized
// copies of the input).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "minfer/artifact.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_ops.h"
#include "runtime/kv_ring.h"
#include "schema/op_traits.h"

namespace minfer {
namespace cpu {
namespace {

// Bytes of memory a new allocation may still take: /proc/meminfo's MemAvailable (Linux's estimate of what can be
// had without swapping), less where the process's cgroup (v2: memory.max − memory.current) allows less; 0 where
// neither can be read.
uint64_t memAvailable() {
  uint64_t available = 0;
  {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    uint64_t kb = 0;
    while (in >> key >> kb) {
      if (key == "MemAvailable:") {
        available = kb * 1024;
        break;
      }
      std::getline(in, unit);  // the rest of the line ("kB")
    }
  }
  uint64_t max = 0, current = 0;
  if ((std::ifstream("/sys/fs/cgroup/memory.max") >> max) && (std::ifstream("/sys/fs/cgroup/memory.current") >> current)) {
    const uint64_t room = max > current ? max - current : 0;  // "max" (no limit) does not parse as a number
    available = available > 0 ? std::min(available, room) : room;
  }
  return available;
}

// One sequence in a contiguous cache of n_ctx positions: the executor's special case of one block; the
// layers with a ring (schema Step.kv_ring) keep theirs, which rings_ tracks.
class CpuSession final : public BackendSession {
 public:
  CpuSession(const CpuBackend& backend, int n_ctx, int n_threads)
      : backend_(backend), exec_(backend, n_threads), n_ctx_(n_ctx) {}
  Status allocate() {
    for (const auto& [layer, shape] : backend_.plan_.kv_layers) rings_.addLayer(shape.ring, shape.window, n_ctx_);
    return exec_.allocate(n_ctx_, n_ctx_, "a CPU session with n_ctx = " + std::to_string(n_ctx_), /*rings=*/true);
  }
  Status forward(std::span<const int32_t> tokens, int pos0, float* logits, bool all_rows) override;
  Result<std::span<const float>> forwardLast(std::span<const int32_t> tokens, int pos0) override;
  bool canResumeAt(int pos0) const override { return rings_.canResumeAt(pos0); }
  int maxBatch() const override { return exec_.maxBatch(); }
  int contextLength() const override { return n_ctx_; }
  uint64_t allocatedBytes() const override { return exec_.allocatedBytes(); }
  uint64_t kvCacheBytes() const override { return exec_.kvCacheBytes(); }

 private:
  // Runs the plan on tokens at pos0; the executor then holds the logits of the last row (all_rows: of every row).
  Status run(std::span<const int32_t> tokens, int pos0, bool all_rows);

  const CpuBackend& backend_;
  CpuExecutor exec_;
  int n_ctx_;
  KvRingTracker rings_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Plan phase.

Status CpuBackend::init() {
  PrepareContext& p = plan_;
  const fb::MemoryPlan* mem = p.m->memory();
  if (!mem || !mem->buffers()) return Status::error(p.file.path() + ": the artifact has no memory plan");
  // The verifier bounds memory.max_batch to 1..kArtifactMaxBatch.
  static_assert(kArtifactMaxBatch <= (1u << 30), "max_batch rows fit an int with room for row offsets");
  p.max_batch = static_cast<int>(mem->max_batch());
  p.n_vocab = static_cast<int>(p.m->config()->n_vocab());
  const auto* bufs = mem->buffers();
  p.ids = mem->input_ids();
  p.logits = mem->logits();
  if (p.ids >= bufs->size() || bufs->Get(p.ids)->type() != fb::BufferType::I32 || bufs->Get(p.ids)->width() != 1)
    return Status::error(p.file.path() + ": memory.input_ids = " + std::to_string(p.ids) +
                         " is not an I32 buffer of width 1");
  if (p.logits >= bufs->size() || bufs->Get(p.logits)->type() != fb::BufferType::F32 ||
      bufs->Get(p.logits)->width() != static_cast<uint32_t>(p.n_vocab) || p.n_vocab < 1)
    return Status::error(p.file.path() + ": memory.logits = " + std::to_string(p.logits) +
                         " is not an F32 buffer of width n_vocab = " + std::to_string(p.n_vocab));
  const size_t n_tensors = p.m->tensors() ? p.m->tensors()->size() : 0;
  p.weights.resize(n_tensors);
  p.resolved.assign(n_tensors, false);
  p.vectors.resize(n_tensors);
  p.used.assign(bufs->size(), false);
  p.used[p.ids] = p.used[p.logits] = true;

  const fb::Plan* prefill = p.m->prefill() && p.m->prefill()->steps() ? p.m->prefill() : nullptr;
  const fb::Plan* decode = p.m->decode() && p.m->decode()->steps() ? p.m->decode() : nullptr;
  if (!prefill && !decode)
    return Status::error(p.file.path() + ": the artifact has neither a prefill nor a decode plan");
  MINFER_RETURN_IF_ERROR(prepare(prefill ? prefill : decode, prefill ? "prefill" : "decode", prefill_));
  MINFER_RETURN_IF_ERROR(prepare(decode ? decode : prefill, decode ? "decode" : "prefill", decode_));
  return Status::ok();
}

Status CpuBackend::prepare(const fb::Plan* plan, const char* which, PreparedPlan& out) {
  out.steps.resize(plan->steps()->size());
  for (uint32_t i = 0; i < plan->steps()->size(); ++i) {
    const fb::Step* s = plan->steps()->Get(i);
    StepInfo& info = out.steps[i];
    info.op = s->op();
    info.tail = s->tail();
    info.label = plan_.file.path() + ": " + which + " step " + std::to_string(i) + " '" +
                 (s->name() ? s->name()->str() : std::string()) + "' (" + opName(s->op()) + ")";
    MINFER_RETURN_IF_ERROR(prepareStep(plan_, *s, info));
  }
  findTail(out, plan_.logits);
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Allocate phase.

int sessionThreads(int requested) { return std::clamp(requested > 0 ? requested : defaultThreads(), 1, 256); }

Result<std::unique_ptr<BackendSession>> CpuBackend::createSession(const BackendSessionConfig& config) const {
  auto session = std::make_unique<CpuSession>(*this, config.n_ctx, sessionThreads(config.n_threads));
  MINFER_RETURN_IF_ERROR(session->allocate());
  return std::unique_ptr<BackendSession>(std::move(session));
}

Status CpuExecutor::allocate(int64_t kv_slots, int n_ctx, const std::string& what, bool rings) {
  const auto* bufs = p_.m->memory()->buffers();
  const uint64_t threads = static_cast<uint64_t>(rc_.pool.threads());
  // Count first, so an impossible request fails with the numbers instead of inside the allocator.
  uint64_t floats = 0;
  for (uint32_t id = 0; id < bufs->size(); ++id)
    if (p_.used[id] && id != p_.ids) floats += uint64_t(p_.max_batch) * bufs->Get(id)->width();
  // Slots of a layer's cache: kv_slots, or its ring's when smaller.
  const auto slots = [&](const KvShape& shape) {
    return rings && shape.ring > 0 ? std::min<int64_t>(kv_slots, shape.ring) : kv_slots;
  };
  uint64_t kv_floats = 0;
  for (const auto& [layer, shape] : p_.kv_layers) kv_floats += 2ull * uint64_t(slots(shape)) * shape.n_head_kv * shape.head_dim;
  floats += kv_floats + threads * p_.max_matmul_cols + threads * uint64_t(n_ctx);
  const uint64_t bytes = floats * sizeof(float) + uint64_t(p_.max_batch) * (2 * sizeof(int32_t) + sizeof(void*));
  // Refused before allocating when it cannot fit: the zero-filled pool would otherwise grow the process until the
  // machine swaps or the kernel kills it (minfer-server -np 4096 of a small model asked for 21 GB of 24).
  const uint64_t phys = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  const uint64_t available = memAvailable();
  if (phys > 0 && bytes > phys)
    return Status::error(p_.file.path() + ": " + what + " needs " + std::to_string(bytes) + " bytes (KV cache " +
                         std::to_string(kv_floats * 4) + "), more than the machine's " + std::to_string(phys) +
                         " bytes of memory");
  if (available > 0 && bytes > available)
    return Status::error(p_.file.path() + ": " + what + " needs " + std::to_string(bytes) + " bytes (KV cache " +
                         std::to_string(kv_floats * 4) + "), more than the " + std::to_string(available) +
                         " bytes of memory available now (MemAvailable; the machine has " + std::to_string(phys) + ")");
  try {
    rc_.weights = &p_.weights;
    rc_.max_batch = p_.max_batch;
    rc_.f32.resize(bufs->size());
    for (uint32_t id = 0; id < bufs->size(); ++id)
      if (p_.used[id] && id != p_.ids) rc_.f32[id].assign(size_t(p_.max_batch) * bufs->Get(id)->width(), 0.0f);
    rc_.ids.assign(size_t(p_.max_batch), 0);
    rc_.kv_storage = KvRowStorage(p_.max_batch);
    rc_.out_rows.reserve(size_t(p_.max_batch));
    for (const auto& [layer, shape] : p_.kv_layers) {
      const size_t per = size_t(slots(shape)) * shape.n_head_kv * shape.head_dim;
      std::vector<float>& kv = kv_[layer];
      kv.assign(2 * per, 0.0f);
      rc_.kv_views[layer] = KvLayer{kv.data(), kv.data() + per, slots(shape), shape.n_head_kv, shape.head_dim,
                                    rings ? shape.ring : 0};
    }
    rc_.matmul_scratch.assign(threads * p_.max_matmul_cols, 0.0f);
    rc_.attn_scratch.assign(threads * size_t(n_ctx), 0.0f);
  } catch (const std::bad_alloc&) {
    return Status::error(p_.file.path() + ": cannot allocate " + std::to_string(bytes) + " bytes for " + what);
  }
  bytes_ = bytes;
  kv_bytes_ = kv_floats * sizeof(float);
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Execute phase.

void CpuExecutor::run(int n) {
  rc_.n = n;
  runPlan(rc_, n == 1 ? b_.decode_ : b_.prefill_, p_.ids);
}

namespace {

Status CpuSession::run(std::span<const int32_t> tokens, int pos0, bool all_rows) {
  const int n = static_cast<int>(tokens.size()), n_vocab = exec_.nVocab();
  if (n < 1 || n > exec_.maxBatch() || pos0 < 0 || pos0 + n > n_ctx_)
    return Status::error("cpu forward: " + std::to_string(n) + " tokens at position " + std::to_string(pos0) +
                         " do not fit (max batch " + std::to_string(exec_.maxBatch()) + ", n_ctx " +
                         std::to_string(n_ctx_) + ")");
  MINFER_RETURN_IF_ERROR(rings_.check(pos0).withContext("cpu "));
  RunContext& rc = exec_.context();
  for (int t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= n_vocab)
      return Status::error("cpu forward: token id " + std::to_string(tokens[t]) + " at batch row " +
                           std::to_string(t) + " is outside [0, " + std::to_string(n_vocab) + ")");
    rc.ids[t] = tokens[t];
  }
  rc.kv = rc.kv_storage.contiguous(pos0, n, n_ctx_);
  rc.out_rows.clear();
  for (int t = all_rows ? 0 : n - 1; t < n; ++t) rc.out_rows.push_back(t);
  exec_.run(n);
  rings_.advance(pos0, n);
  return Status::ok();
}

Status CpuSession::forward(std::span<const int32_t> tokens, int pos0, float* logits, bool all_rows) {
  MINFER_RETURN_IF_ERROR(run(tokens, pos0, all_rows));
  const size_t n_vocab = static_cast<size_t>(exec_.nVocab());
  for (size_t i = 0; i < exec_.context().out_rows.size(); ++i)
    std::memcpy(logits + i * n_vocab, exec_.logits(i), sizeof(float) * n_vocab);
  return Status::ok();
}

Result<std::span<const float>> CpuSession::forwardLast(std::span<const int32_t> tokens, int pos0) {
  MINFER_RETURN_IF_ERROR(run(tokens, pos0, /*all_rows=*/false));
  return std::span<const float>(exec_.logits(0), static_cast<size_t>(exec_.nVocab()));
}

}  // namespace
}  // namespace cpu

Result<std::unique_ptr<Backend>> createCpuBackend(const ArtifactFile& artifact) {
  auto backend = std::make_unique<cpu::CpuBackend>(artifact);
  MINFER_RETURN_IF_ERROR(backend->init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace minfer
