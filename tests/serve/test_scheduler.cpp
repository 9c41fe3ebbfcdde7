// Scheduler (minfer/scheduler.h) on a deterministic fake BatchSession: admission, budget packing,
// preemption by recomputation, cancellation, end of generation, max_tokens, stop strings across pieces,
// UTF-8 streaming, refused requests, a failing backend, and the driving thread.
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "minfer/scheduler.h"
#include "runtime/serve/stop_matcher.h"
#include "tests/serve/fake_batch_session.h"
#include "tests/text/spm_vocabulary.h"

namespace {

using minfer::FinishReason;
using minfer::RequestEvent;
using minfer::RequestParams;
using minfer::Scheduler;
using minfer::SubmitError;
using minfer::test::FakeBatchSession;

// tests/text/spm_vocabulary.h: <unk> <s> </s> (eos), byte tokens 3..258 (byte b = 3 + b), then these.
constexpr int32_t kEos = 2;
constexpr int32_t kHel = 259, kLo = 260, kWor = 261, kLd = 262, kBang = 263, kA = 264;
int32_t byteToken(uint8_t b) { return 3 + b; }

minfer::Tokenizer makeTokenizer() {
  auto tok = minfer::Tokenizer::create(
      minfer::test::spmVocab({{"Hel", 0}, {"lo", 0}, {"_wor", 0}, {"ld", 0}, {"!", 0}, {"a", 0}}, false));
  REQUIRE_MESSAGE(bool(tok), tok.status().message());
  return *tok;
}

struct Collected {
  std::vector<std::string> pieces;  // non-empty texts, in order
  std::string text;
  int finals = 0;
  FinishReason reason = FinishReason::kError;
  int prompt_tokens = -1, completion_tokens = -1;
  std::string error;
};

minfer::RequestCallback collect(Collected& c) {
  return [&c](const RequestEvent& e) {
    if (!e.text.empty()) c.pieces.emplace_back(e.text);
    c.text += e.text;
    if (e.finished) {
      ++c.finals;
      c.reason = e.finish_reason;
      c.prompt_tokens = e.prompt_tokens;
      c.completion_tokens = e.completion_tokens;
      c.error = std::string(e.error);
    }
  };
}

RequestParams greedy(std::vector<int32_t> prompt, int max_tokens) {
  RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0;
  return p;
}

minfer::SchedulerOptions options() {
  minfer::SchedulerOptions o;
  o.n_vocab = 300;
  return o;
}

// Runs iterations until nothing is left (bounded).
int drain(Scheduler& s) {
  int n = 0;
  while (s.runOnce()) REQUIRE(++n < 10000);
  return n;
}

// "Hel" → "lo" → " wor" → "ld" → "!" → eos.
void scriptHelloWorld(FakeBatchSession& fake) { fake.next = {{kA, kHel}, {kHel, kLo}, {kLo, kWor}, {kWor, kLd}, {kLd, kBang}, {kBang, kEos}}; }

}  // namespace

TEST_CASE("StopMatcher: matches across pieces, holds back only a possible start, drops the stop string") {
  minfer::serve::StopMatcher m({"lo wo", "xyz"});
  CHECK(m.push("Hel") == "He");  // "l" could start "lo wo"
  CHECK(m.push("lo") == "l");   // "lo" still could
  CHECK(m.push(" w") == "");
  CHECK(m.push("orld") == "");
  CHECK(m.matched());
  CHECK(m.push("more") == "");

  minfer::serve::StopMatcher n({"xyz"});
  CHECK(n.push("abx") == "ab");
  CHECK(n.push("y") == "");
  CHECK(n.push("q") == "xyq");  // not a stop after all: released
  CHECK(n.push("x") == "");
  CHECK(n.flush() == "x");      // end of generation: the held tail is text
  CHECK(!n.matched());

  minfer::serve::StopMatcher earliest({"cd", "bcd"});
  CHECK(earliest.push("abcde") == "a");  // the earliest occurrence over all stop strings
}

