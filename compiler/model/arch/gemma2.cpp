// gemma2 (Gemma 2): the embedding scaled by sqrt(n_embd); RMSNorm before and after attention and FFN
// (attn_norm, post_attention_norm, ffn_norm, post_ffw_norm); RoPE on the pairs (i, i + n_rot / 2)
// ("neox"); attention logits soft-capped, every other layer local (sliding window); a GELU-tanh gated
// FFN; output tied to token_embd (or output.weight) and the logits soft-capped.
// Hyperparameters as llama.cpp's llama_model::load_hparams reads them for LLM_ARCH_GEMMA2 (fixtures
// README §8.1, §8.7): attention.sliding_window (default 4096), attn_logit_softcapping (default 50),
// final_logit_softcapping (default 30); local layers are the even ones (set_swa_pattern(2)): llama.cpp
// never reads attention.sliding_window_pattern for gemma2, in either form, and neither do we;
// the query scale is 1/sqrt(head_dim), except 1/sqrt(n_embd / n_head) for the 46-layer 27B.
#include <cmath>

#include "compiler/model/architectures.h"
#include "compiler/model/swa_pattern.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

namespace minfer::model {
namespace {

constexpr uint32_t kSwaPeriod = 2;  // layer il is local iff il % 2 < 1: the even layers

// A softcap key: absent → `fallback`; present → finite and > 0.
llvm::Expected<float> readCap(GraphBuilder& g, const std::string& key, float fallback) {
  auto v = g.file().getF32Or(key, fallback);
  if (!v) return v.takeError();
  if (!(*v > 0) || !std::isfinite(*v))
    return g.error(llvm::formatv("{0} = {1} must be finite and > 0", key, llvm::format("%g", *v)));
  return *v;
}

llvm::Error forward(GraphBuilder& g) {
  const ModelConfig& c = g.config();
  const std::string p = c.architecture + ".";
  auto window = g.file().getU32Or(p + "attention.sliding_window", 4096);
  if (!window) return window.takeError();
  if (*window == 0) return g.error(llvm::formatv("{0}attention.sliding_window = 0: no key would be visible", p));
  auto attn_cap = readCap(g, p + "attn_logit_softcapping", 50.0f);
  if (!attn_cap) return attn_cap.takeError();
  auto final_cap = readCap(g, p + "final_logit_softcapping", 30.0f);
  if (!final_cap) return final_cap.takeError();
  // gemma_pytorch's query_pre_attn_scalar, which llama.cpp picks by model size (no GGUF key).
  const bool is_27b = c.n_layer == 46;
  const float q_scale = is_27b ? 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head))
                               : 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  if (auto e = g.embedding()) return e;
  const Activations& a = g.act();
  g.scale("token_embd.scale", a.x, a.x, std::sqrt(static_cast<float>(c.n_embd)));
  const std::vector<bool> local = swaLayersFromPeriod(kSwaPeriod, c.n_layer);
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    const uint32_t layer_window = local[l] ? *window : 0;
    if (auto e = g.decoderLayer(l, {.attention = {.scale = q_scale, .softcap = *attn_cap, .window = layer_window},
                                    .post_norms = true,
                                    .activation = FfnActivation::kGeluTanh}))
      return e;
  }
  if (auto e = g.outputHead(a.x)) return e;
  g.scale("output.softcap", a.logits, a.logits, 1.0f, *final_cap);
  return llvm::Error::success();
}

}  // namespace

extern const Architecture kGemma2 = {"gemma2", {.rope_style = fb::RopeStyle::Neox}, forward};

}  // namespace minfer::model
