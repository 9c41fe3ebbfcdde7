// The device top-k → kernels/topk.cuh: sampling candidates from the last row of the logits buffer (not a
// plan step; the artifact's topk launch record, format 1.9). One row per launch.
#include "compiler/codegen/ops/op_family.h"
#include "kernels/topk.cuh"

namespace minfer::codegen {

KernelLaunch topkLaunch(const model::ExecutionPlan& plan, uint32_t n_vocab) {
  SpecBuilder b(llvm::formatv("topk_n{0}", n_vocab), "kernels/topk.cuh", "minfer_topk");
  b.define("TK_N", static_cast<uint64_t>(n_vocab));
  KernelLaunch l{b.spec, {}, kern::topkLaunchRule(n_vocab)};
  l.args = {activationArg("logits", plan.logits, n_vocab, fb::Access::Read),
            {.kind = fb::ArgKind::TopK, .name = "slot", .bytes = sizeof(kern::TopKSlot)},
            {.kind = fb::ArgKind::Scratch, .name = "scratch", .bytes = kern::topkScratchBytes(n_vocab)},
            {.kind = fb::ArgKind::Counters, .name = "counters", .bytes = kern::kTopKCounterBytes}};
  return l;
}

}  // namespace minfer::codegen
