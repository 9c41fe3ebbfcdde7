// BatchSessionBase (runtime/batch_session.h) under a backend stand-in whose run() records what it was
// given and can be told to fail: run() sees block tables that cover every new position, and a failed
// run() leaves lengths, tables and the free stack exactly as before the step.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "minfer/sampler.h"
#include "runtime/batch_session.h"

namespace minfer {
namespace {

class RecordingBatch final : public BatchSessionBase {
 public:
  using BatchSessionBase::BatchSessionBase;
  uint64_t allocatedBytes() const override { return 0; }
  bool batchedKernels() const override { return false; }
  std::vector<int32_t> table(int seq) const {
    const std::span<const int32_t> t = blocks().table(seq);
    return {t.begin(), t.end()};
  }

  bool fail = false;
  std::vector<std::vector<int32_t>> tables_seen;  // per chunk of the last run(): its sequence's table
  std::vector<int> lengths_seen;                  // per chunk: length(seq) during run()

 protected:
  Status run(std::span<const Chunk> chunks, std::span<float> logits) override {
    tables_seen.clear();
    lengths_seen.clear();
    for (size_t i = 0; i < chunks.size(); ++i) {
      tables_seen.push_back(table(chunks[i].seq));
      lengths_seen.push_back(length(chunks[i].seq));
      logits[i * static_cast<size_t>(config().n_vocab)] = static_cast<float>(chunks[i].seq);
    }
    return fail ? Status::error("injected failure") : Status::ok();
  }
};

const BatchConfig kConfig{.n_ctx = 16, .n_seq_max = 3, .n_blocks = 8, .block_size = 4, .n_threads = 1,
                          .max_tokens = 16, .n_vocab = 5};

TEST_CASE("run() sees the lengths before the step and tables covering the new positions") {
  RecordingBatch b(kConfig);
  const int s0 = *b.openSequence(), s1 = *b.openSequence();
  const std::vector<int32_t> five = {1, 2, 3, 4, 0}, three = {4, 4, 1};
  std::vector<float> logits(2 * 5, -1.0f);
  REQUIRE(b.step(std::vector<BatchSession::Chunk>{{s0, five}}, std::span(logits).first(5)).isOk());
  CHECK(b.tables_seen == std::vector<std::vector<int32_t>>{{0, 1}});
  CHECK(b.lengths_seen == std::vector<int>{0});
  REQUIRE(b.step(std::vector<BatchSession::Chunk>{{s1, three}, {s0, three}}, logits).isOk());
  CHECK(b.tables_seen == std::vector<std::vector<int32_t>>{{2}, {0, 1}});  // 5 + 3 positions fit 2 blocks
  CHECK(b.lengths_seen == std::vector<int>{0, 5});
  CHECK(logits[0] == float(s1));
  CHECK(logits[5] == float(s0));
  CHECK(b.length(s0) == 8);
  CHECK(b.length(s1) == 3);
  CHECK(b.freeBlocks() == 5);
}

TEST_CASE("a failed run() changes nothing, in both step forms: lengths, tables, free blocks, and the blocks the next step takes") {
  RecordingBatch b(kConfig);
  const int s0 = *b.openSequence(), s1 = *b.openSequence(), s2 = *b.openSequence();
  const std::vector<int32_t> five = {1, 2, 3, 4, 0}, nine = {0, 1, 2, 3, 4, 0, 1, 2, 3};
  std::vector<float> one(5), three(15);
  REQUIRE(b.step(std::vector<BatchSession::Chunk>{{s0, five}}, one).isOk());
  REQUIRE(b.step(std::vector<BatchSession::Chunk>{{s2, five}}, one).isOk());
  REQUIRE(b.truncate(s0, 3).isOk());  // block 1 back on top of the free stack
  const std::vector<int32_t> t0 = b.table(s0), t1 = b.table(s1), t2 = b.table(s2);
  const int free = b.freeBlocks();

  b.fail = true;
  const std::vector<BatchSession::Chunk> chunks = {{s1, nine}, {s0, five}, {s2, std::span(nine).first(1)}};
  Status st = b.step(chunks, three);
  REQUIRE_FALSE(st.isOk());
  REQUIRE(st.message() == "injected failure");
  const std::vector<std::vector<int32_t>> attempted = b.tables_seen;
  CHECK(attempted[0].size() == 3);  // 9 positions
  CHECK(attempted[1].size() == 2);  // 3 + 5
  CHECK(attempted[2].size() == 2);  // 5 + 1
  const auto unchanged = [&] {
    CHECK(b.length(s0) == 3);
    CHECK(b.length(s1) == 0);
    CHECK(b.length(s2) == 5);
    CHECK(b.table(s0) == t0);
    CHECK(b.table(s1) == t1);
    CHECK(b.table(s2) == t2);
    CHECK(b.freeBlocks() == free);
  };
  unchanged();
  // The in-place form (step(chunks): the default runInPlace runs run()) fails and rolls back alike.
  Result<std::span<const float>> in_place = b.step(chunks);
  REQUIRE_FALSE(in_place.isOk());
  REQUIRE(in_place.status().message() == "injected failure");
  CHECK(b.tables_seen == attempted);
  unchanged();

  b.fail = false;
  REQUIRE(b.step(chunks, three).isOk());
  CHECK(b.tables_seen == attempted);  // the free stack was restored exactly
  CHECK(b.length(s1) == 9);
  CHECK(b.freeBlocks() == free - 4);
}

// A stand-in that lays out every step's rows as the batched CUDA session uploads them.
class LayoutBatch final : public BatchSessionBase {
 public:
  explicit LayoutBatch(const BatchConfig& c) : BatchSessionBase(c), rows(c) {}
  uint64_t allocatedBytes() const override { return 0; }
  bool batchedKernels() const override { return true; }
  std::vector<int32_t> table(int seq) const {
    const std::span<const int32_t> t = blocks().table(seq);
    return {t.begin(), t.end()};
  }
  BatchRows rows;

