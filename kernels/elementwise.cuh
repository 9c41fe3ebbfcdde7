// Elementwise ops: SwiGLU (OpKind SwiGlu; Shazeer 2020), GeGLU (OpKind GeGlu) and the residual add
// (OpKind Add).
//
//   swiglu: out = silu(gate) ⊙ up, silu(g) = g / (1 + e^(−g)) (expf, not the fast approximation)
//   geglu:  out = gelu(gate) ⊙ up, gelu(g) = 0.5·g·(1 + tanh(√(2/π)·g·(1 + 0.044715·g²))) (tanhf; the
//           exact tanh form, as cpu::geGlu, not llama.cpp's CPU fp16 table)
//   add:    out = a + b
// Compile-time constants: EW_WIDTH (row width of the buffers), EW_OP (1 swiglu, 2 add, 3 geglu);
//   column views (format 1.4, phi3's gate|up rows): EW_A_PITCH, EW_B_PITCH, EW_OUT_PITCH (floats between
//   rows of each operand, all three or none; the pointers address row 0's first element of the view)
//   and EW_VEC4 (1 when the width, pitches and view offsets are multiples of 4: float4 accesses).
// Launch ABI:  minfer_swiglu(const float* gate, const float* up, float* out, int n_tokens)
//              minfer_geglu(const float* gate, const float* up, float* out, int n_tokens)
//              minfer_add(const float* a, const float* b, float* out, int n_tokens)
//   all operands n_tokens × EW_WIDTH f32 (rows EW_*_PITCH apart with views); out may alias an input.
//   With EW_Q8 = 1 (swiglu / geglu, whole buffers; the QuantizeAct step that follows, fused into this
//   launch; EW_WIDTH % 32 == 0): (…, float* out, int8_t* qs, Q8Meta* meta, int n_tokens) also writes
//   out's q8 form (quantize_act.cuh's definition, bit for bit: eight consecutive threads hold one block).
// Launch shape: elementwiseLaunch(): 256 threads, 4 elements per thread (float4 when aligned).
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kEwThreads = 256;

// ⌈⌈n_tokens·width / 4⌉ / kEwThreads⌉ = ⌈n_tokens·width / (4·kEwThreads)⌉ blocks.
MINFER_HD LaunchRule elementwiseLaunchRule(unsigned width) {
  LaunchRule r;
  r.grid[0] = perToken(width, 4 * kEwThreads);
  r.block.x = kEwThreads;
  return r;
}
MINFER_HD LaunchShape elementwiseLaunch(unsigned n_tokens, unsigned width) {
  return elementwiseLaunchRule(width).at(n_tokens);
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE)
namespace minfer::kern {
// The operation of EW_OP = kOp (1 swiglu, 2 add, 3 geglu) on one pair, as the header defines it; also
// the epilogue of the fused gate|up GEMV (gemv_blocks.cuh GEMVB_GLU), compiled with the same flags.
template <int kOp>
__device__ __forceinline__ float ewApply(float a, float b) {
  static_assert(kOp >= 1 && kOp <= 3, "EW_OP must be 1 (swiglu), 2 (add) or 3 (geglu)");
  if constexpr (kOp == 1) return a / (1.0f + expf(-a)) * b;
  else if constexpr (kOp == 2) return a + b;
  else return 0.5f * a * (1.0f + tanhf(0.79788456080286535588f * a * (1.0f + 0.044715f * a * a))) * b;
}
}  // namespace minfer::kern
#endif

#if defined(MINFER_DEVICE_CODE) && defined(EW_WIDTH)
namespace minfer::kern::ew {
__device__ __forceinline__ float apply(float a, float b) { return ewApply<EW_OP>(a, b); }
}  // namespace minfer::kern::ew

#if EW_OP == 1
#define MINFER_EW_ENTRY minfer_swiglu
#elif EW_OP == 3
#define MINFER_EW_ENTRY minfer_geglu
#else
#define MINFER_EW_ENTRY minfer_add
#endif

