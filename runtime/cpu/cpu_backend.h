// CPU backend internals shared by its single-sequence sessions (cpu_backend.cpp) and its batched sessions
// (cpu_batch_session.cpp): the prepared plans, and the executor both run them with.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "runtime/backend.h"
#include "runtime/cpu/cpu_step.h"

namespace minfer::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const ArtifactFile& file) : plan_(file) {}
  const char* name() const override { return "cpu"; }
  Result<std::unique_ptr<BackendSession>> createSession(const BackendSessionConfig& config) const override;
  Result<std::unique_ptr<BatchSession>> createBatchSession(const BatchConfig& config) const override;
  Status init();

  PrepareContext plan_;  // weights, buffers used, KV layers: read by sessions
  PreparedPlan prefill_, decode_;

 private:
  Status prepare(const fb::Plan* plan, const char* which, PreparedPlan& out);
};

// Threads clamped to 1..256, 0 meaning the physical cores.
int sessionThreads(int requested);

// Runs a CpuBackend's plans over a batch of rows that may belong to different sequences. Owns the
// activation buffers (max_batch rows), an f32 KV cache of `kv_slots` positions per attention layer (with
// `rings`, min(kv_slots, kv_ring) for a layer with a ring, schema Step.kv_ring), the scratch and the thread
// pool. The caller fills context(): ids, kv (through kv_storage), out_rows, then calls run(n); allocate()
// is the only call that allocates.
class CpuExecutor {
 public:
  CpuExecutor(const CpuBackend& backend, int n_threads) : b_(backend), p_(backend.plan_), rc_(n_threads) {}
  // Allocates everything for a cache of kv_slots slots and sequences of up to n_ctx positions. `what`
  // names the session in errors ("a CPU session with n_ctx = 512"). Errors: more bytes than the machine
  // has, or a failed allocation (with the byte counts).
  // rings: one sequence in a contiguous cache (kv_slots = n_ctx): ring layers get their ring (KvLayer::ring).
  Status allocate(int64_t kv_slots, int n_ctx, const std::string& what, bool rings = false);
  RunContext& context() { return rc_; }
  // Runs the decode plan for one row, else the prefill plan, over rows 0 .. n−1 of context().
  void run(int n);
  // The logits of the i-th wanted row (context().out_rows[i] before run()): n_vocab floats.
  const float* logits(size_t i) const {
    return rc_.f32[p_.logits].data() + static_cast<size_t>(rc_.out_rows[i]) * static_cast<size_t>(p_.n_vocab);
  }
  int maxBatch() const { return p_.max_batch; }
  int nVocab() const { return p_.n_vocab; }
  uint64_t allocatedBytes() const { return bytes_; }
  uint64_t kvCacheBytes() const { return kv_bytes_; }  // of which the KV cache

 private:
  const CpuBackend& b_;
  const PrepareContext& p_;
  RunContext rc_;
  std::map<int, std::vector<float>> kv_;  // attention layer → K then V, each (kv_slots, n_head_kv, head_dim)
  uint64_t bytes_ = 0, kv_bytes_ = 0;
};

}  // namespace minfer::cpu
