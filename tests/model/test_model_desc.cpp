// Architecture mapping: hyperparameters, tokenizer and plans from the fixture GGUFs and small
// writer-made GGUFs (qwen3, tied embeddings, error cases).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "compiler/gguf/gguf_writer.h"
#include "compiler/model/model_desc.h"
#include "compiler/tools/synth_model.h"
#include "kernels/rope.cuh"
#include "llvm/Support/MemoryBuffer.h"
#include "tests/test_support.h"

using namespace minfer;

namespace {

model::ModelDescription describe(const std::string& name, uint32_t max_batch = 512) {
  auto file = gguf::GgufFile::open(test::fixturesDir() + "/models/" + name);
  REQUIRE_MESSAGE(bool(file), llvm::toString(file.takeError()));
  static std::vector<std::unique_ptr<gguf::GgufFile>> keep;  // descriptions point into the mapping
  keep.push_back(std::move(*file));
  auto desc = model::describeModel(*keep.back(), max_batch);
  REQUIRE_MESSAGE(bool(desc), llvm::toString(desc.takeError()));
  return std::move(*desc);
}

int countOps(const std::vector<model::StepDesc>& steps, fb::OpKind op) {
  int n = 0;
  for (const auto& s : steps) n += s.op == op;
  return n;
}

// A small GGUF with zero F32 weights and no tokenizer, named after llama.cpp's tensors. Biases follow
// `bias`, per-head q/k norms follow `qk_norm`; `skip` drops tensors, `extra` adds [n] F32 vectors.
struct TinySpec {
  std::string arch = "llama";
  uint32_t n_embd = 32, n_layer = 2, n_head = 4, n_head_kv = 2, n_ff = 48, n_vocab = 40;
  uint32_t key_length = 0;    // 0: no attention.key_length key (head_dim = n_embd / n_head)
  uint32_t n_rot = 0;         // 0: no rope.dimension_count key
  float rope_scale = 0;       // > 0: rope.scaling.type linear with this factor
  std::string scaling_type;   // non-empty: rope.scaling.type
  float scaling_factor = NAN, scale_linear = NAN;  // not NaN: rope.scaling.factor / rope.scale_linear
  float attn_factor = NAN;    // not NaN: rope.scaling.attn_factor
  int64_t orig_ctx = -1;      // ≥ 0: rope.scaling.original_context_length (no context_length key: 2048)
  bool tied = false, bias = false, qk_norm = false;
  bool fused = false;         // phi3: attn_qkv [n_embd, q + 2 kv] and ffn_up [n_embd, 2 n_ff], no attn_q/k/v, ffn_gate
  std::set<std::string> skip;
  std::vector<std::pair<std::string, uint64_t>> extra;
  std::vector<std::pair<std::string, std::vector<float>>> extra_values;  // F32 vectors with these values
  bool validate = true;       // false: the writer also writes what GGUF writers refuse (a dim of 0)
  std::vector<std::pair<std::string, uint32_t>> u32_keys;  // <arch>.<key> = value, written as u32
  std::vector<std::pair<std::string, float>> f32_keys;     // <arch>.<key> = value, written as f32
  // > 0: a mixture-of-experts FFN (ffn_gate_inp + ffn_{gate,up,down}_exps) instead of the dense one, and
  // <arch>.expert_count / expert_used_count; n_ff_exp > 0 also writes expert_feed_forward_length.
  uint32_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
};

gguf::GgufWriter makeWriter(const TinySpec& s) {
  gguf::GgufWriter w(3);
  const std::string a = s.arch + ".";
  w.setString("general.architecture", s.arch);
  w.setU32(a + "embedding_length", s.n_embd);
  w.setU32(a + "block_count", s.n_layer);
  w.setU32(a + "feed_forward_length", s.n_ff);
  w.setU32(a + "attention.head_count", s.n_head);
  w.setU32(a + "attention.head_count_kv", s.n_head_kv);
  if (s.key_length) w.setU32(a + "attention.key_length", s.key_length);
  if (s.n_rot) w.setU32(a + "rope.dimension_count", s.n_rot);
  w.setF32(a + "rope.freq_base", 1e6f);
  w.setF32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  if (s.rope_scale > 0) {
    w.setString(a + "rope.scaling.type", "linear");
    w.setF32(a + "rope.scaling.factor", s.rope_scale);
  }
  if (!s.scaling_type.empty()) w.setString(a + "rope.scaling.type", s.scaling_type);
  if (!std::isnan(s.scaling_factor)) w.setF32(a + "rope.scaling.factor", s.scaling_factor);
  if (!std::isnan(s.scale_linear)) w.setF32(a + "rope.scale_linear", s.scale_linear);
  if (!std::isnan(s.attn_factor)) w.setF32(a + "rope.scaling.attn_factor", s.attn_factor);
  if (s.orig_ctx >= 0) w.setU32(a + "rope.scaling.original_context_length", static_cast<uint32_t>(s.orig_ctx));
  for (const auto& [key, v] : s.u32_keys) w.setU32(a + key, v);
  if (s.n_expert) {
    w.setU32(a + "expert_count", s.n_expert);
    w.setU32(a + "expert_used_count", s.n_expert_used);
    if (s.n_ff_exp) w.setU32(a + "expert_feed_forward_length", s.n_ff_exp);
  }
  for (const auto& [key, v] : s.f32_keys) w.setF32(a + key, v);
  auto add = [&](const std::string& name, std::vector<uint64_t> ne) {
    uint64_t n = 1;
    for (uint64_t d : ne) n *= d;
    w.addTensor(name, GgmlType::F32, std::move(ne), std::vector<uint8_t>(n * 4, 0));
  };
  auto tensor = [&](const std::string& name, std::vector<uint64_t> ne) {
    if (!s.skip.count(name)) add(name, std::move(ne));
  };
  const uint32_t head_dim = s.key_length ? s.key_length : s.n_embd / s.n_head;
  const uint64_t qw = uint64_t{s.n_head} * head_dim, kvw = uint64_t{s.n_head_kv} * head_dim;
  tensor("token_embd.weight", {s.n_embd, s.n_vocab});
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    tensor(b + "attn_norm.weight", {s.n_embd});
    if (s.fused) {
      tensor(b + "attn_qkv.weight", {s.n_embd, qw + 2 * kvw});
    } else {
      tensor(b + "attn_q.weight", {s.n_embd, qw});
      tensor(b + "attn_k.weight", {s.n_embd, kvw});
      tensor(b + "attn_v.weight", {s.n_embd, kvw});
    }
    if (s.bias) {
      tensor(b + "attn_q.bias", {qw});
      tensor(b + "attn_k.bias", {kvw});
      tensor(b + "attn_v.bias", {kvw});
    }
    if (s.qk_norm) {
      tensor(b + "attn_q_norm.weight", {head_dim});
      tensor(b + "attn_k_norm.weight", {head_dim});
    }
    tensor(b + "attn_output.weight", {qw, s.n_embd});
    tensor(b + "ffn_norm.weight", {s.n_embd});
    if (s.n_expert) {
      const uint64_t ff = s.n_ff_exp ? s.n_ff_exp : s.n_ff / s.n_expert_used;
      tensor(b + "ffn_gate_inp.weight", {s.n_embd, s.n_expert});
      tensor(b + "ffn_gate_exps.weight", {s.n_embd, ff, s.n_expert});
      tensor(b + "ffn_up_exps.weight", {s.n_embd, ff, s.n_expert});
      tensor(b + "ffn_down_exps.weight", {ff, s.n_embd, s.n_expert});
      continue;
    }
    if (!s.fused) tensor(b + "ffn_gate.weight", {s.n_embd, s.n_ff});
    tensor(b + "ffn_up.weight", {s.n_embd, s.fused ? 2 * uint64_t{s.n_ff} : s.n_ff});
    tensor(b + "ffn_down.weight", {s.n_ff, s.n_embd});
  }
  tensor("output_norm.weight", {s.n_embd});
  if (!s.tied) tensor("output.weight", {s.n_embd, s.n_vocab});
  for (const auto& [name, n] : s.extra) add(name, {n});
  for (const auto& [name, v] : s.extra_values) {
    std::vector<uint8_t> bytes(v.size() * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    w.addTensor(name, GgmlType::F32, {v.size()}, std::move(bytes));
  }
  return w;
}

std::unique_ptr<gguf::GgufFile> makeGguf(const TinySpec& s) {
  gguf::GgufWriter writer = makeWriter(s);
  writer.setValidate(s.validate);
  auto bytes = writer.toBytes();
  REQUIRE_MESSAGE(bool(bytes), llvm::toString(bytes.takeError()));
  auto buffer = llvm::MemoryBuffer::getMemBufferCopy(
      llvm::StringRef(reinterpret_cast<const char*>(bytes->data()), bytes->size()), "tiny-" + s.arch + ".gguf");
  auto file = gguf::GgufFile::parse(std::move(buffer), "tiny-" + s.arch + ".gguf");
  REQUIRE_MESSAGE(bool(file), llvm::toString(file.takeError()));
  return std::move(*file);
}

// describeModel on a TinySpec GGUF; the file is kept alive for the description's TensorInfo pointers.
llvm::Expected<model::ModelDescription> describeTiny(const TinySpec& s, uint32_t max_batch = 16, uint32_t n_ctx = 0) {
  static std::vector<std::unique_ptr<gguf::GgufFile>> keep;
  keep.push_back(makeGguf(s));
  return model::describeModel(*keep.back(), max_batch, n_ctx);
}

std::string describeTinyError(const TinySpec& s) {
  auto desc = describeTiny(s);
  REQUIRE(!desc);
  return llvm::toString(desc.takeError());
}

}  // namespace