#if EW_Q8
static_assert(EW_WIDTH % 32 == 0 && EW_OP != 2, "the q8 form is for swiglu / geglu rows of whole blocks of 32");
#if defined(EW_A_PITCH)
#error "the q8 form takes whole buffers, not column views"
#endif
extern "C" __global__ void __launch_bounds__(minfer::kern::kEwThreads)
    MINFER_EW_ENTRY(const float* a, const float* b, float* out, int8_t* __restrict__ qs,
                    minfer::kern::Q8Meta* __restrict__ meta, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  // Rows are whole blocks, so a group of 8 threads (one block) is entirely in or out of the n values;
  // threads past the end still join the group's shuffles.
  const uint64_t n = static_cast<uint64_t>(n_tokens) * EW_WIDTH;
  const uint64_t i = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  const bool active = i < n;
  float r[4] = {};
  if (active) {
    const float4 va = *reinterpret_cast<const float4*>(a + i);
    const float4 vb = *reinterpret_cast<const float4*>(b + i);
    r[0] = ew::apply(va.x, vb.x), r[1] = ew::apply(va.y, vb.y), r[2] = ew::apply(va.z, vb.z), r[3] = ew::apply(va.w, vb.w);
    *reinterpret_cast<float4*>(out + i) = make_float4(r[0], r[1], r[2], r[3]);
  }
  quantizeBlock<4>(r, qs + (i & ~uint64_t{31}), meta + i / 32, active);
}
#else
extern "C" __global__ void __launch_bounds__(minfer::kern::kEwThreads)
    MINFER_EW_ENTRY(const float* a, const float* b, float* out, int n_tokens) {
  minfer::kern::overlapPrologue();
  const uint64_t n = static_cast<uint64_t>(n_tokens) * EW_WIDTH;
  const uint64_t i = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
#if defined(EW_A_PITCH)  // column views: element (t, c) of each operand at t·pitch + c
  if (i >= n) return;
#if EW_VEC4  // the 4 elements lie in one row (EW_WIDTH % 4 == 0) and are 16-byte aligned
  {
    const uint64_t t = i / EW_WIDTH, c = i % EW_WIDTH;
    const float4 va = *reinterpret_cast<const float4*>(a + t * EW_A_PITCH + c);
    const float4 vb = *reinterpret_cast<const float4*>(b + t * EW_B_PITCH + c);
    float4 r;
    r.x = minfer::kern::ew::apply(va.x, vb.x);
    r.y = minfer::kern::ew::apply(va.y, vb.y);
    r.z = minfer::kern::ew::apply(va.z, vb.z);
    r.w = minfer::kern::ew::apply(va.w, vb.w);
    *reinterpret_cast<float4*>(out + t * EW_OUT_PITCH + c) = r;
  }
#else
  for (uint64_t j = i; j < i + 4 && j < n; ++j) {
    const uint64_t t = j / EW_WIDTH, c = j % EW_WIDTH;
    out[t * EW_OUT_PITCH + c] = minfer::kern::ew::apply(a[t * EW_A_PITCH + c], b[t * EW_B_PITCH + c]);
  }
#endif
  return;
#endif
  if (i + 4 <= n) {
    const float4 va = *reinterpret_cast<const float4*>(a + i);
    const float4 vb = *reinterpret_cast<const float4*>(b + i);
    float4 r;
    r.x = minfer::kern::ew::apply(va.x, vb.x);
    r.y = minfer::kern::ew::apply(va.y, vb.y);
    r.z = minfer::kern::ew::apply(va.z, vb.z);
    r.w = minfer::kern::ew::apply(va.w, vb.w);
    *reinterpret_cast<float4*>(out + i) = r;
  } else {
    for (uint64_t j = i; j < n; ++j) out[j] = minfer::kern::ew::apply(a[j], b[j]);
  }
}
#endif
#endif
