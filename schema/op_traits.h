// Op traits: the arity, the Step fields and the properties of each plan op (schema OpKind), in one
// constexpr table that the compiler (graph builder, tail marking), the artifact verifier and the CPU
// backend all read (STYLE.md "Constant facts are constexpr traits").
#pragma once

#include <cstdint>

#include "schema/artifact_generated.h"

namespace minfer {

// Step fields an op reads besides inputs/outputs/weights (bit set). Each marked count must be > 0.
enum StepField : uint32_t {
  kFieldEps = 1u << 0,      // eps (may be 0)
  kFieldHeads = 1u << 1,    // n_head
  kFieldKvHeads = 1u << 2,  // n_head_kv (n_head a multiple of it)
  kFieldHeadDim = 1u << 3,  // head_dim
  kFieldRope = 1u << 4,     // n_rot (even, ≤ head_dim), rope_style, rope_freq_base, rope_freq_scale
  kFieldLayer = 1u << 5,    // layer (a KV cache layer, ≥ 0)
  kFieldShape = 1u << 6,    // rows (out features), cols (in features)
  kFieldExperts = 1u << 7,  // n_expert, n_expert_used (n_expert_used ≤ n_expert)
};

struct OpTraits {
  const char* name;
  uint8_t min_inputs, max_inputs;    // buffer ids
  uint8_t outputs;                   // buffer ids
  uint8_t min_weights, max_weights;  // tensor indices
  uint32_t fields;                   // StepField bits
  bool row_wise;   // output row t depends only on row t of the inputs (no KV cache, no positions)
  bool in_place;   // outputs[i] == inputs[i]
  bool gpu_only;   // a GPU-side step the CPU backend skips (QuantizeAct)
};

// Every op, in OpKind order, as X(Kind, family, min_inputs, max_inputs, outputs, min_weights,
// max_weights, fields, row_wise, in_place, gpu_only). `family` names the op's implementations: the
// compiler's op family <family>Launches (compiler/codegen/ops/) and the CPU backend's <family>Prepare
// and <family>Run (runtime/cpu/ops/); those dispatch tables are expanded from this list, so a new op
// is one line here.
// Inputs, outputs and weights in order:
//   Embed        ids → x                     weights: token_embd
//   RmsNorm      x → out                     weights: w (width of x)
//   MatMul       x [, q8 copy of x] → out    weights: W [, bias]   (the q8 copy: GPU plan rewrite)
//   Rope         q, k → q, k                 weights: [frequency factors (n_rot/2, f32)]   (in place)
//   Attention    q, k, v → out               (writes K/V of the batch into the cache of `layer` first)
//   SwiGlu       gate, up → out              Add  a, b → out
//   HeadRmsNorm  x → x                       weights: w (head_dim)
//   QuantizeAct  x → q8                      (GPU only)
//   Scale        x → out                     (scale, softcap; out may equal x)
//   GeGlu        gate, up → out
//   ExpandBlocks (no buffers)                weights: W (its kBlocks plane → its derived planes; load plan,
//                                            GPU only: the CPU reads the kBlocks plane itself)
//   MoeRoute     logits → ids (I32), w       (router logits n_expert → top n_expert_used ids and weights)
//   MoeFfn       x, ids, w → out             weights: gate_exps, up_exps, down_exps (expert axis planes);
//                                            row-wise in its math, but marked not row-wise: its GPU kernels
//                                            pass tokens sorted by expert through step scratch, which a
//                                            last-token tail launch may not use, so the tail starts after it
#define MINFER_OPS(X)                                                                                      \
  X(Embed, embed, 1, 1, 1, 1, 1, 0, true, false, false)                                                     \
  X(RmsNorm, rmsNorm, 1, 1, 1, 1, 1, kFieldEps, true, false, false)                                         \
  X(MatMul, matmul, 1, 2, 1, 1, 2, kFieldShape, true, false, false)                                         \
  X(Rope, rope, 2, 2, 2, 0, 1, kFieldHeads | kFieldKvHeads | kFieldHeadDim | kFieldRope, false, true, false)  \
  X(Attention, attention, 3, 3, 1, 0, 0, kFieldHeads | kFieldKvHeads | kFieldHeadDim | kFieldLayer, false,   \
    false, false)                                                                                           \
  X(SwiGlu, swiglu, 2, 2, 1, 0, 0, 0, true, false, false)                                                   \
  X(Add, add, 2, 2, 1, 0, 0, 0, true, false, false)                                                         \
  X(HeadRmsNorm, headRmsNorm, 1, 1, 1, 1, 1, kFieldEps | kFieldHeads | kFieldHeadDim, true, true, false)     \
  X(QuantizeAct, quantizeAct, 1, 1, 1, 0, 0, 0, true, false, true)                                         \
  X(Scale, scale, 1, 1, 1, 0, 0, 0, true, false, false)                                                     \
  X(GeGlu, geglu, 2, 2, 1, 0, 0, 0, true, false, false)                                                    \
  X(ExpandBlocks, expandBlocks, 0, 0, 0, 1, 1, 0, false, false, true)                                      \
  X(MoeRoute, moeRoute, 1, 1, 2, 0, 0, kFieldExperts, true, false, false)                                   \
  X(MoeFfn, moeFfn, 3, 3, 1, 3, 3, kFieldShape | kFieldExperts, false, false, false)

#define MINFER_OP_TRAITS_ROW(kind, family, in0, in1, out, w0, w1, fields, row_wise, in_place, gpu_only) \
  {#kind, in0, in1, out, w0, w1, fields, row_wise, in_place, gpu_only},
inline constexpr OpTraits kOpTraits[] = {MINFER_OPS(MINFER_OP_TRAITS_ROW)};
#undef MINFER_OP_TRAITS_ROW
static_assert(sizeof(kOpTraits) / sizeof(kOpTraits[0]) == static_cast<size_t>(fb::OpKind::MAX) + 1,
              "one MINFER_OPS entry per OpKind");
constexpr bool sameOpName(const char* a, const char* b) { return *a == *b && (*a == 0 || sameOpName(a + 1, b + 1)); }
// The list is in OpKind order: row OpKind::K is K's.
#define MINFER_OP_ORDER(kind, ...) \
  static_assert(sameOpName(kOpTraits[static_cast<size_t>(fb::OpKind::kind)].name, #kind), "MINFER_OPS order");
MINFER_OPS(MINFER_OP_ORDER)
#undef MINFER_OP_ORDER

// The traits of `op`, or nullptr for a value outside OpKind (a damaged or newer artifact).
constexpr const OpTraits* opTraits(fb::OpKind op) {
  const auto i = static_cast<size_t>(op);
  return i <= static_cast<size_t>(fb::OpKind::MAX) ? &kOpTraits[i] : nullptr;
}

// 1.4: whether steps of `op` may have column views (schema Step.input_views / output_views, ColumnView):
// both backends honour them for these ops (their kernels and CPU ops take a row pitch); the compiler,
// the verifier and the CPU backend refuse views on any other op.
constexpr bool takesColumnViews(fb::OpKind op) {
  return op == fb::OpKind::Rope || op == fb::OpKind::Attention || op == fb::OpKind::SwiGlu ||
         op == fb::OpKind::GeGlu || op == fb::OpKind::Add;
}

// "MatMul", or "unknown" outside OpKind.
constexpr const char* opName(fb::OpKind op) {
  const OpTraits* t = opTraits(op);
  return t ? t->name : "unknown";
}

}  // namespace minfer
