// Op families RmsNorm and HeadRmsNorm → kernels/rms_norm.cuh: RMSNorm of whole rows, and per head in
// place (qwen3 q/k norm).
#include "compiler/codegen/ops/op_family.h"
#include "kernels/rms_norm.cuh"

namespace minfer::codegen {

namespace {

// The RmsNorm kernel for step c; with `add` (the Add step before it, whose output c normalizes, fused
// into the launch) RMS_ADD and the Add's operands; with `quant` (the QuantizeAct step after it) RMS_Q8
// and the q8 outputs of that step.
Launches rmsNorm(const StepContext& c, const StepContext* add, const StepContext* quant) {
  auto in = c.input(0, "input");
  if (!in) return in.takeError();
  auto out = c.output(0, "output");
  if (!out) return out.takeError();
  const uint32_t width = (*in)->width;
  if ((*out)->width != width)
    return c.error(llvm::formatv("input width {0} != output width {1}", width, (*out)->width));
  auto w = c.vector(0, width);
  if (!w) return w.takeError();
  if (quant)
    if (llvm::Error e = checkFusedQuantize(*quant, width)) return e;
  if (add) {
    for (size_t i = 0; i < 2; ++i) {
      auto operand = add->input(i, "addend");
      if (!operand) return operand.takeError();
      if ((*operand)->width != width)
        return add->error(llvm::formatv("fused into the RmsNorm after it: addend width {0} != {1}", (*operand)->width, width));
    }
  }
  const float eps = c.step().eps;
  SpecBuilder b(llvm::formatv("rms_norm_w{0}_eps{1}{2}{3}", width, keyNumber(eps), add ? "_add" : "", quant ? "_q8" : ""),
                "kernels/rms_norm.cuh", "minfer_rms_norm");
  b.define("RMS_WIDTH", static_cast<uint64_t>(width)).define("RMS_EPS", floatLiteral(eps));
  if (add) b.define("RMS_ADD", uint64_t{1});
  if (quant) b.define("RMS_Q8", uint64_t{1});
  KernelLaunch k{b.spec, {}, kern::rmsNormLaunchRule()};
  if (add)
    k.args = {activationArg("a", add->inputId(0), width, fb::Access::Read),
              activationArg("b", add->inputId(1), width, fb::Access::Read),
              activationArg("x", c.inputId(0), width, fb::Access::Write)};
  else
    k.args = {activationArg("x", c.inputId(0), width, fb::Access::Read)};
  k.args.push_back(weightArg("w", c.weightId(0), **w));
  k.args.push_back(activationArg("out", c.outputId(0), width, fb::Access::Write));
  if (quant) pushQ8Args(k.args, "qs", "meta", quant->outputId(0), width, fb::Access::Write);
  k.args.push_back(kindArg(fb::ArgKind::TokenCount, "n_tokens"));
  return std::vector<KernelLaunch>{std::move(k)};
}

}  // namespace

Launches rmsNormLaunches(const StepContext& c) { return rmsNorm(c, nullptr, nullptr); }

Launches rmsNormQuantizeLaunches(const StepContext& norm, const StepContext& quant) {
  return rmsNorm(norm, nullptr, &quant);
}

Launches addRmsNormLaunches(const StepContext& add, const StepContext& norm, const StepContext* quant) {
  return rmsNorm(norm, &add, quant);
}

Launches headRmsNormLaunches(const StepContext& c) {
  const model::StepDesc& s = c.step();
  auto in = c.input(0, "input");
  if (!in) return in.takeError();
  if (s.n_head == 0 || s.head_dim == 0 || (*in)->width != s.n_head * s.head_dim)
    return c.error(
        llvm::formatv("buffer width {0} != n_head {1} × head_dim {2}", (*in)->width, s.n_head, s.head_dim));
  auto w = c.vector(0, s.head_dim);
  if (!w) return w.takeError();
  SpecBuilder b(llvm::formatv("head_rms_norm_h{0}_d{1}_eps{2}", s.n_head, s.head_dim, keyNumber(s.eps)),
                "kernels/rms_norm.cuh", "minfer_head_rms_norm");
  b.define("HRMS_NHEAD", static_cast<uint64_t>(s.n_head))
      .define("HRMS_HEAD_DIM", static_cast<uint64_t>(s.head_dim))
      .define("HRMS_EPS", floatLiteral(s.eps));
  KernelLaunch k{b.spec, {}, kern::headRmsNormLaunchRule(s.n_head)};
  k.args = {activationArg("x", c.inputId(0), (*in)->width, fb::Access::ReadWrite), weightArg("w", c.weightId(0), **w),
            kindArg(fb::ArgKind::TokenCount, "n_tokens")};
  return std::vector<KernelLaunch>{std::move(k)};
}

}  // namespace minfer::codegen
