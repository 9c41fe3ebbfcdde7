// llama (Llama 2/3, Mistral, TinyLlama, SmolLM): pre-RMSNorm blocks, GQA attention with RoPE on
// adjacent pairs, SwiGLU FFN; no biases.
#include "compiler/model/architectures.h"

namespace minfer::model {
namespace {

llvm::Error forward(GraphBuilder& g) {
  if (auto e = g.embedding()) return e;
  for (uint32_t l = 0; l < g.config().n_layer; ++l)
    if (auto e = g.llamaLayer(l, {})) return e;
  return g.outputHead(g.act().x);
}

}  // namespace

extern const Architecture kLlama = {"llama", {.rope_style = fb::RopeStyle::Norm}, forward};

}  // namespace minfer::model
