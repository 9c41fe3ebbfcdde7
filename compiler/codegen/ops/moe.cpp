// Op families MoeRoute and MoeFfn (mixture of experts, qwen3moe): no CUDA kernels yet, so an artifact
// for a GPU target is refused here rather than produced without them (the CPU backend runs both ops).
#include "compiler/codegen/ops/op_family.h"

namespace minfer::codegen {

Launches moeRouteLaunches(const StepContext& c) {
  return c.error("the mixture-of-experts ops (MoeRoute, MoeFfn) have no CUDA kernels yet: compile this model "
                 "without --target to run it on the CPU backend");
}

Launches moeFfnLaunches(const StepContext& c) { return moeRouteLaunches(c); }

}  // namespace minfer::codegen
