// What every op family (compiler/codegen/ops/<family>.cpp) is given and builds with: the step being
// specialized with checked access to its buffers and weight planes, a spec builder, and the families'
// entry points. A family turns one plan step into its kernel uses (KernelLaunch: NVRTC spec + launch
// record); the runtime binds them from the record alone.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "compiler/codegen/kernel_spec.h"
#include "kernels/wgmma_matmul.cuh"
#include "llvm/Support/FormatVariadic.h"
#include "schema/op_traits.h"

namespace minfer::codegen {

// One plan step under specialization. Accessors return an error naming the plan, step index and name.
class StepContext {
 public:
  StepContext(const model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts, PlanVariant variant,
              size_t index);

  const model::StepDesc& step() const { return step_; }
  bool prefill() const { return variant_ == PlanVariant::kPrefill; }
  bool load() const { return variant_ == PlanVariant::kLoad; }
  uint32_t maxBatch() const { return desc_.plan.max_batch; }
  bool hasExperts() const { return desc_.config.n_expert > 0; }  // a mixture-of-experts model
  // A prefill step of the last-token tail (plan_rewrite.h lastTokenTailBegin): it runs on one row.
  bool inTail() const;

  llvm::Error error(const llvm::Twine& what) const;
  // Buffer inputs[i] / outputs[i]; `what` names it in the error ("q", "output").
  llvm::Expected<const model::BufferDesc*> input(size_t i, const char* what) const;
  llvm::Expected<const model::BufferDesc*> output(size_t i, const char* what) const;
  // The column view of input / output i (format 1.4): the step's, or (0, the buffer's width). Valid
  // after input(i) / output(i) succeeded.
  model::ColumnView inputView(size_t i) const;
  model::ColumnView outputView(size_t i) const;
  uint32_t inputId(size_t i) const { return step_.inputs[i]; }    // valid after input(i) succeeded
  uint32_t outputId(size_t i) const { return step_.outputs[i]; }  // valid after output(i) succeeded
  // Weight #i of the step (its TensorLayout) and its tensor index in the artifact.
  llvm::Expected<const planes::TensorLayout*> weight(size_t i) const;
  uint32_t weightId(size_t i) const { return step_.weights[i]; }  // valid after weight(i) succeeded
  // The f32 plane of weight #i (a norm weight or bias), checked to hold `n` values.
  llvm::Expected<const StrideTable*> vector(size_t i, uint64_t n) const;

