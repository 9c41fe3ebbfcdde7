// CPU op family Rope: RoPE of q and k in place at the batch's positions (cpu::rope), with the
// optional per-pair frequency factors (weight 0: rope_freqs, n_rot/2 f32 values) for q and k alike, and
// YaRN (format 1.3's Step.rope_ext_factor … rope_n_ctx_orig, llama.cpp's ggml_rope_ext parameters);
// q and k may be column views (format 1.4: phi3's fused q|k|v rows).
#include <cmath>

#include "runtime/cpu/cpu_step.h"

namespace minfer::cpu {

Status ropePrepare(PrepareContext& c, const fb::Step& s, StepInfo& info) {
  MINFER_RETURN_IF_ERROR(positive(info, s.n_head(), "n_head"));
  MINFER_RETURN_IF_ERROR(positive(info, s.n_head_kv(), "n_head_kv"));
  MINFER_RETURN_IF_ERROR(positive(info, s.head_dim(), "head_dim"));
  for (int i = 0; i < 2; ++i)
    if (info.out[i] != info.in[i] || info.out_off[i] != info.in_off[i] || info.out_w[i] != info.in_w[i])
      return Status::error(info.label + ": works in place, but its outputs (or their column views) differ from its inputs");
  if (s.n_rot() % 2 != 0 || s.n_rot() > s.head_dim() || s.n_rot() > static_cast<uint32_t>(kMaxRot))
    return Status::error(info.label + ": n_rot = " + std::to_string(s.n_rot()) +
                         " must be even and ≤ head_dim = " + std::to_string(s.head_dim()) + " and ≤ " +
                         std::to_string(kMaxRot));
  if (!(s.rope_freq_base() > 0) || !(s.rope_freq_scale() > 0))
    return Status::error(info.label + ": rope_freq_base = " + std::to_string(s.rope_freq_base()) +
                         ", rope_freq_scale = " + std::to_string(s.rope_freq_scale()) + " must be > 0");
  if (s.rope_style() != fb::RopeStyle::Norm && s.rope_style() != fb::RopeStyle::Neox)
    return Status::error(info.label + ": unknown rope_style " + std::to_string(static_cast<int>(s.rope_style())));
  info.n_head = static_cast<int>(s.n_head());
  info.n_head_kv = static_cast<int>(s.n_head_kv());
  info.head_dim = static_cast<int>(s.head_dim());
  info.n_rot = static_cast<int>(s.n_rot());
  info.rope_style = s.rope_style() == fb::RopeStyle::Neox ? RopeStyle::kNeox : RopeStyle::kNorm;
  info.rope_base = s.rope_freq_base();
  info.rope_scale = s.rope_freq_scale();
  // 1.3: YaRN and the cos/sin scale (an older artifact reads the defaults: none, 1).
  const bool yarn = s.rope_ext_factor() != 0.0f;
  if (!(s.rope_ext_factor() >= 0 && s.rope_ext_factor() <= 1) || !(s.rope_attn_factor() > 0) ||
      !std::isfinite(s.rope_attn_factor()) || !(s.rope_beta_fast() > 0) || !std::isfinite(s.rope_beta_fast()) ||
      !(s.rope_beta_slow() > 0) || !std::isfinite(s.rope_beta_slow()) || (yarn && s.rope_n_ctx_orig() == 0))
    return Status::error(info.label + ": YaRN parameters rope_ext_factor = " + std::to_string(s.rope_ext_factor()) +
                         ", rope_attn_factor = " + std::to_string(s.rope_attn_factor()) + ", rope_beta_fast = " +
                         std::to_string(s.rope_beta_fast()) + ", rope_beta_slow = " + std::to_string(s.rope_beta_slow()) +
                         ", rope_n_ctx_orig = " + std::to_string(s.rope_n_ctx_orig()) +
                         " (need ext_factor in [0, 1], finite factors and betas > 0, n_ctx_orig ≥ 1 with YaRN)");
  info.rope_yarn = kern::ropeYarn(static_cast<int>(s.n_rot()), s.rope_freq_base(), s.rope_freq_scale(),
                                  s.rope_ext_factor(), s.rope_attn_factor(), s.rope_beta_fast(), s.rope_beta_slow(),
                                  s.rope_n_ctx_orig());
  if (count(s.weights()) == 1) {  // info.vec: the frequency factors (null without them)
    Result<const float*> ff = c.vectorWeight(s.weights()->Get(0), s.n_rot() / 2, info.label);
    if (!ff) return ff.takeStatus();
    for (uint32_t i = 0; i < s.n_rot() / 2; ++i)
      if (!((*ff)[i] > 0) || !std::isfinite((*ff)[i]))
        return Status::error(info.label + ": frequency factor " + std::to_string(i) + " = " +
                             std::to_string((*ff)[i]) + " must be finite and > 0");
    info.vec = *ff;
  }
  MINFER_RETURN_IF_ERROR(c.operand(info, true, 0, uint64_t{s.n_head()} * s.head_dim(), "q"));
  MINFER_RETURN_IF_ERROR(c.operand(info, true, 1, uint64_t{s.n_head_kv()} * s.head_dim(), "k"));
  if (info.in[0] == info.in[1] && info.in_off[0] < info.in_off[1] + info.in_w[1] &&
      info.in_off[1] < info.in_off[0] + info.in_w[0])
    return Status::error(info.label + ": the q and k views of buffer " + std::to_string(info.in[0]) + " overlap");
  return Status::ok();
}

void ropeRun(RunContext& c, const StepInfo& s) {
  rope(c.in(s, 0), c.n, s.n_head, s.head_dim, s.n_rot, s.rope_style, s.rope_base, s.rope_scale, c.kv.pos, s.vec,
       s.rope_yarn, s.in_pitch[0]);
  rope(c.in(s, 1), c.n, s.n_head_kv, s.head_dim, s.n_rot, s.rope_style, s.rope_base, s.rope_scale, c.kv.pos, s.vec,
       s.rope_yarn, s.in_pitch[1]);
}

}  // namespace minfer::cpu