TEST_CASE("stories260K: config, tokenizer and the llama plan") {
  if (!test::haveFixtures()) return;
  const auto d = describe("stories260K.gguf", 64);
  const auto& c = d.config;
  CHECK(c.architecture == "llama");
  CHECK(c.n_embd == 64);
  CHECK(c.n_layer == 5);
  CHECK(c.n_head == 8);
  CHECK(c.n_head_kv == 4);
  CHECK(c.head_dim == 8);
  CHECK(c.n_ff == 172);
  CHECK(c.n_vocab == 512);
  CHECK(c.n_rot == 8);
  CHECK(c.rope_style == fb::RopeStyle::Norm);
  CHECK(!c.tied_embeddings);
  CHECK(d.tokenizer.present);
  CHECK(d.tokenizer.model == fb::TokenizerModel::Spm);
  CHECK(d.tokenizer.bos_id == 1);
  CHECK(d.tokenizer.eos_id == 2);
  CHECK(d.tokenizer.add_bos);
  CHECK(d.tokenizer.tokens.size() == 512);
  const auto& steps = d.plan.prefill;
  CHECK(countOps(steps, fb::OpKind::Embed) == 1);
  CHECK(countOps(steps, fb::OpKind::Attention) == 5);
  CHECK(countOps(steps, fb::OpKind::MatMul) == 5 * 7 + 1);
  CHECK(countOps(steps, fb::OpKind::RmsNorm) == 5 * 2 + 1);
  CHECK(countOps(steps, fb::OpKind::HeadRmsNorm) == 0);
  // llama has no q/k/v biases: every matmul has one weight.
  for (const auto& s : steps)
    if (s.op == fb::OpKind::MatMul) CHECK_MESSAGE(s.weights.size() == 1, s.name);
  for (const auto& s : steps)
    if (s.op == fb::OpKind::Rope) CHECK(s.rope_style == fb::RopeStyle::Norm);
  CHECK(d.plan.max_batch == 64);
  CHECK(d.plan.buffers[d.plan.logits].width == 512);
  CHECK(d.plan.kv_bytes_per_token == 2u * 2u * 5u * 4u * 8u);
  // Every GGUF tensor is used exactly once.
  CHECK(d.weights.size() == 48);
  // Attention layers are numbered in order and the final step projects to the logits.
  int layer = 0;
  for (const auto& s : steps)
    if (s.op == fb::OpKind::Attention) CHECK(s.layer == layer++);
  CHECK(steps.back().outputs[0] == d.plan.logits);
  CHECK(steps.back().rows == 512);
  CHECK(steps.back().cols == 64);
}

TEST_CASE("tiny-qwen2: neox RoPE, q/k/v biases, base 1e6") {
  if (!test::haveFixtures()) return;
  const auto d = describe("tiny-qwen2-Q4_K_M.gguf");
  CHECK(d.config.architecture == "qwen2");
  CHECK(d.config.rope_style == fb::RopeStyle::Neox);
  CHECK(d.config.rope_freq_base == doctest::Approx(1e6));
  CHECK(d.config.rms_norm_eps == doctest::Approx(1e-6));
  int with_bias = 0;
  for (const auto& s : d.plan.prefill)
    if (s.op == fb::OpKind::MatMul && s.weights.size() == 2) ++with_bias;
  CHECK(with_bias == 2 * 3);
  // The biases ride on attn_q/k/v (second weight), nowhere else.
  for (const auto& s : d.plan.prefill) {
    if (s.op != fb::OpKind::MatMul) continue;
    const bool qkv = s.name.find(".attn_q") != std::string::npos || s.name.find(".attn_k") != std::string::npos ||
                     s.name.find(".attn_v") != std::string::npos;
    REQUIRE_MESSAGE(s.weights.size() == (qkv ? 2u : 1u), s.name);
    if (qkv) CHECK(d.weights[s.weights[1]].name == s.name + ".bias");
  }
  const auto& q0 = d.plan.prefill[2];
  CHECK(q0.name == "blk.0.attn_q");
  CHECK(q0.weights.size() == 2);
  CHECK(countOps(d.plan.prefill, fb::OpKind::HeadRmsNorm) == 0);
  for (const auto& s : d.plan.prefill)
    if (s.op == fb::OpKind::Rope) CHECK(s.rope_style == fb::RopeStyle::Neox);
  CHECK(d.config.head_dim == 64);
  CHECK(d.config.n_head_kv == 2);
}

TEST_CASE("gemma2: post-norms, GeGLU, soft-caps, every other layer local; llama.cpp's defaults for absent keys") {
  TinySpec s;
  s.arch = "gemma2", s.tied = true, s.n_layer = 3, s.key_length = 16;  // head_dim 16 ≠ n_embd / n_head = 8
  for (uint32_t l = 0; l < s.n_layer; ++l)
    for (const char* n : {"post_attention_norm.weight", "post_ffw_norm.weight"})
      s.extra.push_back({"blk." + std::to_string(l) + "." + n, s.n_embd});
  auto d = describeTiny(s);
  REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
  CHECK(d->config.rope_style == fb::RopeStyle::Neox);
  const auto& steps = d->plan.prefill;
  REQUIRE(steps.size() >= 2);
  CHECK(steps[1].op == fb::OpKind::Scale);  // x · sqrt(n_embd)
  CHECK(steps[1].scale == doctest::Approx(std::sqrt(32.0)));
  CHECK(steps[1].softcap == 0);
  CHECK(steps[1].inputs == steps[1].outputs);
  const std::vector<std::pair<fb::OpKind, std::string>> layer0 = {
      {fb::OpKind::RmsNorm, "blk.0.attn_norm"},           {fb::OpKind::MatMul, "blk.0.attn_q"},
      {fb::OpKind::MatMul, "blk.0.attn_k"},               {fb::OpKind::MatMul, "blk.0.attn_v"},
      {fb::OpKind::Rope, "blk.0.rope"},                   {fb::OpKind::Attention, "blk.0.attention"},
      {fb::OpKind::MatMul, "blk.0.attn_output"},          {fb::OpKind::RmsNorm, "blk.0.post_attention_norm"},
      {fb::OpKind::Add, "blk.0.attn_residual"},           {fb::OpKind::RmsNorm, "blk.0.ffn_norm"},
      {fb::OpKind::MatMul, "blk.0.ffn_gate"},             {fb::OpKind::MatMul, "blk.0.ffn_up"},
      {fb::OpKind::GeGlu, "blk.0.geglu"},                 {fb::OpKind::MatMul, "blk.0.ffn_down"},
      {fb::OpKind::RmsNorm, "blk.0.post_ffw_norm"},       {fb::OpKind::Add, "blk.0.ffn_residual"}};
  REQUIRE(steps.size() == 2 + 3 * layer0.size() + 3);
  for (size_t i = 0; i < layer0.size(); ++i) {
    CHECK(steps[2 + i].op == layer0[i].first);
    CHECK(steps[2 + i].name == layer0[i].second);
  }
  // Absent keys: window 4096, attention cap 50, final cap 30 (llama.cpp's hparams defaults); local
  // layers 0 and 2 (period 2); query scale 1/sqrt(head_dim).
  std::vector<uint32_t> windows;
  for (const auto& st : steps)
    if (st.op == fb::OpKind::Attention) {
      windows.push_back(st.window);
      CHECK(st.softcap == 50.0f);
      CHECK(st.scale == doctest::Approx(0.25));
    }
  CHECK(windows == std::vector<uint32_t>{4096, 0, 4096});
  CHECK(steps.back().op == fb::OpKind::Scale);
  CHECK(steps.back().name == "output.softcap");
  CHECK(steps.back().softcap == 30.0f);
  CHECK(steps.back().scale == 1.0f);
  CHECK(steps.back().outputs == std::vector<uint32_t>{d->plan.logits});
  // The 46-layer 27B: 1/sqrt(n_embd / n_head) (llama.cpp picks it by model type).
  s.n_layer = 46;
  s.extra.clear();
  for (uint32_t l = 0; l < s.n_layer; ++l)
    for (const char* n : {"post_attention_norm.weight", "post_ffw_norm.weight"})
      s.extra.push_back({"blk." + std::to_string(l) + "." + n, s.n_embd});
  auto d46 = describeTiny(s);
  REQUIRE_MESSAGE(bool(d46), llvm::toString(d46.takeError()));
  for (const auto& st : d46->plan.prefill)
    if (st.op == fb::OpKind::Attention) CHECK(st.scale == doctest::Approx(1 / std::sqrt(8.0)));
  // A missing post-norm is refused by name.
  s.n_layer = 3;
  s.extra.resize(5);
  auto missing = describeTiny(s);
  REQUIRE(!missing);
  CHECK(llvm::toString(missing.takeError()).find("blk.2.post_ffw_norm.weight") != std::string::npos);
}