TEST_CASE("one request: greedy text, max_tokens → length, usage") {
  FakeBatchSession fake({});
  scriptHelloWorld(fake);
  Scheduler s(fake, makeTokenizer(), options());
  Collected c;
  REQUIRE(s.submit(greedy({1, kA}, 3), collect(c)));
  drain(s);
  CHECK(c.text == "Hello wor");
  CHECK(c.finals == 1);
  CHECK(c.reason == FinishReason::kLength);
  CHECK(c.prompt_tokens == 2);
  CHECK(c.completion_tokens == 3);
  CHECK(fake.step_errors == 0);
  CHECK(fake.freeBlocks() == fake.totalBlocks());
  CHECK(fake.openSequences() == 0);
  // The prompt in one chunk, then one decode token per step; the last token is not evaluated.
  REQUIRE(fake.steps.size() == 3);
  CHECK(fake.steps[0][0].tokens == std::vector<int32_t>{1, kA});
  CHECK(fake.steps[1][0].tokens == std::vector<int32_t>{kHel});
  CHECK(fake.steps[2][0].pos == 3);
  const minfer::SchedulerMetrics m = s.metrics();
  CHECK(m.requests_submitted == 1);
  CHECK(m.requests_finished[int(FinishReason::kLength)] == 1);
  CHECK(m.prompt_tokens == 2);
  CHECK(m.generated_tokens == 3);
  CHECK(m.kv_blocks_used == 0);
  CHECK(m.requests_running == 0);
}

TEST_CASE("end of generation: finish_reason stop, the eos token neither emitted nor counted") {
  FakeBatchSession fake({});
  scriptHelloWorld(fake);
  Scheduler s(fake, makeTokenizer(), options());
  Collected c;
  REQUIRE(s.submit(greedy({kA}, 100), collect(c)));
  drain(s);
  CHECK(c.text == "Hello world!");
  CHECK(c.reason == FinishReason::kStop);
  CHECK(c.completion_tokens == 5);
  CHECK(c.pieces == std::vector<std::string>{"Hel", "lo", " wor", "ld", "!"});

  // stop_at_eog off: generation goes on through the eos (its piece is empty) until max_tokens.
  Collected d;
  RequestParams p = greedy({kA}, 7);
  p.stop_at_eog = false;
  fake.next[kEos] = kA;
  REQUIRE(s.submit(p, collect(d)));
  drain(s);
  CHECK(d.text == "Hello world!a");
  CHECK(d.reason == FinishReason::kLength);
  CHECK(d.completion_tokens == 7);
}

TEST_CASE("stop strings: matched across token boundaries, not emitted; a held-back prefix is released") {
  FakeBatchSession fake({});
  scriptHelloWorld(fake);
  Scheduler s(fake, makeTokenizer(), options());
  Collected c;
  RequestParams p = greedy({kA}, 100);
  p.stop = {"lo wo"};  // spans the pieces "lo", " wor"
  REQUIRE(s.submit(p, collect(c)));
  Collected d;
  RequestParams q = greedy({kA}, 100);
  q.stop = {"d!?", "zz"};  // "d!" is held back until the end, then released
  REQUIRE(s.submit(q, collect(d)));
  drain(s);
  CHECK(c.text == "Hel");
  CHECK(c.pieces == std::vector<std::string>{"He", "l"});  // "l" held: it could start "lo wo"
  CHECK(c.reason == FinishReason::kStop);
  CHECK(c.completion_tokens == 3);  // "Hel", "lo", " wor"
  CHECK(d.text == "Hello world!");
  CHECK(d.pieces.back() == "d!");  // held from "ld" on, released with the final event
  CHECK(d.reason == FinishReason::kStop);
  CHECK(fake.freeBlocks() == fake.totalBlocks());
}

TEST_CASE("UTF-8: a character split over byte tokens is streamed whole") {
  FakeBatchSession fake({});
  // "é" = C3 A9, then "!" and eos.
  fake.next = {{kA, byteToken(0xC3)}, {byteToken(0xC3), byteToken(0xA9)}, {byteToken(0xA9), kBang}, {kBang, kEos}};
  Scheduler s(fake, makeTokenizer(), options());
  Collected c;
  REQUIRE(s.submit(greedy({kA}, 10), collect(c)));
  drain(s);
  CHECK(c.pieces == std::vector<std::string>{"\xC3\xA9", "!"});
  CHECK(c.completion_tokens == 3);

  // Stopped in the middle of the character: the incomplete bytes end as U+FFFD (Detokenizer::flush).
  Collected d;
  REQUIRE(s.submit(greedy({kA}, 1), collect(d)));
  drain(s);
  CHECK(d.text == "\xEF\xBF\xBD");
  CHECK(d.reason == FinishReason::kLength);
}

