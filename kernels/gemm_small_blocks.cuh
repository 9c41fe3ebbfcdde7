// Small-batch matmul on the GGUF blocks (OpKind MatMul, 1 ≤ n_tokens ≤ kGemmSmallMaxRows): the rows of a batched
// decode step through int8 tensor-core MMA, reading each byte of the kBlocks plane (Q4_K or Q6_K, as
// gemv_blocks.cuh reads it) once per call for all rows. The small-batch form of the steps whose weights have no
// kI8 plane (Hopper images keep only kBlocks and the kF16 prefill plane of the K-quants).
//
//   out[t][r] = Σ_g [ s(r,g) · d(t,b) · Σ_{c∈g} q(r,c)·xq(t,c)  +  m(r,g) · d(t,b) · Σ_{c∈g} xq(t,c) ] (+ bias[r])
// gemm_small.cuh's and gemv_blocks.cuh's definition with block_formats.h's decomposed values (Q4_K groups of 32,
// s = d·sc, m = −(dmin·m), q = 0..15; Q6_K groups of 16, s = d·sc, q = 6-bit − 32, no m), so the three agree up
// to the f32 summation order. Per (row, group, token) the f32 work is one conversion, one product and one (Q6_K)
// or two (Q4_K: the min) FMAs: acc += s·(d·Σq·x) [+ m·(d·Σx)].
//
// Operands as gemm_small.cuh: the weights are MMA's A operand (m16 = 16 rows), the tokens its B operand (n8 =
// 8 tokens), so one weight fragment serves every token of the call. Fragments straight from the block bytes,
// lane (g, t) = (lane / 4, lane % 4), rows g and g + 8 of an m16 tile:
//   Q4_K: sub-blocks 2j and 2j+1 (activation blocks 8b + 2j, + 1) are the low and high nibbles of qs[32j, +32):
//         lane t loads qs[32j + 8t, +8) of both rows (one 8-byte load each) and takes bytes 8t..8t+3 as the k32
//         fragment's k 4t..4t+3 and 8t+4.. as k 16+4t.. (a permutation of k that A and B share: B loads the
//         activations' bytes 8t..8t+7 of the block); one mma.m16n8k32 per sub-block. Scales and mins from the
//         block head (d, dmin, 12 packed 6-bit bytes: one 16-byte load per row, shared by the quad).
//   Q6_K: groups of 16, one mma.m16n8k16 each (k 4t..4t+3 of the group): weight 128n + 32k + 16h + 4t + i from
//         ql[64n + 32(k&1) + 16h + 4t + i] (nibble k >> 1) and qh[32n + 16h + 4t + i] (bit pair k), 4-byte loads;
//         q − 32 ∈ [−32, 31] formed in the A bytes (so the offset needs no Σx); the 16 int8 scales (one 16-byte
//         load) and d per row.
//
// Work split: a warp owns 16·SBB_MT output features (SBB_MT m16 tiles, each B fragment serving them all) ×
// every token of the call (up to 8 n8 tiles, one instantiation: tiles past the call's tokens are skipped by a
// warp-uniform branch, so the image holds one main loop); a block of kSbbWarps warps owns kSbbRowsPerBlock
// consecutive features and the super-blocks of its K split (gridDim.y = SBB_SPLITS, gemmSmallBlocksSplits), so
// that N = 512 or 3584 still fill 132 SMs. With SBB_SPLITS > 1 the splits are combined by gemm_small.cuh's
// splitKCombine (partial sums in split order, deterministic; ArgKind Counters). Activations and Q8Meta are read
// per fragment from L1 (8 tokens × 8 or 4 bytes per load), shared by the block's warps there.
// Cost: one pass over the plane (every block byte by one load; the quad's loads cover 32 or 16 contiguous bytes
// of a row); each warp keeps SBB_PREFETCH super-blocks of its rows on their way into L2 ahead of its loads (bulk
// prefetch, the first before overlapPrologue), so the loads wait on L2, not HBM, without the warp holding more
// than one super-block in registers. Activations: n·K + n·K/32·8 bytes per block, from L2 and L1. Registers
// (ptxas, sm_90, SBB_MT 2): 168 Q4_K, 208 Q6_K, no spills. Not yet measured on a GPU (bench/gemm_small_bench.cu
// with SBB_* constants, scripts/device-gemm-small-blocks.sh).
//
// Compile-time constants (-D):
//   SBB_N, SBB_K            weight rows and cols (K % 256 == 0)
//   SBB_TYPE                12 (Q4_K) or 14 (Q6_K): the plane's ggml_type
//   SBB_PITCH               the kBlocks plane's row pitch (bytes, multiple of 16)
//   SBB_GROUP_PITCH         bytes from one block to the next (multiple of 16, ≥ the block)
//   SBB_HAS_BIAS            bias vector (N f32)
//   SBB_SPLITS              K splits (gemmSmallBlocksSplits), 1..kSbMaxSplits, ≤ K / 256
// Launch ABI:  minfer_gemm_small_blocks(const uint8_t* w, const float* bias, const int8_t* xq, const Q8Meta* xmeta,
//                                       float* out, float* partial, unsigned* counters, int n_tokens)
//   w: the kBlocks plane; xq, xmeta: the q8 input buffer (width K); out: n_tokens × N f32 (row stride N);
//   partial: scratch of gemmSmallScratchBytes(N, SBB_SPLITS) (unused with one split); counters:
//   gemmSmallBlocksCounterBytes(N) (ArgKind Counters: zero on entry, zero again on exit); 1 ≤ n_tokens ≤ 64.
// Launch shape: gemmSmallBlocksLaunchRule(): grid (⌈N / kSbbRowsPerBlock⌉, SBB_SPLITS), kSbbWarps warps, no
// shared memory but the epilogue's flag; independent of n_tokens.
// SBB_MT, SBB_PREFETCH, SBB_MIN_BLOCKS: variant overrides for bench/gemm_small_bench.cu only.
#pragma once