TEST_CASE("gemma2 fixture: window, caps and query scale from its keys; the memory plan's ring share") {
  if (!test::haveFixtures()) return;
  auto file = gguf::GgufFile::open(test::fixturesDir() + "/arch/models/tiny-gemma2-F32.gguf");
  REQUIRE_MESSAGE(bool(file), llvm::toString(file.takeError()));
  auto d = model::describeModel(**file, 64);
  REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
  std::vector<uint32_t> windows;
  for (const auto& st : d->plan.prefill)
    if (st.op == fb::OpKind::Attention) {
      windows.push_back(st.window);
      CHECK(st.softcap == 5.0f);
      CHECK(st.scale == 0.125f);
    }
  CHECK(windows == std::vector<uint32_t>{16, 0});
  CHECK(d->plan.prefill.back().softcap == 15.0f);
  CHECK(d->config.rope_freq_base == 10000.0f);
  // KV cache: 2 layers x f16 K and V x 1 kv head of 64 = 256 bytes per position each. Without rings
  // (--swa-full) no ring share; with them, layer 0 holds a ring of window + max_batch - 1 = 79 positions.
  CHECK(d->plan.kv_bytes_per_token == 512);
  CHECK(d->plan.kv_ring_bytes_per_token == 0);
  CHECK(d->plan.kv_ring_bytes == 0);
  model::ringLocalKvCaches(d->plan);
  CHECK(d->plan.kv_bytes_per_token == 512);  // a batch session still holds every position
  CHECK(d->plan.kv_ring_bytes_per_token == 256);
  CHECK(d->plan.kv_ring_bytes == 256 * (16 + 64 - 1));
}

namespace {

// A gemma3 TinySpec: gemma2's post-norms plus per-head q/k norms, head_dim 16 ≠ n_embd / n_head = 8.
TinySpec gemma3Spec(uint32_t n_layer) {
  TinySpec s;
  s.arch = "gemma3", s.tied = true, s.qk_norm = true, s.n_layer = n_layer, s.key_length = 16;
  for (uint32_t l = 0; l < s.n_layer; ++l)
    for (const char* n : {"post_attention_norm.weight", "post_ffw_norm.weight"})
      s.extra.push_back({"blk." + std::to_string(l) + "." + n, s.n_embd});
  return s;
}

// Per layer: the attention window and the RoPE base and scale of a gemma3 plan.
struct Gemma3Layers {
  std::vector<uint32_t> windows;
  std::vector<float> bases, scales;
};
Gemma3Layers gemma3Layers(const model::ModelDescription& d) {
  Gemma3Layers r;
  for (const auto& st : d.plan.prefill) {
    if (st.op == fb::OpKind::Attention) {
      r.windows.push_back(st.window);
      CHECK(st.softcap == 0);  // gemma3 has no attention soft-cap
    }
    if (st.op == fb::OpKind::Rope) r.bases.push_back(st.rope_freq_base), r.scales.push_back(st.rope_freq_scale);
  }
  return r;
}

}  // namespace

TEST_CASE("gemma3: q/k head norms, post-norms, GeGLU, no soft-caps; llama.cpp's defaults for absent keys") {
  // sliding_window present, pattern and freq_base_swa absent: period 6 (layers 0-4 local, 5 global,
  // 6 local), local RoPE base 10000 and scale 1; rope.scaling (x8 linear) only on the global layer.
  TinySpec s = gemma3Spec(7);
  s.rope_scale = 8;
  s.u32_keys = {{"attention.sliding_window", 32}};
  auto d = describeTiny(s);
  REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
  CHECK(d->config.rope_style == fb::RopeStyle::Neox);
  const auto& steps = d->plan.prefill;
  REQUIRE(steps.size() >= 2);
  CHECK(steps[1].op == fb::OpKind::Scale);  // x · sqrt(n_embd)
  CHECK(steps[1].scale == doctest::Approx(std::sqrt(32.0)));
  const std::vector<std::pair<fb::OpKind, std::string>> layer0 = {
      {fb::OpKind::RmsNorm, "blk.0.attn_norm"},           {fb::OpKind::MatMul, "blk.0.attn_q"},
      {fb::OpKind::MatMul, "blk.0.attn_k"},               {fb::OpKind::MatMul, "blk.0.attn_v"},
      {fb::OpKind::HeadRmsNorm, "blk.0.attn_q_norm"},     {fb::OpKind::HeadRmsNorm, "blk.0.attn_k_norm"},
      {fb::OpKind::Rope, "blk.0.rope"},                   {fb::OpKind::Attention, "blk.0.attention"},
      {fb::OpKind::MatMul, "blk.0.attn_output"},          {fb::OpKind::RmsNorm, "blk.0.post_attention_norm"},
      {fb::OpKind::Add, "blk.0.attn_residual"},           {fb::OpKind::RmsNorm, "blk.0.ffn_norm"},
      {fb::OpKind::MatMul, "blk.0.ffn_gate"},             {fb::OpKind::MatMul, "blk.0.ffn_up"},
      {fb::OpKind::GeGlu, "blk.0.geglu"},                 {fb::OpKind::MatMul, "blk.0.ffn_down"},
      {fb::OpKind::RmsNorm, "blk.0.post_ffw_norm"},       {fb::OpKind::Add, "blk.0.ffn_residual"}};
  // Embed, scale, the layers, output_norm and the output matmul: no final soft-cap (default 0).
  REQUIRE(steps.size() == 2 + 7 * layer0.size() + 2);
  for (size_t i = 0; i < layer0.size(); ++i) {
    CHECK(steps[2 + i].op == layer0[i].first);
    CHECK(steps[2 + i].name == layer0[i].second);
  }
  CHECK(steps.back().op == fb::OpKind::MatMul);
  for (const auto& st : steps)
    if (st.op == fb::OpKind::Attention) CHECK(st.scale == doctest::Approx(0.25));  // 1/sqrt(head_dim)
  Gemma3Layers l = gemma3Layers(*d);
  CHECK(l.windows == std::vector<uint32_t>{32, 32, 32, 32, 32, 0, 32});
  CHECK(l.bases == std::vector<float>{1e4f, 1e4f, 1e4f, 1e4f, 1e4f, 1e6f, 1e4f});
  CHECK(l.scales == std::vector<float>{1, 1, 1, 1, 1, 0.125f, 1});

  // No sliding_window key: every layer global (llama.cpp's LLAMA_SWA_TYPE_NONE), base and scale the config's.
  s.u32_keys.clear();
  auto none = describeTiny(s);
  REQUIRE_MESSAGE(bool(none), llvm::toString(none.takeError()));
  l = gemma3Layers(*none);
  CHECK(l.windows == std::vector<uint32_t>(7, 0));
  CHECK(l.bases == std::vector<float>(7, 1e6f));
  CHECK(l.scales == std::vector<float>(7, 0.125f));

  // The keys when present: pattern 3 (layers 2 and 5 global), freq_base_swa, final_logit_softcapping.
  s.u32_keys = {{"attention.sliding_window", 16}, {"attention.sliding_window_pattern", 3}};
  s.f32_keys = {{"rope.freq_base_swa", 5e4f}, {"final_logit_softcapping", 30.0f}};
  auto keyed = describeTiny(s);
  REQUIRE_MESSAGE(bool(keyed), llvm::toString(keyed.takeError()));
  l = gemma3Layers(*keyed);
  CHECK(l.windows == std::vector<uint32_t>{16, 16, 0, 16, 16, 0, 16});
  CHECK(l.bases == std::vector<float>{5e4f, 5e4f, 1e6f, 5e4f, 5e4f, 1e6f, 5e4f});
  CHECK(keyed->plan.prefill.back().name == "output.softcap");
  CHECK(keyed->plan.prefill.back().softcap == 30.0f);

  // A missing q/k head norm is refused by name.
  s.skip = {"blk.1.attn_k_norm.weight"};
  auto missing = describeTiny(s);
  REQUIRE(!missing);
  CHECK(llvm::toString(missing.takeError()).find("blk.1.attn_k_norm.weight") != std::string::npos);
}

