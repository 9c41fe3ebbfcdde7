// The runtime end to end on hand-built artifacts: the CPU interpreter vs an independent float64
// forward pass, prefill/decode consistency, batching, threads, generate(), and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "minfer/artifact.h"
#include "minfer/runtime.h"
#include "runtime/backend.h"
#include "tests/runtime/tiny_artifact.h"
#include "tests/test_support.h"

namespace minfer {
namespace {

using test::TinySpec;

// Builds a model from `spec` and writes it once per spec name.
struct Built {
  test::TinyModel model;
  std::string path;
};

Built build(const TinySpec& spec, const std::string& name) {
  Built b{test::makeTinyModel(spec), test::scratchDir() + "/" + name + ".mfb"};
  const std::string err = test::writeTinyArtifact(b.model, b.path);
  REQUIRE_MESSAGE(err.empty(), err);
  return b;
}

std::unique_ptr<Model> open(const std::string& path) {
  Result<std::unique_ptr<Model>> m = Model::open(path, BackendKind::kCpu, {.verify_checksums = true});
  REQUIRE_MESSAGE(m.isOk(), m.status().message());
  return std::move(*m);
}

std::unique_ptr<Session> session(const Model& m, int n_ctx, int threads = 2) {
  Result<std::unique_ptr<Session>> s = m.createSession({.n_ctx = n_ctx, .n_threads = threads});
  REQUIRE_MESSAGE(s.isOk(), s.status().message());
  return std::move(*s);
}

// The three variants: llama-like with a quantized mix (every plane kind), qwen-like (biases, NeoX
// RoPE with partial rotation and frequency scaling, per-head q/k norm, tied quantized embedding),
// and an all-F32 model without GPU extras.
std::vector<std::pair<std::string, TinySpec>> variants() {
  TinySpec llama;
  TinySpec qwen;
  qwen.arch = "qwen3";
  qwen.seed = 2;
  qwen.rope_style = fb::RopeStyle::Neox;
  qwen.rope_base = 1e6f;
  qwen.rope_scale = 0.5f;
  qwen.n_rot = 16;
  qwen.eps = 1e-6f;
  qwen.qkv_bias = qwen.qk_norm = qwen.tied = true;
  qwen.n_head = 4;
  qwen.head_dim = 64;
  qwen.wq = GgmlType::Q5_1;
  qwen.wk = GgmlType::Q4_1;
  qwen.wv = GgmlType::Q5_0;
  qwen.wo = GgmlType::Q4_K;
  qwen.up = GgmlType::Q6_K;
  TinySpec f32;
  f32.seed = 3;
  f32.gpu_extras = false;
  f32.max_batch = 16;
  f32.embd = f32.wq = f32.wk = f32.wv = f32.wo = f32.gate = f32.up = f32.down0 = f32.down1 = f32.output = GgmlType::F32;
  return {{"llama-mix", llama}, {"qwen-mix", qwen}, {"f32", f32}};
}

std::vector<int32_t> randomTokens(int n, uint32_t n_vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& id : t) id = static_cast<int32_t>(rng() % n_vocab);
  return t;
}

double maxRel(std::span<const float> a, std::span<const float> ref) {
  double d = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - ref[i]));
    r = std::max(r, std::fabs(double(ref[i])));
  }
  return d / r;
}

TEST_CASE("prefill logits of every position match the float64 forward pass") {
  for (const auto& [name, spec] : variants()) {
    CAPTURE(name);
    const Built b = build(spec, name);
    auto model = open(b.path);
    CHECK(std::string(model->backendName()) == "cpu");
    const std::vector<int32_t> tokens = randomTokens(11, b.model.n_vocab, 7);  // 3 batches of ≤ 4 (llama, qwen)
    auto s = session(*model, 32);
    std::vector<float> all(tokens.size() * b.model.n_vocab);
    REQUIRE(s->prefill(tokens, all).isOk());
    CHECK(s->position() == 11);
    const std::vector<double> ref = test::referenceForward(b.model, tokens);
    const double err = test::maxRelError(all.data(), ref.data(), all.size());
    MESSAGE(name << ": prefill logits max rel error vs float64 " << err);
    CHECK(err < 1e-5);  // fixtures README §4: f32 math, f32 KV → ~1e-6; bound 1e-5
    // The logits are not degenerate (a broken model gives constant rows): rows and argmaxes differ.
    CHECK(std::memcmp(all.data(), all.data() + b.model.n_vocab, b.model.n_vocab * 4) != 0);
    // logits() is the last row.
    CHECK(std::memcmp(s->logits().data(), all.data() + 10 * b.model.n_vocab, b.model.n_vocab * 4) == 0);
  }
}

