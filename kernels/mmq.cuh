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
// in stages of BK = 64 (two activation blocks) through a kMmqStages-deep cp.async pipeline in dynamic
// shared memory (16-byte copies of the kI8 and qs rows; one barrier per stage). Fragments come from
// ldmatrix.x4 (one per m16 tile and per pair of n8 tiles for each 32 of K), rows padded to BK + 16
// bytes so that its eight 16-byte row reads hit distinct banks.
// Per activation block the int32 MMA result of each group is scaled into the f32 accumulators:
// groups of 32 use mma.m16n8k32, groups of 16 two mma.m16n8k16 (one per group). This per-element
// epilogue (convert, scale product, FMA, and the min term's FMA, per 32 of K) is the floor of the
// instruction count: ~18 of the ~31 instructions per MMA in the 7B's ffn_gate (ncu source counters,
// BENCHMARKS.md). Replacing the I2F conversion by an integer-add/float-subtract trick measured slower.
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
// Launch shape: mmqLaunch(): grid (⌈N/TM⌉, ⌈n_tokens/TN⌉), 256 threads, mmqSmemBytes() of dynamic
// shared memory (the runtime sets the opt-in attribute above 48 KiB).
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kMmqThreads = 256;
constexpr unsigned kMmqBK = 64;
// cp.async pipeline depth (stages in flight + the one computed). MMQ_STAGES overrides it for the
// variant benchmark only (bench/mmq_variants.cu), where host and device code see the same define.
#ifndef MMQ_STAGES
#define MMQ_STAGES 4
#endif
constexpr unsigned kMmqStages = MMQ_STAGES;

// Bytes of one pipeline stage in shared memory (the device code's layout, in this order, each part a
// multiple of 16 bytes): weights TM × (BK + 16) int8 (rows padded so that ldmatrix is conflict-free),
// activations TN × (BK + 16) int8, scales TM × BK/G f32, mins likewise (has_min), Q8Meta BK/32 × TN.
MINFER_HD constexpr unsigned mmqStageBytes(unsigned tm, unsigned tn, unsigned group, bool has_min) {
  const unsigned ld = kMmqBK + 16, groups = kMmqBK / group;
  return tm * ld + tn * ld + tm * groups * 4 * (has_min ? 2 : 1) + (kMmqBK / 32) * tn * 8;
}
// Dynamic shared memory of one thread block (more than 48 KiB needs the opt-in attribute).
MINFER_HD constexpr unsigned mmqSmemBytes(unsigned tm, unsigned tn, unsigned group, bool has_min) {
  return kMmqStages * mmqStageBytes(tm, tn, group, has_min);
}