TEST_CASE("gemma3: the 62-layer 27B's query scale 1/sqrt(n_embd / n_head)") {
  auto d = describeTiny(gemma3Spec(62));
  REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
  for (const auto& st : d->plan.prefill)
    if (st.op == fb::OpKind::Attention) CHECK(st.scale == doctest::Approx(1 / std::sqrt(8.0)));
}

TEST_CASE("gemma3 fixture: pattern 3, window 16, local base 1e4, x8 linear scaling on the global layer only") {
  if (!test::haveFixtures()) return;
  auto file = gguf::GgufFile::open(test::fixturesDir() + "/arch/models/tiny-gemma3-F32.gguf");
  REQUIRE_MESSAGE(bool(file), llvm::toString(file.takeError()));
  auto d = model::describeModel(**file, 64);
  REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
  const Gemma3Layers l = gemma3Layers(*d);
  CHECK(l.windows == std::vector<uint32_t>{16, 16, 0});
  CHECK(l.bases == std::vector<float>{1e4f, 1e4f, 1e6f});
  CHECK(l.scales == std::vector<float>{1, 1, 0.125f});
  for (const auto& st : d->plan.prefill)
    if (st.op == fb::OpKind::Attention) CHECK(st.scale == 0.125f);
  CHECK(d->plan.prefill.back().op == fb::OpKind::MatMul);  // no final soft-cap
  CHECK(countOps(d->plan.prefill, fb::OpKind::HeadRmsNorm) == 6);
}

TEST_CASE("qwen3: per-head q/k RMSNorm between the projections and RoPE") {
  TinySpec s;
  s.arch = "qwen3", s.qk_norm = true, s.tied = true, s.key_length = 16;  // head_dim ≠ n_embd / n_head
  auto d = describeTiny(s);
  REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
  CHECK(d->config.rope_style == fb::RopeStyle::Neox);
  CHECK(d->config.tied_embeddings);
  CHECK(d->config.head_dim == 16);
  const auto& steps = d->plan.prefill;
  CHECK(countOps(steps, fb::OpKind::HeadRmsNorm) == 2 * 2);
  for (const auto& st : steps)
    if (st.op == fb::OpKind::MatMul) CHECK_MESSAGE(st.weights.size() == 1, st.name);  // no biases
  // One layer, step by step: the order the runtime executes.
  const std::vector<std::pair<fb::OpKind, std::string>> layer0 = {
      {fb::OpKind::RmsNorm, "blk.0.attn_norm"},       {fb::OpKind::MatMul, "blk.0.attn_q"},
      {fb::OpKind::MatMul, "blk.0.attn_k"},           {fb::OpKind::MatMul, "blk.0.attn_v"},
      {fb::OpKind::HeadRmsNorm, "blk.0.attn_q_norm"}, {fb::OpKind::HeadRmsNorm, "blk.0.attn_k_norm"},
      {fb::OpKind::Rope, "blk.0.rope"},               {fb::OpKind::Attention, "blk.0.attention"},
      {fb::OpKind::MatMul, "blk.0.attn_output"},      {fb::OpKind::Add, "blk.0.attn_residual"},
      {fb::OpKind::RmsNorm, "blk.0.ffn_norm"},        {fb::OpKind::MatMul, "blk.0.ffn_gate"},
      {fb::OpKind::MatMul, "blk.0.ffn_up"},           {fb::OpKind::SwiGlu, "blk.0.swiglu"},
      {fb::OpKind::MatMul, "blk.0.ffn_down"},         {fb::OpKind::Add, "blk.0.ffn_residual"}};
  REQUIRE(steps.size() == 1 + 2 * layer0.size() + 2);
  CHECK(steps[0].op == fb::OpKind::Embed);
  for (size_t i = 0; i < layer0.size(); ++i) {
    CHECK(steps[1 + i].op == layer0[i].first);
    CHECK(steps[1 + i].name == layer0[i].second);
  }
  const auto& q_norm = steps[5];
  const auto& k_norm = steps[6];
  CHECK(q_norm.n_head == 4);
  CHECK(k_norm.n_head == 2);
  CHECK(q_norm.head_dim == 16);
  CHECK(q_norm.eps == doctest::Approx(1e-6));
  CHECK(q_norm.inputs == q_norm.outputs);
  CHECK(q_norm.inputs == steps[2].outputs);  // normalizes q in place
  CHECK(k_norm.inputs == steps[3].outputs);  // normalizes k in place
  CHECK(d->weights[q_norm.weights[0]].name == "blk.0.attn_q_norm.weight");
  CHECK(d->weights[k_norm.weights[0]].name == "blk.0.attn_k_norm.weight");
  CHECK(steps.back().name == "output (tied to token_embd)");
  CHECK(steps.back().weights == steps[0].weights);
  CHECK(d->weights.size() == 1 + 2 * 11 + 1);
}

