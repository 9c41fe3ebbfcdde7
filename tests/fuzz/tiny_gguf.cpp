// Small writer-made GGUF models for the fuzz corpus and the fault tests (see tiny_gguf.h).
#include "tests/fuzz/tiny_gguf.h"

#include <cstdio>
#include <random>
#include <vector>

#include "tests/runtime/weight_builder.h"

namespace minfer::test {

gguf::GgufWriter makeTinyGguf(const TinyGgufSpec& s) {
  gguf::GgufWriter w(3);
  const std::string a = s.arch + ".";
  w.setString("general.architecture", s.arch);
  w.setString("general.name", "tiny-" + s.arch);
  w.setU32(a + "context_length", s.n_ctx_train);
  w.setU32(a + "embedding_length", s.n_embd);
  w.setU32(a + "block_count", s.n_layer);
  w.setU32(a + "feed_forward_length", s.n_ff);
  w.setU32(a + "attention.head_count", s.n_head);
  w.setU32(a + "attention.head_count_kv", s.n_head_kv);
  if (s.head_dim != 0) w.setU32(a + "attention.key_length", s.head_dim);
  w.setF32(a + "rope.freq_base", s.arch == "llama" ? 10000.0f : 1000000.0f);
  w.setF32(a + "attention.layer_norm_rms_epsilon", 1e-5f);

  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  if (s.byte_tokens) {
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
      tokens.push_back(buf);
      types.push_back(6);
    }
  }
  for (const char* word : {"\xE2\x96\x81", "\xE2\x96\x81the", "\xE2\x96\x81" "a", "\xE2\x96\x81" "cat", "\xE2\x96\x81sat",
                           "\xE2\x96\x81on", "\xE2\x96\x81mat", "he", "at", "t", "h", "e", "a", "c", "s", "o", "n",
                           "m", "."}) {
    tokens.push_back(word);
    types.push_back(1);
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  for (size_t k = 0; k < scores.size(); ++k) scores[k] = -0.5f * static_cast<float>(k % 17);
  const uint32_t n_vocab = static_cast<uint32_t>(tokens.size());
  w.setString("tokenizer.ggml.model", "llama");
  w.setStringArray("tokenizer.ggml.tokens", tokens);
  w.setF32Array("tokenizer.ggml.scores", scores);
  w.setI32Array("tokenizer.ggml.token_type", types);
  w.setU32("tokenizer.ggml.bos_token_id", 1);
  w.setU32("tokenizer.ggml.eos_token_id", 2);

  std::mt19937_64 rng(s.seed);
  auto matrix = [&](const std::string& name, GgmlType type, uint64_t rows, uint64_t cols) {
    RandomWeight rw = makeRandomWeight(type, rows, cols, rng, 0.5f);
    w.addTensor(name, type, {cols, rows}, std::move(rw.source));
  };
  auto vector = [&](const std::string& name, uint64_t n) {
    RandomWeight rw = makeRandomWeight(GgmlType::F32, 1, n, rng, 1.0f);
    w.addTensor(name, GgmlType::F32, {n}, std::move(rw.source));
  };
  const uint32_t head_dim = s.head_dim ? s.head_dim : s.n_embd / s.n_head;
  const uint64_t q_width = uint64_t{s.n_head} * head_dim, kv_width = uint64_t{s.n_head_kv} * head_dim;
  matrix("token_embd.weight", s.embd, n_vocab, s.n_embd);
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    vector(b + "attn_norm.weight", s.n_embd);
    matrix(b + "attn_q.weight", s.attn, q_width, s.n_embd);
    matrix(b + "attn_k.weight", s.attn, kv_width, s.n_embd);
    matrix(b + "attn_v.weight", s.attn, kv_width, s.n_embd);
    if (s.arch == "qwen2") {
      vector(b + "attn_q.bias", q_width);
      vector(b + "attn_k.bias", kv_width);
      vector(b + "attn_v.bias", kv_width);
    }
    matrix(b + "attn_output.weight", s.attn, s.n_embd, q_width);
    vector(b + "ffn_norm.weight", s.n_embd);
    matrix(b + "ffn_gate.weight", s.ffn, s.n_ff, s.n_embd);
    matrix(b + "ffn_up.weight", s.ffn, s.n_ff, s.n_embd);
    matrix(b + "ffn_down.weight", s.down, s.n_embd, s.n_ff);
  }
  vector("output_norm.weight", s.n_embd);
  if (!s.tied) matrix("output.weight", s.output, n_vocab, s.n_embd);
  return w;
}

}  // namespace minfer::test
