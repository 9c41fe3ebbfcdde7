// qwen3 (Qwen3 dense): llama's block with a per-head RMSNorm of q and k between the projections
// and RoPE, which rotates the pairs (i, i + n_rot / 2) ("neox"); no biases.
#include "compiler/model/architectures.h"

namespace minfer::model {
namespace {

llvm::Error forward(GraphBuilder& g) {
  if (auto e = g.embedding()) return e;
  for (uint32_t l = 0; l < g.config().n_layer; ++l)
    if (auto e = g.decoderLayer(l, {.qkv = {.head_norm = true}})) return e;
  return g.outputHead(g.act().x);
}

}  // namespace

extern const Architecture kQwen3 = {"qwen3", {.rope_style = fb::RopeStyle::Neox}, forward};

}  // namespace minfer::model