TEST_CASE("qwen3moe: qwen3 attention, router MatMul + MoeRoute + MoeFfn with an expert axis on the expert tensors") {
  TinySpec s;
  s.arch = "qwen3moe", s.qk_norm = true, s.key_length = 16;
  s.n_embd = 40, s.n_ff = 96, s.n_expert = 5, s.n_expert_used = 3, s.n_ff_exp = 24;  // 5 experts, top-3, odd widths
  auto d = describeTiny(s);
  REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
  CHECK(d->config.rope_style == fb::RopeStyle::Neox);
  CHECK(d->config.n_expert == 5);
  CHECK(d->config.n_expert_used == 3);
  CHECK(d->config.n_ff_exp == 24);
  const auto& steps = d->plan.prefill;
  const std::vector<std::pair<fb::OpKind, std::string>> layer0 = {
      {fb::OpKind::RmsNorm, "blk.0.attn_norm"},       {fb::OpKind::MatMul, "blk.0.attn_q"},
      {fb::OpKind::MatMul, "blk.0.attn_k"},           {fb::OpKind::MatMul, "blk.0.attn_v"},
      {fb::OpKind::HeadRmsNorm, "blk.0.attn_q_norm"}, {fb::OpKind::HeadRmsNorm, "blk.0.attn_k_norm"},
      {fb::OpKind::Rope, "blk.0.rope"},               {fb::OpKind::Attention, "blk.0.attention"},
      {fb::OpKind::MatMul, "blk.0.attn_output"},      {fb::OpKind::Add, "blk.0.attn_residual"},
      {fb::OpKind::RmsNorm, "blk.0.ffn_norm"},        {fb::OpKind::MatMul, "blk.0.ffn_gate_inp"},
      {fb::OpKind::MoeRoute, "blk.0.moe_route"},      {fb::OpKind::MoeFfn, "blk.0.moe_ffn"},
      {fb::OpKind::Add, "blk.0.ffn_residual"}};
  REQUIRE(steps.size() == 1 + 2 * layer0.size() + 2);
  for (size_t i = 0; i < layer0.size(); ++i) {
    CHECK(steps[1 + i].op == layer0[i].first);
    CHECK(steps[1 + i].name == layer0[i].second);
  }
  const auto& buffers = d->plan.buffers;
  const auto& router = steps[12];
  const auto& route = steps[13];
  const auto& ffn = steps[14];
  const auto& residual = steps[15];
  CHECK(router.rows == 5);
  CHECK(router.cols == 40);
  CHECK(d->weights[router.weights[0]].experts == 1);
  CHECK(route.inputs == router.outputs);
  REQUIRE(route.outputs.size() == 2);
  CHECK(buffers[route.outputs[0]].type == fb::BufferType::I32);
  CHECK(buffers[route.outputs[0]].width == 3);
  CHECK(buffers[route.outputs[1]].type == fb::BufferType::F32);
  CHECK(buffers[route.outputs[1]].width == 3);
  CHECK(route.n_expert == 5);
  CHECK(route.n_expert_used == 3);
  CHECK(route.moe_norm);  // llama.cpp's qwen3moe renormalises the chosen weights
  CHECK(ffn.inputs == std::vector<uint32_t>{steps[11].outputs[0], route.outputs[0], route.outputs[1]});
  CHECK(ffn.rows == 24);
  CHECK(ffn.cols == 40);
  CHECK(ffn.n_expert == 5);
  CHECK(ffn.n_expert_used == 3);
  REQUIRE(ffn.weights.size() == 3);
  const char* names[3] = {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"};
  for (int i = 0; i < 3; ++i) {
    const model::WeightDesc& w = d->weights[ffn.weights[i]];
    CHECK(w.name == names[i]);
    CHECK(w.experts == 5);
    CHECK(w.info->rows() == 5 * (i < 2 ? 24u : 40u));
  }
  CHECK(buffers[ffn.outputs[0]].width == 40);
  CHECK(residual.inputs == std::vector<uint32_t>{steps[0].outputs[0], ffn.outputs[0]});
  // expert_feed_forward_length absent: llama.cpp's n_ff / n_expert_used.
  s.n_ff_exp = 0;
  auto d2 = describeTiny(s);
  REQUIRE_MESSAGE(bool(d2), llvm::toString(d2.takeError()));
  CHECK(d2->plan.prefill[14].rows == 96 / 3);
  // Inconsistent expert keys and missing expert tensors are refused.
  TinySpec bad = s;
  bad.n_expert_used = 6;
  CHECK(describeTinyError(bad).find("inconsistent experts: qwen3moe.expert_count = 5, expert_used_count = 6") !=
        std::string::npos);
  TinySpec missing = s;
  missing.skip = {"blk.1.ffn_up_exps.weight"};
  CHECK(describeTinyError(missing) ==
        "tiny-qwen3moe.gguf: tensor 'blk.1.ffn_up_exps.weight' is missing (architecture qwen3moe needs it)");
  TinySpec dense = s;
  dense.n_expert = 0;
  CHECK(describeTinyError(dense).find("expert_count = 0") != std::string::npos);
}

namespace {

// A minfer-synth shape (real keys and tensor names, compiler/tools/synth_model.cpp; sizes shrunk by the
// caller, K-quant rows multiples of 256) written as Q4_K_M and described as minfer-compile does.
model::ModelDescription describeSynth(const synth::ModelShape& shape) {
  gguf::GgufWriter writer(3);
  synth::SynthOptions o;
  o.shape = shape;
  o.mix = synth::TypeMix::kQ4_K_M;
  llvm::Error e = synth::buildSynthModel(o, writer, nullptr);
  REQUIRE_MESSAGE(!e, llvm::toString(std::move(e)));
  auto bytes = writer.toBytes();
  REQUIRE_MESSAGE(bool(bytes), llvm::toString(bytes.takeError()));
  static std::vector<std::unique_ptr<gguf::GgufFile>> keep;  // descriptions point into the mapping
  auto file = gguf::GgufFile::parse(llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(
                                        reinterpret_cast<const char*>(bytes->data()), bytes->size())),
                                    "synth-" + shape.name + ".gguf");
  REQUIRE_MESSAGE(bool(file), llvm::toString(file.takeError()));
  keep.push_back(std::move(*file));
  auto d = model::describeModel(*keep.back(), 16);
  REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
  return std::move(*d);
}

// A gemma benchmark shape with its heads, head_dim and keys, at n_embd 256, n_ff 256, n_vocab 300.
synth::ModelShape smallGemma(const std::string& name, uint32_t n_layer) {
  synth::ModelShape shape = llvm::cantFail(synth::modelShape(name));
  shape.n_layer = n_layer, shape.n_embd = 256, shape.n_ff = 256, shape.n_vocab = 300;
  return shape;
}

}  // namespace

TEST_CASE("minfer-synth's qwen3-30b-a3b shape, scaled down, is read back as qwen3moe with its expert keys") {
  // The benchmark shape's keys and tensor names (compiler/tools/synth_model.cpp) at 2 layers, 6 experts.
  synth::ModelShape shape = llvm::cantFail(synth::modelShape("qwen3-30b-a3b"));
  shape.n_layer = 2, shape.n_embd = 256, shape.n_head = 4, shape.n_head_kv = 2, shape.n_expert = 6;
  shape.n_expert_used = 3, shape.n_ff_exp = 256, shape.n_vocab = 300;  // K-quant rows: multiples of 256
  const model::ModelDescription desc = describeSynth(shape);
  const model::ModelDescription* d = &desc;
  CHECK(d->config.architecture == "qwen3moe");
  CHECK(d->config.head_dim == 128);  // q is 4 x 128 = 512 wide on n_embd 256
  CHECK(d->config.n_expert == 6);
  CHECK(d->config.n_expert_used == 3);
  CHECK(d->config.n_ff_exp == 256);
  CHECK(countOps(d->plan.prefill, fb::OpKind::MoeFfn) == 2);
  CHECK(countOps(d->plan.prefill, fb::OpKind::HeadRmsNorm) == 4);
  for (const model::WeightDesc& w : d->weights)
    CHECK_MESSAGE(w.experts == (w.name.find("_exps") != std::string::npos ? 6u : 1u), w.name);
}

TEST_CASE("minfer-synth's gemma2-9b and gemma3-12b shapes, scaled down, are read back with Gemma's hyperparameters") {
  {  // gemma2-9b: window 4096 on the even layers, caps 50 / 30, query scale 1/sqrt(256), base 10000 by default.
    const model::ModelDescription d = describeSynth(smallGemma("gemma2-9b", 4));
    CHECK(d.config.architecture == "gemma2");
    CHECK(d.config.head_dim == 256);
    CHECK(d.config.n_head == 16);
    CHECK(d.config.n_head_kv == 8);
    CHECK(d.config.tied_embeddings);
    CHECK(d.config.rope_freq_base == 10000.0f);
    CHECK(d.config.rms_norm_eps == 1e-6f);
    std::vector<uint32_t> windows;
    for (const auto& st : d.plan.prefill) {
      if (st.op != fb::OpKind::Attention) continue;
      windows.push_back(st.window);
      CHECK(st.softcap == 50.0f);
      CHECK(st.scale == doctest::Approx(1.0 / 16));
    }
    CHECK(windows == std::vector<uint32_t>{4096, 0, 4096, 0});
    CHECK(d.plan.prefill.back().name == "output.softcap");
    CHECK(d.plan.prefill.back().softcap == 30.0f);
    CHECK(countOps(d.plan.prefill, fb::OpKind::GeGlu) == 4);
  }
  {  // gemma3-12b: period 6 and local base 10000 (llama.cpp's defaults), global base 1e6 with linear x8.
    const model::ModelDescription d = describeSynth(smallGemma("gemma3-12b", 7));
    CHECK(d.config.architecture == "gemma3");
    CHECK(d.config.head_dim == 256);
    CHECK(d.config.tied_embeddings);
    Gemma3Layers l = gemma3Layers(d);
    CHECK(l.windows == std::vector<uint32_t>{1024, 1024, 1024, 1024, 1024, 0, 1024});
    CHECK(l.bases == std::vector<float>{1e4f, 1e4f, 1e4f, 1e4f, 1e4f, 1e6f, 1e4f});
    CHECK(l.scales == std::vector<float>{1, 1, 1, 1, 1, 0.125f, 1});
    CHECK(countOps(d.plan.prefill, fb::OpKind::HeadRmsNorm) == 2 * 7);
    CHECK(d.plan.prefill.back().op == fb::OpKind::MatMul);  // no final soft-cap
  }
}

TEST_CASE("the architecture list is written once and named in the refusal") {
  CHECK(std::string(model::supportedArchitectures()) == "llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe");
  TinySpec s;
  s.arch = "gpt2";
  const std::string msg = describeTinyError(s);
  CHECK(msg == "tiny-gpt2.gguf: unsupported architecture 'gpt2' (general.architecture); supported: llama, qwen2, "
               "qwen3, gemma2, gemma3, phi3, qwen3moe");
}

