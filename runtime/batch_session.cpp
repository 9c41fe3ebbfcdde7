// BatchSessionBase: sequence bookkeeping and step()'s checks for every BatchSession; the sequential
// fallback over one BackendSession per sequence id.
#include "runtime/batch_session.h"

#include <algorithm>
#include <string>

#include "minfer/sampler.h"
#include "runtime/backend.h"

namespace minfer {

BatchSessionBase::BatchSessionBase(const BatchConfig& config)
    : config_(config),
      blocks_(config.n_seq_max, config.n_ctx, config.block_size, config.n_blocks),
      lengths_(static_cast<size_t>(config.n_seq_max), 0),
      open_(static_cast<size_t>(config.n_seq_max), 0),
      seen_(static_cast<size_t>(config.n_seq_max), 0),
      own_argmax_(static_cast<size_t>(std::min(config.n_seq_max, config.max_tokens))) {}

Status BatchSessionBase::badSequence(const char* what, int seq) const {
  return Status::error(std::string(what) + ": sequence " + std::to_string(seq) + " is not open (ids 0.." +
                       std::to_string(config_.n_seq_max - 1) + ", " + std::to_string(n_open_) + " open)");
}

Result<int> BatchSessionBase::openSequence() {
  const auto it = std::find(open_.begin(), open_.end(), 0);
  if (it == open_.end())
    return Status::error("openSequence: all " + std::to_string(config_.n_seq_max) +
                         " sequences are open (BatchOptions::n_seq_max)");
  const int seq = static_cast<int>(it - open_.begin());
  open_[static_cast<size_t>(seq)] = 1;
  lengths_[static_cast<size_t>(seq)] = 0;
  ++n_open_;
  return seq;
}

Status BatchSessionBase::closeSequence(int seq) {
  if (!isOpen(seq)) return badSequence("closeSequence", seq);
  blocks_.shrink(seq, 0);
  open_[static_cast<size_t>(seq)] = 0;
  lengths_[static_cast<size_t>(seq)] = 0;
  --n_open_;
  return Status::ok();
}

Status BatchSessionBase::truncate(int seq, int pos) {
  if (!isOpen(seq)) return badSequence("truncate", seq);
  const int len = lengths_[static_cast<size_t>(seq)];
  if (pos < 0 || pos > len)
    return Status::error("truncate: position " + std::to_string(pos) + " of sequence " + std::to_string(seq) +
                         " must be in 0.." + std::to_string(len) + " (its length)");
  blocks_.shrink(seq, pos);
  lengths_[static_cast<size_t>(seq)] = pos;
  return Status::ok();
}

int BatchSessionBase::blocksNeeded(int seq, int n_tokens) const {
  if (!isOpen(seq) || n_tokens <= 0) return 0;
  return blocks_.needed(seq, int64_t{lengths_[static_cast<size_t>(seq)]} + n_tokens);
}

// Every condition of batch.h's step() errors, in its order; changes nothing (seen_ is cleared again).
Status BatchSessionBase::check(std::span<const Chunk> chunks) {
  if (chunks.empty()) return Status::error("step: no chunks");
  const auto where = [&](size_t i) {
    return "step: chunk " + std::to_string(i) + " (sequence " + std::to_string(chunks[i].seq) + ")";
  };
  // The chunks themselves: tokens, open and distinct sequences, token ids.
  int64_t tokens = 0;
  Status st;
  for (size_t i = 0; i < chunks.size() && st.isOk(); ++i) {
    const Chunk& c = chunks[i];
    if (c.tokens.empty()) {
      st = Status::error(where(i) + " has no tokens");
    } else if (!isOpen(c.seq)) {
      st = badSequence(where(i).c_str(), c.seq);
    } else if (seen_[static_cast<size_t>(c.seq)]) {
      st = Status::error(where(i) + ": the sequence appears twice in one step");
    } else {
      seen_[static_cast<size_t>(c.seq)] = 1;
      for (size_t t = 0; t < c.tokens.size() && st.isOk(); ++t)
        if (c.tokens[t] < 0 || c.tokens[t] >= config_.n_vocab)
          st = Status::error(where(i) + ": token id " + std::to_string(c.tokens[t]) + " at index " + std::to_string(t) +
                             " is outside [0, " + std::to_string(config_.n_vocab) + ")");
      tokens += static_cast<int64_t>(c.tokens.size());
    }
  }
  for (const Chunk& c : chunks)
    if (c.seq >= 0 && c.seq < config_.n_seq_max) seen_[static_cast<size_t>(c.seq)] = 0;
  MINFER_RETURN_IF_ERROR(st);
  // The step: its token budget, each sequence's context, the blocks of them all, the logits.
  if (tokens > config_.max_tokens)
    return Status::error("step: " + std::to_string(tokens) + " tokens in " + std::to_string(chunks.size()) +
                         " chunks exceed the " + std::to_string(config_.max_tokens) +
                         " tokens of one step (maxTokensPerStep)");
  int64_t new_blocks = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int64_t n = static_cast<int64_t>(chunks[i].tokens.size()), len = lengths_[static_cast<size_t>(chunks[i].seq)];
    if (len + n > config_.n_ctx)
      return Status::error(where(i) + ": " + std::to_string(n) + " tokens at position " + std::to_string(len) +
                           " do not fit the context: " + std::to_string(len) + " + " + std::to_string(n) +
                           " > n_ctx " + std::to_string(config_.n_ctx));
    new_blocks += blocks_.needed(chunks[i].seq, len + n);
  }
  if (new_blocks > blocks_.freeBlocks())
    return Status::error("step: out of KV blocks: the chunks need " + std::to_string(new_blocks) +
                         " new blocks, " + std::to_string(blocks_.freeBlocks()) + " are free (of " +
                         std::to_string(blocks_.totalBlocks()) + ")");
  return Status::ok();
}