#include "kernels/gemm_small.cuh"

namespace minfer::kern {

// Calls the compiler gives it (Step.small_rows = min(these, max_batch)): the crossovers against what the step runs
// otherwise, the Hopper f16 prefill GEMM (wgmma_matmul.cuh, a weight with a kF16 plane) or mmq.cuh. Measured on
// the H200 (minfer-bench --parallel, 7B Q4_K_M, sm_90a, `618fa43`): with every call of 2 … 64 rows on this kernel,
// aggregate decode 906 t/s at 8 sequences (764 on wgmma), 1,642 at 32 (2,770) and 1,912 at 64 (4,856): its time
// grows with the rows (the per-element scale work), so it takes calls of up to 8 rows.
constexpr unsigned kGemmSmallBlocksRowsVsWgmma = 8;
constexpr unsigned kGemmSmallBlocksRowsVsMmq = 8;
constexpr unsigned kSbbWarps = 4;
#ifndef SBB_MT  // benchmark override only (host and device see the same value): m16 tiles per warp
#define SBB_MT 2
#endif
constexpr unsigned kSbbRowsPerBlock = kSbbWarps * 16 * SBB_MT;
// Blocks a launch aims for (split-K up to it): ~2 per SM of a 132-SM H100/H200; each split writes n·N f32 of
// partial sums, so fewer splits than gemm_small's.
constexpr unsigned kSbbTargetBlocks = 264;

// K splits for an N × K weight: ⌈kSbbTargetBlocks / row blocks⌉, at most kSbMaxSplits and at most K / 256 (one
// super-block per split; at least 1), then as few as keep the longest split's super-blocks (the time of the
// launch): 14 super-blocks over 10 splits take 2 in the longest, as over 7, which write fewer partial sums.
MINFER_HD unsigned gemmSmallBlocksSplits(unsigned n, unsigned k) {
  const unsigned row_blocks = ceilDiv(n, kSbbRowsPerBlock), super_blocks = k / 256;
  unsigned s = ceilDiv(kSbbTargetBlocks, row_blocks);
  if (s > kSbMaxSplits) s = kSbMaxSplits;
  if (s > super_blocks) s = super_blocks;
  if (s == 0) return 1;
  return ceilDiv(super_blocks, ceilDiv(super_blocks, s));
}
// Bytes of the block counters: one word per row group. The partial sums: gemmSmallScratchBytes(n, splits).
MINFER_HD unsigned long long gemmSmallBlocksCounterBytes(unsigned n) { return splitKCounterBytes(n, kSbbRowsPerBlock); }
MINFER_HD LaunchRule gemmSmallBlocksLaunchRule(unsigned n, unsigned splits) {
  return splitKLaunchRule(n, splits, kSbbRowsPerBlock, kSbbWarps);
}
MINFER_HD LaunchShape gemmSmallBlocksLaunch(unsigned n, unsigned splits) {
  return gemmSmallBlocksLaunchRule(n, splits).at(1);
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(SBB_N)
namespace minfer::kern::gemm_small_blocks {

constexpr int kN = SBB_N, kK = SBB_K, kSplits = SBB_SPLITS, kMT = SBB_MT;
constexpr int kSuper = kK / 256;  // super-blocks per row
constexpr int kActBlocks = kK / 32;
constexpr bool kQ4K = SBB_TYPE == 12;
constexpr int kNT = static_cast<int>(kGemmSmallMaxRows) / 8;  // n8 tiles of the largest call
#ifndef SBB_PREFETCH  // benchmark override only: super-blocks of L2 prefetch ahead of the loads (0: none)
#define SBB_PREFETCH 2
#endif
constexpr int kLookahead = SBB_PREFETCH;
static_assert(kK % 256 == 0, "SBB_K must be a multiple of 256");
static_assert(SBB_TYPE == 12 || SBB_TYPE == 14, "SBB_TYPE must be Q4_K (12) or Q6_K (14)");
static_assert(SBB_PITCH % 16 == 0 && SBB_GROUP_PITCH % 16 == 0, "blocks must start 16-byte aligned");
static_assert(SBB_GROUP_PITCH >= (kQ4K ? 144 : 210), "group pitch smaller than the block");
static_assert(SBB_PITCH >= static_cast<unsigned long long>(kSuper) * SBB_GROUP_PITCH, "row pitch smaller than a row of blocks");
static_assert(kSplits >= 1 && kSplits <= static_cast<int>(kSbMaxSplits) && kSplits <= kSuper, "SBB_SPLITS out of range");
static_assert(kMT >= 1 && kMT <= 4, "SBB_MT: 1 … 4");

// One lane's bytes of one super-block of one row (rows g and g + 8 of each m16 tile: [2·m + 0/1]).
struct RowBytes {
  uint4 head;  // Q4_K: d, dmin, the 12 scale/min bytes;  Q6_K: the 16 int8 scales
  unsigned q[12];  // Q4_K: qs[32j + 8t, +8) as words 2j, 2j+1 (j < 4);  Q6_K: ql words 4n + 2c + h, qh words 8 + 2n + h
  uint16_t d;  // Q6_K: d
};

__device__ __forceinline__ RowBytes loadRow(const uint8_t* blk, int t) {
  RowBytes w;
  if (kQ4K) {
    w.head = *reinterpret_cast<const uint4*>(blk);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint2 v = *reinterpret_cast<const uint2*>(blk + 16 + 32 * j + 8 * t);
      w.q[2 * j] = v.x;
      w.q[2 * j + 1] = v.y;
    }
    w.d = 0;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)  // i = 4n + 2c + h
      w.q[i] = *reinterpret_cast<const unsigned*>(blk + 64 * (i >> 2) + 32 * ((i >> 1) & 1) + 16 * (i & 1) + 4 * t);
#pragma unroll
    for (int i = 0; i < 4; ++i)  // i = 2n + h
      w.q[8 + i] = *reinterpret_cast<const unsigned*>(blk + 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * t);
    w.head = *reinterpret_cast<const uint4*>(blk + 192);
    w.d = *reinterpret_cast<const uint16_t*>(blk + 208);
  }
  return w;
}

// Q6_K: the A word of group (n, k, h): four 6-bit q − 32 as int8 (q ^ 32 is q − 32 in 6-bit two's complement;
// its bit 5 copied into bits 6, 7 sign-extends it, v + 6·(v & 32) with no carry between bytes).
__device__ __forceinline__ int q6Word(const RowBytes& w, int n, int k, int h) {
  const unsigned lo = (w.q[4 * n + 2 * (k & 1) + h] >> (4 * (k >> 1))) & 0x0F0F0F0Fu;
  const unsigned hi = (w.q[8 + 2 * n + h] >> (2 * k)) & 0x03030303u;
  const unsigned v = (lo | (hi << 4)) ^ 0x20202020u;
  return static_cast<int>(v | ((v & 0x20202020u) * 6u));
}
// Q6_K: the scale s = d·sc of group 8n + 2k + h (signed int8 scales, byte i of the 16 at head).
__device__ __forceinline__ float q6Scale(const RowBytes& w, float d, int i) {
  const unsigned word = i < 4 ? w.head.x : i < 8 ? w.head.y : i < 12 ? w.head.z : w.head.w;
  return d * static_cast<float>(static_cast<signed char>((word >> (8 * (i % 4))) & 0xFF));
}
// Q4_K: sub-block sb's scale d·sc and negated min −dmin·m (block_formats.h kScaleMin's 6-bit pairs, unpacked as
// gemv_blocks.cuh does).
__device__ __forceinline__ void q4Scale(const RowBytes& w, int sb, float& s, float& nm) {
  const uint4 h = w.head;
  const unsigned sw = sb < 4 ? h.y & 0x3F3F3F3Fu : (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
  const unsigned mw = sb < 4 ? h.z & 0x3F3F3F3Fu : ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
  const int sh = 8 * (sb % 4);
  s = h2f(static_cast<uint16_t>(h.x)) * static_cast<float>((sw >> sh) & 0xFF);
  nm = -(h2f(static_cast<uint16_t>(h.x >> 16)) * static_cast<float>((mw >> sh) & 0xFF));
}

// acc[m][j][e] (m16 tile m, n8 tile j; e = 0, 1: row g, tokens 8j + 2t, + 1; e = 2, 3: row g + 8) += the products
// of super-block sbk of the lane's rows `w` with the activations (tiles j < ntiles).
__device__ __forceinline__ void superBlock(float (&acc)[kMT][kNT][4], const RowBytes (&w)[kMT][2], int sbk,
                                           const int8_t* xq, const Q8Meta* xmeta, int n_tokens, int ntiles, int g,
                                           int t) {
  if (kQ4K) {
#pragma unroll
    for (int sb = 0; sb < 8; ++sb) {  // sub-block = activation block 8·sbk + sb
      int a[kMT][4];
      float s[kMT][2], nm[kMT][2];
      const int j4 = sb >> 1, shift = 4 * (sb & 1);
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
        a[m][0] = static_cast<int>((w[m][0].q[2 * j4] >> shift) & 0x0F0F0F0Fu);
        a[m][1] = static_cast<int>((w[m][1].q[2 * j4] >> shift) & 0x0F0F0F0Fu);
        a[m][2] = static_cast<int>((w[m][0].q[2 * j4 + 1] >> shift) & 0x0F0F0F0Fu);
        a[m][3] = static_cast<int>((w[m][1].q[2 * j4 + 1] >> shift) & 0x0F0F0F0Fu);
        q4Scale(w[m][0], sb, s[m][0], nm[m][0]);
        q4Scale(w[m][1], sb, s[m][1], nm[m][1]);
      }
      const int ab = 8 * sbk + sb;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        if (j >= ntiles) break;  // warp-uniform
        const int tb = min(8 * j + g, n_tokens - 1);  // B column: token 8j + g (clamped; never stored)
        const int2 xv = *reinterpret_cast<const int2*>(xq + static_cast<uint64_t>(tb) * kK + 32 * ab + 8 * t);
        const int bf[2] = {xv.x, xv.y};
        float dx[2], dxs[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          // One 8-byte load of Q8Meta {d, sum_lo | sum_hi << 16} (8-byte aligned in the q8 buffer).
          const int2 mt = *reinterpret_cast<const int2*>(
              xmeta + static_cast<uint64_t>(min(8 * j + 2 * t + c, n_tokens - 1)) * kActBlocks + ab);
          dx[c] = __int_as_float(mt.x);
          dxs[c] = dx[c] * static_cast<float>(static_cast<short>(mt.y & 0xFFFF) + (mt.y >> 16));
        }
#pragma unroll
        for (int m = 0; m < kMT; ++m) {
          int d[4];
          mmaS8K32(d, a[m], bf);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float v = fmaf(s[m][e / 2], dx[e % 2] * static_cast<float>(d[e]), acc[m][j][e]);
            acc[m][j][e] = fmaf(nm[m][e / 2], dxs[e % 2], v);
          }
        }
      }
    }
  } else {
    float dw[kMT][2];
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) dw[m][r] = h2f(w[m][r].d);
#pragma unroll
    for (int ab = 0; ab < 8; ++ab) {  // activation block 8·sbk + ab = weights 128n + 32k + …
      const int n = ab >> 2, k = ab & 3;
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // group 8n + 2k + h
        int a[kMT][2];
        float s[kMT][2];
#pragma unroll
        for (int m = 0; m < kMT; ++m)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            a[m][r] = q6Word(w[m][r], n, k, h);
            s[m][r] = q6Scale(w[m][r], dw[m][r], 8 * n + 2 * k + h);
          }
        const int abk = 8 * sbk + ab;
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          if (j >= ntiles) break;  // warp-uniform
          const int tb = min(8 * j + g, n_tokens - 1);
          const int bf = *reinterpret_cast<const int*>(xq + static_cast<uint64_t>(tb) * kK + 32 * abk + 16 * h + 4 * t);
          float dx[2];
