// CUDA BatchSession: one forward pass of the prefill plan over the rows of every chunk of a step, each row
// with its own position and its sequence's block table into a paged f16 KV pool (the CUDA twin of
// runtime/cpu/cpu_batch_session.cpp; kernels/paged_attention.cuh).
//
// Allocate phase (CudaBackend::createBatchSession): a paged CudaSession (activations for max_batch rows, a
// KV pool of n_blocks·block_size slots per attention layer, device arrays for the row positions and block
// tables) and host arrays of the same sizes (BatchRows). step() lays the chunks out as rows with their
// positions and block tables (BatchSessionBase::layoutRows; BatchSessionBase grew the tables before run())
// and asks forwardRows for the logits of each chunk's last row, into the caller's memory (step(chunks, logits)) or
// left in the session's pinned buffer of min(n_seq_max, max_tokens) rows (step(chunks)), or for what
// step(chunks, outputs) asks per chunk: the rows asked for into that buffer, and the argmax of the others computed on
// the device (kernels/argmax.cuh), 4 bytes a row back (an artifact without an argmax kernel image: the rows
// downloaded and the argmax taken on the host, BatchSessionBase's); it allocates nothing. The matmuls are the
// prefill plan's: its small-batch kernels for a step of 2 … Step.small_rows rows (format 1.7,
// the batched GEMV on the GGUF blocks of Q4_K / Q6_K weights (kernels/gemv_blocks.cuh GEMVB_BATCH): up to 8 rows;
// kernels/gemm_small.cuh for the other quantized types: up to 64 rows, 16 beside Hopper f16 planes), its batched
// GEMMs above that (a step
// of one row: the decode plan's GEMVs); only RoPE, the KV store and attention (Step.paged_launches) read per-row
// positions and tables.
#include <algorithm>
#include <vector>

#include "runtime/batch_session.h"
#include "runtime/cuda/cuda_backend.h"

namespace minfer::cuda {
namespace {

class CudaBatchSession final : public BatchSessionBase {
 public:
  CudaBatchSession(const BatchConfig& config, std::unique_ptr<CudaSession> session)
      : BatchSessionBase(config),
        session_(std::move(session)),
        rows_(config),
        download_(static_cast<size_t>(std::min(config.n_seq_max, config.max_tokens))) {}

  uint64_t allocatedBytes() const override { return session_->allocatedBytes(); }
  bool batchedKernels() const override { return true; }

 protected:
  Status run(std::span<const Chunk> chunks, std::span<float> logits) override {
    return forward(chunks, {.logits = logits.data()});
  }
  // The rows left in the session's pinned buffer (forwardRows with null logits; it holds min(n_seq_max,
  // max_tokens) rows, the most chunks a step can have).
  Result<std::span<const float>> runInPlace(std::span<const Chunk> chunks) override {
    MINFER_RETURN_IF_ERROR(forward(chunks, {}));
    return pinnedRows(chunks.size());
  }
  // The argmax on the device, and only the rows asked for downloaded into the pinned buffer (an artifact without an
  // argmax kernel image: the base's, on the host after downloading every row).
  Result<StepOutputs> runOutputs(std::span<const Chunk> chunks, std::span<const Output> outputs) override {
    bool argmax = false;
    for (size_t i = 0; i < chunks.size(); ++i) {
      download_[i] = outputs[i].logits ? 1 : 0;
      argmax = argmax || outputs[i].argmax;
    }
    if (argmax && !session_->deviceSampling().argmax) return BatchSessionBase::runOutputs(chunks, outputs);
    MINFER_RETURN_IF_ERROR(forward(
        chunks, {.download = std::span<const uint8_t>(download_.data(), chunks.size()), .argmax = argmax}));
    return StepOutputs{pinnedRows(chunks.size()), std::span<const int32_t>(session_->pinnedArgmax(), chunks.size())};
  }

 private:
  // The session's pinned logits rows for a step of n chunks.
  std::span<const float> pinnedRows(size_t n) const {
    return std::span<const float>(session_->pinnedLogits(), n * static_cast<size_t>(config().n_vocab));
  }
  // The chunks as rows, one forward pass bringing back what `out` asks for (CudaSession::RowsOutput).
  Status forward(std::span<const Chunk> chunks, const CudaSession::RowsOutput& out) {
    layoutRows(chunks, rows_);
    const size_t n = static_cast<size_t>(rows_.rows);
    return session_->forwardRows(std::span<const int32_t>(rows_.ids.data(), n),
                                 std::span<const int32_t>(rows_.pos.data(), n),
                                 std::span<const int32_t>(rows_.tables.data(), rows_.words), rows_.out_rows, out);
  }

  std::unique_ptr<CudaSession> session_;
  BatchRows rows_;  // the step's rows, refilled by every run()
  std::vector<uint8_t> download_;  // (the most chunks of a step) runOutputs' per-chunk download flags
};

}  // namespace

Result<std::unique_ptr<BatchSession>> CudaBackend::createBatchSession(const BatchConfig& config) const {
  if (!supportsPagedSessions()) return std::unique_ptr<BatchSession>();  // Model builds the sequential fallback
  const int64_t words = BatchRows::tableWords(config);
  if (words > (int64_t{1} << 30))
    return Status::error("CUDA batch session: block tables of " + std::to_string(words) +
                         " words per step; lower n_seq_max or raise block_size");
  Result<std::unique_ptr<CudaSession>> session = createPagedSession(
      {.n_ctx = config.n_ctx,
       .kv_slots = int64_t{config.n_blocks} * config.block_size,
       .block_size = config.block_size,
       .table_words = static_cast<int>(words),
       .pinned_rows = std::min(config.n_seq_max, config.max_tokens)});
  if (!session) return session.takeStatus().withContext("CUDA batch session: ");
  return std::unique_ptr<BatchSession>(std::make_unique<CudaBatchSession>(config, std::move(*session)));
}

}  // namespace minfer::cuda
