// phi3 (Phi-3, Phi-3.5 mini/medium, Phi-4-mini): llama's block with the q/k/v projections fused into one
// attn_qkv matrix (rows q, then k, then v) and the FFN's gate and up fused into ffn_up (rows gate, then
// up; y = ffn_down(silu(gate) ⊙ up), no ffn_gate tensor); RoPE on the pairs (i, i + n_rot / 2) ("neox"),
// q scaled by 1/sqrt(head_dim). The fused outputs are read in place as column views (format 1.4): one
// MatMul writes q|k|v, RoPE and attention read its column ranges; one writes gate|up, SwiGLU reads both
// halves. Separate attn_q/k/v tensors are accepted too (llama.cpp's create_tensor_qkv does).
// As llama.cpp's llama_model_phi3 (load_arch_hparams, load_arch_tensors, graph): attention.sliding_window
// is ignored (llama.cpp disables phi3's SWA); output.weight may be absent (tied to token_embd); LongRoPE
// (128k models): rope_factors_long/short.weight chosen by the compiled context (GraphBuilder::
// longRopeFactors), cos/sin scaled by rope.scaling.attn_factor.
#include "compiler/model/architectures.h"

namespace minfer::model {
namespace {

llvm::Error forward(GraphBuilder& g) {
  const bool fused_qkv = g.file().findTensor("blk.0.attn_qkv.weight") != nullptr;
  if (auto e = g.embedding({.fused_qkv = fused_qkv, .fused_gate_up = true})) return e;
  for (uint32_t l = 0; l < g.config().n_layer; ++l)
    if (auto e = g.decoderLayer(l, {.rope = {.long_rope = true}})) return e;
  return g.outputHead(g.act().x);
}

}  // namespace

extern const Architecture kPhi3 = {"phi3", {.rope_style = fb::RopeStyle::Neox}, forward};

}  // namespace minfer::model
