// Launch fusion (schema Step.fused): a step runs inside the launch of the step before it (see
// op_family.h). Which steps fuse, chains of them, and the check the q8 forms make.
#include <algorithm>
#include <optional>

#include "compiler/codegen/ops/op_family.h"

namespace minfer::codegen {

namespace {

// Column views (phi3's gate|up halves) keep their own kernels: the fused forms take whole buffers.
bool wholeBuffers(const model::StepDesc& s) { return s.input_views.empty() && s.output_views.empty(); }

// `next` reads the output of `step` as its only (first) input.
bool consumes(const model::StepDesc& step, const model::StepDesc& next) {
  return step.outputs.size() == 1 && !next.inputs.empty() && next.inputs[0] == step.outputs[0];
}

bool fusesQuantize(const model::StepDesc& producer, const model::StepDesc& quant, PlanVariant variant) {
  const bool decode_attention =
      producer.op == fb::OpKind::Attention && variant == PlanVariant::kDecode && producer.head_dim % 32 == 0;
  const bool carrier = producer.op == fb::OpKind::RmsNorm || producer.op == fb::OpKind::SwiGlu ||
                       producer.op == fb::OpKind::GeGlu || decode_attention;
  // Attention's output is always a whole buffer; its q, k, v may be views (phi3) without changing the
  // combine kernel that carries the quantization.
  const bool whole = decode_attention ? producer.output_views.empty() : wholeBuffers(producer);
  return carrier && whole && quant.op == fb::OpKind::QuantizeAct && quant.inputs.size() == 1 &&
         consumes(producer, quant);
}

// A residual Add whose sum the next step RmsNorms (rms_norm.cuh RMS_ADD).
bool fusesAddNorm(const model::StepDesc& add, const model::StepDesc& norm) {
  return add.op == fb::OpKind::Add && norm.op == fb::OpKind::RmsNorm && wholeBuffers(add) && add.inputs.size() == 2 &&
         consumes(add, norm);
}

// steps[i .. i+3]: MatMul gate, MatMul up, the GLU of their outputs (gate first), and its QuantizeAct.
bool gateUpGluChain(const std::vector<model::StepDesc>& steps, size_t i) {
  const model::StepDesc &gate = steps[i], &up = steps[i + 1], &glu = steps[i + 2];
  const bool glu_op = glu.op == fb::OpKind::SwiGlu || glu.op == fb::OpKind::GeGlu;
  return gate.op == fb::OpKind::MatMul && up.op == fb::OpKind::MatMul && glu_op && wholeBuffers(gate) &&
         wholeBuffers(up) && wholeBuffers(glu) && gate.outputs.size() == 1 && up.outputs.size() == 1 &&
         glu.inputs.size() == 2 && glu.inputs[0] == gate.outputs[0] && glu.inputs[1] == up.outputs[0] &&
         gate.outputs[0] != up.outputs[0] && glu.outputs.size() == 1 && glu.outputs[0] != up.outputs[0] &&
         fusesQuantize(glu, steps[i + 3], PlanVariant::kDecode);
}

// steps[i .. i+4]: MatMul q, MatMul k, MatMul v, the Rope of q and k in place, and the Attention of the
// three, whole buffers.
bool qkvChain(const std::vector<model::StepDesc>& steps, size_t i) {
  const model::StepDesc &q = steps[i], &k = steps[i + 1], &v = steps[i + 2], &rope = steps[i + 3], &att = steps[i + 4];
  for (const model::StepDesc* s : {&q, &k, &v, &rope, &att})
    if (!wholeBuffers(*s)) return false;
  for (const model::StepDesc* s : {&q, &k, &v})
    if (s->op != fb::OpKind::MatMul || s->outputs.size() != 1) return false;
  const std::vector<uint32_t> qk{q.outputs[0], k.outputs[0]};
  return rope.op == fb::OpKind::Rope && att.op == fb::OpKind::Attention && rope.inputs == qk && rope.outputs == qk &&
         att.inputs == std::vector<uint32_t>{q.outputs[0], k.outputs[0], v.outputs[0]} && q.outputs[0] != k.outputs[0] &&
         q.outputs[0] != v.outputs[0] && k.outputs[0] != v.outputs[0];
}

// steps[i .. i+3]: a step of kind `op` with one output, the Add of that output and one other buffer, the RmsNorm
// of the sum and its QuantizeAct, whole buffers.
bool addNormChain(const std::vector<model::StepDesc>& steps, size_t i, fb::OpKind op) {
  const model::StepDesc &p = steps[i], &add = steps[i + 1], &norm = steps[i + 2];
  return p.op == op && wholeBuffers(p) && p.outputs.size() == 1 && add.op == fb::OpKind::Add &&
         add.inputs.size() == 2 && (add.inputs[0] == p.outputs[0] || add.inputs[1] == p.outputs[0]) &&
         fusesAddNorm(add, norm) && wholeBuffers(norm) && norm.outputs.size() == 1 &&
         fusesQuantize(norm, steps[i + 3], PlanVariant::kDecode);
}

// A MatMul's (gemv_blocks.cuh minfer_gemv_add_norm) and a MoeFfn's (moe.cuh minfer_moe_down_dec, MOE_ADD_NORM).
bool gemvNormChain(const std::vector<model::StepDesc>& steps, size_t i) {
  return addNormChain(steps, i, fb::OpKind::MatMul);
}
bool moeNormChain(const std::vector<model::StepDesc>& steps, size_t i) {
  return addNormChain(steps, i, fb::OpKind::MoeFfn);
}

// steps[i], steps[i+1]: two MatMuls of one input into distinct whole buffers (gate and up).
bool gemvPairChain(const std::vector<model::StepDesc>& steps, size_t i) {
  const model::StepDesc &a = steps[i], &b = steps[i + 1];
  return a.op == fb::OpKind::MatMul && b.op == fb::OpKind::MatMul && wholeBuffers(a) && wholeBuffers(b) &&
         a.outputs.size() == 1 && b.outputs.size() == 1 && a.outputs[0] != b.outputs[0] && a.inputs == b.inputs;
}

// steps[i .. i+3]: the gate and up MatMuls of a GLU reading one input (gemvPairChain and gateUpGluChain), the prefill
// pair fusesMmqbSegments may run as one small-batch launch.
bool gluPairChain(const std::vector<model::StepDesc>& steps, size_t i) {
  return i + 3 < steps.size() && gemvPairChain(steps, i) && gateUpGluChain(steps, i);
}

// steps[i .. i+2]: three MatMuls of one input into distinct whole buffers (q, k, v).
bool gemvTripleChain(const std::vector<model::StepDesc>& steps, size_t i) {
  return gemvPairChain(steps, i) && gemvPairChain(steps, i + 1) && steps[i].outputs[0] != steps[i + 2].outputs[0];
}

// steps[i], steps[i+1]: a MoeRoute and the MoeFfn that takes its expert ids and weights, whole buffers.
bool moeRouteFfnChain(const std::vector<model::StepDesc>& steps, size_t i) {
  const model::StepDesc &r = steps[i], &f = steps[i + 1];
  return r.op == fb::OpKind::MoeRoute && f.op == fb::OpKind::MoeFfn && wholeBuffers(r) && wholeBuffers(f) &&
         r.outputs.size() == 2 && f.inputs.size() == 3 && f.inputs[1] == r.outputs[0] && f.inputs[2] == r.outputs[1] &&
         r.n_expert == f.n_expert && r.n_expert_used == f.n_expert_used;
}

// steps[i .. i+2]: a MatMul whose output the MoeRoute of moeRouteFfnChain(steps, i + 1) routes.
bool moeRouterChain(const std::vector<model::StepDesc>& steps, size_t i) {
  const model::StepDesc& mm = steps[i];
  return mm.op == fb::OpKind::MatMul && wholeBuffers(mm) && mm.outputs.size() == 1 && moeRouteFfnChain(steps, i + 1) &&
         steps[i + 1].inputs.size() == 1 && steps[i + 1].inputs[0] == mm.outputs[0];
}

// Whether the GEMV chain of fusedFollowers that starts at decode step j (f followers) is one whose launches take a
// deferred RMSNorm's q8 form (gemv_blocks.cuh GEMVB_RMS_EPS): the fused QKV GEMV, the triple, the gate|up GLU
// GEMV, the pair.
bool normConsumerChain(const std::vector<model::StepDesc>& steps, size_t j, size_t f) {
  return (f >= 4 && qkvChain(steps, j)) || (f == 2 && gemvTripleChain(steps, j)) ||
         (f == 3 && gateUpGluChain(steps, j)) || (f == 1 && gemvPairChain(steps, j));
}

bool reads(const model::StepDesc& s, uint32_t buffer) {
  return std::find(s.inputs.begin(), s.inputs.end(), buffer) != s.inputs.end();
}
bool writes(const model::StepDesc& s, uint32_t buffer) {
  return std::find(s.outputs.begin(), s.outputs.end(), buffer) != s.outputs.end();
}

// Decode steps i .. i+3: a MatMul or the MoeFfn of the decode expert GEMVs, residual Add, RmsNorm, QuantizeAct
// (gemvNormChain, moeNormChain) whose 1/rms the launch leaves to the GEMVs after them (minfer_gemv_add_norm,
// minfer_moe_down_dec with MOE_ADD_NORM): with `gemv.norm`, where fusesGemvAddNorm or fusesMoeAddNorm allows it and
// every reader of the norm's f32 output y and of its q8 form, until each is written again, is a MatMul of the GEMV
// chain that fusedFollowers fuses right after the QuantizeAct and that takes a deferred norm (normConsumerChain),
// reading y (its unused f32 input) and the q8 form and nothing else of them; and the q8 form is not the matmul's own
// q8 input. y then holds the partial sums of squares.
bool defersNorm(const model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts, PlanVariant variant,
                size_t i, GemvFusions gemv) {
  const std::vector<model::StepDesc>& steps = planSteps(desc.plan, variant);
  if (!gemv.norm || variant != PlanVariant::kDecode || i + 4 >= steps.size()) return false;
  const auto ctx = [&](size_t k) { return StepContext(desc, layouts, variant, k); };
  if (gemvNormChain(steps, i)) {
    if (!fusesGemvAddNorm(ctx(i), ctx(i + 1), ctx(i + 2))) return false;
    // The launch writes the q8 form while its other thread blocks still read the matmul's q8 input.
    if (steps[i].inputs.size() < 2 || steps[i].inputs[1] == steps[i + 3].outputs[0]) return false;
  } else if (!moeNormChain(steps, i) || !fusesMoeAddNorm(ctx(i), ctx(i + 1), ctx(i + 2))) {
    return false;
  }
  const uint32_t y = steps[i + 2].outputs[0], q8 = steps[i + 3].outputs[0];
  const size_t j = i + 4, f = fusedFollowers(desc, layouts, variant, j, steps.size(), gemv);
  if (!normConsumerChain(steps, j, f)) return false;
  // Within the chain, only its MatMuls read them, and nothing writes them (its thread blocks would overwrite what
  // others still read).
  for (size_t k = j; k <= j + f; ++k) {
    const model::StepDesc& s = steps[k];
    const bool consumer = s.op == fb::OpKind::MatMul && s.inputs == std::vector<uint32_t>{y, q8};
    if ((!consumer && (reads(s, y) || reads(s, q8))) || writes(s, y) || writes(s, q8)) return false;
  }
  // After it, nothing until the plan writes them again. (The next token's decode writes both before reading them:
  // its first layer's RmsNorm and QuantizeAct.)
  bool y_live = true, q8_live = true;
  for (size_t k = j + f + 1; k < steps.size() && (y_live || q8_live); ++k) {
    if ((y_live && reads(steps[k], y)) || (q8_live && reads(steps[k], q8))) return false;
    y_live = y_live && !writes(steps[k], y);
    q8_live = q8_live && !writes(steps[k], q8);
  }
  return true;
}

// The RmsNorm step whose 1/rms the fused chain of steps[i] and its `f` followers defers (a GEMV + Add + RMSNorm, or
// MoE launches ending with the Add and RMSNorm after the MoeFfn: fusedFollowers gave them 3, or 3 more), if any.
std::optional<size_t> deferredNormOf(const std::vector<model::StepDesc>& steps, size_t i, size_t f) {
  if (f == 3 && gemvNormChain(steps, i)) return i + 2;
  const bool moe = (f == 5 && moeRouterChain(steps, i)) || (f == 4 && moeRouteFfnChain(steps, i));
  if (moe && moeNormChain(steps, i + f - 3)) return i + f - 1;
  return std::nullopt;
}

}  // namespace

llvm::Expected<PlanFusion> planFusion(const model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts,
                                      PlanVariant variant, size_t tail, GemvFusions gemv, bool fuse) {
  const std::vector<model::StepDesc>& steps = planSteps(desc.plan, variant);
  const size_t n = steps.size();
  PlanFusion pf;
  pf.followers.assign(n, 0);
  pf.fused.assign(n, 0);
  pf.input_norm.assign(n, std::nullopt);
  if (!fuse || variant == PlanVariant::kLoad) return pf;
  std::optional<size_t> deferred;  // the RmsNorm step the chain starting next must apply
  for (size_t i = 0; i < n; i += 1 + pf.followers[i]) {
    const size_t f = fusedFollowers(desc, layouts, variant, i, tail, gemv);
    pf.followers[i] = f;
    for (size_t k = 1; k <= f; ++k) pf.fused[i + k] = 1;
    if (deferred) {  // defersNorm checked this chain; fusedFollowers must have fused it the same way
      if (!normConsumerChain(steps, i, f))
        return StepContext(desc, layouts, variant, i)
            .error(llvm::formatv("step {0} defers its RMSNorm to the GEMV chain here, which is not fused as one",
                                 *deferred));
      pf.input_norm[i] = deferred;
      deferred.reset();
    }
    deferred = deferredNormOf(steps, i, f);
  }
  if (deferred)
    return StepContext(desc, layouts, variant, *deferred).error("an RMSNorm deferred to a GEMV chain the plan lacks");
  return pf;
}

bool headNormRopeChain(const std::vector<model::StepDesc>& steps, size_t i) {
  if (i + 2 >= steps.size()) return false;
  const model::StepDesc &qn = steps[i], &kn = steps[i + 1], &rope = steps[i + 2];
  if (qn.op != fb::OpKind::HeadRmsNorm || kn.op != fb::OpKind::HeadRmsNorm || rope.op != fb::OpKind::Rope) return false;
  for (const model::StepDesc* s : {&qn, &kn, &rope})
    if (!wholeBuffers(*s)) return false;
  if (qn.inputs.size() != 1 || qn.outputs != qn.inputs || kn.inputs.size() != 1 || kn.outputs != kn.inputs) return false;
  const std::vector<uint32_t> qk{qn.inputs[0], kn.inputs[0]};
  return qk[0] != qk[1] && rope.inputs == qk && rope.outputs == qk;
}

bool fusesHeadNormRope(const StepContext& qn, const StepContext& kn, const StepContext& rope) {
  const model::StepDesc &q = qn.step(), &k = kn.step(), &r = rope.step();
  return q.n_head == r.n_head && k.n_head == r.n_head_kv && q.head_dim == r.head_dim && k.head_dim == r.head_dim &&
         q.eps == k.eps && q.weights.size() == 1 && k.weights.size() == 1;
}

size_t fusedFollowers(const model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts,
                      PlanVariant variant, size_t i, size_t tail, GemvFusions gemv) {
  const std::vector<model::StepDesc>& steps = planSteps(desc.plan, variant);
  const auto fits = [&](size_t k) { return k < steps.size() && k != tail; };
  const auto ctx = [&](size_t k) { return StepContext(desc, layouts, variant, k); };
  const auto fitsAll = [&](size_t last) {
    for (size_t k = i + 1; k <= last; ++k)
      if (!fits(k)) return false;
    return true;
  };
  // q, k, v of one q8 input in the prefill plan: calls of a few rows (batched steps, short prompt chunks) run them as
  // one mmq_blocks launch (their small-batch launches), longer ones as their own launches.
  if (gemv.qkv && variant == PlanVariant::kPrefill && fitsAll(i + 2) && gemvTripleChain(steps, i) &&
      fusesMmqbSegments({ctx(i), ctx(i + 1), ctx(i + 2)}))
    return 2;
  // The gate and up of a GLU (two matmuls of one q8 input) likewise, with `gemv.prefill_pair`.
  if (gemv.prefill_pair && variant == PlanVariant::kPrefill && fits(i + 1) && gluPairChain(steps, i) &&
      fusesMmqbSegments({ctx(i), ctx(i + 1)}))
    return 1;
  if (gemv.glu && variant == PlanVariant::kDecode && fitsAll(i + 3) && gateUpGluChain(steps, i) &&
      fusesGateUp(ctx(i), ctx(i + 1)))
    return 3;
  if (gemv.qkv && variant == PlanVariant::kDecode && fitsAll(i + 4) && qkvChain(steps, i) &&
      fusesQkv(ctx(i), ctx(i + 1), ctx(i + 2), ctx(i + 3), ctx(i + 4)))
    return fits(i + 5) && fusesQuantize(steps[i + 4], steps[i + 5], variant) ? 5 : 4;
  // q, k, v of a model whose q/k HeadRmsNorm keeps the chain above out (the QKV GEMV's option: its GEMVs).
  if (gemv.qkv && variant == PlanVariant::kDecode && fitsAll(i + 2) && gemvTripleChain(steps, i) &&
      fusesGemvTriple(ctx(i), ctx(i + 1), ctx(i + 2)))
    return 2;
  if (fitsAll(i + 3) && gemvNormChain(steps, i) && defersNorm(desc, layouts, variant, i, gemv)) return 3;
  if (gemv.pair && variant == PlanVariant::kDecode && fits(i + 1) && gemvPairChain(steps, i) &&
      fusesGemvPair(ctx(i), ctx(i + 1)))
    return 1;
  if (fitsAll(i + 2) && headNormRopeChain(steps, i) && fusesHeadNormRope(ctx(i), ctx(i + 1), ctx(i + 2))) {
    // In decode the Attention after the Rope too: its KV store rides in the same launch.
    if (variant == PlanVariant::kDecode && fits(i + 3) && fusesHeadNormRopeStore(ctx(i + 2), ctx(i + 3)))
      return fits(i + 4) && fusesQuantize(steps[i + 3], steps[i + 4], variant) ? 4 : 3;
    return 2;
  }
  // The router MatMul, MoeRoute and MoeFfn (or the last two), and the residual Add and RmsNorm after them where the
  // MoE launches can defer that norm.
  if (variant == PlanVariant::kDecode && fitsAll(i + 2) && moeRouterChain(steps, i) &&
      fusesMoeRouter(ctx(i), ctx(i + 1), ctx(i + 2)))
    return fitsAll(i + 5) && defersNorm(desc, layouts, variant, i + 2, gemv) ? 5 : 2;
  if (variant == PlanVariant::kDecode && fits(i + 1) && moeRouteFfnChain(steps, i))
    return fitsAll(i + 4) && defersNorm(desc, layouts, variant, i + 1, gemv) ? 4 : 1;
  if (fits(i + 1) && fusesAddNorm(steps[i], steps[i + 1]))
    return fits(i + 2) && fusesQuantize(steps[i + 1], steps[i + 2], variant) ? 2 : 1;
  return fits(i + 1) && fusesQuantize(steps[i], steps[i + 1], variant) ? 1 : 0;
}

Launches fusedLaunches(const model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts,
                       PlanVariant variant, size_t i, size_t followers, std::optional<size_t> input_norm_step) {
  const StepContext producer(desc, layouts, variant, i), next(desc, layouts, variant, i + 1);
  const auto ctx = [&](size_t k) { return StepContext(desc, layouts, variant, k); };
  // The chain fusedFollowers recognised (by its steps, not by its length alone).
  const std::vector<model::StepDesc>& steps = planSteps(desc.plan, variant);
  // A GEMV chain reading a deferred RMSNorm's q8 form: that norm's step (planFusion).
  std::optional<StepContext> norm;
  if (input_norm_step) {
    if (!normConsumerChain(steps, i, followers))
      return producer.error("a deferred RMSNorm's reader is not a GEMV chain");
    norm.emplace(ctx(*input_norm_step));
  }
  const StepContext* input_norm = norm ? &*norm : nullptr;
  if (followers >= 4 && qkvChain(steps, i)) {
    if (followers == 4)
      return qkvAttentionLaunches(producer, next, ctx(i + 2), ctx(i + 3), ctx(i + 4), nullptr, input_norm);
    const StepContext quant = ctx(i + 5);
    return qkvAttentionLaunches(producer, next, ctx(i + 2), ctx(i + 3), ctx(i + 4), &quant, input_norm);
  }
  if (variant == PlanVariant::kPrefill &&
      ((followers == 2 && gemvTripleChain(steps, i)) || (followers == 1 && gluPairChain(steps, i)))) {
    // The prefill q, k, v or gate and up (their small-batch launches fused: smallLaunchesForStep): each step's own
    // launches in turn.
    if (input_norm) return producer.error("the prefill matmuls fused for small batches take no deferred RMSNorm");
    std::vector<KernelLaunch> all;
    for (size_t k = 0; k <= followers; ++k) {
      auto own = launchesForStep(desc, layouts, variant, i + k);
      if (!own) return own.takeError();
      for (KernelLaunch& l : *own) all.push_back(std::move(l));
    }
    return all;
  }
  if (followers == 2 && gemvTripleChain(steps, i)) return gemvTripleLaunches(producer, next, ctx(i + 2), input_norm);
  if (followers == 3 && gateUpGluChain(steps, i))
    return gateUpGluLaunches(producer, next, ctx(i + 2), ctx(i + 3), input_norm);
  if (followers == 1 && gemvPairChain(steps, i)) return gemvPairLaunches(producer, next, input_norm);
  if (followers == 2 && headNormRopeChain(steps, i)) return headNormRopeLaunches(producer, next, ctx(i + 2), false);
  if (followers >= 3 && headNormRopeChain(steps, i)) {
    if (followers == 3) return headNormRopeAttentionLaunches(producer, next, ctx(i + 2), ctx(i + 3), nullptr);
    const StepContext quant = ctx(i + 4);
    return headNormRopeAttentionLaunches(producer, next, ctx(i + 2), ctx(i + 3), &quant);
  }
  if (followers == 3 && gemvNormChain(steps, i)) return gemvAddNormLaunches(producer, next, ctx(i + 2), ctx(i + 3));
  if ((followers == 1 || followers == 4) && moeRouteFfnChain(steps, i)) {
    if (followers == 1) return moeRouteFfnLaunches(producer, next, nullptr);
    const AddNormSteps add_norm{ctx(i + 2), ctx(i + 3), ctx(i + 4)};
    return moeRouteFfnLaunches(producer, next, &add_norm);
  }
  if ((followers == 2 || followers == 5) && moeRouterChain(steps, i)) {
    if (followers == 2) return moeRouterFfnLaunches(producer, next, ctx(i + 2), nullptr);
    const AddNormSteps add_norm{ctx(i + 3), ctx(i + 4), ctx(i + 5)};
    return moeRouterFfnLaunches(producer, next, ctx(i + 2), &add_norm);
  }
  if (producer.step().op == fb::OpKind::Add) {
    if (followers == 1) return addRmsNormLaunches(producer, next, nullptr);
    const StepContext quant = ctx(i + 2);
    return addRmsNormLaunches(producer, next, &quant);
  }
  switch (producer.step().op) {
    case fb::OpKind::RmsNorm: return rmsNormQuantizeLaunches(producer, next);
    case fb::OpKind::Attention: return attentionQuantizeLaunches(producer, next);
    default: return gluQuantizeLaunches(producer, next);
  }
}

llvm::Error checkFusedQuantize(const StepContext& quant, uint32_t width) {
  auto q = quant.output(0, "output");
  if (!q) return q.takeError();
  if (width % 32 != 0 || (*q)->width != width || (*q)->type != fb::BufferType::I8)
    return quant.error(llvm::formatv("fused into the step before it: quantizes a width-{0} buffer into a width-{1} "
                                     "buffer; both must match, be a multiple of 32, and the output I8",
                                     width, (*q)->width));
  return llvm::Error::success();
}

}  // namespace minfer::codegen