int64_t BatchRows::tableWords(const BatchConfig& c) {
  const int64_t per_seq = (int64_t{c.n_ctx} + c.block_size - 1) / c.block_size;
  return c.max_tokens + std::min(c.max_tokens, c.n_seq_max) * per_seq;
}

BatchRows::BatchRows(const BatchConfig& config)
    : ids(static_cast<size_t>(config.max_tokens)),
      pos(static_cast<size_t>(config.max_tokens)),
      tables(static_cast<size_t>(tableWords(config))) {
  out_rows.reserve(static_cast<size_t>(std::min(config.max_tokens, config.n_seq_max)));
}

void BatchSessionBase::layoutRows(std::span<const Chunk> chunks, BatchRows& out) const {
  out.rows = 0;
  for (const Chunk& c : chunks) out.rows += static_cast<int>(c.tokens.size());
  out.words = static_cast<size_t>(out.rows);  // the tables follow the rows' indices
  out.out_rows.clear();
  size_t row = 0;
  for (const Chunk& c : chunks) {
    const std::span<const int32_t> table = blocks_.table(c.seq);
    const int32_t at = static_cast<int32_t>(out.words);
    std::copy(table.begin(), table.end(), out.tables.begin() + static_cast<std::ptrdiff_t>(out.words));
    out.words += table.size();
    const int pos0 = lengths_[static_cast<size_t>(c.seq)];
    for (size_t j = 0; j < c.tokens.size(); ++j, ++row) {
      out.ids[row] = c.tokens[j];
      out.pos[row] = pos0 + static_cast<int32_t>(j);
      out.tables[row] = at;
    }
    out.out_rows.push_back(static_cast<int>(row) - 1);
  }
}

template <class Evaluate>
Status BatchSessionBase::execute(std::span<const Chunk> chunks, const Evaluate& evaluate) {
  for (const Chunk& c : chunks) {
    const bool grown = blocks_.grow(c.seq, int64_t{lengths_[static_cast<size_t>(c.seq)]} + int64_t(c.tokens.size()));
    (void)grown;  // check() counted the blocks of every chunk against freeBlocks()
  }
  Status st = evaluate();
  if (!st) {  // give the new blocks back, last taken first: the free stack is as before
    for (size_t i = chunks.size(); i-- > 0;) blocks_.shrink(chunks[i].seq, lengths_[static_cast<size_t>(chunks[i].seq)]);
    return st;
  }
  for (const Chunk& c : chunks) lengths_[static_cast<size_t>(c.seq)] += static_cast<int>(c.tokens.size());
  return Status::ok();
}

Status BatchSessionBase::step(std::span<const Chunk> chunks, std::span<float> logits) {
  MINFER_RETURN_IF_ERROR(check(chunks));
  if (logits.size() != chunks.size() * static_cast<size_t>(config_.n_vocab))
    return Status::error("step: logits has " + std::to_string(logits.size()) + " floats, expected " +
                         std::to_string(chunks.size()) + " chunks x " + std::to_string(config_.n_vocab));
  return execute(chunks, [&] { return run(chunks, logits); });
}

