// Small-batch matmul on quantized weights (OpKind MatMul, 1 ≤ n_tokens ≤ kGemmSmallMaxRows): the rows of a
// batched decode step (one token of each of up to 64 sequences) through int8 tensor-core MMA, reading each
// weight once per call for all rows.
//
//   out[t][r] = Σ_g [ s(r,g) · d(t,b) · Σ_{c∈g} q(r,c)·xq(t,c)  +  m(r,g) · d(t,b) · Σ_{c∈g} xq(t,c) ] (+ bias[r])
// (the definition of gemv.cuh and mmq.cuh: the same q8 activations, so the three agree up to the f32
// summation order).
//
// Why not mmq.cuh: its grid is ⌈N/TM⌉ × ⌈n/TN⌉ blocks, one column of tiles at n ≤ 64 — a few dozen blocks on
// 132 SMs — and it stages whole 64-wide K tiles per block. Why not gemv.cuh: it reads the weights once per
// token. Here the operands are swapped: the weights are MMA's A operand (m16 = 16 output features), the
// tokens its B operand (n8 = 8 tokens, ⌈n/8⌉ tiles), so one weight fragment serves every token of the call.
//
// Planes (the GEMV's, with the same constants):
//   SB_BITS 4: the kPacked plane (Q4_0, Q4_1, Q4_K): a row's 16 bytes per activation block of 32 hold
//              weight i in the low nibble of byte i and weight i + 16 in its high nibble (stride_table.h
//              packedOffset), which is the m16n8k32 A fragment: lane (g, t)'s word at byte 4t gives k 4t..4t+3
//              (a0/a1, low nibbles) and k 16+4t.. (a2/a3, high nibbles); q = nibble + SB_Q_OFFSET, the
//              offset applied through the activation sums (Σ (u + o)·x = Σ u·x + o·Σ x).
//   SB_BITS 8: the kI8 plane (every quantized type): groups of 32, lane (g, t)'s 8 bytes at 8t of the block as
//              the fragment's k 4t..4t+3 and 16+4t.. (any order of k that A and B share gives the block's sum);
//              groups of 16, its words at bytes 4t and 16 + 4t (each k16 MMA must see one group only).
//   Groups of 32 take one mma.m16n8k32 per activation block; groups of 16 (Q2_K, Q3_K, Q6_K) two
//   mma.m16n8k16 on the same registers (k 0..15 and 16..31), each scaled with its own group's s and m.
//
// Work split: a warp owns kSbRowsPerWarp (32) output features (two m16 tiles, so each B fragment serves two
// MMAs) × every token of the call (⌈n/8⌉ n8 tiles, the kernel instantiated for 1..8 tiles); a block of
// kSbWarps warps owns kSbRowsPerBlock consecutive features. K is split SB_SPLITS ways over gridDim.y
// (split-K) so that small N still fill the GPU: with SB_SPLITS > 1 each block writes its f32 partial sums
// to the step scratch, counts itself in counters[blockIdx.x] (a block barrier, then one acquire-release
// atomic, as gemv_blocks.cuh's GLU epilogue), and the block that completes a row group sums the splits in
// split order (deterministic), adds the bias, writes `out` and zeroes its counter again.
// Staging: per kChunk activation blocks, the call's activations and Q8Meta and the block's scales (and mins) go
// to shared memory by cp.async, the next stage's copies in flight while this one is computed; each lane issues a
// stage's weight loads (4 or 8 bytes per row and block, straight to registers) before waiting for its copies.
// Cost: one pass over the plane; the activations (n·K bytes + n·K/32 Q8Meta) once per block. Measured (H200,
// BENCHMARKS.md): 0.9–1.3 TB/s of kI8 at 1 row, the time growing about linearly with the rows (the per-element
// epilogue, as mmq's), hence the row limits below.
//
// Compile-time constants (-D):
//   SB_N, SB_K              weight rows and cols (K % 32 == 0)
//   SB_BITS                 4 (kPacked) or 8 (kI8)
//   SB_PITCH                row pitch of the plane read (bytes, multiple of 16)
//   SB_Q_OFFSET             kPacked: q = stored nibble + offset (−8 for Q4_0); 0 for kI8
//   SB_GROUP                16 or 32 (scale/min group along K; 4-bit planes need 32)
//   SB_S_PITCH              kScale row pitch (bytes)
//   SB_HAS_MIN, SB_M_PITCH  kMin plane
//   SB_HAS_BIAS             bias vector (N f32)
//   SB_SPLITS               K splits (gemmSmallSplits), 1..kSbMaxSplits
// Launch ABI:  minfer_gemm_small(const uint8_t* w, const float* wscale, const float* wmin, const float* bias,
//                                const int8_t* xq, const Q8Meta* xmeta, float* out, float* partial,
//                                unsigned* counters, int n_tokens)
//   w: the kPacked (BITS 4) or kI8 (BITS 8) plane; xq, xmeta: the q8 input buffer (width K); out: n_tokens × N
//   f32 (row stride N); partial: scratch of gemmSmallScratchBytes() (unused with SB_SPLITS 1); counters:
//   ⌈N / kSbRowsPerBlock⌉ words, zero on entry, zero again on exit (ArgKind Counters); 1 ≤ n_tokens ≤ 64.
// Launch shape: gemmSmallLaunchRule(): grid (⌈N / kSbRowsPerBlock⌉, SB_SPLITS), kSbWarps warps, no dynamic
// shared memory (two static stages, 18–41 KB); independent of n_tokens.
// SB_CHUNK, SB_MT, SB_MIN_BLOCKS, SB_PREFETCH: variant overrides for bench/gemm_small_bench.cu only.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kGemmSmallMaxRows = 64;  // tokens per call the kernel takes (8 n8 tiles)
// Calls the compiler gives it (Step.small_rows, bounded by the artifact's max_batch), by what the step runs
// otherwise. Measured on an H200 (BENCHMARKS.md; bench/gemm_small_bench.cu and bench/mmq_variants.cu, the 7B's
// Q4_K-like shapes): this kernel's time grows with the rows (3584² 14 → 49 µs, 18944 × 3584 51 → 139 µs and
// 3584 × 18944 51 → 151 µs from 1 to 64 rows) while mmq's stays flat (61, 99, 304 µs at 1..64 tokens, one
// column of tiles), so over a layer's seven matmuls it is faster up to 64 rows (598 against 732 µs at 64):
// kGemmSmallRowsVsMmq. Against the Hopper f16 prefill (wgmma_matmul.cuh) it was not measured: up to 16 rows,
// where it is 3–5× faster than mmq, kGemmSmallRowsVsWgmma.
constexpr unsigned kGemmSmallRowsVsMmq = 64;
constexpr unsigned kGemmSmallRowsVsWgmma = 16;
constexpr unsigned kSbWarps = 4;
#ifndef SB_MT  // benchmark override only (host and device see the same value): m16 tiles per warp
#define SB_MT 2
#endif
constexpr unsigned kSbRowsPerWarp = 16 * SB_MT;
constexpr unsigned kSbRowsPerBlock = kSbWarps * kSbRowsPerWarp;
constexpr unsigned kSbMaxSplits = 32;
// Blocks a launch aims for: ~4 per SM of a 132-SM H100/H200, so that every SM streams weights.
constexpr unsigned kSbTargetBlocks = 528;
// Activation blocks of 32 each split keeps at least (fewer makes the split-K epilogue dominate).
constexpr unsigned kSbMinBlocksPerSplit = 4;

