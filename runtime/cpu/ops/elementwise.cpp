// CPU op families SwiGlu, GeGlu and Add: two inputs and an output of one width (cpu::swiGlu, cpu::geGlu,
// cpu::add).
#include "runtime/cpu/cpu_step.h"

namespace minfer::cpu {
namespace {

// The operands may be column views (format 1.4: phi3's gate and up halves of one row); the width is
// the first input's.
Status prepareElementwise(PrepareContext& c, StepInfo& info) {
  const uint64_t width = info.in_w[0];
  MINFER_RETURN_IF_ERROR(positive(info, static_cast<uint32_t>(width), "input width"));
  MINFER_RETURN_IF_ERROR(c.operand(info, true, 0, width, "1st input"));
  MINFER_RETURN_IF_ERROR(c.operand(info, true, 1, width, "2nd input"));
  MINFER_RETURN_IF_ERROR(c.operand(info, false, 0, width, "output"));
  info.cols = static_cast<int>(width);
  return Status::ok();
}

// fn over the batch: one call over n·cols elements for whole buffers, else one per row (views).
template <typename Fn>
void rows(RunContext& c, const StepInfo& s, Fn fn) {
  if (!s.views) return fn(c.in(s, 0), c.in(s, 1), int64_t(c.n) * s.cols, c.out(s, 0));
  for (int64_t t = 0; t < c.n; ++t)
    fn(c.in(s, 0) + t * s.in_pitch[0], c.in(s, 1) + t * s.in_pitch[1], int64_t{s.cols}, c.out(s, 0) + t * s.out_pitch[0]);
}

}  // namespace

Status swigluPrepare(PrepareContext& c, const fb::Step&, StepInfo& info) { return prepareElementwise(c, info); }

void swigluRun(RunContext& c, const StepInfo& s) {
  rows(c, s, swiGlu);
}

Status gegluPrepare(PrepareContext& c, const fb::Step&, StepInfo& info) { return prepareElementwise(c, info); }

void gegluRun(RunContext& c, const StepInfo& s) {
  rows(c, s, geGlu);
}

Status addPrepare(PrepareContext& c, const fb::Step&, StepInfo& info) { return prepareElementwise(c, info); }

void addRun(RunContext& c, const StepInfo& s) {
  rows(c, s, add);
}

}  // namespace minfer::cpu
