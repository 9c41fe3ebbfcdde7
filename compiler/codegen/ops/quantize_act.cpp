// Op family QuantizeAct → kernels/quantize_act.cuh: f32 rows → q8 buffer (the int8 input of the
// quantized matmuls).
#include "compiler/codegen/ops/op_family.h"
#include "kernels/quantize_act.cuh"

namespace minfer::codegen {

Launches quantizeActLaunches(const StepContext& c) {
  auto in = c.input(0, "input");
  if (!in) return in.takeError();
  auto out = c.output(0, "output");
  if (!out) return out.takeError();
  const uint32_t k = (*in)->width;
  if (k % 32 != 0 || (*out)->width != k || (*out)->type != fb::BufferType::I8)
    return c.error(llvm::formatv("quantizes a width-{0} buffer into a width-{1} buffer; both must match, be a "
                                 "multiple of 32, and the output must be I8",
                                 k, (*out)->width));
  SpecBuilder b(llvm::formatv("quantize_act_k{0}", k), "kernels/quantize_act.cuh", "minfer_quantize_act");
  b.define("QA_K", static_cast<uint64_t>(k));
  KernelLaunch l{b.spec, {}, kern::quantizeActLaunchRule(k)};
  l.args.push_back(activationArg("x", c.inputId(0), k, fb::Access::Read));
  pushQ8Args(l.args, "qs", "meta", c.outputId(0), k, fb::Access::Write);
  l.args.push_back(kindArg(fb::ArgKind::TokenCount, "n_tokens"));
  return std::vector<KernelLaunch>{std::move(l)};
}

}  // namespace minfer::codegen