TEST_CASE("architecture facts are checked against the tensors") {
  TinySpec qwen3;
  qwen3.arch = "qwen3", qwen3.qk_norm = true;
  qwen3.skip = {"blk.1.attn_k_norm.weight"};
  CHECK(describeTinyError(qwen3) ==
        "tiny-qwen3.gguf: tensor 'blk.1.attn_k_norm.weight' is missing (architecture qwen3 needs it)");
  TinySpec qwen2;
  qwen2.arch = "qwen2", qwen2.bias = true;
  qwen2.skip = {"blk.0.attn_v.bias"};
  CHECK(describeTinyError(qwen2) == "tiny-qwen2.gguf: tensor 'blk.0.attn_v.bias' is missing (architecture qwen2 needs it)");
  // A llama GGUF with qwen3's q/k norms: an architecture variant minfer does not know.
  TinySpec llama;
  llama.qk_norm = true;
  CHECK(describeTinyError(llama) ==
        "tiny-llama.gguf: tensor 'blk.0.attn_q_norm.weight' is not used by the llama architecture as minfer knows it");
  TinySpec wrong_shape;
  wrong_shape.arch = "qwen3", wrong_shape.qk_norm = true;
  wrong_shape.skip = {"blk.0.attn_q_norm.weight"};
  wrong_shape.extra = {{"blk.0.attn_q_norm.weight", 9}};
  CHECK(describeTinyError(wrong_shape) ==
        "tiny-qwen3.gguf: tensor 'blk.0.attn_q_norm.weight' has shape [9], expected [8] from the hyperparameters");
}

TEST_CASE("max batch out of range is refused") {
  TinySpec s;
  for (uint32_t bad : {0u, 70000u}) {
    auto desc = describeTiny(s, bad);
    REQUIRE(!desc);
    const std::string msg = llvm::toString(desc.takeError());
    CHECK(msg == "max batch " + std::to_string(bad) + " is out of range 1..65536");
  }
  CHECK(bool(describeTiny(s, 65536)));
}

TEST_CASE("tiny-llama31: rope_freqs.weight is one weight shared by every layer's RoPE step") {
  if (!test::haveFixtures()) return;
  const auto d = describe("../arch/models/tiny-llama31-Q4_K_M.gguf");
  CHECK(d.config.rope_freq_base == doctest::Approx(5e5));
  CHECK(d.config.rope_scaling == fb::RopeScaling::None);  // Llama 3.1 scaling lives only in the tensor
  CHECK(d.config.n_rot == 64);
  int ropes = 0;
  for (const auto& s : d.plan.prefill) {
    if (s.op != fb::OpKind::Rope) continue;
    ++ropes;
    REQUIRE(s.weights.size() == 1);
    const auto& w = d.weights[s.weights[0]];
    CHECK(w.name == "rope_freqs.weight");
    CHECK(w.role == planes::TensorRole::kVector);
    CHECK(w.info->ne[0] == 32);
  }
  CHECK(ropes == 2);
  int registered = 0;
  for (const auto& w : d.weights) registered += w.name == "rope_freqs.weight";
  CHECK(registered == 1);  // every GGUF tensor once
}

TEST_CASE("rope_freqs: optional for llama, shape [n_rot/2], F32 values > 0, unknown to qwen3") {
  const std::vector<float> ff = {1.0f, 1.5f, 4.0f, 8.0f};  // n_rot/2 = 4 (head_dim 8)
  TinySpec plain;
  auto d0 = describeTiny(plain);
  REQUIRE_MESSAGE(bool(d0), llvm::toString(d0.takeError()));
  for (const auto& s : d0->plan.prefill)
    if (s.op == fb::OpKind::Rope) CHECK(s.weights.empty());
  TinySpec with;
  with.extra_values = {{"rope_freqs.weight", ff}};
  auto d1 = describeTiny(with);
  REQUIRE_MESSAGE(bool(d1), llvm::toString(d1.takeError()));
  std::set<uint32_t> ids;
  for (const auto& s : d1->plan.prefill)
    if (s.op == fb::OpKind::Rope) {
      REQUIRE(s.weights.size() == 1);
      ids.insert(s.weights[0]);
    }
  REQUIRE(ids.size() == 1);
  CHECK(d1->weights[*ids.begin()].name == "rope_freqs.weight");
  for (const auto& s : d1->plan.decode)
    if (s.op == fb::OpKind::Rope) CHECK(s.weights == std::vector<uint32_t>{*ids.begin()});

  TinySpec wrong = with;
  wrong.extra_values = {{"rope_freqs.weight", {1, 1, 1, 1, 1, 1, 1, 1}}};
  CHECK(describeTinyError(wrong) ==
        "tiny-llama.gguf: tensor 'rope_freqs.weight' has shape [8], expected [4] from the hyperparameters");
  TinySpec zero = with;
  zero.extra_values = {{"rope_freqs.weight", {1, 1, 0, 1}}};
  CHECK(describeTinyError(zero) == "tiny-llama.gguf: tensor 'rope_freqs.weight' value 2 = 0 must be finite and > 0");
  TinySpec qwen3 = with;
  qwen3.arch = "qwen3", qwen3.qk_norm = true;
  CHECK(describeTinyError(qwen3) ==
        "tiny-qwen3.gguf: tensor 'rope_freqs.weight' is not used by the qwen3 architecture as minfer knows it");
}

TEST_CASE("llama refuses n_rot != head_dim with llama.cpp's reason; qwen3 rotates part of the head") {
  TinySpec llama;
  llama.n_rot = 4;  // head_dim 8
  CHECK(describeTinyError(llama) ==
        "tiny-llama.gguf: invalid n_rot: 4, expected 8 (llama.rope.dimension_count must equal the head dimension "
        "for llama, as in llama.cpp)");
  TinySpec qwen3;
  qwen3.arch = "qwen3", qwen3.qk_norm = true, qwen3.n_rot = 4;
  auto d = describeTiny(qwen3);
  REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
  CHECK(d->config.n_rot == 4);
}

TEST_CASE("RoPE scaling keys read as llama.cpp reads them") {
  struct Case {
    const char* what;
    std::string type;
    float factor, legacy;
    fb::RopeScaling scaling;
    float freq_scale;
  };
  const Case cases[] = {
      {"no keys", "", NAN, NAN, fb::RopeScaling::None, 1.0f},
      {"linear x4", "linear", 4.0f, NAN, fb::RopeScaling::Linear, 0.25f},
      {"legacy scale_linear alone", "", NAN, 4.0f, fb::RopeScaling::Linear, 0.25f},
      {"factor without type (type defaults to linear)", "", 2.0f, NAN, fb::RopeScaling::Linear, 0.5f},
      {"factor wins over legacy", "", 4.0f, 2.0f, fb::RopeScaling::Linear, 0.25f},
      {"linear with factor 0", "linear", 0.0f, NAN, fb::RopeScaling::None, 1.0f},
      {"legacy 0", "", NAN, 0.0f, fb::RopeScaling::None, 1.0f},
      {"linear without factor", "linear", NAN, NAN, fb::RopeScaling::None, 1.0f},
      {"type none never scales", "none", 4.0f, NAN, fb::RopeScaling::None, 1.0f},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    TinySpec s;
    s.scaling_type = c.type, s.scaling_factor = c.factor, s.scale_linear = c.legacy;
    auto d = describeTiny(s);
    REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
    CHECK(d->config.rope_scaling == c.scaling);
    CHECK(d->config.rope_freq_scale == c.freq_scale);
    for (const auto& st : d->plan.prefill)
      if (st.op == fb::OpKind::Rope) CHECK(st.rope_freq_scale == c.freq_scale);
  }
  // longrope scales like linear in llama.cpp (its factors are tensors, phi3 only).
  TinySpec longrope;
  longrope.scaling_type = "longrope", longrope.scaling_factor = 4.0f;
  auto dl = describeTiny(longrope);
  REQUIRE_MESSAGE(bool(dl), llvm::toString(dl.takeError()));
  CHECK(dl->config.rope_scaling == fb::RopeScaling::Linear);
  CHECK(dl->config.rope_freq_scale == 0.25f);
  const std::pair<std::string, std::string> refused[] = {
      {"dynamic", "tiny-llama.gguf: llama.rope.scaling.type = 'dynamic' is not a RoPE scaling type (supported: none, "
                  "linear, yarn, longrope)"},
  };
  for (const auto& [type, message] : refused) {
    TinySpec s;
    s.scaling_type = type, s.scaling_factor = 4.0f;
    CHECK(describeTinyError(s) == message);
  }
  TinySpec negative;
  negative.scale_linear = -2.0f;
  CHECK(describeTinyError(negative) ==
        "tiny-llama.gguf: llama.rope.scale_linear = -2 must be finite and ≥ 0 (0: no scaling)");
}