// K splits for an N × K weight: the smallest power of two that brings the grid to kSbTargetBlocks blocks,
// at most kSbMaxSplits and at most (K/32) / kSbMinBlocksPerSplit (at least 1).
MINFER_HD unsigned gemmSmallSplits(unsigned n, unsigned k) {
  const unsigned row_blocks = ceilDiv(n, kSbRowsPerBlock), kblocks = k / 32;
  unsigned s = 1;
  while (s < kSbMaxSplits && row_blocks * s < kSbTargetBlocks && kblocks / (2 * s) >= kSbMinBlocksPerSplit) s *= 2;
  return s;
}

// Bytes of the split-K partial sums: splits × kGemmSmallMaxRows × N f32 (0 with one split).
MINFER_HD unsigned long long gemmSmallScratchBytes(unsigned n, unsigned splits) {
  return splits > 1 ? static_cast<unsigned long long>(splits) * kGemmSmallMaxRows * n * 4 : 0;
}
// The split-K shape: blocks of `warps` warps owning
// `rows_per_block` output rows each, × splits; and their counters, one word per row group.
MINFER_HD LaunchRule splitKLaunchRule(unsigned n, unsigned splits, unsigned rows_per_block, unsigned warps) {
  LaunchRule r;
  r.grid[0] = fixedExtent(ceilDiv(n, rows_per_block));
  r.grid[1] = fixedExtent(splits);
  r.block.x = 32 * warps;
  return r;
}
MINFER_HD unsigned long long splitKCounterBytes(unsigned n, unsigned rows_per_block) {
  return ceilDiv(n, rows_per_block) * 4ull;
}
MINFER_HD unsigned long long gemmSmallCounterBytes(unsigned n) { return splitKCounterBytes(n, kSbRowsPerBlock); }
MINFER_HD LaunchRule gemmSmallLaunchRule(unsigned n, unsigned splits) {
  return splitKLaunchRule(n, splits, kSbRowsPerBlock, kSbWarps);
}
MINFER_HD LaunchShape gemmSmallLaunch(unsigned n, unsigned splits) { return gemmSmallLaunchRule(n, splits).at(1); }

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE)
namespace minfer::kern {

// The split-K epilogue of the small-batch matmul: called by every thread of
// a block after the block stored its split's sums to partial[blockIdx.y][token][row] (row stride kN, token
// stride kGemmSmallMaxRows rows). The block counts itself in counters[blockIdx.x] (a block barrier, then one
// acquire-release atomic, as gemv_blocks.cuh's GLU epilogue); the block that completes row group blockIdx.x
// (kRowsPerBlock rows) sums the splits in split order (deterministic), adds the bias, writes `out` (n_tokens × kN
// f32) and zeroes its counter again.
template <int kN, int kSplits, unsigned kRowsPerBlock, bool kBias>
__device__ __forceinline__ void splitKCombine(const float* partial, const float* bias, float* out, unsigned* counters,
                                              int n_tokens) {
  __shared__ bool completes;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counters + blockIdx.x) : "memory");
    completes = before == static_cast<unsigned>(kSplits) - 1;
  }
  __syncthreads();
  if (!completes) return;
  const int first = blockIdx.x * kRowsPerBlock;
  const int rows = min(static_cast<int>(kRowsPerBlock), kN - first);
  for (int i = threadIdx.x; i < rows * n_tokens; i += blockDim.x) {
    const int tok = i / rows, row = first + i % rows;
    float v = 0.0f;
    for (int s = 0; s < kSplits; ++s)
      v += __ldcg(partial + (static_cast<uint64_t>(s) * kGemmSmallMaxRows + tok) * kN + row);
    if (kBias) v += bias[row];
    out[static_cast<uint64_t>(tok) * kN + row] = v;
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0;
}

}  // namespace minfer::kern
#endif  // MINFER_DEVICE_CODE

