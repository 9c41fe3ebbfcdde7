// CPU op family ExpandBlocks: a load-plan step that materializes a tensor's derived planes on the GPU.
// The CPU backend never runs the load plan: it reads quantized weights from the kBlocks plane itself
// (dequantizeBlock, bit-identical to the derived planes' scale·q + min), and resolveTensor skips
// derived planes.
#include "runtime/cpu/cpu_step.h"

namespace minfer::cpu {

Status expandBlocksPrepare(PrepareContext&, const fb::Step&, StepInfo& info) {
  info.skip = true;
  return Status::ok();
}

void expandBlocksRun(RunContext&, const StepInfo&) {}  // never called: the step is skipped

}  // namespace minfer::cpu
