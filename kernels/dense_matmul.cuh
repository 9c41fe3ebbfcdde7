// Matmul on dense float weights (OpKind MatMul with an F32 / F16 / BF16 plane), f32 activations,
// f32 accumulation: out[t][r] = Σ_c W(r,c)·x[t][c] (+ bias[r]). Weights widen exactly to f32.
//
// dense_mm (prefill, any n_tokens): SIMT tiles of 64 rows × 64 tokens, K in steps of 16 through shared
//   memory; 256 threads, each accumulating 4 rows × 4 tokens (rows tx + 16i, tokens ty + 16j, so
//   output stores of a half-warp are 16 consecutive floats).
// dense_gemv (decode, one token): one warp per row, 16-byte weight loads (4 f32 or 8 f16/bf16),
//   kDenseUnroll loads in flight per lane; a scalar tail when K is not a multiple of the chunk.
//
// Compile-time constants (-D), prefix DMM_ (dense_mm) or DGEMV_ (dense_gemv):
//   _N, _K          weight rows and cols (any K ≥ 1)
//   _PLANE          PlaneKind: 4 kF32, 5 kF16, 6 kBF16
//   _PITCH          plane row pitch (bytes, multiple of 16)
//   _HAS_BIAS       bias vector (N f32)
// Launch ABI:
//   minfer_dense_mm(const uint8_t* w, const float* bias, const float* x, float* out, int n_tokens)
//   minfer_dense_gemv(const uint8_t* w, const float* bias, const float* x, float* out)
//   x: n_tokens × K f32 (row stride K); out: n_tokens × N f32 (row stride N); bias N f32 or null.
// Launch shape: denseMmLaunch() grid (⌈N/64⌉, ⌈n_tokens/64⌉) × 256; denseGemvLaunch() 4 rows per block.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kDenseTile = 64;
constexpr unsigned kDenseBK = 16;
constexpr unsigned kDenseGemvWarps = 4;
constexpr unsigned kDenseUnroll = 4;

MINFER_HD LaunchRule denseMmLaunchRule(unsigned n) {
  LaunchRule r;
  r.grid[0] = fixedExtent(ceilDiv(n, kDenseTile));
  r.grid[1] = perToken(1, kDenseTile);
  r.block.x = 256;
  return r;
}
MINFER_HD LaunchShape denseMmLaunch(unsigned n, unsigned n_tokens) { return denseMmLaunchRule(n).at(n_tokens); }

MINFER_HD LaunchRule denseGemvLaunchRule(unsigned n) {
  LaunchRule r;
  r.grid[0] = fixedExtent(ceilDiv(n, kDenseGemvWarps));
  r.block.x = 32 * kDenseGemvWarps;
  return r;
}
MINFER_HD LaunchShape denseGemvLaunch(unsigned n) { return denseGemvLaunchRule(n).at(1); }

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE)
namespace minfer::kern::dense {

// Element c of a dense row of plane kind `plane`, widened to f32.
template <int kPlane>
__device__ __forceinline__ float loadWeight(const uint8_t* row, int c) {
  if (kPlane == 4) return reinterpret_cast<const float*>(row)[c];
  if (kPlane == 5) return h2f(reinterpret_cast<const uint16_t*>(row)[c]);
  return bf2f(reinterpret_cast<const uint16_t*>(row)[c]);
}

}  // namespace minfer::kern::dense
#endif

