// BatchSession on the fixture models, compiled at test time: several sequences of different lengths in
// one step, then decode steps with sequences joining, leaving and being truncated, against each sequence
// run alone through Session; block accounting, out-of-blocks, every error of batch.h, and the sequential
// fallback (the path of backends without batched kernels) giving the same logits; the steps of a scenario take the
// three forms in turn (step(chunks, logits); step(chunks): the logits where the session keeps them; step(chunks,
// outputs): per chunk its logits, its argmax, both or neither), with the same logits, and each argmax the greedy token
// of Session's row.
//
// Tolerance: 0 (bit-identical). Every CPU op is row-wise or per (row, head) and sums in an order that does
// not depend on the other rows of the batch (matmul splits its work over output features, attention over
// (row, head) tasks, each reading its own sequence's keys in position order), so a row's logits cannot
// depend on what else shares the step. The test measures max |Δ| and requires it to be 0.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compiler/gguf/gguf_writer.h"
#include "minfer/runtime.h"
#include "runtime/batch_session.h"
#include "tests/e2e/golden_support.h"
#include "tests/runtime/tiny_artifact.h"
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

// What happened to one sequence, in order: a chunk (its tokens, the logits the batch gave unless the step asked for
// none, the argmax it gave or −1), or a truncation to `pos` (tokens empty).
struct Event {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  int pos = 0;
  int32_t argmax = -1;
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
    // The three forms in turn: each must give each sequence's Session logits (and argmax where asked for).
    std::vector<float> logits(plan.size() * static_cast<size_t>(n_vocab_), NAN);
    std::vector<BatchSession::Output> outputs(plan.size());
    std::vector<int32_t> argmax(plan.size(), -1);
    form_ = (form_ + 1) % 3;
    if (form_ == 1) {
      Result<std::span<const float>> rows = b_.step(chunks);
      REQUIRE_MESSAGE(rows.isOk(), rows.status().message());
      REQUIRE(rows->size() == logits.size());
      std::copy(rows->begin(), rows->end(), logits.begin());
    } else if (form_ == 2) {
      // Chunk i asks for: argmax alone, both, neither, logits alone (shifted by three each such step: the scenario's
      // second such step asks for a prompt chunk's argmax alone).
      for (size_t i = 0; i < plan.size(); ++i) {
        const size_t k = (i + 3 * static_cast<size_t>(outputs_steps_)) % 4;
        outputs[i] = {.logits = k == 1 || k == 3, .argmax = k <= 1};
      }
      ++outputs_steps_;
      Result<BatchSession::StepOutputs> out = b_.step(chunks, outputs);
      REQUIRE_MESSAGE(out.isOk(), out.status().message());
      REQUIRE(out->logits.size() == logits.size());
      REQUIRE(out->argmax.size() == plan.size());
      for (size_t i = 0; i < plan.size(); ++i) {
        if (outputs[i].logits)
          std::copy_n(out->logits.begin() + i * n_vocab_, n_vocab_, logits.begin() + i * n_vocab_);
        if (outputs[i].argmax) argmax[i] = out->argmax[i];
      }
    } else {
      Status st = b_.step(chunks, logits);
      REQUIRE_MESSAGE(st.isOk(), st.message());
    }
    for (size_t i = 0; i < plan.size(); ++i) {
      const float* row = logits.data() + i * n_vocab_;
      std::vector<float> kept;
      if (form_ != 2 || outputs[i].logits) kept.assign(row, row + n_vocab_);
      history_[static_cast<size_t>(live_.at(plan[i].first))].push_back(Event{tokens[i], std::move(kept), 0, argmax[i]});
    }
  }
  const std::vector<std::vector<Event>>& history() const { return history_; }

 private:
  BatchSession& b_;
  int n_vocab_;
  std::mt19937 rng_;
  std::map<int, int> live_;  // id → index into history_
  std::vector<std::vector<Event>> history_;
  int form_ = 0;            // the last step's form: 0 step(chunks, logits), 1 step(chunks), 2 step(chunks, outputs)
  int outputs_steps_ = 0;   // steps of form 2 so far
};

