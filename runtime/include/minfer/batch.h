// BatchSession: many sequences of one model evaluated together over a paged KV cache (issue 14).
//
// The KV cache is a pool of `totalBlocks()` blocks of `blockSize()` positions per attention layer
// (vLLM's paged attention: Kwon et al. 2023). Each open sequence has a block table; a sequence that
// grows past its last block takes a free block, one that is closed or truncated gives its blocks
// back. step() evaluates one chunk of new tokens for each of several sequences in one forward pass
// (continuous batching: a decode step is a chunk of one token, a prompt a chunk of up to the token
// budget; both may share a step). The scheduler above (requests, queueing, preemption) decides what
// goes into each step; this class only checks and executes.
//
// Phases (STYLE.md): Model::createBatchSession allocates everything (activations for the token budget,
// the block pool, block tables, scratch); openSequence/closeSequence/truncate only move block ids
// between lists; step() executes and allocates nothing, except that step(chunks) and step(chunks, outputs) on a
// backend without a logits buffer of its own (the CPU) grow the session's copy at the first step that needs more rows.
//
// Units: token ids int32 in [0, n_vocab); positions count a sequence's tokens from 0; logits float32
// rows of n_vocab. Errors are Status/Result with messages naming the sequence, the field and the
// numbers; a failed call changes nothing (no partial step: sequence lengths are only advanced after the
// whole step ran).
//
// Thread-safety: not thread-safe; one thread drives a BatchSession (the scheduler's). Must not
// outlive its Model.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "minfer/status.h"

namespace minfer {

class Model;

struct BatchOptions {
  int n_ctx = 2048;      // positions per sequence at most; 1 ≤ n_ctx ≤ Model::kMaxContext (and ≤ n_ctx_max)
  int n_seq_max = 8;     // sequences open at once; 1 ≤ n_seq_max ≤ 4096
  int n_blocks = 0;      // KV blocks in the pool; 0: n_seq_max × ceil(n_ctx / block_size) (no sequence ever waits)
  int block_size = 16;   // positions per KV block; a power of two in 1..1024
  int n_threads = 0;     // CPU threads; 0 = the physical cores available
  // Run each step's chunks one after another, one backend session per sequence (what a backend without
  // batched kernels does; batchedKernels() is then false), even where batched kernels exist: for tests
  // and comparisons. Results and block accounting are the same.
  bool sequential = false;
};

class BatchSession {
 public:
  virtual ~BatchSession() = default;

  // One sequence's new tokens in a step: they are appended at positions length(seq) ...
  struct Chunk {
    int seq = -1;
    std::span<const int32_t> tokens;
  };

  // Opens an empty sequence and returns its id (in [0, maxSequences())); ids of closed sequences are
  // reused. Error when maxSequences() sequences are open.
  virtual Result<int> openSequence() = 0;
  // Releases `seq`'s blocks; its id becomes free. Error for an id that is not open.
  virtual Status closeSequence(int seq) = 0;
  // Forgets `seq`'s positions from `pos` on (0 ≤ pos ≤ length(seq)) and releases the blocks no longer
  // covered (preemption by recomputation: truncate(seq, 0) frees everything but keeps the id open).
  virtual Status truncate(int seq, int pos) = 0;

  // Evaluates every chunk in one forward pass (a backend without batched kernels may run them one
  // after another; the results are the same). Each chunk's tokens go at positions length(seq) ..
  // length(seq)+n−1; afterwards length(seq) += n. logits: chunks.size() × n_vocab floats; row i = the
  // logits after the last token of chunk i.
  // Errors (nothing is evaluated, nothing changes): no chunks; an empty chunk; a sequence that is not open
  // or appears twice; a token id outside [0, n_vocab); more than maxTokensPerStep() tokens in all;
  // length(seq) + n > contextLength(); more new blocks needed than freeBlocks() (the message says
  // "out of KV blocks" with both counts); logits of the wrong size.
  virtual Status step(std::span<const Chunk> chunks, std::span<float> logits) = 0;
  // The same step with the logits left where the backend put them instead of copied into the caller's memory (the
  // CUDA backend: its pinned host buffer, as llama.cpp's llama_get_logits; a step of 32 rows of a 152,064-token
  // vocabulary is 19.5 MB): chunks.size() × n_vocab floats, row i = the logits after the last token of chunk i,
  // valid until the next call of any step form on this session (a failed one included). Backends without such a
  // buffer copy into one the session keeps (grown at the first step that needs more rows). Errors: as
  // step(chunks, logits), less the logits' size.
  virtual Result<std::span<const float>> step(std::span<const Chunk> chunks) = 0;

  // What a step brings back for one chunk (step(chunks, outputs)); both, one or neither.
  struct Output {
    bool logits = true;   // the logits row after the chunk's last token
    // That row's argmax, the greedy token: the highest logit, the lowest id on ties, NaN never wins, 0 when every
    // logit is −∞ or NaN (Sampler's steps 1–2 with temperature ≤ 0 and no repetition penalty). The CUDA backend
    // computes it on the device (kernels/argmax.cuh) and copies 4 bytes back instead of the row (n_vocab · 4 bytes:
    // 39 MB for a step of 64 rows of a 152,064-token vocabulary, ~0.8 ms over PCIe).
    bool argmax = false;
  };
  // step(chunks, outputs)'s results, in memory the session keeps, valid until the next call of any step form on this
  // session (a failed one included).
  struct StepOutputs {
    std::span<const float> logits;    // chunks.size() × n_vocab; row i: chunk i's where outputs[i].logits
    std::span<const int32_t> argmax;  // chunks.size() token ids; entry i: chunk i's where outputs[i].argmax
    // (the other rows and entries are unspecified: whatever an earlier step left there)
  };
  // The same step bringing back per chunk only what `outputs` (one per chunk) asks for: a scheduler asks for the argmax
  // alone for greedy requests and for nothing for a prompt chunk before the prompt's last. Errors: as step(chunks),
  // and outputs.size() ≠ chunks.size().
  virtual Result<StepOutputs> step(std::span<const Chunk> chunks, std::span<const Output> outputs) = 0;

  virtual int length(int seq) const = 0;                  // positions held by an open sequence (0 if not open)
  virtual bool isOpen(int seq) const = 0;
  virtual int openSequences() const = 0;
  // Blocks `seq` must take from the pool to grow by n_tokens (0 when its blocks already cover them).
  virtual int blocksNeeded(int seq, int n_tokens) const = 0;

  virtual int maxSequences() const = 0;      // BatchOptions::n_seq_max
  virtual int maxTokensPerStep() const = 0;  // tokens in one step at most (the artifact's max batch)
  virtual int contextLength() const = 0;     // BatchOptions::n_ctx
  virtual int blockSize() const = 0;
  virtual int totalBlocks() const = 0;
  virtual int freeBlocks() const = 0;
  virtual uint64_t allocatedBytes() const = 0;  // activations, KV pool, scratch
  // True when step() runs all chunks in one forward pass; false when this backend runs them one by one
  // (no batched kernels yet), so a step costs about the sum of single-sequence passes.
  virtual bool batchedKernels() const = 0;
};

}  // namespace minfer