MINFER_HD LaunchRule mmqLaunchRule(unsigned n, unsigned tm, unsigned tn, unsigned group, bool has_min) {
  LaunchRule r;
  r.grid[0] = fixedExtent(ceilDiv(n, tm));
  r.grid[1] = perToken(1, tn);
  r.block.x = kMmqThreads;
  r.smem = mmqSmemBytes(tm, tn, group, has_min);
  return r;
}
MINFER_HD LaunchShape mmqLaunch(unsigned n, unsigned n_tokens, unsigned tm, unsigned tn, unsigned group, bool has_min) {
  return mmqLaunchRule(n, tm, tn, group, has_min).at(n_tokens);
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

// kChunksPerRow 16-byte chunks per stage row; kIters(n) copies per thread for n items (compile time).
constexpr int kChunksPerRow = kBK / 16;
MINFER_HD constexpr int iters(int items) { return (items + static_cast<int>(kMmqThreads) - 1) / static_cast<int>(kMmqThreads); }
constexpr bool kFullStages = kK % kBK == 0;  // no stage reaches past K: no column bounds checks

constexpr int kStageBytes = static_cast<int>(mmqStageBytes(kTM, kTN, kG, MMQ_HAS_MIN != 0));

// One stage inside the dynamic shared memory (layout of mmqStageBytes).
struct Stage {
  int8_t* a;   // [TM][kLD]
  int8_t* b;   // [TN][kLD]
  float* s;    // [TM][kGS]
  float* m;    // [TM][kGS] (MMQ_HAS_MIN)
  Q8Meta* x;   // [BK/32][TN]: a thread's tokens 2t, 2t+1 are adjacent
};
__device__ __forceinline__ Stage stageAt(uint8_t* smem, int i) {
  uint8_t* p = smem + i * kStageBytes;
  Stage st;
  st.a = reinterpret_cast<int8_t*>(p);
  p += kTM * kLD;
  st.b = reinterpret_cast<int8_t*>(p);
  p += kTN * kLD;
  st.s = reinterpret_cast<float*>(p);
  p += kTM * kGS * 4;
  st.m = reinterpret_cast<float*>(p);
  p += MMQ_HAS_MIN ? kTM * kGS * 4 : 0;
  st.x = reinterpret_cast<Q8Meta*>(p);
  return st;
}

// Issues the cp.async copies of stage kt. Every loop has a compile-time trip count (unrolled); the
// row and token bounds depend only on the block, the column bounds only on kt when K % BK != 0.
__device__ __forceinline__ void loadStage(const Stage& st, int kt, int m0, int n0, int n_tokens, const int8_t* wq,
                                          const float* wscale, const float* wmin, const int8_t* xq,
                                          const Q8Meta* xmeta) {
  const int k0 = kt * kBK;
  // Weights: TM rows × BK bytes in 16-byte chunks.
#pragma unroll
  for (int i = 0; i < iters(kTM * kChunksPerRow); ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * static_cast<int>(kMmqThreads);
    if ((kTM * kChunksPerRow) % kMmqThreads != 0 && c >= kTM * kChunksPerRow) break;
    const int row = c / kChunksPerRow, col = (c % kChunksPerRow) * 16;
    const bool ok = (m0 + row < kN) && (kFullStages || k0 + col < kK);
    const int8_t* src = ok ? wq + static_cast<uint64_t>(m0 + row) * MMQ_Q_PITCH + k0 + col : wq;
    cpAsync<16>(st.a + row * kLD + col, src, ok);
  }
  // Activations: TN tokens × BK bytes.
#pragma unroll
  for (int i = 0; i < iters(kTN * kChunksPerRow); ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * static_cast<int>(kMmqThreads);
    if ((kTN * kChunksPerRow) % kMmqThreads != 0 && c >= kTN * kChunksPerRow) break;
    const int tok = c / kChunksPerRow, col = (c % kChunksPerRow) * 16;
    const bool ok = (n0 + tok < n_tokens) && (kFullStages || k0 + col < kK);
    const int8_t* src = ok ? xq + static_cast<uint64_t>(n0 + tok) * kK + k0 + col : xq;
    cpAsync<16>(st.b + tok * kLD + col, src, ok);
  }
  // Group scales (and mins): TM rows × BK/G floats.
#pragma unroll
  for (int i = 0; i < iters(kTM * kGS); ++i) {
    const int e = static_cast<int>(threadIdx.x) + i * static_cast<int>(kMmqThreads);
    if ((kTM * kGS) % kMmqThreads != 0 && e >= kTM * kGS) break;
    const int row = e / kGS, g = k0 / kG + e % kGS;
    const bool ok = (m0 + row < kN) && (kFullStages || g < kGroupsPerRow);
    const uint64_t off = static_cast<uint64_t>(m0 + row) * (MMQ_S_PITCH / 4) + g;
    cpAsync<4>(st.s + e, ok ? wscale + off : wscale, ok);
#if MMQ_HAS_MIN
    const uint64_t moff = static_cast<uint64_t>(m0 + row) * (MMQ_M_PITCH / 4) + g;
    cpAsync<4>(st.m + e, ok ? wmin + moff : wmin, ok);
#endif
  }
  // Activation block scales and sums: BK/32 blocks × TN tokens.
#pragma unroll
  for (int i = 0; i < iters(kTN * kKB); ++i) {
    const int e = static_cast<int>(threadIdx.x) + i * static_cast<int>(kMmqThreads);
    if ((kTN * kKB) % kMmqThreads != 0 && e >= kTN * kKB) break;
    const int tok = e % kTN, kb = e / kTN, b = k0 / 32 + kb;
    const bool ok = (n0 + tok < n_tokens) && (kFullStages || b < kBlocksPerRow);
    const Q8Meta* src = ok ? xmeta + static_cast<uint64_t>(n0 + tok) * kBlocksPerRow + b : xmeta;
    cpAsync<8>(st.x + e, src, ok);
  }
}

}  // namespace minfer::kern::mmq

