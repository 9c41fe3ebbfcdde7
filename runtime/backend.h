// Backend: the interface an execution backend (runtime/cpu, runtime/cuda) implements for the runtime.
//
// Phases (STYLE.md): the artifact is mapped and verified before a backend sees it (Model::open);
// Backend creation resolves weights (upload on a GPU, plane views on the CPU); createSession
// allocates every buffer a session needs (activations for max_batch rows, the KV cache for n_ctx
// positions, scratch) and prepares both plans; forward() only executes: it allocates nothing.
//
// Thread-safety: a Backend is immutable after creation and may create sessions from any thread;
// each BackendSession is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "minfer/batch.h"
#include "minfer/sampler.h"
#include "minfer/status.h"

namespace minfer {

class ArtifactFile;
struct BatchConfig;

// What a session can sample on its device instead of copying the logits row back (Session::generate).
struct DeviceSampling {
  bool argmax = false;      // the artifact's argmax kernel: forwardArgmax (a paged CUDA session: forwardRows' argmax)
  int top_k_max = 0;        // forwardTopK: k up to this (0: none)
  int penalized_max = 0;    // forwardTopK: at most this many penalized (distinct history) tokens
};

struct BackendSessionConfig {
  int n_ctx = 0;      // KV cache positions (≥ 1, already validated by Session)
  int n_threads = 0;  // CPU worker threads (0: hardware concurrency)
};

class BackendSession {
 public:
  virtual ~BackendSession() = default;

  // Evaluates tokens (1 ≤ n ≤ maxBatch()) at positions pos0 .. pos0+n−1; the KV cache must hold the
  // positions < pos0 from earlier calls (positions ≥ pos0 are overwritten). n == 1 runs the decode
  // plan, n > 1 the prefill plan. Token ids must be in [0, n_vocab) (Session checks).
  // logits: all_rows → n × n_vocab floats, row t = the logits after token t; else n_vocab floats,
  // the logits after the last token. Requires pos0 + n ≤ n_ctx. Error (nothing evaluated) when
  // !canResumeAt(pos0).
  virtual Status forward(std::span<const int32_t> tokens, int pos0, float* logits, bool all_rows) = 0;
  // Like forward(tokens, pos0, ·, false) without the copy: the last token's logits (n_vocab floats) in memory the
  // session owns, valid until its next call that evaluates tokens or copies logits back. The CUDA session's is the
  // pinned buffer the row is downloaded into (llama.cpp's output buffer is pinned host memory too), the CPU
  // session's its executor's logits row. Errors: forward's.
  virtual Result<std::span<const float>> forwardLast(std::span<const int32_t> tokens, int pos0) = 0;
  // False when a forward at pos0 would read keys that sliding-window layers' ring caches (schema
  // Step.kv_ring, runtime/kv_ring.h) have overwritten since: after going back by more than the artifact's
  // max batch, only position 0 is safe. Always true without rings.
  virtual bool canResumeAt(int pos0) const {
    (void)pos0;
    return true;
  }

  // Device sampling (the CUDA backend, with the artifact's argmax / top-k kernels); none by default.
  virtual DeviceSampling deviceSampling() const { return {}; }
  // Like forward(tokens, pos0, ·, false) but the logits stay on the device: the last row's argmax (highest
  // logit, lowest id on ties, NaN never wins) comes back instead. Error when !deviceSampling().argmax.
  virtual Result<int32_t> forwardArgmax(std::span<const int32_t> tokens, int pos0) {
    (void)tokens, (void)pos0;
    return Status::error("this backend has no device argmax");
  }
  // Like forwardArgmax, but the last row's out.size() = k highest (id, logit) pairs after the repetition
  // penalty, as Sampler::sample steps 1 and 3 leave them (logits NaN → −∞; each of `penalized` (distinct ids)
  // divided by repeat_penalty when > 0, else multiplied; then logit descending, id ascending). Requires
  // 1 ≤ k ≤ deviceSampling().top_k_max, k ≤ n_vocab, penalized.size() ≤ penalized_max, repeat_penalty > 0.
  virtual Status forwardTopK(std::span<const int32_t> tokens, int pos0, float repeat_penalty,
                             std::span<const int32_t> penalized, std::span<TokenLogit> out) {
    (void)tokens, (void)pos0, (void)repeat_penalty, (void)penalized, (void)out;
    return Status::error("this backend has no device top-k");
  }
  // The last row's logits (n_vocab floats) of the latest forwardArgmax / forwardTopK call, copied back.
  // Error (nothing copied) when no such call has completed, or a forward (any other call that evaluates
  // tokens) has started since: the logits buffer then no longer holds that row.
  virtual Status lastLogits(float* logits) {
    (void)logits;
    return Status::error("this backend has no device sampling");
  }

  virtual int maxBatch() const = 0;
  virtual int contextLength() const = 0;
  // Bytes this session allocated (activations, KV cache, scratch), for --verbose reporting.
  virtual uint64_t allocatedBytes() const = 0;
  // Of which the KV cache (every layer's K and V; a ring layer's min(n_ctx, kv_ring) positions).
  virtual uint64_t kvCacheBytes() const { return 0; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "cpu", "cuda"
  virtual Result<std::unique_ptr<BackendSession>> createSession(const BackendSessionConfig& config) const = 0;
  // A BatchSession (minfer/batch.h) whose step() runs all chunks in one forward pass over a paged KV
  // cache; null (not an error) when this backend has no batched kernels: Model then builds the
  // sequential fallback (runtime/batch_session.h) over createSession. Errors: not enough memory.
  virtual Result<std::unique_ptr<BatchSession>> createBatchSession(const BatchConfig& config) const {
    (void)config;
    return std::unique_ptr<BatchSession>();
  }
};

// The CPU backend (runtime/cpu/cpu_backend.cpp). `artifact` must outlive the backend and its
// sessions. Errors: a tensor without planes the CPU can read, a plan step whose buffers, weights or
// parameters are inconsistent (message names the step index, its name and the numbers).
Result<std::unique_ptr<Backend>> createCpuBackend(const ArtifactFile& artifact);

}  // namespace minfer
