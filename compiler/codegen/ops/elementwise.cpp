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
  // The operands may be column views (format 1.4, phi3's gate|up rows): widths are the views', pitches
  // the buffers' widths.
  const model::ColumnView av = c.inputView(0), bv = c.inputView(1), ov = c.outputView(0);
  const uint32_t w = av.width, ap = (*a)->width, bp = (*b2)->width, op_pitch = (*out)->width;
  if (bv.width != w || ov.width != w)
    return c.error(llvm::formatv("widths {0}, {1} → {2} differ", w, bv.width, ov.width));
  const bool views = ap != w || bp != w || op_pitch != w;
  if (quant && views) return quant->error("the fused quantization takes whole buffers, not column views");
  if (quant)
    if (llvm::Error e = checkFusedQuantize(*quant, w)) return e;
  std::string key = llvm::formatv("{0}_w{1}", name, w);
  const bool vec4 = w % 4 == 0 && ap % 4 == 0 && bp % 4 == 0 && op_pitch % 4 == 0 && av.offset % 4 == 0 &&
                    bv.offset % 4 == 0 && ov.offset % 4 == 0;
  if (views) key += llvm::formatv("_ap{0}_bp{1}_op{2}{3}", ap, bp, op_pitch, vec4 ? "_v4" : "").str();
  if (quant) key += "_q8";
  SpecBuilder b(key, "kernels/elementwise.cuh", entry);
  b.define("EW_WIDTH", static_cast<uint64_t>(w)).define("EW_OP", static_cast<uint64_t>(op));
  if (views)
    b.define("EW_A_PITCH", uint64_t{ap})
        .define("EW_B_PITCH", uint64_t{bp})
        .define("EW_OUT_PITCH", uint64_t{op_pitch})
        .define("EW_VEC4", uint64_t{vec4});
  if (quant) b.define("EW_Q8", uint64_t{1});
  KernelLaunch k{b.spec, {}, kern::elementwiseLaunchRule(w)};
  k.args = {viewArg("a", c.inputId(0), ap, av, fb::Access::Read), viewArg("b", c.inputId(1), bp, bv, fb::Access::Read),
            viewArg("out", c.outputId(0), op_pitch, ov, fb::Access::Write)};
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
