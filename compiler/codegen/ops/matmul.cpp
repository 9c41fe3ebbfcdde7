// Op family MatMul → three kernels by weight format and plan:
//   quantized weights (kI8 + kScale [+ kMin] planes), q8 activations: prefill kernels/mmq.cuh (int8
//   tensor-core MMA on kI8), or kernels/wgmma_matmul.cuh (Hopper, sm_90a images only) on the kF16 plane
//   when the weight has one (layout_planner.h f16_prefill), decode kernels/gemv.cuh (the 4-bit kPacked plane where there is one, else kI8),
//   or kernels/gemv_blocks.cuh on the GGUF blocks themselves when the weight has a kBlocks plane of Q4_K or
//   Q6_K whose blocks start 16-byte aligned (decodeBlocksPlane); in decode q, k, v fuse with their RoPE and
//   KV store into one gemv_blocks launch (CodegenOptions::fuse_qkv, on by default: qkvAttentionLaunches), or,
//   where a q/k HeadRmsNorm keeps that chain out, the three GEMVs alone into one (gemvTripleLaunches),
//   and with fuse_glu (off by default) the gate and up matmuls of a GLU with it and its quantization
//   (gateUpGluLaunches); batched decode steps of a few rows (Step.small_launches) the batched GEMV
//   (gemv_blocks.cuh GEMVB_BATCH) on the kBlocks plane of Q4_K / Q6_K and from kMmqbFromRows rows
//   kernels/mmq_blocks.cuh on f16 tensor cores (the prefill q, k, v of one input as one minfer_mmq_blocks3 launch, gate
//   and up as one minfer_mmq_blocks2: fusesMmqbSegments), else kernels/gemm_small.cuh on the plane the decode GEMV
//   reads;
//   float weights (dense F32 / F16 / BF16 plane), f32 activations: kernels/dense_matmul.cuh
//   (dense_mm in prefill, dense_gemv in decode).
// Every plane constant the kernel is compiled with (-D…_PITCH) is taken from the stride table that the
// launch record's Weight argument carries, so the verifier's load-time check covers it.
#include <optional>

#include "compiler/codegen/ops/op_family.h"
#include "kernels/dense_matmul.cuh"
#include "kernels/gemm_small.cuh"
#include "kernels/gemv.cuh"
#include "kernels/gemv_blocks.cuh"
#include "kernels/mmq.cuh"
#include "kernels/mmq_blocks.cuh"
#include "kernels/wgmma_matmul.cuh"

