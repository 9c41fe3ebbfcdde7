// Prefill matmul on quantized weights (OpKind MatMul, n_tokens > 1): int8 tensor-core MMA on the kI8
// plane with per-group scales (and mins) applied in f32, q8 activations (quantize_act.cuh).
//
//   out[t][r] = Σ_g [ s(r,g) · d(t,b) · Σ_{c∈g} q(r,c)·xq(t,c)  +  m(r,g) · d(t,b) · Σ_{c∈g} xq(t,c) ] (+ bias[r])
// where g runs over the weight groups (16 or 32 columns, stride_table.h: w = s·q + m), b = c / 32 is
// the activation block and xq, d are the q8 activation (w·(d·xq) exactly, up to f32 rounding).
// Formats: every quantized type with a kI8 plane (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K … Q6_K).
//
// Tiling: a thread block computes TM weight rows × TN tokens with 8 warps (256 threads) laid out as
// (TM/32) × (8·32/TM); each warp owns 32 rows × (TN/WN) tokens = 2 × NI MMA tiles of 16×8. K advances
// in stages of BK = 64 (two activation blocks), double-buffered in shared memory with cp.async
// (16-byte copies of the kI8 and qs rows; every copy of a stage is issued before the first wait).
// Per activation block the int32 MMA result of each group is scaled into the f32 accumulators:
// groups of 32 use mma.m16n8k32, groups of 16 two mma.m16n8k16 (one per group). This per-element
// epilogue (convert, scale product, FMA, per 32 of K) issues more instructions than the MMAs; replacing
// the I2F conversion by an integer-add/float-subtract trick measured slower on the H200 (MatMul 64 →
// 69 ms of a 7B pp512), so the epilogue's cost lies elsewhere: the next place to attribute.
// Shared-memory rows are padded to BK + 16 bytes so the fragment loads (8 rows × 4 words) hit 32
// distinct banks.
//
// Compile-time constants (-D):
//   MMQ_N, MMQ_K        weight rows (out features) and cols (in features; K % 32 == 0)
//   MMQ_GROUP           16 or 32 (scale/min group along K)
//   MMQ_HAS_MIN         1 when the tensor has a kMin plane
//   MMQ_HAS_BIAS        1 when the step has a bias vector (N f32)
//   MMQ_Q_PITCH         kI8 row pitch (bytes, multiple of 16)
//   MMQ_S_PITCH         kScale row pitch (bytes); group pitch 4
//   MMQ_M_PITCH         kMin row pitch (bytes; MMQ_HAS_MIN only)
//   MMQ_TM, MMQ_TN      tile: TM ∈ {32, 64, 128, 256}, TN multiple of 8·(256/TM)/32·8
// Launch ABI:  minfer_mmq(const int8_t* wq, const float* wscale, const float* wmin, const float* bias,
//                         const int8_t* xq, const Q8Meta* xmeta, float* out, int n_tokens)
//   wq/wscale/wmin: the tensor's kI8/kScale/kMin planes; bias: N f32 or null; xq, xmeta: the q8 input
//   buffer (width K); out: n_tokens × N f32 (row stride N).
// Launch shape: mmqLaunch(): grid (⌈N/TM⌉, ⌈n_tokens/TN⌉), 256 threads, static shared memory.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kMmqThreads = 256;
constexpr unsigned kMmqBK = 64;

MINFER_HD LaunchShape mmqLaunch(unsigned n, unsigned n_tokens, unsigned tm, unsigned tn) {
  LaunchShape s;
  s.grid.x = ceilDiv(n, tm);
  s.grid.y = ceilDiv(n_tokens, tn);
  s.block.x = kMmqThreads;
  return s;
}

