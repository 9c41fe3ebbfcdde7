// Op family Rope → kernels/rope.cuh: rotary position embedding of q and k, in place, with the
// optional per-pair frequency factors (weight 0, rope_freqs: n_rot/2 f32 values) of Llama 3.1+ and
// YaRN scaling (its ramp ends and cos/sin scale baked in as constants); q and k may be column views
// (format 1.4: their buffers' widths become the ROPE_Q_PITCH / ROPE_K_PITCH constants). With the two
// HeadRmsNorm steps before it fused in (ops/fusion.cpp), minfer_head_norm_rope, in decode with the Attention
// after it too minfer_head_norm_rope_kv (the KV-cache store in the same launch).
#include "compiler/codegen/ops/op_family.h"
#include "kernels/rope.cuh"

namespace minfer::codegen {

llvm::Expected<RopeConstants> ropeConstants(const StepContext& c) {
  const model::StepDesc& s = c.step();
  if (s.n_rot % 2 != 0 || s.n_rot > s.head_dim || s.n_rot == 0)
    return c.error(llvm::formatv("n_rot {0} must be even and in 2..head_dim {1}", s.n_rot, s.head_dim));
  RopeConstants r;
  const bool neox = s.rope_style == fb::RopeStyle::Neox;
  r.key = llvm::formatv("{0}_r{1}_b{2}", neox ? "neox" : "norm", s.n_rot, keyNumber(s.rope_freq_base));
  if (s.rope_freq_scale != 1.0f) r.key += "_s" + keyNumber(s.rope_freq_scale);
  if (!s.weights.empty()) {
    auto plane = c.vector(0, s.n_rot / 2);
    if (!plane) return plane.takeError();
    r.freq_factors = *plane;
    r.key += "_ff";  // the values are a runtime operand; only their presence is compiled in
  }
  // YaRN and the cos/sin scale (format 1.3): constants derived once, as the CPU reference derives them.
  const kern::RopeYarn yarn = kern::ropeYarn(static_cast<int>(s.n_rot), s.rope_freq_base, s.rope_freq_scale,
                                             s.rope_ext_factor, s.rope_attn_factor, s.rope_beta_fast,
                                             s.rope_beta_slow, s.rope_n_ctx_orig);
  const bool mix = yarn.ext_factor != 0.0f;
  if (mix)
    r.key += "_yarn" + keyNumber(yarn.ext_factor) + "_lo" + keyNumber(yarn.corr_lo) + "_hi" + keyNumber(yarn.corr_hi);
  if (yarn.mscale != 1.0f) r.key += "_m" + keyNumber(yarn.mscale);
  r.defines = {{"ROPE_NROT", std::to_string(s.n_rot)},
               {"ROPE_NEOX", neox ? "1" : "0"},
               {"ROPE_BASE", floatLiteral(s.rope_freq_base)},
               {"ROPE_SCALE", floatLiteral(s.rope_freq_scale)},
               {"ROPE_FREQ_FACTORS", r.freq_factors ? "1" : "0"}};
  if (mix) {
    r.defines.push_back({"ROPE_YARN", "1"});
    r.defines.push_back({"ROPE_EXT_FACTOR", floatLiteral(yarn.ext_factor)});
    r.defines.push_back({"ROPE_CORR_LO", floatLiteral(yarn.corr_lo)});
    r.defines.push_back({"ROPE_CORR_HI", floatLiteral(yarn.corr_hi)});
  }
  if (yarn.mscale != 1.0f) r.defines.push_back({"ROPE_MSCALE", floatLiteral(yarn.mscale)});
  return r;
}

KernelArgDesc freqFactorsArg(const StepContext& c, const RopeConstants& r) {
  return r.freq_factors ? weightArg("freq_factors", c.weightId(0), *r.freq_factors)
                        : kindArg(fb::ArgKind::Null, "freq_factors");
}

// minfer_rope (kernels/rope.cuh; positions pos0 + t) or, `paged`, minfer_rope_paged (kernels/paged_attention.cuh;
// each row's own position, ArgKind RowPositions): the same rotation constants, rounding and launch shape.
Launches ropeLaunchesOf(const StepContext& c, bool paged) {
  const model::StepDesc& s = c.step();
  auto q = c.input(0, "q");
  if (!q) return q.takeError();
  auto k = c.input(1, "k");
  if (!k) return k.takeError();
  // q and k may be column views of one buffer (format 1.4, phi3): widths are the views', pitches the buffers'.
  const model::ColumnView qv = c.inputView(0), kv = c.inputView(1);
  if (auto e = checkHeads(c, qv.width, kv.width)) return e;
  const bool views = qv.width != (*q)->width || kv.width != (*k)->width;
  auto rc = ropeConstants(c);
  if (!rc) return rc.takeError();
  std::string key = llvm::formatv("{0}_h{1}_hkv{2}_d{3}_{4}", paged ? "rope_paged" : "rope", s.n_head, s.n_head_kv,
                                  s.head_dim, rc->key);
  if (views) key += llvm::formatv("_qp{0}_kp{1}", (*q)->width, (*k)->width).str();
  SpecBuilder b(key, paged ? "kernels/paged_attention.cuh" : "kernels/rope.cuh",
                paged ? "minfer_rope_paged" : "minfer_rope");
  if (paged) b.define("PA_ROPE", uint64_t{1});
  b.define(paged ? "PA_NHEAD" : "ROPE_NHEAD", static_cast<uint64_t>(s.n_head))
      .define(paged ? "PA_NHEAD_KV" : "ROPE_NHEAD_KV", static_cast<uint64_t>(s.n_head_kv))
      .define(paged ? "PA_HEAD_DIM" : "ROPE_HEAD_DIM", static_cast<uint64_t>(s.head_dim));
  for (const auto& [name, value] : rc->defines) b.define(name, value);
  if (views)
    b.define(paged ? "PA_Q_PITCH" : "ROPE_Q_PITCH", uint64_t{(*q)->width})
        .define(paged ? "PA_K_PITCH" : "ROPE_K_PITCH", uint64_t{(*k)->width});
  b.flag("--fmad=false");  // rotation rounded like the CPU reference
  KernelLaunch l{b.spec, {}, kern::ropeLaunchRule(s.n_head, s.n_head_kv)};
  l.args = {viewArg("q", c.inputId(0), (*q)->width, qv, fb::Access::ReadWrite),
            viewArg("k", c.inputId(1), (*k)->width, kv, fb::Access::ReadWrite), freqFactorsArg(c, *rc),
            kindArg(paged ? fb::ArgKind::RowPositions : fb::ArgKind::Positions, "pos"),
            kindArg(fb::ArgKind::TokenCount, "n_tokens")};
  return std::vector<KernelLaunch>{std::move(l)};
}

Launches ropeLaunches(const StepContext& c) { return ropeLaunchesOf(c, false); }

namespace {

// minfer_head_norm_rope (kernels/rope.cuh ROPE_NORM_EPS): the two HeadRmsNorm steps' weights and epsilon, the
// Rope step's heads and rotation constants; `paged`: ROPE_ROW_POSITIONS (each row's own position, ArgKind
// RowPositions) for a batch session's paged launch. With `attention` (the decode Attention of q, k and v after
// the Rope), minfer_head_norm_rope_kv (ROPE_KV_STORE): it also stores k and v into that layer's caches.
Launches headNormRope(const StepContext& qn, const StepContext& kn, const StepContext& rope, bool paged,
                      const StepContext* attention) {
  if (!fusesHeadNormRope(qn, kn, rope))
    return qn.error("cannot run with the k HeadRmsNorm and the Rope after it as one launch (fusesHeadNormRope)");
  if (attention && (paged || !fusesHeadNormRopeStore(rope, *attention)))
    return qn.error("cannot store K and V for the attention after its Rope (fusesHeadNormRopeStore)");
  const model::StepDesc& s = rope.step();
  auto q = rope.input(0, "q");
  if (!q) return q.takeError();
  auto k = rope.input(1, "k");
  if (!k) return k.takeError();
  if (auto e = checkHeads(rope, (*q)->width, (*k)->width)) return e;
  auto wq = qn.vector(0, s.head_dim);
  if (!wq) return wq.takeError();
  auto wk = kn.vector(0, s.head_dim);
  if (!wk) return wk.takeError();
  auto rc = ropeConstants(rope);
  if (!rc) return rc.takeError();
  const float eps = qn.step().eps;
  const uint32_t ring = attention ? attention->step().kv_ring : 0;
  const std::string store = !attention ? "" : ring != 0 ? "_kv_ring" + std::to_string(ring) : "_kv";
  SpecBuilder b(llvm::formatv("head_norm_rope{0}{1}_h{2}_hkv{3}_d{4}_eps{5}_{6}", store, paged ? "_paged" : "", s.n_head,
                              s.n_head_kv, s.head_dim, keyNumber(eps), rc->key),
                "kernels/rope.cuh", attention ? "minfer_head_norm_rope_kv" : "minfer_head_norm_rope");
  b.define("ROPE_NHEAD", static_cast<uint64_t>(s.n_head))
      .define("ROPE_NHEAD_KV", static_cast<uint64_t>(s.n_head_kv))
      .define("ROPE_HEAD_DIM", static_cast<uint64_t>(s.head_dim));
  for (const auto& [name, value] : rc->defines) b.define(name, value);
  b.define("ROPE_NORM_EPS", floatLiteral(eps));
  if (paged) b.define("ROPE_ROW_POSITIONS", uint64_t{1});
  if (attention) b.define("ROPE_KV_STORE", uint64_t{1});
  if (ring != 0) b.define("ROPE_KV_RING", static_cast<uint64_t>(ring));  // the cache slot p % ring (Step.kv_ring)
  b.flag("--fmad=false");  // rotation rounded as minfer_rope (the norm's operations are explicit intrinsics)
  KernelLaunch l{b.spec, {}, kern::headNormRopeLaunchRule(s.n_head, s.n_head_kv)};
  l.args = {activationArg("q", rope.inputId(0), (*q)->width, fb::Access::ReadWrite),
            activationArg("k", rope.inputId(1), (*k)->width, fb::Access::ReadWrite)};
  const uint32_t kv_width = (*k)->width;
  if (attention) {
    auto v = attention->input(2, "v");
    if (!v) return v.takeError();
    l.args.push_back(activationArg("v", attention->inputId(2), (*v)->width, fb::Access::Read));
  }
  l.args.insert(l.args.end(), {weightArg("wq", qn.weightId(0), **wq), weightArg("wk", kn.weightId(0), **wk),
                               freqFactorsArg(rope, *rc)});
  if (attention) {
    const uint32_t layer = static_cast<uint32_t>(attention->step().layer);
    l.args.push_back({.kind = fb::ArgKind::KCache, .name = "kc", .access = fb::Access::Write, .width = kv_width, .layer = layer});
    l.args.push_back({.kind = fb::ArgKind::VCache, .name = "vc", .access = fb::Access::Write, .width = kv_width, .layer = layer});
  }
  l.args.push_back(kindArg(paged ? fb::ArgKind::RowPositions : fb::ArgKind::Positions, "pos"));
  l.args.push_back(kindArg(fb::ArgKind::TokenCount, "n_tokens"));
  return std::vector<KernelLaunch>{std::move(l)};
}

}  // namespace

Launches headNormRopeLaunches(const StepContext& qn, const StepContext& kn, const StepContext& rope, bool paged) {
  return headNormRope(qn, kn, rope, paged, nullptr);
}

bool fusesHeadNormRopeStore(const StepContext& rope, const StepContext& attention) {
  const model::StepDesc &r = rope.step(), &a = attention.step();
  if (rope.prefill() || a.op != fb::OpKind::Attention || a.inputs.size() != 3 || !a.input_views.empty() ||
      !a.output_views.empty() || a.layer < 0 || r.inputs.size() != 2)
    return false;
  return a.inputs[0] == r.inputs[0] && a.inputs[1] == r.inputs[1] && a.inputs[2] != r.inputs[0] &&
         a.inputs[2] != r.inputs[1] && a.n_head == r.n_head && a.n_head_kv == r.n_head_kv && a.head_dim == r.head_dim;
}

Launches headNormRopeAttentionLaunches(const StepContext& qn, const StepContext& kn, const StepContext& rope,
                                       const StepContext& attention, const StepContext* quant) {
  auto first = headNormRope(qn, kn, rope, false, &attention);
  if (!first) return first.takeError();
  auto after = storedAttentionLaunches(attention, quant);
  if (!after) return after.takeError();
  for (KernelLaunch& l : *after) first->push_back(std::move(l));
  return first;
}

}  // namespace minfer::codegen