extern "C" __global__ void __launch_bounds__(minfer::kern::kMmqThreads, 2)
    minfer_mmq(const int8_t* __restrict__ wq, const float* __restrict__ wscale, const float* __restrict__ wmin,
               const float* __restrict__ bias, const int8_t* __restrict__ xq,
               const minfer::kern::Q8Meta* __restrict__ xmeta, float* __restrict__ out, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  using namespace minfer::kern::mmq;
  extern __shared__ __align__(16) uint8_t smem[];

  const int m0 = blockIdx.x * kTM, n0 = blockIdx.y * kTN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int wm0 = (warp % kWM) * 32;          // warp's first row inside the tile
  const int wn0 = (warp / kWM) * (kTN / kWN);  // warp's first token inside the tile
  // ldmatrix row addresses (bytes inside a stage row block), lane l → matrix q = l / 8, row l % 8:
  //   A (per m16 tile): q = 0..3 → rows +0/+8 (q % 2), k bytes +0/+16 (q / 2): fragments a0..a3.
  //   B (per pair of n8 tiles): q = 0..3 → tile +0/+1 (q / 2), k bytes +0/+16 (q % 2): b0, b1 of each.
  const int q = lane / 8, r8 = lane % 8;
  const int a_off = (wm0 + (q % 2) * 8 + r8) * kLD + (q / 2) * 16;
  const int b_off = (wn0 + (q / 2) * 8 + r8) * kLD + (q % 2) * 16;

  float acc[kMI][kNI][4];
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

  // Pipeline: stages 0..S-2 in flight before the loop; iteration kt waits for stage kt, then (after the
  // barrier that also ends everyone's reads of stage kt-1) refills that buffer with stage kt+S-1.
  constexpr int kS = static_cast<int>(kMmqStages);
#pragma unroll
  for (int i = 0; i < kS - 1; ++i) {
    if (i < kKT) loadStage(stageAt(smem, i), i, m0, n0, n_tokens, wq, wscale, wmin, xq, xmeta);
    cpAsyncCommit();
  }

  for (int kt = 0; kt < kKT; ++kt) {
    cpAsyncWait<kS - 2>();
    __syncthreads();
    const int next = kt + kS - 1;
    if (next < kKT) loadStage(stageAt(smem, next % kS), next, m0, n0, n_tokens, wq, wscale, wmin, xq, xmeta);
    cpAsyncCommit();
    const Stage st = stageAt(smem, kt % kS);

#pragma unroll
    for (int kb = 0; kb < kKB; ++kb) {
      // Fragments of this activation block's 32 k: for groups of 16, elements 0..1 (A) and 0 (B)
      // hold the first group and 2..3 / 1 the second, which is the m16n8k16 layout of each half.
      int afr[kMI][4], bfr[kNI][2];
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) ldmatrixX4(afr[mi], st.a + a_off + mi * 16 * kLD + kb * 32);
#pragma unroll
      for (int ni = 0; ni + 1 < kNI; ni += 2) {
        int r[4];
        ldmatrixX4(r, st.b + b_off + ni * 8 * kLD + kb * 32);
        bfr[ni][0] = r[0];
        bfr[ni][1] = r[1];
        bfr[ni + 1][0] = r[2];
        bfr[ni + 1][1] = r[3];
      }
      if (kNI % 2 == 1) {  // last n8 tile alone: lanes 0..15 give its rows (x2 reads matrices 0 and 1)
        ldmatrixX2(bfr[kNI - 1], st.b + b_off - (q / 2) * 8 * kLD + (kNI - 1) * 8 * kLD + kb * 32);
      }
      // Activation scale d and d·Σq per token of this thread's C fragments (cols 2t, 2t+1 of each n8):
      // the two tokens' Q8Meta are adjacent (one 16-byte load).
      float xd[kNI][2], xs[kNI][2][32 / kG];
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
        const uint4 raw = *reinterpret_cast<const uint4*>(st.x + kb * kTN + wn0 + ni * 8 + 2 * t);
        const Q8Meta mt[2] = {*reinterpret_cast<const Q8Meta*>(&raw.x), *reinterpret_cast<const Q8Meta*>(&raw.z)};
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          xd[ni][j] = mt[j].d;
          if (kG == 32) {
            xs[ni][j][0] = mt[j].d * static_cast<float>(mt[j].sum_lo + mt[j].sum_hi);
          } else {
            xs[ni][j][0] = mt[j].d * static_cast<float>(mt[j].sum_lo);
            xs[ni][j][32 / kG - 1] = mt[j].d * static_cast<float>(mt[j].sum_hi);
          }
        }
      }
      (void)xs;  // used by the min term only
#pragma unroll
      for (int h = 0; h < 32 / kG; ++h) {  // weight groups inside this activation block
        const int gi = kb * (32 / kG) + h;  // group index inside the stage
#pragma unroll
        for (int mi = 0; mi < kMI; ++mi) {
          const int r0 = wm0 + mi * 16 + g;  // rows r0 and r0 + 8 of the tile
          const float sc[2] = {st.s[r0 * kGS + gi], st.s[(r0 + 8) * kGS + gi]};
#if MMQ_HAS_MIN
          const float mn[2] = {st.m[r0 * kGS + gi], st.m[(r0 + 8) * kGS + gi]};
#endif
#pragma unroll
          for (int ni = 0; ni < kNI; ++ni) {
            int c[4];
            if (kG == 32) {
              mmaS8K32(c, afr[mi], bfr[ni]);
            } else {
              const int a2[2] = {afr[mi][2 * h], afr[mi][2 * h + 1]};
              mmaS8K16(c, a2, bfr[ni][h]);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int ri = e / 2, j = e % 2;
              float v = acc[mi][ni][e];
              v = fmaf(static_cast<float>(c[e]), sc[ri] * xd[ni][j], v);
#if MMQ_HAS_MIN
              v = fmaf(mn[ri], xs[ni][j][h], v);
#endif
              acc[mi][ni][e] = v;
            }
          }
        }
      }
    }
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