TEST_CASE("budget packing: decode tokens first, then prompt chunks in arrival order within maxTokensPerStep") {
  FakeBatchSession::Config cfg;
  cfg.max_tokens_per_step = 8;
  FakeBatchSession fake(cfg);
  fake.default_next = kA;
  Scheduler s(fake, makeTokenizer(), options());
  Collected a, b, c;
  REQUIRE(s.submit(greedy({1, 2, 3, 4, 5}, 4), collect(a)));
  REQUIRE(s.submit(greedy({6, 7, 8, 9, 10}, 4), collect(b)));
  REQUIRE(s.submit(greedy({11, 12, 13, 14, 15}, 4), collect(c)));
  drain(s);
  CHECK(fake.step_errors == 0);
  REQUIRE(fake.steps.size() >= 3);
  // Step 1: a's prompt (5) and 3 tokens of b's.
  REQUIRE(fake.steps[0].size() == 2);
  CHECK(fake.steps[0][0].tokens.size() == 5);
  CHECK(fake.steps[0][1].tokens == std::vector<int32_t>{6, 7, 8});
  // Step 2: a's decode token, the rest of b's prompt (2), then 5 of c's: 8.
  REQUIRE(fake.steps[1].size() == 3);
  CHECK(fake.steps[1][0].tokens.size() == 1);
  CHECK(fake.steps[1][1].tokens == std::vector<int32_t>{9, 10});
  CHECK(fake.steps[1][1].pos == 3);
  CHECK(fake.steps[1][2].tokens.size() == 5);
  for (const auto& step : fake.steps) {
    size_t n = 0;
    for (const auto& chunk : step) n += chunk.tokens.size();
    CHECK(n <= 8);
  }
  for (Collected* r : {&a, &b, &c}) {
    CHECK(r->text == "aaaa");
    CHECK(r->reason == FinishReason::kLength);
  }
}

TEST_CASE("step outputs: nothing before a prompt's last chunk, the argmax alone for greedy requests, else the row") {
  FakeBatchSession::Config cfg;
  cfg.max_tokens_per_step = 8;
  FakeBatchSession fake(cfg);
  fake.default_next = kA;
  Scheduler s(fake, makeTokenizer(), options());
  Collected a, b, c;
  RequestParams penalized = greedy({6, 7, 8, 9, 10}, 3);
  penalized.sampling.repeat_penalty = 1.1f;  // greedy, but the penalty changes the row first: the row comes back
  RequestParams sampled = greedy({11, 12, 13, 14, 15}, 3);
  sampled.sampling.temperature = 0.8f;
  REQUIRE(s.submit(greedy({1, 2, 3, 4, 5}, 3), collect(a)));
  REQUIRE(s.submit(penalized, collect(b)));
  REQUIRE(s.submit(sampled, collect(c)));
  drain(s);
  CHECK(fake.step_errors == 0);
  using Output = minfer::BatchSession::Output;
  const Output none{.logits = false, .argmax = false}, argmax{.logits = false, .argmax = true}, row{};
  auto same = [](const std::vector<Output>& got, const std::vector<Output>& want) {
    if (got.size() != want.size()) return false;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i].logits != want[i].logits || got[i].argmax != want[i].argmax) return false;
    return true;
  };
  REQUIRE(fake.outputs.size() == fake.steps.size());
  REQUIRE(fake.outputs.size() >= 2);
  CHECK(same(fake.outputs[0], {argmax, none}));      // a's whole prompt; the first 3 of b's
  CHECK(same(fake.outputs[1], {argmax, row, row}));  // a decodes; b's last 2 (penalized); c's whole prompt (sampled)
  for (size_t i = 2; i < fake.outputs.size(); ++i)
    for (size_t k = 0; k < fake.steps[i].size(); ++k) {
      const Output& o = fake.outputs[i][k];
      CHECK(o.logits != o.argmax);  // every later chunk is a decode token: one of the two
    }
  // The fake's rows not asked for are NaN: the texts show nobody sampled one.
  for (Collected* r : {&a, &b, &c}) {
    CHECK(r->text == "aaa");
    CHECK(r->reason == FinishReason::kLength);
  }
}