#if defined(MINFER_DEVICE_CODE) && defined(SB_N)
namespace minfer::kern::gemm_small {

constexpr int kN = SB_N, kK = SB_K, kBits = SB_BITS, kG = SB_GROUP, kSplits = SB_SPLITS;
constexpr int kKBlocks = kK / 32;
constexpr int kMT = kSbRowsPerWarp / 16;                // m16 tiles per warp
constexpr int kWords = kBits == 4 ? 2 * kMT : 4 * kMT;  // weight words per lane per activation block
constexpr int kGroups = 32 / kG;                         // scale groups per activation block
#ifndef SB_CHUNK  // benchmark override only (bench/gemm_small_bench.cu)
#define SB_CHUNK 4
#endif
constexpr int kChunk = SB_CHUNK;                         // activation blocks per pipeline stage
// kI8 with groups of 32 reads 8 bytes per lane and row (k 8t..8t+7 as the fragment's k 4t..4t+3 and 16+4t..: the
// products of a block are a sum, any order of k that A and B share gives it); every other plane 4 bytes.
constexpr bool kWide = kBits == 8 && kG == 32;
// Staged activation row (bytes): padded so that the lanes' B reads (8 rows × 4 lanes) hit distinct banks.
constexpr int kXPitch = kChunk * 32 + (kWide ? 32 : 16);
constexpr int kSPitch = kChunk * kGroups + 1;            // staged scale row (floats; +1: conflict-free)
constexpr int kThreads = 32 * kSbWarps;
static_assert(kK % 32 == 0, "SB_K must be a multiple of 32");
static_assert(kBits == 4 || kBits == 8, "SB_BITS must be 4 or 8");
static_assert(kG == 16 || kG == 32, "SB_GROUP must be 16 or 32");
static_assert(kBits == 8 || kG == 32, "4-bit planes have groups of 32");
static_assert(SB_PITCH % 16 == 0, "plane rows must be 16-byte aligned");
static_assert(kSplits >= 1 && kSplits <= static_cast<int>(kSbMaxSplits), "SB_SPLITS out of range");

// One pipeline stage in shared memory: the call's activations and Q8Meta for kChunk activation blocks, and the
// block's kSbRowsPerBlock rows of scales (and mins) for them.
struct Stage {
  int8_t x[kGemmSmallMaxRows][kXPitch];
  Q8Meta meta[kChunk][kGemmSmallMaxRows];
  float s[kSbRowsPerBlock][kSPitch];
#if SB_HAS_MIN
  float m[kSbRowsPerBlock][kSPitch];
#endif
};

// Activation blocks [begin, end) of split s (the first kKBlocks % kSplits splits take one more).
__device__ __forceinline__ void splitRange(int s, int* begin, int* end) {
  const int base = kKBlocks / kSplits, extra = kKBlocks % kSplits;
  *begin = s * base + (s < extra ? s : extra);
  *end = *begin + base + (s < extra ? 1 : 0);
}

// Issues the cp.async copies of activation blocks [kb, kb + nkb) into `st` (one commit group per call).
__device__ __forceinline__ void stage(Stage& st, const int8_t* xq, const Q8Meta* xmeta, const float* wscale,
                                      const float* wmin, int first_row, int kb, int nkb, int n_tokens) {
  for (int i = threadIdx.x; i < n_tokens * nkb * 2; i += kThreads) {  // 16-byte halves of each token's blocks
    const int tok = i / (nkb * 2), piece = i % (nkb * 2);
    cpAsync<16>(&st.x[tok][16 * piece], xq + static_cast<uint64_t>(tok) * kK + kb * 32 + 16 * piece, true);
  }
  for (int i = threadIdx.x; i < n_tokens * nkb; i += kThreads) {
    const int tok = i / nkb, b = i % nkb;
    cpAsync<8>(&st.meta[b][tok], xmeta + static_cast<uint64_t>(tok) * kKBlocks + kb + b, true);
  }
  for (int i = threadIdx.x; i < static_cast<int>(kSbRowsPerBlock) * nkb * kGroups; i += kThreads) {
    const int r = i / (nkb * kGroups), c = i % (nkb * kGroups);
    const int row = min(first_row + r, kN - 1);  // rows past N read row N − 1, never stored
    cpAsync<4>(&st.s[r][c], wscale + static_cast<uint64_t>(row) * (SB_S_PITCH / 4) + kb * kGroups + c, true);
#if SB_HAS_MIN
    cpAsync<4>(&st.m[r][c], wmin + static_cast<uint64_t>(row) * (SB_M_PITCH / 4) + kb * kGroups + c, true);
#else
    (void)wmin;
#endif
  }
  cpAsyncCommit();
}

// The lane's weight words of activation block kb: for m16 tile m, rows r0 = row g, r1 = row g + 8 of the tile.
//   BITS 4: w[2m] = (r0, bytes 4t..4t+3), w[2m+1] = (r1, …)
//   BITS 8: w[4m] = (r0, 4t), w[4m+1] = (r1, 4t), w[4m+2] = (r0, 16+4t), w[4m+3] = (r1, 16+4t)
__device__ __forceinline__ void loadWeights(unsigned (&w)[kWords], const uint8_t* const (&rows)[2 * kMT], int kb, int t) {
#pragma unroll
  for (int i = 0; i < 2 * kMT; ++i) {
    if (kBits == 4) {
      w[i] = *reinterpret_cast<const unsigned*>(rows[i] + kb * 16 + 4 * t);
    } else if (kWide) {
      const uint2 v = *reinterpret_cast<const uint2*>(rows[i] + kb * 32 + 8 * t);
      w[4 * (i / 2) + i % 2] = v.x;
      w[4 * (i / 2) + 2 + i % 2] = v.y;
    } else {
      const int m = i / 2, r = i % 2;
      w[4 * m + r] = *reinterpret_cast<const unsigned*>(rows[i] + kb * 32 + 4 * t);
      w[4 * m + 2 + r] = *reinterpret_cast<const unsigned*>(rows[i] + kb * 32 + 16 + 4 * t);
    }
  }
}

// acc[m][j][e] += the scaled products of staged activation block b of `st`: m16 tile m, n8 tile j, D fragment
// element e (e = 0, 1: row g, tokens 2t, 2t+1; e = 2, 3: row g + 8). lr: the warp's first row in the block.
template <int NT>
__device__ __forceinline__ void blockProducts(float (&acc)[kMT][NT][4], const unsigned (&w)[kWords], const Stage& st,
                                              int b, int lr, int n_tokens, int g, int t) {
  int a[kMT][4];
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    if (kBits == 4) {
      a[m][0] = static_cast<int>(w[2 * m] & 0x0F0F0F0Fu);
      a[m][1] = static_cast<int>(w[2 * m + 1] & 0x0F0F0F0Fu);
      a[m][2] = static_cast<int>((w[2 * m] >> 4) & 0x0F0F0F0Fu);
      a[m][3] = static_cast<int>((w[2 * m + 1] >> 4) & 0x0F0F0F0Fu);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) a[m][e] = static_cast<int>(w[4 * m + e]);
    }
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    // B fragment: token 8j + g (clamped: columns past n_tokens are computed and never stored).
    const int8_t* xr = &st.x[min(8 * j + g, n_tokens - 1)][32 * b + 4 * t];
    int bf[2];
    if (kWide) {
      const int2 v = *reinterpret_cast<const int2*>(xr + 4 * t);  // bytes 8t..8t+7 of the block
      bf[0] = v.x;
      bf[1] = v.y;
    } else {
      bf[0] = *reinterpret_cast<const int*>(xr);
      bf[1] = *reinterpret_cast<const int*>(xr + 16);
    }
    const Q8Meta mt[2] = {st.meta[b][min(8 * j + 2 * t, n_tokens - 1)], st.meta[b][min(8 * j + 2 * t + 1, n_tokens - 1)]};
#pragma unroll
    for (int m = 0; m < kMT; ++m) {
      if (kG == 32) {
        int d[4];
        mmaS8K32(d, a[m], bf);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const Q8Meta& x = mt[e % 2];
          const int r = lr + 16 * m + 8 * (e / 2) + g, sum = x.sum_lo + x.sum_hi;
          float v = st.s[r][b] * x.d * static_cast<float>(d[e] + SB_Q_OFFSET * sum);
#if SB_HAS_MIN
          v = fmaf(st.m[r][b], x.d * static_cast<float>(sum), v);
#endif
          acc[m][j][e] += v;
        }
      } else {
        int dl[4], dh[4];
        const int al[2] = {a[m][0], a[m][1]}, ah[2] = {a[m][2], a[m][3]};
        mmaS8K16(dl, al, bf[0]);
        mmaS8K16(dh, ah, bf[1]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const Q8Meta& x = mt[e % 2];
          const int r = lr + 16 * m + 8 * (e / 2) + g;
          float v = st.s[r][2 * b] * x.d * static_cast<float>(dl[e]);
          v += st.s[r][2 * b + 1] * x.d * static_cast<float>(dh[e]);
#if SB_HAS_MIN
          v = fmaf(st.m[r][2 * b], x.d * static_cast<float>(x.sum_lo), v);
          v = fmaf(st.m[r][2 * b + 1], x.d * static_cast<float>(x.sum_hi), v);
#endif
          acc[m][j][e] += v;
        }
      }
    }
  }
}