// Replays each sequence's history alone through a Session (the same chunks, rewinds for truncations) and
// returns max |Δ| over every logits row against what the batch gave; counts the rows compared, and the argmax
// compared and those that differ from greedyToken of Session's row.
double maxDiffAgainstSessions(const Model& m, const std::vector<std::vector<Event>>& history, int n_ctx, int* rows,
                              int* argmax = nullptr, int* argmax_wrong = nullptr) {
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
      if (e.argmax >= 0 && argmax) {
        ++*argmax;
        if (e.argmax != greedyToken(want)) ++*argmax_wrong;
      }
      if (e.logits.empty()) continue;  // the step asked for no logits for this chunk
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
  int rows = 0, argmax = 0, argmax_wrong = 0;
  const double diff = maxDiffAgainstSessions(m, s.history(), options.n_ctx, &rows, &argmax, &argmax_wrong);
  const std::string path = sequential ? " (sequential fallback)" : " (batched)";
  MESSAGE(what << path << ": max |Δ| vs Session alone = " << diff << " over " << rows << " logits rows; "
               << argmax_wrong << " of " << argmax << " argmax differ from Session's greedy token");
  CHECK(diff == 0);
  CHECK(argmax > 0);
  CHECK(argmax_wrong == 0);
}

// Every family the compiler supports, batched and through the sequential fallback.
TEST_CASE("every model family: sequences joining and leaving between steps give each sequence's Session logits") {
  if (!test::haveFixtures()) return;
  const std::pair<const char*, const char*> fixtures[] = {
      {"stories260K.gguf", "models"},             // llama
      {"tiny-qwen2-Q4_K_M.gguf", "models"},       // qwen2: q/k/v biases, NeoX RoPE, quantized mix
      {"tiny-gemma2-F32.gguf", "arch/models"},    // sliding window 16, attention and final softcaps
      {"tiny-gemma3-Q8_0.gguf", "arch/models"},   // sliding window, QK norm, per-layer RoPE bases
      {"tiny-qwen3moe-Q4_K_M.gguf", "arch/models"}, // MoE FFN
  };
  for (const auto& [model, dir] : fixtures) {
    const std::string name = model;
    CAPTURE(name);
    const std::unique_ptr<Model> m = openFixture(model, dir);
    runScenario(*m, false, model);
    runScenario(*m, true, model);
  }
}

// phi3 with LongRoPE (uneven long factors, compiled for a context beyond the original one, so the long
// set is in use) and its fused q|k|v and gate|up rows read as column views.
TEST_CASE("phi3 with LongRoPE and column views: batched logits equal Session's") {
  if (!test::haveFixtures()) return;
  const uint32_t n_rot = 64, orig = 32;  // tiny-phi3: head_dim 64 = n_rot (fixtures README §8.1)
  const auto factors = [](float first, float step, uint32_t n) {
    std::vector<uint8_t> bytes(4 * n);
    for (uint32_t i = 0; i < n; ++i) {
      const float f = first + step * static_cast<float>(i);
      std::memcpy(bytes.data() + 4 * i, &f, 4);
    }
    return bytes;
  };
  const std::string path = test::ggufVariant(
      "arch/models/tiny-phi3-F32.gguf", "batch-phi3-longrope",
      [&](gguf::GgufWriter& w) {
        w.setU32("phi3.rope.scaling.original_context_length", orig);
        w.setF32("phi3.rope.scaling.attn_factor", 1.1f);
        w.addTensor("rope_factors_long.weight", GgmlType::F32, {n_rot / 2}, factors(1.0f, 0.25f, n_rot / 2));
        w.addTensor("rope_factors_short.weight", GgmlType::F32, {n_rot / 2}, factors(1.0f, 0.0f, n_rot / 2));
      },
      {}, 128);
  Result<std::unique_ptr<Model>> m = Model::open(path, BackendKind::kCpu);
  REQUIRE_MESSAGE(m.isOk(), m.status().message());
  runScenario(**m, false, "tiny-phi3 LongRoPE");
  runScenario(**m, true, "tiny-phi3 LongRoPE");
}

