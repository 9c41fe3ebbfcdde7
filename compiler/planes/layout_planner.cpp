// Layout planner: chooses each weight tensor's planes and computes their StrideTables.
#include "compiler/planes/layout_planner.h"

#include "llvm/Support/FormatVariadic.h"

namespace minfer::planes {

namespace {

constexpr uint64_t kMaxPlaneBytes = uint64_t{1} << 62;

bool isFloat(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// 4-bit formats whose decode GEMV reads a 4-bit packed plane (Q4_K's reads its kBlocks plane).
bool hasPacked4(GgmlType t) { return t == GgmlType::Q4_0 || t == GgmlType::Q4_1; }

// Types whose decode GEMV reads the kBlocks plane (kernels/gemv_blocks.cuh): their block slots are
// padded to 16 bytes so that every block starts 16-byte aligned (Q4_K: 144, unchanged; Q6_K: 210 → 224).
bool blocksReadByGemv(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q6_K; }

StrideTable blocksTable(GgmlType type, uint64_t rows, uint64_t cols, bool padded) {
  const GgmlTypeTraits traits = ggmlTypeTraits(type);
  StrideTable b;
  b.kind = PlaneKind::kBlocks;
  b.elem = ElemType::kU8;
  b.rows = rows;
  b.cols = cols;
  b.group_size = traits.block_size;
  b.group_pitch = padded ? static_cast<uint32_t>(alignUp(traits.type_size, kPlaneRowAlign)) : traits.type_size;
  b.row_pitch = cols / traits.block_size * b.group_pitch;
  b.ggml_type = static_cast<uint32_t>(type);
  return b;
}

StrideTable denseTable(GgmlType source, PlaneKind kind, ElemType elem, uint64_t rows, uint64_t cols) {
  StrideTable t;
  t.kind = kind;
  t.elem = elem;
  t.rows = rows;
  t.cols = cols;
  t.row_pitch = alignUp(cols * elemBytes(elem), kPlaneRowAlign);
  t.ggml_type = static_cast<uint32_t>(source);
  return t;
}

// The dense plane holding a float source in its own precision.
StrideTable floatTable(GgmlType type, uint64_t rows, uint64_t cols) {
  switch (type) {
    case GgmlType::F16: return denseTable(type, PlaneKind::kF16, ElemType::kF16, rows, cols);
    case GgmlType::BF16: return denseTable(type, PlaneKind::kBF16, ElemType::kBF16, rows, cols);
    default: return denseTable(type, PlaneKind::kF32, ElemType::kF32, rows, cols);
  }
}

StrideTable groupTable(GgmlType type, PlaneKind kind, uint64_t rows, uint64_t cols) {
  StrideTable t;
  t.kind = kind;
  t.elem = ElemType::kF32;
  t.rows = rows;
  t.cols = cols;
  t.group_size = static_cast<uint32_t>(groupSize(type));
  t.group_pitch = 4;
  t.row_pitch = alignUp(cols / t.group_size * 4, kPlaneRowAlign);
  t.ggml_type = static_cast<uint32_t>(type);
  return t;
}

void addInt8Planes(GgmlType type, uint64_t rows, uint64_t cols, std::vector<StrideTable>& out);

// The planes derived from the kBlocks plane: kI8, kScale, [kMin], [kPacked], [kF16]. With f16 (Hopper
// prefill), a type whose decode GEMV reads the kBlocks plane needs nothing else: kF16 only.
void addDerivedPlanes(GgmlType type, uint64_t rows, uint64_t cols, bool f16, std::vector<StrideTable>& out) {
  if (!(f16 && blocksReadByGemv(type))) addInt8Planes(type, rows, cols, out);
  if (f16) out.push_back(denseTable(type, PlaneKind::kF16, ElemType::kF16, rows, cols));
}

// kI8, kScale, [kMin], [kPacked]: what mmq and the int8 decode GEMV read.
void addInt8Planes(GgmlType type, uint64_t rows, uint64_t cols, std::vector<StrideTable>& out) {
  out.push_back(denseTable(type, PlaneKind::kI8, ElemType::kI8, rows, cols));
  out.push_back(groupTable(type, PlaneKind::kScale, rows, cols));
  if (hasMin(type)) out.push_back(groupTable(type, PlaneKind::kMin, rows, cols));
  if (hasPacked4(type)) {
    StrideTable p;
    p.kind = PlaneKind::kPacked;
    p.elem = ElemType::kU8;
    p.rows = rows;
    p.cols = cols;
    p.row_pitch = alignUp(cols / 2, kPlaneRowAlign);
    p.bits = 4;
    p.q_offset = type == GgmlType::Q4_0 ? -8 : 0;
    p.ggml_type = static_cast<uint32_t>(type);
    out.push_back(p);
  }
}

}  // namespace

const char* roleName(TensorRole role) {
  switch (role) {
    case TensorRole::kMatMul: return "matmul";
    case TensorRole::kEmbedding: return "embedding";
    case TensorRole::kEmbeddingMatMul: return "embedding+matmul";
    case TensorRole::kVector: return "vector";
  }
  return "unknown";
}

int TensorLayout::find(PlaneKind kind) const {
  for (size_t i = 0; i < planes.size(); ++i)
    if (planes[i].kind == kind) return static_cast<int>(i);
  return -1;
}

uint64_t TensorLayout::planeBytes() const {
  uint64_t sum = 0;
  for (const StrideTable& t : planes) sum += t.bytes();
  return sum;
}

const char* planeFormName(PlaneForm form) { return form == PlaneForm::kCompact ? "compact" : "expanded"; }

uint64_t TensorLayout::storedBytes() const {
  uint64_t sum = 0;
  for (size_t i = 0; i < planes.size(); ++i)
    if (!derived[i]) sum += planes[i].bytes();
  return sum;
}

llvm::Expected<TensorLayout> planLayout(const TensorDesc& desc, PlaneForm form, bool f16_prefill) {
  const GgmlTypeTraits traits = ggmlTypeTraits(desc.type);
  const auto fail = [&](const llvm::Twine& what) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "tensor '" + llvm::Twine(desc.name) + "' (" + traits.name + ", " +
                                       llvm::Twine(desc.rows) + " x " + llvm::Twine(desc.cols) + ", " +
                                       roleName(desc.role) + "): " + what);
  };
  if (!traits.known || !traits.supported)
    return fail(llvm::formatv("type id {0} is not supported; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                              "Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K",
                              static_cast<uint32_t>(desc.type)));
  if (desc.rows == 0 || desc.cols == 0) return fail("rows and cols must be non-zero");
  if (desc.cols % traits.block_size != 0)
    return fail(llvm::formatv("cols = {0} is not a multiple of the block size {1}", desc.cols,
                              traits.block_size));
  if (desc.experts == 0 || desc.rows % desc.experts != 0 || (desc.experts > 1 && desc.role == TensorRole::kVector))
    return fail(llvm::formatv("{0} experts: need ≥ 1 experts that divide the rows, and no expert axis on a vector",
                              desc.experts));
  // Bound every size before multiplying. The widest row of any plane is the f32 one (4 bytes per
  // weight, padded by < 16 bytes); every other plane row and the source row are narrower.
  const uint64_t blocks_per_row = desc.cols / traits.block_size;
  if (desc.cols > (uint64_t{1} << 40) || desc.rows > kMaxPlaneBytes / (desc.cols * 4 + kPlaneRowAlign))
    return fail(llvm::formatv("{0} x {1} weights exceed the plane size limit of 2^62 bytes", desc.rows,
                              desc.cols));

