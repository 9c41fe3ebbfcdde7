// Test-side reference for weight planes: an independent expansion of GGUF blocks and the two gates.
//
// Nothing here calls the code under test (compiler/planes) or decomposeBlock: the per-type expansion
// follows the loop order of the format definitions (ggml's dequantize_row_* as restated in
// dequantizeBlock) and records the (q, scale, additive term) of every element; the expected plane
// images use their own address arithmetic written from the layout rules of layout_planner.h; the
// offset gate reads planes only through a StrideTable (elementOffset / packedOffset) and compares with
// dequantizeBlock bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/stride_table.h"

namespace minfer::test {

// (q, scale, additive term) of the 32 or 256 elements of one quantized block, in element order.
struct RefBlock {
  int n = 0;            // elements
  int group = 0;        // elements per scale group
  bool has_add = false; // the format has an additive term (m, or −dmin·m)
  int q[256] = {};
  float scale[16] = {};
  float add[16] = {};   // the term added: m (Q4_1/Q5_1) or −(dmin·m) (Q2_K/Q4_K/Q5_K)
};

// Expands one block of a quantized type; false for float types.
bool refExpandBlock(GgmlType type, const uint8_t* block, RefBlock* out);

// Reference value of every element, rows × cols floats row-major, from dequantizeBlock.
std::vector<float> refDequantize(GgmlType type, uint64_t rows, uint64_t cols, const uint8_t* data);

// The plane image the layout rules prescribe for `table` (its kind, pitches, group size) built from
// the source with the test's own addressing; padding is zero. A kF32 plane of a non-F32 source (a
// norm or bias) holds the dequantizeBlock values.
std::vector<uint8_t> expectedPlane(GgmlType type, const StrideTable& table, const uint8_t* source,
                                   uint64_t source_row_bytes);

// Result of the offset gate over one read path.
struct GateResult {
  uint64_t checked = 0;
  uint64_t mismatches = 0;
  std::string first;  // description of the first mismatch
};

// One plane as the gate sees it: its table (possibly altered by a negative control) and bytes.
struct GatePlane {
  StrideTable table;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
};

// Offset gate for a dense float plane or a kBlocks plane: every (r, c) read through the table must
// equal ref[r * cols + c] bit for bit. Reads outside the plane count as mismatches.
GateResult gateDirect(const GatePlane& plane, const std::vector<float>& ref);

// Offset gate for the decomposed planes: q from `qplane` (kI8 via elementOffset, or kPacked via
// packedOffset), s from `scale`, m from `min` (nullptr when the tensor has no min plane);
// value = s·q + m (or s·q) must equal ref bit for bit for every (r, c).
GateResult gateDecomposed(const GatePlane& qplane, const GatePlane& scale, const GatePlane* min,
                          const std::vector<float>& ref);

// The table a "rows ↔ cols" stride mix-up would produce: row_pitch computed by the layout rule with
// rows in place of cols (every other field unchanged).
StrideTable swappedPitch(const StrideTable& t);

}  // namespace minfer::test
