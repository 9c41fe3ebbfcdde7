// The device argmax → kernels/argmax.cuh: greedy sampling over rows of the logits buffer (not a plan
// step; the artifact's argmax launch record). One row per token of the launch.
#include "compiler/codegen/ops/op_family.h"
#include "kernels/argmax.cuh"

namespace minfer::codegen {

KernelLaunch argmaxLaunch(const model::ExecutionPlan& plan, uint32_t n_vocab) {
  SpecBuilder b(llvm::formatv("argmax_n{0}", n_vocab), "kernels/argmax.cuh", "minfer_argmax");
  b.define("AM_N", static_cast<uint64_t>(n_vocab));
  KernelLaunch l{b.spec, {}, kern::argmaxLaunchRule()};
  l.args = {activationArg("logits", plan.logits, n_vocab, fb::Access::Read), kindArg(fb::ArgKind::TokenOut, "out"),
            kindArg(fb::ArgKind::TokenCount, "n_rows")};
  return l;
}

}  // namespace minfer::codegen
