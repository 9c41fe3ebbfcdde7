// Op family Embed → kernels/embed.cuh: gather rows of token_embd (kBlocks plane of a quantized table,
// or its dense float plane) into f32 rows.
#include "compiler/codegen/ops/op_family.h"
#include "kernels/embed.cuh"

namespace minfer::codegen {

Launches embedLaunches(const StepContext& c) {
  auto w = c.weight(0);
  if (!w) return w.takeError();
  auto ids = c.input(0, "ids");
  if (!ids) return ids.takeError();
  auto out = c.output(0, "output");
  if (!out) return out.takeError();
  const planes::TensorLayout& l = **w;
  const StrideTable* t = findPlane(l, PlaneKind::kBlocks);
  if (!t) t = densePlane(l);
  if (!t) return c.error(llvm::formatv("'{0}' has neither a kBlocks nor a dense plane to gather from", l.desc.name));
  if ((*out)->width != t->cols)
    return c.error(llvm::formatv("output width {0} != embedding width {1}", (*out)->width, t->cols));
  const bool blocks = t->kind == PlaneKind::kBlocks;
  SpecBuilder b(llvm::formatv("embed_{0}_{1}_n{2}", blocks ? "blocks" : denseTag(t->kind), typeTag(t->ggml_type),
                              t->cols),
                "kernels/embed.cuh", "minfer_embed");
  b.define("EMBED_PLANE", static_cast<uint64_t>(t->kind))
      .define("EMBED_TYPE", static_cast<uint64_t>(t->ggml_type))
      .define("EMBED_COLS", t->cols)
      .define("EMBED_ROW_PITCH", t->row_pitch)
      .define("EMBED_GROUP_SIZE", static_cast<uint64_t>(t->group_size))
      .define("EMBED_GROUP_PITCH", static_cast<uint64_t>(t->group_pitch))
      .flag("--fmad=false");  // dequantizeBlock bit-identical to the CPU
  KernelLaunch k{b.spec, {}, kern::embedLaunchRule()};
  k.args = {activationArg("ids", c.inputId(0), (*ids)->width, fb::Access::Read), weightArg("table", c.weightId(0), *t),
            activationArg("out", c.outputId(0), (*out)->width, fb::Access::Write),
            kindArg(fb::ArgKind::TokenCount, "n_tokens")};
  return std::vector<KernelLaunch>{std::move(k)};
}

}  // namespace minfer::codegen
