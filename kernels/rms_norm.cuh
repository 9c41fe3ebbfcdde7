// RMSNorm (OpKind RmsNorm) and per-head RMSNorm (OpKind HeadRmsNorm, qwen3 q/k norm).
//
//   rms_norm:       out[t] = x[t] / sqrt(mean(x[t]²) + eps) ⊙ w          (Zhang & Sennrich 2019)
//   head_rms_norm:  the same on each head_dim slice of each row, in place, with one weight vector w.
// Sums of squares in f32 (tree reduction; the CPU sums sequentially, tolerance 2e-6 relative).
//
// rms_norm, compile-time constants: RMS_WIDTH (row width), RMS_EPS (float literal), RMS_Q8 (optional).
//   Launch ABI:   minfer_rms_norm(const float* x, const float* w, float* out, int n_tokens)
//                 x, out: n_tokens × RMS_WIDTH (out may equal x); w: RMS_WIDTH f32.
//   With RMS_Q8 = 1 (the QuantizeAct step that follows, fused into this launch; RMS_WIDTH % 32 == 0):
//                 minfer_rms_norm(const float* x, const float* w, float* out, int8_t* qs, Q8Meta* meta,
//                                 int n_tokens)
//                 also writes out's q8 form (quantize_act.cuh's definition, bit for bit: each warp holds
//                 one block of 32 consecutive values per pass) into the q8 buffer's qs / meta parts.
//   With RMS_ADD = 1 (the residual Add before it fused into this launch): the row normalized is
//   sum = a + b, written to `sum` too (may alias a or b):
//                 minfer_rms_norm(const float* a, const float* b, float* sum, const float* w, float* out,
//                                 [int8_t* qs, Q8Meta* meta,] int n_tokens)
//   Launch shape: rmsNormLaunch(): one block of 1024 threads per row; rows up to 8192 values are read once
//                 (held in registers), longer ones twice; the weight is read before the previous kernel ends.
// head_rms_norm, compile-time constants: HRMS_NHEAD, HRMS_HEAD_DIM, HRMS_EPS.
//   Launch ABI:   minfer_head_rms_norm(float* x, const float* w, int n_tokens)
//                 x: n_tokens × (NHEAD·HEAD_DIM), normalized in place; w: HEAD_DIM f32.
//   Launch shape: headRmsNormLaunch(): one warp per (token, head), 4 warps per block.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kRmsThreads = 1024;
constexpr unsigned kHeadRmsWarps = 4;

MINFER_HD LaunchRule rmsNormLaunchRule() {
  LaunchRule r;
  r.grid[0] = perToken(1);
  r.block.x = kRmsThreads;
  return r;
}
MINFER_HD LaunchShape rmsNormLaunch(unsigned n_tokens) { return rmsNormLaunchRule().at(n_tokens); }

MINFER_HD LaunchRule headRmsNormLaunchRule(unsigned n_head) {
  LaunchRule r;
  r.grid[0] = perToken(n_head, kHeadRmsWarps);
  r.block.x = 32 * kHeadRmsWarps;
  return r;
}
MINFER_HD LaunchShape headRmsNormLaunch(unsigned n_tokens, unsigned n_head) {
  return headRmsNormLaunchRule(n_head).at(n_tokens);
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(RMS_WIDTH)
#if RMS_Q8
static_assert(RMS_WIDTH % 32 == 0, "the q8 form needs whole blocks of 32");
#endif
namespace minfer::kern::rms {
// Values per thread; rows up to kRmsThreads · 8 values are held in registers between the two passes.
constexpr int kPasses = (RMS_WIDTH + static_cast<int>(kRmsThreads) - 1) / static_cast<int>(kRmsThreads);
constexpr bool kHold = kPasses <= 8;
}  // namespace minfer::kern::rms

extern "C" __global__ void __launch_bounds__(minfer::kern::kRmsThreads)
    minfer_rms_norm(
#if RMS_ADD
        const float* a, const float* b, float* x,  // x = a + b: the row normalized
#else
        const float* x,
#endif
        const float* __restrict__ w, float* out,
#if RMS_Q8
                    int8_t* __restrict__ qs, minfer::kern::Q8Meta* __restrict__ meta,
#endif
                    int n_tokens) {
  using namespace minfer::kern;
  using namespace minfer::kern::rms;
  // The weight (a plane no kernel writes) is read before waiting for the previous kernel.
  float wv[kHold ? kPasses : 1];
  if (kHold)
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int i = threadIdx.x + p * static_cast<int>(kRmsThreads);
      wv[p] = i < RMS_WIDTH ? w[i] : 0.0f;
    }
  overlapPrologue();
  const int t = blockIdx.x;
  if (t >= n_tokens) return;
#if RMS_ADD
  // Each thread adds, writes and later reads back only its own elements (sum may alias a or b).
  const float* ar = a + static_cast<uint64_t>(t) * RMS_WIDTH;
  const float* br = b + static_cast<uint64_t>(t) * RMS_WIDTH;
  float* sr = x + static_cast<uint64_t>(t) * RMS_WIDTH;
#define MINFER_RMS_LOAD(i) (sr[i] = ar[i] + br[i])
#else
#define MINFER_RMS_LOAD(i) xr[i]
#endif
  const float* xr = x + static_cast<uint64_t>(t) * RMS_WIDTH;
  float* yr = out + static_cast<uint64_t>(t) * RMS_WIDTH;
  float xv[kHold ? kPasses : 1];
  float ss = 0.0f;
  if (kHold) {
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int i = threadIdx.x + p * static_cast<int>(kRmsThreads);
      xv[p] = i < RMS_WIDTH ? MINFER_RMS_LOAD(i) : 0.0f;
      ss += xv[p] * xv[p];
    }
  } else {
    for (int i = threadIdx.x; i < RMS_WIDTH; i += kRmsThreads) {
      const float v = MINFER_RMS_LOAD(i);
      ss += v * v;
    }
  }