 private:
  const model::ModelDescription& desc_;
  llvm::ArrayRef<planes::TensorLayout> layouts_;
  PlanVariant variant_;
  size_t index_;
  const model::StepDesc& step_;
};

// Builds a spec field by field: define() appends -D constants in order.
struct SpecBuilder {
  KernelSpec spec;
  SpecBuilder(std::string key, const char* source, const char* entry);
  SpecBuilder& define(const char* name, uint64_t v) { return define(name, std::to_string(v)); }
  SpecBuilder& define(const char* name, int64_t v) { return define(name, std::to_string(v)); }
  SpecBuilder& define(const char* name, std::string v);
  SpecBuilder& flag(const char* f);
};

// Launch-record arguments (schema KernelArg).
KernelArgDesc activationArg(const char* name, uint32_t buffer, uint32_t width, fb::Access access);
// An Activation argument for a column view of `buffer` (format 1.4): `pitch` is the buffer's width (the
// kernel's row pitch constant); a whole-buffer view gives the plain argument.
KernelArgDesc viewArg(const char* name, uint32_t buffer, uint32_t pitch, model::ColumnView view, fb::Access access);
KernelArgDesc weightArg(const char* name, uint32_t tensor, const StrideTable& plane);
KernelArgDesc kindArg(fb::ArgKind kind, const char* name);  // Null, Positions, TokenCount, TokenOut
// The int8 values and the Q8Meta part of a q8 buffer (kernels/common.cuh), two parameters.
void pushQ8Args(std::vector<KernelArgDesc>& args, const char* values, const char* meta, uint32_t buffer,
                uint32_t width, fb::Access access);

const StrideTable* findPlane(const planes::TensorLayout& layout, PlaneKind kind);
// The dense float plane of a layout (F32 / F16 / BF16), or nullptr.
const StrideTable* densePlane(const planes::TensorLayout& layout);
const char* denseTag(PlaneKind kind);
// A number for a key: %g without '+' ("1e-05", "1e06", "10000", "0.5").
std::string keyNumber(double v);

// Head counts of a Rope / Attention step against its q and k buffer widths (n_head a multiple of
// n_head_kv, head_dim ≤ 256). Defined in ops/attention.cpp.
llvm::Error checkHeads(const StepContext& c, uint32_t q_width, uint32_t kv_width);

// The rotation constants of a Rope step (kernels/rope.cuh ROPE_NROT, _NEOX, _BASE, _SCALE,
// _FREQ_FACTORS and the optional YaRN / MSCALE ones; not the head counts or pitches), the kernel-key
// part that names them, and its frequency-factor plane (null without). Defined in ops/rope.cpp.
struct RopeConstants {
  std::string key;
  std::vector<std::pair<const char*, std::string>> defines;
  const StrideTable* freq_factors = nullptr;
};
llvm::Expected<RopeConstants> ropeConstants(const StepContext& rope);
KernelArgDesc freqFactorsArg(const StepContext& rope, const RopeConstants& r);  // Weight or Null
// A Rope step's launch: minfer_rope, or with `paged` minfer_rope_paged (per-row positions; schema
// Step.paged_launches). Defined in ops/rope.cpp.
llvm::Expected<std::vector<KernelLaunch>> ropeLaunchesOf(const StepContext& rope, bool paged);

using Launches = llvm::Expected<std::vector<KernelLaunch>>;

// The families, one per op of schema/op_traits.h MINFER_OPS: Launches <family>Launches(const StepContext&),
// defined in ops/<family>.cpp (SwiGlu and Add share ops/elementwise.cpp, RmsNorm and HeadRmsNorm
// ops/norm.cpp). Each file names the kernels/*.cuh it specializes.
#define MINFER_DECLARE_FAMILY(kind, family, ...) Launches family##Launches(const StepContext& c);
MINFER_OPS(MINFER_DECLARE_FAMILY)
#undef MINFER_DECLARE_FAMILY

// Launch fusion (schema Step.fused, ops/fusion.cpp): steps that run inside the launch of the step
// before them. A QuantizeAct that quantizes the output of the step before it, `producer`: RmsNorm
// (rms_norm.cuh RMS_Q8, ops/norm.cpp), SwiGlu and GeGlu (elementwise.cuh EW_Q8, ops/elementwise.cpp),
// decode Attention with heads of whole blocks of 32 (attention.cuh ATT_Q8 in the combine launch,
// ops/attention.cpp); the q8 values are the QuantizeAct kernel's, bit for bit. And an RmsNorm of an
// Add's output, in the Add's launch (rms_norm.cuh RMS_ADD), with its QuantizeAct too.
// And in decode, with `gemv.glu`, MatMul gate, MatMul up, SwiGlu / GeGlu and QuantizeAct as one fused
// gate|up GEMV (gemv_blocks.cuh GEMVB_GLU, ops/matmul.cpp) where fusesGateUp allows it; with `gemv.qkv`
// MatMul q, k, v, Rope and Attention (and its QuantizeAct) as the fused QKV GEMV and the attention's
// launches (GEMVB_QKV) where fusesQkv allows it, and where that chain is not there (a q/k HeadRmsNorm before the
// Rope) MatMul q, k, v as one GEMV triple launch (GEMVB_TRIPLE) where fusesGemvTriple allows it; with `gemv.pair` two MatMuls of one input (gate and up,
// when the GLU fusion does not take them) as one GEMV pair launch (GEMVB_PAIR) where fusesGemvPair allows it;
// with `gemv.norm` MatMul, Add, RmsNorm and QuantizeAct as one GEMV launch that leaves the 1/rms to the GEMV chain
// after it (GEMVB_NORM; defersNorm in ops/fusion.cpp, planFusion below). In prefill, with `gemv.qkv`, MatMul q, k, v
// where fusesMmqbSegments allows it: the step's launches are the three steps' own, its small-batch launches one
// minfer_mmq_blocks3 (mmqbSegmentsSmallLaunches); with `gemv.prefill_pair` likewise the gate and up MatMuls of a
// GLU (gateUpGluChain, one input) as one minfer_mmq_blocks2.
// In both plans, HeadRmsNorm q, HeadRmsNorm k and their Rope as one launch (rope.cuh minfer_head_norm_rope)
// where fusesHeadNormRope allows it; in decode, where fusesHeadNormRopeStore allows it, with the Attention after
// them (and its QuantizeAct) too: that launch also stores K and V (minfer_head_norm_rope_kv), then the
// attention's own launches without kv_store. In decode, a MoeRoute with the MoeFfn after it as the MoeFfn's
// launches, the first of them routing too (moeRouteFfnLaunches), and where fusesMoeRouter allows it with the
// router MatMul before them, the first launch computing the logits too (moeRouterFfnLaunches); with `gemv.norm` and
// where the decode expert GEMVs run, the residual Add and RmsNorm after the MoeFfn in its last launch, the norm
// deferred as the GEMV + Add + RMSNorm's (fusesMoeAddNorm, defersNorm).
// fusedFollowers: how many of the steps after steps[i] run in its launches (0 … 5), none across the
// last-token tail's first step `tail`; `gemv`: which decode GEMV fusions (CodegenOptions fuse_qkv,
// fuse_glu, fuse_pair, fuse_norm) and prefill small-batch fusions (fuse_qkv, fuse_prefill_pair). fusedLaunches:
// the launches of steps[i] and those followers.
struct GemvFusions {
  bool qkv = false, glu = false, pair = false, norm = false;
  bool prefill_pair = false;  // CodegenOptions::fuse_prefill_pair
};
size_t fusedFollowers(const model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts,
                      PlanVariant variant, size_t i, size_t tail, GemvFusions gemv);
// `input_norm_step`: planFusion's input_norm of step i (the chain's launches apply that RmsNorm's 1/rms).
Launches fusedLaunches(const model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts,
                       PlanVariant variant, size_t i, size_t followers, std::optional<size_t> input_norm_step);
// With `gemv.norm`, a decode MatMul, its residual Add, the RmsNorm of the sum and its QuantizeAct run as one
// minfer_gemv_add_norm launch whose RMSNorm is deferred (gemv_blocks.cuh GEMVB_NORM: the q8 form of sum ⊙ w, the
// partial sums of squares in the norm's output buffer) where fusesGemvAddNorm allows it and every reader of the
// norm's outputs is the GEMV chain fused right after it, which applies the 1/rms (GEMVB_RMS_EPS: the fused QKV
// GEMV, the triple, the gate|up GLU GEMV or the pair); so do a decode MoeFfn's expert GEMVs with the Add, RmsNorm
// and QuantizeAct after them (moe.cuh minfer_moe_down_dec MOE_ADD_NORM) where fusesMoeAddNorm allows it.
// The fusions of one plan, decided once (generateKernels launches what this says): steps taken in order, each not
// fused into an earlier one getting fusedFollowers (none with `fuse` off, none in the load plan); `input_norm`: for
// the first step of each GEMV chain that reads a deferred RMSNorm, that RmsNorm step. An error naming the step if
// a deferring launch and its chain disagree (a compiler bug, never silently wrong launches).
struct PlanFusion {
  std::vector<size_t> followers;                  // per step: the steps after it that its launches run
  std::vector<uint8_t> fused;                     // per step: 1 when an earlier step's launches run it
  std::vector<std::optional<size_t>> input_norm;  // per step: the deferred RmsNorm its chain applies, if any
};
llvm::Expected<PlanFusion> planFusion(const model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts,
                                      PlanVariant variant, size_t tail, GemvFusions gemv, bool fuse);
Launches rmsNormQuantizeLaunches(const StepContext& norm, const StepContext& quant);
Launches addRmsNormLaunches(const StepContext& add, const StepContext& norm, const StepContext* quant);
Launches gluQuantizeLaunches(const StepContext& glu, const StepContext& quant);
Launches attentionQuantizeLaunches(const StepContext& attention, const StepContext& quant);
// Decode MatMul steps `gate` and `up` (the two inputs of the GLU step that follows them) can run as one
// minfer_gemv_glu launch: same inputs, no bias, kBlocks planes of one type and geometry that the decode
// GEMV reads, and a width of whole blocks of 32 (ops/matmul.cpp).
// Whether a decode MatMul (o or down), the residual Add of its output, the RmsNorm of the sum (and the
// QuantizeAct after it, checked by the launches) can run as one minfer_gemv_add_norm launch (gemv_blocks.cuh
// GEMVB_NORM): a q8 input and a kBlocks plane the decode GEMV reads, N % 32 == 0 with whole q8 blocks in whole
// thread blocks, the norm as wide as the matmul with its weight, and the norm's output distinct from the other
// buffers.
bool fusesGemvAddNorm(const StepContext& mm, const StepContext& add, const StepContext& norm);
// Shared by it and fusesMoeAddNorm: the Add reads the product's buffer `o` (n values) once and one other buffer, the
// RmsNorm reads the sum, n wide, with its weight, and its output is distinct from the sum and the residual, o from
// the residual and the sum (and from the norm's output unless `o_may_be_y`).
bool addNormFollows(const StepContext& add, const StepContext& norm, uint32_t o, uint64_t n, bool o_may_be_y);
// The arguments after the product of a GEMV + Add + deferred RMSNorm launch (minfer_gemv_add_norm; moe.cuh
// minfer_moe_down_dec with MOE_ADD_NORM): res, sum (n f32), the norm weight, the q8 form (values, meta), the
// partial sums of squares (in the norm's output buffer) and n / 32 counter words. Errors: the QuantizeAct's
// (checkFusedQuantize) and the norm weight's.
llvm::Error pushAddNormArgs(std::vector<KernelArgDesc>& args, const StepContext& add, const StepContext& norm,
                            const StepContext& quant, uint32_t o, uint32_t n);
// Their launch, writing the matmul's product (unless the norm's output reuses its buffer), the Add's sum, the
// QuantizeAct's q8 buffer (the q8 form of sum ⊙ w) and in the RmsNorm's output buffer the partial sums of squares
// (GEMVB_NORM; only for a norm whose consumers planFusion names). An error naming the matmul step unless
// fusesGemvAddNorm; the QuantizeAct's and the weight's errors as theirs.
Launches gemvAddNormLaunches(const StepContext& mm, const StepContext& add, const StepContext& norm,
                             const StepContext& quant);
// A decode MatMul on Q4_K / Q6_K blocks whose q8 input is the deferred RmsNorm `norm`'s: minfer_gemv_blocks with
// GEMVB_RMS_EPS (a fused QKV GEMV chain's paged launches). An error naming the step for another weight or plan.
Launches deferredNormMatmulLaunches(const StepContext& c, const StepContext& norm);
// Whether three decode MatMul steps (q, k, v where the fused QKV GEMV does not take them: a q/k HeadRmsNorm
// between them and the Rope) can run as one GEMV triple launch (gemv_blocks.cuh GEMVB_TRIPLE): one q8 input,
// distinct outputs, kBlocks planes the decode GEMV reads (any mix of Q4_K and Q6_K, pitches and biases), the same
// k, and gemvBlocksShape giving the three the same warps and unroll.
bool fusesGemvTriple(const StepContext& a, const StepContext& b, const StepContext& c);
// Whether two or three prefill MatMul steps of one q8 input (gate and up; q, k, v) can take one small-batch launch,
// minfer_mmq_blocks2 or minfer_mmq_blocks3 (kernels/mmq_blocks.cuh MMQB_SEGMENTS): not in the last-token tail,
// distinct outputs, the same k, each weight on a kBlocks plane the decode GEMV reads and without a kI8 plane (as
// smallLaunchesForStep's mmq_blocks), max_batch ≥ kMmqbFromRows and no experts. fusedFollowers then fuses them (the
// step's launches: the steps' own in turn; its small-batch launches: mmqbSegmentsSmallLaunches). False for fewer
// than two or more than kMmqbMaxSegments steps.
bool fusesMmqbSegments(llvm::ArrayRef<StepContext> mm);
// Their launch: minfer_gemv_triple, writing the three outputs as their own minfer_gemv_blocks launches would. An
// error naming step `a` unless fusesGemvTriple. `norm` (here and in the pair, GLU and QKV launches below): the
// deferred RmsNorm whose q8 form the chain reads (planFusion's input_norm), or null.
Launches gemvTripleLaunches(const StepContext& a, const StepContext& b, const StepContext& c,
                            const StepContext* norm);
// Whether two decode MatMul steps (e.g. gate and up) can run as one GEMV pair launch (gemv_blocks.cuh
// GEMVB_PAIR): one q8 input, distinct outputs, kBlocks planes of one type and geometry, the same n and k,
// both with a bias or neither.
bool fusesGemvPair(const StepContext& a, const StepContext& b);
// Their launch: minfer_gemv_pair, writing both outputs. An error naming step `a` unless fusesGemvPair.
Launches gemvPairLaunches(const StepContext& a, const StepContext& b, const StepContext* norm);
bool fusesGateUp(const StepContext& gate, const StepContext& up);
// The one launch of those steps and the GLU's QuantizeAct `quant`: writes the gate and up products, the GLU
// output and its q8 form, with N / 32 counter words. An error naming the step unless fusesGateUp.
Launches gateUpGluLaunches(const StepContext& gate, const StepContext& up, const StepContext& glu,
                           const StepContext& quant, const StepContext* norm);
// Decode MatMul steps q, k, v, the Rope of q and k and the Attention of the three (whole buffers, one q8
// input, kBlocks planes the decode GEMV reads) can run as one minfer_gemv_qkv launch that also stores K
// and V, followed by the attention's own launches without its store (ops/matmul.cpp).
bool fusesQkv(const StepContext& q, const StepContext& k, const StepContext& v, const StepContext& rope,
              const StepContext& attention);
// Their launches: minfer_gemv_qkv (q and k rotated, v, and K and V into the layer's caches at the position),
// then the decode attention's without kv_store; `quant` its QuantizeAct or null. An error naming the step
// unless fusesQkv.
Launches qkvAttentionLaunches(const StepContext& q, const StepContext& k, const StepContext& v,
                              const StepContext& rope, const StepContext& attention, const StepContext* quant,
                              const StepContext* norm);
// The HeadRmsNorm of q, the HeadRmsNorm of k and the Rope of the two (steps[i .. i+2], prefill or decode;
// qwen3, qwen3moe, gemma3) can run as one minfer_head_norm_rope launch (kernels/rope.cuh ROPE_NORM_EPS): the
// norms in place on the Rope's q and k, whole buffers, the norms' heads and head size the Rope's, one epsilon.
// headNormRopeChain checks the steps' ops and buffers, fusesHeadNormRope their shapes too (ops/fusion.cpp).
bool headNormRopeChain(const std::vector<model::StepDesc>& steps, size_t i);
bool fusesHeadNormRope(const StepContext& q_norm, const StepContext& k_norm, const StepContext& rope);
// Their launch (`paged`: the batch session's, at per-row positions), writing q and k normalized and rotated,
// bit-identical to minfer_head_rms_norm twice and minfer_rope (or minfer_rope_paged). An error naming the q
// norm step unless fusesHeadNormRope; the weights' and rotation constants' errors as the steps' own (ops/rope.cpp).
Launches headNormRopeLaunches(const StepContext& q_norm, const StepContext& k_norm, const StepContext& rope,
                              bool paged);
// In decode, the Attention step after that Rope (steps[i+3]) can take K and V stored by the same launch
// (minfer_head_norm_rope_kv, kernels/rope.cuh ROPE_KV_STORE): it attends over the Rope's q and k and a third
// buffer v, whole buffers, with the Rope's heads, and has a KV-cache layer (ops/rope.cpp).
bool fusesHeadNormRopeStore(const StepContext& rope, const StepContext& attention);
// Their launches: minfer_head_norm_rope_kv (q and k normalized and rotated as headNormRopeLaunches writes them,
// and k and v as f16 into the layer's caches at the position, as minfer_kv_store writes them; the ring slot of a
// Step.kv_ring layer), then the decode attention's without kv_store (storedAttentionLaunches); `quant` its
// QuantizeAct or null. An error naming the q norm step unless fusesHeadNormRope and fusesHeadNormRopeStore.
Launches headNormRopeAttentionLaunches(const StepContext& q_norm, const StepContext& k_norm, const StepContext& rope,
                                       const StepContext& attention, const StepContext* quant);
// The decode plan's MoeRoute and the MoeFfn step after it (which takes its expert ids and weights) as the MoeFfn's
// launches with the sort launch routing too (kernels/moe.cuh minfer_moe_route_sort: ids and weights as
// minfer_moe_route writes them, the sort's scratch as minfer_moe_sort's), then gate/up and down + combine
// (ops/moe.cpp). Errors: the route's and the MoeFfn's own, a prefill step, a MoeFfn not fed by this router.
// With `add_norm` (fusesMoeAddNorm allowed it) the residual Add after the MoeFfn, the RmsNorm of the sum and its
// QuantizeAct run in the last launch, the norm deferred to the GEMVs that read its q8 form (moe.cuh
// minfer_moe_down_dec with MOE_ADD_NORM: the MoeFfn's output, the Add's sum, the q8 form of sum ⊙ w and the partial
// sums of squares in the norm's output buffer, as gemvAddNormLaunches writes them); an error naming the MoeFfn
// unless fusesMoeAddNorm, the QuantizeAct's and the norm weight's as theirs.
struct AddNormSteps {
  const StepContext &add, &norm, &quant;
};
Launches moeRouteFfnLaunches(const StepContext& route, const StepContext& ffn, const AddNormSteps* add_norm);
// Whether the residual Add after a decode MoeFfn step and the RmsNorm of the sum can run in its last launch (the
// decode expert GEMVs: gate, up and down read from their blocks, K ≤ 32): the Add of the MoeFfn's output and one
// other buffer, the norm as wide as n_embd with its weight, its output distinct from the sum, the residual, the
// MoeFfn's output (which the kernel always writes) and the expert ids and weights, and the MoeFfn's output distinct
// from the sum and the residual (ops/moe.cpp).
bool fusesMoeAddNorm(const StepContext& ffn, const StepContext& add, const StepContext& norm);
// Whether the decode router MatMul `mm` before that MoeRoute can run in the same first launch too
// (minfer_moe_router_sort): one f32 input, the MoeFfn's x, a dense float weight (no kI8 or kBlocks plane) of
// n_expert rows of the MoeFfn's width with 16-byte aligned rows, its output the route's input (ops/moe.cpp).
bool fusesMoeRouter(const StepContext& mm, const StepContext& route, const StepContext& ffn);
// The three steps as the MoeFfn's launches, the first computing the logits (dense_gemv's values), routing and
// sorting (minfer_moe_router_sort). Errors as moeRouteFfnLaunches, and one naming the MatMul unless fusesMoeRouter.
Launches moeRouterFfnLaunches(const StepContext& mm, const StepContext& route, const StepContext& ffn,
                              const AddNormSteps* add_norm);
// The decode attention's launches after a fused QKV GEMV stored K and V (ops/attention.cpp).
Launches storedAttentionLaunches(const StepContext& attention, const StepContext* quant);
// The paged launches of step `step_index` of the prefill or decode plan (schema Step.paged_launches,
// ops/paged_attention.cpp), given how many steps after it run in its launches (`followers`): for a Rope step
// without followers minfer_rope_paged; for an Attention step minfer_kv_store_paged and minfer_attn_paged, all
// with per-row positions and block tables (kernels/paged_attention.cuh); with one follower that is a
// QuantizeAct (the decode plan's fusion) the attention also writes its q8 form (PA_Q8); for a q MatMul with
// the fused QKV GEMV's chain (4 or 5 followers) the three GEMVs' own launches (deferredNormMatmulLaunches where
// the chain reads a deferred RMSNorm: planFusion's `input_norm_step`), minfer_rope_paged and the attention's paged
// launches; for a q HeadRmsNorm with the head-norm RoPE chain (2 followers)
// minfer_head_norm_rope at per-row positions, and with the Attention too (3 or 4 followers) that launch, then the
// attention's paged launches (minfer_kv_store_paged, minfer_attn_paged). None for other ops (row-wise launches serve a batch as they are) or other
// fusions, for attention groups too wide for the
// kernel's shared memory, or a q8 form of heads that are not whole blocks of 32. Errors as the step's own
// launches.
Launches pagedLaunchesForStep(const model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts,
                              PlanVariant variant, size_t step_index, size_t followers,
                              std::optional<size_t> input_norm_step);
// The small-batch launches of step `step_index` of the prefill plan (schema Step.small_launches, 1.7,
// ops/matmul.cpp) and the largest call they serve (small_rows): for a MatMul step with no followers on a
// quantized weight and a q8 input, on a kBlocks plane the decode GEMV reads (Q4_K, Q6_K) where the weight has no kI8
// plane: minfer_gemv_batch (kernels/gemv_blocks.cuh GEMVB_BATCH) for calls of 1 ≤ n_tokens < kMmqbFromRows and
// minfer_mmq_blocks (kernels/mmq_blocks.cuh, tiles of 16 and 32 tokens) from there to min(kMmqbMaxRows, max_batch),
// each launch with its row range (KernelLaunch min_rows / max_rows; with max_batch below kMmqbFromRows or in a model
// with experts the batched GEMV alone, up to min(kGemvBatchMaxRows, max_batch)); else, on a weight with a kI8 plane,
// minfer_gemm_small
// (kernels/gemm_small.cuh) on the plane the decode GEMV reads, for calls of 1 ≤ n_tokens ≤ min(kGemmSmallRowsVsMmq
// or, for a weight with a kF16 plane (Hopper prefill), kGemmSmallRowsVsWgmma, max_batch). None (small_rows 0) for
// other steps, plans or weights (float weights; other types whose only prefill plane is kF16). With 2 followers (the
// prefill q, k, v fusesMmqbSegments fused) or 1 (gate and up, likewise) mmqbSegmentsSmallLaunches. Errors as the
// step's own launches. `forms` (sm_90a images only: CodegenOptions, which generateKernels passes; the default here,
// all off, is what the unit tests check): with mmqb_wgmma the fused mmq_blocks launches' tiles that mmqbWarpgroupTile
// names in their warpgroup form (kernels/mmq_blocks.cuh MMQB_WGMMA; the plain kernel's tiles, up to kMmqbMaxRows, are
// none of them), and with mmqb_f16act too those tiles on f16 activations (MMQB_F16ACT: minfer_mmqb_f16_act stages the
// q8 input as f16 at byte 0 of the step's scratch, then the mmq_blocks launch, its partials after them); with
// wgmma_split, on a weight that also has a kF16 plane (Hopper prefill), the plain matmuls' calls of
// kMmqbMaxRows + 1 … min(64, max_batch) rows on the Hopper matmul split over K (minfer_q8_to_f16, then
// minfer_wgmma_matmul_split with wgmmaSplits' count at wgmma_split_min_stages, or minfer_wgmma_matmul on its 64 × 64
// tile where that is 1), not
// in the last-token tail; with wgmma_split_fused likewise the fused q, k, v and gate and up (their mmq_blocks tiles
// then stop at kMmqbMaxRows: one minfer_q8_to_f16 and each matmul's Hopper launch in turn past it).
struct SmallLaunches {
  std::vector<KernelLaunch> launches;
  uint32_t rows = 0;
};
struct SmallBatchForms {
  bool mmqb_wgmma = false;         // CodegenOptions::mmqb_wgmma
  bool mmqb_f16act = false;        // CodegenOptions::mmqb_f16act (with mmqb_wgmma)
  bool wgmma_split = false;        // CodegenOptions::wgmma_split
  bool wgmma_split_fused = false;  // CodegenOptions::wgmma_split_fused
  unsigned wgmma_split_min_stages = kern::kWgmmaSplitMinStages;  // wgmmaSplits' min_stages
};
llvm::Expected<SmallLaunches> smallLaunchesForStep(const model::ModelDescription& desc,
                                                   llvm::ArrayRef<planes::TensorLayout> layouts, PlanVariant variant,
                                                   size_t step_index, size_t followers, SmallBatchForms forms = {});
// The small-batch launches of the prefill matmuls that fusesMmqbSegments allows (smallLaunchesForStep with 1 or 2
// followers): each step's batched GEMV below kMmqbFromRows rows, then minfer_mmq_blocks2 or minfer_mmq_blocks3 in
// tiles of 16, 32 and 64 tokens up to min(kMmqbFusedMaxRows, max_batch), split over K as mmqbSplits gives for the
// matrices' row tiles together; each output as minfer_mmq_blocks would write it with those splits (with
// forms.mmqb_wgmma and forms.mmqb_f16act each warpgroup tile after a minfer_mmqb_f16_act launch of the same rows; with
// forms.wgmma_split_fused and a kF16 plane for every matrix, the tiles stop at kMmqbMaxRows and the calls past it
// take minfer_q8_to_f16 and each matmul's Hopper matmul of the split form's tile). An error naming the first step
// unless fusesMmqbSegments.
llvm::Expected<SmallLaunches> mmqbSegmentsSmallLaunches(llvm::ArrayRef<StepContext> mm, SmallBatchForms forms = {});
// The check the q8 forms make of `quant`: its output is an I8 buffer of the producer's width, a multiple of 32.
llvm::Error checkFusedQuantize(const StepContext& quant, uint32_t width);

}  // namespace minfer::codegen
