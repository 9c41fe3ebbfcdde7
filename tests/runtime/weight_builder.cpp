// Random GGUF-style weights and their planes, for the CPU op and interpreter tests.
#include "tests/runtime/weight_builder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace minfer::test {
namespace {

void putHalf(uint8_t* p, float v) {
  const uint16_t h = floatToHalf(v);
  p[0] = static_cast<uint8_t>(h & 0xFF);
  p[1] = static_cast<uint8_t>(h >> 8);
}

float uniform(std::mt19937_64& rng, float lo, float hi) {
  return lo + (hi - lo) * static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-53);
}

// Byte offsets of the binary16 "d" (and "dmin"/"m", or −1) fields of one block.
void scaleFields(GgmlType t, int* d, int* m) {
  *m = -1;
  switch (t) {
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: *d = 0; *m = 2; return;
    case GgmlType::Q2_K: *d = 80; *m = 82; return;
    case GgmlType::Q3_K: *d = 108; return;
    case GgmlType::Q6_K: *d = 208; return;
    default: *d = 0; return;  // Q4_0, Q5_0, Q8_0
  }
}

}  // namespace

std::vector<float> randomFloats(size_t n, std::mt19937_64& rng, float lo, float hi) {
  std::vector<float> v(n);
  for (float& x : v) x = uniform(rng, lo, hi);
  return v;
}

double maxRelError(const float* a, const double* ref, size_t n) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - ref[i]));
    max_ref = std::max(max_ref, std::fabs(ref[i]));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

RandomWeight makeRandomWeight(GgmlType type, uint64_t rows, uint64_t cols, std::mt19937_64& rng, float scale) {
  RandomWeight w;
  w.type = type;
  w.rows = rows;
  w.cols = cols;
  const GgmlTypeTraits tr = ggmlTypeTraits(type);
  const uint64_t blocks_per_row = cols / tr.block_size;
  w.source.resize(rows * blocks_per_row * tr.type_size);
  w.values.resize(rows * cols);
  const bool is_float = type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16;
  for (uint64_t b = 0; b < rows * blocks_per_row; ++b) {
    uint8_t* blk = w.source.data() + b * tr.type_size;
    if (is_float) {
      const float v = uniform(rng, -scale, scale);
      if (type == GgmlType::F32) std::memcpy(blk, &v, 4);
      if (type == GgmlType::F16) putHalf(blk, v);
      if (type == GgmlType::BF16) {
        const uint16_t bits = static_cast<uint16_t>(floatToBits(v) >> 16);
        blk[0] = static_cast<uint8_t>(bits & 0xFF);
        blk[1] = static_cast<uint8_t>(bits >> 8);
      }
    } else {
      for (uint32_t i = 0; i < tr.type_size; ++i) blk[i] = static_cast<uint8_t>(rng());
      int d, m;
      scaleFields(type, &d, &m);
      // K-quant scales multiply by 6-bit sub-scales (up to 63) and q up to 31: keep d small.
      const float q_range = tr.block_size == 256 ? 63.0f * 16.0f : (type == GgmlType::Q8_0 ? 128.0f : 16.0f);
      putHalf(blk + d, uniform(rng, 0.3f, 1.0f) * scale / q_range * (rng() % 2 ? 1.0f : -1.0f));
      if (m >= 0) putHalf(blk + m, uniform(rng, -0.5f, 0.5f) * scale / (tr.block_size == 256 ? 63.0f : 1.0f));
    }
  }
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t b = 0; b < blocks_per_row; ++b)
      dequantizeBlock(type, w.source.data() + (r * blocks_per_row + b) * tr.type_size,
                      w.values.data() + r * cols + b * tr.block_size);
  return w;
}

