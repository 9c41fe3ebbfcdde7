// Op families SwiGlu, GeGlu and Add → kernels/elementwise.cuh: out = silu(gate) ⊙ up,
// out = gelu_tanh(gate) ⊙ up, out = a + b.
#include "compiler/codegen/ops/op_family.h"
#include "kernels/elementwise.cuh"

namespace minfer::codegen {
namespace {

Launches elementwise(const StepContext& c, int op, const char* name, const char* entry) {
  auto a = c.input(0, "first input");
  if (!a) return a.takeError();
  auto b2 = c.input(1, "second input");
  if (!b2) return b2.takeError();
  auto out = c.output(0, "output");
  if (!out) return out.takeError();
  // The operands may be column views (format 1.4, phi3's gate|up rows): widths are the views', pitches
  // the buffers' widths.
  const model::ColumnView av = c.inputView(0), bv = c.inputView(1), ov = c.outputView(0);
  const uint32_t w = av.width, ap = (*a)->width, bp = (*b2)->width, op_pitch = (*out)->width;
  if (bv.width != w || ov.width != w)
    return c.error(llvm::formatv("widths {0}, {1} → {2} differ", w, bv.width, ov.width));
  const bool views = ap != w || bp != w || op_pitch != w;
  std::string key = llvm::formatv("{0}_w{1}", name, w);
  const bool vec4 = w % 4 == 0 && ap % 4 == 0 && bp % 4 == 0 && op_pitch % 4 == 0 && av.offset % 4 == 0 &&
                    bv.offset % 4 == 0 && ov.offset % 4 == 0;
  if (views) key += llvm::formatv("_ap{0}_bp{1}_op{2}{3}", ap, bp, op_pitch, vec4 ? "_v4" : "").str();
  SpecBuilder b(key, "kernels/elementwise.cuh", entry);
  b.define("EW_WIDTH", static_cast<uint64_t>(w)).define("EW_OP", static_cast<uint64_t>(op));
  if (views)
    b.define("EW_A_PITCH", uint64_t{ap})
        .define("EW_B_PITCH", uint64_t{bp})
        .define("EW_OUT_PITCH", uint64_t{op_pitch})
        .define("EW_VEC4", uint64_t{vec4});
  KernelLaunch k{b.spec, {}, kern::elementwiseLaunchRule(w)};
  k.args = {viewArg("a", c.inputId(0), ap, av, fb::Access::Read), viewArg("b", c.inputId(1), bp, bv, fb::Access::Read),
            viewArg("out", c.outputId(0), op_pitch, ov, fb::Access::Write), kindArg(fb::ArgKind::TokenCount, "n_tokens")};
  return std::vector<KernelLaunch>{std::move(k)};
}

}  // namespace

Launches swigluLaunches(const StepContext& c) { return elementwise(c, 1, "swiglu", "minfer_swiglu"); }
Launches gegluLaunches(const StepContext& c) { return elementwise(c, 3, "geglu", "minfer_geglu"); }
Launches addLaunches(const StepContext& c) { return elementwise(c, 2, "add", "minfer_add"); }

}  // namespace minfer::codegen