namespace minfer::codegen {
namespace {

// The weight and its planes, and the step's buffers, checked against each other.
struct MatMulOperands {
  const planes::TensorLayout* w = nullptr;
  const StrideTable* bias = nullptr;  // null: no bias
  uint64_t n = 0, k = 0;              // rows (out features), cols (in features)
  std::string bias_tag;               // "_bias" or ""
};

llvm::Expected<MatMulOperands> operands(const StepContext& c) {
  MatMulOperands m;
  auto w = c.weight(0);
  if (!w) return w.takeError();
  m.w = *w;
  auto in = c.input(0, "input");
  if (!in) return in.takeError();
  auto out = c.output(0, "output");
  if (!out) return out.takeError();
  m.n = m.w->desc.rows;
  m.k = m.w->desc.cols;
  if ((*in)->width != m.k || (*out)->width != m.n)
    return c.error(llvm::formatv("'{0}' is {1} × {2} but the input is {3} wide and the output {4}", m.w->desc.name, m.n,
                                 m.k, (*in)->width, (*out)->width));
  if (c.step().weights.size() > 1) {
    auto v = c.vector(1, m.n);
    if (!v) return v.takeError();
    m.bias = *v;
    m.bias_tag = "_bias";
  }
  return m;
}

KernelArgDesc biasArg(const StepContext& c, const MatMulOperands& m, const char* name = "bias") {
  return m.bias ? weightArg(name, c.weightId(1), *m.bias) : kindArg(fb::ArgKind::Null, name);
}

Launches dense(const StepContext& c, const MatMulOperands& m, const StrideTable& d) {
  const bool prefill = c.prefill();
  SpecBuilder b(llvm::formatv("{0}_{1}_n{2}_k{3}{4}", prefill ? "dense_mm" : "dense_gemv", denseTag(d.kind), m.n, m.k,
                              m.bias_tag),
                "kernels/dense_matmul.cuh", prefill ? "minfer_dense_mm" : "minfer_dense_gemv");
  const std::string p = prefill ? "DMM_" : "DGEMV_";
  b.define((p + "N").c_str(), m.n)
      .define((p + "K").c_str(), m.k)
      .define((p + "PLANE").c_str(), static_cast<uint64_t>(d.kind))
      .define((p + "PITCH").c_str(), d.row_pitch)
      .define((p + "HAS_BIAS").c_str(), static_cast<uint64_t>(m.bias != nullptr));
  const unsigned n = static_cast<unsigned>(m.n);
  KernelLaunch l{b.spec, {}, prefill ? kern::denseMmLaunchRule(n) : kern::denseGemvLaunchRule(n)};
  l.args = {weightArg("w", c.weightId(0), d), biasArg(c, m),
            activationArg("x", c.inputId(0), static_cast<uint32_t>(m.k), fb::Access::Read),
            activationArg("out", c.outputId(0), static_cast<uint32_t>(m.n), fb::Access::Write)};
  if (prefill) l.args.push_back(kindArg(fb::ArgKind::TokenCount, "n_tokens"));
  return std::vector<KernelLaunch>{std::move(l)};
}

// wq (the plane read), wscale, wmin, bias, xq, xmeta, out: the common head of mmq's and gemv's ABI.
std::vector<KernelArgDesc> quantizedArgs(const StepContext& c, const MatMulOperands& m, const StrideTable& q,
                                         const StrideTable& s, const StrideTable* mins) {
  std::vector<KernelArgDesc> args{weightArg("wq", c.weightId(0), q), weightArg("wscale", c.weightId(0), s),
                                  mins ? weightArg("wmin", c.weightId(0), *mins) : kindArg(fb::ArgKind::Null, "wmin"),
                                  biasArg(c, m)};
  pushQ8Args(args, "xq", "xmeta", c.inputId(1), static_cast<uint32_t>(m.k), fb::Access::Read);
  args.push_back(activationArg("out", c.outputId(0), static_cast<uint32_t>(m.n), fb::Access::Write));
  return args;
}

// The -D constants of a kernels/wgmma_matmul.cuh launch: the weight's shape and kF16 plane, tile `t`, activations
// `act` (0: f16, 1: q8), the bias.
void defineWgmma(SpecBuilder& b, const MatMulOperands& m, const StrideTable& f16, kern::WgmmaTile t, unsigned act) {
  b.define("WG_N", m.n)
      .define("WG_K", m.k)
      .define("WG_W_PITCH", f16.row_pitch)
      .define("WG_BM", static_cast<uint64_t>(t.bm))
      .define("WG_BN", static_cast<uint64_t>(t.bn))
      .define("WG_STAGES", static_cast<uint64_t>(t.stages))
      .define("WG_ACT", uint64_t{act})
      .define("WG_HAS_BIAS", static_cast<uint64_t>(m.bias != nullptr));
}

// A launch that stages the step's q8 input (k wide) as f16 into the scratch `x16` (a Scratch argument): `entry` of
// `source`, with `k_define` = k its one constant; its parameters xq, xmeta, x16, n_tokens.
KernelLaunch q8StagingLaunch(const StepContext& c, unsigned k, const KernelArgDesc& x16, const std::string& key,
                             const char* source, const char* entry, const char* k_define, kern::LaunchRule rule) {
  SpecBuilder b(key, source, entry);
  b.define(k_define, uint64_t{k});
  std::vector<KernelArgDesc> args;
  pushQ8Args(args, "xq", "xmeta", c.inputId(1), k, fb::Access::Read);
  args.push_back(x16);
  args.push_back(kindArg(fb::ArgKind::TokenCount, "n_tokens"));
  return {b.spec, std::move(args), rule};
}

// minfer_q8_to_f16: the step's q8 input as f16 (row order) for the Hopper matmul.
KernelLaunch q8ToF16Launch(const StepContext& c, unsigned k, const KernelArgDesc& x16) {
  return q8StagingLaunch(c, k, x16, llvm::formatv("q8_to_f16_k{0}", k), "kernels/wgmma_matmul.cuh", "minfer_q8_to_f16",
                         "Q8F16_K", kern::q8ToF16LaunchRule(k));
}

// minfer_wgmma_matmul on tile `t` of the weight's kF16 plane: from the f16 activations in the scratch `x16` (WG_ACT = 0),
// or, where x16 is null, from the step's q8 input, dequantized as it is staged (WG_ACT = 1).
KernelLaunch wgmmaLaunch(const StepContext& c, const MatMulOperands& m, const StrideTable& f16, kern::WgmmaTile t,
                         const KernelArgDesc* x16) {
  const unsigned n = static_cast<unsigned>(m.n), k = static_cast<unsigned>(m.k);
  SpecBuilder b(llvm::formatv("wgmma_{0}_n{1}_k{2}_bm{3}_bn{4}_s{5}{6}", x16 ? "f16" : "q8", m.n, m.k, t.bm, t.bn,
                              t.stages, m.bias_tag),
                "kernels/wgmma_matmul.cuh", "minfer_wgmma_matmul");
  defineWgmma(b, m, f16, t, x16 ? 0u : 1u);
  std::vector<KernelArgDesc> args{weightArg("w", c.weightId(0), f16), biasArg(c, m)};
  if (x16) {
    args.push_back(*x16);
    args.push_back(kindArg(fb::ArgKind::Null, "xmeta"));
  } else {
    pushQ8Args(args, "x", "xmeta", c.inputId(1), k, fb::Access::Read);
  }
  args.push_back(activationArg("out", c.outputId(0), n, fb::Access::Write));
  args.push_back(kindArg(fb::ArgKind::TokenCount, "n_tokens"));
  return {b.spec, std::move(args), kern::wgmmaMatmulLaunchRule(n, t.bm, t.bn, t.stages)};
}

// Prefill on Hopper (kernels/wgmma_matmul.cuh) from the weight's kF16 plane: two launches, the q8 input
// dequantized to f16 into the step's scratch (minfer_q8_to_f16), then the matmul on f16 activations
// (WG_ACT = 0: 1.2–2.9× faster per launch than dequantizing inside the matmul, BENCHMARKS.md). A step of
// the last-token tail may not use scratch (it runs on one row, or on every row when all logits are
// wanted): one launch that dequantizes the q8 input as it stages it (WG_ACT = 1). The caller checked the
// q8 input.
Launches wgmmaMatmul(const StepContext& c, const MatMulOperands& m, const StrideTable& f16) {
  const unsigned n = static_cast<unsigned>(m.n), k = static_cast<unsigned>(m.k);
  if (m.k % 32 != 0 || f16.row_pitch % 16 != 0 || f16.elem != ElemType::kF16)
    return c.error(llvm::formatv("'{0}': unsupported kF16 plane for the Hopper matmul (cols {1}, pitch {2})",
                                 m.w->desc.name, m.k, f16.row_pitch));
  const kern::WgmmaTile t = kern::wgmmaMatmulTile(n);
  if (c.inTail()) return std::vector<KernelLaunch>{wgmmaLaunch(c, m, f16, t, nullptr)};
  const KernelArgDesc scratch{.kind = fb::ArgKind::Scratch, .name = "x16", .bytes = kern::q8ToF16Bytes(c.maxBatch(), k)};
  return std::vector<KernelLaunch>{q8ToF16Launch(c, k, scratch), wgmmaLaunch(c, m, f16, t, &scratch)};
}

// Whether a MatMul can take the small-batch Hopper matmul of the split form's tile (wgmmaSplitMatmul) for the calls of
// kMmqbMaxRows + 1 … min(64, max_batch) rows: a kF16 plane that wgmmaMatmul would take, a plan of more than
// kMmqbMaxRows rows, not in the last-token tail (no scratch there).
bool takesWgmmaSplit(const StepContext& c, const MatMulOperands& m, const StrideTable* f16) {
  return f16 && !c.inTail() && c.maxBatch() > kern::kMmqbMaxRows && m.k % 32 == 0 && f16->row_pitch % 16 == 0 &&
         f16->elem == ElemType::kF16;
}

// The scratch the q8 input of a split-form call is staged into (minfer_q8_to_f16): one token tile of f16.
KernelArgDesc splitActivations(unsigned k) {
  return {.kind = fb::ArgKind::Scratch, .name = "x16", .bytes = kern::q8ToF16Bytes(kern::kWgmmaSplitTile.bm, k)};
}

// The Hopper matmul on the split form's tile (kern::kWgmmaSplitTile) from the f16 activations staged in the scratch:
// split over K as wgmmaSplits gives with `min_stages` (minfer_wgmma_matmul_split, its partials after the activations),
// or, where that is one split (one wave of weight tiles already, or K too short), minfer_wgmma_matmul on that tile.
// The caller checked takesWgmmaSplit and stages the activations.
KernelLaunch wgmmaSplitMatmul(const StepContext& c, const MatMulOperands& m, const StrideTable& f16,
                              unsigned min_stages) {
  const unsigned n = static_cast<unsigned>(m.n), k = static_cast<unsigned>(m.k);
  const unsigned splits = kern::wgmmaSplits(n, k, min_stages);
  const kern::WgmmaTile t = kern::kWgmmaSplitTile;
  if (splits == 1) {
    const KernelArgDesc x16 = splitActivations(k);
    return wgmmaLaunch(c, m, f16, t, &x16);
  }
  SpecBuilder b(llvm::formatv("wgmma_split_n{0}_k{1}_bm{2}_bn{3}_s{4}_x{5}{6}", m.n, m.k, t.bm, t.bn, t.stages, splits,
                              m.bias_tag),
                "kernels/wgmma_matmul.cuh", "minfer_wgmma_matmul_split");
  defineWgmma(b, m, f16, t, 0);
  b.define("WG_SPLITS", uint64_t{splits});
  std::vector<KernelArgDesc> args{
      weightArg("w", c.weightId(0), f16), biasArg(c, m),
      {.kind = fb::ArgKind::Scratch, .name = "scratch", .bytes = kern::wgmmaSplitScratchBytes(n, k, splits)},
      activationArg("out", c.outputId(0), n, fb::Access::Write),
      {.kind = fb::ArgKind::Counters, .name = "counters", .bytes = kern::wgmmaSplitCounterBytes(n)},
      kindArg(fb::ArgKind::TokenCount, "n_tokens")};
  return {b.spec, std::move(args), kern::wgmmaSplitLaunchRule(n, splits)};
}

// The split form's launches of one q8 input (the step `c` reads it, `k` wide) and the matmuls `mm` of it, for the
// calls of kMmqbMaxRows + 1 … min(64, max_batch) rows: minfer_q8_to_f16 into the scratch, then each matmul's
// wgmmaSplitMatmul with `min_stages` in turn (they share the staged activations; each split launch's partials and
// counters are its own until it ends).
std::vector<KernelLaunch> wgmmaSplitLaunches(const StepContext& c, unsigned k,
                                             llvm::ArrayRef<std::pair<const StepContext*, const MatMulOperands*>> mm,
                                             unsigned min_stages) {
  std::vector<KernelLaunch> out{q8ToF16Launch(c, k, splitActivations(k))};
  for (const auto& [step, m] : mm)
    out.push_back(wgmmaSplitMatmul(*step, *m, *findPlane(*m->w, PlaneKind::kF16), min_stages));
  for (KernelLaunch& l : out) {
    l.min_rows = kern::kMmqbMaxRows + 1;
    l.max_rows = std::min(kern::kWgmmaSplitTile.bm, c.maxBatch());
  }
  return out;
}

// The kBlocks plane the decode GEMV can read directly: Q4_K or Q6_K blocks of 256 weights, each starting
// 16-byte aligned (group and row pitch multiples of 16); null when there is none.
const StrideTable* decodeBlocksPlane(const planes::TensorLayout& l) {
  const StrideTable* b = findPlane(l, PlaneKind::kBlocks);
  const auto type = b ? static_cast<GgmlType>(b->ggml_type) : GgmlType::F32;
  if (type != GgmlType::Q4_K && type != GgmlType::Q6_K) return nullptr;
  const bool aligned = b->group_pitch % 16 == 0 && b->row_pitch % 16 == 0;
  const bool fits = b->group_pitch >= ggmlTypeTraits(b->ggml_type).type_size &&
                    b->row_pitch >= b->cols / kQK_K * b->group_pitch;
  return b->group_size == kQK_K && b->cols % kQK_K == 0 && aligned && fits ? b : nullptr;
}

// The -D constants of a gemv_blocks.cuh GEMV on the kBlocks plane `blk` (n rows of k), work shape `shape`.
void defineBlocksGemv(SpecBuilder& b, const StrideTable& blk, uint64_t n, uint64_t k, kern::GemvBlocksShape shape,
                      bool bias) {
  b.define("GEMVB_N", n)
      .define("GEMVB_K", k)
      .define("GEMVB_TYPE", static_cast<uint64_t>(blk.ggml_type))
      .define("GEMVB_PITCH", blk.row_pitch)
      .define("GEMVB_GROUP_PITCH", static_cast<uint64_t>(blk.group_pitch))
      .define("GEMVB_ROWS", static_cast<uint64_t>(shape.rows))
      .define("GEMVB_ROW_WARPS", static_cast<uint64_t>(shape.warps))
      .define("GEMVB_UNROLL", static_cast<uint64_t>(shape.unroll))
      .define("GEMVB_HAS_BIAS", uint64_t{bias ? 1u : 0u});
}

// A GEMV on the GGUF blocks whose q8 input is a deferred RMSNorm's (gemv_blocks.cuh GEMVB_RMS_EPS; `norm` the
// RmsNorm step, whose f32 output buffer holds the partial sums of squares): the key part, the constant and the
// kernel's last argument, `rms`. Nothing without a norm.
void deferInputNorm(SpecBuilder& b, std::vector<KernelArgDesc>& args, const StepContext* norm, uint64_t k) {
  if (!norm) return;
  b.spec.key += "_rms" + keyNumber(norm->step().eps);
  b.define("GEMVB_RMS_EPS", floatLiteral(norm->step().eps));
  args.push_back(activationArg("rms", norm->outputId(0), static_cast<uint32_t>(k), fb::Access::Read));
}

// The spec of gemv_blocks.cuh's `entry` (key `prefix`_type_g…_n…_k…[bias]) on the kBlocks plane `blk` of m, in
// gemvBlocksShape's work shape.
SpecBuilder blocksGemvSpec(const char* prefix, const char* entry, const StrideTable& blk, const MatMulOperands& m) {
  SpecBuilder b(llvm::formatv("{0}_{1}_g{2}_n{3}_k{4}{5}", prefix, typeTag(blk.ggml_type), blk.group_pitch, m.n, m.k,
                              m.bias_tag),
                "kernels/gemv_blocks.cuh", entry);
  defineBlocksGemv(b, blk, m.n, m.k,
                   kern::gemvBlocksShape(static_cast<unsigned>(m.n), static_cast<unsigned>(m.k)), m.bias != nullptr);
  return b;
}

// Decode GEMV on a kBlocks plane (kernels/gemv_blocks.cuh); the q8 input was checked by the caller. `norm`: the
// deferred RmsNorm of that input (deferInputNorm), or null.
Launches blocksGemv(const StepContext& c, const MatMulOperands& m, const StrideTable& blk, const StepContext* norm) {
  const unsigned n = static_cast<unsigned>(m.n), k = static_cast<unsigned>(m.k);
  const kern::GemvBlocksShape shape = kern::gemvBlocksShape(n, k);
  SpecBuilder b = blocksGemvSpec("gemv_blocks", "minfer_gemv_blocks", blk, m);
  std::vector<KernelArgDesc> args{weightArg("w", c.weightId(0), blk), biasArg(c, m)};
  pushQ8Args(args, "xq", "xmeta", c.inputId(1), k, fb::Access::Read);
  args.push_back(activationArg("out", c.outputId(0), n, fb::Access::Write));
  deferInputNorm(b, args, norm, k);
  return std::vector<KernelLaunch>{{b.spec, std::move(args), kern::gemvBlocksLaunchRule(n, shape)}};
}

Launches quantized(const StepContext& c, const MatMulOperands& m) {
  const planes::TensorLayout& l = *m.w;
  const uint64_t n = m.n, k = m.k;
  auto qin = c.input(1, "quantized input");
  if (!qin) return qin.takeError();
  if ((*qin)->type != fb::BufferType::I8 || (*qin)->width != k)
    return c.error(llvm::formatv("the quantized input '{0}' must be an I8 buffer of width {1}", (*qin)->name, k));
  // Hopper prefill on the kF16 plane; decode on the GGUF blocks; else the kI8 plane (mmq, gemv).
  const StrideTable* f16 = findPlane(l, PlaneKind::kF16);
  const StrideTable* blocks = decodeBlocksPlane(l);
  if (c.prefill() && f16) return wgmmaMatmul(c, m, *f16);
  if (!c.prefill() && blocks) return blocksGemv(c, m, *blocks, nullptr);
  const StrideTable* qp = findPlane(l, PlaneKind::kI8);
  if (!qp)
    return c.error(llvm::formatv("'{0}' has no kI8 plane for the {1} matmul", l.desc.name, c.prefill() ? "prefill" : "decode"));
  const StrideTable& q = *qp;
  const StrideTable* s = findPlane(l, PlaneKind::kScale);
  const StrideTable* mins = findPlane(l, PlaneKind::kMin);
  if (!s) return c.error(llvm::formatv("'{0}' has a kI8 plane without a kScale plane", l.desc.name));
  if (k % 32 != 0 || (s->group_size != 16 && s->group_size != 32) || s->group_pitch != 4 ||
      (mins && (mins->group_size != s->group_size || mins->group_pitch != 4)) || q.row_pitch % 16 != 0)
    return c.error(llvm::formatv("'{0}': unsupported geometry (cols {1}, group {2}, group pitch {3}, kI8 pitch {4})",
                                 l.desc.name, k, s->group_size, s->group_pitch, q.row_pitch));
  const uint64_t has_min = mins ? 1 : 0, has_bias = m.bias ? 1 : 0;
  const std::string type = typeTag(static_cast<uint32_t>(l.desc.type));
  if (c.prefill()) {
    const auto [tm, tn] = chooseMmqTile(n, k);
    SpecBuilder b(llvm::formatv("mmq_i8_{0}_n{1}_k{2}_tm{3}_tn{4}{5}", type, n, k, tm, tn, m.bias_tag),
                  "kernels/mmq.cuh", "minfer_mmq");
    b.define("MMQ_N", n)
        .define("MMQ_K", k)
        .define("MMQ_GROUP", static_cast<uint64_t>(s->group_size))
        .define("MMQ_HAS_MIN", has_min)
        .define("MMQ_HAS_BIAS", has_bias)
        .define("MMQ_Q_PITCH", q.row_pitch)
        .define("MMQ_S_PITCH", s->row_pitch)
        .define("MMQ_M_PITCH", mins ? mins->row_pitch : 0)
        .define("MMQ_TM", static_cast<uint64_t>(tm))
        .define("MMQ_TN", static_cast<uint64_t>(tn));
    KernelLaunch launch{b.spec, quantizedArgs(c, m, q, *s, mins),
                        kern::mmqLaunchRule(static_cast<unsigned>(n), tm, tn, s->group_size, mins != nullptr)};
    launch.args.push_back(kindArg(fb::ArgKind::TokenCount, "n_tokens"));
    return std::vector<KernelLaunch>{std::move(launch)};
  }
  const StrideTable* packed = findPlane(l, PlaneKind::kPacked);
  const bool four = packed && packed->bits == 4 && s->group_size == 32 && packed->row_pitch % 16 == 0;
  const StrideTable& read = four ? *packed : q;
  SpecBuilder b(llvm::formatv("gemv_{0}_{1}_n{2}_k{3}{4}", four ? "packed4" : "i8", type, n, k, m.bias_tag),
                "kernels/gemv.cuh", "minfer_gemv");
  b.define("GEMV_N", n)
      .define("GEMV_K", k)
      .define("GEMV_BITS", static_cast<uint64_t>(four ? 4 : 8))
      .define("GEMV_PITCH", read.row_pitch)
      .define("GEMV_Q_OFFSET", static_cast<int64_t>(four ? packed->q_offset : 0))
      .define("GEMV_GROUP", static_cast<uint64_t>(s->group_size))
      .define("GEMV_S_PITCH", s->row_pitch)
      .define("GEMV_HAS_MIN", has_min)
      .define("GEMV_M_PITCH", mins ? mins->row_pitch : 0)
      .define("GEMV_HAS_BIAS", has_bias);
  return std::vector<KernelLaunch>{
      {b.spec, quantizedArgs(c, m, read, *s, mins), kern::gemvLaunchRule(static_cast<unsigned>(n))}};
}

// The split-K arguments of the small-batch matmuls: the partial sums (Scratch) and the block counters (Counters),
// both Null with one split.
void pushSplitKArgs(std::vector<KernelArgDesc>& args, uint64_t scratch_bytes, uint64_t counter_bytes, unsigned splits) {
  if (splits > 1) {
    args.push_back({.kind = fb::ArgKind::Scratch, .name = "partial", .bytes = scratch_bytes});
    args.push_back({.kind = fb::ArgKind::Counters, .name = "counters", .bytes = counter_bytes});
  } else {
    args.push_back(kindArg(fb::ArgKind::Null, "partial"));
    args.push_back(kindArg(fb::ArgKind::Null, "counters"));
  }
}

// minfer_mmqb_f16_act: the step's q8 input as f16 in the MMA's k order, the activations of an MMQB_F16ACT mmq_blocks
// launch.
KernelLaunch mmqbF16ActLaunch(const StepContext& c, unsigned k, const KernelArgDesc& x16) {
  return q8StagingLaunch(c, k, x16, llvm::formatv("mmqb_f16_act_k{0}", k), "kernels/mmq_blocks.cuh",
                         "minfer_mmqb_f16_act", "MMQB_ACT_K", kern::mmqbF16ActLaunchRule(k));
}

// The small-batch form of a prefill MatMul (kernels/gemm_small.cuh) on the plane the decode GEMV reads (the 4-bit
// kPacked plane where there is one, else kI8), split over K (gemmSmallSplits) except in the last-token tail;
// nothing for weights without a kI8 plane or a geometry that quantized() would refuse (its launches report those).
Launches smallBatchMatmul(const StepContext& c, const MatMulOperands& m) {
  const planes::TensorLayout& l = *m.w;
  const StrideTable* q = findPlane(l, PlaneKind::kI8);
  const StrideTable* s = findPlane(l, PlaneKind::kScale);
  const StrideTable* mins = findPlane(l, PlaneKind::kMin);
  auto qin = c.input(1, "quantized input");
  if (!qin) return qin.takeError();
  const bool q8 = (*qin)->type == fb::BufferType::I8 && (*qin)->width == m.k;
  if (!q || !s || !q8 || m.k % 32 != 0 || (s->group_size != 16 && s->group_size != 32) || s->group_pitch != 4 ||
      (mins && (mins->group_size != s->group_size || mins->group_pitch != 4)) || q->row_pitch % 16 != 0 ||
      m.n > (uint64_t{1} << 30) || m.k > (uint64_t{1} << 30))
    return std::vector<KernelLaunch>{};
  const StrideTable* packed = findPlane(l, PlaneKind::kPacked);
  const bool four = packed && packed->bits == 4 && s->group_size == 32 && packed->row_pitch % 16 == 0;
  const StrideTable& read = four ? *packed : *q;
  const unsigned n = static_cast<unsigned>(m.n), k = static_cast<unsigned>(m.k);
  // A step of the last-token tail may not use scratch (it runs on one row, see wgmmaMatmul): one split there.
  const unsigned splits = c.inTail() ? 1u : kern::gemmSmallSplits(n, k);
  SpecBuilder b(llvm::formatv("gemm_small_{0}_{1}_n{2}_k{3}_s{4}{5}", four ? "packed4" : "i8",
                              typeTag(static_cast<uint32_t>(l.desc.type)), n, k, splits, m.bias_tag),
                "kernels/gemm_small.cuh", "minfer_gemm_small");
  b.define("SB_N", m.n)
      .define("SB_K", m.k)
      .define("SB_BITS", static_cast<uint64_t>(four ? 4 : 8))
      .define("SB_PITCH", read.row_pitch)
      .define("SB_Q_OFFSET", static_cast<int64_t>(four ? packed->q_offset : 0))
      .define("SB_GROUP", static_cast<uint64_t>(s->group_size))
      .define("SB_S_PITCH", s->row_pitch)
      .define("SB_HAS_MIN", uint64_t{mins ? 1u : 0u})
      .define("SB_M_PITCH", mins ? mins->row_pitch : 0)
      .define("SB_HAS_BIAS", uint64_t{m.bias ? 1u : 0u})
      .define("SB_SPLITS", static_cast<uint64_t>(splits));
  std::vector<KernelArgDesc> args = quantizedArgs(c, m, read, *s, mins);
  pushSplitKArgs(args, kern::gemmSmallScratchBytes(n, splits), kern::gemmSmallCounterBytes(n), splits);
  args.push_back(kindArg(fb::ArgKind::TokenCount, "n_tokens"));
  return std::vector<KernelLaunch>{{b.spec, std::move(args), kern::gemmSmallLaunchRule(n, splits)}};
}

// The kBlocks plane a prefill MatMul's small-batch launches read (Q4_K, Q6_K, as the decode GEMV) where its input is
// q8 and the weight has no kI8 plane (minfer_gemm_small reads that one); null otherwise.
const StrideTable* smallBatchBlocks(const StepContext& c, const MatMulOperands& m) {
  auto qin = c.input(1, "quantized input");
  if (!qin) {
    llvm::consumeError(qin.takeError());
    return nullptr;
  }
  const bool q8 = (*qin)->type == fb::BufferType::I8 && (*qin)->width == m.k;
  if (!q8 || m.n > (uint64_t{1} << 30) || m.k > (uint64_t{1} << 30) || findPlane(*m.w, PlaneKind::kI8)) return nullptr;
  return decodeBlocksPlane(*m.w);
}

// The batched GEMV of a small-batch step (gemv_blocks.cuh GEMVB_BATCH: the decode GEMV's sums for each row, one
// weight pass), serving every row count up to its GEMVB_BATCH unless bounded.
KernelLaunch batchedGemvLaunch(const StepContext& c, const MatMulOperands& m, const StrideTable& blk) {
  const unsigned n = static_cast<unsigned>(m.n), k = static_cast<unsigned>(m.k);
  SpecBuilder b = blocksGemvSpec("gemv_batch", "minfer_gemv_batch", blk, m);
  b.define("GEMVB_BATCH", uint64_t{kern::kGemvBatchMaxRows});
  std::vector<KernelArgDesc> args{weightArg("w", c.weightId(0), blk), biasArg(c, m)};
  pushQ8Args(args, "xq", "xmeta", c.inputId(1), k, fb::Access::Read);
  args.push_back(activationArg("out", c.outputId(0), n, fb::Access::Write));
  args.push_back(kindArg(fb::ArgKind::TokenCount, "n_tokens"));
  return {b.spec, std::move(args), kern::gemvBlocksLaunchRule(n, kern::gemvBlocksShape(n, k))};
}

// The mmq_blocks tiles of a small-batch step and the rows each serves: 16 tokens from kMmqbFromRows, then 32, then
// 64, up to min(most, max_batch) rows (`most`: kMmqbMaxRows, or kMmqbFusedMaxRows for the fused forms,
// minfer_mmq_blocks2 and minfer_mmq_blocks3); `make(tn)` builds the launches of one tile (the mmq_blocks launch,
// after the one that stages its activations where it takes MMQB_F16ACT), each serving the tile's rows.
template <class Make>
void pushMmqbTiles(std::vector<KernelLaunch>& out, unsigned rows, unsigned most, Make make) {
  for (const unsigned tn : {16u, 32u, 64u}) {
    const unsigned first = tn == 16 ? kern::kMmqbFromRows : tn / 2 + 1;
    if (first > rows || first > most) break;
    for (KernelLaunch& l : make(tn)) {
      l.min_rows = first;
      l.max_rows = std::min({tn, rows, most});
      out.push_back(std::move(l));
    }
  }
}

// The small-batch forms of a prefill MatMul on the GGUF blocks, for a weight with a kBlocks plane the decode GEMV reads
// (Q4_K, Q6_K) and a q8 input (nothing otherwise), each serving its range of rows (format 1.10 Launch.min_rows and
// max_rows), up to min(kMmqbMaxRows, max_batch): the batched GEMV (kernels/gemv_blocks.cuh GEMVB_BATCH, the decode
// GEMV's sums for each row, one weight pass) below kMmqbFromRows rows; from there minfer_mmq_blocks
// (kernels/mmq_blocks.cuh, f16 tensor cores) in tiles of 16 tokens, then 32; split over K (mmqbSplits) except in the
// last-token tail. Models with experts: the batched GEMV alone (up to min(kGemvBatchMaxRows, max_batch) rows).
// Always the mma.sync form: none of its tiles is one the warpgroup form takes (mmqb_wgmma is for the fused forms).
static_assert(!kern::mmqbWarpgroupTile(kern::kMmqbMaxRows), "the plain mmq_blocks tiles would need mmqb_wgmma too");
Launches smallBatchBlocksMatmul(const StepContext& c, const MatMulOperands& m) {
  if (auto qin = c.input(1, "quantized input"); !qin) return qin.takeError();
  const StrideTable* blk = smallBatchBlocks(c, m);
  if (!blk) return std::vector<KernelLaunch>{};
  const unsigned n = static_cast<unsigned>(m.n), k = static_cast<unsigned>(m.k), rows = c.maxBatch();
  std::vector<KernelLaunch> out{batchedGemvLaunch(c, m, *blk)};
  // Not in models with experts: mmq_blocks's f16 rounding moved a near-tie router row to another expert
  // (kMmqbFromRows' comment), where the batched GEMV's sums are the single-sequence decode's.
  if (rows < kern::kMmqbFromRows || c.hasExperts()) return out;
  out.back().max_rows = kern::kMmqbFromRows - 1;
  // A step of the last-token tail may not use scratch (it runs on one row, see wgmmaMatmul): one split there.
  const unsigned splits = c.inTail() ? 1u : kern::mmqbSplits(n, k);
  const std::vector<KernelArgDesc> args = out.back().args;  // a copy: out grows below
  pushMmqbTiles(out, rows, kern::kMmqbMaxRows, [&](unsigned tn) {
    SpecBuilder mb(llvm::formatv("mmq_blocks_{0}_g{1}_n{2}_k{3}_t{4}_s{5}{6}", typeTag(blk->ggml_type), blk->group_pitch,
                                 n, k, tn, splits, m.bias_tag),
                   "kernels/mmq_blocks.cuh", "minfer_mmq_blocks");
    mb.define("MMQB_N", m.n)
        .define("MMQB_K", m.k)
        .define("MMQB_TYPE", uint64_t{blk->ggml_type})
        .define("MMQB_PITCH", blk->row_pitch)
        .define("MMQB_GROUP_PITCH", uint64_t{blk->group_pitch})
        .define("MMQB_TN", uint64_t{tn})
        .define("MMQB_SPLITS", uint64_t{splits})
        .define("MMQB_HAS_BIAS", uint64_t{m.bias ? 1u : 0u});
    std::vector<KernelArgDesc> margs(args.begin(), args.end() - 1);  // w, bias, xq, xmeta, out
    pushSplitKArgs(margs, kern::mmqbPartialBytes(n, tn, splits), kern::mmqbCounterBytes(n), splits);
    margs.push_back(kindArg(fb::ArgKind::TokenCount, "n_tokens"));
    return std::vector<KernelLaunch>{
        {mb.spec, std::move(margs), kern::mmqbLaunchRule(n, blk->ggml_type, tn, splits, false)}};
  });
  return out;
}

// The plane of a decode MatMul that a fused GEMV can take: a q8 input and a kBlocks plane the decode
// GEMV reads (a bias only where `bias_ok`); null otherwise.
const StrideTable* fusibleBlocks(const StepContext& c, const MatMulOperands& m, bool bias_ok) {
  auto qin = c.input(1, "quantized input");
  if (!qin) {
    llvm::consumeError(qin.takeError());
    return nullptr;
  }
  const bool q8 = (*qin)->type == fb::BufferType::I8 && (*qin)->width == m.k;
  return !c.prefill() && (bias_ok || !m.bias) && q8 ? decodeBlocksPlane(*m.w) : nullptr;
}

// A step's matmul operands, or nothing (the unfused path reports the error).
std::optional<MatMulOperands> fusibleOperands(const StepContext& c) {
  auto m = operands(c);
  if (!m) {
    llvm::consumeError(m.takeError());
    return std::nullopt;
  }
  return *m;
}

}  // namespace

bool fusesGateUp(const StepContext& gate, const StepContext& up) {
  const std::optional<MatMulOperands> g = fusibleOperands(gate), u = fusibleOperands(up);
  if (!g || !u) return false;
  const StrideTable* gb = fusibleBlocks(gate, *g, false);
  const StrideTable* ub = fusibleBlocks(up, *u, false);
  return gb && ub && gate.step().inputs == up.step().inputs && g->n == u->n && g->k == u->k && g->n % 32 == 0 &&
         gb->ggml_type == ub->ggml_type && gb->row_pitch == ub->row_pitch && gb->group_pitch == ub->group_pitch;
}

bool fusesGemvPair(const StepContext& a, const StepContext& b) {
  const std::optional<MatMulOperands> ma = fusibleOperands(a), mb = fusibleOperands(b);
  if (!ma || !mb) return false;
  const StrideTable* ba = fusibleBlocks(a, *ma, true);
  const StrideTable* bb = fusibleBlocks(b, *mb, true);
  return ba && bb && a.step().inputs == b.step().inputs && a.outputId(0) != b.outputId(0) && ma->n == mb->n &&
         ma->k == mb->k && (ma->bias == nullptr) == (mb->bias == nullptr) && ba->ggml_type == bb->ggml_type &&
         ba->row_pitch == bb->row_pitch && ba->group_pitch == bb->group_pitch;
}

// MatMul a, MatMul b of one q8 input (decode) → one minfer_gemv_pair launch (kernels/gemv_blocks.cuh
// GEMVB_PAIR, and GEMVB_PERSIST where gemvPairPersists) with minfer_gemv_blocks' constants: each output exactly as
// its own GEMV writes it.
Launches gemvPairLaunches(const StepContext& a, const StepContext& b, const StepContext* norm) {
  if (!fusesGemvPair(a, b)) return a.error("the two matmuls cannot run as one GEMV pair");
  const MatMulOperands ma = *fusibleOperands(a), mb = *fusibleOperands(b);
  const StrideTable& ba = *decodeBlocksPlane(*ma.w);
  const StrideTable& bb = *decodeBlocksPlane(*mb.w);
  const unsigned n = static_cast<unsigned>(ma.n), k = static_cast<unsigned>(ma.k);
  const kern::GemvBlocksShape shape = kern::gemvBlocksShape(n, k);
  SpecBuilder sb = blocksGemvSpec("gemv_pair", "minfer_gemv_pair", ba, ma);
  sb.define("GEMVB_PAIR", uint64_t{1});
  std::vector<KernelArgDesc> args{weightArg("w0", a.weightId(0), ba), biasArg(a, ma, "bias0"),
                                  weightArg("w1", b.weightId(0), bb), biasArg(b, mb, "bias1")};
  pushQ8Args(args, "xq", "xmeta", a.inputId(1), k, fb::Access::Read);
  args.push_back(activationArg("out0", a.outputId(0), n, fb::Access::Write));
  args.push_back(activationArg("out1", b.outputId(0), n, fb::Access::Write));
  deferInputNorm(sb, args, norm, k);
  // Above kGemvPairPersistBlocks thread blocks, the persistent form's resident grid (GEMVB_PERSIST).
  if (!kern::gemvPairPersists(n, shape))
    return std::vector<KernelLaunch>{{sb.spec, std::move(args), kern::gemvPairLaunchRule(n, shape)}};
  sb.spec.key += "_persist";
  sb.define("GEMVB_PERSIST", uint64_t{1});
  return std::vector<KernelLaunch>{
      {sb.spec, std::move(args), kern::gemvPairPersistentLaunchRule(n, shape, kern::kGemvPairPersistBlocks)}};
}

bool fusesGemvTriple(const StepContext& a, const StepContext& b, const StepContext& c) {
  const StepContext* mm[3] = {&a, &b, &c};
  std::optional<MatMulOperands> m[3];
  for (int i = 0; i < 3; ++i) {
    m[i] = fusibleOperands(*mm[i]);
    if (!m[i] || !fusibleBlocks(*mm[i], *m[i], true) || m[i]->n > (uint64_t{1} << 30)) return false;
  }
  // One work shape's warps and unroll for the three (the kernel takes them once).
  const kern::GemvBlocksShape s0 = kern::gemvBlocksShape(static_cast<unsigned>(m[0]->n), static_cast<unsigned>(m[0]->k));
  for (int i = 1; i < 3; ++i) {
    const kern::GemvBlocksShape si = kern::gemvBlocksShape(static_cast<unsigned>(m[i]->n), static_cast<unsigned>(m[i]->k));
    if (mm[i]->step().inputs != a.step().inputs || m[i]->k != m[0]->k || si.warps != s0.warps || si.unroll != s0.unroll)
      return false;
  }
  return a.outputId(0) != b.outputId(0) && a.outputId(0) != c.outputId(0) && b.outputId(0) != c.outputId(0);
}

// MatMul a, b, c of one q8 input (decode; q, k, v where the fused QKV GEMV does not take them) → one
// minfer_gemv_triple launch (kernels/gemv_blocks.cuh GEMVB_TRIPLE): each segment with minfer_gemv_blocks'
// constants for its weight, so each output is exactly what its own GEMV writes.
Launches gemvTripleLaunches(const StepContext& a, const StepContext& b, const StepContext& c,
                            const StepContext* norm) {
  if (!fusesGemvTriple(a, b, c)) return a.error("the three matmuls cannot run as one GEMV triple");
  const StepContext* mm[3] = {&a, &b, &c};
  MatMulOperands m[3];
  const StrideTable* blk[3];
  unsigned n[3];
  kern::GemvBlocksShape shape[3];
  for (int i = 0; i < 3; ++i) {
    m[i] = *fusibleOperands(*mm[i]);
    blk[i] = decodeBlocksPlane(*m[i].w);
    n[i] = static_cast<unsigned>(m[i].n);
    shape[i] = kern::gemvBlocksShape(n[i], static_cast<unsigned>(m[i].k));
  }
  std::string key = llvm::formatv("gemv_triple_k{0}", m[0].k);
  for (int i = 0; i < 3; ++i)
    key += llvm::formatv("_{0}_g{1}_n{2}{3}", typeTag(blk[i]->ggml_type), blk[i]->group_pitch, m[i].n, m[i].bias_tag).str();
  SpecBuilder sb(key, "kernels/gemv_blocks.cuh", "minfer_gemv_triple");
  sb.define("GEMVB_TRIPLE", uint64_t{1})
      .define("GEMVB_K", m[0].k)
      .define("GEMVB_ROW_WARPS", static_cast<uint64_t>(shape[0].warps))
      .define("GEMVB_UNROLL", static_cast<uint64_t>(shape[0].unroll));
  static const char* const kNames[3][6] = {
      {"GEMVB_N0", "GEMVB_TYPE0", "GEMVB_PITCH0", "GEMVB_GROUP_PITCH0", "GEMVB_ROWS0", "GEMVB_HAS_BIAS0"},
      {"GEMVB_N1", "GEMVB_TYPE1", "GEMVB_PITCH1", "GEMVB_GROUP_PITCH1", "GEMVB_ROWS1", "GEMVB_HAS_BIAS1"},
      {"GEMVB_N2", "GEMVB_TYPE2", "GEMVB_PITCH2", "GEMVB_GROUP_PITCH2", "GEMVB_ROWS2", "GEMVB_HAS_BIAS2"}};
  for (int i = 0; i < 3; ++i)
    sb.define(kNames[i][0], m[i].n)
        .define(kNames[i][1], static_cast<uint64_t>(blk[i]->ggml_type))
        .define(kNames[i][2], blk[i]->row_pitch)
        .define(kNames[i][3], static_cast<uint64_t>(blk[i]->group_pitch))
        .define(kNames[i][4], static_cast<uint64_t>(shape[i].rows))
        .define(kNames[i][5], uint64_t{m[i].bias ? 1u : 0u});
  static const char* const kW[3] = {"w0", "w1", "w2"}, *const kBias[3] = {"bias0", "bias1", "bias2"},
                           *const kOut[3] = {"out0", "out1", "out2"};
  std::vector<KernelArgDesc> args;
  for (int i = 0; i < 3; ++i) {
    args.push_back(weightArg(kW[i], mm[i]->weightId(0), *blk[i]));
    args.push_back(biasArg(*mm[i], m[i], kBias[i]));
  }
  pushQ8Args(args, "xq", "xmeta", a.inputId(1), static_cast<uint32_t>(m[0].k), fb::Access::Read);
  for (int i = 0; i < 3; ++i) args.push_back(activationArg(kOut[i], mm[i]->outputId(0), n[i], fb::Access::Write));
  deferInputNorm(sb, args, norm, m[0].k);
  return std::vector<KernelLaunch>{{sb.spec, std::move(args), kern::gemvTripleLaunchRule(n, shape)}};
}

bool fusesGemvAddNorm(const StepContext& mm, const StepContext& add, const StepContext& norm) {
  const std::optional<MatMulOperands> m = fusibleOperands(mm);
  // (n ≤ 2³⁰: the kernel's row and block indices are int.)
  if (!m || !fusibleBlocks(mm, *m, true) || m->n % kern::kQ8Block != 0 || m->n > (uint64_t{1} << 30)) return false;
  // Whole q8 blocks of 32 rows in whole thread blocks of the GEMV's grid (gemv_blocks.cuh GEMVB_NORM).
  const unsigned rows_per_cta = kern::gemvBlocksRowsPerCta(
      kern::gemvBlocksShape(static_cast<unsigned>(m->n), static_cast<unsigned>(m->k)));
  if (kern::kQ8Block % rows_per_cta != 0) return false;
  // y may be the matmul's buffer (the plan reuses it: nothing reads the product after the Add; the launch then leaves
  // the product unwritten).
  return addNormFollows(add, norm, mm.step().outputs[0], m->n, true);
}

bool addNormFollows(const StepContext& add, const StepContext& norm, uint32_t o, uint64_t n, bool o_may_be_y) {
  const model::StepDesc &as = add.step(), &ns = norm.step();
  if (as.inputs.size() != 2 || as.outputs.size() != 1 || ns.outputs.size() != 1) return false;
  const uint32_t s = as.outputs[0], y = ns.outputs[0];
  const uint32_t res = as.inputs[0] == o ? as.inputs[1] : as.inputs[0];
  auto width = norm.input(0, "input");
  if (!width) {
    llvm::consumeError(width.takeError());
    return false;
  }
  auto weight = norm.vector(0, n);
  if (!weight) {
    llvm::consumeError(weight.takeError());
    return false;
  }
  return (as.inputs[0] == o) != (as.inputs[1] == o) && (*width)->width == n && y != s && y != res && o != res &&
         o != s && (o_may_be_y || o != y);
}

llvm::Error pushAddNormArgs(std::vector<KernelArgDesc>& args, const StepContext& add, const StepContext& norm,
                            const StepContext& quant, uint32_t o, uint32_t n) {
  if (llvm::Error e = checkFusedQuantize(quant, n)) return e;
  auto nw = norm.vector(0, n);
  if (!nw) return nw.takeError();
  const uint32_t res = add.inputId(0) == o ? add.inputId(1) : add.inputId(0);
  args.push_back(activationArg("res", res, n, fb::Access::Read));
  args.push_back(activationArg("sum", add.outputId(0), n, fb::Access::Write));
  args.push_back(weightArg("nw", norm.weightId(0), **nw));
  pushQ8Args(args, "qs", "meta", quant.outputId(0), n, fb::Access::Write);
  // The norm's output buffer (n wide, as the verifier checks the argument against it): its first n / 32 values.
  args.push_back(activationArg("partial", norm.outputId(0), n, fb::Access::Write));
  args.push_back({.kind = fb::ArgKind::Counters, .name = "counters", .bytes = uint64_t{n / kern::kQ8Block} * 4});
  return llvm::Error::success();
}

// MatMul (o or down), the residual Add, its RmsNorm and QuantizeAct (decode) → one minfer_gemv_add_norm launch
// (kernels/gemv_blocks.cuh GEMVB_NORM): the product (unless the norm's output reuses its buffer), the Add's sum,
// the q8 form of sum ⊙ w and, in the norm's output buffer, the partial sums of squares its consumers take.
Launches gemvAddNormLaunches(const StepContext& mm, const StepContext& add, const StepContext& norm,
                             const StepContext& quant) {
  if (!fusesGemvAddNorm(mm, add, norm)) return mm.error("the matmul, Add and RmsNorm cannot run as one GEMV launch");
  const MatMulOperands m = *fusibleOperands(mm);
  const StrideTable& blk = *decodeBlocksPlane(*m.w);
  const unsigned n = static_cast<unsigned>(m.n), k = static_cast<unsigned>(m.k);
  const uint32_t o = mm.outputId(0);
  SpecBuilder b = blocksGemvSpec("gemv_add_norm", "minfer_gemv_add_norm", blk, m);
  b.define("GEMVB_NORM", uint64_t{1});
  std::vector<KernelArgDesc> args{weightArg("w", mm.weightId(0), blk), biasArg(mm, m)};
  pushQ8Args(args, "xq", "xmeta", mm.inputId(1), k, fb::Access::Read);
  // Where the norm's output reuses the product's buffer, the product is not written (the partials go there).
  args.push_back(o == norm.outputId(0) ? kindArg(fb::ArgKind::Null, "out") : activationArg("out", o, n, fb::Access::Write));
  if (llvm::Error e = pushAddNormArgs(args, add, norm, quant, o, n)) return e;
  const kern::LaunchRule rule = kern::gemvBlocksLaunchRule(n, kern::gemvBlocksShape(n, k));
  return std::vector<KernelLaunch>{{b.spec, std::move(args), rule}};
}

Launches deferredNormMatmulLaunches(const StepContext& c, const StepContext& norm) {
  auto m = operands(c);
  if (!m) return m.takeError();
  const StrideTable* blk = fusibleBlocks(c, *m, true);
  if (!blk) return c.error("a matmul reading a deferred RMSNorm's q8 form needs a decode GEMV on Q4_K / Q6_K blocks");
  return blocksGemv(c, *m, *blk, &norm);
}

// MatMul gate, MatMul up, SwiGlu / GeGlu, QuantizeAct (decode) → one minfer_gemv_glu launch
// (kernels/gemv_blocks.cuh GEMVB_GLU). It writes every buffer the four steps write: the gate and up
// products (the gate buffer only when the GLU does not write its output there), the GLU output and
// its q8 form.
Launches gateUpGluLaunches(const StepContext& gate, const StepContext& up, const StepContext& glu,
                           const StepContext& quant, const StepContext* norm) {
  if (!fusesGateUp(gate, up)) return gate.error("the gate and up matmuls cannot run as one fused GEMV");
  auto m = operands(gate);
  if (!m) return m.takeError();
  auto out = glu.output(0, "output");
  if (!out) return out.takeError();
  if ((*out)->width != m->n) return glu.error(llvm::formatv("output width {0}, the matmuls give {1}", (*out)->width, m->n));
  if (llvm::Error e = checkFusedQuantize(quant, static_cast<uint32_t>(m->n))) return e;
  const StrideTable& gb = *decodeBlocksPlane(*m->w);
  const StrideTable& ub = *decodeBlocksPlane(*fusibleOperands(up)->w);
  const unsigned n = static_cast<unsigned>(m->n), k = static_cast<unsigned>(m->k);
  const bool geglu = glu.step().op == fb::OpKind::GeGlu;
  const kern::GemvBlocksShape shape = kern::gemvGluShape(n, k);
  SpecBuilder b(llvm::formatv("gemv_{0}_{1}_g{2}_n{3}_k{4}", geglu ? "geglu" : "swiglu", typeTag(gb.ggml_type),
                              gb.group_pitch, n, k),
                "kernels/gemv_blocks.cuh", "minfer_gemv_glu");
  defineBlocksGemv(b, gb, m->n, m->k, shape, false);
  b.define("GEMVB_GLU", uint64_t{geglu ? 3u : 1u});
  const uint32_t gate_buf = gate.outputId(0), out_buf = glu.outputId(0);
  std::vector<KernelArgDesc> args{weightArg("wg", gate.weightId(0), gb), weightArg("wu", up.weightId(0), ub)};
  pushQ8Args(args, "xq", "xmeta", gate.inputId(1), k, fb::Access::Read);
  args.push_back(gate_buf == out_buf ? kindArg(fb::ArgKind::Null, "gate")
                                     : activationArg("gate", gate_buf, n, fb::Access::Write));
  args.push_back(activationArg("up", up.outputId(0), n, fb::Access::Write));
  args.push_back(activationArg("out", out_buf, n, fb::Access::Write));
  pushQ8Args(args, "qs", "meta", quant.outputId(0), n, fb::Access::Write);
  args.push_back({.kind = fb::ArgKind::Counters, .name = "counters", .bytes = uint64_t{n / kern::kQ8Block} * 4});
  deferInputNorm(b, args, norm, k);
  return std::vector<KernelLaunch>{{b.spec, std::move(args), kern::gemvGluLaunchRule(n, shape)}};
}

bool fusesQkv(const StepContext& q, const StepContext& k, const StepContext& v, const StepContext& rope,
              const StepContext& attention) {
  const std::optional<MatMulOperands> mq = fusibleOperands(q), mk = fusibleOperands(k), mv = fusibleOperands(v);
  if (!mq || !mk || !mv || !fusibleBlocks(q, *mq, true) || !fusibleBlocks(k, *mk, true) || !fusibleBlocks(v, *mv, true))
    return false;
  const model::StepDesc &r = rope.step(), &a = attention.step();
  const uint64_t d = a.head_dim;
  return q.step().inputs == k.step().inputs && q.step().inputs == v.step().inputs && r.n_head == a.n_head &&
         r.n_head_kv == a.n_head_kv && r.head_dim == a.head_dim && d % 2 == 0 && a.layer >= 0 &&
         mq->n == a.n_head * d && mk->n == a.n_head_kv * d && mv->n == a.n_head_kv * d && mk->k == mq->k &&
         mv->k == mq->k;
}

// MatMul q, k, v, Rope, Attention (decode) → minfer_gemv_qkv (kernels/gemv_blocks.cuh GEMVB_QKV: the three
// products, biases, the rotation and the K/V cache store) and the attention's decode launches without
// their store; `quant`, the QuantizeAct of the attention output, rides in its combine launch as before.
Launches qkvAttentionLaunches(const StepContext& q, const StepContext& k, const StepContext& v,
                              const StepContext& rope, const StepContext& attention, const StepContext* quant,
                              const StepContext* norm) {
  if (!fusesQkv(q, k, v, rope, attention)) return q.error("the q, k and v matmuls cannot run as one fused GEMV");
  auto rc = ropeConstants(rope);
  if (!rc) return rc.takeError();
  auto after = storedAttentionLaunches(attention, quant);
  if (!after) return after.takeError();
  const model::StepDesc& a = attention.step();
  const kern::GemvBlocksShape shape = kern::gemvQkvShape();
  const StepContext* mm[3] = {&q, &k, &v};
  MatMulOperands m[3];
  const StrideTable* blk[3];
  for (int i = 0; i < 3; ++i) {
    m[i] = *fusibleOperands(*mm[i]);
    blk[i] = decodeBlocksPlane(*m[i].w);
  }
  std::string key = llvm::formatv("gemv_qkv_h{0}_hkv{1}_d{2}_k{3}_{4}", a.n_head, a.n_head_kv, a.head_dim, m[0].k, rc->key);
  for (int i = 0; i < 3; ++i)
    key += llvm::formatv("_{0}{1}{2}", typeTag(blk[i]->ggml_type), blk[i]->group_pitch, m[i].bias_tag).str();
  if (a.kv_ring != 0) key += "_ring" + std::to_string(a.kv_ring);  // the store's slot p % ring (schema Step.kv_ring)
  SpecBuilder b(key, "kernels/gemv_blocks.cuh", "minfer_gemv_qkv");
  b.define("GEMVB_QKV", uint64_t{1})
      .define("GEMVB_K", m[0].k)
      .define("QKV_NHEAD", static_cast<uint64_t>(a.n_head))
      .define("QKV_NHEAD_KV", static_cast<uint64_t>(a.n_head_kv))
      .define("QKV_HEAD_DIM", static_cast<uint64_t>(a.head_dim))
      .define("GEMVB_ROW_WARPS", static_cast<uint64_t>(shape.warps))
      .define("GEMVB_UNROLL", static_cast<uint64_t>(shape.unroll));
  const char* names[3][4] = {{"GEMVB_Q_TYPE", "GEMVB_Q_PITCH", "GEMVB_Q_GROUP_PITCH", "GEMVB_Q_HAS_BIAS"},
                             {"GEMVB_K_TYPE", "GEMVB_K_PITCH", "GEMVB_K_GROUP_PITCH", "GEMVB_K_HAS_BIAS"},
                             {"GEMVB_V_TYPE", "GEMVB_V_PITCH", "GEMVB_V_GROUP_PITCH", "GEMVB_V_HAS_BIAS"}};
  for (int i = 0; i < 3; ++i)
    b.define(names[i][0], static_cast<uint64_t>(blk[i]->ggml_type))
        .define(names[i][1], blk[i]->row_pitch)
        .define(names[i][2], static_cast<uint64_t>(blk[i]->group_pitch))
        .define(names[i][3], static_cast<uint64_t>(m[i].bias != nullptr));
  for (const auto& [name, value] : rc->defines) b.define(name, value);
  if (a.kv_ring != 0) b.define("QKV_KV_RING", static_cast<uint64_t>(a.kv_ring));
  const char* w_names[3] = {"wq", "wk", "wv"};
  const char* b_names[3] = {"bq", "bk", "bv"};
  std::vector<KernelArgDesc> args;
  for (int i = 0; i < 3; ++i) {
    args.push_back(weightArg(w_names[i], mm[i]->weightId(0), *blk[i]));
    args.push_back(m[i].bias ? weightArg(b_names[i], mm[i]->weightId(1), *m[i].bias) : kindArg(fb::ArgKind::Null, b_names[i]));
  }
  const uint32_t k_cols = static_cast<uint32_t>(m[0].k), kv_width = a.n_head_kv * a.head_dim;
  pushQ8Args(args, "xq", "xmeta", q.inputId(1), k_cols, fb::Access::Read);
  args.push_back(freqFactorsArg(rope, *rc));
  const char* out_names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i)
    args.push_back(activationArg(out_names[i], mm[i]->outputId(0), static_cast<uint32_t>(m[i].n), fb::Access::Write));
  const uint32_t layer = static_cast<uint32_t>(a.layer);
  args.push_back({.kind = fb::ArgKind::KCache, .name = "kc", .access = fb::Access::Write, .width = kv_width, .layer = layer});
  args.push_back({.kind = fb::ArgKind::VCache, .name = "vc", .access = fb::Access::Write, .width = kv_width, .layer = layer});
  args.push_back(kindArg(fb::ArgKind::Positions, "pos"));
  deferInputNorm(b, args, norm, k_cols);
  std::vector<KernelLaunch> launches{
      {b.spec, std::move(args), kern::gemvQkvLaunchRule(a.n_head, a.n_head_kv, a.head_dim, shape)}};
  for (KernelLaunch& l : *after) launches.push_back(std::move(l));
  return launches;
}

