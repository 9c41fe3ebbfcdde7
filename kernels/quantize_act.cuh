// Activation quantization (OpKind QuantizeAct): f32 rows → q8 buffer (kernels/common.cuh, Q8Meta), the
// int8 input of the prefill MMQ and the decode GEMV on quantized weights.
//
// Per block of 32 consecutive values of a row: d = max|x| / 127, q = rint(x · (1/d)) (round half to
// even; 0 when d = 0), plus the integer sums of q over each half. IEEE division and multiplication,
// no fast math, so a host reference reproduces q and d bit for bit.
//
// Compile-time constants: QA_K (row width; multiple of 32).
// Launch ABI:  minfer_quantize_act(const float* x, int8_t* qs, Q8Meta* meta, int n_tokens)
//   x: n_tokens × QA_K f32; qs: n_tokens × QA_K int8; meta: n_tokens × QA_K/32 (see common.cuh for where
//   qs and meta live inside a q8 buffer).
// Launch shape: quantizeActLaunch(): one warp per block of 32 values, 8 warps per thread block.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kQuantizeActWarps = 8;

MINFER_HD LaunchShape quantizeActLaunch(unsigned n_tokens, unsigned k) {
  LaunchShape s;
  s.grid.x = ceilDiv(n_tokens * (k / kQ8Block), kQuantizeActWarps);
  s.block.x = 32 * kQuantizeActWarps;
  return s;
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(QA_K)
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kQuantizeActWarps)
    minfer_quantize_act(const float* __restrict__ x, int8_t* __restrict__ qs, minfer::kern::Q8Meta* __restrict__ meta,
                        int n_tokens) {
  using namespace minfer::kern;
  static_assert(QA_K % 32 == 0, "QA_K must be a multiple of 32");
  constexpr int kBlocksPerRow = QA_K / 32;
  const int block = blockIdx.x * kQuantizeActWarps + threadIdx.x / 32;  // t · kBlocksPerRow + b
  if (block >= n_tokens * kBlocksPerRow) return;
  const int lane = threadIdx.x & 31;
  const uint64_t i = static_cast<uint64_t>(block) * 32 + lane;  // = t·K + 32b + lane
  const float v = x[i];
  const float amax = warpMax(fabsf(v));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int q = static_cast<int>(rintf(v * id));
  q = q > 127 ? 127 : (q < -127 ? -127 : q);
  qs[i] = static_cast<int8_t>(q);
  int lo = lane < 16 ? q : 0, hi = lane < 16 ? 0 : q;
  lo = warpSumInt(lo);
  hi = warpSumInt(hi);
  if (lane == 0) {
    Q8Meta m;
    m.d = d;
    m.sum_lo = static_cast<short>(lo);
    m.sum_hi = static_cast<short>(hi);
    meta[block] = m;
  }
}
#endif
