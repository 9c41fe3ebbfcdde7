// qwen3moe (Qwen3-MoE, e.g. Qwen3-30B-A3B): qwen3's attention (per-head q/k RMSNorm before RoPE, neox
// pairs, no biases) and a mixture-of-experts FFN in every layer: softmax router over expert_count
// experts, the expert_used_count most probable ones with their probabilities renormalised to sum 1
// (llama.cpp's llm_build_qwen3moe passes norm_w = true to build_moe_ffn; it reads no
// expert_weights_norm key for this architecture), SwiGLU experts of expert_feed_forward_length.
// feed_forward_length is present in real files but only sizes the expert width when that key is absent.
#include "compiler/model/architectures.h"

namespace minfer::model {
namespace {

llvm::Error forward(GraphBuilder& g) {
  if (auto e = g.embedding()) return e;
  for (uint32_t l = 0; l < g.config().n_layer; ++l)
    if (auto e = g.decoderLayer(l, {.qkv = {.head_norm = true}, .moe = true, .moe_norm_weights = true})) return e;
  return g.outputHead(g.act().x);
}

}  // namespace

extern const Architecture kQwen3Moe = {"qwen3moe", {.rope_style = fb::RopeStyle::Neox}, forward};

}  // namespace minfer::model