TEST_CASE("YaRN RoPE scaling: llama.cpp's ggml_rope_ext parameters from the rope.scaling keys") {
  struct Case {
    const char* what;
    std::string type;
    float factor, attn;
    int64_t orig;
    fb::RopeScaling scaling;
    float freq_scale, ext_factor;
    uint32_t n_ctx_orig;
    double attn_factor;  // llama_context: get_mscale(factor) / (1 + 0.1·ln factor) · rope.scaling.attn_factor
  };
  const double ln4 = std::log(4.0);
  const Case cases[] = {
      {"yarn x4, original context 512", "yarn", 4.0f, NAN, 512, fb::RopeScaling::Yarn, 0.25f, 1.0f, 512, 1.0},
      {"yarn x8 without original context: context_length", "yarn", 8.0f, NAN, -1, fb::RopeScaling::Yarn, 0.125f,
       1.0f, 2048, 1.0},
      {"yarn original context 0: context_length", "yarn", 4.0f, NAN, 0, fb::RopeScaling::Yarn, 0.25f, 1.0f, 2048, 1.0},
      {"yarn with attn_factor", "yarn", 4.0f, 0.5f, 1024, fb::RopeScaling::Yarn, 0.25f, 1.0f, 1024, 0.5},
      {"yarn without factor: freq_scale 1", "yarn", NAN, NAN, -1, fb::RopeScaling::Yarn, 1.0f, 1.0f, 2048, 1.0},
      {"yarn factor 0.5 (< 1): no get_mscale", "yarn", 0.5f, NAN, 64, fb::RopeScaling::Yarn, 2.0f, 1.0f, 64,
       1.0 / (1 + 0.1 * std::log(0.5))},
      {"linear with attn_factor", "linear", 8.0f, 2.0f, 100, fb::RopeScaling::Linear, 0.125f, 0.0f, 0, 2.0},
      {"none with attn_factor", "none", 8.0f, 3.0f, -1, fb::RopeScaling::None, 1.0f, 0.0f, 0, 3.0},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    TinySpec s;
    s.scaling_type = c.type, s.scaling_factor = c.factor, s.attn_factor = c.attn, s.orig_ctx = c.orig;
    auto d = describeTiny(s);
    REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
    CHECK(d->config.rope_scaling == c.scaling);
    CHECK(d->config.rope_freq_scale == c.freq_scale);
    int n_rope = 0;
    for (const auto* plan : {&d->plan.prefill, &d->plan.decode})
      for (const auto& st : *plan)
        if (st.op == fb::OpKind::Rope) {
          ++n_rope;
          CHECK(st.rope_freq_scale == c.freq_scale);
          CHECK(st.rope_ext_factor == c.ext_factor);
          CHECK(st.rope_n_ctx_orig == c.n_ctx_orig);
          CHECK(std::abs(st.rope_attn_factor - c.attn_factor) < 1e-6);
          CHECK(st.rope_beta_fast == 32.0f);  // llama.cpp's defaults (its yarn_* keys are for other archs)
          CHECK(st.rope_beta_slow == 1.0f);
        }
    CHECK(n_rope >= 2);
  }
  // What the rope op then applies to cos and sin: 1 + 0.1·ln 4 for x4 (llama.cpp's net YaRN scale).
  TinySpec x4;
  x4.scaling_type = "yarn", x4.scaling_factor = 4.0f, x4.orig_ctx = 512;
  auto d = describeTiny(x4);
  REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
  const model::ModelConfig& c = d->config;
  const kern::RopeYarn y = kern::ropeYarn(static_cast<int>(c.n_rot), c.rope_freq_base, c.rope_freq_scale,
                                          c.rope_ext_factor, c.rope_attn_factor, c.rope_beta_fast, c.rope_beta_slow,
                                          c.rope_n_ctx_orig);
  CHECK(std::abs(y.mscale - (1 + 0.1 * ln4)) < 1e-6);

  TinySpec bad_attn;
  bad_attn.scaling_type = "yarn", bad_attn.scaling_factor = 4.0f, bad_attn.attn_factor = 0.0f;
  CHECK(describeTinyError(bad_attn) == "tiny-llama.gguf: llama.rope.scaling.attn_factor = 0 must be finite and > 0");
}

TEST_CASE("an empty tensor (a dim of 0) parses and is refused by the block that uses it") {
  TinySpec s;
  s.validate = false;
  s.skip = {"blk.1.ffn_norm.weight"};
  s.extra = {{"blk.1.ffn_norm.weight", 0}};
  CHECK(describeTinyError(s) ==
        "tiny-llama.gguf: tensor 'blk.1.ffn_norm.weight' has no elements (ne[0] = 0); architecture llama uses it");
  TinySpec ff = s;
  ff.skip = {}, ff.extra = {{"rope_freqs.weight", 0}};  // optional, but present and empty
  CHECK(describeTinyError(ff) ==
        "tiny-llama.gguf: tensor 'rope_freqs.weight' has no elements (ne[0] = 0); architecture llama uses it");
}

namespace {

// A phi3 GGUF with odd shapes: n_embd 36, 3 heads of 12 (q 36 wide), 1 kv head (k, v 12), n_ff 20.
TinySpec phi3Spec() {
  TinySpec s;
  s.arch = "phi3", s.n_embd = 36, s.n_layer = 2, s.n_head = 3, s.n_head_kv = 1, s.n_ff = 20, s.n_vocab = 43;
  s.fused = true;
  return s;
}

}  // namespace

