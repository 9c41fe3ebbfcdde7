// Paged launches (schema Step.paged_launches, format 1.6) → kernels/paged_attention.cuh: what a batch session
// runs for the Rope and Attention steps (and a fused QKV GEMV's chain) instead of their launches: per-row positions and block tables into a
// paged KV pool (minfer_rope_paged; minfer_kv_store_paged + minfer_attn_paged, in the decode plan with the
// fused QuantizeAct's q8 output when the step has it). Every other step's launches are row-wise and serve a
// batch of rows from several sequences as they are.
#include <optional>

#include "compiler/codegen/ops/op_family.h"
#include "kernels/paged_attention.cuh"

namespace minfer::codegen {
namespace {

KernelArgDesc pagedCacheArg(fb::ArgKind kind, const char* name, uint32_t layer, uint32_t width, fb::Access access) {
  return {.kind = kind, .name = name, .access = access, .width = width, .layer = layer};
}

// `quant`: the decode plan's QuantizeAct fused into the attention (its output's q8 form, PA_Q8), or null.
Launches pagedAttention(const StepContext& c, const StepContext* quant) {
  const model::StepDesc& s = c.step();
  auto q = c.input(0, "q");
  if (!q) return q.takeError();
  auto k = c.input(1, "k");
  if (!k) return k.takeError();
  auto v = c.input(2, "v");
  if (!v) return v.takeError();
  auto out = c.output(0, "output");
  if (!out) return out.takeError();
  const model::ColumnView qv = c.inputView(0), kv = c.inputView(1), vv = c.inputView(2);
  if (auto e = checkHeads(c, qv.width, kv.width)) return e;
  if (vv.width != kv.width || (*out)->width != qv.width)
    return c.error(llvm::formatv("v width {0} must equal k width {1}, and the output width {2} q width {3}", vv.width,
                                 kv.width, (*out)->width, qv.width));
  if (s.layer < 0) return c.error("attention step without a KV cache layer");
  const uint32_t h = s.n_head, hkv = s.n_head_kv, d = s.head_dim, layer = static_cast<uint32_t>(s.layer);
  // The SIMT kernel keeps every query head of a kv head's group in static shared memory (≤ 48 KiB,
  // pagedAttnSmemBytes; the tensor-core form only their maxima and sums): a wider group gets no paged launches,
  // and its batch sessions run sequentially (as the decode kernel, whose shared memory is the same, could not be
  // compiled for it either).
  if (kern::pagedAttnSmemBytes(h, hkv, d) > 48u * 1024u) return std::vector<KernelLaunch>{};
  if (quant && d % 32 != 0) return std::vector<KernelLaunch>{};  // no q8 form for such heads: no paged launches
  if (quant)
    if (llvm::Error e = checkFusedQuantize(*quant, (*out)->width)) return e;
  const uint32_t kv_width = hkv * d, q_pitch = (*q)->width, k_pitch = (*k)->width, v_pitch = (*v)->width;
  const bool kv_views = k_pitch != kv.width || v_pitch != vv.width, q_view = q_pitch != qv.width;
  // The same key parts and constants as the single-sequence attention (ops/attention.cpp).
  std::string opts;
  if (s.scale != 0) opts += "_sc" + keyNumber(s.scale);
  if (s.softcap != 0) opts += "_cap" + keyNumber(s.softcap);
  if (s.window != 0) opts += "_win" + std::to_string(s.window);
  auto heads = [&](SpecBuilder& b) -> SpecBuilder& {
    return b.define("ATT_NHEAD", static_cast<uint64_t>(h))
        .define("ATT_NHEAD_KV", static_cast<uint64_t>(hkv))
        .define("ATT_HEAD_DIM", static_cast<uint64_t>(d));
  };
  const KernelArgDesc pos = kindArg(fb::ArgKind::RowPositions, "pos"), tables = kindArg(fb::ArgKind::BlockTables, "tables"),
                      bs = kindArg(fb::ArgKind::BlockSize, "block_size"), ntok = kindArg(fb::ArgKind::TokenCount, "n_tokens");

  std::vector<KernelLaunch> launches;
  const std::string kv_tag = kv_views ? llvm::formatv("_kp{0}_vp{1}", k_pitch, v_pitch).str() : "";
  SpecBuilder store(llvm::formatv("kv_store_paged_hkv{0}_d{1}{2}", hkv, d, kv_tag), "kernels/paged_attention.cuh",
                    "minfer_kv_store_paged");
  heads(store).define("PA_KV_STORE", uint64_t{1});
  if (kv_views) store.define("ATT_K_PITCH", uint64_t{k_pitch}).define("ATT_V_PITCH", uint64_t{v_pitch});
  launches.push_back({store.spec,
                      {viewArg("k", c.inputId(1), k_pitch, kv, fb::Access::Read),
                       viewArg("v", c.inputId(2), v_pitch, vv, fb::Access::Read),
                       pagedCacheArg(fb::ArgKind::KCache, "kc", layer, kv_width, fb::Access::Write),
                       pagedCacheArg(fb::ArgKind::VCache, "vc", layer, kv_width, fb::Access::Write), pos, tables, bs, ntok},
                      kern::pagedKvStoreLaunchRule(hkv, d)});
  const std::string q_tag = q_view ? llvm::formatv("_qp{0}", q_pitch).str() : "";
  SpecBuilder b(llvm::formatv("attn_paged_h{0}_hkv{1}_d{2}{3}{4}{5}", h, hkv, d, opts, q_tag, quant ? "_q8" : ""),
                "kernels/paged_attention.cuh", "minfer_attn_paged");
  heads(b).define("PA_ATTN", uint64_t{1});
  if (quant) b.define("PA_Q8", uint64_t{1});
  if (s.scale != 0) b.define("ATT_SCALE", floatLiteral(s.scale));
  if (s.softcap != 0) b.define("ATT_SOFTCAP", floatLiteral(s.softcap));
  if (s.window != 0) b.define("ATT_WINDOW", static_cast<uint64_t>(s.window));
  if (q_view) b.define("ATT_Q_PITCH", uint64_t{q_pitch});
  KernelLaunch attn{b.spec,
                    {viewArg("q", c.inputId(0), q_pitch, qv, fb::Access::Read),
                     pagedCacheArg(fb::ArgKind::KCache, "kc", layer, kv_width, fb::Access::Read),
                     pagedCacheArg(fb::ArgKind::VCache, "vc", layer, kv_width, fb::Access::Read),
                     activationArg("out", c.outputId(0), qv.width, fb::Access::Write)},
                    kern::pagedAttnLaunchRule(h, hkv, d)};
  if (quant) pushQ8Args(attn.args, "qs", "meta", quant->outputId(0), qv.width, fb::Access::Write);
  attn.args.insert(attn.args.end(), {pos, tables, bs, ntok});
  launches.push_back(std::move(attn));
  return launches;
}

}  // namespace

Launches pagedLaunchesForStep(const model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts,
                              PlanVariant variant, size_t step_index, size_t followers,
                              std::optional<size_t> input_norm_step) {
  const StepContext c(desc, layouts, variant, step_index);
  const auto& steps = planSteps(desc.plan, variant);
  if (followers == 0 && c.step().op == fb::OpKind::Rope) return ropeLaunchesOf(c, true);
  if (followers == 0 && c.step().op == fb::OpKind::Attention) return pagedAttention(c, nullptr);
  // HeadRmsNorm q, HeadRmsNorm k and their Rope in one launch (ops/fusion.cpp): the same, at per-row positions.
  if (followers == 2 && headNormRopeChain(steps, step_index)) {
    const auto ctx = [&](size_t k) { return StepContext(desc, layouts, variant, step_index + k); };
    return headNormRopeLaunches(c, ctx(1), ctx(2), true);
  }
  // The same with the decode Attention (and its QuantizeAct) fused in (minfer_head_norm_rope_kv): the paged
  // launch above, then the attention's paged KV store and attention.
  if (followers >= 3 && headNormRopeChain(steps, step_index)) {
    const auto ctx = [&](size_t k) { return StepContext(desc, layouts, variant, step_index + k); };
    auto all = headNormRopeLaunches(c, ctx(1), ctx(2), true);
    if (!all) return all.takeError();
    std::optional<StepContext> quant;
    if (followers == 4) quant.emplace(ctx(4));
    auto att = pagedAttention(ctx(3), quant ? &*quant : nullptr);
    if (!att) return att.takeError();
    if (att->empty()) return std::vector<KernelLaunch>{};  // no paged attention for these heads: none at all
    all->insert(all->end(), att->begin(), att->end());
    return all;
  }
  if (followers == 1 && c.step().op == fb::OpKind::Attention && step_index + 1 < steps.size() &&
      steps[step_index + 1].op == fb::OpKind::QuantizeAct) {
    const StepContext quant(desc, layouts, variant, step_index + 1);
    return pagedAttention(c, &quant);
  }
  // The fused QKV GEMV's chain (MatMul q, k, v, Rope, Attention [, QuantizeAct]; ops/fusion.cpp): the three
  // GEMVs as they are (one row), then the paged RoPE, KV store and attention.
  if (followers >= 4 && c.step().op == fb::OpKind::MatMul && steps[step_index + 3].op == fb::OpKind::Rope &&
      steps[step_index + 4].op == fb::OpKind::Attention) {
    const auto ctx = [&](size_t k) { return StepContext(desc, layouts, variant, step_index + k); };
    // A deferred RMSNorm's q8 input (planFusion): the GEMVs apply its 1/rms, as the fused QKV GEMV does.
    std::vector<KernelLaunch> all;
    for (size_t k = 0; k < 3; ++k) {
      auto m = input_norm_step
                   ? deferredNormMatmulLaunches(ctx(k), StepContext(desc, layouts, variant, *input_norm_step))
                   : matmulLaunches(ctx(k));
      if (!m) return m.takeError();
      all.insert(all.end(), m->begin(), m->end());
    }
    auto rope = ropeLaunchesOf(ctx(3), true);
    if (!rope) return rope.takeError();
    std::optional<StepContext> quant;
    if (followers == 5) quant.emplace(ctx(5));
    auto att = pagedAttention(ctx(4), quant ? &*quant : nullptr);
    if (!att) return att.takeError();
    if (att->empty()) return std::vector<KernelLaunch>{};  // no paged attention for these heads: none at all
    all.insert(all.end(), rope->begin(), rope->end());
    all.insert(all.end(), att->begin(), att->end());
    return all;
  }
  return std::vector<KernelLaunch>{};
}

}  // namespace minfer::codegen