TEST_CASE("prefill then decode gives the logits of one prefill over all tokens") {
  for (const auto& [name, spec] : variants()) {
    CAPTURE(name);
    const Built b = build(spec, name);
    auto model = open(b.path);
    const uint32_t nv = b.model.n_vocab;
    const std::vector<int32_t> tokens = randomTokens(12, nv, 9);
    auto whole = session(*model, 16);
    std::vector<float> all(tokens.size() * nv);
    REQUIRE(whole->prefill(tokens, all).isOk());

    auto s = session(*model, 16, 3);
    REQUIRE(s->prefill(std::span(tokens).first(5)).isOk());
    double worst = maxRel(s->logits(), std::span<const float>(all).subspan(4 * nv, nv));
    for (size_t t = 5; t < tokens.size(); ++t) {
      REQUIRE(s->decode(tokens[t]).isOk());
      CHECK(s->position() == int(t) + 1);
      worst = std::max(worst, maxRel(s->logits(), std::span<const float>(all).subspan(t * nv, nv)));
    }
    MESSAGE(name << ": prefill+decode vs one prefill, max rel difference " << worst);
    CHECK(worst < 1e-6);

    // Rewind and replay: the same logits again.
    REQUIRE(s->rewind(7).isOk());
    REQUIRE(s->decode(tokens[7]).isOk());
    CHECK(maxRel(s->logits(), std::span<const float>(all).subspan(7 * nv, nv)) < 1e-6);
  }
}

TEST_CASE("forwardLast: forward's last row, bit for bit, left in the session's memory until its next call") {
  for (const auto& [name, spec] : variants()) {
    CAPTURE(name);
    const Built b = build(spec, name);
    auto file = ArtifactFile::open(b.path);
    REQUIRE_MESSAGE(file.isOk(), file.status().message());
    auto backend = createCpuBackend(**file);
    REQUIRE_MESSAGE(backend.isOk(), backend.status().message());
    auto copied = (*backend)->createSession({.n_ctx = 16, .n_threads = 2});
    auto kept = (*backend)->createSession({.n_ctx = 16, .n_threads = 2});
    REQUIRE(copied.isOk());
    REQUIRE(kept.isOk());
    const size_t nv = b.model.n_vocab;
    const std::vector<int32_t> tokens = randomTokens(7, static_cast<uint32_t>(nv), 13);
    REQUIRE((*kept)->maxBatch() >= 3);
    // A prefill of 3 tokens (the last row of a batch), then 4 decode steps.
    std::vector<float> want(nv), before(nv);
    const std::pair<int, int> calls[] = {{0, 3}, {3, 1}, {4, 1}, {5, 1}, {6, 1}};  // (position, tokens)
    for (const auto& [pos, count] : calls) {
      CAPTURE(pos);
      const std::span<const int32_t> chunk = std::span(tokens).subspan(pos, count);
      REQUIRE((*copied)->forward(chunk, pos, want.data(), false).isOk());
      Result<std::span<const float>> row = (*kept)->forwardLast(chunk, pos);
      REQUIRE_MESSAGE(row.isOk(), row.status().message());
      REQUIRE(row->size() == nv);
      CHECK(std::memcmp(row->data(), want.data(), nv * sizeof(float)) == 0);
      if (pos > 0) CHECK(std::memcmp(before.data(), want.data(), nv * sizeof(float)) != 0);  // a new row each step
      before = want;
    }
    // Errors are forward's: past the context, nothing evaluated.
    const int32_t t = tokens[0];
    CHECK(!(*kept)->forwardLast({&t, 1}, 16).isOk());
  }
}

TEST_CASE("thread count and batch size do not change a bit of the logits") {
  const auto [name, spec] = variants()[0];
  const Built b = build(spec, name);
  auto model = open(b.path);
  const std::vector<int32_t> tokens = randomTokens(9, b.model.n_vocab, 11);
  std::vector<float> a(tokens.size() * b.model.n_vocab), c(a.size());
  REQUIRE(session(*model, 9, 1)->prefill(tokens, a).isOk());
  REQUIRE(session(*model, 9, 4)->prefill(tokens, c).isOk());
  CHECK(std::memcmp(a.data(), c.data(), a.size() * 4) == 0);
  // Same model with max batch 16 (one batch instead of three).
  TinySpec big = spec;
  big.max_batch = 16;
  const Built b16 = build(big, "llama-mix-b16");
  auto model16 = open(b16.path);
  CHECK(model16->info().max_batch == 16);
  REQUIRE(session(*model16, 9)->prefill(tokens, c).isOk());
  CHECK(maxRel(c, a) < 1e-6);
}

