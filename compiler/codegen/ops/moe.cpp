// Op families MoeRoute and MoeFfn → kernels/moe.cuh: the softmax router's top-k (one launch), and the
// expert FFN as four launches (sort the token slots by expert, gate/up per chosen expert, down per chosen
// expert, weighted combine; in decode three: the combine in the down launch, and, fused with the MoeRoute and the
// router MatMul before it, the sort launch computing the router's logits and routing too) sharing the step's scratch;
// in decode with gate, up and down all on their blocks (and K ≤ 32), the experts run as two GEMVs over the chosen
// experts' rows instead (decodeExpertLaunches: minfer_moe_gate_up_dec, minfer_moe_down_dec; the router launch without
// the slot sort), the down GEMV also running the residual Add, RmsNorm and QuantizeAct after the step where planFusion
// defers that norm (MOE_ADD_NORM, fusesMoeAddNorm). Every -D…PITCH / …EPITCH constant is taken from the
// stride table the launch record's Weight argument carries (row pitch and expert pitch). Q4_K and Q6_K
// experts are read from their kBlocks plane (the GGUF blocks; q8 activations), other types from kI8 +
// kScale [+ kMin] or their dense plane (layout_planner.h: which planes an expert tensor has).
#include "compiler/codegen/ops/op_family.h"
#include "kernels/moe.cuh"