// True when (tm, tn) is a tile the kernel supports.
MINFER_HD bool mmqTileSupported(unsigned tm, unsigned tn) {
  if (tm != 32 && tm != 64 && tm != 128 && tm != 256) return false;
  const unsigned wn = 8 / (tm / 32);
  return tn >= wn * 8 && tn % (wn * 8) == 0 && tn <= 128;
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(MMQ_N)
namespace minfer::kern::mmq {

constexpr int kN = MMQ_N, kK = MMQ_K, kG = MMQ_GROUP, kTM = MMQ_TM, kTN = MMQ_TN;
constexpr int kBK = static_cast<int>(kMmqBK);
constexpr int kKB = kBK / 32;               // activation blocks per stage
constexpr int kGS = kBK / kG;               // weight groups per stage
constexpr int kLD = kBK + 16;               // padded smem row (bytes)
constexpr int kWM = kTM / 32;               // warps along M
constexpr int kWN = 8 / kWM;                // warps along N
constexpr int kNI = kTN / kWN / 8;          // n8 tiles per warp
constexpr int kMI = 2;                      // m16 tiles per warp
constexpr int kKT = (kK + kBK - 1) / kBK;   // stages
constexpr int kGroupsPerRow = kK / kG;
constexpr int kBlocksPerRow = kK / 32;
static_assert(kK % 32 == 0, "MMQ_K must be a multiple of 32");
static_assert(kG == 16 || kG == 32, "MMQ_GROUP must be 16 or 32");
static_assert(kTM == 32 || kTM == 64 || kTM == 128 || kTM == 256, "MMQ_TM");
static_assert(kNI >= 1 && kTN % (kWN * 8) == 0, "MMQ_TN must be a multiple of 8 x warps along N");
static_assert(MMQ_Q_PITCH % 16 == 0, "kI8 rows must be 16-byte aligned");

struct Stage {
  alignas(16) int8_t a[kTM * kLD];
  alignas(16) int8_t b[kTN * kLD];
  float s[kTM * kGS];
#if MMQ_HAS_MIN
  float m[kTM * kGS];
#endif
  Q8Meta x[kTN * kKB];
};

__device__ __forceinline__ void loadStage(Stage& st, int kt, int m0, int n0, int n_tokens, const int8_t* wq,
                                          const float* wscale, const float* wmin, const int8_t* xq,
                                          const Q8Meta* xmeta) {
  const int k0 = kt * kBK;
  constexpr int kChunksPerRow = kBK / 16;
  // Weights: TM rows × BK bytes in 16-byte chunks.
  for (int c = threadIdx.x; c < kTM * kChunksPerRow; c += kMmqThreads) {
    const int row = c / kChunksPerRow, col = (c % kChunksPerRow) * 16;
    const bool ok = (m0 + row < kN) && (k0 + col < kK);
    const int8_t* src = ok ? wq + static_cast<uint64_t>(m0 + row) * MMQ_Q_PITCH + k0 + col : wq;
    cpAsync<16>(st.a + row * kLD + col, src, ok);
  }
  // Activations: TN tokens × BK bytes.
  for (int c = threadIdx.x; c < kTN * kChunksPerRow; c += kMmqThreads) {
    const int tok = c / kChunksPerRow, col = (c % kChunksPerRow) * 16;
    const bool ok = (n0 + tok < n_tokens) && (k0 + col < kK);
    const int8_t* src = ok ? xq + static_cast<uint64_t>(n0 + tok) * kK + k0 + col : xq;
    cpAsync<16>(st.b + tok * kLD + col, src, ok);
  }
  // Group scales (and mins): TM rows × BK/G floats.
  for (int e = threadIdx.x; e < kTM * kGS; e += kMmqThreads) {
    const int row = e / kGS, g = k0 / kG + e % kGS;
    const bool ok = (m0 + row < kN) && (g < kGroupsPerRow);
    const uint64_t off = static_cast<uint64_t>(m0 + row) * (MMQ_S_PITCH / 4) + g;
    cpAsync<4>(st.s + e, ok ? wscale + off : wscale, ok);
#if MMQ_HAS_MIN
    const uint64_t moff = static_cast<uint64_t>(m0 + row) * (MMQ_M_PITCH / 4) + g;
    cpAsync<4>(st.m + e, ok ? wmin + moff : wmin, ok);
#endif
  }
  // Activation block scales and sums: TN tokens × BK/32.
  for (int e = threadIdx.x; e < kTN * kKB; e += kMmqThreads) {
    const int tok = e / kKB, b = k0 / 32 + e % kKB;
    const bool ok = (n0 + tok < n_tokens) && (b < kBlocksPerRow);
    const Q8Meta* src = ok ? xmeta + static_cast<uint64_t>(n0 + tok) * kBlocksPerRow + b : xmeta;
    cpAsync<8>(st.x + e, src, ok);
  }
}

}  // namespace minfer::kern::mmq

extern "C" __global__ void __launch_bounds__(minfer::kern::kMmqThreads)
    minfer_mmq(const int8_t* __restrict__ wq, const float* __restrict__ wscale, const float* __restrict__ wmin,
               const float* __restrict__ bias, const int8_t* __restrict__ xq,
               const minfer::kern::Q8Meta* __restrict__ xmeta, float* __restrict__ out, int n_tokens) {
  using namespace minfer::kern;
  using namespace minfer::kern::mmq;
  __shared__ Stage stages[2];

  const int m0 = blockIdx.x * kTM, n0 = blockIdx.y * kTN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int wm0 = (warp % kWM) * 32;          // warp's first row inside the tile
  const int wn0 = (warp / kWM) * (kTN / kWN);  // warp's first token inside the tile

  float acc[kMI][kNI][4];
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

  loadStage(stages[0], 0, m0, n0, n_tokens, wq, wscale, wmin, xq, xmeta);
  cpAsyncCommit();

  for (int kt = 0; kt < kKT; ++kt) {
    if (kt + 1 < kKT) loadStage(stages[(kt + 1) & 1], kt + 1, m0, n0, n_tokens, wq, wscale, wmin, xq, xmeta);
    cpAsyncCommit();
    cpAsyncWait<1>();
    __syncthreads();
    const Stage& st = stages[kt & 1];

#pragma unroll
    for (int kb = 0; kb < kKB; ++kb) {
      // Activation scale d and d·Σq per token of this thread's C fragments (cols 2t, 2t+1 of each n8).
      float xd[kNI][2], xs_lo[kNI][2], xs_hi[kNI][2];
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const Q8Meta mt = st.x[(wn0 + ni * 8 + 2 * t + j) * kKB + kb];
          xd[ni][j] = mt.d;
          xs_lo[ni][j] = mt.d * static_cast<float>(mt.sum_lo);
          xs_hi[ni][j] = mt.d * static_cast<float>(mt.sum_hi);
        }
      (void)xs_lo;  // used by the min term only
      (void)xs_hi;
#pragma unroll
      for (int h = 0; h < 32 / kG; ++h) {  // weight groups inside this activation block
        const int kofs = kb * 32 + h * kG;  // byte offset of the group inside the stage row
        const int gi = kb * (32 / kG) + h;  // group index inside the stage
        int bfr[kNI][2];
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) {
          const int8_t* p = st.b + (wn0 + ni * 8 + g) * kLD + kofs + 4 * t;
          bfr[ni][0] = *reinterpret_cast<const int*>(p);
          bfr[ni][1] = kG == 32 ? *reinterpret_cast<const int*>(p + 16) : 0;
        }
#pragma unroll
        for (int mi = 0; mi < kMI; ++mi) {
          const int r0 = wm0 + mi * 16 + g;  // rows r0 and r0 + 8 of the tile
          const int8_t* p0 = st.a + r0 * kLD + kofs + 4 * t;
          const int8_t* p1 = p0 + 8 * kLD;
          int afr[4];
          afr[0] = *reinterpret_cast<const int*>(p0);
          afr[1] = *reinterpret_cast<const int*>(p1);
          afr[2] = kG == 32 ? *reinterpret_cast<const int*>(p0 + 16) : 0;
          afr[3] = kG == 32 ? *reinterpret_cast<const int*>(p1 + 16) : 0;
          const float sc[2] = {st.s[r0 * kGS + gi], st.s[(r0 + 8) * kGS + gi]};
#if MMQ_HAS_MIN
          const float mn[2] = {st.m[r0 * kGS + gi], st.m[(r0 + 8) * kGS + gi]};
#endif
#pragma unroll
          for (int ni = 0; ni < kNI; ++ni) {
            int c[4];
            if (kG == 32)
              mmaS8K32(c, afr, bfr[ni]);
            else
              mmaS8K16(c, afr, bfr[ni][0]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int ri = e / 2, j = e % 2;
              float v = acc[mi][ni][e];
              v = fmaf(static_cast<float>(c[e]), sc[ri] * xd[ni][j], v);
#if MMQ_HAS_MIN
              const float xs = kG == 32 ? xs_lo[ni][j] + xs_hi[ni][j] : (h == 0 ? xs_lo[ni][j] : xs_hi[ni][j]);
              v = fmaf(mn[ri], xs, v);
#endif
              acc[mi][ni][e] = v;
            }
          }
        }
      }
    }
    __syncthreads();
  }

  // Epilogue: f32 (+ bias) to out[token][row].
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = m0 + wm0 + mi * 16 + g + (e / 2) * 8;
        const int tok = n0 + wn0 + ni * 8 + 2 * t + (e % 2);
        if (row < kN && tok < n_tokens) {
          float v = acc[mi][ni][e];
#if MMQ_HAS_BIAS
          v += bias[row];
#endif
          out[static_cast<uint64_t>(tok) * kN + row] = v;
        }
      }
}
#endif
