// Rotary position embedding (OpKind Rope; Su et al. 2021, "RoFormer"), in place on q and k.
//
// For token t at position p = pos0 + t and i < n_rot/2:  θ_i = (p·freq_scale)·base^(−2i/n_rot) / ff_i,
// in double precision (as the CPU reference cpu::rope, same operation order), cos/sin rounded to f32;
// ff_i = freq_factors[i] with ROPE_FREQ_FACTORS = 1 (llama.cpp's ggml_rope_ext freq_factors: the
// rope_freqs.weight of Llama 3.1+, the same n_rot/2 values for q and k), else 1; the pair (a, b) becomes
// (a·cosθ − b·sinθ, a·sinθ + b·cosθ). Norm style rotates (2i, 2i+1), NeoX style (i, i + n_rot/2);
// elements ≥ n_rot of a head are untouched. Compiled with --fmad=false (matches the CPU rounding).
//
// YaRN (Peng et al. 2023; llama.cpp's ggml_rope_ext with ext_factor ≠ 0, ggml-cpu rope_yarn): with
// ROPE_YARN = 1, θ_i mixes extrapolation and interpolation per pair: θ_extrap = p·base^(−2i/n_rot) / ff_i
// (p unscaled), θ_interp = freq_scale·θ_extrap, θ_i = θ_interp·(1 − γ_i) + θ_extrap·γ_i (double), with
// γ_i = ext_factor·ramp(i), ramp(i) = 1 − clamp((i − lo) / max(0.001, hi − lo), 0, 1) (float, as ggml):
// pairs below lo keep their original rotation, pairs above hi are interpolated. cos and sin are then
// multiplied by ROPE_MSCALE (absent: 1), which is llama.cpp's attn_factor, times 1 + 0.1·ln(1/freq_scale)
// under YaRN. lo, hi and the scale come from ropeYarn() on the host, for the kernel and the CPU alike.
//
// Compile-time constants: ROPE_NHEAD, ROPE_NHEAD_KV, ROPE_HEAD_DIM, ROPE_NROT (even, ≤ HEAD_DIM),
//   ROPE_NEOX (0 norm, 1 neox), ROPE_BASE, ROPE_SCALE (float literals), ROPE_FREQ_FACTORS (0 or 1);
//   optional: ROPE_YARN (0 or 1) with ROPE_EXT_FACTOR, ROPE_CORR_LO, ROPE_CORR_HI, and ROPE_MSCALE
//   (float literals; absent: no YaRN, scale 1); ROPE_Q_PITCH, ROPE_K_PITCH (floats between rows of q and
//   k; absent: NHEAD·HEAD_DIM and NHEAD_KV·HEAD_DIM): q and k as column views of a wider buffer
//   (format 1.4, phi3's fused q|k|v rows; the pointers address row 0's first q / k element).
// Launch ABI:  minfer_rope(float* q, float* k, const float* freq_factors, const int* pos, int n_tokens)
//   q: n_tokens × NHEAD·HEAD_DIM, k: n_tokens × NHEAD_KV·HEAD_DIM (f32, rotated in place);
//   freq_factors: NROT/2 f32 values > 0 with ROPE_FREQ_FACTORS = 1, else null (not read); pos[0] = pos0.
// Launch shape: ropeLaunch(): grid (n_tokens, head groups), 64 threads over the pairs; each thread
// computes cos/sin of its pairs once and rotates them in every head of the block's group (θ does not
// depend on the head). Groups of 8 heads for batches of ≥ 64 tokens (fewer transcendentals), of one
// head below (more blocks for the latency-bound decode step); the kernel reads the group size from
// gridDim.y.
//
// head_norm_rope (ROPE_NORM_EPS defined; schema Step.fused: the decode and prefill plans' HeadRmsNorm of q,
// HeadRmsNorm of k and the Rope of the two, one launch, compiler/codegen/ops/fusion.cpp): each head of q
// and k first normalized as rms_norm.cuh's minfer_head_rms_norm (q heads with wq, k heads with wk, epsilon
// ROPE_NORM_EPS; headRmsInv / headRmsScale, the same bits), then rotated as minfer_rope (ropeCosSin /
// ropeRotate from the normalized values, the same bits); compiled with --fmad=false like minfer_rope. With
// it, minfer_rope is not compiled (one entry per module). Whole buffers (HeadRmsNorm takes no column views).
//   Compile-time constants: minfer_rope's (ROPE_NHEAD, _NHEAD_KV, _HEAD_DIM, the rotation constants), no
//   pitches, ROPE_NORM_EPS (float literal), and ROPE_ROW_POSITIONS (0 or 1, absent 0): 1 rotates row t at
//   pos[t] (a batch session's paged launch, paged_attention.cuh minfer_rope_paged's positions), 0 at pos[0] + t.
//   Launch ABI:  minfer_head_norm_rope(float* q, float* k, const float* wq, const float* wk,
//                                      const float* freq_factors, const int* pos, int n_tokens)
//                wq, wk: HEAD_DIM f32 each (the two HeadRmsNorm weights); the rest as minfer_rope.
//   Launch shape: headNormRopeLaunch(): grid (n_tokens, ⌈(NHEAD + NHEAD_KV) / 4⌉), 4 warps, one per (token,
//                head); the block's threads first compute the NROT/2 cos/sin pairs of its token once into shared
//                memory (they do not depend on the head), each warp normalizes its head into shared memory,
//                then rotates it from there into place.
#pragma once

