// StrideTable: the single description of how a weight plane is laid out in memory (DESIGN.md §3).
//
// Shared by the compiler (writes planes and records their tables in the artifact; schema/artifact.fbs
// mirrors StrideTable field by field), the CPU backend (reads planes through the table) and the kernel
// specializer (bakes the strides into each NVRTC compilation as compile-time constants). Compiles under
// host compilers, nvcc and NVRTC.
//
// A plane always describes a logical matrix of `rows` × `cols` weights (rows = out_features,
// cols = in_features; a norm or bias vector is 1 × n). All multi-byte values are little-endian.
//
// Addressing of logical element (r, c) (elementOffset / packedOffset below):
//   kI8 / kF32 / kF16 / kBF16 (dense):   byte offset = r * row_pitch + c * elemBytes(elem)
//   kScale / kMin (one value per group): byte offset = r * row_pitch + (c / group_size) * group_pitch
//   kPacked: see packedOffset below (bits of q packed along cols, 16-byte aligned rows).
//   kBlocks: the block holding (r, c) is at r * row_pitch + (c / group_size) * group_pitch, with
//            group_size = the type's block size and group_pitch = its bytes per block; the element is
//            c % group_size within that block (dequantizeBlock of `ggml_type`).
//
// Value of logical element (r, c), i.e. what every reader must reconstruct (the "offset gate" of
// DESIGN.md §3 checks that this equals dequantizeBlock of the source GGUF, bit for bit):
//   dense float planes:   the stored float (f16 / bf16 widened exactly to float32).
//   kBlocks:              dequantizeBlock(ggml_type, block)[c % group_size].
//   quantized matmul:     q = int8 at kI8, or packedQ() of kPacked (the same q);
//                         s = float32 at kScale; m = float32 at kMin when the tensor has a kMin plane;
//                         value = s * (float)q + m   with a kMin plane,
//                         value = s * (float)q       without one (NOT "+ 0.0f": that would turn a
//                                                    −0.0 product into +0.0).
//                         Both evaluated in float32 without contraction into an FMA (the source
//                         formats define value = d·q − dmin·m as a rounded product then a rounded add).
//   The kMin plane stores the additive term itself (already negated for the K-quants: −dmin·m), so
//   readers always add it.
//   kF16 derived from a quantized tensor (layout_planner.h f16_prefill): f16Weight below, the value
//   above rounded to binary16 (to nearest, ties to even): an approximation (relative error ≤ 2^-11, or
//   ≤ 2^-25 absolute below 2^-14), the only plane whose value is not dequantizeBlock's exactly.
//
// Expert axis (MoE expert tensors, GGUF ne = [cols, rows_per_expert, experts]): `experts` slices of
// rows / experts consecutive rows each; expert e's row r is logical row e·(rows / experts) + r, whose
// bytes start at e·expert_pitch + r·row_pitch (expertOffset), expert_pitch = (rows / experts)·row_pitch.
// A plane without an expert axis has experts = 1, expert_pitch = 0. Every other rule above applies to
// the plane as the rows × cols matrix it still is (rows = all experts' rows), so readers that know no
// experts read it whole; kernels that select experts add expertOffset to the plane's base.
//
// Row padding: every plane except kBlocks pads each row to a multiple of kPlaneRowAlign (16) bytes,
// so every row of every plane starts 16-byte aligned (prefill GEMM tiles and decode GEMV loads use
// 16-byte loads). Padding bytes are zero. kBlocks rows are the source rows unchanged (row_pitch = the
// source row's bytes), so a row gather is one contiguous copy of one GGUF row.
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

// Every plane row except kBlocks starts at a multiple of this many bytes (see the header comment).
constexpr uint32_t kPlaneRowAlign = 16;

