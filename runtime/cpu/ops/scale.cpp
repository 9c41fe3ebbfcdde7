// CPU op family Scale: out = x·scale, optionally soft-capped (cpu::scale); out may equal x.
#include <cmath>

#include "runtime/cpu/cpu_step.h"

namespace minfer::cpu {

Status scalePrepare(PrepareContext& c, const fb::Step& s, StepInfo& info) {
  const uint64_t width = c.bufferWidth(info.in[0]);
  MINFER_RETURN_IF_ERROR(positive(info, static_cast<uint32_t>(width), "input width"));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.in[0], width, "input"));
  MINFER_RETURN_IF_ERROR(c.buffer(info, info.out[0], width, "output"));
  if (!std::isfinite(s.scale()) || !(s.softcap() >= 0) || !std::isfinite(s.softcap()))
    return Status::error(info.label + ": scale " + std::to_string(s.scale()) + " must be finite and softcap " +
                         std::to_string(s.softcap()) + " finite and ≥ 0");
  info.cols = static_cast<int>(width);
  info.scale = s.scale();
  info.softcap = s.softcap();
  return Status::ok();
}

void scaleRun(RunContext& c, const StepInfo& s) {
  scale(c.buf(s.in[0]), int64_t(c.n) * s.cols, s.scale, s.softcap, c.buf(s.out[0]));
}

}  // namespace minfer::cpu