template <class T, class Evaluate>
Result<T> BatchSessionBase::executeFor(std::span<const Chunk> chunks, const Evaluate& evaluate) {
  T value{};
  MINFER_RETURN_IF_ERROR(execute(chunks, [&] {
    Result<T> r = evaluate();
    if (!r) return r.takeStatus();
    value = *r;
    return Status::ok();
  }));
  return value;
}

Result<std::span<const float>> BatchSessionBase::step(std::span<const Chunk> chunks) {
  MINFER_RETURN_IF_ERROR(check(chunks));
  return executeFor<std::span<const float>>(chunks, [&] { return runInPlace(chunks); });
}

Result<BatchSession::StepOutputs> BatchSessionBase::step(std::span<const Chunk> chunks,
                                                         std::span<const Output> outputs) {
  MINFER_RETURN_IF_ERROR(check(chunks));
  if (outputs.size() != chunks.size())
    return Status::error("step: " + std::to_string(outputs.size()) + " outputs for " + std::to_string(chunks.size()) +
                         " chunks (one per chunk)");
  return executeFor<StepOutputs>(chunks, [&] { return runOutputs(chunks, outputs); });
}

Result<BatchSession::StepOutputs> BatchSessionBase::runOutputs(std::span<const Chunk> chunks,
                                                               std::span<const Output> outputs) {
  Result<std::span<const float>> rows = runInPlace(chunks);
  if (!rows) return rows.takeStatus();
  const size_t n_vocab = static_cast<size_t>(config_.n_vocab);
  for (size_t i = 0; i < chunks.size(); ++i)
    if (outputs[i].argmax) own_argmax_[i] = greedyToken(rows->subspan(i * n_vocab, n_vocab));
  return StepOutputs{*rows, std::span<const int32_t>(own_argmax_.data(), chunks.size())};
}

Result<std::span<const float>> BatchSessionBase::runInPlace(std::span<const Chunk> chunks) {
  const size_t n = chunks.size() * static_cast<size_t>(config_.n_vocab);
  if (own_logits_.size() < n) own_logits_.resize(n);
  const std::span<float> rows(own_logits_.data(), n);
  MINFER_RETURN_IF_ERROR(run(chunks, rows));
  return std::span<const float>(rows);
}

// ---------------------------------------------------------------------------------------------
// The sequential fallback.

namespace {

class SequentialBatchSession final : public BatchSessionBase {
 public:
  SequentialBatchSession(const Backend& backend, const BatchConfig& config)
      : BatchSessionBase(config), backend_(backend), sessions_(static_cast<size_t>(config.n_seq_max)) {}

  uint64_t allocatedBytes() const override {
    uint64_t bytes = 0;
    for (const auto& s : sessions_)
      if (s) bytes += s->allocatedBytes();
    return bytes;
  }
  bool batchedKernels() const override { return false; }

 protected:
  Status run(std::span<const Chunk> chunks, std::span<float> logits) override {
    // Every session first, so that a failed creation evaluates nothing.
    for (const Chunk& c : chunks) {
      std::unique_ptr<BackendSession>& s = sessions_[static_cast<size_t>(c.seq)];
      if (s) continue;
      Result<std::unique_ptr<BackendSession>> created =
          backend_.createSession(BackendSessionConfig{config().n_ctx, config().n_threads});
      if (!created) return created.takeStatus().withContext("step: sequence " + std::to_string(c.seq) + ": ");
      s = std::move(*created);
    }
    const size_t n_vocab = static_cast<size_t>(config().n_vocab);
    for (size_t i = 0; i < chunks.size(); ++i) {
      BackendSession& s = *sessions_[static_cast<size_t>(chunks[i].seq)];
      const int64_t n = static_cast<int64_t>(chunks[i].tokens.size());
      int pos = length(chunks[i].seq);
      for (int64_t done = 0; done < n;) {  // a chunk ≤ maxTokensPerStep is one forward on the CPU
        const int64_t m = std::min<int64_t>(s.maxBatch(), n - done);
        MINFER_RETURN_IF_ERROR(s.forward(chunks[i].tokens.subspan(static_cast<size_t>(done), static_cast<size_t>(m)),
                                         pos, logits.data() + i * n_vocab, false));
        pos += static_cast<int>(m);
        done += m;
      }
    }
    return Status::ok();
  }

 private:
  const Backend& backend_;
  std::vector<std::unique_ptr<BackendSession>> sessions_;  // (n_seq_max), created at an id's first step
};

}  // namespace

std::unique_ptr<BatchSession> createSequentialBatchSession(const Backend& backend, const BatchConfig& config) {
  return std::make_unique<SequentialBatchSession>(backend, config);
}

}  // namespace minfer
