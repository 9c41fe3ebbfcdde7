// Load-time plane expansion (OpKind ExpandBlocks, the artifact's load plan): a quantized tensor's
// kBlocks plane (the GGUF blocks, the only copy stored in a compact artifact) → its derived planes
// kI8, kScale, [kMin], [kPacked], [kF16] (f16Weight, for the Hopper prefill matmul), written into device memory once after the upload (DESIGN.md §3:
// "the GPU expands a 7B's plane from the packed one in milliseconds at load").
//
// Values: decomposeBlock (kernels/block_formats.h), the same decomposed form the compiler's plane
// transforms write into an expanded artifact (tests check the two byte for byte). Addressing: the
// stride tables of the planes (kernels/stride_table.h); the 4-bit kPacked plane in packedOffset's
// nibble order with stored = q − q_offset.
//
// Compile-time constants (-D):
//   EXPAND_TYPE              source GgmlType id (a quantized type)
//   EXPAND_ROWS              rows of the tensor
//   EXPAND_BLOCKS            blocks per row (cols / block size)
//   EXPAND_SRC_PITCH         kBlocks row_pitch; EXPAND_SRC_GROUP_PITCH its group_pitch (bytes per block slot)
//   EXPAND_HAS_I8            1 when the tensor has kI8 and kScale planes
//   EXPAND_I8_PITCH          kI8 row_pitch
//   EXPAND_S_PITCH           kScale row_pitch
//   EXPAND_HAS_MIN, EXPAND_M_PITCH       kMin plane
//   EXPAND_HAS_PACKED, EXPAND_P_PITCH, EXPAND_Q_OFFSET   4-bit kPacked plane
//   EXPAND_HAS_F16, EXPAND_F_PITCH        kF16 plane (binary16 weights)
// Launch ABI:  minfer_expand_blocks(const uint8_t* blocks, int8_t* q, float* scale, float* min, uint8_t* packed,
//                                   uint16_t* f16)
//   q / scale / min / packed / f16 null when the tensor has no such plane (Hopper plans: Q4_K and Q6_K
//   derive kF16 only). Padding bytes of the derived planes are not
//   written: the runtime zeroes the planes before the launch.
// Launch shape: expandBlocksLaunchRule(): one thread per block, kExpandThreads per CUDA block.
// Cost: one read of the kBlocks plane, one write of each derived plane (memory-bound; a 7B's planes
// take milliseconds on an H200).
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kExpandThreads = 128;

// Grid over rows × blocks_per_row blocks (the product is < 2^32 for any plane the planner accepts
// with rows and cols below 2^31; the compiler checks it).
MINFER_HD LaunchRule expandBlocksLaunchRule(unsigned long long total_blocks) {
  LaunchRule r;
  r.grid[0] = fixedExtent(static_cast<unsigned>((total_blocks + kExpandThreads - 1) / kExpandThreads));
  r.block.x = kExpandThreads;
  return r;
}

// Where the derived planes of one tensor are and how their rows are laid out.
struct ExpandTargets {
  int8_t* q = nullptr;  // null: no kI8 plane (then no kScale plane either)
  uint64_t q_pitch = 0;
  float* scale = nullptr;
  uint64_t s_pitch = 0;
  float* min = nullptr;  // null: no kMin plane
  uint64_t m_pitch = 0;
  uint8_t* packed = nullptr;  // null: no kPacked plane (4-bit)
  uint64_t p_pitch = 0;
  int q_offset = 0;
  uint16_t* f16 = nullptr;  // null: no kF16 plane
  uint64_t f_pitch = 0;
};

