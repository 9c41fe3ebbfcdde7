// CPU op families RmsNorm (over a row) and HeadRmsNorm (per head, in place): cpu::rmsNorm, cpu::headRmsNorm.
#include "runtime/cpu/cpu_step.h"

namespace minfer::cpu {

Status rmsNormPrepare(PrepareContext& c, const fb::Step& s, StepInfo& info) {
  const uint64_t width = c.bufferWidth(info.in[0]);
  MINFER_RETURN_IF_ERROR(positive(info, static_cast<uint32_t>(width), "input width"));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.in[0], width, "input"));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.out[0], width, "output"));
  Result<const float*> w = c.vectorWeight(s.weights()->Get(0), width, info.label);
  if (!w) return w.takeStatus();
  info.vec = *w;
  info.cols = static_cast<int>(width);
  info.eps = s.eps();
  return Status::ok();
}

void rmsNormRun(RunContext& c, const StepInfo& s) {
  rmsNorm(c.buf(s.in[0]), s.vec, c.n, s.cols, s.eps, c.buf(s.out[0]));
}

Status headRmsNormPrepare(PrepareContext& c, const fb::Step& s, StepInfo& info) {
  MINFER_RETURN_IF_ERROR(positive(info, s.n_head(), "n_head"));
  MINFER_RETURN_IF_ERROR(positive(info, s.head_dim(), "head_dim"));
  if (info.out[0] != info.in[0])
    return Status::error(info.label + ": works in place, but output buffer " + std::to_string(info.out[0]) +
                         " ≠ input buffer " + std::to_string(info.in[0]));
  info.n_head = static_cast<int>(s.n_head());
  info.head_dim = static_cast<int>(s.head_dim());
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.in[0], uint64_t{s.n_head()} * s.head_dim(), "input"));
  Result<const float*> w = c.vectorWeight(s.weights()->Get(0), s.head_dim(), info.label);
  if (!w) return w.takeStatus();
  info.vec = *w;
  info.eps = s.eps();
  return Status::ok();
}

void headRmsNormRun(RunContext& c, const StepInfo& s) {
  headRmsNorm(c.buf(s.in[0]), s.vec, c.n, s.n_head, s.head_dim, s.eps);
}

}  // namespace minfer::cpu