#pragma unroll
          for (int c = 0; c < 2; ++c)
            dx[c] = xmeta[static_cast<uint64_t>(min(8 * j + 2 * t + c, n_tokens - 1)) * kActBlocks + abk].d;
#pragma unroll
          for (int m = 0; m < kMT; ++m) {
            int d[4];
            mmaS8K16(d, a[m], bf);
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][j][e] = fmaf(s[m][e / 2], dx[e % 2] * static_cast<float>(d[e]), acc[m][j][e]);
          }
        }
      }
    }
  }
}

// Stores acc (element (m, j, e): row row0 + 16m + 8(e/2) + g, token 8j + 2t + e%2) to dst (row stride kN), with
// the bias when `bias` is non-null; rows ≥ kN and tokens ≥ n_tokens are not stored.
__device__ __forceinline__ void storeTile(const float (&acc)[kMT][kNT][4], float* dst, const float* bias, int n_tokens,
                                          int ntiles, int row0, int g, int t) {
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    if (j >= ntiles) break;
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + 16 * m + 8 * (e / 2) + g, tok = 8 * j + 2 * t + e % 2;
        if (row >= kN || tok >= n_tokens) continue;
        dst[static_cast<uint64_t>(tok) * kN + row] = bias ? acc[m][j][e] + bias[row] : acc[m][j][e];
      }
  }
}