std::vector<BuiltPlane> buildPlanes(const RandomWeight& w, const PlaneOptions& o) {
  std::vector<BuiltPlane> out;
  const GgmlTypeTraits tr = ggmlTypeTraits(w.type);
  const uint64_t blocks_per_row = w.cols / tr.block_size;
  const uint64_t src_row_bytes = blocks_per_row * tr.type_size;
  const bool is_float = w.type == GgmlType::F32 || w.type == GgmlType::F16 || w.type == GgmlType::BF16;
  auto plane = [&](PlaneKind kind, ElemType elem, uint64_t row_bytes) -> BuiltPlane& {
    BuiltPlane p;
    p.table.kind = kind;
    p.table.elem = elem;
    p.table.rows = w.rows;
    p.table.cols = w.cols;
    p.table.row_pitch = alignUp(row_bytes, kPlaneRowAlign) + o.extra_pitch;
    p.table.ggml_type = static_cast<uint32_t>(w.type);
    p.bytes.assign(p.table.bytes(), 0xCD);
    out.push_back(std::move(p));
    return out.back();
  };
  if (o.matmul && is_float) {
    const PlaneKind kind = w.type == GgmlType::F32 ? PlaneKind::kF32 : w.type == GgmlType::F16 ? PlaneKind::kF16 : PlaneKind::kBF16;
    const ElemType elem = w.type == GgmlType::F32 ? ElemType::kF32 : w.type == GgmlType::F16 ? ElemType::kF16 : ElemType::kBF16;
    BuiltPlane& p = plane(kind, elem, src_row_bytes);
    for (uint64_t r = 0; r < w.rows; ++r)
      std::memcpy(p.bytes.data() + r * p.table.row_pitch, w.source.data() + r * src_row_bytes, src_row_bytes);
  } else if (o.matmul) {
    const uint32_t gs = static_cast<uint32_t>(groupSize(w.type));
    const uint64_t groups = w.cols / gs;
    plane(PlaneKind::kI8, ElemType::kI8, w.cols);
    const size_t qi = out.size() - 1;
    auto group_plane = [&](PlaneKind kind) -> size_t {
      BuiltPlane& p = plane(kind, ElemType::kF32, (groups - 1) * o.group_pitch + 4);
      p.table.group_size = gs;
      p.table.group_pitch = o.group_pitch;
      return out.size() - 1;
    };
    const size_t si = group_plane(PlaneKind::kScale);
    const size_t mi = hasMin(w.type) ? group_plane(PlaneKind::kMin) : SIZE_MAX;
    int8_t qv[kQK_K];
    float sc[kQK_K / 16], mn[kQK_K / 16];
    for (uint64_t r = 0; r < w.rows; ++r)
      for (uint64_t b = 0; b < blocks_per_row; ++b) {
        decomposeBlock(w.type, w.source.data() + r * src_row_bytes + b * tr.type_size, qv, sc, mn);
        BuiltPlane& qp = out[qi];
        std::memcpy(qp.bytes.data() + r * qp.table.row_pitch + b * tr.block_size, qv, tr.block_size);
        for (uint32_t g = 0; g < tr.block_size / gs; ++g) {
          const uint64_t group = b * (tr.block_size / gs) + g;
          BuiltPlane& sp = out[si];
          std::memcpy(sp.bytes.data() + r * sp.table.row_pitch + group * o.group_pitch, &sc[g], 4);
          if (mi != SIZE_MAX) {
            BuiltPlane& mp = out[mi];
            std::memcpy(mp.bytes.data() + r * mp.table.row_pitch + group * o.group_pitch, &mn[g], 4);
          }
        }
      }
  }
  if (o.blocks) {
    BuiltPlane p;
    p.table.kind = PlaneKind::kBlocks;
    p.table.elem = ElemType::kU8;
    p.table.rows = w.rows;
    p.table.cols = w.cols;
    p.table.row_pitch = src_row_bytes + o.extra_pitch;
    p.table.group_size = tr.block_size;
    p.table.group_pitch = tr.type_size;
    p.table.ggml_type = static_cast<uint32_t>(w.type);
    p.bytes.assign(p.table.bytes(), 0xCD);
    for (uint64_t r = 0; r < w.rows; ++r)
      std::memcpy(p.bytes.data() + r * p.table.row_pitch, w.source.data() + r * src_row_bytes, src_row_bytes);
    out.push_back(std::move(p));
  }
  return out;
}

cpu::WeightPlanes viewPlanes(const std::vector<BuiltPlane>& planes, const char* name) {
  cpu::WeightPlanes w;
  w.name = name;
  for (const BuiltPlane& p : planes) {
    cpu::PlaneView v{p.table, p.bytes.data(), p.bytes.size()};
    w.rows = p.table.rows;
    w.cols = p.table.cols;
    switch (p.table.kind) {
      case PlaneKind::kF32: case PlaneKind::kF16: case PlaneKind::kBF16: w.dense = v; break;
      case PlaneKind::kI8: w.q = v; break;
      case PlaneKind::kScale: w.scale = v; break;
      case PlaneKind::kMin: w.min = v; break;
      case PlaneKind::kBlocks: w.blocks = v; break;
      default: break;
    }
  }
  return w;
}

}  // namespace minfer::test
