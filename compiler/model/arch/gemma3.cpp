// gemma3 (Gemma 3): gemma2's block (embedding x sqrt(n_embd), post-attention and post-FFN RMSNorms,
// GELU-tanh gated FFN, neox RoPE, tied output) with a per-head RMSNorm of q and k before RoPE (as
// qwen3), no attention soft-cap, and local (sliding-window) layers whose RoPE has its own base and no
// scaling.
// Hyperparameters as llama.cpp's load_hparams reads them for LLM_ARCH_GEMMA3 (fixtures README §8.1,
// §8.7): attention.sliding_window absent or 0 → every layer global; otherwise the local layers are
// given by attention.sliding_window_pattern (swa_pattern.h): a period P (default 6; layer il is local iff
// il % P < P - 1) or an array with one flag per layer. llama.cpp's gemma3 loader reads this key as a
// scalar only and, for an array, silently keeps period 6; we follow the array instead (its flags as
// llama.cpp's per-layer reader, get_key_or_arr into swa_layers, interprets them), so such a file runs
// as it declares and differs from llama.cpp unless its array is the period-6 layout. Local layers
// rotate with rope.freq_base_swa (default 10000) and freq scale 1, while rope.freq_base and
// rope.scaling apply to the global layers only. final_logit_softcapping: default 0 (none). The query
// scale is 1/sqrt(head_dim), except 1/sqrt(n_embd / n_head) for the 62-layer 27B.
#include <cmath>

#include "compiler/model/architectures.h"
#include "compiler/model/swa_pattern.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

namespace minfer::model {
namespace {

llvm::Error forward(GraphBuilder& g) {
  const ModelConfig& c = g.config();
  const std::string p = c.architecture + ".";
  auto window = g.file().getU32Or(p + "attention.sliding_window", 0);
  if (!window) return window.takeError();
  std::vector<bool> local(c.n_layer, false);  // no window: every layer global
  float base_swa = 10000.0f;
  if (*window > 0) {
    auto layers = readSwaLayers(g.file(), p + "attention.sliding_window_pattern", c.n_layer, 6);
    if (!layers) return layers.takeError();
    local = std::move(*layers);
    auto base = g.file().getF32Or(p + "rope.freq_base_swa", base_swa);
    if (!base) return base.takeError();
    if (!(*base > 0) || !std::isfinite(*base))
      return g.error(llvm::formatv("{0}rope.freq_base_swa = {1} must be finite and > 0", p, llvm::format("%g", *base)));
    base_swa = *base;
  }
  auto final_cap = g.file().getF32Or(p + "final_logit_softcapping", 0.0f);
  if (!final_cap) return final_cap.takeError();
  if (!(*final_cap >= 0) || !std::isfinite(*final_cap))
    return g.error(llvm::formatv("{0}final_logit_softcapping = {1} must be finite and >= 0", p,
                                 llvm::format("%g", *final_cap)));
  // gemma_pytorch's query_pre_attn_scalar, which llama.cpp picks by model size (no GGUF key).
  const bool is_27b = c.n_layer == 62;
  const float q_scale = is_27b ? 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head))
                               : 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  if (auto e = g.embedding()) return e;
  const Activations& a = g.act();
  g.scale("token_embd.scale", a.x, a.x, std::sqrt(static_cast<float>(c.n_embd)));
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    if (auto e = g.decoderLayer(
            l, {.qkv = {.head_norm = true},
                .rope = local[l] ? RopeOptions{.freq_base = base_swa, .freq_scale = 1.0f} : RopeOptions{},
                .attention = {.scale = q_scale, .window = local[l] ? *window : 0},
                .post_norms = true,
                .activation = FfnActivation::kGeluTanh}))
      return e;
  }
  if (auto e = g.outputHead(a.x)) return e;
  if (*final_cap > 0) g.scale("output.softcap", a.logits, a.logits, 1.0f, *final_cap);
  return llvm::Error::success();
}

}  // namespace

extern const Architecture kGemma3 = {"gemma3", {.rope_style = fb::RopeStyle::Neox}, forward};

}  // namespace minfer::model