// Quad lane 0 asks L2 for super-block sbk of its rows (one bulk prefetch of the group pitch per row).
__device__ __forceinline__ void prefetchRows(const uint8_t* const (&rows)[kMT][2], int sbk, int t) {
  if (kLookahead == 0 || t != 0) return;
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) prefetchL2(rows[m][r] + static_cast<uint64_t>(sbk) * SBB_GROUP_PITCH, SBB_GROUP_PITCH);
}

// Super-blocks [begin, end) of split s (the first kSuper % kSplits splits take one more).
__device__ __forceinline__ void splitRange(int s, int* begin, int* end) {
  const int base = kSuper / kSplits, extra = kSuper % kSplits;
  *begin = s * base + (s < extra ? s : extra);
  *end = *begin + base + (s < extra ? 1 : 0);
}

}  // namespace minfer::kern::gemm_small_blocks

#ifndef SBB_MIN_BLOCKS  // benchmark override only: blocks per SM the registers must allow
#define SBB_MIN_BLOCKS 2
#endif
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kSbbWarps, SBB_MIN_BLOCKS)
    minfer_gemm_small_blocks(const uint8_t* __restrict__ w, const float* __restrict__ bias,
                             const int8_t* __restrict__ xq, const minfer::kern::Q8Meta* __restrict__ xmeta,
                             float* __restrict__ out, float* __restrict__ partial, unsigned* __restrict__ counters,
                             int n_tokens) {
  using namespace minfer::kern;
  using namespace minfer::kern::gemm_small_blocks;
  int sb0, sb1;
  splitRange(blockIdx.y, &sb0, &sb1);
  const int first_row = blockIdx.x * kSbbRowsPerBlock;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row0 = first_row + warp * 16 * kMT;
  const uint8_t* rows[kMT][2];  // rows past N read row N − 1 (never stored)
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      rows[m][r] = w + static_cast<uint64_t>(min(row0 + 16 * m + 8 * r + g, kN - 1)) * SBB_PITCH;
  // The first kLookahead super-blocks of the lane's rows start moving into L2 (weights: readable before the
  // prologue); the loop keeps kLookahead ahead.
  for (int sbk = sb0; sbk < min(sb0 + kLookahead, sb1); ++sbk) prefetchRows(rows, sbk, t);
  overlapPrologue();
  const int ntiles = (n_tokens + 7) / 8;  // the caller keeps 1 ≤ n_tokens ≤ kGemmSmallMaxRows
  float acc[kMT][kNT][4];
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.0f;
  for (int sbk = sb0; sbk < sb1; ++sbk) {
    if (sbk + kLookahead < sb1) prefetchRows(rows, sbk + kLookahead, t);
    RowBytes wb[kMT][2];
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int r = 0; r < 2; ++r) wb[m][r] = loadRow(rows[m][r] + static_cast<uint64_t>(sbk) * SBB_GROUP_PITCH, t);
    superBlock(acc, wb, sbk, xq, xmeta, n_tokens, ntiles, g, t);
  }
  if (kSplits == 1) {
    storeTile(acc, out, SBB_HAS_BIAS ? bias : nullptr, n_tokens, ntiles, row0, g, t);
    return;
  }
  storeTile(acc, partial + static_cast<uint64_t>(blockIdx.y) * kGemmSmallMaxRows * kN, nullptr, n_tokens, ntiles, row0,
            g, t);
  splitKCombine<kN, kSplits, kSbbRowsPerBlock, SBB_HAS_BIAS != 0>(partial, bias, out, counters, n_tokens);
}
#endif