MINFER_HD uint64_t alignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Short lowercase name of a plane kind ("i8", "scale", …) for messages and tools.
MINFER_HD const char* planeKindName(PlaneKind kind) {
  switch (kind) {
    case PlaneKind::kI8: return "i8";
    case PlaneKind::kScale: return "scale";
    case PlaneKind::kMin: return "min";
    case PlaneKind::kPacked: return "packed";
    case PlaneKind::kF32: return "f32";
    case PlaneKind::kF16: return "f16";
    case PlaneKind::kBF16: return "bf16";
    case PlaneKind::kBlocks: return "blocks";
  }
  return "unknown";
}

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
  ElemType elem = ElemType::kF32;  // kI8 plane: kI8; kScale/kMin: kF32; kPacked/kBlocks: kU8
  uint64_t rows = 0;         // logical rows (out_features)
  uint64_t cols = 0;         // logical cols (in_features), in weights
  uint64_t row_pitch = 0;    // bytes between the starts of consecutive rows
  uint32_t group_size = 1;   // weights per group along cols (scale/min planes; block size for kBlocks; 1 otherwise)
  uint32_t group_pitch = 0;  // bytes between consecutive groups of a row (scale/min: 4; kBlocks: block bytes)
  uint32_t bits = 8;         // packed plane: bits per weight (4 or 8)
  int32_t q_offset = 0;      // packed plane: stored unsigned value u, q = u + q_offset
  uint32_t ggml_type = 0;    // source GgmlType id (the compiler sets it on every plane; kBlocks decodes with it)
  uint32_t experts = 1;      // expert slices along rows (1: no expert axis); rows % experts == 0
  uint64_t expert_pitch = 0; // bytes between the first rows of consecutive experts: (rows / experts)·row_pitch

  // Total bytes the plane occupies: rows * row_pitch (every row padded to row_pitch).
  MINFER_HD uint64_t bytes() const { return rows * row_pitch; }
};

// The binary16 bits of a quantized weight s·q (+ m when the tensor has a kMin plane): the value of a
// kF16 plane derived from a quantized tensor (header comment). Host and device round the same way
// (floatToHalf); callers compile without FMA contraction (the product is rounded before the add).
MINFER_HD uint16_t f16Weight(float s, int q, float m, bool has_min) {
  const float p = s * static_cast<float>(q);
  return floatToHalf(has_min ? p + m : p);
}

// Byte offset of logical element (r, c) for dense and scale/min planes; for kBlocks, of its block.
MINFER_HD uint64_t elementOffset(const StrideTable& t, uint64_t r, uint64_t c) {
  if (t.kind == PlaneKind::kScale || t.kind == PlaneKind::kMin || t.kind == PlaneKind::kBlocks)
    return r * t.row_pitch + (c / t.group_size) * t.group_pitch;
  return r * t.row_pitch + c * elemBytes(t.elem);
}

// Rows of one expert slice (rows when the plane has no expert axis).
MINFER_HD uint64_t expertRows(const StrideTable& t) { return t.experts > 1 ? t.rows / t.experts : t.rows; }

// Byte offset of expert e's first row (0 for e = 0 and for planes without an expert axis). Row r of
// expert e is at expertOffset(t, e) + elementOffset(t, r, c) with r < expertRows(t).
MINFER_HD uint64_t expertOffset(const StrideTable& t, uint64_t e) { return e * t.expert_pitch; }

// Packed plane, bits = 4: within each run of 32 weights along a row (16 bytes), byte b holds weight b
// in its low nibble and weight b + 16 in its high nibble (ggml's Q4_0 order, so one 16-byte load
// gives 32 consecutive weights). bits = 8: one byte per weight. Returns the byte offset and, for
// 4-bit, the shift (0 or 4) of the nibble. (4-bit planes need cols % 32 == 0; the compiler only makes
// them for Q4_0, Q4_1 and Q4_K, whose block sizes are multiples of 32.)
MINFER_HD uint64_t packedOffset(const StrideTable& t, uint64_t r, uint64_t c, uint32_t* shift) {
  if (t.bits == 4) {
    *shift = (c % 32) < 16 ? 0 : 4;
    return r * t.row_pitch + (c / 32) * 16 + (c % 16);
  }
  *shift = 0;
  return r * t.row_pitch + c;
}

// q of logical element (r, c) of a packed plane whose bytes start at `plane`: the stored unsigned
// field (4 or 8 bits) plus q_offset. The caller guarantees (r, c) < (rows, cols).
MINFER_HD int packedQ(const StrideTable& t, const uint8_t* plane, uint64_t r, uint64_t c) {
  uint32_t shift = 0;
  const uint64_t off = packedOffset(t, r, c, &shift);
  const uint32_t mask = t.bits == 4 ? 0xFu : 0xFFu;
  return static_cast<int>((plane[off] >> shift) & mask) + t.q_offset;
}

}  // namespace minfer
