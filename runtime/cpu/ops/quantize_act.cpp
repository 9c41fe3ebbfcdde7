// CPU op family QuantizeAct: a GPU-side step (the q8 copy of a matmul input) that the CPU skips.
#include "runtime/cpu/cpu_step.h"

namespace minfer::cpu {

// gpu_only in schema/op_traits.h: prepareStep checks nothing, the step is marked skipped and its
// buffers are not allocated on the CPU.
Status quantizeActPrepare(PrepareContext&, const fb::Step&, StepInfo& info) {
  info.skip = true;
  return Status::ok();
}

void quantizeActRun(RunContext&, const StepInfo&) {}  // never called: the step is skipped

}  // namespace minfer::cpu