#include "kernels/common.cuh"
#include "kernels/rms_norm.cuh"

#if !defined(MINFER_DEVICE_CODE)
#include <cmath>
#endif

namespace minfer::kern {

// The per-step YaRN constants (see above). Defaults: no YaRN, scale 1 (plain RoPE).
struct RopeYarn {
  float ext_factor = 0;        // γ's weight: 0 = no YaRN mix
  float corr_lo = 0, corr_hi = 0;  // the ramp's ends, in pairs
  float mscale = 1;            // multiplies cos and sin
};

// ramp(i) of YaRN: 1 for pairs i ≤ lo, 0 for i ≥ hi, linear between (llama.cpp's rope_yarn_ramp).
MINFER_HD float ropeYarnRamp(float lo, float hi, int i) {
  const float d = hi - lo > 0.001f ? hi - lo : 0.001f;
  const float y = (static_cast<float>(i) - lo) / d;
  return 1.0f - (y < 0.0f ? 0.0f : y > 1.0f ? 1.0f : y);
}

#if !defined(MINFER_DEVICE_CODE)
// The constants of a Rope step from llama.cpp's ggml_rope_ext parameters, in float as ggml computes them
// (ggml_rope_yarn_corr_dims; the mscale of rope_yarn): the pair whose wavelength fits β times into
// n_ctx_orig positions is corr(β) = n_rot·ln(n_ctx_orig / (2π·β)) / (2·ln base); lo = max(0, ⌊corr(beta_fast)⌋),
// hi = min(n_rot − 1, ⌈corr(beta_slow)⌉); mscale = attn_factor, times 1 + 0.1·ln(1/freq_scale) when
// ext_factor ≠ 0. The ramp ends are only computed when ext_factor ≠ 0 (they are unused otherwise).
inline RopeYarn ropeYarn(int n_rot, float freq_base, float freq_scale, float ext_factor, float attn_factor,
                         float beta_fast, float beta_slow, unsigned n_ctx_orig) {
  RopeYarn y;
  y.ext_factor = ext_factor;
  y.mscale = attn_factor;
  if (ext_factor == 0.0f) return y;
  const float pi = 3.14159265358979323846f;
  auto corr = [&](float beta) {
    return static_cast<float>(n_rot) * std::log(static_cast<float>(n_ctx_orig) / (beta * 2.0f * pi)) /
           (2.0f * std::log(freq_base));
  };
  y.corr_lo = std::fmax(0.0f, std::floor(corr(beta_fast)));
  y.corr_hi = std::fmin(static_cast<float>(n_rot - 1), std::ceil(corr(beta_slow)));
  y.mscale *= 1.0f + 0.1f * std::log(1.0f / freq_scale);
  return y;
}
#endif

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

constexpr unsigned kHeadNormRopeWarps = 4;  // heads per block of minfer_head_norm_rope

MINFER_HD LaunchRule headNormRopeLaunchRule(unsigned n_head, unsigned n_head_kv) {
  LaunchRule r;
  r.grid[0] = perToken(1);
  r.grid[1] = fixedExtent(ceilDiv(n_head + n_head_kv, kHeadNormRopeWarps));
  r.block.x = 32 * kHeadNormRopeWarps;
  return r;
}
MINFER_HD LaunchShape headNormRopeLaunch(unsigned n_tokens, unsigned n_head, unsigned n_head_kv) {
  return headNormRopeLaunchRule(n_head, n_head_kv).at(n_tokens);
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(ROPE_NROT)
#ifndef ROPE_YARN
#define ROPE_YARN 0
#endif
#ifndef ROPE_MSCALE
#define ROPE_MSCALE 1.0f
#endif
#ifndef ROPE_Q_PITCH
#define ROPE_Q_PITCH (ROPE_NHEAD * ROPE_HEAD_DIM)
#endif
#ifndef ROPE_K_PITCH
#define ROPE_K_PITCH (ROPE_NHEAD_KV * ROPE_HEAD_DIM)
#endif
namespace minfer::kern {
// cos θ_i and sin θ_i of pair i at `position` (the header's definition and operation order, as
// cpu::rope), each times ROPE_MSCALE; freq_factors as minfer_rope takes them. Every product and sum is an
// explicitly rounded intrinsic, so the result does not depend on --fmad: the fused QKV GEMV
// (gemv_blocks.cuh GEMVB_QKV, compiled with contraction like the GEMV it fuses) gets minfer_rope's values.
__device__ __forceinline__ void ropeCosSin(int i, int position, const float* freq_factors, float& c, float& s) {
#if ROPE_YARN
  const double p = static_cast<double>(position);
#else
  const double p = __dmul_rn(static_cast<double>(position), static_cast<double>(ROPE_SCALE));
#endif
  double theta = __dmul_rn(p, pow(static_cast<double>(ROPE_BASE), -2.0 * i / ROPE_NROT));
#if ROPE_FREQ_FACTORS
  theta = __ddiv_rn(theta, static_cast<double>(freq_factors[i]));
#else
  (void)freq_factors;
#endif
#if ROPE_YARN  // same operations as cpu::rope
  const double mix = static_cast<double>(__fmul_rn(ropeYarnRamp(ROPE_CORR_LO, ROPE_CORR_HI, i), ROPE_EXT_FACTOR));
  theta = __dadd_rn(__dmul_rn(__dmul_rn(theta, static_cast<double>(ROPE_SCALE)), __dsub_rn(1.0, mix)),
                    __dmul_rn(theta, mix));
#endif
  c = __fmul_rn(static_cast<float>(cos(theta)), ROPE_MSCALE);
  s = __fmul_rn(static_cast<float>(sin(theta)), ROPE_MSCALE);
}
// The rotation of the pair (a, b): (a·c − b·s, a·s + b·c), each product and sum rounded (no contraction).
__device__ __forceinline__ void ropeRotate(float a, float b, float c, float s, float& x, float& y) {
  x = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  y = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}
}  // namespace minfer::kern

#if defined(ROPE_NHEAD) && !defined(ROPE_NORM_EPS)  // the rotation kernel; without it only ropeCosSin / ropeRotate (gemv_blocks.cuh GEMVB_QKV)
extern "C" __global__ void __launch_bounds__(minfer::kern::kRopeThreads)
    minfer_rope(float* q, float* k, const float* __restrict__ freq_factors, const int* __restrict__ pos,
                int n_tokens) {
  minfer::kern::overlapPrologue();
  static_assert(ROPE_NROT % 2 == 0 && ROPE_NROT <= ROPE_HEAD_DIM, "ROPE_NROT must be even and <= ROPE_HEAD_DIM");
  constexpr int kHeads = ROPE_NHEAD + ROPE_NHEAD_KV;
  const int per_block = (kHeads + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y);
  const int t = blockIdx.x, h0 = blockIdx.y * per_block;
  if (t >= n_tokens) return;
  for (int i = threadIdx.x; i < ROPE_NROT / 2; i += blockDim.x) {
    float c, s;
    minfer::kern::ropeCosSin(i, pos[0] + t, freq_factors, c, s);
    const int i0 = ROPE_NEOX ? i : 2 * i;
    const int i1 = ROPE_NEOX ? i + ROPE_NROT / 2 : 2 * i + 1;
    for (int hh = 0; hh < per_block; ++hh) {
      const int h = h0 + hh;
      if (h >= kHeads) break;
      float* x = h < ROPE_NHEAD ? q + static_cast<uint64_t>(t) * ROPE_Q_PITCH + h * ROPE_HEAD_DIM
                                : k + static_cast<uint64_t>(t) * ROPE_K_PITCH + (h - ROPE_NHEAD) * ROPE_HEAD_DIM;
      minfer::kern::ropeRotate(x[i0], x[i1], c, s, x[i0], x[i1]);
    }
  }
}
#endif  // ROPE_NHEAD

#if defined(ROPE_NHEAD) && defined(ROPE_NORM_EPS)  // the HeadRmsNorm q, HeadRmsNorm k, Rope launch (see above)
#ifndef ROPE_ROW_POSITIONS
#define ROPE_ROW_POSITIONS 0
#endif
#ifndef ROPE_KV_STORE
#define ROPE_KV_STORE 0
#endif
static_assert(!(ROPE_KV_STORE && ROPE_ROW_POSITIONS), "the KV store writes a contiguous cache at pos[0] + t");
namespace minfer::kern::hnr {
// The body of minfer_head_norm_rope and minfer_head_norm_rope_kv: with kStore, the warp of k head j also writes
// k head j (as left in k) and v head j of token t as f16 into the caches' row of position pos[0] + t (slot
// p % ROPE_KV_RING with a ring), as attention.cuh's minfer_kv_store writes them (f2h of the same floats).
template <bool kStore>
__device__ __forceinline__ void headNormRope(float* q, float* k, const float* v, const float* wq, const float* wk,
                                             const float* freq_factors, uint16_t* kc, uint16_t* vc, const int* pos,
                                             int n_tokens) {
  static_assert(ROPE_NROT % 2 == 0 && ROPE_NROT <= ROPE_HEAD_DIM, "ROPE_NROT must be even and <= ROPE_HEAD_DIM");
  constexpr int kHeads = ROPE_NHEAD + ROPE_NHEAD_KV, kPer = (ROPE_HEAD_DIM + 31) / 32;
  constexpr int kKvW = ROPE_NHEAD_KV * ROPE_HEAD_DIM;
  const int t = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int h = blockIdx.y * kHeadNormRopeWarps + warp;  // this warp's head: q heads, then k heads
  const bool is_q = h < ROPE_NHEAD;
  // The norm weight (a plane no kernel writes) is read before waiting for the previous kernel.
  const float* w = is_q ? wq : wk;
  float wv[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) wv[j] = h < kHeads && lane + 32 * j < ROPE_HEAD_DIM ? w[lane + 32 * j] : 0.0f;
  // So are the positions (the host's, common.cuh overlapPrologue) and the frequency factors: the cos/sin pairs are
  // computed while the previous kernel still runs. (n_tokens is a launch argument.)
  if (t >= n_tokens) return;  // whole blocks (the grid's x is the token)
  __shared__ float cs[ROPE_NROT / 2], sn[ROPE_NROT / 2];
  __shared__ float xs[kHeadNormRopeWarps][ROPE_HEAD_DIM];
  const int position = ROPE_ROW_POSITIONS ? pos[t] : pos[0] + t;
  for (int i = threadIdx.x; i < ROPE_NROT / 2; i += blockDim.x) ropeCosSin(i, position, freq_factors, cs[i], sn[i]);
  overlapPrologue();
  float* xh = nullptr;
  if (h < kHeads) {
    xh = is_q ? q + static_cast<uint64_t>(t) * (ROPE_NHEAD * ROPE_HEAD_DIM) + h * ROPE_HEAD_DIM
              : k + static_cast<uint64_t>(t) * kKvW + (h - ROPE_NHEAD) * ROPE_HEAD_DIM;
    const float inv = headRmsInv(xh, lane, ROPE_HEAD_DIM, ROPE_NORM_EPS);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = lane + 32 * j;
      if (i < ROPE_HEAD_DIM) xs[warp][i] = headRmsScale(xh[i], inv, wv[j]);
    }
  }
  __syncthreads();  // cos/sin of every pair, and each warp's normalized head
  if (h >= kHeads) return;
  const float* y = xs[warp];
  // k head j's row of the caches (kStore): position pos[0] + t, or its slot in a ring.
  uint16_t *kr = nullptr, *vr = nullptr;
  if (kStore && !is_q) {
#ifdef ROPE_KV_RING
    const uint64_t row = static_cast<uint64_t>(position % ROPE_KV_RING) * kKvW + (h - ROPE_NHEAD) * ROPE_HEAD_DIM;
#else
    const uint64_t row = static_cast<uint64_t>(position) * kKvW + (h - ROPE_NHEAD) * ROPE_HEAD_DIM;
#endif
    kr = kc + row;
    vr = vc + row;
  }
  for (int i = lane; i < ROPE_NROT / 2; i += 32) {
    const int i0 = ROPE_NEOX ? i : 2 * i;
    const int i1 = ROPE_NEOX ? i + ROPE_NROT / 2 : 2 * i + 1;
    float a, b;
    ropeRotate(y[i0], y[i1], cs[i], sn[i], a, b);
    xh[i0] = a;
    xh[i1] = b;
    if (kr) {
      kr[i0] = f2h(a);
      kr[i1] = f2h(b);
    }
  }
  for (int i = ROPE_NROT + lane; i < ROPE_HEAD_DIM; i += 32) {  // not rotated: the norm's value
    xh[i] = y[i];
    if (kr) kr[i] = f2h(y[i]);
  }
  if (!vr) return;
  const float* vh = v + static_cast<uint64_t>(t) * kKvW + (h - ROPE_NHEAD) * ROPE_HEAD_DIM;
  for (int i = lane; i < ROPE_HEAD_DIM; i += 32) vr[i] = f2h(vh[i]);
}
}  // namespace minfer::kern::hnr

#if ROPE_KV_STORE
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kHeadNormRopeWarps)
    minfer_head_norm_rope_kv(float* q, float* k, const float* __restrict__ v, const float* __restrict__ wq,
                             const float* __restrict__ wk, const float* __restrict__ freq_factors,
                             uint16_t* __restrict__ kc, uint16_t* __restrict__ vc, const int* __restrict__ pos,
                             int n_tokens) {
  minfer::kern::hnr::headNormRope<true>(q, k, v, wq, wk, freq_factors, kc, vc, pos, n_tokens);
}
#else
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kHeadNormRopeWarps)
    minfer_head_norm_rope(float* q, float* k, const float* __restrict__ wq, const float* __restrict__ wk,
                          const float* __restrict__ freq_factors, const int* __restrict__ pos, int n_tokens) {
  minfer::kern::hnr::headNormRope<false>(q, k, nullptr, wq, wk, freq_factors, nullptr, nullptr, pos, n_tokens);
}
#endif
#endif  // ROPE_NORM_EPS
#endif
