// StrideTable: the single description of how a weight plane is laid out in memory (DESIGN.md §3).
//
// Shared by the compiler (writes planes and records their tables in the artifact), the CPU backend
// (reads planes through the table) and the kernel specializer (bakes the strides into each NVRTC
// compilation as compile-time constants). Compiles under host compilers, nvcc and NVRTC.
//
// A plane always describes a logical matrix of `rows` × `cols` weights (rows = out_features,
// cols = in_features). Addressing of logical element (r, c):
//   kI8 / kF32 / kF16 / kBF16 (dense):   byte offset = r * row_pitch + c * elemBytes(elem)
//   kScale / kMin (one value per group): byte offset = r * row_pitch + (c / group_size) * group_pitch
//   kPacked: see packedOffset below (bits of q packed along cols, 16-byte aligned rows).
//   kBlocks: the block holding (r, c) is at r * row_pitch + (c / group_size) * group_pitch, with
//            group_size = the type's block size and group_pitch = its bytes per block; the element is
//            c % group_size within that block (dequantizeBlock of `ggml_type`).
#pragma once

#include "kernels/block_formats.h"

namespace minfer {

// What a plane holds (values are stored in the artifact: append only, never renumber).
enum class PlaneKind : uint8_t {
  kI8 = 0,      // int8 q per weight, row-major                            (prefill int8 GEMM)
  kScale = 1,   // float32 scale per (row, group)                          (prefill and decode)
  kMin = 2,     // float32 additive offset per (row, group)                (prefill and decode)
  kPacked = 3,  // q packed at `bits` per weight, for 16-byte GEMV loads   (decode)
  kF32 = 4,     // dense float32                                           (float sources, norms, biases)
  kF16 = 5,     // dense binary16                                          (float sources)
  kBF16 = 6,    // dense bfloat16                                          (float sources)
  kBlocks = 7,  // the source GGUF blocks, unchanged, row-major             (embedding row gather)
};

// Storage type of one element of a plane (append only).
enum class ElemType : uint8_t { kI8 = 0, kF32 = 1, kF16 = 2, kBF16 = 3, kU8 = 4 };

MINFER_HD uint32_t elemBytes(ElemType t) {
  switch (t) {
    case ElemType::kI8: case ElemType::kU8: return 1;
    case ElemType::kF16: case ElemType::kBF16: return 2;
    case ElemType::kF32: return 4;
  }
  return 0;
}

struct StrideTable {
  PlaneKind kind = PlaneKind::kF32;
  ElemType elem = ElemType::kF32;
  uint64_t rows = 0;         // logical rows (out_features)
  uint64_t cols = 0;         // logical cols (in_features), in weights
  uint64_t row_pitch = 0;    // bytes between the starts of consecutive rows
  uint32_t group_size = 1;   // weights per group along cols (scale/min planes; 1 otherwise)
  uint32_t group_pitch = 0;  // bytes between consecutive groups of a row (scale/min planes)
  uint32_t bits = 8;         // packed plane: bits per weight (4 or 8)
  int32_t q_offset = 0;      // packed plane: stored unsigned value u, q = u + q_offset
  uint32_t ggml_type = 0;    // source GgmlType id (kBlocks planes decode with it)

  // Total bytes the plane occupies: rows * row_pitch (every row padded to row_pitch).
  MINFER_HD uint64_t bytes() const { return rows * row_pitch; }
};

// Byte offset of logical element (r, c) for dense and scale/min planes; for kBlocks, of its block.
MINFER_HD uint64_t elementOffset(const StrideTable& t, uint64_t r, uint64_t c) {
  if (t.kind == PlaneKind::kScale || t.kind == PlaneKind::kMin || t.kind == PlaneKind::kBlocks)
    return r * t.row_pitch + (c / t.group_size) * t.group_pitch;
  return r * t.row_pitch + c * elemBytes(t.elem);
}

// Packed plane, bits = 4: within each run of 32 weights along a row (16 bytes), byte b holds weight b
// in its low nibble and weight b + 16 in its high nibble (ggml's Q4_0 order, so one 16-byte load
// gives 32 consecutive weights). bits = 8: one byte per weight. Returns the byte offset and, for
// 4-bit, the shift (0 or 4) of the nibble.
MINFER_HD uint64_t packedOffset(const StrideTable& t, uint64_t r, uint64_t c, uint32_t* shift) {
  if (t.bits == 4) {
    *shift = (c % 32) < 16 ? 0 : 4;
    return r * t.row_pitch + (c / 32) * 16 + (c % 16);
  }
  *shift = 0;
  return r * t.row_pitch + c;
}

}  // namespace minfer
