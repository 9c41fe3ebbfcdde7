// CPU BatchSession: one forward pass over the rows of every chunk of a step, each row with its own
// position and its sequence's block table in a paged KV cache (cpu_ops.h KvRows).
//
// Allocate phase (CpuBackend::createBatchSession): the executor's activations (max_batch rows), a KV pool
// of n_blocks·block_size slots per attention layer, attention scratch for n_ctx positions. step() lays the
// chunks' tokens out as consecutive rows (chunk 0 first), points each row at its sequence's block table
// (BatchSessionBase grew the tables before run()), wants the logits of each chunk's last row, runs the
// plan once and copies those rows out; it allocates nothing.
#include <cstring>

#include "runtime/batch_session.h"
#include "runtime/cpu/cpu_backend.h"

namespace minfer::cpu {
namespace {

class CpuBatchSession final : public BatchSessionBase {
 public:
  CpuBatchSession(const CpuBackend& backend, const BatchConfig& config)
      : BatchSessionBase(config), exec_(backend, sessionThreads(config.n_threads)) {}
  Status allocate() {
    const BatchConfig& c = config();
    return exec_.allocate(int64_t{c.n_blocks} * c.block_size, c.n_ctx,
                          "a CPU batch session of " + std::to_string(c.n_blocks) + " KV blocks of " +
                              std::to_string(c.block_size) + " positions");
  }
  uint64_t allocatedBytes() const override { return exec_.allocatedBytes(); }
  bool batchedKernels() const override { return true; }

 protected:
  Status run(std::span<const Chunk> chunks, std::span<float> logits) override {
    RunContext& rc = exec_.context();
    rc.out_rows.clear();
    int row = 0;
    for (const Chunk& c : chunks) {
      const int32_t* table = blocks().table(c.seq).data();
      const int pos0 = length(c.seq);
      for (size_t j = 0; j < c.tokens.size(); ++j, ++row) {
        rc.ids[static_cast<size_t>(row)] = c.tokens[j];
        rc.kv_storage.pos[static_cast<size_t>(row)] = pos0 + static_cast<int>(j);
        rc.kv_storage.tables[static_cast<size_t>(row)] = table;
      }
      rc.out_rows.push_back(row - 1);
    }
    rc.kv = rc.kv_storage.paged(config().block_size, config().n_ctx);
    exec_.run(row);
    const size_t n_vocab = static_cast<size_t>(config().n_vocab);
    for (size_t i = 0; i < chunks.size(); ++i)
      std::memcpy(logits.data() + i * n_vocab, exec_.logits(i), sizeof(float) * n_vocab);
    return Status::ok();
  }

 private:
  CpuExecutor exec_;
};

}  // namespace

Result<std::unique_ptr<BatchSession>> CpuBackend::createBatchSession(const BatchConfig& config) const {
  auto session = std::make_unique<CpuBatchSession>(*this, config);
  MINFER_RETURN_IF_ERROR(session->allocate());
  return std::unique_ptr<BatchSession>(std::move(session));
}

}  // namespace minfer::cpu