// The block's products over activation blocks [kb0, kb1): kChunk blocks per stage, the next stage's copies in
// flight while this one is computed, each lane's weight loads of a stage issued before the wait for its copies.
template <int NT>
__device__ __forceinline__ void blockRange(float (&acc)[kMT][NT][4], Stage (&st)[2], const uint8_t* w,
                                           const float* wscale, const float* wmin, const int8_t* xq,
                                           const Q8Meta* xmeta, int n_tokens, int first_row, int lr, int kb0, int kb1,
                                           int g, int t) {
  const uint8_t* rows[2 * kMT];
#pragma unroll
  for (int i = 0; i < 2 * kMT; ++i)
    rows[i] = w + static_cast<uint64_t>(min(first_row + lr + 16 * (i / 2) + 8 * (i % 2) + g, kN - 1)) * SB_PITCH;
  if (kb0 < kb1) stage(st[0], xq, xmeta, wscale, wmin, first_row, kb0, min(kChunk, kb1 - kb0), n_tokens);
  for (int kb = kb0, c = 0; kb < kb1; kb += kChunk, ++c) {
    const int nkb = min(kChunk, kb1 - kb), next = kb + kChunk;
    if (next < kb1)
      stage(st[(c + 1) % 2], xq, xmeta, wscale, wmin, first_row, next, min(kChunk, kb1 - next), n_tokens);
    else
      cpAsyncCommit();  // an empty group keeps the wait below uniform
    unsigned v[kChunk][kWords];
#pragma unroll
    for (int b = 0; b < kChunk; ++b)
      if (b < nkb) loadWeights(v[b], rows, kb + b, t);
    cpAsyncWait<1>();
    __syncthreads();
#pragma unroll
    for (int b = 0; b < kChunk; ++b)
      if (b < nkb) blockProducts<NT>(acc, v[b], st[c % 2], b, lr, n_tokens, g, t);
    __syncthreads();  // the next iteration's copies overwrite this stage
  }
}

