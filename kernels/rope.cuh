// Rotary position embedding (OpKind Rope; Su et al. 2021, "RoFormer"), in place on q and k.
//
// For token t at position p = pos0 + t and i < n_rot/2:  θ_i = (p·freq_scale)·base^(−2i/n_rot) / ff_i,
// in double precision (as the CPU reference cpu::rope, same operation order), cos/sin rounded to f32;
// ff_i = freq_factors[i] with ROPE_FREQ_FACTORS = 1 (llama.cpp's ggml_rope_ext freq_factors: the
// rope_freqs.weight of Llama 3.1+, the same n_rot/2 values for q and k), else 1; the pair (a, b) becomes
// (a·cosθ − b·sinθ, a·sinθ + b·cosθ). Norm style rotates (2i, 2i+1), NeoX style (i, i + n_rot/2);
// elements ≥ n_rot of a head are untouched. Compiled with --fmad=false (matches the CPU rounding).
//
// Compile-time constants: ROPE_NHEAD, ROPE_NHEAD_KV, ROPE_HEAD_DIM, ROPE_NROT (even, ≤ HEAD_DIM),
//   ROPE_NEOX (0 norm, 1 neox), ROPE_BASE, ROPE_SCALE (float literals), ROPE_FREQ_FACTORS (0 or 1).
// Launch ABI:  minfer_rope(float* q, float* k, const float* freq_factors, const int* pos, int n_tokens)
//   q: n_tokens × NHEAD·HEAD_DIM, k: n_tokens × NHEAD_KV·HEAD_DIM (f32, rotated in place);
//   freq_factors: NROT/2 f32 values > 0 with ROPE_FREQ_FACTORS = 1, else null (not read); pos[0] = pos0.
// Launch shape: ropeLaunch(): grid (n_tokens, head groups), 64 threads over the pairs; each thread
// computes cos/sin of its pairs once and rotates them in every head of the block's group (θ does not
// depend on the head). Groups of 8 heads for batches of ≥ 64 tokens (fewer transcendentals), of one
// head below (more blocks for the latency-bound decode step); the kernel reads the group size from
// gridDim.y.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kRopeThreads = 64;
constexpr unsigned kRopeHeadsPerBlock = 8;  // head group size for batches of ≥ kRopeGroupMinTokens
constexpr unsigned kRopeGroupMinTokens = 64;

MINFER_HD LaunchRule ropeLaunchRule(unsigned n_head, unsigned n_head_kv) {
  LaunchRule r;
  r.grid[0] = r.grid_large[0] = perToken(1);
  r.grid[1] = fixedExtent(n_head + n_head_kv);
  r.grid_large[1] = fixedExtent(ceilDiv(n_head + n_head_kv, kRopeHeadsPerBlock));
  r.large_from = kRopeGroupMinTokens;
  r.block.x = kRopeThreads;
  return r;
}
MINFER_HD LaunchShape ropeLaunch(unsigned n_tokens, unsigned n_head, unsigned n_head_kv) {
  return ropeLaunchRule(n_head, n_head_kv).at(n_tokens);
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(ROPE_NROT)
extern "C" __global__ void __launch_bounds__(minfer::kern::kRopeThreads)
    minfer_rope(float* q, float* k, const float* __restrict__ freq_factors, const int* __restrict__ pos,
                int n_tokens) {
  static_assert(ROPE_NROT % 2 == 0 && ROPE_NROT <= ROPE_HEAD_DIM, "ROPE_NROT must be even and <= ROPE_HEAD_DIM");
  constexpr int kHeads = ROPE_NHEAD + ROPE_NHEAD_KV;
  const int per_block = (kHeads + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y);
  const int t = blockIdx.x, h0 = blockIdx.y * per_block;
  if (t >= n_tokens) return;
  const double p = static_cast<double>(pos[0] + t) * static_cast<double>(ROPE_SCALE);
  for (int i = threadIdx.x; i < ROPE_NROT / 2; i += blockDim.x) {
    double theta = p * pow(static_cast<double>(ROPE_BASE), -2.0 * i / ROPE_NROT);
#if ROPE_FREQ_FACTORS
    theta /= static_cast<double>(freq_factors[i]);
#else
    (void)freq_factors;
#endif
    const float c = static_cast<float>(cos(theta)), s = static_cast<float>(sin(theta));
    const int i0 = ROPE_NEOX ? i : 2 * i;
    const int i1 = ROPE_NEOX ? i + ROPE_NROT / 2 : 2 * i + 1;
    for (int hh = 0; hh < per_block; ++hh) {
      const int h = h0 + hh;
      if (h >= kHeads) break;
      float* x = h < ROPE_NHEAD ? q + (static_cast<uint64_t>(t) * ROPE_NHEAD + h) * ROPE_HEAD_DIM
                                : k + (static_cast<uint64_t>(t) * ROPE_NHEAD_KV + (h - ROPE_NHEAD)) * ROPE_HEAD_DIM;
      const float a = x[i0], b = x[i1];
      x[i0] = a * c - b * s;
      x[i1] = a * s + b * c;
    }
  }
}
#endif
