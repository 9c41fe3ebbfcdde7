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

#if defined(MINFER_DEVICE_CODE)
namespace minfer::kern::rms {
// The RMSNorm of one row of kWidth values by the kThreads threads of one block, every thread calling:
//   x = a + b (kAdd; x written to `sum`, which may alias a or b) or x = a;
//   y = x / sqrt(mean(x²) + eps) ⊙ w  (y may alias a, b or sum: a thread reads and writes its own elements)
// and with kQ8 y's q8 form (common.cuh quantizeBlock, quantize_act.cuh's definition, bit for bit).
// Whatever kThreads (a divisor of kRmsThreads), the arithmetic is minfer_rms_norm's, bit for bit: thread t
// plays the kRmsThreads-thread block's threads v = t + kThreads·j, each summing the squares of elements
// v, v + kRmsThreads, … in order, then warpSum per (virtual) warp and the kRmsThreads / 32 warp sums in
// order; a warp's 32 values of a pass are one q8 block (kWidth % 32 == 0 with kQ8). Rows of at most
// kHoldPasses values per thread are held in registers between the two passes; longer ones are read again
// (from where this thread wrote them). a and b are read through L2 (__ldcg): b may be another block's
// output of the same grid (gemv_blocks.cuh GEMVB_NORM).
template <int kThreads, int kWidth, int kHoldPasses>
struct RowNorm {
  static constexpr int kV = static_cast<int>(kRmsThreads);  // the threads whose arithmetic is reproduced
  static constexpr int kJ = kV / kThreads;                   // virtual threads per thread
  static constexpr int kPasses = (kWidth + kV - 1) / kV;     // elements per virtual thread (at most)
  static constexpr bool kHold = kJ * kPasses <= kHoldPasses;
  static_assert(kThreads % 32 == 0 && kV % kThreads == 0, "whole warps, a divisor of kRmsThreads");
  float wv[kHold ? kJ * kPasses : 1];

  __device__ static int element(int j, int p) { return static_cast<int>(threadIdx.x) + kThreads * j + kV * p; }

  // The weight into registers (held rows only), e.g. before waiting for the previous kernel.
  __device__ __forceinline__ void loadWeight(const float* __restrict__ w) {
    if (kHold)
#pragma unroll
      for (int j = 0; j < kJ; ++j)
#pragma unroll
        for (int p = 0; p < kPasses; ++p) wv[j * kPasses + p] = element(j, p) < kWidth ? w[element(j, p)] : 0.0f;
  }

  template <bool kAdd, bool kQ8>
  __device__ __forceinline__ void normalize(const float* a, const float* b, float* sum, const float* __restrict__ w,
                                            float* y, float eps, int8_t* qs, Q8Meta* meta) {
    static_assert(!kQ8 || kWidth % 32 == 0, "the q8 form needs whole blocks of 32");
    const float* x = kAdd ? sum : a;
    const auto load = [&](int i) {
      if (!kAdd) return __ldcg(a + i);
      const float v = __ldcg(a + i) + __ldcg(b + i);
      sum[i] = v;
      return v;
    };
    float xv[kHold ? kJ * kPasses : 1];
    float ss[kJ];
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      ss[j] = 0.0f;
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const int i = element(j, p);
        if (i >= kWidth) break;
        const float v = load(i);
        if (kHold) xv[j * kPasses + p] = v;
        ss[j] += v * v;
      }
    }
    __shared__ float partial[kV / 32];
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const float s = warpSum(ss[j]);
      if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32 + kThreads / 32 * j] = s;
    }
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kV / 32; ++i) total += partial[i];
    const float inv = 1.0f / sqrtf(total / static_cast<float>(kWidth) + eps);
#pragma unroll
    for (int j = 0; j < kJ; ++j)
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const int i = element(j, p);
        if (i >= kWidth) break;  // whole warps leave together (kWidth % 32 == 0 with kQ8)
        const float v = (kHold ? xv[j * kPasses + p] : x[i]) * inv * (kHold ? wv[j * kPasses + p] : w[i]);
        y[i] = v;
        if (kQ8) quantizeBlock<1>({v}, qs + (i & ~31), meta + i / 32, true);
      }
  }
};
}  // namespace minfer::kern::rms
#endif

#if defined(MINFER_DEVICE_CODE) && defined(RMS_WIDTH)
extern "C" __global__ void __launch_bounds__(minfer::kern::kRmsThreads)
    minfer_rms_norm(
#if RMS_ADD
        const float* a, const float* b, float* sum,  // the row normalized: a + b, written to sum
#else
        const float* x,
#endif
        const float* __restrict__ w, float* out,
#if RMS_Q8
                    int8_t* __restrict__ qs, minfer::kern::Q8Meta* __restrict__ meta,
#endif
                    int n_tokens) {
  using namespace minfer::kern;
  rms::RowNorm<static_cast<int>(kRmsThreads), RMS_WIDTH, 8> row;
  row.loadWeight(w);  // a plane no kernel writes: read before waiting for the previous kernel
  overlapPrologue();
  const int t = blockIdx.x;
  if (t >= n_tokens) return;
  const uint64_t at = static_cast<uint64_t>(t) * RMS_WIDTH;
#if RMS_Q8
  constexpr bool kQ8 = true;
  int8_t* qr = qs + at;
  Q8Meta* mr = meta + at / 32;
#else
  constexpr bool kQ8 = false;
  int8_t* qr = nullptr;
  Q8Meta* mr = nullptr;
#endif
#if RMS_ADD
  row.normalize<true, kQ8>(a + at, b + at, sum + at, w, out + at, RMS_EPS, qr, mr);
#else
  row.normalize<false, kQ8>(x + at, nullptr, nullptr, w, out + at, RMS_EPS, qr, mr);
#endif
}
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
  float ss = 0.0f;
  for (int i = lane; i < HRMS_HEAD_DIM; i += 32) ss += xh[i] * xh[i];
  ss = warpSum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(HRMS_HEAD_DIM) + HRMS_EPS);
  for (int i = lane; i < HRMS_HEAD_DIM; i += 32) xh[i] = xh[i] * inv * w[i];
}
#endif