#undef MINFER_RMS_LOAD
  __shared__ float partial[kRmsThreads / 32];
  ss = warpSum(ss);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < static_cast<int>(kRmsThreads / 32); ++i) total += partial[i];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(RMS_WIDTH) + RMS_EPS);
#if RMS_Q8
  // A warp's 32 values of a pass are one q8 block (passes start at multiples of kRmsThreads; whole warps
  // are in or out of the row since RMS_WIDTH % 32 == 0).
  int8_t* qr = qs + static_cast<uint64_t>(t) * RMS_WIDTH;
  Q8Meta* mr = meta + static_cast<uint64_t>(t) * (RMS_WIDTH / 32);
#endif
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int i = threadIdx.x + p * static_cast<int>(kRmsThreads);
    if (i >= RMS_WIDTH) break;  // whole warps leave together (see above)
    const float y = (kHold ? xv[p] : xr[i]) * inv * (kHold ? wv[p] : w[i]);
    yr[i] = y;
#if RMS_Q8
    quantizeBlock<1>({y}, qr + (i & ~31), mr + i / 32, true);
#endif
  }
}
#endif

#if defined(MINFER_DEVICE_CODE)
namespace minfer::kern {
// One warp's head_rms_norm of one head of `head_dim` values (the formula above): 1/rms of the head at xh, the
// lane's squares summed at lane, lane + 32, …, then the warp's tree. Every operation is an explicitly rounded
// intrinsic, so the value does not depend on --fmad: minfer_head_rms_norm (compiled with contraction) and
// rope.cuh's minfer_head_norm_rope (compiled with --fmad=false, as RoPE is) compute the same bits.
__device__ __forceinline__ float headRmsInv(const float* xh, int lane, int head_dim, float eps) {
  float ss = 0.0f;
  for (int i = lane; i < head_dim; i += 32) ss = __fmaf_rn(xh[i], xh[i], ss);
  ss = warpSum(ss);
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(head_dim)), eps)));
}
// Element x of the head normalized: x·inv·w, rounded after each product.
__device__ __forceinline__ float headRmsScale(float x, float inv, float w) { return __fmul_rn(__fmul_rn(x, inv), w); }
}  // namespace minfer::kern
#endif

#if defined(MINFER_DEVICE_CODE) && defined(HRMS_HEAD_DIM)
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kHeadRmsWarps)
    minfer_head_rms_norm(float* x, const float* __restrict__ w, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  const int item = blockIdx.x * kHeadRmsWarps + threadIdx.x / 32;  // (token, head)
  if (item >= n_tokens * HRMS_NHEAD) return;
  const int lane = threadIdx.x & 31;
  float* xh = x + static_cast<uint64_t>(item) * HRMS_HEAD_DIM;
  const float inv = headRmsInv(xh, lane, HRMS_HEAD_DIM, HRMS_EPS);
  for (int i = lane; i < HRMS_HEAD_DIM; i += 32) xh[i] = headRmsScale(xh[i], inv, w[i]);
}
#endif
