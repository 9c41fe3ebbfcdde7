// CPU op families MoeRoute and MoeFfn: the mixture-of-experts router (cpu::moeRoute) and the expert FFN
// over the chosen experts (cpu::moeFfn). The expert ids travel in an I32 buffer, stored in the session's
// 4-byte activation rows.
#include <algorithm>

#include "runtime/cpu/cpu_step.h"

namespace minfer::cpu {
namespace {

Status experts(const StepInfo& info, const fb::Step& s) {
  MINFER_RETURN_IF_ERROR(positive(info, s.n_expert(), "n_expert"));
  MINFER_RETURN_IF_ERROR(positive(info, s.n_expert_used(), "n_expert_used"));
  if (s.n_expert() > static_cast<uint32_t>(kMaxExperts) || s.n_expert_used() > s.n_expert())
    return Status::error(info.label + ": n_expert_used = " + std::to_string(s.n_expert_used()) + ", n_expert = " +
                         std::to_string(s.n_expert()) + " (need n_expert_used ≤ n_expert ≤ " +
                         std::to_string(kMaxExperts) + ")");
  return Status::ok();
}

int32_t* idsOf(RunContext& c, uint32_t buffer) { return reinterpret_cast<int32_t*>(c.buf(buffer)); }

}  // namespace

Status moeRoutePrepare(PrepareContext& c, const fb::Step& s, StepInfo& info) {
  MINFER_RETURN_IF_ERROR(experts(info, s));
  info.n_expert = static_cast<int>(s.n_expert());
  info.n_expert_used = static_cast<int>(s.n_expert_used());
  info.moe_norm = s.moe_norm();
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.in[0], s.n_expert(), "router logits"));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.out[0], s.n_expert_used(), "expert ids", /*ids=*/true));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.out[1], s.n_expert_used(), "expert weights"));
  if (info.out[0] == c.ids) return Status::error(info.label + ": the expert ids buffer is the token ids buffer");
  return Status::ok();
}

void moeRouteRun(RunContext& c, const StepInfo& s) {
  moeRoute(c.buf(s.in[0]), c.n, s.n_expert, s.n_expert_used, s.moe_norm, idsOf(c, s.out[0]), c.buf(s.out[1]));
}

// weights: gate_exps (n_expert·rows × cols), up_exps (same), down_exps (n_expert·cols × rows), each with
// an expert axis of n_expert slices; rows = expert width, cols = n_embd.
Status moeFfnPrepare(PrepareContext& c, const fb::Step& s, StepInfo& info) {
  MINFER_RETURN_IF_ERROR(experts(info, s));
  MINFER_RETURN_IF_ERROR(positive(info, s.rows(), "rows"));
  MINFER_RETURN_IF_ERROR(positive(info, s.cols(), "cols"));
  info.n_expert = static_cast<int>(s.n_expert());
  info.n_expert_used = static_cast<int>(s.n_expert_used());
  info.rows = static_cast<int>(s.rows());
  info.cols = static_cast<int>(s.cols());
  const uint64_t n_ff = s.rows(), n_embd = s.cols(), n_expert = s.n_expert();
  const char* names[3] = {"gate", "up", "down"};
  for (int i = 0; i < 3; ++i) {
    info.moe_weights[i] = static_cast<int>(s.weights()->Get(i));
    MINFER_RETURN_IF_ERROR(c.resolveTensor(info.moe_weights[i], info.label));
    const WeightPlanes& w = c.weight(info.moe_weights[i]);
    const uint64_t want_rows = n_expert * (i < 2 ? n_ff : n_embd), want_cols = i < 2 ? n_embd : n_ff;
    if (w.rows != want_rows || w.cols != want_cols)
      return Status::error(info.label + ": " + names[i] + " weight '" + w.name + "' is " + std::to_string(w.rows) +
                           " x " + std::to_string(w.cols) + ", expected " + std::to_string(want_rows) + " x " +
                           std::to_string(want_cols) + " (n_expert " + std::to_string(n_expert) + ")");
    Result<RowSource> src = pickRowSource(w, false);
    if (!src) return src.takeStatus().withContext(info.label + ": ");
    info.moe_src[i] = *src;
    // Every plane the CPU may read must slice into n_expert experts of the same rows.
    for (const PlaneView* p : {&w.dense, &w.q, &w.scale, &w.min, &w.blocks})
      if (p->present() && (p->table.experts != n_expert || p->table.expert_pitch != expertRows(p->table) * p->table.row_pitch))
        return Status::error(info.label + ": " + names[i] + " weight '" + w.name + "' " +
                             planeKindName(p->table.kind) + " plane has experts " + std::to_string(p->table.experts) +
                             ", expert_pitch " + std::to_string(p->table.expert_pitch) + "; the step has " +
                             std::to_string(n_expert) + " experts");
  }
  if (info.in[0] == info.out[0])
    return Status::error(info.label + ": output buffer " + std::to_string(info.out[0]) + " is its input");
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.in[0], n_embd, "input"));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.in[1], s.n_expert_used(), "expert ids", /*ids=*/true));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.in[2], s.n_expert_used(), "expert weights"));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.out[0], n_embd, "output"));
  if (info.in[1] == c.ids) return Status::error(info.label + ": the expert ids buffer is the token ids buffer");
  c.max_matmul_cols = std::max(c.max_matmul_cols, static_cast<int>(moeScratchFloats(n_embd, n_ff)));
  return Status::ok();
}

void moeFfnRun(RunContext& c, const StepInfo& s) {
  const WeightPlanes &g = c.weight(s.moe_weights[0]), &u = c.weight(s.moe_weights[1]), &d = c.weight(s.moe_weights[2]);
  moeFfn(g, s.moe_src[0], u, s.moe_src[1], d, s.moe_src[2], c.buf(s.in[0]), idsOf(c, s.in[1]), c.buf(s.in[2]), c.n,
         s.n_expert_used, c.buf(s.out[0]), &c.pool, c.matmul_scratch.data());
}

}  // namespace minfer::cpu