// Element (row, token) of a D fragment: acc[m][j][e] is row row0 + 16m + 8(e/2) + g, token 8j + 2t + e%2.
template <int NT>
__device__ __forceinline__ void storeTile(const float (&acc)[kMT][NT][4], float* dst, const float* bias,
                                          int n_tokens, int row0, int g, int t) {
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + 16 * m + 8 * (e / 2) + g, tok = 8 * j + 2 * t + e % 2;
        if (row >= kN || tok >= n_tokens) continue;
        float v = acc[m][j][e];
#if SB_HAS_BIAS
        if (bias) v += bias[row];
#else
        (void)bias;
#endif
        dst[static_cast<uint64_t>(tok) * kN + row] = v;
      }
}

template <int NT>
__device__ __forceinline__ void run(const uint8_t* w, const float* wscale, const float* wmin, const float* bias,
                                    const int8_t* xq, const Q8Meta* xmeta, float* out, float* partial,
                                    unsigned* counters, int n_tokens, Stage (&st)[2]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int first_row = blockIdx.x * kSbRowsPerBlock, lr = warp * kSbRowsPerWarp, row0 = first_row + lr;
  int kb0, kb1;
  splitRange(blockIdx.y, &kb0, &kb1);
  float acc[kMT][NT][4];
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.0f;
  blockRange<NT>(acc, st, w, wscale, wmin, xq, xmeta, n_tokens, first_row, lr, kb0, kb1, g, t);
  if (kSplits == 1) {
    storeTile<NT>(acc, out, bias, n_tokens, row0, g, t);
    return;
  }
  // Split-K: this split's sums to partial[split][token][row]; the block completing the row group sums them.
  storeTile<NT>(acc, partial + static_cast<uint64_t>(blockIdx.y) * kGemmSmallMaxRows * kN, nullptr, n_tokens, row0,
                g, t);
  splitKCombine<kN, kSplits, kSbRowsPerBlock, SB_HAS_BIAS != 0>(partial, bias, out, counters, n_tokens);
}

}  // namespace minfer::kern::gemm_small