bool fusesMmqbSegments(llvm::ArrayRef<StepContext> mm) {
  if (mm.size() < 2 || mm.size() > kern::kMmqbMaxSegments) return false;
  const std::optional<MatMulOperands> first = fusibleOperands(mm[0]);
  if (!first) return false;
  for (const StepContext& c : mm) {
    const std::optional<MatMulOperands> m = fusibleOperands(c);
    if (!c.prefill() || c.inTail() || !m || !smallBatchBlocks(c, *m) || m->k != first->k ||
        c.step().inputs != mm[0].step().inputs)
      return false;
  }
  for (size_t i = 0; i < mm.size(); ++i)
    for (size_t j = i + 1; j < mm.size(); ++j)
      if (mm[i].outputId(0) == mm[j].outputId(0)) return false;
  return mm[0].maxBatch() >= kern::kMmqbFromRows && !mm[0].hasExperts();
}

llvm::Expected<SmallLaunches> mmqbSegmentsSmallLaunches(llvm::ArrayRef<StepContext> mm, SmallBatchForms forms) {
  if (mm.empty()) return llvm::createStringError(llvm::inconvertibleErrorCode(), "mmq_blocks fusion of no matmuls");
  if (!fusesMmqbSegments(mm))
    return mm[0].error(llvm::formatv("the {0} matmuls cannot run as one small-batch mmq_blocks launch", mm.size()));
  constexpr size_t kMost = kern::kMmqbMaxSegments;
  const size_t segs = mm.size();
  MatMulOperands m[kMost];
  const StrideTable* blk[kMost];
  unsigned n[kMost] = {}, type[kMost] = {};
  SmallLaunches out;
  for (size_t i = 0; i < segs; ++i) {
    m[i] = *fusibleOperands(mm[i]);
    blk[i] = smallBatchBlocks(mm[i], m[i]);
    n[i] = static_cast<unsigned>(m[i].n);
    type[i] = blk[i]->ggml_type;
    out.launches.push_back(batchedGemvLaunch(mm[i], m[i], *blk[i]));
    out.launches.back().max_rows = kern::kMmqbFromRows - 1;
  }
  const unsigned k = static_cast<unsigned>(m[0].k), nseg = static_cast<unsigned>(segs);
  const unsigned splits = kern::mmqbSplits(kern::mmqbFusedTiles(n, nseg) * kern::kMmqbTM, k);
  std::string tag;
  for (size_t i = 0; i < segs; ++i)
    tag += llvm::formatv("_{0}g{1}n{2}{3}", typeTag(type[i]), blk[i]->group_pitch, n[i], m[i].bias_tag).str();
  const char* entry = segs == 2 ? "minfer_mmq_blocks2" : "minfer_mmq_blocks3";
  // Each segment's constants: its -D names (segment 0 the plain kernel's) and its arguments' names.
  static constexpr const char* kNames[kMost][8] = {
      {"MMQB_N", "MMQB_TYPE", "MMQB_PITCH", "MMQB_GROUP_PITCH", "MMQB_HAS_BIAS", "w0", "bias0", "out0"},
      {"MMQB_N1", "MMQB_TYPE1", "MMQB_PITCH1", "MMQB_GROUP_PITCH1", "MMQB_HAS_BIAS1", "w1", "bias1", "out1"},
      {"MMQB_N2", "MMQB_TYPE2", "MMQB_PITCH2", "MMQB_GROUP_PITCH2", "MMQB_HAS_BIAS2", "w2", "bias2", "out2"}};
  // With wgmma_split_fused, the calls past kMmqbMaxRows rows on the Hopper matmul of each weight's kF16 plane instead
  // of the 64-token tile.
  bool hopper = forms.wgmma_split_fused;
  for (size_t i = 0; i < segs; ++i)
    hopper = hopper && takesWgmmaSplit(mm[i], m[i], findPlane(*m[i].w, PlaneKind::kF16));
  const unsigned most = hopper ? kern::kMmqbMaxRows : kern::kMmqbFusedMaxRows;
  pushMmqbTiles(out.launches, mm[0].maxBatch(), most, [&](unsigned tn) {
    const bool wg = forms.mmqb_wgmma && kern::mmqbWarpgroupTile(tn);
    const bool f16act = wg && forms.mmqb_f16act;
    SpecBuilder sb(llvm::formatv("mmq_blocks{0}{1}_k{2}_t{3}_s{4}{5}", segs, tag, k, tn, splits,
                                 f16act ? "_wgf16" : wg ? "_wg" : ""),
                   "kernels/mmq_blocks.cuh", entry);
    if (wg) sb.define("MMQB_WGMMA", uint64_t{1});
    if (f16act) sb.define("MMQB_F16ACT", uint64_t{1});
    sb.define("MMQB_SEGMENTS", uint64_t{segs}).define("MMQB_K", m[0].k).define("MMQB_TN", uint64_t{tn});
    sb.define("MMQB_SPLITS", uint64_t{splits});
    std::vector<KernelArgDesc> args;
    for (size_t i = 0; i < segs; ++i) {
      sb.define(kNames[i][0], m[i].n)
          .define(kNames[i][1], uint64_t{type[i]})
          .define(kNames[i][2], blk[i]->row_pitch)
          .define(kNames[i][3], uint64_t{blk[i]->group_pitch})
          .define(kNames[i][4], uint64_t{m[i].bias ? 1u : 0u});
      args.push_back(weightArg(kNames[i][5], mm[i].weightId(0), *blk[i]));
      args.push_back(biasArg(mm[i], m[i], kNames[i][6]));
    }
    // The split-K scratch; with f16 activations they come first in it, the partials after them.
    const uint64_t partial_bytes = kern::mmqbFusedPartialBytes(n, nseg, tn, splits);
    const uint64_t scratch_bytes = f16act ? kern::mmqbF16ScratchBytes(tn, k, partial_bytes) : partial_bytes;
    std::vector<KernelLaunch> launches;
    if (f16act) {
      KernelArgDesc x16{.kind = fb::ArgKind::Scratch, .name = "x16", .bytes = scratch_bytes};
      launches.push_back(mmqbF16ActLaunch(mm[0], k, x16));
      x16.name = "xq";  // the mmq_blocks kernel's parameter
      args.push_back(x16);
      args.push_back(kindArg(fb::ArgKind::Null, "xmeta"));
    } else {
      pushQ8Args(args, "xq", "xmeta", mm[0].inputId(1), k, fb::Access::Read);
    }
    for (size_t i = 0; i < segs; ++i)
      args.push_back(activationArg(kNames[i][7], mm[i].outputId(0), n[i], fb::Access::Write));
    pushSplitKArgs(args, scratch_bytes, kern::mmqbFusedCounterBytes(n, nseg), splits);
    args.push_back(kindArg(fb::ArgKind::TokenCount, "n_tokens"));
    launches.push_back({sb.spec, std::move(args), kern::mmqbFusedLaunchRule(n, type, nseg, tn, splits, f16act)});
    return launches;
  });
  if (hopper) {
    std::vector<std::pair<const StepContext*, const MatMulOperands*>> matmuls;
    for (size_t i = 0; i < segs; ++i) matmuls.emplace_back(&mm[i], &m[i]);
    for (KernelLaunch& l : wgmmaSplitLaunches(mm[0], k, matmuls, forms.wgmma_split_min_stages))
      out.launches.push_back(std::move(l));
  }
  out.rows = out.launches.back().max_rows;
  return out;
}

