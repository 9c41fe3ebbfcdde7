// Op families RmsNorm and HeadRmsNorm → kernels/rms_norm.cuh: RMSNorm of whole rows, and per head in
// place (qwen3 q/k norm).
#include "compiler/codegen/ops/op_family.h"
#include "kernels/rms_norm.cuh"

namespace minfer::codegen {

Launches rmsNormLaunches(const StepContext& c) {
  auto in = c.input(0, "input");
  if (!in) return in.takeError();
  auto out = c.output(0, "output");
  if (!out) return out.takeError();
  const uint32_t width = (*in)->width;
  if ((*out)->width != width)
    return c.error(llvm::formatv("input width {0} != output width {1}", width, (*out)->width));
  auto w = c.vector(0, width);
  if (!w) return w.takeError();
  const float eps = c.step().eps;
  SpecBuilder b(llvm::formatv("rms_norm_w{0}_eps{1}", width, keyNumber(eps)), "kernels/rms_norm.cuh",
                "minfer_rms_norm");
  b.define("RMS_WIDTH", static_cast<uint64_t>(width)).define("RMS_EPS", floatLiteral(eps));
  KernelLaunch k{b.spec, {}, kern::rmsNormLaunchRule()};
  k.args = {activationArg("x", c.inputId(0), width, fb::Access::Read), weightArg("w", c.weightId(0), **w),
            activationArg("out", c.outputId(0), width, fb::Access::Write),
            kindArg(fb::ArgKind::TokenCount, "n_tokens")};
  return std::vector<KernelLaunch>{std::move(k)};
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
