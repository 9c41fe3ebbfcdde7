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
// Launch shape: quantizeActLaunch(): four threads per block of 32 values (8 each: two 16-byte loads, one
// 8-byte store; max and sums over the quad by two shuffles), 256 threads per thread block.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kQuantizeActThreads = 256;
constexpr unsigned kQuantizeActBlocksPerTb = kQuantizeActThreads / 4;  // blocks of 32 values per thread block

MINFER_HD LaunchRule quantizeActLaunchRule(unsigned k) {
  LaunchRule r;
  r.grid[0] = perToken(k / kQ8Block, kQuantizeActBlocksPerTb);
  r.block.x = kQuantizeActThreads;
  return r;
}
MINFER_HD LaunchShape quantizeActLaunch(unsigned n_tokens, unsigned k) { return quantizeActLaunchRule(k).at(n_tokens); }

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(QA_K)
extern "C" __global__ void __launch_bounds__(minfer::kern::kQuantizeActThreads)
    minfer_quantize_act(const float* __restrict__ x, int8_t* __restrict__ qs, minfer::kern::Q8Meta* __restrict__ meta,
                        int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  static_assert(QA_K % 32 == 0, "QA_K must be a multiple of 32");
  constexpr int kBlocksPerRow = QA_K / 32;
  const int block = blockIdx.x * kQuantizeActBlocksPerTb + threadIdx.x / 4;  // t · kBlocksPerRow + b
  const int sub = threadIdx.x % 4;                                             // values 8·sub … 8·sub + 7
  const bool active = block < n_tokens * kBlocksPerRow;  // inactive lanes still join the shuffles
  const uint64_t i0 = static_cast<uint64_t>(block) * 32 + sub * 8;
  float v[8] = {};
  if (active) {
    const float4 a = *reinterpret_cast<const float4*>(x + i0), b = *reinterpret_cast<const float4*>(x + i0 + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
  quantizeBlock<8>(v, qs + static_cast<uint64_t>(block) * 32, meta + block, active);
}
#endif
