// CPU op families SwiGlu, GeGlu and Add: two inputs and an output of one width (cpu::swiGlu, cpu::geGlu,
// cpu::add).
#include "runtime/cpu/cpu_step.h"

namespace minfer::cpu {
namespace {

Status prepareElementwise(PrepareContext& c, StepInfo& info) {
  const uint64_t width = c.bufferWidth(info.in[0]);
  MINFER_RETURN_IF_ERROR(positive(info, static_cast<uint32_t>(width), "input width"));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.in[0], width, "1st input"));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.in[1], width, "2nd input"));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.out[0], width, "output"));
  info.cols = static_cast<int>(width);
  return Status::ok();
}

}  // namespace

Status swigluPrepare(PrepareContext& c, const fb::Step&, StepInfo& info) { return prepareElementwise(c, info); }

void swigluRun(RunContext& c, const StepInfo& s) {
  swiGlu(c.buf(s.in[0]), c.buf(s.in[1]), int64_t(c.n) * s.cols, c.buf(s.out[0]));
}

Status gegluPrepare(PrepareContext& c, const fb::Step&, StepInfo& info) { return prepareElementwise(c, info); }

void gegluRun(RunContext& c, const StepInfo& s) {
  geGlu(c.buf(s.in[0]), c.buf(s.in[1]), int64_t(c.n) * s.cols, c.buf(s.out[0]));
}

Status addPrepare(PrepareContext& c, const fb::Step&, StepInfo& info) { return prepareElementwise(c, info); }

void addRun(RunContext& c, const StepInfo& s) {
  add(c.buf(s.in[0]), c.buf(s.in[1]), int64_t(c.n) * s.cols, c.buf(s.out[0]));
}

}  // namespace minfer::cpu
