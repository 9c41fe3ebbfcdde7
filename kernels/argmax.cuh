// Greedy sampling on the device: the index of the largest logit of each row (ties → lowest index;
// NaN never wins), so the decode loop can copy 4 bytes back instead of the whole logits row.
//
// Compile-time constants: AM_N (row width, n_vocab).
// Launch ABI:  minfer_argmax(const float* logits, int32_t* out, int n_rows)
//   logits: n_rows × AM_N f32; out: n_rows int32.
// Launch shape: argmaxLaunch(): one block of 512 threads per row.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kArgmaxThreads = 512;

// One block per row: the launch's n_tokens is the number of rows.
MINFER_HD LaunchRule argmaxLaunchRule() {
  LaunchRule r;
  r.grid[0] = perToken(1);
  r.block.x = kArgmaxThreads;
  return r;
}
MINFER_HD LaunchShape argmaxLaunch(unsigned n_rows) { return argmaxLaunchRule().at(n_rows); }

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(AM_N)
extern "C" __global__ void __launch_bounds__(minfer::kern::kArgmaxThreads)
    minfer_argmax(const float* __restrict__ logits, int32_t* __restrict__ out, int n_rows) {
  minfer::kern::overlapPrologue();
  using minfer::kern::kArgmaxThreads;
  const int row = blockIdx.x;
  if (row >= n_rows) return;
  const float* x = logits + static_cast<uint64_t>(row) * AM_N;
  float best = -MINFER_INF;
  int best_i = 0x7fffffff;
  for (int i = threadIdx.x; i < AM_N; i += kArgmaxThreads) {
    const float v = x[i];
    if (v > best) {  // strictly greater: the first (lowest) index of this thread wins ties
      best = v;
      best_i = i;
    }
  }
  // Warp then block reduction on (value, index): larger value wins, equal values take the lower index.
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ov > best || (ov == best && oi < best_i)) {
      best = ov;
      best_i = oi;
    }
  }
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  if ((threadIdx.x & 31) == 0) {
    sv[threadIdx.x / 32] = best;
    si[threadIdx.x / 32] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(kArgmaxThreads / 32); ++w)
      if (sv[w] > best || (sv[w] == best && si[w] < best_i)) {
        best = sv[w];
        best_i = si[w];
      }
    out[row] = best_i == 0x7fffffff ? 0 : best_i;
  }
}
#endif