TEST_CASE("admission: at most maxSequences() run; the rest wait in FIFO order and are admitted as others finish") {
  FakeBatchSession::Config cfg;
  cfg.n_seq_max = 2;
  FakeBatchSession fake(cfg);
  fake.default_next = kA;
  Scheduler s(fake, makeTokenizer(), options());
  std::vector<Collected> c(5);
  for (int i = 0; i < 5; ++i) REQUIRE(s.submit(greedy({1, kA}, 2 + i), collect(c[i])));
  REQUIRE(s.runOnce());
  minfer::SchedulerMetrics m = s.metrics();
  CHECK(m.requests_running == 2);
  CHECK(m.requests_waiting == 3);
  CHECK(fake.steps[0].size() == 2);
  drain(s);
  for (int i = 0; i < 5; ++i) {
    CHECK(c[i].finals == 1);
    CHECK(c[i].completion_tokens == 2 + i);
  }
  for (const auto& step : fake.steps) CHECK(step.size() <= 2);
  m = s.metrics();
  CHECK(m.requests_waiting == 0);
  CHECK(m.requests_finished[int(FinishReason::kLength)] == 5);
  CHECK(fake.step_errors == 0);
}

TEST_CASE("admission waits for KV blocks: a prompt is admitted only when the pool covers it") {
  FakeBatchSession::Config cfg;
  cfg.block_size = 4;
  cfg.n_blocks = 5;  // 20 positions in all
  FakeBatchSession fake(cfg);
  fake.default_next = kA;
  Scheduler s(fake, makeTokenizer(), options());
  Collected a, b;
  REQUIRE(s.submit(greedy(std::vector<int32_t>(12, kA), 2), collect(a)));  // 3 blocks
  REQUIRE(s.submit(greedy(std::vector<int32_t>(8, kA), 2), collect(b)));   // 2 blocks: + a's next block > 5
  REQUIRE(s.runOnce());
  CHECK(s.metrics().requests_running == 1);
  CHECK(s.metrics().requests_waiting == 1);
  drain(s);
  CHECK(a.completion_tokens == 2);
  CHECK(b.completion_tokens == 2);
  CHECK(fake.step_errors == 0);
  CHECK(s.metrics().preemptions == 0);
}

TEST_CASE("out of blocks: the youngest request is preempted (truncate to 0), recomputed later, same text") {
  // Reference: each request alone.
  auto script = [](FakeBatchSession& f) {
    for (int32_t t = 259; t < 265; ++t) f.next[t] = 259 + (t - 258) % 6;  // a cycle over the normal tokens
  };
  std::vector<std::string> alone;
  for (int i = 0; i < 3; ++i) {
    FakeBatchSession f({});
    script(f);
    Scheduler s(f, makeTokenizer(), options());
    Collected c;
    REQUIRE(s.submit(greedy({1, int32_t(259 + i)}, 20), collect(c)));
    drain(s);
    alone.push_back(c.text);
  }

  FakeBatchSession::Config cfg;
  cfg.block_size = 2;
  cfg.n_blocks = 14;  // 28 positions for three requests growing to 22 each
  cfg.n_ctx = 64;
  FakeBatchSession fake(cfg);
  script(fake);
  Scheduler s(fake, makeTokenizer(), options());
  std::vector<Collected> c(3);
  for (int i = 0; i < 3; ++i) REQUIRE(s.submit(greedy({1, int32_t(259 + i)}, 20), collect(c[i])));
  drain(s);
  CHECK(fake.step_errors == 0);
  CHECK(s.metrics().preemptions > 0);
  for (int i = 0; i < 3; ++i) {
    INFO("request " << i);
    CHECK(c[i].text == alone[i]);
    CHECK(c[i].reason == FinishReason::kLength);
    CHECK(c[i].completion_tokens == 20);
  }
  // A recomputation evaluates prompt + generated tokens from position 0 again.
  bool recomputed = false;
  for (const auto& step : fake.steps)
    for (const auto& chunk : step)
      if (chunk.pos == 0 && chunk.tokens.size() > 2) recomputed = true;
  CHECK(recomputed);
  CHECK(fake.freeBlocks() == fake.totalBlocks());
}

