// Op families SwiGlu, GeGlu and Add → kernels/elementwise.cuh: out = silu(gate) ⊙ up,
// out = gelu_tanh(gate) ⊙ up, out = a + b.
#include "compiler/codegen/ops/op_family.h"
#include "kernels/elementwise.cuh"

namespace minfer::codegen {
namespace {

// `quant`: the QuantizeAct step fused into this launch (EW_Q8), or nullptr.
Launches elementwise(const StepContext& c, int op, const char* name, const char* entry,
                     const StepContext* quant = nullptr) {
  auto a = c.input(0, "first input");
  if (!a) return a.takeError();
  auto b2 = c.input(1, "second input");
  if (!b2) return b2.takeError();
  auto out = c.output(0, "output");
  if (!out) return out.takeError();
  const uint32_t w = (*a)->width;
  if ((*b2)->width != w || (*out)->width != w)
    return c.error(llvm::formatv("widths {0}, {1} → {2} differ", w, (*b2)->width, (*out)->width));
  if (quant)
    if (llvm::Error e = checkFusedQuantize(*quant, w)) return e;
  SpecBuilder b(llvm::formatv("{0}_w{1}{2}", name, w, quant ? "_q8" : ""), "kernels/elementwise.cuh", entry);
  b.define("EW_WIDTH", static_cast<uint64_t>(w)).define("EW_OP", static_cast<uint64_t>(op));
  if (quant) b.define("EW_Q8", uint64_t{1});
  KernelLaunch k{b.spec, {}, kern::elementwiseLaunchRule(w)};
  k.args = {activationArg("a", c.inputId(0), w, fb::Access::Read), activationArg("b", c.inputId(1), w, fb::Access::Read),
            activationArg("out", c.outputId(0), w, fb::Access::Write)};
  if (quant) pushQ8Args(k.args, "qs", "meta", quant->outputId(0), w, fb::Access::Write);
  k.args.push_back(kindArg(fb::ArgKind::TokenCount, "n_tokens"));
  return std::vector<KernelLaunch>{std::move(k)};
}

}  // namespace

Launches swigluLaunches(const StepContext& c) { return elementwise(c, 1, "swiglu", "minfer_swiglu"); }
Launches gegluLaunches(const StepContext& c) { return elementwise(c, 3, "geglu", "minfer_geglu"); }
Launches addLaunches(const StepContext& c) { return elementwise(c, 2, "add", "minfer_add"); }

Launches gluQuantizeLaunches(const StepContext& glu, const StepContext& quant) {
  return glu.step().op == fb::OpKind::GeGlu ? elementwise(glu, 3, "geglu", "minfer_geglu", &quant)
                                            : elementwise(glu, 1, "swiglu", "minfer_swiglu", &quant);
}

}  // namespace minfer::codegen
