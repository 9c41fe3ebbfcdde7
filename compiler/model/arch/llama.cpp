// llama (Llama 2/3/3.1+, Mistral, TinyLlama, SmolLM): pre-RMSNorm blocks, GQA attention with RoPE on
// adjacent pairs over the whole head, optional rope_freqs (Llama 3.1+ frequency factors), SwiGLU FFN;
// no biases.
#include "compiler/model/architectures.h"
#include "llvm/Support/FormatVariadic.h"

namespace minfer::model {
namespace {

llvm::Error forward(GraphBuilder& g) {
  const ModelConfig& c = g.config();
  // llama.cpp's llama_model::load_hparams refuses partial rotation for llama with this text.
  if (c.n_rot != c.head_dim)
    return g.error(llvm::formatv("invalid n_rot: {0}, expected {1} ({2}.rope.dimension_count must equal the head "
                                 "dimension for llama, as in llama.cpp)",
                                 c.n_rot, c.head_dim, c.architecture));
  if (auto e = g.embedding()) return e;
  for (uint32_t l = 0; l < c.n_layer; ++l)
    if (auto e = g.decoderLayer(l, {.rope = {.freq_factors = true}})) return e;
  return g.outputHead(g.act().x);
}

}  // namespace

extern const Architecture kLlama = {"llama", {.rope_style = fb::RopeStyle::Norm}, forward};

}  // namespace minfer::model