// Rows sampled on several threads (SchedulerOptions::sampling_threads): the same tokens as on one, and as each
// request alone with its seed. A vocabulary of 131,072 (each row worth a thread of its own: cpu::ThreadPool's
// kMinWorkPerThread) and seeded sampling at temperature 1 with top-k, top-p and min-p off over the fake's rows (the
// scripted token at 10, the rest spread over −(v mod 7): about 40% of the draws take the scripted token, which differs
// from row to row; ids past the tokenizer's 265 detokenize to nothing) and a repetition penalty, so each row's draw
// depends on its own row, Sampler state and history; a wrong row, Sampler or order shows in the logged steps.
TEST_CASE("sampling threads: a step's rows sampled in parallel give the tokens of one thread and of each request alone") {
  auto params = [](int i) {
    RequestParams p;
    p.prompt = {1, int32_t(259 + i)};
    p.max_tokens = 24;
    p.stop_at_eog = false;
    p.sampling.temperature = 1.0f;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    p.sampling.repeat_penalty = 1.1f;
    p.sampling.seed = 1000 + static_cast<uint64_t>(i);
    return p;
  };
  // Each request's evaluated tokens, as the fake logged them (seq, position → token).
  auto run = [&](int threads, int requests, int first) {
    FakeBatchSession::Config cfg;
    cfg.n_vocab = 131072;
    cfg.n_seq_max = 6;
    cfg.n_blocks = 128;
    FakeBatchSession fake(cfg);
    fake.default_next = 3;
    for (int32_t t = 0; t < 300; ++t) fake.next[t] = 3 + (t * 37) % 290;
    minfer::SchedulerOptions o = options();
    o.n_vocab = cfg.n_vocab;
    o.sampling_threads = threads;
    Scheduler s(fake, makeTokenizer(), o);
    std::vector<Collected> c(static_cast<size_t>(requests));
    for (int i = 0; i < requests; ++i) REQUIRE(s.submit(params(first + i), collect(c[static_cast<size_t>(i)])));
    drain(s);
    CHECK(fake.step_errors == 0);
    std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(requests));
    std::vector<std::vector<int32_t>> by_seq(static_cast<size_t>(cfg.n_seq_max));
    for (const auto& step : fake.steps)
      for (const auto& chunk : step) {
        auto& t = by_seq[static_cast<size_t>(chunk.seq)];
        t.resize(static_cast<size_t>(chunk.pos));
        t.insert(t.end(), chunk.tokens.begin(), chunk.tokens.end());
      }
    for (int i = 0; i < requests; ++i) {
      CHECK(c[static_cast<size_t>(i)].completion_tokens == 24);
      tokens[static_cast<size_t>(i)] = by_seq[static_cast<size_t>(i)];  // sequence ids in submission order here
    }
    return tokens;
  };
  const std::vector<std::vector<int32_t>> one = run(1, 6, 0);
  CHECK(run(3, 6, 0) == one);
  CHECK(run(6, 6, 0) == one);
  for (int i = 0; i < 6; ++i) {
    INFO("request " << i);
    CHECK(run(4, 1, i)[0] == one[static_cast<size_t>(i)]);
  }
  // The draws are not the scripted (greedy) path: both kinds of token occur in every request.
  for (const std::vector<int32_t>& t : one) {
    size_t scripted = 0, other = 0;
    for (size_t k = 2; k < t.size(); ++k) {
      const int32_t want = t[k - 1] < 300 ? 3 + (t[k - 1] * 37) % 290 : 3;  // fake.next, else default_next
      (t[k] == want ? scripted : other) += 1;
    }
    CHECK(scripted > 0);
    CHECK(other > 0);
  }
}

TEST_CASE("a request that alone fills the pool finishes with length, never a refused step") {
  FakeBatchSession::Config cfg;
  cfg.block_size = 4;
  cfg.n_blocks = 3;  // 12 positions < n_ctx 64
  FakeBatchSession fake(cfg);
  fake.default_next = kA;
  Scheduler s(fake, makeTokenizer(), options());
  CHECK(s.capacity() == 12);
  Collected c;
  REQUIRE(s.submit(greedy({1, 2, 3}, 100), collect(c)));
  drain(s);
  CHECK(c.reason == FinishReason::kLength);
  CHECK(c.completion_tokens == 10);  // 3 + 10 = 13 tokens: the last one is never evaluated
  CHECK(fake.step_errors == 0);
}

