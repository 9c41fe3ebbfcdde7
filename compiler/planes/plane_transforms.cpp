// Plane transforms: GGUF blocks → kI8 / kScale / kMin / kPacked / dense / kBlocks planes, row-parallel.
#include "compiler/planes/plane_transforms.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "llvm/Support/FormatVariadic.h"

namespace minfer::planes {

static_assert(std::endian::native == std::endian::little,
              "planes are little-endian and are written with memcpy from host floats");

namespace {

constexpr int kKinds = 8;  // PlaneKind values 0..7

// Everything a row range needs: the source, and per plane kind its output (null when not requested)
// and row pitch.
struct RowContext {
  GgmlType type = GgmlType::F32;
  uint64_t cols = 0;
  uint64_t blocks_per_row = 0;
  uint64_t src_row_bytes = 0;
  const uint8_t* src = nullptr;
  uint8_t* out[kKinds] = {};
  uint64_t pitch[kKinds] = {};
  int q_offset = 0;  // of the packed plane
  uint32_t block_slot = 0;  // group_pitch of the kBlocks plane (≥ the block's bytes)

  uint8_t* row(PlaneKind k, uint64_t r) const {
    const int i = static_cast<int>(k);
    return out[i] ? out[i] + r * pitch[i] : nullptr;
  }
  uint64_t rowPitch(PlaneKind k) const { return pitch[static_cast<int>(k)]; }
};

void zeroTail(uint8_t* row, uint64_t used, uint64_t pitch) {
  if (row && pitch > used) std::memset(row + used, 0, pitch - used);
}

// ---------------------------------------------------------------------------------------------
// Byte copies: kBlocks (the source blocks, each in a slot of group_pitch bytes) and a dense plane in
// the source's own precision.

void copyBlockRows(const RowContext& x, uint64_t r0, uint64_t r1) {
  const uint32_t block_bytes = ggmlTypeTraits(x.type).type_size;
  for (uint64_t r = r0; r < r1; ++r) {
    uint8_t* dst = x.row(PlaneKind::kBlocks, r);
    const uint8_t* src = x.src + r * x.src_row_bytes;
    for (uint64_t b = 0; b < x.blocks_per_row; ++b) {
      std::memcpy(dst + b * x.block_slot, src + b * block_bytes, block_bytes);
      zeroTail(dst + b * x.block_slot, block_bytes, x.block_slot);
    }
    zeroTail(dst, x.blocks_per_row * x.block_slot, x.rowPitch(PlaneKind::kBlocks));
  }
}

void copyRows(const RowContext& x, PlaneKind kind, uint64_t r0, uint64_t r1) {
  for (uint64_t r = r0; r < r1; ++r) {
    uint8_t* dst = x.row(kind, r);
    std::memcpy(dst, x.src + r * x.src_row_bytes, x.src_row_bytes);
    zeroTail(dst, x.src_row_bytes, x.rowPitch(kind));
  }
}

// kF32 plane of any source type (norms and biases): exact widening or reference dequantization.
void toF32Rows(const RowContext& x, uint64_t r0, uint64_t r1) {
  const GgmlTypeTraits tr = ggmlTypeTraits(x.type);
  float buf[kQK_K];
  for (uint64_t r = r0; r < r1; ++r) {
    uint8_t* dst = x.row(PlaneKind::kF32, r);
    const uint8_t* src = x.src + r * x.src_row_bytes;
    if (x.type == GgmlType::F32) {
      std::memcpy(dst, src, x.cols * sizeof(float));
    } else {
      for (uint64_t b = 0; b < x.blocks_per_row; ++b) {
        dequantizeBlock(x.type, src + b * tr.type_size, buf);
        std::memcpy(dst + b * tr.block_size * sizeof(float), buf, tr.block_size * sizeof(float));
      }
    }
    zeroTail(dst, x.cols * sizeof(float), x.rowPitch(PlaneKind::kF32));
  }
}

// ---------------------------------------------------------------------------------------------
// Quantized types: decompose each block once and scatter q / scale / min / packed nibbles.

// The 4-bit packed plane's run (packedOffset, kernels/stride_table.h): ggml's Q4_0 nibble order, so a
// run is one Q4_0 block's weights and its bytes are that block's qs.
constexpr int kPackedRun = BlockTraits<GgmlType::Q4_0>::kWeights;
constexpr int kPackedRunBytes = static_cast<int>(sizeof(BlockQ4_0::qs));

// 4-bit packed run: bytes b < kPackedRunBytes of each run hold q[b] + off (low nibble) and
// q[b + kPackedRunBytes] + off (high nibble), the order of packedOffset().
inline void packNibbles(const int8_t* q, int n, int off, uint8_t* dst) {
  for (int run = 0; run < n / kPackedRun; ++run) {
    const int8_t* qr = q + kPackedRun * run;
    for (int b = 0; b < kPackedRunBytes; ++b)
      dst[kPackedRunBytes * run + b] =
          static_cast<uint8_t>(((qr[b] + off) & 0xF) | (((qr[b + kPackedRunBytes] + off) & 0xF) << 4));
  }
}

// Specialized block decompositions of the K-quants (the throughput-critical formats) and Q5_0/Q5_1. Each produces
// exactly decomposeBlock's q / scale / min (the content gate in tests/planes checks every type against
// an independent expansion), with loops that vectorize: one pass over the block's bytes, no per-element
// index arithmetic. `min` is written only for formats that have one. Sizes, field offsets and biases
// come from BlockTraits and the block structs (kernels/block_formats.h); the loop shapes are ggml's
// element orders (dequantize_row_*), stated in each comment.
// Cost: about 256 byte ops + 16 float ops per block.

// Q4_K / Q5_K: groups 2c and 2c + 1 (32 weights each) are the low and high nibbles of
// qs[32c .. 32c + 31]; Q5_K adds 16·bit g of qh[l] to weight l of group g.
template <bool kFive>
inline void fastQ45K(const uint8_t* b, int8_t* q, float* scale, float* min) {
  using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  using Tr = BlockTraits<kFive ? GgmlType::Q5_K : GgmlType::Q4_K>;
  constexpr int kG = Tr::kGroupSize;
  const float d = halfToFloat(readU16(b + offsetof(Block, d)));
  const float dmin = halfToFloat(readU16(b + offsetof(Block, dmin)));
  for (int g = 0; g < Tr::kGroups; ++g) {
    uint8_t sc, m;
    kScaleMin(g, b + offsetof(Block, scales), &sc, &m);
    scale[g] = d * static_cast<float>(sc);
    min[g] = -(dmin * static_cast<float>(m));
  }
  const uint8_t* qh = b + offsetof(BlockQ5_K, qh);  // read for Q5_K only
  const uint8_t* qs = b + offsetof(Block, qs);
  for (int c = 0; c < Tr::kGroups / 2; ++c) {
    for (int l = 0; l < kG; ++l) {
      const uint8_t v = qs[kG * c + l];
      uint8_t lo = v & 0xF, hi = v >> 4;
      if constexpr (kFive) {
        lo |= static_cast<uint8_t>(((qh[l] >> (2 * c)) & 1) << 4);
        hi |= static_cast<uint8_t>(((qh[l] >> (2 * c + 1)) & 1) << 4);
      }
      q[2 * kG * c + l] = static_cast<int8_t>(lo);
      q[2 * kG * c + kG + l] = static_cast<int8_t>(hi);
    }
  }
}

// Q4_K packed plane straight from qs: each group is one packed run; run 2c holds the low nibbles of
// qs[32c .. 32c + 31], run 2c + 1 the high nibbles; packed byte i of a run pairs its weights i and i + 16.
inline void packQ4K(const uint8_t* b, uint8_t* dst) {
  using Tr = BlockTraits<GgmlType::Q4_K>;
  static_assert(Tr::kGroupSize == kPackedRun, "a Q4_K group is one packed run");
  constexpr int kHalf = kPackedRunBytes;
  const uint8_t* qs = b + offsetof(BlockQ4_K, qs);
  for (int c = 0; c < Tr::kGroups / 2; ++c) {
    for (int i = 0; i < kHalf; ++i) {
      const uint8_t x = qs[Tr::kGroupSize * c + i], y = qs[Tr::kGroupSize * c + kHalf + i];
      dst[2 * kPackedRunBytes * c + i] = static_cast<uint8_t>((x & 0xF) | (y << 4));
      dst[2 * kPackedRunBytes * c + kPackedRunBytes + i] = static_cast<uint8_t>((x >> 4) | (y & 0xF0));
    }
  }
}

// Q6_K, ggml's order: two halves of 128 weights; weight 128n + 32k + l (quarter k, lane l < 32) is
// nibble (k / 2) of ql[64n + 32(k % 2) + l] with high bits 2k..2k+1 of qh[32n + l], minus 32;
// 16 groups of 16 with scale d · scales[g].
inline void fastQ6K(const uint8_t* b, int8_t* q, float* scale) {
  using Tr = BlockTraits<GgmlType::Q6_K>;
  constexpr int kLanes = 32;                                                // ggml's inner loop
  constexpr int kHalves = static_cast<int>(sizeof(BlockQ6_K::qh)) / kLanes;  // qh: one byte per lane
  constexpr int kHalfWeights = Tr::kWeights / kHalves;
  constexpr int kQlHalf = static_cast<int>(sizeof(BlockQ6_K::ql)) / kHalves;
  static_assert(kHalfWeights == 4 * kLanes && kQlHalf == 2 * kLanes, "Q6_K: 4 quarters per half");
  const float d = halfToFloat(readU16(b + offsetof(BlockQ6_K, d)));
  const uint8_t* scales = b + offsetof(BlockQ6_K, scales);
  for (int g = 0; g < Tr::kGroups; ++g) scale[g] = d * static_cast<float>(static_cast<int8_t>(scales[g]));
  for (int n = 0; n < kHalves; ++n) {
    const uint8_t* ql = b + offsetof(BlockQ6_K, ql) + kQlHalf * n;
    const uint8_t* qh = b + offsetof(BlockQ6_K, qh) + kLanes * n;
    int8_t* y = q + kHalfWeights * n;
    for (int l = 0; l < kLanes; ++l) {
      const uint8_t h = qh[l];
      y[l] = static_cast<int8_t>(((ql[l] & 0xF) | ((h & 3) << 4)) - Tr::kQBias);
      y[l + kLanes] = static_cast<int8_t>(((ql[l + kLanes] & 0xF) | (((h >> 2) & 3) << 4)) - Tr::kQBias);
      y[l + 2 * kLanes] = static_cast<int8_t>(((ql[l] >> 4) | (((h >> 4) & 3) << 4)) - Tr::kQBias);
      y[l + 3 * kLanes] = static_cast<int8_t>(((ql[l + kLanes] >> 4) | (((h >> 6) & 3) << 4)) - Tr::kQBias);
    }
  }
}

// Q2_K / Q3_K, ggml's order: weight 128n + 32s + j (j < 32) takes bits 2s..2s+1 of qs[32n + j]; Q3_K
// subtracts 4 when bit (4n + s) of hmask[j] is clear. 16 groups of 16.
template <bool kThree>
inline void fastQ23K(const uint8_t* b, int8_t* q, float* scale, float* min) {
  using Block = std::conditional_t<kThree, BlockQ3_K, BlockQ2_K>;
  using Tr = BlockTraits<kThree ? GgmlType::Q3_K : GgmlType::Q2_K>;
  constexpr int kLanes = 32;                                                  // ggml's inner loop
  constexpr int kHalves = static_cast<int>(sizeof(Block::qs)) / kLanes;       // 2
  constexpr int kShifts = Tr::kWeights / (kHalves * kLanes);                  // 4 2-bit fields per byte
  static_assert(kShifts == 4, "2 low bits per weight in qs");
  const uint8_t* qs = b + offsetof(Block, qs);
  if constexpr (kThree) {
    using Q3 = BlockTraits<GgmlType::Q3_K>;
    int8_t sc[Q3::kGroups];
    q3kScales(b + offsetof(BlockQ3_K, scales), sc);
    const float d = halfToFloat(readU16(b + offsetof(BlockQ3_K, d)));
    for (int g = 0; g < Q3::kGroups; ++g) scale[g] = d * static_cast<float>(sc[g] - Q3::kScaleBias);
  } else {
    using Q2 = BlockTraits<GgmlType::Q2_K>;
    constexpr uint8_t kMask = (1u << Q2::kScaleBits) - 1;
    const uint8_t* scales = b + offsetof(BlockQ2_K, scales);
    const float d = halfToFloat(readU16(b + offsetof(BlockQ2_K, d)));
    const float dmin = halfToFloat(readU16(b + offsetof(BlockQ2_K, dmin)));
    for (int g = 0; g < Q2::kGroups; ++g) {
      scale[g] = d * static_cast<float>(scales[g] & kMask);
      min[g] = -(dmin * static_cast<float>(scales[g] >> Q2::kScaleBits));
    }
  }
  const uint8_t* hmask = b + offsetof(BlockQ3_K, hmask);  // read for Q3_K only
  // Byte-wide arithmetic throughout (stays in 16-byte vectors of 16 lanes).
  for (int n = 0; n < kHalves; ++n) {
    for (int s = 0; s < kShifts; ++s) {
      uint8_t* y = reinterpret_cast<uint8_t*>(q + kShifts * kLanes * n + kLanes * s);
      for (int j = 0; j < kLanes; ++j) {
        uint8_t v = static_cast<uint8_t>((qs[kLanes * n + j] >> (2 * s)) & 3);
        if constexpr (kThree)
          v = static_cast<uint8_t>(v - ((~hmask[j] >> (kShifts * n + s)) & 1) * Tr::kQBias);
        y[j] = v;
      }
    }
  }
}

// Q5_0 / Q5_1: element j < 16 is the low nibble of qs[j], element j + 16 the high nibble; the 5th
// bit of element j is bit j of the little-endian uint32 qh. Q5_0 subtracts 16. kSpread turns one qh
// byte into 8 bytes holding 0 or 16 (its bits, moved to bit 4 of each byte).
struct SpreadTable {
  uint64_t v[256];
  constexpr SpreadTable() : v() {
    for (int k = 0; k < 256; ++k)
      for (int i = 0; i < 8; ++i) v[k] |= static_cast<uint64_t>(((k >> i) & 1) << 4) << (8 * i);
  }
};
constexpr SpreadTable kSpread;

template <bool kOne>
inline void fastQ5(const uint8_t* b, int8_t* q, float* scale, float* min) {
  using Block = std::conditional_t<kOne, BlockQ5_1, BlockQ5_0>;
  using Tr = BlockTraits<kOne ? GgmlType::Q5_1 : GgmlType::Q5_0>;
  constexpr int kHalf = Tr::kWeights / 2;
  scale[0] = halfToFloat(readU16(b + offsetof(Block, d)));
  if constexpr (kOne) min[0] = halfToFloat(readU16(b + offsetof(BlockQ5_1, m)));
  const uint8_t* qh = b + offsetof(Block, qh);
  const uint8_t* qs = b + offsetof(Block, qs);
  uint8_t high[Tr::kWeights];
  for (int k = 0; k < static_cast<int>(sizeof(Block::qh)); ++k) std::memcpy(high + 8 * k, &kSpread.v[qh[k]], 8);
  uint8_t* y = reinterpret_cast<uint8_t*>(q);
  for (int j = 0; j < kHalf; ++j) {
    y[j] = static_cast<uint8_t>(((qs[j] & 0xF) | high[j]) - Tr::kQBias);
    y[j + kHalf] = static_cast<uint8_t>(((qs[j] >> 4) | high[j + kHalf]) - Tr::kQBias);
  }
}

// One block → q (kWeights int8), scale and min (kGroups floats; min only with kHasMin).
template <GgmlType T>
inline void decomposeOne(const uint8_t* b, int8_t* q, float* scale, float* min) {
  if constexpr (T == GgmlType::Q4_K) fastQ45K<false>(b, q, scale, min);
  else if constexpr (T == GgmlType::Q5_K) fastQ45K<true>(b, q, scale, min);
  else if constexpr (T == GgmlType::Q6_K) fastQ6K(b, q, scale);
  else if constexpr (T == GgmlType::Q2_K) fastQ23K<false>(b, q, scale, min);
  else if constexpr (T == GgmlType::Q3_K) fastQ23K<true>(b, q, scale, min);
  else if constexpr (T == GgmlType::Q5_0) fastQ5<false>(b, q, scale, min);
  else if constexpr (T == GgmlType::Q5_1) fastQ5<true>(b, q, scale, min);
  else decomposeBlock(T, b, q, scale, min);
}

template <GgmlType T>
void decomposeRows(const RowContext& x, uint64_t r0, uint64_t r1) {
  using Tr = BlockTraits<T>;
  using Block = typename Tr::Block;
  constexpr int kBs = Tr::kWeights;
  constexpr int kTs = Tr::kBytes;
  constexpr int kGroups = Tr::kGroups;
  constexpr bool kHasMin = Tr::kHasMin;
  // The run-time tables of block_formats.h state the same facts (tests/planes checks every type).
  assert(ggmlTypeTraits(T).block_size == kBs && ggmlTypeTraits(T).type_size == kTs &&
         groupSize(T) == Tr::kGroupSize && hasMin(T) == kHasMin);
  const int off = -x.q_offset;
  for (uint64_t r = r0; r < r1; ++r) {
    const uint8_t* src = x.src + r * x.src_row_bytes;
    uint8_t* qi = x.row(PlaneKind::kI8, r);
    uint8_t* sc = x.row(PlaneKind::kScale, r);
    uint8_t* mn = x.row(PlaneKind::kMin, r);
    uint8_t* pk = x.row(PlaneKind::kPacked, r);
    uint8_t* fh = x.row(PlaneKind::kF16, r);  // f16_prefill: the weights rounded to binary16
    // The packed plane is derived from q unless the format's own nibble order already is the
    // packed order (Q4_0, Q4_1: stored nibble = q − q_offset) or has a direct repacking (Q4_K).
    constexpr bool kPackFromQ = !(T == GgmlType::Q4_0 || T == GgmlType::Q4_1 || T == GgmlType::Q4_K);
    const bool need_q = qi || (pk && kPackFromQ);
    const bool need_groups = sc || mn || fh;
    for (uint64_t b = 0; b < x.blocks_per_row; ++b) {
      const uint8_t* blk = src + b * kTs;
      if (need_q || need_groups) {
        int8_t qtmp[kBs];
        float scale[kGroups], min[kGroups];
        int8_t* q = qi ? reinterpret_cast<int8_t*>(qi + b * kBs) : qtmp;
        decomposeOne<T>(blk, q, scale, min);
        if (sc) std::memcpy(sc + b * sizeof scale, scale, sizeof scale);
        if constexpr (kHasMin)
          if (mn) std::memcpy(mn + b * sizeof min, min, sizeof min);
        if constexpr (kPackFromQ)
          if (pk) packNibbles(q, kBs, off, pk + b * (kBs / 2));
        if (fh) {
          uint16_t* h = reinterpret_cast<uint16_t*>(fh) + b * kBs;
          for (int j = 0; j < kBs; ++j) {
            const int g = j / Tr::kGroupSize;
            h[j] = f16Weight(scale[g], q[j], kHasMin ? min[g] : 0.0f, kHasMin);
          }
        }
      }
      if constexpr (!kPackFromQ) {
        if (pk) {
          if constexpr (T == GgmlType::Q4_K) packQ4K(blk, pk + b * (kBs / 2));
          else std::memcpy(pk + b * sizeof(Block::qs), blk + offsetof(Block, qs), sizeof(Block::qs));
        }
      }
    }
    const uint64_t groups = x.blocks_per_row * kGroups;
    zeroTail(qi, x.cols, x.rowPitch(PlaneKind::kI8));
    zeroTail(sc, groups * sizeof(float), x.rowPitch(PlaneKind::kScale));
    zeroTail(mn, groups * sizeof(float), x.rowPitch(PlaneKind::kMin));
    zeroTail(pk, x.cols / 2, x.rowPitch(PlaneKind::kPacked));
    zeroTail(fh, x.cols * 2, x.rowPitch(PlaneKind::kF16));
  }
}

using RowFn = void (*)(const RowContext&, uint64_t, uint64_t);

RowFn decomposeFn(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return decomposeRows<GgmlType::Q4_0>;
    case GgmlType::Q4_1: return decomposeRows<GgmlType::Q4_1>;
    case GgmlType::Q5_0: return decomposeRows<GgmlType::Q5_0>;
    case GgmlType::Q5_1: return decomposeRows<GgmlType::Q5_1>;
    case GgmlType::Q8_0: return decomposeRows<GgmlType::Q8_0>;
    case GgmlType::Q2_K: return decomposeRows<GgmlType::Q2_K>;
    case GgmlType::Q3_K: return decomposeRows<GgmlType::Q3_K>;
    case GgmlType::Q4_K: return decomposeRows<GgmlType::Q4_K>;
    case GgmlType::Q5_K: return decomposeRows<GgmlType::Q5_K>;
    case GgmlType::Q6_K: return decomposeRows<GgmlType::Q6_K>;
    default: return nullptr;
  }
}

bool isDenseSourceKind(PlaneKind k) {
  return k == PlaneKind::kF16 || k == PlaneKind::kBF16;
}

}  // namespace