#if defined(MINFER_DEVICE_CODE) && defined(DMM_N)
extern "C" __global__ void __launch_bounds__(256)
    minfer_dense_mm(const uint8_t* __restrict__ w, const float* __restrict__ bias, const float* __restrict__ x,
                    float* __restrict__ out, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  constexpr int kT = kDenseTile, kBK = kDenseBK;
  __shared__ float sw[kBK][kT + 1];  // [k][row], padded: the k-major stores hit distinct banks
  __shared__ float sx[kBK][kT + 1];  // [k][token]
  const int m0 = blockIdx.x * kT, n0 = blockIdx.y * kT;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (int k0 = 0; k0 < DMM_K; k0 += kBK) {
    // 64 × 16 weights and 64 × 16 activations: 4 of each per thread, consecutive threads along k.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = threadIdx.x + 256 * i;
      const int r = e / kBK, k = e % kBK;
      const int gr = m0 + r, gk = k0 + k;
      sw[k][r] = (gr < DMM_N && gk < DMM_K)
                     ? dense::loadWeight<DMM_PLANE>(w + static_cast<uint64_t>(gr) * DMM_PITCH, gk)
                     : 0.0f;
      const int gt = n0 + r;
      sx[k][r] = (gt < n_tokens && gk < DMM_K) ? x[static_cast<uint64_t>(gt) * DMM_K + gk] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = sw[k][tx + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = sx[k][ty + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = m0 + tx + 16 * i, tok = n0 + ty + 16 * j;
      if (r < DMM_N && tok < n_tokens) {
        float v = acc[i][j];
#if DMM_HAS_BIAS
        v += bias[r];
#endif
        out[static_cast<uint64_t>(tok) * DMM_N + r] = v;
      }
    }
}
#endif

#if defined(MINFER_DEVICE_CODE)
namespace minfer::kern::dense {
// dense_gemv's sum for one row (one warp; lane = threadIdx.x % 32; every lane returns the sum, without the bias):
// the row at w + row·kPitch of plane kind kPlane against x (kK f32). Also the router of kernels/moe.cuh's
// minfer_moe_router_sort, so both sum a row in one order.
template <int kPlane, int kK, unsigned long long kPitch>
__device__ __forceinline__ float gemvRow(const uint8_t* w, const float* x, int row, int lane) {
  static_assert(kPitch % 16 == 0, "plane rows must be 16-byte aligned");
  constexpr int kElemBytes = kPlane == 4 ? 4 : 2;
  constexpr int kPerChunk = 16 / kElemBytes;  // weights per 16-byte load
  constexpr int kChunks = kK / kPerChunk;
  const uint8_t* wr = w + static_cast<uint64_t>(row) * kPitch;
  float acc = 0.0f;
  auto chunk = [&](uint4 v, int c) {
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
    const float* xc = x + c * kPerChunk;
    float s = 0.0f;
    if (kPlane == 4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) s = fmaf(__uint_as_float(words[i]), xc[i], s);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint16_t lo = static_cast<uint16_t>(words[i] & 0xFFFFu), hi = static_cast<uint16_t>(words[i] >> 16);
        const float w0 = kPlane == 5 ? h2f(lo) : bf2f(lo);
        const float w1 = kPlane == 5 ? h2f(hi) : bf2f(hi);
        s = fmaf(w0, xc[2 * i], s);
        s = fmaf(w1, xc[2 * i + 1], s);
      }
    }
    return s;
  };
  int c = lane;
  for (; c + 32 * (static_cast<int>(kDenseUnroll) - 1) < kChunks; c += 32 * kDenseUnroll) {
    uint4 v[kDenseUnroll];
#pragma unroll
    for (int u = 0; u < static_cast<int>(kDenseUnroll); ++u)
      v[u] = *reinterpret_cast<const uint4*>(wr + static_cast<uint64_t>(c + 32 * u) * 16);
#pragma unroll
    for (int u = 0; u < static_cast<int>(kDenseUnroll); ++u) acc += chunk(v[u], c + 32 * u);
  }
  for (; c < kChunks; c += 32) acc += chunk(*reinterpret_cast<const uint4*>(wr + static_cast<uint64_t>(c) * 16), c);
  for (int k = kChunks * kPerChunk + lane; k < kK; k += 32)  // tail (K not a multiple of the chunk)
    acc = fmaf(loadWeight<kPlane>(wr, k), x[k], acc);
  return warpSum(acc);
}
}  // namespace minfer::kern::dense
#endif

#if defined(MINFER_DEVICE_CODE) && defined(DGEMV_N)
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kDenseGemvWarps)
    minfer_dense_gemv(const uint8_t* __restrict__ w, const float* __restrict__ bias, const float* __restrict__ x,
                      float* __restrict__ out) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  const int row = blockIdx.x * kDenseGemvWarps + threadIdx.x / 32;
  if (row >= DGEMV_N) return;
  const int lane = threadIdx.x % 32;
  float acc = dense::gemvRow<DGEMV_PLANE, DGEMV_K, DGEMV_PITCH>(w, x, row, lane);
  if (lane == 0) {
#if DGEMV_HAS_BIAS
    acc += bias[row];
#endif
    out[row] = acc;
  }
}
#endif