TEST_CASE("cancel: a running request finishes cancelled at the next iteration and frees its blocks; so does a waiting one") {
  FakeBatchSession::Config cfg;
  cfg.n_seq_max = 1;
  FakeBatchSession fake(cfg);
  fake.default_next = kA;
  Scheduler s(fake, makeTokenizer(), options());
  Collected a, b;
  auto ha = s.submit(greedy({1, 2, 3, 4, 5, 6}, 50), collect(a));
  auto hb = s.submit(greedy({1, 2}, 50), collect(b));
  REQUIRE(ha);
  REQUIRE(hb);
  CHECK(ha->id() == 1);
  CHECK(hb->id() == 2);
  REQUIRE(s.runOnce());
  REQUIRE(s.runOnce());
  CHECK(fake.freeBlocks() < fake.totalBlocks());
  hb->cancel();  // waiting
  ha->cancel();  // running
  ha->cancel();  // idempotent
  s.runOnce();
  CHECK(a.finals == 1);
  CHECK(a.reason == FinishReason::kCancelled);
  CHECK(a.text == "aa");
  CHECK(b.finals == 1);
  CHECK(b.reason == FinishReason::kCancelled);
  CHECK(b.completion_tokens == 0);
  CHECK(fake.freeBlocks() == fake.totalBlocks());
  CHECK(fake.openSequences() == 0);
  CHECK(!s.runOnce());
  CHECK(s.metrics().requests_finished[int(FinishReason::kCancelled)] == 2);
}

TEST_CASE("submit refuses bad requests with the field named") {
  FakeBatchSession fake({});
  minfer::SchedulerOptions o = options();
  o.max_queue = 2;
  Scheduler s(fake, makeTokenizer(), o);
  auto refused = [&](RequestParams p, const char* what, SubmitError reason = SubmitError::kInvalidRequest) {
    Collected c;
    SubmitError why = SubmitError::kStopped;
    auto h = s.submit(std::move(p), collect(c), &why);
    REQUIRE(!h);
    INFO(h.status().message());
    CHECK(h.status().message().find(what) != std::string::npos);
    CHECK(why == reason);  // typed: the server maps it to 400 or 503 without reading the message
  };
  refused(greedy({}, 1), "prompt: empty");
  refused(greedy({1, 300}, 1), "prompt[1]: token id 300 outside [0, 300)");
  refused(greedy(std::vector<int32_t>(64, 1), 1), "prompt of 64 tokens does not fit the context of 64");
  refused(greedy({1}, 0), "max_tokens: 0");
  RequestParams many = greedy({1}, 1);
  many.stop.assign(17, "x");
  refused(many, "stop: 17 strings, at most 16");
  RequestParams empty_stop = greedy({1}, 1);
  empty_stop.stop = {"x", ""};
  refused(empty_stop, "stop[1]: empty");
  Collected c1, c2;
  REQUIRE(s.submit(greedy({1}, 1), collect(c1)));
  REQUIRE(s.submit(greedy({1}, 1), collect(c2)));
  refused(greedy({1}, 1), "queue full", SubmitError::kQueueFull);
  drain(s);
  CHECK(c1.finals == 1);
  CHECK(c2.finals == 1);
  s.stop();
  refused(greedy({1}, 1), "stopped", SubmitError::kStopped);
  refused(greedy({}, 1), "prompt: empty");  // the request's own fault comes first
}

TEST_CASE("repeat_last_n beyond the capacity is the whole history (not an allocation of that many tokens)") {
  FakeBatchSession fake({});
  fake.default_next = kA;
  Scheduler s(fake, makeTokenizer(), options());
  std::vector<Collected> c(2);  // INT32_MAX, then capacity() + 1: the same text
  for (int32_t last_n : {INT32_MAX, s.capacity() + 1}) {
    RequestParams p = greedy({1, kA}, 4);
    p.sampling.repeat_last_n = last_n;
    p.sampling.repeat_penalty = 1e6f;
    REQUIRE(s.submit(p, collect(c[last_n == INT32_MAX ? 0 : 1])));
  }
  drain(s);
  CHECK(c[0].reason == FinishReason::kLength);
  CHECK(c[0].text == c[1].text);
  CHECK(fake.step_errors == 0);
}

