// BatchSession on the fixture models, compiled at test time: several sequences of different lengths in
// one step, then decode steps with sequences joining, leaving and being truncated, against each sequence
// run alone through Session; block accounting, out-of-blocks, every error of batch.h, and the sequential
// fallback (the path of backends without batched kernels) giving the same logits.
//
// Tolerance: 0 (bit-identical). Every CPU op is row-wise or per (row, head) and sums in an order that does
// not depend on the other rows of the batch (matmul splits its work over output features, attention over
// (row, head) tasks, each reading its own sequence's keys in position order), so a row's logits cannot
// depend on what else shares the step. The test measures max |Δ| and requires it to be 0.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "minfer/runtime.h"
#include "tests/e2e/golden_support.h"
#include "tests/test_support.h"

namespace minfer {
namespace {

std::unique_ptr<Model> openFixture(const std::string& model, const std::string& dir = "models") {
  const std::string path = test::compiledFixture(model, dir);
  REQUIRE(!path.empty());
  Result<std::unique_ptr<Model>> m = Model::open(path, BackendKind::kCpu);
  REQUIRE_MESSAGE(m.isOk(), m.status().message());
  return std::move(*m);
}

std::unique_ptr<BatchSession> batchSession(const Model& m, const BatchOptions& options) {
  Result<std::unique_ptr<BatchSession>> b = m.createBatchSession(options);
  REQUIRE_MESSAGE(b.isOk(), b.status().message());
  return std::move(*b);
}

std::vector<int32_t> randomTokens(int n, int n_vocab, std::mt19937& rng) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& id : t) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(n_vocab));
  return t;
}

// What happened to one sequence, in order: a chunk (its tokens and the logits the batch gave), or a
// truncation to `pos` (tokens empty).
struct Event {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  int pos = 0;
};

// Drives a BatchSession and records every sequence's history (sequence = the order it was opened in,
// not its id: ids are reused).
class Script {
 public:
  Script(BatchSession& b, int n_vocab, uint32_t seed) : b_(b), n_vocab_(n_vocab), rng_(seed) {}

  int open() {
    Result<int> id = b_.openSequence();
    REQUIRE_MESSAGE(id.isOk(), id.status().message());
    live_[*id] = static_cast<int>(history_.size());
    history_.emplace_back();
    return *id;
  }
  void close(int id) {
    REQUIRE(b_.closeSequence(id).isOk());
    live_.erase(id);
  }
  void truncate(int id, int pos) {
    REQUIRE(b_.truncate(id, pos).isOk());
    history_[static_cast<size_t>(live_.at(id))].push_back(Event{{}, {}, pos});
  }
  // One step: sequence id → number of new (random) tokens.
  void step(const std::vector<std::pair<int, int>>& plan) {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<BatchSession::Chunk> chunks;
    for (const auto& [id, n] : plan) tokens.push_back(randomTokens(n, n_vocab_, rng_));
    for (size_t i = 0; i < plan.size(); ++i) chunks.push_back({plan[i].first, tokens[i]});
    std::vector<float> logits(plan.size() * static_cast<size_t>(n_vocab_), NAN);
    Status st = b_.step(chunks, logits);
    REQUIRE_MESSAGE(st.isOk(), st.message());
    for (size_t i = 0; i < plan.size(); ++i) {
      const float* row = logits.data() + i * n_vocab_;
      history_[static_cast<size_t>(live_.at(plan[i].first))].push_back(
          Event{tokens[i], std::vector<float>(row, row + n_vocab_), 0});
    }
  }
  const std::vector<std::vector<Event>>& history() const { return history_; }

 private:
  BatchSession& b_;
  int n_vocab_;
  std::mt19937 rng_;
  std::map<int, int> live_;  // id → index into history_
  std::vector<std::vector<Event>> history_;
};

// Replays each sequence's history alone through a Session (the same chunks, rewinds for truncations) and
// returns max |Δ| over every logits row against what the batch gave; counts the rows compared.
double maxDiffAgainstSessions(const Model& m, const std::vector<std::vector<Event>>& history, int n_ctx, int* rows) {
  double worst = 0;
  for (const std::vector<Event>& seq : history) {
    Result<std::unique_ptr<Session>> s = m.createSession({.n_ctx = n_ctx, .n_threads = 2});
    REQUIRE_MESSAGE(s.isOk(), s.status().message());
    for (const Event& e : seq) {
      if (e.tokens.empty()) {
        REQUIRE((*s)->rewind(e.pos).isOk());
        continue;
      }
      Status st = (*s)->prefill(e.tokens);
      REQUIRE_MESSAGE(st.isOk(), st.message());
      const std::span<const float> want = (*s)->logits();
      REQUIRE(want.size() == e.logits.size());
      for (size_t t = 0; t < want.size(); ++t) {
        const double d = std::isfinite(e.logits[t]) ? std::fabs(double(e.logits[t]) - want[t]) : INFINITY;
        worst = std::max(worst, d);
      }
      ++*rows;
    }
  }
  return worst;
}

// Prompts of different lengths in one step, decode steps, a sequence joining (on a closed one's id),
// one leaving, one truncated and regrown, one prompt arriving in two chunks beside decodes.
void runScenario(const Model& m, bool sequential, const std::string& what) {
  const int n_vocab = m.info().n_vocab, max_tokens = m.info().max_batch;
  REQUIRE(max_tokens >= 24);
  BatchOptions options{.n_ctx = 64, .n_seq_max = 4, .n_blocks = 0, .block_size = 4, .n_threads = 2};
  options.sequential = sequential;
  std::unique_ptr<BatchSession> b = batchSession(m, options);
  CHECK(b->batchedKernels() == !sequential);
  Script s(*b, n_vocab, 14);
  const int a = s.open(), bb = s.open(), c = s.open();
  s.step({{a, 7}, {bb, 3}, {c, 12}});
  for (int i = 0; i < 3; ++i) s.step({{a, 1}, {bb, 1}, {c, 1}});
  s.close(bb);
  const int d = s.open();  // reuses bb's id
  CHECK(d == bb);
  s.step({{c, 1}, {d, 9}, {a, 1}});
  s.truncate(c, 6);
  s.step({{a, 1}, {c, 5}, {d, 1}});
  const int e = s.open();
  s.step({{e, 10}, {d, 1}, {a, 1}, {c, 1}});  // e's prompt in two chunks
  s.step({{d, 1}, {e, 6}});
  s.close(a);
  for (int i = 0; i < 2; ++i) s.step({{e, 1}, {c, 1}, {d, 1}});
  int rows = 0;
  const double diff = maxDiffAgainstSessions(m, s.history(), options.n_ctx, &rows);
  MESSAGE(what << (sequential ? " (sequential fallback)" : " (batched)") << ": max |Δ| vs Session alone = " << diff
                << " over " << rows << " logits rows");
  CHECK(diff == 0);
}

TEST_CASE("stories260K: sequences joining and leaving between steps give each sequence's Session logits") {
  if (!test::haveFixtures()) return;
  const std::unique_ptr<Model> m = openFixture("stories260K.gguf");
  runScenario(*m, false, "stories260K");
  runScenario(*m, true, "stories260K");
}

}  // namespace
}  // namespace minfer
