// CUDA BatchSession: one forward pass of the prefill plan over the rows of every chunk of a step, each row
// with its own position and its sequence's block table into a paged f16 KV pool (the CUDA twin of
// runtime/cpu/cpu_batch_session.cpp; kernels/paged_attention.cuh).
//
// Allocate phase (CudaBackend::createBatchSession): a paged CudaSession (activations for max_batch rows, a
// KV pool of n_blocks·block_size slots per attention layer, device arrays for the row positions and block
// tables) and host arrays of the same sizes. step() lays the chunks' tokens out as consecutive rows (chunk 0
// first), writes each row's position and the index of its sequence's block table (BatchSessionBase grew the
// tables before run()), the tables themselves after the rows' indices, and asks forwardRows for the logits
// of each chunk's last row; it allocates nothing. The matmuls are the prefill plan's batched GEMMs; only
// RoPE, the KV store and attention (Step.paged_launches) read per-row positions and tables.
#include <algorithm>

#include "runtime/batch_session.h"
#include "runtime/cuda/cuda_backend.h"

namespace minfer::cuda {
namespace {

// int32 words of the block tables one step can need: one index per row, then the tables of its chunks
// (at most one chunk per row and per sequence), each of at most ceil(n_ctx / block_size) blocks.
int tableWords(const BatchConfig& c) {
  const int64_t per_seq = (int64_t{c.n_ctx} + c.block_size - 1) / c.block_size;
  return static_cast<int>(c.max_tokens + std::min(c.max_tokens, c.n_seq_max) * per_seq);
}

class CudaBatchSession final : public BatchSessionBase {
 public:
  CudaBatchSession(const BatchConfig& config, std::unique_ptr<CudaSession> session)
      : BatchSessionBase(config),
        session_(std::move(session)),
        ids_(static_cast<size_t>(config.max_tokens)),
        pos_(static_cast<size_t>(config.max_tokens)),
        tables_(static_cast<size_t>(tableWords(config))) {
    out_rows_.reserve(static_cast<size_t>(std::min(config.max_tokens, config.n_seq_max)));
  }

  uint64_t allocatedBytes() const override { return session_->allocatedBytes(); }
  bool batchedKernels() const override { return true; }

 protected:
  Status run(std::span<const Chunk> chunks, std::span<float> logits) override {
    int rows = 0;
    for (const Chunk& c : chunks) rows += static_cast<int>(c.tokens.size());
    out_rows_.clear();
    size_t words = static_cast<size_t>(rows);  // the tables follow the rows' indices
    int row = 0;
    for (const Chunk& c : chunks) {
      const std::span<const int32_t> table = blocks().table(c.seq);
      const int32_t at = static_cast<int32_t>(words);
      std::copy(table.begin(), table.end(), tables_.begin() + static_cast<std::ptrdiff_t>(words));
      words += table.size();
      const int pos0 = length(c.seq);
      for (size_t j = 0; j < c.tokens.size(); ++j, ++row) {
        ids_[static_cast<size_t>(row)] = c.tokens[j];
        pos_[static_cast<size_t>(row)] = pos0 + static_cast<int32_t>(j);
        tables_[static_cast<size_t>(row)] = at;
      }
      out_rows_.push_back(row - 1);
    }
    const size_t n = static_cast<size_t>(rows);
    return session_->forwardRows(std::span<const int32_t>(ids_.data(), n), std::span<const int32_t>(pos_.data(), n),
                                 std::span<const int32_t>(tables_.data(), words), out_rows_, logits.data());
  }

 private:
  std::unique_ptr<CudaSession> session_;
  std::vector<int32_t> ids_, pos_;  // (max_tokens) per row
  std::vector<int32_t> tables_;     // (tableWords) rows' table indices, then the tables
  std::vector<int> out_rows_;       // per chunk: its last row
};

}  // namespace

Result<std::unique_ptr<BatchSession>> CudaBackend::createBatchSession(const BatchConfig& config) const {
  if (!supportsPagedSessions()) return std::unique_ptr<BatchSession>();  // Model builds the sequential fallback
  Result<std::unique_ptr<CudaSession>> session = createPagedSession(
      {.n_ctx = config.n_ctx,
       .kv_slots = int64_t{config.n_blocks} * config.block_size,
       .block_size = config.block_size,
       .table_words = tableWords(config)});
  if (!session) return session.takeStatus().withContext("CUDA batch session: ");
  return std::unique_ptr<BatchSession>(std::make_unique<CudaBatchSession>(config, std::move(*session)));
}

}  // namespace minfer::cuda