  TensorLayout layout;
  layout.desc = desc;
  layout.source_row_bytes = blocks_per_row * traits.type_size;
  layout.source_bytes = desc.rows * layout.source_row_bytes;

  const uint64_t rows = desc.rows, cols = desc.cols;
  const bool floating = isFloat(desc.type);
  const bool matmul = desc.role == TensorRole::kMatMul || desc.role == TensorRole::kEmbeddingMatMul;
  switch (desc.role) {
    case TensorRole::kVector:
      layout.planes.push_back(denseTable(desc.type, PlaneKind::kF32, ElemType::kF32, rows, cols));
      break;
    case TensorRole::kMatMul:
    case TensorRole::kEmbedding:
    case TensorRole::kEmbeddingMatMul:
      if (floating) {
        layout.planes.push_back(floatTable(desc.type, rows, cols));
        break;
      }
      layout.planes.push_back(blocksTable(desc.type, rows, cols, matmul && blocksReadByGemv(desc.type)));
      // Q4_K and Q6_K expert tensors: the MoE kernels read their kBlocks plane only (kernels/moe.cuh).
      if (matmul && !(desc.experts > 1 && blocksReadByGemv(desc.type)))
        addDerivedPlanes(desc.type, rows, cols, f16_prefill && desc.experts == 1, layout.planes);
      break;
    default:
      return fail(llvm::formatv("unknown role {0}", static_cast<unsigned>(desc.role)));
  }
  if (desc.experts > 1)
    for (StrideTable& t : layout.planes) {
      t.experts = desc.experts;
      t.expert_pitch = rows / desc.experts * t.row_pitch;
    }
  // Every plane after a quantized tensor's kBlocks plane is derived from it.
  layout.derived.assign(layout.planes.size(), false);
  if (form == PlaneForm::kCompact)
    for (size_t i = 1; i < layout.planes.size(); ++i) layout.derived[i] = layout.planes[0].kind == PlaneKind::kBlocks;
  return layout;
}

}  // namespace minfer::planes
