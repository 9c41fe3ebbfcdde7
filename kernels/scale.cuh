// Scale (OpKind Scale): out = x·SC_SCALE, then with SC_SOFTCAP = c > 0 out = c·tanh(out·(1/c)) — gemma's
// embedding scale √n_embd and final logit soft-capping (llama.cpp: ggml_scale, ggml_tanh, ggml_scale).
// The f32 reference is cpu::scale.
// Compile-time constants: SC_WIDTH (row width), SC_SCALE, SC_SOFTCAP (float literals; SC_SOFTCAP 0: no cap).
// Launch ABI:  minfer_scale(const float* x, float* out, int n_tokens)
//   x, out: n_tokens × SC_WIDTH f32; out may equal x.
// Launch shape: scaleLaunchRule(): 256 threads, 4 elements per thread (float4 when aligned); one pass.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kScaleThreads = 256;

MINFER_HD LaunchRule scaleLaunchRule(unsigned width) {
  LaunchRule r;
  r.grid[0] = perToken(width, 4 * kScaleThreads);
  r.block.x = kScaleThreads;
  return r;
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(SC_WIDTH)
namespace minfer::kern::sc {
__device__ __forceinline__ float apply(float x) {
  constexpr float kCap = SC_SOFTCAP;
  if constexpr (kCap > 0.0f) return kCap * tanhf(x * SC_SCALE * (1.0f / kCap));
  return x * SC_SCALE;
}
}  // namespace minfer::kern::sc

extern "C" __global__ void __launch_bounds__(minfer::kern::kScaleThreads)
    minfer_scale(const float* x, float* out, int n_tokens) {
  minfer::kern::overlapPrologue();
  using minfer::kern::sc::apply;
  const uint64_t n = static_cast<uint64_t>(n_tokens) * SC_WIDTH;
  const uint64_t i = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i + 4 <= n && SC_WIDTH % 4 == 0) {
    const float4 v = *reinterpret_cast<const float4*>(x + i);
    *reinterpret_cast<float4*>(out + i) = make_float4(apply(v.x), apply(v.y), apply(v.z), apply(v.w));
  } else {
    for (uint64_t j = i; j < min(i + 4, n); ++j) out[j] = apply(x[j]);
  }
}
#endif
