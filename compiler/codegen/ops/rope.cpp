// Op family Rope → kernels/rope.cuh: rotary position embedding of q and k, in place, with the
// optional per-pair frequency factors (weight 0, rope_freqs: n_rot/2 f32 values) of Llama 3.1+.
#include "compiler/codegen/ops/op_family.h"
#include "kernels/rope.cuh"

namespace minfer::codegen {

Launches ropeLaunches(const StepContext& c) {
  const model::StepDesc& s = c.step();
  auto q = c.input(0, "q");
  if (!q) return q.takeError();
  auto k = c.input(1, "k");
  if (!k) return k.takeError();
  if (auto e = checkHeads(c, (*q)->width, (*k)->width)) return e;
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
  SpecBuilder b(key, "kernels/rope.cuh", "minfer_rope");
  b.define("ROPE_NHEAD", static_cast<uint64_t>(s.n_head))
      .define("ROPE_NHEAD_KV", static_cast<uint64_t>(s.n_head_kv))
      .define("ROPE_HEAD_DIM", static_cast<uint64_t>(s.head_dim))
      .define("ROPE_NROT", static_cast<uint64_t>(s.n_rot))
      .define("ROPE_NEOX", static_cast<uint64_t>(neox))
      .define("ROPE_BASE", floatLiteral(s.rope_freq_base))
      .define("ROPE_SCALE", floatLiteral(s.rope_freq_scale))
      .define("ROPE_FREQ_FACTORS", static_cast<uint64_t>(freq_factors))
      .flag("--fmad=false");  // rotation rounded like the CPU reference
  KernelLaunch l{b.spec, {}, kern::ropeLaunchRule(s.n_head, s.n_head_kv)};
  l.args = {activationArg("q", c.inputId(0), (*q)->width, fb::Access::ReadWrite),
            activationArg("k", c.inputId(1), (*k)->width, fb::Access::ReadWrite),
            ff ? weightArg("freq_factors", c.weightId(0), *ff) : kindArg(fb::ArgKind::Null, "freq_factors"),
            kindArg(fb::ArgKind::Positions, "pos"), kindArg(fb::ArgKind::TokenCount, "n_tokens")};
  return std::vector<KernelLaunch>{std::move(l)};
}

}  // namespace minfer::codegen