TEST_CASE("generate: greedy tokens follow the argmax chain; stops at n, callback, EOS, full context") {
  const auto [name, spec] = variants()[0];
  const Built b = build(spec, name);
  auto model = open(b.path);
  REQUIRE(model->hasTokenizer());
  const std::string prompt = "the cat sat on the mat";
  Result<std::vector<int32_t>> ids = model->tokenize(prompt);
  REQUIRE(ids.isOk());
  CHECK((*ids)[0] == 1);  // BOS

  // Manual argmax chain.
  std::vector<int32_t> expected;
  {
    auto s = session(*model, 64);
    REQUIRE(s->prefill(*ids).isOk());
    for (int i = 0; i < 12; ++i) {
      const auto l = s->logits();
      const int32_t next = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
      expected.push_back(next);
      REQUIRE(s->decode(next).isOk());
    }
  }
  GenerateParams gp;
  gp.sampling.temperature = 0;
  gp.n_predict = 12;
  gp.stop_at_eog = false;
  int logit_rows = 0;
  gp.on_logits = [&](std::span<const float> rows, int n) {
    CHECK(rows.size() == size_t(n) * b.model.n_vocab);
    logit_rows += n;
  };
  std::string text;
  auto s = session(*model, 64);
  Result<GenerateResult> r = s->generate(prompt, gp, [&](std::string_view piece, int32_t) {
    text += piece;
    return true;
  });
  REQUIRE_MESSAGE(r.isOk(), r.status().message());
  CHECK(r->tokens == expected);
  CHECK(r->n_prompt == int(ids->size()));
  CHECK(r->stop == StopReason::kMaxTokens);
  CHECK(logit_rows == int(ids->size()) + 11);
  std::string pieces;
  for (int32_t id : expected) pieces += model->tokenizer().tokenToPiece(id);
  Detokenizer d(model->tokenizer());
  std::string streamed;
  for (int32_t id : expected) streamed += d.push(id);
  streamed += d.flush();
  CHECK(text == streamed);

  // The callback stops it.
  {
    auto s2 = session(*model, 64);
    int calls = 0;
    Result<GenerateResult> r2 = s2->generate(prompt, gp, [&](std::string_view, int32_t tok) { return tok < 0 || ++calls < 3; });
    REQUIRE(r2.isOk());
    CHECK(r2->stop == StopReason::kCallback);
    CHECK(r2->n_generated == 3);
  }
  // logits() inside the callback: the row the token was sampled from (host sampling: the CPU backend has no
  // device sampling, so device_sampling = true changes nothing; on a device-sampled step it would be empty).
  {
    GenerateParams g = gp;
    g.on_logits = nullptr;
    g.device_sampling = true;
    auto sc = session(*model, 64);
    int rows = 0;
    Result<GenerateResult> rc = sc->generate(prompt, g, [&](std::string_view, int32_t tok) {
      if (tok < 0) return true;
      const std::span<const float> l = sc->logits();
      REQUIRE(l.size() == size_t(b.model.n_vocab));
      CHECK(std::max_element(l.begin(), l.end()) - l.begin() == tok);
      ++rows;
      return true;
    });
    REQUIRE(rc.isOk());
    CHECK(rows == 12);
    CHECK(sc->logits().size() == size_t(b.model.n_vocab));
  }
  // A full context stops it: prompt of P tokens + room for 4 more.
  {
    auto s3 = session(*model, int(ids->size()) + 4);
    Result<GenerateResult> r3 = s3->generate(prompt, gp, [](std::string_view, int32_t) { return true; });
    REQUIRE(r3.isOk());
    CHECK(r3->stop == StopReason::kContextFull);
    CHECK(r3->n_generated == 5);  // 4 decoded + the last one sampled from the full context
    CHECK(std::vector<int32_t>(expected.begin(), expected.begin() + 5) == r3->tokens);
  }
  // End of generation: the same weights with eos_id = the 4th greedy token (first occurrence).
  {
    TinySpec eos = spec;
    eos.eos_id = expected[3];
    const size_t first = std::find(expected.begin(), expected.end(), expected[3]) - expected.begin();
    const Built be = build(eos, "llama-mix-eos");
    auto me = open(be.path);
    auto s4 = session(*me, 64);
    GenerateParams g4 = gp;
    g4.stop_at_eog = true;
    Result<GenerateResult> r4 = s4->generate(prompt, g4, [](std::string_view, int32_t) { return true; });
    REQUIRE(r4.isOk());
    CHECK(r4->stop == StopReason::kEndOfGeneration);
    CHECK(r4->n_generated == int(first));
  }
  // Sampling with a seed is reproducible.
  {
    GenerateParams g5 = gp;
    g5.sampling = SamplerParams{};
    g5.sampling.temperature = 1.0f;
    g5.sampling.seed = 99;
    Result<GenerateResult> a = session(*model, 64)->generate(prompt, g5, [](std::string_view, int32_t) { return true; });
    Result<GenerateResult> c = session(*model, 64)->generate(prompt, g5, [](std::string_view, int32_t) { return true; });
    REQUIRE(a.isOk());
    REQUIRE(c.isOk());
    CHECK(a->tokens == c->tokens);
  }
}