llvm::Expected<SmallLaunches> smallLaunchesForStep(const model::ModelDescription& desc,
                                                   llvm::ArrayRef<planes::TensorLayout> layouts, PlanVariant variant,
                                                   size_t step_index, size_t followers, SmallBatchForms forms) {
  const StepContext c(desc, layouts, variant, step_index);
  // q, k, v (or gate and up) fused for their small-batch steps (fusedFollowers): their batched GEMVs and one
  // mmq_blocks launch.
  if (variant == PlanVariant::kPrefill && (followers == 1 || followers == 2) && c.step().op == fb::OpKind::MatMul) {
    std::vector<StepContext> mm{c};
    for (size_t f = 1; f <= followers; ++f) mm.emplace_back(desc, layouts, variant, step_index + f);
    return mmqbSegmentsSmallLaunches(mm, forms);
  }
  if (variant != PlanVariant::kPrefill || followers != 0 || c.step().op != fb::OpKind::MatMul) return SmallLaunches{};
  auto m = operands(c);
  if (!m) return m.takeError();
  if (c.step().weights.empty()) return SmallLaunches{};
  SmallLaunches out;
  // The kI8 plane where the weight has one (gemm_small.cuh); else the GGUF blocks where the decode GEMV reads them
  // (Q4_K, Q6_K beside a Hopper kF16 plane: the batched GEMV, then mmq_blocks). The kI8 kernel first: at 32 and 64
  // rows it measured faster than a kernel on the blocks (BENCHMARKS.md, issue 14).
  if (!findPlane(*m->w, PlaneKind::kI8) && decodeBlocksPlane(*m->w)) {
    auto launches = smallBatchBlocksMatmul(c, *m);
    if (!launches) return launches.takeError();
    if (!launches->empty()) {
      // With wgmma_split, the Hopper matmul split over K above the mmq_blocks tiles (from kMmqbMaxRows + 1 rows).
      if (forms.wgmma_split && takesWgmmaSplit(c, *m, findPlane(*m->w, PlaneKind::kF16)) &&
          launches->back().max_rows == kern::kMmqbMaxRows)
        for (KernelLaunch& l :
             wgmmaSplitLaunches(c, static_cast<unsigned>(m->k), {{&c, &*m}}, forms.wgmma_split_min_stages))
          launches->push_back(std::move(l));
      // The last launch's bound; 0: the batched GEMV alone, up to its GEMVB_BATCH rows.
      const uint32_t top = launches->back().max_rows;
      out.rows = top ? top : std::min<uint32_t>(kern::kGemvBatchMaxRows, c.maxBatch());
      out.launches = std::move(*launches);
      return out;
    }
  }
  if (!findPlane(*m->w, PlaneKind::kI8)) return out;
  auto launches = smallBatchMatmul(c, *m);
  if (!launches) return launches.takeError();
  if (launches->empty()) return out;
  out.launches = std::move(*launches);
  // The rows up to which it beats what the step runs otherwise (gemm_small.cuh): mmq, or the Hopper f16 GEMM.
  const bool wgmma = findPlane(*m->w, PlaneKind::kF16) != nullptr;
  out.rows = std::min<uint32_t>(wgmma ? kern::kGemmSmallRowsVsWgmma : kern::kGemmSmallRowsVsMmq, c.maxBatch());
  return out;
}

Launches matmulLaunches(const StepContext& c) {
  auto m = operands(c);
  if (!m) return m.takeError();
  if (findPlane(*m->w, PlaneKind::kI8) || findPlane(*m->w, PlaneKind::kBlocks)) return quantized(c, *m);
  const StrideTable* d = densePlane(*m->w);
  if (!d) return c.error(llvm::formatv("'{0}' has neither a kI8 nor a dense plane", m->w->desc.name));
  return dense(c, *m, *d);
}

}  // namespace minfer::codegen