 protected:
  Status run(std::span<const Chunk> chunks, std::span<float>) override {
    layoutRows(chunks, rows);
    return Status::ok();
  }
};

TEST_CASE("layoutRows: consecutive rows per chunk, positions from each length, block tables after the row indices") {
  const BatchConfig config{.n_ctx = 16, .n_seq_max = 3, .n_blocks = 12, .block_size = 4, .n_threads = 1,
                           .max_tokens = 16, .n_vocab = 5};
  CHECK(BatchRows::tableWords(config) == 16 + 3 * 4);  // rows, then a full table per chunk (3 sequences)
  LayoutBatch b(config);
  CHECK(b.rows.tables.size() == 28u);
  CHECK(b.rows.ids.size() == 16u);
  const int s0 = *b.openSequence(), s1 = *b.openSequence(), s2 = *b.openSequence();
  const std::vector<int32_t> six = {1, 2, 3, 4, 0, 1}, one = {3}, two = {2, 4};
  std::vector<float> logits(3 * 5);
  REQUIRE(b.step(std::vector<BatchSession::Chunk>{{s0, six}, {s1, one}}, std::span(logits).first(10)).isOk());
  // s0: blocks 0, 1 (6 positions); s1: block 2.
  CHECK(b.rows.rows == 7);
  CHECK(std::vector<int32_t>(b.rows.ids.begin(), b.rows.ids.begin() + 7) == std::vector<int32_t>{1, 2, 3, 4, 0, 1, 3});
  CHECK(std::vector<int32_t>(b.rows.pos.begin(), b.rows.pos.begin() + 7) == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 0});
  CHECK(b.rows.words == 7u + 2u + 1u);
  CHECK(std::vector<int32_t>(b.rows.tables.begin(), b.rows.tables.begin() + 10) ==
        std::vector<int32_t>{7, 7, 7, 7, 7, 7, 9, 0, 1, 2});
  CHECK(b.rows.out_rows == std::vector<int>{5, 6});
  // Then a decode row for s0 (position 6, still block 1), a prompt for s2 and two tokens for s1 (positions 1, 2),
  // in that chunk order: s2's table is its new block 3.
  REQUIRE(b.step(std::vector<BatchSession::Chunk>{{s0, one}, {s2, six}, {s1, two}}, logits).isOk());
  CHECK(b.rows.rows == 9);
  CHECK(std::vector<int32_t>(b.rows.pos.begin(), b.rows.pos.begin() + 9) ==
        std::vector<int32_t>{6, 0, 1, 2, 3, 4, 5, 1, 2});
  const std::vector<int32_t> t0 = b.table(s0), t1 = b.table(s1), t2 = b.table(s2);
  CHECK(t0 == std::vector<int32_t>{0, 1});
  CHECK(t1 == std::vector<int32_t>{2});
  CHECK(t2 == std::vector<int32_t>{3, 4});
  // Every row's table, read through its index, is its sequence's; and covers its position.
  const int seq_of_row[] = {s0, s2, s2, s2, s2, s2, s2, s1, s1};
  for (int r = 0; r < 9; ++r) {
    CAPTURE(r);
    const std::vector<int32_t> want = b.table(seq_of_row[r]);
    const int32_t at = b.rows.tables[static_cast<size_t>(r)];
    REQUIRE(at >= 9);
    REQUIRE(static_cast<size_t>(at) + want.size() <= b.rows.words);
    CHECK(std::vector<int32_t>(b.rows.tables.begin() + at, b.rows.tables.begin() + at + static_cast<long>(want.size())) == want);
    CHECK(b.rows.pos[static_cast<size_t>(r)] / config.block_size < static_cast<int>(want.size()));
  }
  CHECK(b.rows.words == 9u + 2u + 2u + 1u);
  CHECK(b.rows.out_rows == std::vector<int>{0, 6, 8});
}

// greedyToken is the argmax BatchSession::Output asks for: Sampler::sample's greedy token (temperature 0, no penalty)
// on rows with ties, NaN and infinities, and the documented special cases.
TEST_CASE("greedyToken: the first highest value, NaN never wins, 0 when nothing is finite; Sampler's greedy token") {
  const float inf = INFINITY, nan = NAN;
  CHECK(greedyToken(std::vector<float>{1, 3, 3, 2}) == 1);               // ties: the lowest id
  CHECK(greedyToken(std::vector<float>{nan, -2, nan, -1}) == 3);         // NaN never wins
  CHECK(greedyToken(std::vector<float>{nan, nan}) == 0);                 // nothing to pick: token 0
  CHECK(greedyToken(std::vector<float>{-inf, -inf, -inf}) == 0);
  CHECK(greedyToken(std::vector<float>{-inf, -5, inf, inf}) == 2);
  CHECK(greedyToken(std::vector<float>{-0.0f, 0.0f}) == 0);              // −0 == +0: a tie
  SamplerParams greedy;
  greedy.temperature = 0;
  REQUIRE(samplesArgmax(greedy));
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> value(-4, 4), special(0, 9);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> row(37 + trial % 11);
    for (float& v : row) {  // few distinct values: many ties; some NaN, infinities and signed zeros
      const int k = special(rng);
      v = k == 0 ? nan : k == 1 ? -inf : k == 2 ? (trial % 3 == 0 ? inf : -0.0f) : static_cast<float>(value(rng));
    }
    // The rule spelled out: the first index of the highest value that is neither NaN nor −∞, else 0.
    int32_t want = 0;
    bool found = false;
    for (size_t i = 0; i < row.size(); ++i) {
      if (std::isnan(row[i]) || row[i] == -inf) continue;
      if (!found || row[i] > row[static_cast<size_t>(want)]) want = static_cast<int32_t>(i);
      found = true;
    }
    Sampler sampler(greedy, static_cast<int32_t>(row.size()));
    CAPTURE(trial);
    CHECK(greedyToken(row) == want);
    CHECK(sampler.sample(row) == want);
  }
}

TEST_CASE("samplesArgmax: greedy without a repetition penalty, and nothing else") {
  SamplerParams p;
  CHECK_FALSE(samplesArgmax(p));  // temperature 0.8
  p.temperature = 0;
  CHECK(samplesArgmax(p));  // penalty 1: off
  p.repeat_penalty = 1.1f;
  CHECK_FALSE(samplesArgmax(p));
  p.repeat_last_n = 0;  // no history: off again
  CHECK(samplesArgmax(p));
  p.temperature = -1;
  CHECK(samplesArgmax(p));
}

}  // namespace
}  // namespace minfer
