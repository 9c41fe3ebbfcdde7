// Architecture mapping: hyperparameters, tokenizer and plans from the fixture GGUFs.
#include <doctest/doctest.h>

#include "compiler/model/model_desc.h"
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
  CHECK(!c.qkv_bias);
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
  CHECK(d.config.qkv_bias);
  int with_bias = 0;
  for (const auto& s : d.plan.prefill)
    if (s.op == fb::OpKind::MatMul && s.weights.size() == 2) ++with_bias;
  CHECK(with_bias == 2 * 3);
  CHECK(d.config.head_dim == 64);
  CHECK(d.config.n_head_kv == 2);
}

TEST_CASE("max batch out of range is refused") {
  if (!test::haveFixtures()) return;
  auto file = gguf::GgufFile::open(test::fixturesDir() + "/models/stories260K.gguf");
  REQUIRE(bool(file));
  for (uint32_t bad : {0u, 70000u}) {
    auto desc = model::describeModel(**file, bad);
    REQUIRE(!desc);
    const std::string msg = llvm::toString(desc.takeError());
    CHECK(msg.find(std::to_string(bad)) != std::string::npos);
  }
}
