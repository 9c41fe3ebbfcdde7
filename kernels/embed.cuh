// Embedding gather (OpKind Embed): out[t] = row ids[t] of token_embd, dequantized to f32.
//
// Formats: the kBlocks plane of a quantized table (each thread dequantizes whole GGUF blocks with the
// reference dequantizeBlock, or an eighth of a Q4_K / Q5_K / Q6_K block with dequantizeBlockPart, so the result is
// bit-identical to the CPU backend: compiled with --fmad=false) or a dense F32 / F16 / BF16 plane (exact widening).
//
// Compile-time constants (-D):
//   EMBED_PLANE        PlaneKind of the plane read: 7 kBlocks, 4 kF32, 5 kF16, 6 kBF16
//   EMBED_TYPE         source GgmlType id (kBlocks: decodes with it)
//   EMBED_COLS         n_embd (= table cols = output row width)
//   EMBED_ROW_PITCH    bytes between table rows (stride table row_pitch)
//   EMBED_GROUP_SIZE   kBlocks: weights per block; EMBED_GROUP_PITCH: bytes per block
// Launch ABI:  minfer_embed(const int32_t* ids, const uint8_t* table, float* out, int n_tokens)
//   ids: n_tokens token ids, each in [0, rows) (the session validates them); out: n_tokens × COLS f32.
// Launch shape: embedLaunch(): one block of 128 threads per token. Cost: one read of each gathered row.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kEmbedThreads = 128;

MINFER_HD LaunchRule embedLaunchRule() {
  LaunchRule r;
  r.grid[0] = perToken(1);
  r.block.x = kEmbedThreads;
  return r;
}
MINFER_HD LaunchShape embedLaunch(unsigned n_tokens) { return embedLaunchRule().at(n_tokens); }

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(EMBED_COLS)
extern "C" __global__ void __launch_bounds__(minfer::kern::kEmbedThreads)
    minfer_embed(const int32_t* __restrict__ ids, const uint8_t* __restrict__ table, float* __restrict__ out,
                 int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer;
  const int t = blockIdx.x;
  if (t >= n_tokens) return;
  const uint8_t* row = table + static_cast<uint64_t>(ids[t]) * EMBED_ROW_PITCH;
  float* o = out + static_cast<uint64_t>(t) * EMBED_COLS;
#if EMBED_PLANE == 7 && (EMBED_TYPE == 12 || EMBED_TYPE == 13 || EMBED_TYPE == 14)
  // Q4_K, Q5_K, Q6_K: eight threads per block, each an eighth of dequantizeBlock's loop (dequantizeBlockPart: the
  // same values; one thread per 256-weight block took 7.3 µs for a 3584-wide row, the decode step's first launch).
  constexpr int kParts = 8;
  for (int i = threadIdx.x; i < EMBED_COLS / EMBED_GROUP_SIZE * kParts; i += blockDim.x)
    dequantizeBlockPart(static_cast<GgmlType>(EMBED_TYPE), row + i / kParts * EMBED_GROUP_PITCH, i % kParts,
                        o + i / kParts * EMBED_GROUP_SIZE);
#elif EMBED_PLANE == 7
  for (int b = threadIdx.x; b < EMBED_COLS / EMBED_GROUP_SIZE; b += blockDim.x)
    dequantizeBlock(static_cast<GgmlType>(EMBED_TYPE), row + b * EMBED_GROUP_PITCH, o + b * EMBED_GROUP_SIZE);
#elif EMBED_PLANE == 4
  for (int c = threadIdx.x; c < EMBED_COLS; c += blockDim.x) o[c] = reinterpret_cast<const float*>(row)[c];
#elif EMBED_PLANE == 5
  for (int c = threadIdx.x; c < EMBED_COLS; c += blockDim.x) o[c] = kern::h2f(reinterpret_cast<const uint16_t*>(row)[c]);
#elif EMBED_PLANE == 6
  for (int c = threadIdx.x; c < EMBED_COLS; c += blockDim.x) o[c] = kern::bf2f(reinterpret_cast<const uint16_t*>(row)[c]);
#else
#error "EMBED_PLANE must be 7 (kBlocks), 4 (kF32), 5 (kF16) or 6 (kBF16)"
#endif
}
#endif
