// A deterministic BatchSession for scheduler tests: real block accounting and every check step() documents,
// a scripted "model" (the next token is a function of the chunk's last token), and a log of the steps.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "minfer/batch.h"

namespace minfer::test {

class FakeBatchSession final : public BatchSession {
 public:
  struct Config {
    int n_vocab = 300;
    int n_seq_max = 4;
    int n_ctx = 64;
    int block_size = 4;
    int n_blocks = 64;
    int max_tokens_per_step = 16;
  };
  explicit FakeBatchSession(const Config& config);

  // The scripted model: after token t the argmax of the logits is next[t] (default_next when absent).
  std::map<int32_t, int32_t> next;
  int32_t default_next = 2;
  // Makes the next step() calls fail (a backend failure), count down.
  int fail_steps = 0;
  // Makes the next step(chunks, outputs) calls give an argmax of n_vocab (outside the vocabulary), count down.
  int bad_argmax_steps = 0;

  // What step() saw: each step's chunks as (seq, first position, tokens).
  struct LoggedChunk {
    int seq;
    int pos;
    std::vector<int32_t> tokens;
  };
  std::vector<std::vector<LoggedChunk>> steps;
  int step_errors = 0;        // refused steps (a scheduler bug unless fail_steps caused them)
  std::string last_error;
  std::vector<int32_t> history(int seq) const { return seqs_.at(seq).tokens; }  // positions 0.. of `seq`

  Result<int> openSequence() override;
  Status closeSequence(int seq) override;
  Status truncate(int seq, int pos) override;
  Status step(std::span<const Chunk> chunks, std::span<float> logits) override;
  // The copying step into a buffer of its own.
  Result<std::span<const float>> step(std::span<const Chunk> chunks) override {
    rows_.resize(chunks.size() * static_cast<size_t>(config_.n_vocab));
    MINFER_RETURN_IF_ERROR(step(chunks, std::span<float>(rows_)));
    return std::span<const float>(rows_);
  }
  // The step with outputs: the rows not asked for are NaN (a scheduler that reads one samples garbage), the argmax
  // is the scripted token. Logs the outputs asked for.
  Result<StepOutputs> step(std::span<const Chunk> chunks, std::span<const Output> outputs) override;
  std::vector<std::vector<Output>> outputs;  // per step(chunks, outputs) call that ran: what it asked for
  int length(int seq) const override;
  bool isOpen(int seq) const override;
  int openSequences() const override;
  int blocksNeeded(int seq, int n_tokens) const override;
  int maxSequences() const override { return config_.n_seq_max; }
  int maxTokensPerStep() const override { return config_.max_tokens_per_step; }
  int contextLength() const override { return config_.n_ctx; }
  int blockSize() const override { return config_.block_size; }
  int totalBlocks() const override { return config_.n_blocks; }
  int freeBlocks() const override { return free_; }
  uint64_t allocatedBytes() const override { return 0; }
  bool batchedKernels() const override { return true; }

 private:
  struct Seq {
    bool open = false;
    std::vector<int32_t> tokens;
  };
  int blocksFor(size_t n) const { return static_cast<int>((n + config_.block_size - 1) / config_.block_size); }
  Status refuse(std::string message);
  Config config_;
  std::vector<Seq> seqs_;
  int free_ = 0;
  std::vector<float> rows_;  // step(chunks)'s logits
  std::vector<int32_t> argmax_;  // step(chunks, outputs)'s
};

}  // namespace minfer::test