namespace minfer::codegen {
namespace {

// The planes an expert weight is read from: kBlocks (Q4_K, Q6_K), kI8 + kScale [+ kMin] (other
// quantized types) or its dense plane.
struct ExpertPlanes {
  const StrideTable* q = nullptr;  // kBlocks, kI8 or the dense plane
  const StrideTable* s = nullptr;
  const StrideTable* m = nullptr;
  bool blocks() const { return q->kind == PlaneKind::kBlocks; }
};

// A kBlocks plane the expert kernels decode (kernels/moe.cuh BlocksWeight): Q4_K or Q6_K, whole
// 256-weight blocks, every block 16-byte aligned.
bool readableBlocks(const StrideTable& t) {
  const auto type = static_cast<GgmlType>(t.ggml_type);
  return (type == GgmlType::Q4_K || type == GgmlType::Q6_K) && t.cols % 256 == 0 && t.group_pitch % 16 == 0 &&
         t.row_pitch % 16 == 0;
}

llvm::Expected<ExpertPlanes> expertPlanes(const StepContext& c, size_t i, uint64_t rows, uint64_t cols) {
  auto w = c.weight(i);
  if (!w) return w.takeError();
  const planes::TensorLayout& l = **w;
  ExpertPlanes p;
  const StrideTable* blocks = findPlane(l, PlaneKind::kBlocks);
  if (blocks && readableBlocks(*blocks)) {
    p.q = blocks;
  } else if ((p.q = findPlane(l, PlaneKind::kI8))) {
    p.s = findPlane(l, PlaneKind::kScale);
    p.m = findPlane(l, PlaneKind::kMin);
    if (!p.s || p.s->elem != ElemType::kF32 || (p.m && (p.m->elem != ElemType::kF32 || p.m->group_size != p.s->group_size)))
      return c.error(llvm::formatv("'{0}': the expert kernels need f32 scale (and min) planes of one group size",
                                   l.desc.name));
  } else if (!(p.q = densePlane(l))) {
    return c.error(llvm::formatv("'{0}' has neither an i8 nor a dense plane", l.desc.name));
  }
  const uint32_t n_expert = c.step().n_expert;
  for (const StrideTable* t : {p.q, p.s, p.m})
    if (t && (t->experts != n_expert || expertRows(*t) != rows || t->cols != cols ||
              t->expert_pitch != rows * t->row_pitch))
      return c.error(llvm::formatv("'{0}' {1} plane: {2} experts of {3} x {4} (expert pitch {5}), the step needs {6} "
                                   "experts of {7} x {8}",
                                   l.desc.name, planeKindName(t->kind), t->experts, expertRows(*t), t->cols,
                                   t->expert_pitch, n_expert, rows, cols));
  return p;
}

// moe.cuh's shape constants (experts, experts per token, expert width, n_embd, the plan's max batch) and the kernel
// selector `which`.
SpecBuilder& defineMoeShape(SpecBuilder& b, uint64_t n_expert, uint64_t k, uint64_t f, uint64_t e, uint64_t max_batch,
                            const char* which) {
  return b.define("MOE_NEXP", n_expert)
      .define("MOE_K", k)
      .define("MOE_F", f)
      .define("MOE_E", e)
      .define("MOE_MAX_BATCH", max_batch)
      .define(which, uint64_t{1});
}

// The MOE_<X>_* constants and the three Weight (or Null) arguments of one expert weight.
void addWeight(const StepContext& c, size_t i, const char* x, const ExpertPlanes& p, SpecBuilder& b,
               std::vector<KernelArgDesc>& args) {
  const std::string pre = std::string("MOE_") + x + "_";
  auto def = [&](const char* name, uint64_t v) { b.define((pre + name).c_str(), v); };
  def("PLANE", static_cast<uint64_t>(p.q->kind));
  def("PITCH", p.q->row_pitch);
  def("EPITCH", p.q->expert_pitch);
  def("S_PITCH", p.s ? p.s->row_pitch : 0);
  def("S_EPITCH", p.s ? p.s->expert_pitch : 0);
  def("M_PITCH", p.m ? p.m->row_pitch : 0);
  def("M_EPITCH", p.m ? p.m->expert_pitch : 0);
  def("GS", p.s ? p.s->group_size : 1);
  if (p.blocks()) {
    def("TYPE", p.q->ggml_type);
    def("GP", p.q->group_pitch);
  }
  const std::string lower(1, static_cast<char>(x[0] - 'A' + 'a'));
  const uint32_t tensor = c.weightId(i);
  args.push_back(weightArg((lower + "q").c_str(), tensor, *p.q));
  args.push_back(p.s ? weightArg((lower + "s").c_str(), tensor, *p.s) : kindArg(fb::ArgKind::Null, (lower + "s").c_str()));
  args.push_back(p.m ? weightArg((lower + "m").c_str(), tensor, *p.m) : kindArg(fb::ArgKind::Null, (lower + "m").c_str()));
}

// The MOE_<X>_ TYPE, GP, PITCH and EPITCH constants of an expert weight read from its kBlocks plane alone (the
// decode expert GEMVs: one Weight argument each).
void defineBlocksWeight(const char* x, const ExpertPlanes& p, SpecBuilder& b) {
  const std::string pre = std::string("MOE_") + x + "_";
  b.define((pre + "TYPE").c_str(), uint64_t{p.q->ggml_type})
      .define((pre + "GP").c_str(), uint64_t{p.q->group_pitch})
      .define((pre + "PITCH").c_str(), uint64_t{p.q->row_pitch})
      .define((pre + "EPITCH").c_str(), uint64_t{p.q->expert_pitch});
}

// Whether the MoeFfn step c's experts run as the decode expert GEMVs (decodeExpertLaunches): the decode plan, gate,
// up and down read from their blocks, K ≤ 32 (minfer_moe_down_dec's lane j < K holds choice j).
bool decodeExperts(const StepContext& c, const ExpertPlanes& gate, const ExpertPlanes& up, const ExpertPlanes& down) {
  return !c.prefill() && gate.blocks() && up.blocks() && down.blocks() && c.step().n_expert_used <= 32;
}

// "q4_k_blocks", "q8_0", "f32": the tag of the plane set an expert weight is read from.
std::string weightTag(const ExpertPlanes& p) {
  if (p.blocks()) return typeTag(p.q->ggml_type) + "_blocks";
  return p.q->kind == PlaneKind::kI8 ? typeTag(p.q->ggml_type) : denseTag(p.q->kind);
}

// A MoeRoute step's experts, choices and buffers, checked against each other.
llvm::Error checkRoute(const StepContext& c) {
  const model::StepDesc& s = c.step();
  auto logits = c.input(0, "router logits");
  if (!logits) return logits.takeError();
  auto ids = c.output(0, "expert ids");
  if (!ids) return ids.takeError();
  auto w = c.output(1, "expert weights");
  if (!w) return w.takeError();
  if (s.n_expert == 0 || s.n_expert > 4096 || s.n_expert_used == 0 || s.n_expert_used > s.n_expert ||
      s.n_expert_used > 64 || (*logits)->width != s.n_expert || (*ids)->width != s.n_expert_used ||
      (*ids)->type != fb::BufferType::I32 || (*w)->width != s.n_expert_used)
    return c.error(llvm::formatv("router of {0} experts choosing {1} (≤ 64, ≤ 4096 experts) with buffers of widths "
                                 "{2}, {3} (i32), {4}",
                                 s.n_expert, s.n_expert_used, (*logits)->width, (*ids)->width, (*w)->width));
  return llvm::Error::success();
}

}  // namespace

Launches moeRouteLaunches(const StepContext& c) {
  const model::StepDesc& s = c.step();
  if (llvm::Error e = checkRoute(c)) return e;
  SpecBuilder b(llvm::formatv("moe_route_e{0}_k{1}{2}", s.n_expert, s.n_expert_used, s.moe_norm ? "_norm" : ""),
                "kernels/moe.cuh", "minfer_moe_route");
  defineMoeShape(b, s.n_expert, s.n_expert_used, 1, 1, c.maxBatch(), "MOE_ROUTE").define("MOE_NORM", uint64_t{s.moe_norm});
  KernelLaunch k{b.spec, {}, kern::moeRouteLaunchRule()};
  k.args = {activationArg("logits", c.inputId(0), s.n_expert, fb::Access::Read),
            activationArg("ids", c.outputId(0), s.n_expert_used, fb::Access::Write),
            activationArg("w", c.outputId(1), s.n_expert_used, fb::Access::Write)};
  return std::vector<KernelLaunch>{std::move(k)};
}

namespace {

// The MoeRoute step `route` checked, and checked to feed the MoeFfn step c (its experts, ids and weights).
llvm::Error checkRouteFeeds(const StepContext& c, const StepContext& route) {
  const model::StepDesc &r = route.step(), &s = c.step();
  if (llvm::Error err = checkRoute(route)) return err;
  if (r.n_expert != s.n_expert || r.n_expert_used != s.n_expert_used || r.outputs.size() != 2 ||
      r.outputs[0] != c.inputId(1) || r.outputs[1] != c.inputId(2))
    return route.error(llvm::formatv("cannot route in the launch of the MoeFfn step after it: {0} experts choosing "
                                     "{1} there, its expert ids and weights not the router's outputs",
                                     s.n_expert, s.n_expert_used));
  return llvm::Error::success();
}

// The decode MoeFfn step c's first launch with its MoeRoute step `route` (minfer_moe_route_sort): the router's
// logits in, its expert ids and weights out, then the sort's work on the scratch (and x's q8 form with
// `x_q8`); `shape`, `x_in`, `scratch`: moeFfn's key part and arguments. Errors: the route's own, and a router
// whose experts or outputs are not the MoeFfn's.
llvm::Expected<KernelLaunch> routeSortLaunch(const StepContext& c, const StepContext& route, const std::string& shape,
                                            bool x_q8, const KernelArgDesc& x_in, const KernelArgDesc& scratch) {
  const model::StepDesc &r = route.step(), &s = c.step();
  if (llvm::Error err = checkRouteFeeds(c, route)) return err;
  SpecBuilder b(llvm::formatv("moe_route_sort_{0}{1}{2}", shape, r.moe_norm ? "_norm" : "", x_q8 ? "_xq8" : ""),
                "kernels/moe.cuh", "minfer_moe_route_sort");
  defineMoeShape(b, s.n_expert, s.n_expert_used, s.rows, s.cols, c.maxBatch(), "MOE_ROUTE_SORT")
      .define("MOE_NORM", uint64_t{r.moe_norm})
      .define("MOE_X_Q8", uint64_t{x_q8});
  return KernelLaunch{b.spec,
                      {activationArg("logits", route.inputId(0), s.n_expert, fb::Access::Read),
                       activationArg("ids", route.outputId(0), s.n_expert_used, fb::Access::Write),
                       activationArg("w", route.outputId(1), s.n_expert_used, fb::Access::Write), x_in, scratch,
                       kindArg(fb::ArgKind::TokenCount, "n_tokens")},
                      kern::moeSortLaunchRule(s.cols, x_q8)};
}

// The router MatMul's dense plane the one-token router kernel reads (dense_matmul.cuh's dense_gemv form) when `mm`
// is a decode MatMul with one f32 input, `rows` × `cols` and no kI8 or kBlocks plane (matmulLaunches would take
// those); null otherwise.
const StrideTable* routerPlane(const StepContext& mm, uint32_t rows, uint32_t cols) {
  const model::StepDesc& m = mm.step();
  if (mm.prefill() || m.op != fb::OpKind::MatMul || m.inputs.size() != 1 || m.outputs.size() != 1 || m.weights.empty() ||
      m.weights.size() > 2)
    return nullptr;
  auto w = mm.weight(0);
  if (!w) {
    llvm::consumeError(w.takeError());
    return nullptr;
  }
  const planes::TensorLayout& l = **w;
  const StrideTable* d = densePlane(l);
  if (findPlane(l, PlaneKind::kI8) || findPlane(l, PlaneKind::kBlocks) || !d || d->row_pitch % 16 != 0 ||
      l.desc.rows != rows || l.desc.cols != cols)
    return nullptr;
  return d;
}

// The decode MoeFfn step c's first launch with its MoeRoute step `route` and the router MatMul `mm` before that
// (minfer_moe_router_sort): x and the router weight in, the logits, expert ids and weights out, then the sort's
// work on the scratch (and x's q8 form with `x_q8`), with one counter word; one token (the kernel traps on a token
// count ≠ 1), so the decode plan's only; without `sort_slots` it leaves the sort out (MOE_SORT_SLOTS 0: the decode
// expert GEMVs read the ids). Errors: a prefill step, the route's own, a router whose experts or outputs
// are not the MoeFfn's, a MatMul fusesMoeRouter refuses, its bias plane's.
llvm::Expected<KernelLaunch> routerSortLaunch(const StepContext& c, const StepContext& route, const StepContext& mm,
                                             const std::string& shape, bool x_q8, bool sort_slots,
                                             const KernelArgDesc& x_in, const KernelArgDesc& scratch) {
  const model::StepDesc &r = route.step(), &s = c.step();
  if (c.prefill()) return c.error("minfer_moe_router_sort computes one token: only in the decode plan");
  if (llvm::Error err = checkRouteFeeds(c, route)) return err;
  if (!fusesMoeRouter(mm, route, c)) return mm.error("cannot compute the router in the MoE launches (fusesMoeRouter)");
  const StrideTable& plane = *routerPlane(mm, s.n_expert, s.cols);
  const StrideTable* bias = nullptr;
  if (mm.step().weights.size() > 1) {
    auto v = mm.vector(1, s.n_expert);
    if (!v) return v.takeError();
    bias = *v;
  }
  SpecBuilder b(llvm::formatv("moe_router_sort_{0}_{1}_p{2}{3}{4}{5}{6}", shape, denseTag(plane.kind),
                              plane.row_pitch, bias ? "_bias" : "", r.moe_norm ? "_norm" : "", x_q8 ? "_xq8" : "",
                              sort_slots ? "" : "_nosort"),
                "kernels/moe.cuh", "minfer_moe_router_sort");
  defineMoeShape(b, s.n_expert, s.n_expert_used, s.rows, s.cols, c.maxBatch(), "MOE_ROUTER_SORT")
      .define("MOE_NORM", uint64_t{r.moe_norm})
      .define("MOE_X_Q8", uint64_t{x_q8})
      .define("MOE_R_PLANE", static_cast<uint64_t>(plane.kind))
      .define("MOE_R_PITCH", plane.row_pitch)
      .define("MOE_R_HAS_BIAS", uint64_t{bias ? 1u : 0u})
      .define("MOE_SORT_SLOTS", uint64_t{sort_slots});
  return KernelLaunch{b.spec,
                      {weightArg("rw", mm.weightId(0), plane),
                       bias ? weightArg("rbias", mm.weightId(1), *bias) : kindArg(fb::ArgKind::Null, "rbias"), x_in,
                       activationArg("logits", mm.outputId(0), s.n_expert, fb::Access::Write),
                       activationArg("ids", route.outputId(0), s.n_expert_used, fb::Access::Write),
                       activationArg("w", route.outputId(1), s.n_expert_used, fb::Access::Write), scratch,
                       {.kind = fb::ArgKind::Counters, .name = "counters", .bytes = 4},
                       kindArg(fb::ArgKind::TokenCount, "n_tokens")},
                      kern::moeRouterSortLaunchRule(s.n_expert, s.cols, x_q8)};
}

// The decode MoeFfn step c's expert launches when gate, up and down are all read from blocks: one token's K chosen
// experts as GEMVs over their rows (minfer_moe_gate_up_dec, then minfer_moe_down_dec with the combine), without the
// sort's slot lists (the sort launch before them still quantizes x into the scratch). `shape`, `scratch`, `ids_in`:
// moeFfn's; `add_norm`: the residual Add, RmsNorm and QuantizeAct the down launch also runs (MOE_ADD_NORM), or null.
llvm::Expected<std::vector<KernelLaunch>> decodeExpertLaunches(const StepContext& c, const std::string& shape,
                                                              const ExpertPlanes& gate, const ExpertPlanes& up,
                                                              const ExpertPlanes& down, const KernelArgDesc& scratch,
                                                              const KernelArgDesc& ids_in,
                                                              const AddNormSteps* add_norm) {
  const model::StepDesc& s = c.step();
  const uint32_t nexp = s.n_expert, k = s.n_expert_used, f = s.rows, e = s.cols;
  SpecBuilder gu(llvm::formatv("moe_gate_up_dec_{0}_{1}_{2}_p{3}_{4}_{5}_p{6}", shape, weightTag(gate),
                               weightTag(up), gate.q->row_pitch, up.q->row_pitch, weightTag(down), down.q->row_pitch),
                 "kernels/moe.cuh", "minfer_moe_gate_up_dec");
  defineMoeShape(gu, nexp, k, f, e, c.maxBatch(), "MOE_GATE_UP_DEC");
  defineBlocksWeight("G", gate, gu);
  defineBlocksWeight("U", up, gu);
  defineBlocksWeight("D", down, gu);
  std::vector<KernelArgDesc> gu_args{ids_in, weightArg("gq", c.weightId(0), *gate.q),
                                     weightArg("uq", c.weightId(1), *up.q), weightArg("dq", c.weightId(2), *down.q),
                                     scratch};
  gu_args.push_back({.kind = fb::ArgKind::Counters, .name = "counters", .bytes = uint64_t{k} * f / 32 * 4});

  SpecBuilder dn(llvm::formatv("moe_down_dec_{0}_{1}_p{2}{3}", shape, weightTag(down), down.q->row_pitch,
                               add_norm ? "_add_norm" : ""),
                 "kernels/moe.cuh", "minfer_moe_down_dec");
  defineMoeShape(dn, nexp, k, f, e, c.maxBatch(), "MOE_DOWN_DEC");
  defineBlocksWeight("D", down, dn);
  std::vector<KernelArgDesc> dn_args{ids_in, activationArg("w", c.inputId(2), k, fb::Access::Read),
                                     weightArg("dq", c.weightId(2), *down.q), scratch,
                                     activationArg("out", c.outputId(0), e, fb::Access::Write)};
  if (add_norm) {  // minfer_gemv_add_norm's arguments after its product
    if (!fusesMoeAddNorm(c, add_norm->add, add_norm->norm))
      return c.error("the MoeFfn, the Add and the RmsNorm after it cannot run as one launch (fusesMoeAddNorm)");
    dn.define("MOE_ADD_NORM", uint64_t{1});
    if (llvm::Error err = pushAddNormArgs(dn_args, add_norm->add, add_norm->norm, add_norm->quant, c.outputId(0), e))
      return err;
  }
  std::vector<KernelLaunch> launches;
  launches.push_back({gu.spec, std::move(gu_args), kern::moeGateUpDecLaunchRule(k, f, e)});
  launches.push_back({dn.spec, std::move(dn_args), kern::moeDownDecLaunchRule(e)});
  return launches;
}

// The MoeFfn step c's launches; with `route` (the decode plan's MoeRoute step before it, fused) the sort launch
// routes too (minfer_moe_route_sort), and with `router` (the router MatMul before that, fused) it also computes
// the router's logits (minfer_moe_router_sort); with `add_norm` the down launch also runs those steps after it
// (decodeExpertLaunches).
Launches moeFfn(const StepContext& c, const StepContext* route, const StepContext* router, const AddNormSteps* add_norm) {
  const model::StepDesc& s = c.step();
  const uint32_t nexp = s.n_expert, k = s.n_expert_used, f = s.rows, e = s.cols;
  auto x = c.input(0, "input");
  if (!x) return x.takeError();
  auto ids = c.input(1, "expert ids");
  if (!ids) return ids.takeError();
  auto w = c.input(2, "expert weights");
  if (!w) return w.takeError();
  auto out = c.output(0, "output");
  if (!out) return out.takeError();
  if (nexp == 0 || nexp > 4096 || k == 0 || k > nexp || f == 0 || e == 0 || (*x)->width != e || (*out)->width != e ||
      (*ids)->width != k || (*ids)->type != fb::BufferType::I32 || (*w)->width != k)
    return c.error(llvm::formatv("{0} experts, {1} per token, {2} x {3}, with buffers of widths {4} (input), {5} "
                                 "(i32 ids), {6} (weights), {7} (output)",
                                 nexp, k, f, e, (*x)->width, (*ids)->width, (*w)->width, (*out)->width));
  auto gate = expertPlanes(c, 0, f, e);
  if (!gate) return gate.takeError();
  auto up = expertPlanes(c, 1, f, e);
  if (!up) return up.takeError();
  auto down = expertPlanes(c, 2, e, f);
  if (!down) return down.takeError();
  // Gate and up share one kernel's plane set: both kBlocks, or neither.
  const bool gu_blocks = gate->blocks(), dn_blocks = down->blocks();
  if (gu_blocks != up->blocks())
    return c.error(llvm::formatv("gate '{0}' ({1}) and up '{2}' ({3}): the expert kernels read both from blocks "
                                 "(Q4_K, Q6_K) or neither",
                                 (*c.weight(0))->desc.name, weightTag(*gate), (*c.weight(1))->desc.name,
                                 weightTag(*up)));

  // Decode with every expert weight on its blocks: the expert GEMVs (decodeExpertLaunches; lane j < K holds choice j).
  const bool dec_experts = decodeExperts(c, *gate, *up, *down);
  const uint32_t mb = c.maxBatch();
  const KernelArgDesc scratch{.kind = fb::ArgKind::Scratch, .name = "scratch",
                              .bytes = kern::moeScratchBytes(nexp, mb, k, f, e)};
  const std::string shape = llvm::formatv("e{0}_k{1}_f{2}_n{3}_b{4}", nexp, k, f, e, mb);
  auto common = [&](SpecBuilder& b, const char* which) -> SpecBuilder& {
    return defineMoeShape(b, nexp, k, f, e, mb, which);
  };
  const KernelArgDesc ntok = kindArg(fb::ArgKind::TokenCount, "n_tokens");
  const KernelArgDesc ids_in = activationArg("ids", c.inputId(1), k, fb::Access::Read);
  std::vector<KernelLaunch> launches;

  const KernelArgDesc x_in = activationArg("x", c.inputId(0), e, fb::Access::Read);
  if (route) {
    auto rs = router ? routerSortLaunch(c, *route, *router, shape, gu_blocks, !dec_experts, x_in, scratch)
                     : routeSortLaunch(c, *route, shape, gu_blocks, x_in, scratch);
    if (!rs) return rs.takeError();
    launches.push_back(std::move(*rs));
  } else {
    SpecBuilder sort("moe_sort_" + shape + (gu_blocks ? "_xq8" : ""), "kernels/moe.cuh", "minfer_moe_sort");
    common(sort, "MOE_SORT").define("MOE_X_Q8", uint64_t{gu_blocks});
    launches.push_back({sort.spec, {ids_in, x_in, scratch, ntok}, kern::moeSortLaunchRule(e, gu_blocks)});
  }

  if (dec_experts) {
    auto experts = decodeExpertLaunches(c, shape, *gate, *up, *down, scratch, ids_in, add_norm);
    if (!experts) return experts.takeError();
    launches.insert(launches.end(), std::make_move_iterator(experts->begin()), std::make_move_iterator(experts->end()));
    return launches;
  }
  if (add_norm) return c.error("the Add and RmsNorm after a MoeFfn run in its launches only with the decode expert GEMVs");

  SpecBuilder gu(llvm::formatv("moe_gate_up_{0}_{1}_{2}_p{3}_{4}{5}", shape, weightTag(*gate), weightTag(*up),
                               gate->q->row_pitch, up->q->row_pitch, dn_blocks ? "_aq8" : ""),
                 "kernels/moe.cuh", "minfer_moe_gate_up");
  common(gu, "MOE_GATE_UP").define("MOE_A_Q8", uint64_t{dn_blocks});
  std::vector<KernelArgDesc> gu_args{x_in};
  addWeight(c, 0, "G", *gate, gu, gu_args);
  addWeight(c, 1, "U", *up, gu, gu_args);
  gu_args.push_back(scratch);
  launches.push_back({gu.spec, std::move(gu_args),
                      kern::moeExpertsLaunchRule(f, kern::moeGateUpRows(gu_blocks, e, dn_blocks), nexp, k)});

  // In decode (expert planes other than all-blocks) the combine runs in the down launch (MOE_DOWN_COMBINE: the last thread block of each row tile
  // combines its rows, with one counter word per tile), the same values as minfer_moe_combine's.
  const bool down_combine = !c.prefill();
  const unsigned down_rows = kern::moeDownRows(dn_blocks, f);
  SpecBuilder dn(llvm::formatv("moe_down_{0}_{1}_p{2}{3}", shape, weightTag(*down), down->q->row_pitch,
                               down_combine ? "_combine" : ""),
                 "kernels/moe.cuh", down_combine ? "minfer_moe_down_combine" : "minfer_moe_down");
  common(dn, "MOE_DOWN");
  if (down_combine) dn.define("MOE_DOWN_COMBINE", uint64_t{1});
  std::vector<KernelArgDesc> dn_args;
  addWeight(c, 2, "D", *down, dn, dn_args);
  dn_args.push_back(scratch);
  if (down_combine) {
    dn_args.insert(dn_args.end(), {ids_in, activationArg("w", c.inputId(2), k, fb::Access::Read),
                                   activationArg("out", c.outputId(0), e, fb::Access::Write)});
    dn_args.push_back({.kind = fb::ArgKind::Counters, .name = "counters", .bytes = uint64_t{kern::ceilDiv(e, down_rows)} * 4});
    dn_args.push_back(ntok);
  }
  launches.push_back({dn.spec, std::move(dn_args), kern::moeExpertsLaunchRule(e, down_rows, nexp, k)});
  if (down_combine) return launches;

  SpecBuilder comb("moe_combine_" + shape, "kernels/moe.cuh", "minfer_moe_combine");
  common(comb, "MOE_COMBINE");
  launches.push_back({comb.spec,
                      {ids_in, activationArg("w", c.inputId(2), k, fb::Access::Read), scratch,
                       activationArg("out", c.outputId(0), e, fb::Access::Write), ntok},
                      kern::moeCombineLaunchRule(e)});
  return launches;
}

}  // namespace

Launches moeFfnLaunches(const StepContext& c) { return moeFfn(c, nullptr, nullptr, nullptr); }

Launches moeRouteFfnLaunches(const StepContext& route, const StepContext& ffn, const AddNormSteps* add_norm) {
  if (ffn.prefill()) return route.error("only the decode plan routes in the MoeFfn step's launches");
  return moeFfn(ffn, &route, nullptr, add_norm);
}

bool fusesMoeRouter(const StepContext& mm, const StepContext& route, const StepContext& ffn) {
  const model::StepDesc &m = mm.step(), &r = route.step(), &f = ffn.step();
  return routerPlane(mm, f.n_expert, f.cols) && f.inputs.size() == 3 && m.inputs[0] == f.inputs[0] &&
         r.inputs.size() == 1 && r.inputs[0] == m.outputs[0] && m.outputs[0] != f.inputs[0];
}

Launches moeRouterFfnLaunches(const StepContext& mm, const StepContext& route, const StepContext& ffn,
                              const AddNormSteps* add_norm) {
  if (ffn.prefill()) return mm.error("only the decode plan computes the router in the MoeFfn step's launches");
  return moeFfn(ffn, &route, &mm, add_norm);
}

bool fusesMoeAddNorm(const StepContext& ffn, const StepContext& add, const StepContext& norm) {
  const model::StepDesc &s = ffn.step(), &as = add.step(), &ns = norm.step();
  if (s.op != fb::OpKind::MoeFfn || s.inputs.size() != 3 || s.outputs.size() != 1 || s.cols % kern::kQ8Block != 0 ||
      as.inputs.size() != 2 || as.outputs.size() != 1 || ns.inputs.size() != 1 || ns.outputs.size() != 1 ||
      ns.inputs[0] != as.outputs[0])
    return false;
  // The decode expert GEMVs (moeFfn's dec_experts).
  auto gate = expertPlanes(ffn, 0, s.rows, s.cols), up = expertPlanes(ffn, 1, s.rows, s.cols),
       down = expertPlanes(ffn, 2, s.cols, s.rows);
  const bool planes = gate && up && down;
  if (!gate) llvm::consumeError(gate.takeError());
  if (!up) llvm::consumeError(up.takeError());
  if (!down) llvm::consumeError(down.takeError());
  if (!planes || !decodeExperts(ffn, *gate, *up, *down)) return false;
  // The kernel always writes the MoeFfn's output, so the norm's output may not reuse it; the launch writes sum, y
  // and the q8 form while its thread blocks read the ids, the weights and the scratch.
  const uint32_t sum = as.outputs[0], y = ns.outputs[0], ids = s.inputs[1], w = s.inputs[2];
  return addNormFollows(add, norm, s.outputs[0], s.cols, false) && sum != ids && sum != w && y != ids && y != w;
}

}  // namespace minfer::codegen