// A hand-built artifact has no last-token tail (schema Plan): the whole plan runs on every row and the
// logits projection computes the wanted rows only, one run of consecutive rows at a time.
TEST_CASE("a plan without a last-token tail (hand-built artifact): batched logits equal Session's") {
  test::TinySpec spec;
  spec.max_batch = 32;
  spec.seed = 41;
  const test::TinyModel tiny = test::makeTinyModel(spec);
  const std::string path = test::scratchDir() + "/batch-tiny.mfb";
  const std::string err = test::writeTinyArtifact(tiny, path);
  REQUIRE_MESSAGE(err.empty(), err);
  Result<std::unique_ptr<Model>> m = Model::open(path, BackendKind::kCpu);
  REQUIRE_MESSAGE(m.isOk(), m.status().message());
  runScenario(**m, false, "tiny hand-built (no tail)");
}

// The state a scheduler sees.
struct Snapshot {
  int free = 0, open = 0;
  std::vector<int> lengths;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(const BatchSession& b) {
  Snapshot s{b.freeBlocks(), b.openSequences(), {}};
  for (int id = 0; id < b.maxSequences(); ++id) s.lengths.push_back(b.isOpen(id) ? b.length(id) : -1);
  return s;
}

// Runs `chunks` (sequence, token count) expecting an error containing `want`; checks nothing changed.
void expectStepError(BatchSession& b, const std::vector<BatchSession::Chunk>& chunks, size_t logits_size,
                     const std::string& want) {
  const Snapshot before = snapshot(b);
  std::vector<float> logits(logits_size);
  Status st = b.step(chunks, logits);
  REQUIRE_FALSE(st.isOk());
  INFO(st.message());
  CHECK(st.message().find(want) != std::string::npos);
  CHECK(snapshot(b) == before);
  if (want.find("logits has") != std::string::npos) return;  // the one error the in-place form cannot make
  Result<std::span<const float>> rows = b.step(chunks);  // the in-place form: the same error, nothing changed
  REQUIRE_FALSE(rows.isOk());
  CHECK(rows.status().message() == st.message());
  CHECK(snapshot(b) == before);
  const std::vector<BatchSession::Output> outputs(chunks.size(), {.logits = false, .argmax = true});
  Result<BatchSession::StepOutputs> out = b.step(chunks, outputs);  // and the outputs form
  REQUIRE_FALSE(out.isOk());
  CHECK(out.status().message() == st.message());
  CHECK(snapshot(b) == before);
}

TEST_CASE("block accounting: growth by whole blocks, truncate and close give blocks back, out of blocks, same on both paths") {
  if (!test::haveFixtures()) return;
  const std::unique_ptr<Model> m = openFixture("stories260K.gguf");
  const int n_vocab = m->info().n_vocab;
  std::vector<Snapshot> seen[2];
  for (bool sequential : {false, true}) {
    CAPTURE(sequential);
    BatchOptions options{.n_ctx = 30, .n_seq_max = 3, .n_blocks = 5, .block_size = 4, .n_threads = 1};
    options.sequential = sequential;
    std::unique_ptr<BatchSession> b = batchSession(*m, options);
    std::vector<Snapshot>& log = seen[sequential];
    CHECK(b->totalBlocks() == 5);
    CHECK(b->freeBlocks() == 5);
    CHECK(b->blockSize() == 4);
    CHECK(b->contextLength() == 30);
    CHECK(b->maxSequences() == 3);
    CHECK(b->maxTokensPerStep() == m->info().max_batch);
    std::mt19937 rng(5);
    const std::vector<int32_t> nine = randomTokens(9, n_vocab, rng), three = randomTokens(3, n_vocab, rng);
    std::vector<float> one(n_vocab), two(2 * size_t(n_vocab));

    const int s0 = *b->openSequence(), s1 = *b->openSequence();
    CHECK(b->blocksNeeded(s0, 9) == 3);
    CHECK(b->blocksNeeded(s1, 0) == 0);
    CHECK(b->blocksNeeded(2, 5) == 0);  // not open
    REQUIRE(b->step(std::vector<BatchSession::Chunk>{{s0, nine}}, one).isOk());
    log.push_back(snapshot(*b));
    CHECK(b->allocatedBytes() > 0);
    CHECK(b->freeBlocks() == 2);
    CHECK(b->length(s0) == 9);
    CHECK(b->blocksNeeded(s0, 3) == 0);  // positions 9..11 are in block 2
    CHECK(b->blocksNeeded(s0, 4) == 1);
    // 3 blocks wanted, 2 free: refused, nothing changes (the fallback's session is not even consulted).
    expectStepError(*b, {{s1, nine}}, n_vocab, "out of KV blocks: the chunks need 3 new blocks, 2 are free (of 5)");
    // Two chunks that fit alone but not together.
    expectStepError(*b, {{s0, three}, {s1, nine}}, 2 * n_vocab, "need 3 new blocks, 2 are free");
    REQUIRE(b->truncate(s0, 5).isOk());  // keeps blocks 0 and 1 (positions 0..7)
    CHECK(b->freeBlocks() == 3);
    CHECK(b->length(s0) == 5);
    REQUIRE(b->truncate(s0, 4).isOk());  // block 1 held nothing any more
    CHECK(b->freeBlocks() == 4);
    log.push_back(snapshot(*b));
    REQUIRE(b->step(std::vector<BatchSession::Chunk>{{s1, nine}, {s0, three}}, two).isOk());
    log.push_back(snapshot(*b));
    CHECK(b->freeBlocks() == 0);
    CHECK(b->length(s0) == 7);
    REQUIRE(b->closeSequence(s1).isOk());
    CHECK(b->freeBlocks() == 3);
    CHECK_FALSE(b->isOpen(s1));
    CHECK(b->length(s1) == 0);
    CHECK(b->openSequences() == 1);
    REQUIRE(b->truncate(s0, 0).isOk());  // preemption: everything back, the id stays open
    CHECK(b->freeBlocks() == 5);
    CHECK(b->isOpen(s0));
    CHECK(b->length(s0) == 0);
    log.push_back(snapshot(*b));
    // One sequence takes the whole pool (20 positions); its next token finds no block.
    const std::vector<int32_t> ten = randomTokens(10, n_vocab, rng);
    for (int i = 0; i < 2; ++i) {
      REQUIRE(b->step(std::vector<BatchSession::Chunk>{{s0, ten}}, one).isOk());
      log.push_back(snapshot(*b));
    }
    CHECK(b->freeBlocks() == 0);
    CHECK(b->blocksNeeded(s0, 1) == 1);
    expectStepError(*b, {{s0, std::span(ten).first(1)}}, n_vocab, "need 1 new blocks, 0 are free (of 5)");
  }
  CHECK(seen[0] == seen[1]);
}

TEST_CASE("every error of batch.h: the message names the numbers and a failed call changes nothing") {
  if (!test::haveFixtures()) return;
  const std::unique_ptr<Model> m = openFixture("stories260K.gguf");
  const int n_vocab = m->info().n_vocab, max_tokens = m->info().max_batch;
  for (bool sequential : {false, true}) {
    CAPTURE(sequential);
    BatchOptions options{.n_ctx = 20, .n_seq_max = 3, .n_blocks = 0, .block_size = 8, .n_threads = 1};
    options.sequential = sequential;
    std::unique_ptr<BatchSession> b = batchSession(*m, options);
    CHECK(b->totalBlocks() == 3 * 3);  // n_blocks 0: n_seq_max × ceil(20 / 8)
    std::mt19937 rng(9);
    const std::vector<int32_t> five = randomTokens(5, n_vocab, rng), bad_low = {3, -1}, bad_high = {n_vocab, 4};
    const std::vector<int32_t> many = randomTokens(max_tokens + 1, n_vocab, rng), empty;
    const int a = *b->openSequence(), c = *b->openSequence();
    std::vector<float> row(n_vocab);
    REQUIRE(b->step(std::vector<BatchSession::Chunk>{{a, five}}, row).isOk());
    const std::vector<float> after_five = row;

    expectStepError(*b, {}, 0, "step: no chunks");
    expectStepError(*b, {{a, five}, {c, empty}}, 2 * n_vocab, "chunk 1 (sequence 1) has no tokens");
    expectStepError(*b, {{2, five}}, n_vocab, "sequence 2 is not open");
    expectStepError(*b, {{-1, five}}, n_vocab, "sequence -1 is not open");
    expectStepError(*b, {{3, five}}, n_vocab, "sequence 3 is not open (ids 0..2");
    expectStepError(*b, {{c, five}, {a, five}, {c, five}}, 3 * n_vocab, "chunk 2 (sequence 1): the sequence appears twice");
    expectStepError(*b, {{c, bad_low}}, n_vocab, "token id -1 at index 1 is outside [0, 512)");
    expectStepError(*b, {{a, five}, {c, bad_high}}, 2 * n_vocab, "token id 512 at index 0 is outside [0, 512)");
    expectStepError(*b, {{c, many}}, n_vocab,
                    std::to_string(max_tokens + 1) + " tokens in 1 chunks exceed the " + std::to_string(max_tokens) +
                        " tokens of one step");
    expectStepError(*b, {{a, std::span(many).first(16)}}, n_vocab,
                    "16 tokens at position 5 do not fit the context: 5 + 16 > n_ctx 20");
    expectStepError(*b, {{a, five}}, n_vocab + 1, "logits has 513 floats, expected 1 chunks x 512");
    expectStepError(*b, {{a, five}, {c, five}}, n_vocab, "logits has 512 floats, expected 2 chunks x 512");
    {  // the outputs form's own error: one output per chunk
      const Snapshot before = snapshot(*b);
      const std::vector<BatchSession::Output> one(1);
      Result<BatchSession::StepOutputs> out = b->step(std::vector<BatchSession::Chunk>{{a, five}, {c, five}}, one);
      REQUIRE_FALSE(out.isOk());
      CHECK(out.status().message().find("step: 1 outputs for 2 chunks (one per chunk)") != std::string::npos);
      CHECK(snapshot(*b) == before);
    }

    CHECK(b->closeSequence(2).message().find("closeSequence: sequence 2 is not open") != std::string::npos);
    CHECK(b->closeSequence(-5).message().find("sequence -5 is not open") != std::string::npos);
    CHECK(b->truncate(2, 0).message().find("truncate: sequence 2 is not open") != std::string::npos);
    CHECK(b->truncate(a, 6).message().find("position 6 of sequence 0 must be in 0..5") != std::string::npos);
    CHECK(b->truncate(a, -1).message().find("position -1 of sequence 0 must be in 0..5") != std::string::npos);
    CHECK(b->length(a) == 5);
    REQUIRE(b->openSequence().isOk());
    Result<int> full = b->openSequence();
    REQUIRE_FALSE(full.isOk());
    CHECK(full.status().message().find("all 3 sequences are open") != std::string::npos);

    // After every refusal the session computes what it would have without them: a truncated and
    // re-evaluated suffix gives the logits it gave before.
    REQUIRE(b->truncate(a, 0).isOk());
    REQUIRE(b->step(std::vector<BatchSession::Chunk>{{a, five}}, row).isOk());
    CHECK(row == after_five);
  }
}

TEST_CASE("options out of range: the message names the option and its bounds") {
  if (!test::haveFixtures()) return;
  const std::unique_ptr<Model> m = openFixture("stories260K.gguf");
  const auto refused = [&](BatchOptions o, const std::string& want) {
    Result<std::unique_ptr<BatchSession>> b = m->createBatchSession(o);
    REQUIRE_FALSE(b.isOk());
    INFO(b.status().message());
    CHECK(b.status().message().find(want) != std::string::npos);
  };
  const BatchOptions ok{.n_ctx = 64, .n_seq_max = 4, .n_blocks = 0, .block_size = 16, .n_threads = 1};
  const auto with = [&](auto edit) {
    BatchOptions o = ok;
    edit(o);
    return o;
  };
  refused(with([](BatchOptions& o) { o.n_ctx = 0; }), "BatchOptions::n_ctx = 0 is out of range 1..");
  refused(with([](BatchOptions& o) { o.n_ctx = Model::kMaxContext + 1; }),
          "BatchOptions::n_ctx = 1048577 is out of range 1..");
  refused(with([](BatchOptions& o) { o.n_seq_max = 0; }), "BatchOptions::n_seq_max = 0 is out of range 1..4096");
  refused(with([](BatchOptions& o) { o.n_seq_max = 4097; }), "BatchOptions::n_seq_max = 4097 is out of range 1..4096");
  refused(with([](BatchOptions& o) { o.block_size = 0; }), "BatchOptions::block_size = 0 is out of range 1..1024");
  refused(with([](BatchOptions& o) { o.block_size = 12; }), "BatchOptions::block_size = 12 is out of range 1..1024 or not a power of two");
  refused(with([](BatchOptions& o) { o.block_size = 2048; }), "BatchOptions::block_size = 2048 is out of range");
  refused(with([](BatchOptions& o) { o.n_blocks = -1; }), "BatchOptions::n_blocks = -1 is out of range 0..16");
  refused(with([](BatchOptions& o) { o.n_blocks = 17; }), "BatchOptions::n_blocks = 17 is out of range 0..16");
  refused(with([](BatchOptions& o) { o.n_threads = -2; }), "BatchOptions::n_threads = -2 must be ≥ 0");
  // The bounds themselves are accepted.
  for (const BatchOptions& o : {with([](BatchOptions& x) { x.n_blocks = 16; }), with([](BatchOptions& x) { x.block_size = 1; }),
                                with([](BatchOptions& x) { x.block_size = 1024; x.n_seq_max = 1; x.n_ctx = 1; })}) {
    Result<std::unique_ptr<BatchSession>> b = m->createBatchSession(o);
    CHECK_MESSAGE(b.isOk(), b.status().message());
  }
}

// A step of one token per sequence equals Session::decode, and a step of every sequence's last token
// equals that sequence's prefill: the decode plan (one row) and the prefill plan agree on the CPU.
TEST_CASE("a step of one row (the decode plan) and many rows (the prefill plan) agree with Session") {
  if (!test::haveFixtures()) return;
  const std::unique_ptr<Model> m = openFixture("tiny-gemma2-Q8_0.gguf", "arch/models");
  const int n_vocab = m->info().n_vocab;
  std::unique_ptr<BatchSession> b = batchSession(*m, {.n_ctx = 40, .n_seq_max = 2, .n_blocks = 0, .block_size = 2, .n_threads = 2});
  Script s(*b, n_vocab, 77);
  const int x = s.open();
  s.step({{x, 1}});  // one row at position 0
  s.step({{x, 1}});
  const int y = s.open();
  s.step({{y, 1}, {x, 1}});
  s.step({{y, 20}});
  s.step({{x, 1}});
  int rows = 0;
  const double diff = maxDiffAgainstSessions(*m, s.history(), 40, &rows);
  MESSAGE("tiny-gemma2-Q8_0 one-row steps: max |Δ| " << diff << " over " << rows << " rows");
  CHECK(diff == 0);
}

}  // namespace
}  // namespace minfer
