// BatchSessionBase: what every BatchSession (minfer/batch.h) shares: open sequences, their lengths and
// KV blocks (KvBlockAllocator), and step()'s checks, commit and rollback. A backend adds run(): the
// forward pass over checked chunks whose block tables already cover their new positions.
//
// step() = check everything (nothing changes on an error) → grow each chunk's block table → run() →
// on success advance the lengths, on failure give the new blocks back in reverse order (the free stack
// is then exactly as before). Both the batched CPU path and the sequential fallback account blocks here,
// so a scheduler sees identical freeBlocks() / blocksNeeded() on every backend.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "minfer/batch.h"
#include "runtime/kv_blocks.h"

namespace minfer {

class Backend;

// BatchOptions after Model::createBatchSession checked them, with n_blocks resolved.
struct BatchConfig {
  int n_ctx = 0;       // positions per sequence at most
  int n_seq_max = 0;   // sequence ids 0 .. n_seq_max−1
  int n_blocks = 0;    // blocks in the pool (≥ 0; n_blocks·block_size ≤ 2^30)
  int block_size = 0;  // positions per block (power of two)
  int n_threads = 0;   // CPU threads (0: the physical cores)
  int max_tokens = 0;  // tokens per step at most (the artifact's max batch)
  int n_vocab = 0;
};

// A step's rows as batched kernels take them (schema ArgKind RowPositions and BlockTables; the CUDA batch
// session uploads them): the chunks' tokens as consecutive rows, chunk 0 first; each row's position in its
// sequence; `tables` = one word per row, the index in `tables` of the row's block table, then the block
// tables of the step's sequences (each blocks().table(seq) as it covers the step's positions); and per chunk
// its last row (whose logits the step returns). The arrays are allocated once, at their largest
// (BatchRows(config)), and refilled by BatchSessionBase::layoutRows.
struct BatchRows {
  explicit BatchRows(const BatchConfig& config);
  // int32 words of `tables` one step can need: one per row, then a table of at most ceil(n_ctx / block_size)
  // blocks per chunk (at most one chunk per sequence and per row).
  static int64_t tableWords(const BatchConfig& config);

  int rows = 0;                  // rows of the last layout
  size_t words = 0;              // words of `tables` in use
  std::vector<int32_t> ids;      // (max_tokens) token of each row
  std::vector<int32_t> pos;      // (max_tokens) position of each row in its sequence
  std::vector<int32_t> tables;   // (tableWords) rows' table indices, then the tables
  std::vector<int> out_rows;     // per chunk: its last row
};

class BatchSessionBase : public BatchSession {
 public:
  explicit BatchSessionBase(const BatchConfig& config);

  Result<int> openSequence() override;
  Status closeSequence(int seq) override;
  Status truncate(int seq, int pos) override;
  Status step(std::span<const Chunk> chunks, std::span<float> logits) override;
  Result<std::span<const float>> step(std::span<const Chunk> chunks) override;
  Result<StepOutputs> step(std::span<const Chunk> chunks, std::span<const Output> outputs) override;

  int length(int seq) const override { return isOpen(seq) ? lengths_[static_cast<size_t>(seq)] : 0; }
  bool isOpen(int seq) const override {
    return seq >= 0 && seq < config_.n_seq_max && open_[static_cast<size_t>(seq)];
  }
  int openSequences() const override { return n_open_; }
  int blocksNeeded(int seq, int n_tokens) const override;
  int maxSequences() const override { return config_.n_seq_max; }
  int maxTokensPerStep() const override { return config_.max_tokens; }
  int contextLength() const override { return config_.n_ctx; }
  int blockSize() const override { return config_.block_size; }
  int totalBlocks() const override { return blocks_.totalBlocks(); }
  int freeBlocks() const override { return blocks_.freeBlocks(); }

 protected:
  // Evaluates checked chunks: every sequence open and distinct, tokens valid, positions length(seq) ..
  // inside the context and covered by blocks().table(seq); logits: chunks.size() × n_vocab. On an
  // error the base rolls the blocks back and the lengths stay.
  virtual Status run(std::span<const Chunk> chunks, std::span<float> logits) = 0;
  // The same for step(chunks): the logits rows where this session keeps them (chunks.size() × n_vocab, valid until
  // the next step of any form). By default run() into a buffer of the base's, grown to the rows of the largest
  // such step.
  virtual Result<std::span<const float>> runInPlace(std::span<const Chunk> chunks);
  // The same for step(chunks, outputs) (outputs.size() == chunks.size()). By default runInPlace(), then greedyToken of
  // each row whose chunk asks for the argmax, into an array of the base's (allocated with the session).
  virtual Result<StepOutputs> runOutputs(std::span<const Chunk> chunks, std::span<const Output> outputs);
  const KvBlockAllocator& blocks() const { return blocks_; }
  const BatchConfig& config() const { return config_; }
  // Fills `out` (allocated for this session's config) for checked chunks inside run(). Allocates nothing.
  void layoutRows(std::span<const Chunk> chunks, BatchRows& out) const;

 private:
  // Every error of a step but the logits' size: chunks, sequences, tokens, context, blocks.
  Status check(std::span<const Chunk> chunks);
  // Grows the chunks' block tables, runs `evaluate` (a callable returning Status), then advances the lengths; on
  // its error the blocks go back. A template, so that a step allocates nothing.
  template <class Evaluate>
  Status execute(std::span<const Chunk> chunks, const Evaluate& evaluate);
  // execute() of a callable returning Result<T>, whose value it returns.
  template <class T, class Evaluate>
  Result<T> executeFor(std::span<const Chunk> chunks, const Evaluate& evaluate);
  Status badSequence(const char* what, int seq) const;

  BatchConfig config_;
  KvBlockAllocator blocks_;
  std::vector<int> lengths_;    // (n_seq_max) positions held
  std::vector<uint8_t> open_;   // (n_seq_max)
  std::vector<uint8_t> seen_;   // (n_seq_max) step()'s duplicate check, all 0 between steps
  int n_open_ = 0;
  std::vector<float> own_logits_;  // runInPlace's rows by default (grown, never shrunk)
  std::vector<int32_t> own_argmax_;  // (min(n_seq_max, max_tokens): the most chunks of a step) runOutputs' argmax
};

// The sequential fallback for backends without batched kernels: one BackendSession of n_ctx positions per
// sequence id (created at the id's first step, kept and reused by the sequences that get the id later);
// step() runs the chunks one after another, each through its own session (n == 1: the decode plan, as
// Session does). Blocks are accounted as in the paged path although the KV lives in the sessions.
// batchedKernels() is false. `backend` must outlive the session. Errors: those of BatchSessionBase, and a
// BackendSession that cannot be created (then nothing is evaluated).
std::unique_ptr<BatchSession> createSequentialBatchSession(const Backend& backend, const BatchConfig& config);

}  // namespace minfer
