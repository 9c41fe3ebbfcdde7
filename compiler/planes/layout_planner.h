// Layout planner: which planes a weight tensor becomes and the StrideTable of each (DESIGN.md §3).
//
// Decisions (the StrideTable header, kernels/stride_table.h, defines addressing and value semantics):
//
//   role            source type                   planes, in this order
//   kMatMul         Q4_0, Q4_1                    kBlocks, then derived: kI8, kScale, [kMin], kPacked (4 bits)
//                   Q4_K, Q5_0, Q5_1, Q8_0,       kBlocks, then derived: kI8, kScale, [kMin]
//                   Q2_K, Q3_K, Q5_K, Q6_K
//                   F32 / F16 / BF16              kF32 / kF16 / kBF16 (dense, the source precision)
//   kEmbedding      quantized                     kBlocks (the GGUF rows unchanged, for row gather)
//                   F32 / F16 / BF16              the dense plane of the source precision
//   kEmbeddingMatMul quantized                    kBlocks, then the kMatMul derived planes
//   (f16_prefill: the derived planes of a quantized matmul end with a kF16 plane, and are that plane
//   alone for Q4_K and Q6_K, whose decode reads kBlocks; not on expert tensors)
//   (expert axis)   Q4_K, Q6_K                    kBlocks only (the MoE kernels read the GGUF blocks)
//   (tied output)   F32 / F16 / BF16              the dense plane only (it serves both uses)
//   kVector         any supported type            kF32 (norm weights, biases; dequantized exactly)
//   ([kMin] only where hasMin(type): Q4_1, Q5_1, Q2_K, Q4_K, Q5_K.)
//
// Plane forms (DESIGN.md §3): in the compact form (the default) a quantized matmul weight stores only
// its kBlocks plane, i.e. the GGUF's bytes; its kI8 / kScale / kMin / kPacked planes are *derived*:
// described by stride tables like any plane but materialized by the runtime at load (the artifact's
// load plan, kernels/expand_blocks.cuh). The expanded form stores the derived planes too (the same
// bytes the load plan would write), trading file size and upload time for no expansion at load.
//
//   kI8     elem kI8, row_pitch = alignUp(cols, 16): one int8 q per weight (ranges in block_formats.h,
//           decomposeBlock). Rows are 16-byte aligned because the prefill GEMM stages tiles with
//           16-byte loads; cols is a multiple of 32 for every quantized type, so the padding is
//           empty today, but the rule does not depend on that.
//   kScale  elem kF32, group_size = groupSize(type) (16 for Q2_K/Q3_K/Q6_K, 32 otherwise),
//           group_pitch = 4, row_pitch = alignUp(4 * cols / group_size, 16).
//   kMin    same geometry as kScale; holds the additive term (m for Q4_1/Q5_1, −dmin·m for the K-quants).
//   kPacked elem kU8, bits = 4, row_pitch = alignUp(cols / 2, 16); q_offset = −8 for Q4_0 (stores
//           q + 8 ∈ 0..15), 0 for Q4_1 and Q4_K (q ∈ 0..15). Nibble order: packedOffset().
//           For 5-, 6-, 8-, 2- and 3-bit types a packedOffset-addressable plane would hold 8 bits per
//           weight, i.e. exactly the kI8 plane: none is emitted and the decode GEMV reads kI8 for
//           them. (Future work: true sub-byte layouts — a 6-bit packed Q6_K, 2-bit Q2_K, 3-bit
//           Q3_K, 5-bit Q5_* — which need new `bits` values and packedOffset cases.)
//   dense   elem of the source precision, row_pitch = alignUp(cols * elemBytes, 16). Exact copies.
//   kBlocks elem kU8, group_size = block size, row_pitch = blocks per row × group_pitch.
//           group_pitch = the block's bytes (no padding: a gathered row is one contiguous GGUF row),
//           except for matmul weights of Q4_K and Q6_K, whose decode GEMV reads the blocks with
//           16-byte loads: their block slots are alignUp(block bytes, 16) (Q4_K 144, unchanged;
//           Q6_K 224: the 210 GGUF bytes, then 14 zero bytes).
//   Every plane records ggml_type = the source type. Every plane's size is table.bytes().
//
// Expert axis (MoE expert tensors, GGUF ne = [cols, rows_per_expert, experts]): desc.experts > 1 gives
// every plane experts = desc.experts and expert_pitch = (rows / experts)·row_pitch (stride_table.h);
// the planes are otherwise planned as the rows × cols matrix of all experts' rows (expert e's rows
// follow expert e − 1's, as in the GGUF), so transforms and the load-time expansion need no change.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/stride_table.h"
#include "llvm/Support/Error.h"

namespace minfer::planes {

// How the model uses a weight tensor; decides which planes it gets.
enum class TensorRole : uint8_t {
  kMatMul = 0,           // y = W·x weight (attention/FFN projections, output.weight)
  kEmbedding = 1,        // token embedding table, read by row gather only
  kEmbeddingMatMul = 2,  // tied embedding: row gather AND the output projection (no output.weight)
  kVector = 3,           // norm weight or bias
};

const char* roleName(TensorRole role);

// Whether derived planes are stored in the artifact (kExpanded) or materialized at load (kCompact).
enum class PlaneForm : uint8_t { kCompact = 0, kExpanded = 1 };
const char* planeFormName(PlaneForm form);  // "compact" / "expanded"

// One weight tensor as the planner sees it. rows = out_features (GGUF ne[1]·ne[2]·ne[3]),
// cols = in_features (GGUF ne[0], the contiguous dimension). `name` only appears in error messages.
struct TensorDesc {
  std::string name;
  GgmlType type = GgmlType::F32;
  uint64_t rows = 0;
  uint64_t cols = 0;
  TensorRole role = TensorRole::kMatMul;
  uint32_t experts = 1;  // expert slices along rows (MoE expert tensors: GGUF ne[2]); rows % experts == 0
};

struct TensorLayout {
  TensorDesc desc;
  uint64_t source_row_bytes = 0;  // bytes of one GGUF row: cols / block_size * type_size
  uint64_t source_bytes = 0;      // rows * source_row_bytes: the GGUF tensor data size
  std::vector<StrideTable> planes;
  std::vector<bool> derived;  // parallel to planes: true = not stored, materialized at load

  // Index of the plane of `kind` in `planes`, or -1.
  int find(PlaneKind kind) const;
  // Sum of table.bytes() over the planes; over the stored (not derived) planes.
  uint64_t planeBytes() const;
  uint64_t storedBytes() const;
};

// Plans the planes of one tensor (table above). f16_prefill: a quantized kMatMul / kEmbeddingMatMul tensor
// without an expert axis also gets a derived kF16 plane, its weights s·q + m rounded to binary16
// (kernels/stride_table.h f16Weight), which the Hopper prefill matmul reads (kernels/wgmma_matmul.cuh).
// Errors (each names the tensor and the numbers): type not supported by minfer; rows or cols zero;
// cols not a multiple of the type's block size; experts 0 or not dividing rows, or on a vector; a plane or the source larger than 2^62 bytes.
llvm::Expected<TensorLayout> planLayout(const TensorDesc& desc, PlaneForm form = PlaneForm::kCompact,
                                        bool f16_prefill = false);

}  // namespace minfer::planes
