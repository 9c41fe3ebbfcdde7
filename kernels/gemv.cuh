// Decode matmul on quantized weights (OpKind MatMul, one token): GEMV with q8 activations.
//
//   out[r] = Σ_g [ s(r,g) · d(b) · Σ_{c∈g} q(r,c)·xq(c)  +  m(r,g) · d(b) · Σ_{c∈g} xq(c) ] (+ bias[r])
// (same definition as mmq.cuh, so prefill and decode agree up to f32 summation order).
//
// Decode is bound by memory bandwidth: the kernel reads the fewest weight bytes it can.
//   GEMV_BITS 4: the kPacked plane (Q4_0, Q4_1, Q4_K): one 16-byte load = 32 weights = one activation
//                block (stride_table.h packedOffset: byte i holds weight i in its low nibble and i+16
//                in its high nibble), q = nibble + GEMV_Q_OFFSET, dot products with dp4a.
//   GEMV_BITS 8: the kI8 plane (every other quantized type): one 16-byte load = 16 weights.
// One warp per weight row; each lane walks the row's 16-byte chunks with a stride of 32 chunks and
// keeps kGemvUnroll loads in flight (all issued before the first is used). Activations (K bytes +
// K/32 Q8Meta) are read through L1/L2.
//
// Compile-time constants (-D):
//   GEMV_N, GEMV_K          weight rows and cols (K % 32 == 0)
//   GEMV_BITS               4 (kPacked) or 8 (kI8)
//   GEMV_PITCH              row pitch of the plane read (bytes, multiple of 16)
//   GEMV_Q_OFFSET           kPacked: q = stored nibble + offset (−8 for Q4_0); 0 for kI8
//   GEMV_GROUP              16 or 32 (scale/min group along K; 4-bit planes need 32)
//   GEMV_S_PITCH            kScale row pitch (bytes)
//   GEMV_HAS_MIN, GEMV_M_PITCH   kMin plane
//   GEMV_HAS_BIAS           bias vector (N f32)
// Launch ABI:  minfer_gemv(const uint8_t* w, const float* wscale, const float* wmin, const float* bias,
//                          const int8_t* xq, const Q8Meta* xmeta, float* out)
//   w: the kPacked (BITS 4) or kI8 (BITS 8) plane; xq, xmeta: the q8 input buffer, row 0; out: N f32.
// Launch shape: gemvLaunch(): 4 warps (4 rows) per block.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kGemvWarps = 4;
constexpr unsigned kGemvUnroll = 4;

