// Op family Scale → kernels/scale.cuh: out = x·scale, optionally soft-capped (gemma's embedding scale and
// final logit soft-capping); out may equal x.
#include <cmath>

#include "compiler/codegen/ops/op_family.h"
#include "kernels/scale.cuh"

namespace minfer::codegen {

Launches scaleLaunches(const StepContext& c) {
  const model::StepDesc& s = c.step();
  auto in = c.input(0, "input");
  if (!in) return in.takeError();
  auto out = c.output(0, "output");
  if (!out) return out.takeError();
  const uint32_t w = (*in)->width;
  if ((*out)->width != w) return c.error(llvm::formatv("input width {0} != output width {1}", w, (*out)->width));
  if (!std::isfinite(s.scale) || !std::isfinite(s.softcap) || s.softcap < 0)
    return c.error(llvm::formatv("scale {0} and softcap {1} must be finite (softcap ≥ 0)", s.scale, s.softcap));
  std::string key = llvm::formatv("scale_w{0}_s{1}", w, keyNumber(s.scale));
  if (s.softcap > 0) key += "_cap" + keyNumber(s.softcap);
  SpecBuilder b(key, "kernels/scale.cuh", "minfer_scale");
  b.define("SC_WIDTH", static_cast<uint64_t>(w))
      .define("SC_SCALE", floatLiteral(s.scale))
      .define("SC_SOFTCAP", floatLiteral(s.softcap));
  KernelLaunch k{b.spec, {}, kern::scaleLaunchRule(w)};
  k.args = {activationArg("x", c.inputId(0), w, fb::Access::Read), activationArg("out", c.outputId(0), w, fb::Access::Write),
            kindArg(fb::ArgKind::TokenCount, "n_tokens")};
  return std::vector<KernelLaunch>{std::move(k)};
}

}  // namespace minfer::codegen