#ifndef SB_PREFETCH  // benchmark override only: 0 = no L2 prefetch of the block's weight rows
#define SB_PREFETCH 0
#endif
#ifndef SB_MIN_BLOCKS  // benchmark override only: blocks per SM the registers must allow
#define SB_MIN_BLOCKS 1
#endif
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kSbWarps, SB_MIN_BLOCKS)
    minfer_gemm_small(const uint8_t* __restrict__ w, const float* __restrict__ wscale, const float* __restrict__ wmin,
                      const float* __restrict__ bias, const int8_t* __restrict__ xq,
                      const minfer::kern::Q8Meta* __restrict__ xmeta, float* __restrict__ out,
                      float* __restrict__ partial, unsigned* __restrict__ counters, int n_tokens) {
  using namespace minfer::kern::gemm_small;
#if SB_PREFETCH
  {  // the block's weight rows for its split start moving into L2 (weights: readable before the prologue)
    int kb0, kb1;
    splitRange(blockIdx.y, &kb0, &kb1);
    const int row = blockIdx.x * minfer::kern::kSbRowsPerBlock + threadIdx.x;
    constexpr int kBytesPerBlock = kBits == 4 ? 16 : 32;
    if (row < kN && kb1 > kb0)
      minfer::kern::prefetchL2(w + static_cast<uint64_t>(row) * SB_PITCH + kb0 * kBytesPerBlock, (kb1 - kb0) * kBytesPerBlock);
  }
#endif
  minfer::kern::overlapPrologue();
  __shared__ __align__(16) Stage st[2];  // one for every instantiation of run (each would get its own)
  switch ((n_tokens + 7) / 8) {  // n8 tiles of tokens; the caller keeps 1 ≤ n_tokens ≤ kGemmSmallMaxRows
    case 1: run<1>(w, wscale, wmin, bias, xq, xmeta, out, partial, counters, n_tokens, st); break;
    case 2: run<2>(w, wscale, wmin, bias, xq, xmeta, out, partial, counters, n_tokens, st); break;
    case 3: run<3>(w, wscale, wmin, bias, xq, xmeta, out, partial, counters, n_tokens, st); break;
    case 4: run<4>(w, wscale, wmin, bias, xq, xmeta, out, partial, counters, n_tokens, st); break;
    case 5: run<5>(w, wscale, wmin, bias, xq, xmeta, out, partial, counters, n_tokens, st); break;
    case 6: run<6>(w, wscale, wmin, bias, xq, xmeta, out, partial, counters, n_tokens, st); break;
    case 7: run<7>(w, wscale, wmin, bias, xq, xmeta, out, partial, counters, n_tokens, st); break;
    case 8: run<8>(w, wscale, wmin, bias, xq, xmeta, out, partial, counters, n_tokens, st); break;
    default: break;
  }
}
#endif