TEST_CASE("session and model errors say what and which numbers") {
  const auto [name, spec] = variants()[0];
  const Built b = build(spec, name);
  auto model = open(b.path);
  const int nv = int(b.model.n_vocab);
  auto s = session(*model, 8);
  const std::vector<int32_t> nine = randomTokens(9, nv, 1);
  Status st = s->prefill(nine);
  REQUIRE_FALSE(st.isOk());
  CHECK(st.message().find("> n_ctx 8") != std::string::npos);
  CHECK(s->position() == 0);
  st = s->prefill(std::vector<int32_t>{1, nv});
  REQUIRE_FALSE(st.isOk());
  CHECK(st.message().find(std::to_string(nv)) != std::string::npos);
  CHECK_FALSE(s->prefill(std::vector<int32_t>{}).isOk());
  CHECK_FALSE(s->decode(-1).isOk());
  std::vector<float> small(10);
  CHECK_FALSE(s->prefill(std::vector<int32_t>{1, 2}, small).isOk());
  CHECK(s->logits().empty());
  CHECK_FALSE(s->rewind(1).isOk());
  for (int ctx : {0, -5, Model::kMaxContext + 1}) {
    Result<std::unique_ptr<Session>> bad = model->createSession({.n_ctx = ctx});
    REQUIRE_FALSE(bad.isOk());
    CHECK(bad.status().message().find(std::to_string(ctx)) != std::string::npos);
  }
  // A context longer than n_ctx_train (128 here) is allowed, like llama.cpp.
  CHECK(model->createSession({.n_ctx = 300, .n_threads = 1}).isOk());

  GenerateParams gp;
  gp.n_predict = 2;
  auto s2 = session(*model, 4);
  Result<GenerateResult> r = s2->generate("the cat sat on the mat and the dog ran", gp, [](std::string_view, int32_t) { return true; });
  REQUIRE_FALSE(r.isOk());
  CHECK(r.status().message().find("does not fit the context") != std::string::npos);

  Result<std::unique_ptr<Model>> cuda = Model::open(b.path, BackendKind::kCuda);
  REQUIRE_FALSE(cuda.isOk());
  // --device cuda fails clearly: a build without the CUDA backend, a machine without a driver, or (on a
  // GPU machine) this hand-built artifact's lack of kernel images.
  const std::string cuda_msg = cuda.status().message();
  CHECK_MESSAGE((cuda_msg.find("CUDA backend not available in this build") != std::string::npos ||
                 cuda_msg.find("libcuda.so.1") != std::string::npos ||
                 cuda_msg.find("no kernel images") != std::string::npos),
                cuda_msg);
  Result<std::unique_ptr<Model>> autom = Model::open(b.path, BackendKind::kAuto);
  REQUIRE(autom.isOk());
  CHECK(std::string((*autom)->backendName()) == "cpu");
  CHECK((*autom)->backendNote().find("cpu") != std::string::npos);
  CHECK(parseBackendKind("cuda").isOk());
  CHECK_FALSE(parseBackendKind("gpu").isOk());
}

TEST_CASE("plans the CPU cannot run are rejected at open, naming the step and the numbers") {
  struct Case {
    TinySpec::Defect defect;
    std::vector<std::string> words;
  };
  const Case cases[] = {
      {TinySpec::Defect::kMatMulRows, {"prefill step", "blk.1.attn_q", "rows = 288"}},
      {TinySpec::Defect::kBufferWidth, {"blk.0.ffn_up", "'up' has width 513", "expected 512"}},
      {TinySpec::Defect::kNoScalePlane, {"blk.0.attn_k.weight", "scale"}},
      // Arity is the verifier's (op_traits.h), before any backend sees the plan.
      {TinySpec::Defect::kOpKind, {"prefill.steps[1]", "SwiGlu step has 1 inputs", "expected 2..2 inputs"}},
  };
  for (const Case& c : cases) {
    TinySpec spec = variants()[0].second;
    spec.defect = c.defect;
    CAPTURE(static_cast<int>(c.defect));
    const Built b = build(spec, "defect");
    Result<std::unique_ptr<Model>> m = Model::open(b.path, BackendKind::kCpu);
    REQUIRE_FALSE(m.isOk());
    MESSAGE(m.status().message());
    for (const std::string& w : c.words) CHECK(m.status().message().find(w) != std::string::npos);
  }
}

}  // namespace
}  // namespace minfer