TEST_CASE("phi3: one fused q|k|v matmul and one gate|up matmul, read in place as column views") {
  auto d = describeTiny(phi3Spec());
  REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
  CHECK(d->config.rope_style == fb::RopeStyle::Neox);
  CHECK(d->config.n_ctx_max == 0);
  const auto& buffers = d->plan.buffers;
  auto bufferNamed = [&](const std::string& name) {
    for (size_t i = 0; i < buffers.size(); ++i)
      if (buffers[i].name == name) return static_cast<uint32_t>(i);
    FAIL("no buffer " << name);
    return UINT32_MAX;
  };
  const uint32_t qkv = bufferNamed("qkv"), gate_up = bufferNamed("gate_up"), gate = bufferNamed("gate");
  CHECK(buffers[qkv].width == 36 + 2 * 12);
  CHECK(buffers[gate_up].width == 2 * 20);
  for (const auto& b : buffers) CHECK((b.name != "q" && b.name != "k" && b.name != "v" && b.name != "up"));
  const auto& steps = d->plan.prefill;
  const std::vector<std::pair<fb::OpKind, std::string>> layer0 = {
      {fb::OpKind::RmsNorm, "blk.0.attn_norm"},   {fb::OpKind::MatMul, "blk.0.attn_qkv"},
      {fb::OpKind::Rope, "blk.0.rope"},           {fb::OpKind::Attention, "blk.0.attention"},
      {fb::OpKind::MatMul, "blk.0.attn_output"},  {fb::OpKind::Add, "blk.0.attn_residual"},
      {fb::OpKind::RmsNorm, "blk.0.ffn_norm"},    {fb::OpKind::MatMul, "blk.0.ffn_up"},
      {fb::OpKind::SwiGlu, "blk.0.swiglu"},       {fb::OpKind::MatMul, "blk.0.ffn_down"},
      {fb::OpKind::Add, "blk.0.ffn_residual"}};
  REQUIRE(steps.size() == 1 + 2 * layer0.size() + 2);  // Embed, the layers, output_norm, output
  for (size_t i = 0; i < layer0.size(); ++i) {
    CAPTURE(i);
    CHECK(steps[1 + i].op == layer0[i].first);
    CHECK(steps[1 + i].name == layer0[i].second);
  }
  const model::StepDesc& mm = steps[2];
  CHECK(mm.outputs == std::vector<uint32_t>{qkv});
  CHECK((mm.rows == 60 && mm.cols == 36));
  CHECK(mm.input_views.empty());
  // RoPE in place on q = columns 0..35 and k = 36..47 of qkv; attention reads q, k and v = 48..59.
  const model::StepDesc& rope = steps[3];
  CHECK(rope.inputs == std::vector<uint32_t>{qkv, qkv});
  CHECK(rope.outputs == rope.inputs);
  REQUIRE(rope.input_views.size() == 2);
  CHECK((rope.input_views[0].offset == 0 && rope.input_views[0].width == 36));
  CHECK((rope.input_views[1].offset == 36 && rope.input_views[1].width == 12));
  REQUIRE(rope.output_views.size() == 2);
  CHECK((rope.output_views[1].offset == 36 && rope.output_views[1].width == 12));
  CHECK(rope.weights.empty());  // no LongRoPE factors in this file
  const model::StepDesc& att = steps[4];
  CHECK(att.inputs == std::vector<uint32_t>{qkv, qkv, qkv});
  REQUIRE(att.input_views.size() == 3);
  CHECK((att.input_views[2].offset == 48 && att.input_views[2].width == 12));
  REQUIRE(att.output_views.size() == 1);
  CHECK((att.output_views[0].offset == 0 && att.output_views[0].width == 36));  // attn, a whole buffer
  // SwiGLU: gate = columns 0..19, up = 20..39 of gate_up, into the whole gate buffer, ffn_down's input.
  const model::StepDesc& glu = steps[9];
  CHECK(steps[8].outputs == std::vector<uint32_t>{gate_up});
  CHECK((steps[8].rows == 40 && steps[8].cols == 36));
  CHECK(glu.inputs == std::vector<uint32_t>{gate_up, gate_up});
  REQUIRE(glu.input_views.size() == 2);
  CHECK((glu.input_views[0].offset == 0 && glu.input_views[0].width == 20));
  CHECK((glu.input_views[1].offset == 20 && glu.input_views[1].width == 20));
  CHECK(glu.outputs == std::vector<uint32_t>{gate});
  CHECK(steps[10].inputs == std::vector<uint32_t>{gate});
  CHECK((steps[10].rows == 36 && steps[10].cols == 20));
  // The same step list for decode.
  REQUIRE(d->plan.decode.size() == steps.size());
  CHECK(d->plan.decode[3].input_views.size() == 2);

  // ffn_up must hold gate and up (2·n_ff rows): a plain [n_embd, n_ff] one is refused by name.
  TinySpec split = phi3Spec();
  split.fused = false;
  split.skip = {"blk.0.ffn_gate.weight", "blk.1.ffn_gate.weight"};
  CHECK(describeTinyError(split) ==
        "tiny-phi3.gguf: tensor 'blk.0.ffn_up.weight' has shape [36, 20], expected [36, 40] from the hyperparameters");
  // A missing fused tensor is refused by name.
  TinySpec missing = phi3Spec();
  missing.skip = {"blk.1.attn_qkv.weight"};
  CHECK(describeTinyError(missing) ==
        "tiny-phi3.gguf: tensor 'blk.1.attn_qkv.weight' is missing (architecture phi3 needs it)");
}

TEST_CASE("LongRoPE: rope_factors_long or _short chosen by the compiled context, as llama.cpp's get_rope_factors") {
  // head_dim 12 → n_rot/2 = 6 factors; context_length 2048 (no key), original_context_length 64.
  const std::vector<float> longf = {1, 2, 3, 4, 5, 6}, shortf = {1, 1.5f, 2, 2.5f, 3, 3.5f};
  TinySpec s = phi3Spec();
  s.orig_ctx = 64;
  s.attn_factor = 1.25f;
  s.extra_values = {{"rope_factors_long.weight", longf}, {"rope_factors_short.weight", shortf}};
  struct Case {
    uint32_t n_ctx;
    const char* chosen;
    uint32_t n_ctx_max;
  };
  const Case cases[] = {{0, "rope_factors_long.weight", 0},     // context_length 2048 > 64
                        {65, "rope_factors_long.weight", 65},   // n_ctx > n_ctx_orig_yarn: long
                        {64, "rope_factors_short.weight", 64},  // n_ctx == n_ctx_orig_yarn: short
                        {16, "rope_factors_short.weight", 16}};
  for (const Case& c : cases) {
    CAPTURE(c.n_ctx);
    auto d = describeTiny(s, 16, c.n_ctx);
    REQUIRE_MESSAGE(bool(d), llvm::toString(d.takeError()));
    CHECK(d->config.n_ctx_max == c.n_ctx_max);
    int ropes = 0;
    for (const auto& st : d->plan.prefill)
      if (st.op == fb::OpKind::Rope) {
        ++ropes;
        REQUIRE(st.weights.size() == 1);
        CHECK(d->weights[st.weights[0]].name == c.chosen);
        CHECK(st.rope_attn_factor == 1.25f);  // rope.scaling.attn_factor scales cos/sin for either set
        CHECK(st.rope_ext_factor == 0.0f);
      }
    CHECK(ropes == 2);
    // The other set is checked but not stored.
    int stored = 0;
    for (const auto& w : d->weights) stored += w.name.rfind("rope_factors_", 0) == 0;
    CHECK(stored == 1);
  }
  // Short chosen by the model's own context (context_length ≤ original): sessions stay within the
  // original context, beyond which llama.cpp would take the long set.
  TinySpec short_ctx = s;
  short_ctx.orig_ctx = 4096;
  auto ds = describeTiny(short_ctx);
  REQUIRE_MESSAGE(bool(ds), llvm::toString(ds.takeError()));
  CHECK(ds->config.n_ctx_max == 4096);
  // Only one set present: the other choice has no factors (llama.cpp passes a null tensor).
  TinySpec only_long = s;
  only_long.extra_values = {{"rope_factors_long.weight", longf}};
  auto dn = describeTiny(only_long, 16, 32);
  REQUIRE_MESSAGE(bool(dn), llvm::toString(dn.takeError()));
  for (const auto& st : dn->plan.prefill)
    if (st.op == fb::OpKind::Rope) CHECK(st.weights.empty());

  // Refusals: wrong length, wrong type, a value that is not finite and > 0 - of either set, chosen or not.
  TinySpec wrong_len = s;
  wrong_len.extra_values = {{"rope_factors_long.weight", longf}, {"rope_factors_short.weight", {1, 1, 1, 1, 1}}};
  CHECK(describeTinyError(wrong_len) ==
        "tiny-phi3.gguf: tensor 'rope_factors_short.weight' has shape [5], expected [6] from the hyperparameters");
  TinySpec zero = s;
  zero.extra_values = {{"rope_factors_long.weight", {1, 2, 0, 4, 5, 6}}, {"rope_factors_short.weight", shortf}};
  CHECK(describeTinyError(zero) ==
        "tiny-phi3.gguf: tensor 'rope_factors_long.weight' value 2 = 0 must be finite and > 0");
  TinySpec nan = s;
  nan.extra_values = {{"rope_factors_long.weight", longf}, {"rope_factors_short.weight", {1, NAN, 1, 1, 1, 1}}};
  CHECK(describeTinyError(nan) ==
        "tiny-phi3.gguf: tensor 'rope_factors_short.weight' value 1 = nan must be finite and > 0");
  {  // F16 factors: refused by type
    gguf::GgufWriter w = makeWriter(phi3Spec());
    w.addTensor("rope_factors_long.weight", GgmlType::F16, {6}, std::vector<uint8_t>(12, 0x3c));
    auto bytes = w.toBytes();
    REQUIRE(bool(bytes));
    auto file = gguf::GgufFile::parse(
        llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(reinterpret_cast<const char*>(bytes->data()), bytes->size()),
                                             "f16.gguf"),
        "f16.gguf");
    REQUIRE(bool(file));
    auto d = model::describeModel(**file, 16);
    REQUIRE(!d);
    CHECK(llvm::toString(d.takeError()) ==
          "f16.gguf: tensor 'rope_factors_long.weight' has type F16; norm weights, biases and RoPE factors must be F32");
  }
  // LongRoPE factors mean nothing to llama (llama.cpp does not load them there): refused as unused.
  TinySpec llama;
  llama.extra_values = {{"rope_factors_long.weight", {1, 1, 1, 1}}};
  CHECK(describeTinyError(llama) ==
        "tiny-llama.gguf: tensor 'rope_factors_long.weight' is not used by the llama architecture as minfer knows it");
  // The compiled context is bounded.
  auto big = describeTiny(s, 16, (1u << 20) + 1);
  REQUIRE(!big);
  CHECK(llvm::toString(big.takeError()) == "context 1048577 is out of range 0..2^20 (0: the model's)");
}
