// Op family Rope → kernels/rope.cuh: rotary position embedding of q and k, in place, with the
// optional per-pair frequency factors (weight 0, rope_freqs: n_rot/2 f32 values) of Llama 3.1+ and
// YaRN scaling (its ramp ends and cos/sin scale baked in as constants); q and k may be column views
// (format 1.4: their buffers' widths become the ROPE_Q_PITCH / ROPE_K_PITCH constants).
#include "compiler/codegen/ops/op_family.h"
#include "kernels/rope.cuh"

namespace minfer::codegen {

Launches ropeLaunches(const StepContext& c) {
  const model::StepDesc& s = c.step();
  auto q = c.input(0, "q");
  if (!q) return q.takeError();
  auto k = c.input(1, "k");
  if (!k) return k.takeError();
  // q and k may be column views of one buffer (format 1.4, phi3): widths are the views', pitches the buffers'.
  const model::ColumnView qv = c.inputView(0), kv = c.inputView(1);
  if (auto e = checkHeads(c, qv.width, kv.width)) return e;
  const bool views = qv.width != (*q)->width || kv.width != (*k)->width;
  if (s.n_rot % 2 != 0 || s.n_rot > s.head_dim || s.n_rot == 0)
    return c.error(llvm::formatv("n_rot {0} must be even and in 2..head_dim {1}", s.n_rot, s.head_dim));
  const bool neox = s.rope_style == fb::RopeStyle::Neox;
  std::string key = llvm::formatv("rope_{0}_h{1}_hkv{2}_d{3}_r{4}_b{5}", neox ? "neox" : "norm", s.n_head, s.n_head_kv,
                                  s.head_dim, s.n_rot, keyNumber(s.rope_freq_base));
  if (s.rope_freq_scale != 1.0f) key += "_s" + keyNumber(s.rope_freq_scale);
  const bool freq_factors = !s.weights.empty();
  const StrideTable* ff = nullptr;
  if (freq_factors) {
    auto plane = c.vector(0, s.n_rot / 2);
    if (!plane) return plane.takeError();
    ff = *plane;
    key += "_ff";  // the values are a runtime operand; only their presence is compiled in
  }
  // YaRN and the cos/sin scale (format 1.3): constants derived once, as the CPU reference derives them.
  const kern::RopeYarn yarn = kern::ropeYarn(static_cast<int>(s.n_rot), s.rope_freq_base, s.rope_freq_scale,
                                             s.rope_ext_factor, s.rope_attn_factor, s.rope_beta_fast,
                                             s.rope_beta_slow, s.rope_n_ctx_orig);
  const bool mix = yarn.ext_factor != 0.0f;
  if (mix)
    key += "_yarn" + keyNumber(yarn.ext_factor) + "_lo" + keyNumber(yarn.corr_lo) + "_hi" + keyNumber(yarn.corr_hi);
  if (yarn.mscale != 1.0f) key += "_m" + keyNumber(yarn.mscale);
  if (views) key += llvm::formatv("_qp{0}_kp{1}", (*q)->width, (*k)->width).str();
  SpecBuilder b(key, "kernels/rope.cuh", "minfer_rope");
  b.define("ROPE_NHEAD", static_cast<uint64_t>(s.n_head))
      .define("ROPE_NHEAD_KV", static_cast<uint64_t>(s.n_head_kv))
      .define("ROPE_HEAD_DIM", static_cast<uint64_t>(s.head_dim))
      .define("ROPE_NROT", static_cast<uint64_t>(s.n_rot))
      .define("ROPE_NEOX", static_cast<uint64_t>(neox))
      .define("ROPE_BASE", floatLiteral(s.rope_freq_base))
      .define("ROPE_SCALE", floatLiteral(s.rope_freq_scale))
      .define("ROPE_FREQ_FACTORS", static_cast<uint64_t>(freq_factors));
  if (mix)
    b.define("ROPE_YARN", uint64_t{1})
        .define("ROPE_EXT_FACTOR", floatLiteral(yarn.ext_factor))
        .define("ROPE_CORR_LO", floatLiteral(yarn.corr_lo))
        .define("ROPE_CORR_HI", floatLiteral(yarn.corr_hi));
  if (yarn.mscale != 1.0f) b.define("ROPE_MSCALE", floatLiteral(yarn.mscale));
  if (views) b.define("ROPE_Q_PITCH", uint64_t{(*q)->width}).define("ROPE_K_PITCH", uint64_t{(*k)->width});
  b.flag("--fmad=false");  // rotation rounded like the CPU reference
  KernelLaunch l{b.spec, {}, kern::ropeLaunchRule(s.n_head, s.n_head_kv)};
  l.args = {viewArg("q", c.inputId(0), (*q)->width, qv, fb::Access::ReadWrite),
            viewArg("k", c.inputId(1), (*k)->width, kv, fb::Access::ReadWrite),
            ff ? weightArg("freq_factors", c.weightId(0), *ff) : kindArg(fb::ArgKind::Null, "freq_factors"),
            kindArg(fb::ArgKind::Positions, "pos"), kindArg(fb::ArgKind::TokenCount, "n_tokens")};
  return std::vector<KernelLaunch>{std::move(l)};
}

}  // namespace minfer::codegen
