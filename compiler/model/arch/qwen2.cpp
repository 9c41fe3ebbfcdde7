// qwen2 (Qwen2, Qwen2.5): llama's block with biases on the q/k/v projections and RoPE on the pairs
// (i, i + n_rot / 2) ("neox").
#include "compiler/model/architectures.h"

namespace minfer::model {
namespace {

llvm::Error forward(GraphBuilder& g) {
  if (auto e = g.embedding()) return e;
  for (uint32_t l = 0; l < g.config().n_layer; ++l)
    if (auto e = g.decoderLayer(l, {.qkv = {.bias = true}})) return e;
  return g.outputHead(g.act().x);
}

}  // namespace

extern const Architecture kQwen2 = {"qwen2", {.rope_style = fb::RopeStyle::Neox}, forward};

}  // namespace minfer::model