llvm::Error transformTensor(const TensorLayout& layout, llvm::ArrayRef<uint8_t> source,
                            llvm::ArrayRef<llvm::MutableArrayRef<uint8_t>> outputs, PlaneWorkers& workers) {
  const TensorDesc& d = layout.desc;
  const auto fail = [&](const llvm::Twine& what) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "tensor '" + llvm::Twine(d.name) + "' (" + ggmlTypeTraits(d.type).name +
                                       ", " + llvm::Twine(d.rows) + " x " + llvm::Twine(d.cols) + "): " + what);
  };
  if (source.size() != layout.source_bytes)
    return fail(llvm::formatv("source data is {0} bytes, the layout expects {1} ({2} rows of {3})",
                              source.size(), layout.source_bytes, d.rows, layout.source_row_bytes));
  if (outputs.size() != layout.planes.size())
    return fail(llvm::formatv("{0} output buffers for {1} planes", outputs.size(), layout.planes.size()));

  RowContext x;
  x.type = d.type;
  x.cols = d.cols;
  x.blocks_per_row = d.cols / ggmlTypeTraits(d.type).block_size;
  x.src_row_bytes = layout.source_row_bytes;
  x.src = source.data();
  bool any = false;
  for (size_t i = 0; i < layout.planes.size(); ++i) {
    const StrideTable& t = layout.planes[i];
    if (outputs[i].empty()) continue;
    if (outputs[i].size() != t.bytes())
      return fail(llvm::formatv("output buffer of plane {0} ({1}) is {2} bytes, its stride table implies {3}",
                                i, planeKindName(t.kind), outputs[i].size(), t.bytes()));
    const int k = static_cast<int>(t.kind);
    if (k >= kKinds || x.out[k])
      return fail(llvm::formatv("plane {0}: unexpected or repeated kind {1}", i, k));
    x.out[k] = outputs[i].data();
    x.pitch[k] = t.row_pitch;
    if (t.kind == PlaneKind::kPacked) x.q_offset = t.q_offset;
    if (t.kind == PlaneKind::kBlocks) {
      if (t.group_pitch < ggmlTypeTraits(d.type).type_size || t.row_pitch < x.blocks_per_row * t.group_pitch)
        return fail(llvm::formatv("kBlocks plane: block slots of {0} bytes in rows of {1} cannot hold {2} blocks of {3}",
                                  t.group_pitch, t.row_pitch, x.blocks_per_row, ggmlTypeTraits(d.type).type_size));
      x.block_slot = t.group_pitch;
    }
    any = true;
  }
  if (!any) return llvm::Error::success();

  const bool quantized = decomposeFn(d.type) != nullptr;
  // About 64 KiB of source per chunk: large enough to amortize the claim, small enough to balance.
  const uint64_t grain = std::max<uint64_t>(1, (uint64_t{64} << 10) / std::max<uint64_t>(1, x.src_row_bytes));
  workers.parallelFor(d.rows, grain, [&](uint64_t r0, uint64_t r1) {
    if (x.out[static_cast<int>(PlaneKind::kBlocks)]) copyBlockRows(x, r0, r1);
    for (int k = 0; k < kKinds; ++k)
      if (x.out[k] && !quantized && isDenseSourceKind(static_cast<PlaneKind>(k)))
        copyRows(x, static_cast<PlaneKind>(k), r0, r1);
    if (x.out[static_cast<int>(PlaneKind::kF32)]) toF32Rows(x, r0, r1);
    if (quantized && (x.out[static_cast<int>(PlaneKind::kI8)] || x.out[static_cast<int>(PlaneKind::kScale)] ||
                      x.out[static_cast<int>(PlaneKind::kMin)] || x.out[static_cast<int>(PlaneKind::kPacked)] ||
                      x.out[static_cast<int>(PlaneKind::kF16)]))
      decomposeFn(d.type)(x, r0, r1);
  });
  return llvm::Error::success();
}

llvm::Expected<std::vector<std::vector<uint8_t>>> transformTensor(const TensorLayout& layout,
                                                                  llvm::ArrayRef<uint8_t> source,
                                                                  PlaneWorkers& workers) {
  std::vector<std::vector<uint8_t>> planes(layout.planes.size());
  std::vector<llvm::MutableArrayRef<uint8_t>> views;
  for (size_t i = 0; i < planes.size(); ++i) {
    planes[i].resize(layout.planes[i].bytes());
    views.emplace_back(planes[i]);
  }
  if (llvm::Error e = transformTensor(layout, source, views, workers)) return e;
  return planes;
}

}  // namespace minfer::planes