MINFER_HD LaunchRule gemvLaunchRule(unsigned n) {
  LaunchRule r;
  r.grid[0] = fixedExtent(ceilDiv(n, kGemvWarps));
  r.block.x = 32 * kGemvWarps;
  return r;
}
MINFER_HD LaunchShape gemvLaunch(unsigned n) { return gemvLaunchRule(n).at(1); }

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(GEMV_N)
namespace minfer::kern::gemv {

constexpr int kN = GEMV_N, kK = GEMV_K, kBits = GEMV_BITS, kG = GEMV_GROUP;
constexpr int kWeightsPerChunk = kBits == 4 ? 32 : 16;
constexpr int kChunks = kK / kWeightsPerChunk;
static_assert(kK % 32 == 0, "GEMV_K must be a multiple of 32");
static_assert(kBits == 4 || kBits == 8, "GEMV_BITS must be 4 or 8");
static_assert(kG == 16 || kG == 32, "GEMV_GROUP must be 16 or 32");
static_assert(kBits == 8 || kG == 32, "4-bit planes have groups of 32");
static_assert(GEMV_PITCH % 16 == 0, "plane rows must be 16-byte aligned");

// Contribution of chunk c (already loaded as w) of row `row`.
__device__ __forceinline__ float chunkDot(uint4 w, int c, int row, const float* wscale, const float* wmin,
                                          const int8_t* xq, const Q8Meta* xmeta) {
  const unsigned words[4] = {w.x, w.y, w.z, w.w};
  if (kBits == 4) {
    const int4 a0 = *reinterpret_cast<const int4*>(xq + 32 * c);       // activations 0..15
    const int4 a1 = *reinterpret_cast<const int4*>(xq + 32 * c + 16);  // activations 16..31
    const int xa[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    int dot = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      dot = dp4a(static_cast<int>(words[i] & 0x0F0F0F0Fu), xa[i], dot);
      dot = dp4a(static_cast<int>((words[i] >> 4) & 0x0F0F0F0Fu), xa[4 + i], dot);
    }
    const Q8Meta mt = xmeta[c];
    const int sum = mt.sum_lo + mt.sum_hi;
    const float s = wscale[static_cast<uint64_t>(row) * (GEMV_S_PITCH / 4) + c];
    float v = s * mt.d * static_cast<float>(dot + GEMV_Q_OFFSET * sum);
#if GEMV_HAS_MIN
    v = fmaf(wmin[static_cast<uint64_t>(row) * (GEMV_M_PITCH / 4) + c], mt.d * static_cast<float>(sum), v);
#endif
    return v;
  } else {
    const int4 a = *reinterpret_cast<const int4*>(xq + 16 * c);
    int dot = dp4a(static_cast<int>(words[0]), a.x, 0);
    dot = dp4a(static_cast<int>(words[1]), a.y, dot);
    dot = dp4a(static_cast<int>(words[2]), a.z, dot);
    dot = dp4a(static_cast<int>(words[3]), a.w, dot);
    const Q8Meta mt = xmeta[c / 2];
    const int half_sum = (c % 2) ? mt.sum_hi : mt.sum_lo;
    const int grp = c * 16 / kG;
    const float s = wscale[static_cast<uint64_t>(row) * (GEMV_S_PITCH / 4) + grp];
    float v = s * mt.d * static_cast<float>(dot);
#if GEMV_HAS_MIN
    v = fmaf(wmin[static_cast<uint64_t>(row) * (GEMV_M_PITCH / 4) + grp], mt.d * static_cast<float>(half_sum), v);
#endif
    (void)half_sum;
    return v;
  }
}

}  // namespace minfer::kern::gemv

extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kGemvWarps)
    minfer_gemv(const uint8_t* __restrict__ w, const float* __restrict__ wscale, const float* __restrict__ wmin,
                const float* __restrict__ bias, const int8_t* __restrict__ xq,
                const minfer::kern::Q8Meta* __restrict__ xmeta, float* __restrict__ out) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  using namespace minfer::kern::gemv;
  const int row = blockIdx.x * kGemvWarps + threadIdx.x / 32;
  if (row >= kN) return;
  const int lane = threadIdx.x % 32;
  const uint8_t* wr = w + static_cast<uint64_t>(row) * GEMV_PITCH;
  float acc = 0.0f;
  int c = lane;
  // Main loop: kGemvUnroll loads in flight per lane.
  for (; c + 32 * (static_cast<int>(kGemvUnroll) - 1) < kChunks; c += 32 * kGemvUnroll) {
    uint4 v[kGemvUnroll];
#pragma unroll
    for (int u = 0; u < static_cast<int>(kGemvUnroll); ++u)
      v[u] = *reinterpret_cast<const uint4*>(wr + static_cast<uint64_t>(c + 32 * u) * 16);
#pragma unroll
    for (int u = 0; u < static_cast<int>(kGemvUnroll); ++u)
      acc += chunkDot(v[u], c + 32 * u, row, wscale, wmin, xq, xmeta);
  }
  for (; c < kChunks; c += 32)
    acc += chunkDot(*reinterpret_cast<const uint4*>(wr + static_cast<uint64_t>(c) * 16), c, row, wscale, wmin, xq,
                    xmeta);
  acc = warpSum(acc);
  if (lane == 0) {
#if GEMV_HAS_BIAS
    acc += bias[row];
#endif
    out[row] = acc;
  }
}
#endif