// Expands block `b` of row `r` (its bytes at `block`) of a tensor of type `t` into the targets.
// Block size and group size are the type's (ggmlTypeTraits, groupSize).
MINFER_HD void expandBlock(GgmlType t, const uint8_t* block, uint64_t r, uint64_t b, const ExpandTargets& x) {
  alignas(16) int8_t q[kQK_K];
  float scale[kQK_K / 16], min[kQK_K / 16];
  decomposeBlock(t, block, q, scale, min);
  const int bs = static_cast<int>(ggmlTypeTraits(t).block_size), gs = groupSize(t);
  if (x.q) {
    int8_t* qd = x.q + r * x.q_pitch + b * bs;
#if defined(__CUDA_ARCH__)
    // 16-byte stores: kI8 rows start 16-byte aligned (kPlaneRowAlign) and every block size is a multiple of 16.
    for (int j = 0; j < bs; j += 16) *reinterpret_cast<uint4*>(qd + j) = *reinterpret_cast<const uint4*>(q + j);
#else
    for (int j = 0; j < bs; ++j) qd[j] = q[j];
#endif
  }
  if (x.scale) {
    float* sd = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(x.scale) + r * x.s_pitch) + b * (bs / gs);
    for (int g = 0; g < bs / gs; ++g) sd[g] = scale[g];
  }
  if (x.min) {
    float* md = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(x.min) + r * x.m_pitch) + b * (bs / gs);
    for (int g = 0; g < bs / gs; ++g) md[g] = min[g];
  }
  if (x.packed) {  // runs of 32 weights: byte i = (q_i − off) | (q_{i+16} − off) << 4
    uint8_t* pd = x.packed + r * x.p_pitch + b * (bs / 2);
    for (int run = 0; run < bs / 32; ++run)
      for (int i = 0; i < 16; ++i) {
        const int lo = q[32 * run + i] - x.q_offset, hi = q[32 * run + i + 16] - x.q_offset;
        pd[16 * run + i] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      }
  }
  if (x.f16) {
    uint16_t* fd = reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(x.f16) + r * x.f_pitch) + b * bs;
    const bool has_min = hasMin(t);
    auto w = [&](int j) { return f16Weight(scale[j / gs], q[j], has_min ? min[j / gs] : 0.0f, has_min); };
#if defined(__CUDA_ARCH__)
    // 16-byte stores (kF16 rows start 16-byte aligned; blocks are 32 or 256 weights): 2-byte stores made the
    // expansion ~6x slower (0.125 s for a 7B's 14 GB).
    for (int j = 0; j < bs; j += 8) {
      uint4 v;
      v.x = w(j) | static_cast<uint32_t>(w(j + 1)) << 16;
      v.y = w(j + 2) | static_cast<uint32_t>(w(j + 3)) << 16;
      v.z = w(j + 4) | static_cast<uint32_t>(w(j + 5)) << 16;
      v.w = w(j + 6) | static_cast<uint32_t>(w(j + 7)) << 16;
      *reinterpret_cast<uint4*>(fd + j) = v;
    }
#else
    for (int j = 0; j < bs; ++j) fd[j] = w(j);
#endif
  }
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(EXPAND_TYPE)
extern "C" __global__ void __launch_bounds__(minfer::kern::kExpandThreads)
    minfer_expand_blocks(const uint8_t* __restrict__ blocks, int8_t* __restrict__ q, float* __restrict__ scale,
                         float* __restrict__ min, uint8_t* __restrict__ packed, uint16_t* __restrict__ f16) {
  minfer::kern::overlapPrologue();
  using namespace minfer;
  using namespace minfer::kern;
  const uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<uint64_t>(EXPAND_ROWS) * EXPAND_BLOCKS) return;
  const uint64_t r = i / EXPAND_BLOCKS, b = i % EXPAND_BLOCKS;
  ExpandTargets x;
#if EXPAND_HAS_I8
  x.q = q;
  x.q_pitch = EXPAND_I8_PITCH;
  x.scale = scale;
  x.s_pitch = EXPAND_S_PITCH;
#endif
#if EXPAND_HAS_MIN
  x.min = min;
  x.m_pitch = EXPAND_M_PITCH;
#endif
#if EXPAND_HAS_PACKED
  x.packed = packed;
  x.p_pitch = EXPAND_P_PITCH;
  x.q_offset = EXPAND_Q_OFFSET;
#endif
#if EXPAND_HAS_F16
  x.f16 = f16;
  x.f_pitch = EXPAND_F_PITCH;
#endif
  expandBlock(static_cast<GgmlType>(EXPAND_TYPE), blocks + r * EXPAND_SRC_PITCH + b * EXPAND_SRC_GROUP_PITCH, r, b, x);
}
#endif
