// Op family ExpandBlocks → kernels/expand_blocks.cuh: at load, a tensor's kBlocks plane → its derived
// planes (kI8, kScale, [kMin], [kPacked], [kF16]). Load plan only; the Weight arguments that receive the
// derived planes are written (Access Write), which the verifier allows in the load plan alone.
#include "compiler/codegen/ops/op_family.h"
#include "kernels/expand_blocks.cuh"

namespace minfer::codegen {

Launches expandBlocksLaunches(const StepContext& c) {
  if (!c.load()) return c.error("ExpandBlocks belongs to the load plan only");
  auto w = c.weight(0);
  if (!w) return w.takeError();
  const planes::TensorLayout& l = **w;
  const StrideTable* blocks = findPlane(l, PlaneKind::kBlocks);
  const StrideTable* q = findPlane(l, PlaneKind::kI8);
  const StrideTable* f16 = findPlane(l, PlaneKind::kF16);
  const StrideTable* s = findPlane(l, PlaneKind::kScale);
  const StrideTable* mins = findPlane(l, PlaneKind::kMin);
  const StrideTable* packed = findPlane(l, PlaneKind::kPacked);
  if (!blocks || (!q && !f16) || (q != nullptr) != (s != nullptr))
    return c.error(llvm::formatv("'{0}' needs a kBlocks plane and kI8 with kScale, or kF16, to expand", l.desc.name));
  if (packed && packed->bits != 4)
    return c.error(llvm::formatv("'{0}': only 4-bit kPacked planes are derived at load", l.desc.name));
  const uint64_t per_row = l.desc.cols / ggmlTypeTraits(l.desc.type).block_size;
  const uint64_t total = l.desc.rows * per_row;
  if (total >= (uint64_t{1} << 31))
    return c.error(llvm::formatv("'{0}' has {1} blocks; one expansion launch takes fewer than 2^31", l.desc.name,
                                 total));
  SpecBuilder b(llvm::formatv("expand_blocks_{0}_r{1}_k{2}{3}{4}", typeTag(static_cast<uint32_t>(l.desc.type)),
                              l.desc.rows, l.desc.cols, packed ? "_packed4" : "", f16 ? "_f16" : ""),
                "kernels/expand_blocks.cuh", "minfer_expand_blocks");
  b.define("EXPAND_TYPE", static_cast<uint64_t>(l.desc.type))
      .define("EXPAND_ROWS", l.desc.rows)
      .define("EXPAND_BLOCKS", per_row)
      .define("EXPAND_SRC_PITCH", blocks->row_pitch)
      .define("EXPAND_SRC_GROUP_PITCH", static_cast<uint64_t>(blocks->group_pitch))
      .define("EXPAND_HAS_I8", static_cast<uint64_t>(q != nullptr))
      .define("EXPAND_I8_PITCH", q ? q->row_pitch : 0)
      .define("EXPAND_S_PITCH", s ? s->row_pitch : 0)
      .define("EXPAND_HAS_MIN", static_cast<uint64_t>(mins != nullptr))
      .define("EXPAND_M_PITCH", mins ? mins->row_pitch : 0)
      .define("EXPAND_HAS_PACKED", static_cast<uint64_t>(packed != nullptr))
      .define("EXPAND_P_PITCH", packed ? packed->row_pitch : 0)
      .define("EXPAND_Q_OFFSET", static_cast<int64_t>(packed ? packed->q_offset : 0))
      .define("EXPAND_HAS_F16", static_cast<uint64_t>(f16 != nullptr))
      .define("EXPAND_F_PITCH", f16 ? f16->row_pitch : 0)
      .flag("--fmad=false");  // decomposeBlock's products, bit-identical to the compiler's planes
  const uint32_t t = c.weightId(0);
  KernelLaunch k{b.spec, {}, kern::expandBlocksLaunchRule(total)};
  auto written = [&](const char* name, const StrideTable* plane) {
    if (!plane) return kindArg(fb::ArgKind::Null, name);
    KernelArgDesc a = weightArg(name, t, *plane);
    a.access = fb::Access::Write;
    return a;
  };
  k.args = {weightArg("blocks", t, *blocks), written("q", q), written("scale", s), written("min", mins),
            written("packed", packed), written("f16", f16)};
  return std::vector<KernelLaunch>{std::move(k)};
}

}  // namespace minfer::codegen
