// Op family Attention → kernels/attention.cuh: the batch's K/V into the f16 cache, then causal GQA:
// prefill kv_store + attn_prefill; decode kv_store + split-KV attn_decode + attn_combine (the split
// partials in step-local scratch); no kv_store when the fused QKV GEMV stored K and V (ops/matmul.cpp).
#include <cmath>

#include "compiler/codegen/ops/op_family.h"
#include "kernels/attention.cuh"

namespace minfer::codegen {

llvm::Error checkHeads(const StepContext& c, uint32_t q_width, uint32_t kv_width) {
  const uint32_t h = c.step().n_head, hkv = c.step().n_head_kv, d = c.step().head_dim;
  if (h == 0 || hkv == 0 || d == 0 || h % hkv != 0 || d > 256 || q_width != h * d || kv_width != hkv * d)
    return c.error(llvm::formatv("heads {0}, kv heads {1}, head_dim {2} do not fit buffers of width {3} and {4} "
                                 "(need n_head % n_head_kv == 0 and head_dim ≤ 256)",
                                 h, hkv, d, q_width, kv_width));
  return llvm::Error::success();
}

namespace {

KernelArgDesc cacheArg(fb::ArgKind kind, const char* name, uint32_t layer, uint32_t width,
                       fb::Access access = fb::Access::Read) {
  return {.kind = kind, .name = name, .access = access, .width = width, .layer = layer};
}

}  // namespace

namespace {

// `quant` (decode only): the QuantizeAct of the output, fused into the combine launch (ATT_Q8).
// `stored` (decode only): the fused QKV GEMV stored this token's K and V (no kv_store launch).
Launches attention(const StepContext& c, const StepContext* quant, bool stored) {
  const model::StepDesc& s = c.step();
  auto q = c.input(0, "q");
  if (!q) return q.takeError();
  auto k = c.input(1, "k");
  if (!k) return k.takeError();
  auto v = c.input(2, "v");
  if (!v) return v.takeError();
  auto out = c.output(0, "output");
  if (!out) return out.takeError();
  // q, k and v may be column views (format 1.4, phi3's q|k|v rows); the output is a whole buffer.
  const model::ColumnView qv = c.inputView(0), kv = c.inputView(1), vv = c.inputView(2), ov = c.outputView(0);
  if (auto e = checkHeads(c, qv.width, kv.width)) return e;
  if (vv.width != kv.width || ov.width != qv.width || ov.width != (*out)->width)
    return c.error(llvm::formatv("v width {0} must equal k width {1}, and the output (a whole buffer of width {2}) "
                                 "q width {3}",
                                 vv.width, kv.width, (*out)->width, qv.width));
  const uint32_t q_pitch = (*q)->width, k_pitch = (*k)->width, v_pitch = (*v)->width;
  const bool kv_views = k_pitch != kv.width || v_pitch != vv.width, q_view = q_pitch != qv.width;
  if (kern::attnPrefillUsesMma(s.head_dim) && (qv.offset % 2 != 0 || q_pitch % 2 != 0))
    return c.error(llvm::formatv("q view at column {0} of rows {1} wide: the tensor-core prefill reads q in pairs "
                                 "(8-byte loads) and needs both even",
                                 qv.offset, q_pitch));
  if (s.layer < 0) return c.error("attention step without a KV cache layer");
  if (quant && (c.prefill() || s.head_dim % 32 != 0))
    return quant->error("only a decode attention with heads of whole blocks of 32 can carry the quantization");
  if (stored && c.prefill()) return c.error("only decode attention can take K and V stored by the QKV GEMV");
  if (quant)
    if (llvm::Error e = checkFusedQuantize(*quant, (*out)->width)) return e;
  const uint32_t h = s.n_head, hkv = s.n_head_kv, d = s.head_dim, layer = static_cast<uint32_t>(s.layer);
  const uint32_t q_width = h * d, kv_width = hkv * d;
  if (!(s.scale >= 0) || !std::isfinite(s.scale) || !(s.softcap >= 0) || !std::isfinite(s.softcap))
    return c.error(llvm::formatv("query scale {0} and softcap {1} must be finite and ≥ 0", s.scale, s.softcap));
  // Query scale, logit soft-cap and sliding window (gemma2): in the key and as constants only when set,
  // so that plain attention keeps its kernels.
  std::string opts;
  if (s.scale != 0) opts += "_sc" + keyNumber(s.scale);
  if (s.softcap != 0) opts += "_cap" + keyNumber(s.softcap);
  if (s.window != 0) opts += "_win" + std::to_string(s.window);
  // A ring KV cache (schema Step.kv_ring): every launch that reads or writes the cache indexes slot p % ring.
  if (s.kv_ring != 0 && (s.window == 0 || s.kv_ring < s.window))
    return c.error(llvm::formatv("a KV ring of {0} positions needs a sliding window of 1..{0} positions (window {1})",
                                 s.kv_ring, s.window));
  const std::string ring_tag = s.kv_ring != 0 ? "_ring" + std::to_string(s.kv_ring) : "";
  opts += ring_tag;
  auto ring = [&](SpecBuilder& b) -> SpecBuilder& {
    if (s.kv_ring != 0) b.define("ATT_KV_RING", static_cast<uint64_t>(s.kv_ring));
    return b;
  };
  auto options = [&](SpecBuilder& b) -> SpecBuilder& {
    if (s.scale != 0) b.define("ATT_SCALE", floatLiteral(s.scale));
    if (s.softcap != 0) b.define("ATT_SOFTCAP", floatLiteral(s.softcap));
    if (s.window != 0) b.define("ATT_WINDOW", static_cast<uint64_t>(s.window));
    return ring(b);
  };
  auto heads = [&](SpecBuilder& b) -> SpecBuilder& {
    return b.define("ATT_NHEAD", static_cast<uint64_t>(h))
        .define("ATT_NHEAD_KV", static_cast<uint64_t>(hkv))
        .define("ATT_HEAD_DIM", static_cast<uint64_t>(d));
  };
  const KernelArgDesc kc = cacheArg(fb::ArgKind::KCache, "kc", layer, kv_width);
  const KernelArgDesc vc = cacheArg(fb::ArgKind::VCache, "vc", layer, kv_width);
  const KernelArgDesc pos = kindArg(fb::ArgKind::Positions, "pos"), ntok = kindArg(fb::ArgKind::TokenCount, "n_tokens");
  const KernelArgDesc q_in = viewArg("q", c.inputId(0), q_pitch, qv, fb::Access::Read);
  const KernelArgDesc o = activationArg("out", c.outputId(0), q_width, fb::Access::Write);

  std::vector<KernelLaunch> launches;
  const std::string kv_tag = kv_views ? llvm::formatv("_kp{0}_vp{1}", k_pitch, v_pitch).str() : "";
  SpecBuilder store(llvm::formatv("kv_store_hkv{0}_d{1}{2}{3}", hkv, d, kv_tag, ring_tag), "kernels/attention.cuh",
                    "minfer_kv_store");
  ring(heads(store)).define("ATT_KV_STORE", uint64_t{1});
  if (kv_views) store.define("ATT_K_PITCH", uint64_t{k_pitch}).define("ATT_V_PITCH", uint64_t{v_pitch});
  if (!stored)
    launches.push_back({store.spec,
                        {viewArg("k", c.inputId(1), k_pitch, kv, fb::Access::Read),
                         viewArg("v", c.inputId(2), v_pitch, vv, fb::Access::Read),
                         cacheArg(fb::ArgKind::KCache, "kc", layer, kv_width, fb::Access::Write),
                         cacheArg(fb::ArgKind::VCache, "vc", layer, kv_width, fb::Access::Write), pos, ntok},
                        kern::kvStoreLaunchRule(hkv, d)});
  if (c.prefill()) {
    const std::string q_tag = q_view ? llvm::formatv("_qp{0}", q_pitch).str() : "";
    SpecBuilder b(llvm::formatv("attn_prefill_h{0}_hkv{1}_d{2}{3}{4}", h, hkv, d, opts, q_tag), "kernels/attention.cuh",
                  "minfer_attn_prefill");
    options(heads(b)).define("ATT_PREFILL", uint64_t{1});
    if (q_view) b.define("ATT_Q_PITCH", uint64_t{q_pitch});
    launches.push_back({b.spec, {q_in, kc, vc, o, pos, ntok}, kern::attnPrefillLaunchRule(h, d)});
    return launches;
  }
  const unsigned splits = attnDecodeSplits(hkv);
  const KernelArgDesc part{.kind = fb::ArgKind::Scratch, .name = "part",
                           .bytes = kern::attnDecodePartFloats(h, d, splits) * sizeof(float)};
  SpecBuilder b(llvm::formatv("attn_decode_h{0}_hkv{1}_d{2}_s{3}{4}", h, hkv, d, splits, opts), "kernels/attention.cuh",
                "minfer_attn_decode");
  options(heads(b)).define("ATT_SPLITS", static_cast<uint64_t>(splits)).define("ATT_DECODE", uint64_t{1});
  launches.push_back({b.spec, {q_in, kc, vc, part, pos}, kern::attnDecodeLaunchRule(hkv, splits, d, h / hkv)});
  // The combine reads the splits decodeSplits() makes non-empty, which depend on the window and on the decode's
  // form (attnDecodeUsesMma: the group, so the key names the kv heads).
  const std::string win = s.window != 0 ? "_win" + std::to_string(s.window) : "";
  SpecBuilder comb(llvm::formatv("attn_combine_h{0}_hkv{1}_d{2}_s{3}{4}{5}", h, hkv, d, splits, win, quant ? "_q8" : ""),
                   "kernels/attention.cuh", "minfer_attn_combine");
  heads(comb).define("ATT_SPLITS", static_cast<uint64_t>(splits)).define("ATT_COMBINE", uint64_t{1});
  if (s.window != 0) comb.define("ATT_WINDOW", static_cast<uint64_t>(s.window));
  if (quant) comb.define("ATT_Q8", uint64_t{1});
  KernelLaunch combine{comb.spec, {part, o, pos}, kern::attnCombineLaunchRule(h)};
  if (quant) pushQ8Args(combine.args, "qs", "meta", quant->outputId(0), q_width, fb::Access::Write);
  launches.push_back(std::move(combine));
  return launches;
}

}  // namespace

Launches attentionLaunches(const StepContext& c) { return attention(c, nullptr, false); }
Launches attentionQuantizeLaunches(const StepContext& c, const StepContext& quant) { return attention(c, &quant, false); }
Launches storedAttentionLaunches(const StepContext& c, const StepContext* quant) { return attention(c, quant, true); }

}  // namespace minfer::codegen