TEST_CASE("a failing step, or one giving an argmax outside the vocabulary, finishes its requests with error; the "
          "scheduler keeps serving") {
  const std::pair<int FakeBatchSession::*, const char*> faults[] = {
      {&FakeBatchSession::fail_steps, "injected backend failure"},
      {&FakeBatchSession::bad_argmax_steps, "the step gave chunk 0 the argmax 300, outside [0, 300)"}};
  for (const auto& [fault, says] : faults) {
    CAPTURE(says);
    FakeBatchSession fake({});
    fake.default_next = kA;
    Scheduler s(fake, makeTokenizer(), options());
    Collected a, b;
    REQUIRE(s.submit(greedy({1, 2}, 3), collect(a)));
    fake.*fault = 1;
    s.runOnce();
    CHECK(a.reason == FinishReason::kError);
    CHECK(a.error.find(says) != std::string::npos);
    CHECK(fake.openSequences() == 0);
    REQUIRE(s.submit(greedy({1, 2}, 3), collect(b)));
    drain(s);
    CHECK(b.reason == FinishReason::kLength);
    CHECK(b.text == "aaa");
  }
}

TEST_CASE("a failing step right after a preemption: the preempted request still resumes and finishes") {
  // 3 blocks of 2 positions: both prompts (2 tokens each) take one block; the next decode step needs a
  // block for each, one is free, so the younger request is preempted for the older one's decode token.
  FakeBatchSession::Config cfg;
  cfg.block_size = 2;
  cfg.n_blocks = 3;
  FakeBatchSession fake(cfg);
  fake.default_next = kA;
  Scheduler s(fake, makeTokenizer(), options());
  Collected a, b;
  REQUIRE(s.submit(greedy({1, kA}, 3), collect(a)));
  REQUIRE(s.submit(greedy({1, kA}, 3), collect(b)));
  REQUIRE(s.runOnce());  // both prompts
  REQUIRE(fake.steps.size() == 1);
  CHECK(fake.steps[0].size() == 2);
  fake.fail_steps = 1;
  s.runOnce();  // a's decode token, b preempted to make room; the step fails
  CHECK(s.metrics().preemptions == 1);
  CHECK(a.reason == FinishReason::kError);
  drain(s);
  CHECK(b.finals == 1);
  CHECK(b.reason == FinishReason::kLength);
  CHECK(b.text == "aaa");
  CHECK(fake.step_errors == 0);
  CHECK(fake.openSequences() == 0);
}

TEST_CASE("driving thread: concurrent submitters, every request answered once; stop() cancels what is left") {
  FakeBatchSession::Config cfg;
  cfg.n_seq_max = 3;
  cfg.n_blocks = 20;
  FakeBatchSession fake(cfg);
  fake.default_next = kA;
  Scheduler s(fake, makeTokenizer(), options());
  s.start();
  std::mutex mu;
  std::vector<Collected> results(40);
  std::atomic<int> done{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t)
    clients.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        Collected* c = &results[t * 10 + i];
        auto h = s.submit(greedy({1, kA}, 1 + i), [c, &mu, &done](const RequestEvent& e) {
          std::lock_guard<std::mutex> lock(mu);
          c->text += e.text;
          if (e.finished) {
            ++c->finals;
            c->completion_tokens = e.completion_tokens;
            ++done;
          }
        });
        REQUIRE(h);
      }
    });
  for (auto& t : clients) t.join();
  for (int spin = 0; done < 40 && spin < 2000; ++spin) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(done == 40);
  for (int i = 0; i < 40; ++i) {
    CHECK(results[i].finals == 1);
    CHECK(results[i].text == std::string(1 + i % 10, 'a'));
  }
  // Long requests, then stop: each finishes exactly once, cancelled or done.
  std::vector<Collected> late(5);
  for (auto& c : late) REQUIRE(s.submit(greedy({1}, 60), [&c, &mu](const RequestEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (e.finished) ++c.finals;
  }));
  s.stop();
  for (auto& c : late) CHECK(c.finals == 1);
  CHECK(fake.step_errors == 0);
  CHECK(fake.openSequences() == 0);
  Collected after;
  CHECK(!s.submit(greedy({1}, 1), collect(after)));
}
