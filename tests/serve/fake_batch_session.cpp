// FakeBatchSession: block accounting and step() checks as minfer/batch.h documents them.
#include "tests/serve/fake_batch_session.h"

#include <algorithm>
#include <limits>
#include <set>

namespace minfer::test {

FakeBatchSession::FakeBatchSession(const Config& config) : config_(config), seqs_(config.n_seq_max), free_(config.n_blocks) {}

Status FakeBatchSession::refuse(std::string message) {
  ++step_errors;
  last_error = message;
  return Status::error(std::move(message));
}

Result<int> FakeBatchSession::openSequence() {
  for (int i = 0; i < config_.n_seq_max; ++i)
    if (!seqs_[i].open) {
      seqs_[i] = Seq{true, {}};
      return i;
    }
  return refuse("openSequence: all " + std::to_string(config_.n_seq_max) + " sequences are open");
}

Status FakeBatchSession::closeSequence(int seq) {
  if (!isOpen(seq)) return refuse("closeSequence: sequence " + std::to_string(seq) + " is not open");
  free_ += blocksFor(seqs_[seq].tokens.size());
  seqs_[seq] = Seq{};
  return Status::ok();
}

Status FakeBatchSession::truncate(int seq, int pos) {
  if (!isOpen(seq) || pos < 0 || pos > length(seq)) return refuse("truncate: bad sequence or position");
  free_ += blocksFor(seqs_[seq].tokens.size()) - blocksFor(static_cast<size_t>(pos));
  seqs_[seq].tokens.resize(static_cast<size_t>(pos));
  return Status::ok();
}

Status FakeBatchSession::step(std::span<const Chunk> chunks, std::span<float> logits) {
  if (fail_steps > 0) {
    --fail_steps;
    return Status::error("injected backend failure");
  }
  if (chunks.empty()) return refuse("step: no chunks");
  std::set<int> seen;
  size_t total = 0;
  int blocks = 0;
  for (const Chunk& c : chunks) {
    if (!isOpen(c.seq) || !seen.insert(c.seq).second) return refuse("step: sequence not open or twice");
    if (c.tokens.empty()) return refuse("step: empty chunk");
    for (int32_t t : c.tokens)
      if (t < 0 || t >= config_.n_vocab) return refuse("step: token out of range");
    if (length(c.seq) + c.tokens.size() > static_cast<size_t>(config_.n_ctx)) return refuse("step: past the context");
    total += c.tokens.size();
    blocks += blocksNeeded(c.seq, static_cast<int>(c.tokens.size()));
  }
  if (total > static_cast<size_t>(config_.max_tokens_per_step)) return refuse("step: over the token budget");
  if (blocks > free_)
    return refuse("step: out of KV blocks: " + std::to_string(blocks) + " needed, " + std::to_string(free_) + " free");
  if (logits.size() != chunks.size() * static_cast<size_t>(config_.n_vocab)) return refuse("step: logits size");
  std::vector<LoggedChunk> log;
  for (size_t i = 0; i < chunks.size(); ++i) {
    Seq& s = seqs_[chunks[i].seq];
    log.push_back({chunks[i].seq, static_cast<int>(s.tokens.size()), {chunks[i].tokens.begin(), chunks[i].tokens.end()}});
    s.tokens.insert(s.tokens.end(), chunks[i].tokens.begin(), chunks[i].tokens.end());
    const int32_t last = chunks[i].tokens.back();
    auto it = next.find(last);
    const int32_t want = it != next.end() ? it->second : default_next;
    float* row = logits.data() + i * config_.n_vocab;
    for (int v = 0; v < config_.n_vocab; ++v) row[v] = -static_cast<float>(v % 7);  // a spread, argmax below
    row[want] = 10.0f;
  }
  free_ -= blocks;
  steps.push_back(std::move(log));
  return Status::ok();
}

Result<BatchSession::StepOutputs> FakeBatchSession::step(std::span<const Chunk> chunks,
                                                         std::span<const Output> wanted) {
  if (wanted.size() != chunks.size()) return refuse("step: outputs size");
  Result<std::span<const float>> rows = step(chunks);
  if (!rows) return rows.takeStatus();
  const size_t n_vocab = static_cast<size_t>(config_.n_vocab);
  argmax_.assign(chunks.size(), -1);
  for (size_t i = 0; i < chunks.size(); ++i) {
    float* row = rows_.data() + i * n_vocab;
    if (wanted[i].argmax)
      argmax_[i] = bad_argmax_steps > 0 ? config_.n_vocab : static_cast<int32_t>(std::max_element(row, row + n_vocab) - row);
    if (!wanted[i].logits) std::fill(row, row + n_vocab, std::numeric_limits<float>::quiet_NaN());
  }
  if (bad_argmax_steps > 0) --bad_argmax_steps;
  outputs.emplace_back(wanted.begin(), wanted.end());
  return StepOutputs{rows_, argmax_};
}

int FakeBatchSession::length(int seq) const { return isOpen(seq) ? static_cast<int>(seqs_[seq].tokens.size()) : 0; }

bool FakeBatchSession::isOpen(int seq) const { return seq >= 0 && seq < config_.n_seq_max && seqs_[seq].open; }

int FakeBatchSession::openSequences() const {
  return static_cast<int>(std::count_if(seqs_.begin(), seqs_.end(), [](const Seq& s) { return s.open; }));
}

int FakeBatchSession::blocksNeeded(int seq, int n_tokens) const {
  const size_t len = isOpen(seq) ? seqs_[seq].tokens.size() : 0;
  return blocksFor(len + static_cast<size_t>(n_tokens)) - blocksFor(len);
}

}  // namespace minfer::test
