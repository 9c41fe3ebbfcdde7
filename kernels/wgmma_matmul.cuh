// Prefill matmul on Hopper's tensor cores (sm_90a `wgmma`), f16 operands, f32 accumulation (issue 15):
//
//   out[t][r] = Σ_k x(t,k) · w(r,k)  (+ bias[r])
//
// w: a dense f16 plane of the weights (N rows × K, row pitch WG_W_PITCH bytes), the GGUF blocks
// dequantized once at load (w = s·q + m of stride_table.h, rounded to f16: relative error ≤ 2^-11).
// x: WG_ACT = 0: f16 activations (n_tokens × K, row pitch 2K bytes);
//    WG_ACT = 1: q8 activations (quantize_act.cuh: xq int8 n_tokens × K and one Q8Meta per 32), each
//    value dequantized to f16 as round(xq · d) when staged (the product is exact in f32).
// Numerics: products of f16 values are exact in the tensor core and summed in f32 (PTX ISA,
// "Warpgroup MMA": wgmma.mma_async .f32.f16.f16), so the error against float64 on the same f16 operands
// is the f32 summation error; the operands' rounding to f16 is the rest.
//
// Tiling: a thread block has WG_BM / 64 warpgroups (128 threads each) and computes WG_BM tokens ×
// WG_BN weight rows; warpgroup g owns tokens 64g .. 64g+63 of the tile, all WG_BN rows: one
// wgmma.m64n{BN}k16 per 16 of K. K advances in stages of 64 (one 128-byte row of f16 per token or
// weight row) through a WG_STAGES-deep pipeline of shared-memory stages, each stage the activation
// tile then the weight tile, rows of 128 bytes in the 128-byte swizzle that wgmma's shared-memory
// descriptors name (16-byte chunk c of row r stored at chunk c ^ (r mod 8); PTX ISA, "Matrix
// Descriptor Format", "Shared Memory Matrix Layout"). Weights (and f16 activations) are copied with
// cp.async; q8 activations are loaded into registers one iteration ahead, converted and stored.
// Iteration kt waits for stage kt, refills stage kt+S−2 (read by the wgmma of iteration kt−2, which the
// previous iteration's wgmma.wait_group 1 retired before this iteration's barrier), issues the four
// wgmma of stage kt and retires those of kt−1.
//
// Compile-time constants (-D):
//   WG_N, WG_K          weight rows (out features) and cols (in features); K % 8 == 0 (K % 32 == 0 with
//                       WG_ACT = 1: one Q8Meta per 32 values)
//   WG_W_PITCH          weight plane row pitch (bytes, multiple of 16)
//   WG_BM, WG_BN        tile: BM ∈ {64, 128} tokens, BN ∈ {64, 128, 256} weight rows
//   WG_STAGES           pipeline depth (4..8; WG_ACT = 1 needs ≥ 4)
//   WG_ACT              0: f16 activations; 1: q8 activations
//   WG_HAS_BIAS         1 when the step has a bias vector (N f32)
//   WG_SPLITS           splits of K (absent or 1: minfer_wgmma_matmul; 2 … 16: minfer_wgmma_matmul_split alone,
//                       with WG_ACT = 0, the tile kWgmmaSplitTile (WG_BM 64, WG_BN 64, WG_STAGES 6) and at least
//                       one stage of 64 per split)
// Launch ABI:  minfer_wgmma_matmul(const uint16_t* w, const float* bias, const void* x,
//                                  const Q8Meta* xmeta, float* out, int n_tokens)
//   x: f16 (WG_ACT 0) or int8 (WG_ACT 1) activations; xmeta: their Q8Meta (WG_ACT 1; else unused);
//   out: n_tokens × N f32 (row stride N).
//
// Second entry, the q8 → f16 staging the plan runs before the WG_ACT = 0 kernel (compile_model: one
// launch per matmul step, into the step's scratch):
//   minfer_q8_to_f16(const int8_t* xq, const Q8Meta* xmeta, uint16_t* x, int n_tokens): x[t][c] =
//   round_to_f16(xq[t][c] · d(t, c/32)), the value the WG_ACT = 1 kernel stages; Q8F16_K (K % 32 == 0)
//   is the only constant; q8ToF16LaunchRule(): one thread per 16 values.
// Launch shape: wgmmaMatmulLaunch(): grid (⌈n_tokens/BM⌉, ⌈N/BN⌉) (the token tiles of one weight tile
// run side by side, so each weight tile is read from HBM about once), BM/64 · 128 threads,
// wgmmaMatmulSmemBytes() of dynamic shared memory (opt-in attribute above 48 KiB).
//
// Third entry, split over K for calls of at most one token tile (WG_SPLITS = S > 1; WG_ACT = 0, WG_BM = 64): the
// small-batch form of a matmul whose weight tiles alone leave most SMs idle and whose K is long (the 7B's
// down projection at 33 … 64 rows: 56 tiles of 64 rows for 132 SMs, 296 stages; wgmmaSplits). grid.z = S; split s
// takes the stages [s·KT/S, (s+1)·KT/S) of K (KT = ⌈K/64⌉), writes its f32 sums to partial[s][t][r] and counts
// itself in its weight tile's word of `counters` (every thread's fence, a block barrier, then one acquire-release
// atomic, as mmq_blocks.cuh's split-K); the tile's last split adds the S partials in split order (+ bias), so the
// result does not depend on which split finishes last, and sets the word back to 0.
//   minfer_wgmma_matmul_split(const uint16_t* w, const float* bias, uint8_t* scratch, float* out,
//                             unsigned* counters, int n_tokens)
//   scratch: the step's scratch, wgmmaSplitScratchBytes(N, K, S) bytes: the f16 activations (n_tokens × K, as
//   minfer_q8_to_f16 writes them) at byte 0, the partials (S × 64 × N f32) at wgmmaSplitPartialOffset(K);
//   counters: wgmmaSplitCounterBytes(N) (zero on entry and again on exit); n_tokens ≤ 64 (one token tile: the
//   launch's row range keeps it so; later tokens are not computed). wgmmaSplitLaunchRule(): grid (1, ⌈N/64⌉, S),
//   128 threads, two blocks per SM.

#pragma once

#include "kernels/common.cuh"
#include "kernels/wgmma.cuh"

namespace minfer::kern {

constexpr unsigned kWgmmaBK = 64;  // K per stage: 64 f16 = one 128-byte swizzled row

// Dynamic shared memory: the stages plus 1 KiB to align the first stage to the swizzle's 1024-byte period.
MINFER_HD constexpr unsigned wgmmaMatmulSmemBytes(unsigned bm, unsigned bn, unsigned stages) {
  return stages * (bm + bn) * kWgmmaBK * 2 + 1024;
}
MINFER_HD constexpr unsigned wgmmaMatmulThreads(unsigned bm) { return bm / 64 * 128; }
MINFER_HD LaunchRule wgmmaMatmulLaunchRule(unsigned n, unsigned bm, unsigned bn, unsigned stages) {
  LaunchRule r;
  r.grid[0] = perToken(1, bm);
  r.grid[1] = fixedExtent(ceilDiv(n, bn));
  r.block.x = wgmmaMatmulThreads(bm);
  r.smem = wgmmaMatmulSmemBytes(bm, bn, stages);
  return r;
}
MINFER_HD LaunchShape wgmmaMatmulLaunch(unsigned n, unsigned n_tokens, unsigned bm, unsigned bn, unsigned stages) {
  return wgmmaMatmulLaunchRule(n, bm, bn, stages).at(n_tokens);
}

constexpr unsigned kQ8F16Threads = 256;
MINFER_HD LaunchRule q8ToF16LaunchRule(unsigned k) {
  LaunchRule r;
  r.grid[0] = perToken(k / 16, kQ8F16Threads);
  r.block.x = kQ8F16Threads;
  return r;
}
MINFER_HD constexpr unsigned long long q8ToF16Bytes(unsigned max_batch, unsigned k) {
  return static_cast<unsigned long long>(max_batch) * k * 2;
}

// The tile the compiler picks for N weight rows (scripts/device-wgmma-variants.sh, BENCHMARKS.md: f16
// activations): 128 tokens × 256 rows, 4 stages, for wide matrices (best or within 3% at T = 128 … 2048);
// 64 × 64, 6 stages, for narrow ones (N < 8192), where larger tiles leave SMs idle at short prompts (2.3×
// faster at T = 128 on the 7B's down projection, ≤ 17% slower at T = 512).
struct WgmmaTile {
  unsigned bm, bn, stages;
};
MINFER_HD WgmmaTile wgmmaMatmulTile(unsigned n) { return n >= 8192 ? WgmmaTile{128, 256, 4} : WgmmaTile{64, 64, 6}; }

// The split-K form (minfer_wgmma_matmul_split): one token tile of 64, weight tiles of 64 rows, 6 stages (two blocks
// per SM: each 96 KiB of stages, 1 KiB of alignment slack, 1 KiB of static shared memory and 1 KiB the driver
// reserves, 198 KiB of the 228).
constexpr WgmmaTile kWgmmaSplitTile{64, 64, 6};
constexpr unsigned kWgmmaSplitSlots = 264;      // blocks a 132-SM Hopper runs at once, two per SM
// Stages of 64 per split at least (each split pays a pipeline fill and its share of the partial sums). Measured on an
// H100 at 64 rows (minfer-bench-gemv --wgmma-rows 64 --wgmma-splits, BENCHMARKS.md 2026-12-05): the 7B's o and k
// (K = 3584, 56 stages) slower at every split count (o 18.8 µs alone, 20.9 at 2 splits of 28 stages), its down
// (K = 18944, 296 stages) 75.8 µs alone, 68.4 / 66.6 / 68.0 at 2 / 3 / 4 splits (148 / 99 / 74 stages each), 99.9 at
// 6 (a second wave). 96: down 3 splits, o, q, k, v, gate and up none.
constexpr unsigned kWgmmaSplitMinStages = 96;
constexpr unsigned kWgmmaSplitMaxSplits = 16;
// Splits of K for N weight rows and K columns: as many as fill the slots in one wave (⌊264 / weight tiles⌋), each at
// least `min_stages` stages long (0 counts as 1), 1 … kWgmmaSplitMaxSplits. The 7B's down (3584 × 18944): 56 tiles,
// 3 splits (168 blocks); its o (3584 × 3584) and gate (18944 rows, 296 tiles): 1. The tests pass a smaller min_stages
// to split the matmuls of small models.
MINFER_HD unsigned wgmmaSplits(unsigned n, unsigned k, unsigned min_stages = kWgmmaSplitMinStages) {
  const unsigned tiles = ceilDiv(n, kWgmmaSplitTile.bn), stages = ceilDiv(k, kWgmmaBK);
  const unsigned most = stages / (min_stages < 1 ? 1 : min_stages);  // splits of at least min_stages stages
  unsigned s = kWgmmaSplitSlots / tiles;
  if (s > most) s = most;
  if (s > kWgmmaSplitMaxSplits) s = kWgmmaSplitMaxSplits;
  return s < 1 ? 1 : s;
}
// The scratch of the split form: the f16 activations of one token tile, then (256-byte aligned) the partials.
MINFER_HD constexpr unsigned long long wgmmaSplitPartialOffset(unsigned k) {
  return (2ull * kWgmmaSplitTile.bm * k + 255) / 256 * 256;
}
MINFER_HD constexpr unsigned long long wgmmaSplitScratchBytes(unsigned n, unsigned k, unsigned splits) {
  return wgmmaSplitPartialOffset(k) + 4ull * splits * kWgmmaSplitTile.bm * n;
}
MINFER_HD unsigned wgmmaSplitCounterBytes(unsigned n) { return 4 * ceilDiv(n, kWgmmaSplitTile.bn); }
MINFER_HD LaunchRule wgmmaSplitLaunchRule(unsigned n, unsigned splits) {
  LaunchRule r;
  r.grid[1] = fixedExtent(ceilDiv(n, kWgmmaSplitTile.bn));
  r.grid[2] = fixedExtent(splits);
  r.block.x = wgmmaMatmulThreads(kWgmmaSplitTile.bm);
  r.smem = wgmmaMatmulSmemBytes(kWgmmaSplitTile.bm, kWgmmaSplitTile.bn, kWgmmaSplitTile.stages);
  return r;
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE)
namespace minfer::kern {

// Two f32 → one f16x2 register (lo in the low half), round to nearest even.
__device__ __forceinline__ uint32_t packHalf2(float lo, float hi) {
  uint32_t v;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(hi), "f"(lo));
  return v;
}
// Four q8 values (int8 in a word, lowest byte first) times d as two f16x2 words: round_to_f16(q·d), the
// product exact in f32.
__device__ __forceinline__ void dequantQ8x4(uint32_t q, float d, uint32_t& lo, uint32_t& hi) {
  const int v = static_cast<int>(q);
  lo = packHalf2(static_cast<float>(v << 24 >> 24) * d, static_cast<float>(v << 16 >> 24) * d);
  hi = packHalf2(static_cast<float>(v << 8 >> 24) * d, static_cast<float>(v >> 24) * d);
}

}  // namespace minfer::kern
#endif

#if defined(MINFER_DEVICE_CODE) && defined(WG_N)
namespace minfer::kern::wg {

constexpr int kN = WG_N, kK = WG_K, kBM = WG_BM, kBN = WG_BN, kS = WG_STAGES;
constexpr int kBK = static_cast<int>(kWgmmaBK);
constexpr int kThreads = static_cast<int>(wgmmaMatmulThreads(kBM));
constexpr int kKT = (kK + kBK - 1) / kBK;
constexpr int kATileBytes = kBM * kBK * 2, kStageBytes = (kBM + kBN) * kBK * 2;
constexpr int kAcc = kBN / 2;  // f32 accumulators per thread
static_assert(kK % 8 == 0, "WG_K must be a multiple of 8 (16-byte rows of f16)");
static_assert(WG_ACT == 0 || kK % 32 == 0, "q8 activations come in blocks of 32");
static_assert(kBM == 64 || kBM == 128, "WG_BM");
static_assert(kBN == 64 || kBN == 128 || kBN == 256, "WG_BN");
static_assert(kS >= 3 && kS <= 8 && (WG_ACT == 0 || kS >= 4), "WG_STAGES");
static_assert(WG_W_PITCH % 16 == 0, "weight rows must be 16-byte aligned");

// D(64 × N, f32) += A(64 × 16, f16, K-major, descriptor a) · B(16 × N, f16, K-major, descriptor b), for one
// warpgroup; the accumulator fragment: thread l of warp w holds rows 16w + l/4 (+8) and columns
// 8j + 2(l%4) (+1) as d[4j + 2h + e] (row +8h, column +e).
__device__ __forceinline__ void wgmmaF16N64(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(1));
}
__device__ __forceinline__ void wgmmaF16N128(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(1));
}
__device__ __forceinline__ void wgmmaF16N256(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(1));
}

__device__ __forceinline__ void wgmmaTile(float (&d)[kAcc], uint64_t a, uint64_t b) {
#if WG_BN == 64
  wgmmaF16N64(d, a, b);
#elif WG_BN == 128
  wgmmaF16N128(d, a, b);
#else
  wgmmaF16N256(d, a, b);
#endif
}

constexpr int kChunks = kBK * 2 / 16;  // 16-byte chunks per tile row (8)
MINFER_HD constexpr int iters(int items) { return (items + kThreads - 1) / kThreads; }

// cp.async of the weight tile of stage kt: BN rows × 8 chunks, zero-filled past N and K.
__device__ __forceinline__ void loadWeights(uint8_t* tile, int kt, int n0, const uint16_t* w) {
  const int k0 = kt * kBK;
#pragma unroll
  for (int i = 0; i < iters(kBN * kChunks); ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kThreads;
    if ((kBN * kChunks) % kThreads != 0 && c >= kBN * kChunks) break;
    const int row = c / kChunks, ch = c % kChunks, col = k0 + ch * 8;
    const bool ok = n0 + row < kN && (kK % kBK == 0 || col < kK);
    const uint16_t* src = ok ? w + static_cast<uint64_t>(n0 + row) * (WG_W_PITCH / 2) + col : w;
    cpAsync<16>(tile + swizzled(row, ch), src, ok);
  }
}

#if WG_ACT == 0
// cp.async of the f16 activation tile of stage kt: BM tokens × 8 chunks, zero-filled past n_tokens and K.
__device__ __forceinline__ void loadActivations(uint8_t* tile, int kt, int m0, int n_tokens, const uint16_t* x) {
  const int k0 = kt * kBK;
#pragma unroll
  for (int i = 0; i < iters(kBM * kChunks); ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kThreads;
    if ((kBM * kChunks) % kThreads != 0 && c >= kBM * kChunks) break;
    const int row = c / kChunks, ch = c % kChunks, col = k0 + ch * 8;
    const bool ok = m0 + row < n_tokens && (kK % kBK == 0 || col < kK);
    const uint16_t* src = ok ? x + static_cast<uint64_t>(m0 + row) * kK + col : x;
    cpAsync<16>(tile + swizzled(row, ch), src, ok);
  }
}
#else
// q8 activations of one stage held in registers between their load and their store: each thread owns
// kQ8Items chunks of 16 int8 (BM tokens × 4 chunks per stage) and their block scales.
constexpr int kQ8Chunks = kBK / 16;  // 16-value chunks per token row (4)
constexpr int kQ8Items = iters(kBM * kQ8Chunks);
struct Q8Regs {
  uint4 q[kQ8Items];
  float d[kQ8Items];
};
__device__ __forceinline__ void loadQ8(Q8Regs& r, int kt, int m0, int n_tokens, const int8_t* xq, const Q8Meta* xmeta) {
  const int k0 = kt * kBK;
#pragma unroll
  for (int i = 0; i < kQ8Items; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kThreads;
    const int row = c / kQ8Chunks, col = k0 + (c % kQ8Chunks) * 16;
    const bool ok = c < kBM * kQ8Chunks && m0 + row < n_tokens && (kK % kBK == 0 || col < kK);
    r.q[i] = ok ? *reinterpret_cast<const uint4*>(xq + static_cast<uint64_t>(m0 + row) * kK + col) : make_uint4(0, 0, 0, 0);
    r.d[i] = ok ? xmeta[static_cast<uint64_t>(m0 + row) * (kK / 32) + col / 32].d : 0.0f;
  }
}
__device__ __forceinline__ void storeQ8(uint8_t* tile, const Q8Regs& r) {
#pragma unroll
  for (int i = 0; i < kQ8Items; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kThreads;
    if ((kBM * kQ8Chunks) % kThreads != 0 && c >= kBM * kQ8Chunks) break;
    const int row = c / kQ8Chunks, ch = (c % kQ8Chunks) * 2;  // 16 values = two 16-byte f16 chunks
    uint4 a, b;
    dequantQ8x4(r.q[i].x, r.d[i], a.x, a.y);
    dequantQ8x4(r.q[i].y, r.d[i], a.z, a.w);
    dequantQ8x4(r.q[i].z, r.d[i], b.x, b.y);
    dequantQ8x4(r.q[i].w, r.d[i], b.z, b.w);
    *reinterpret_cast<uint4*>(tile + swizzled(row, ch)) = a;
    *reinterpret_cast<uint4*>(tile + swizzled(row, ch + 1)) = b;
  }
}
#endif

// The K loop of one thread block over the stages [kt0, kt1): tokens m0 … m0 + BM − 1, weight rows n0 … n0 + BN − 1,
// sums into d (warpgroup g: tokens 64g …). `smem`: the 1024-byte aligned stages.
__device__ __forceinline__ void mainLoop(float (&d)[kAcc], uint8_t* smem, int m0, int n0, int kt0, int kt1,
                                         int n_tokens, const uint16_t* __restrict__ w, const void* __restrict__ x,
                                         const Q8Meta* __restrict__ xmeta) {
  const int wg = threadIdx.x / 128, nkt = kt1 - kt0;
  auto stage = [&](int i) { return smem + (i % kS) * kStageBytes; };  // i: stage index from kt0
#pragma unroll
  for (int i = 0; i < kAcc; ++i) d[i] = 0.0f;

#if WG_ACT == 0
  (void)xmeta;
  const uint16_t* xh = static_cast<const uint16_t*>(x);
#pragma unroll
  for (int i = 0; i < kS - 2; ++i) {
    if (i < nkt) {
      loadActivations(stage(i), kt0 + i, m0, n_tokens, xh);
      loadWeights(stage(i) + kATileBytes, kt0 + i, n0, w);
    }
    cpAsyncCommit();
  }
#else
  const int8_t* xq = static_cast<const int8_t*>(x);
  Q8Regs q8;
#pragma unroll
  for (int i = 0; i < kS - 2; ++i) {
    if (i < nkt) {
      loadQ8(q8, kt0 + i, m0, n_tokens, xq, xmeta);
      storeQ8(stage(i), q8);
      loadWeights(stage(i) + kATileBytes, kt0 + i, n0, w);
    }
    cpAsyncCommit();
  }
  if (kS - 2 < nkt) loadQ8(q8, kt0 + kS - 2, m0, n_tokens, xq, xmeta);
#endif

  for (int i = 0; i < nkt; ++i) {
    cpAsyncWait<kS - 3>();
    fenceProxyAsync();
    __syncthreads();
    const int next = i + kS - 2;
    if (next < nkt) {
#if WG_ACT == 0
      loadActivations(stage(next), kt0 + next, m0, n_tokens, xh);
#else
      storeQ8(stage(next), q8);
#endif
      loadWeights(stage(next) + kATileBytes, kt0 + next, n0, w);
    }
    cpAsyncCommit();
#if WG_ACT == 1
    if (next + 1 < nkt) loadQ8(q8, kt0 + next + 1, m0, n_tokens, xq, xmeta);
#endif
    const uint8_t* st = stage(i);
    const uint64_t da = tileDescriptor(st + wg * 64 * 128), db = tileDescriptor(st + kATileBytes);
    wgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) wgmmaTile(d, da + 2 * kk, db + 2 * kk);
    wgmmaCommit();
    wgmmaWait<1>();
  }
  wgmmaWait<0>();
}

// Calls f(tok, r, h, j) for each pair of accumulators d[4j + 2h], d[4j + 2h + 1] this thread holds: token tok (of the
// tile at m0) and weight rows r, r + 1 (of the tile at n0); thread l of warp w (in its warpgroup g) holds tokens
// 64g + 16w + l/4 (+8) and rows 8j + 2(l%4) (+1). Tokens at or past n_tokens are skipped, rows past N are not.
template <class F>
__device__ __forceinline__ void forEachPair(int m0, int n0, int n_tokens, F f) {
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int tok = m0 + wg * 64 + warp * 16 + lane / 4 + 8 * h;
    if (tok >= n_tokens) continue;
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) f(tok, n0 + 8 * j + 2 * (lane % 4), h, j);
  }
}

// Stores v0, v1 (+ bias) at rows r, r + 1 of one output row (those below N).
__device__ __forceinline__ void storePair(float* __restrict__ row, const float* __restrict__ bias, int r, float v0,
                                          float v1) {
#if WG_HAS_BIAS
  if (r < kN) v0 += bias[r];
  if (r + 1 < kN) v1 += bias[r + 1];
#else
  (void)bias;
#endif
  if (kN % 2 == 0 && r + 1 < kN) {
    *reinterpret_cast<float2*>(row + r) = make_float2(v0, v1);
  } else {
    if (r < kN) row[r] = v0;
    if (r + 1 < kN) row[r + 1] = v1;
  }
}

}  // namespace minfer::kern::wg

#ifndef WG_SPLITS
#define WG_SPLITS 1
#endif
#if WG_SPLITS == 1
extern "C" __global__ void __launch_bounds__(minfer::kern::wg::kThreads, 1)
    minfer_wgmma_matmul(const uint16_t* __restrict__ w, const float* __restrict__ bias, const void* __restrict__ x,
                        const minfer::kern::Q8Meta* __restrict__ xmeta, float* __restrict__ out, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  using namespace minfer::kern::wg;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const int m0 = blockIdx.x * kBM, n0 = blockIdx.y * kBN;
  float d[kAcc];
  mainLoop(d, align1024(smem_raw), m0, n0, 0, kKT, n_tokens, w, x, xmeta);
  forEachPair(m0, n0, n_tokens, [&](int tok, int r, int h, int j) {
    storePair(out + static_cast<uint64_t>(tok) * kN, bias, r, d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
  });
}
#else
namespace minfer::kern::wg {
constexpr int kSplits = WG_SPLITS;
static_assert(WG_ACT == 0, "the split form takes f16 activations");
static_assert(kSplits >= 2 && kSplits <= static_cast<int>(kWgmmaSplitMaxSplits) && kSplits <= kKT,
              "WG_SPLITS: 2 … 16, at most one per stage of 64");
// wgmmaSplitLaunchRule's grid, shared memory and counters and the scratch layout are the split tile's.
static_assert(kBM == static_cast<int>(kWgmmaSplitTile.bm) && kBN == static_cast<int>(kWgmmaSplitTile.bn) &&
                  kS == static_cast<int>(kWgmmaSplitTile.stages),
              "the split form runs kWgmmaSplitTile (WG_BM 64, WG_BN 64, WG_STAGES 6)");
}  // namespace minfer::kern::wg

extern "C" __global__ void __launch_bounds__(minfer::kern::wg::kThreads, 2)
    minfer_wgmma_matmul_split(const uint16_t* __restrict__ w, const float* __restrict__ bias,
                              uint8_t* __restrict__ scratch, float* __restrict__ out, unsigned* __restrict__ counters,
                              int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  using namespace minfer::kern::wg;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const int n0 = blockIdx.y * kBN, split = blockIdx.z;
  float* partial = reinterpret_cast<float*>(scratch + wgmmaSplitPartialOffset(kK));  // [split][token][row]
  float d[kAcc];
  mainLoop(d, align1024(smem_raw), 0, n0, split * kKT / kSplits, (split + 1) * kKT / kSplits, n_tokens, w, scratch,
           nullptr);
  auto at = [&](int s, int tok, int r) { return partial + (static_cast<uint64_t>(s) * kBM + tok) * kN + r; };
  forEachPair(0, n0, n_tokens, [&](int tok, int r, int h, int j) {
    if (r < kN) *at(split, tok, r) = d[4 * j + 2 * h];
    if (r + 1 < kN) *at(split, tok, r + 1) = d[4 * j + 2 * h + 1];
  });
  __threadfence();
  __shared__ bool last;
  __syncthreads();
  unsigned* const counter = counters + blockIdx.y;
  if (threadIdx.x == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
    last = before == kSplits - 1;
  }
  __syncthreads();
  if (!last) return;
  if (threadIdx.x == 0) *counter = 0;
  forEachPair(0, n0, n_tokens, [&](int tok, int r, int h, int j) {
    float v0 = 0.0f, v1 = 0.0f;
#pragma unroll 1  // unrolled, ptxas hoists every split's loads: 255 registers and spills at 16 splits
    for (int s = 0; s < kSplits; ++s) {
      v0 += s == split ? d[4 * j + 2 * h] : (r < kN ? __ldcg(at(s, tok, r)) : 0.0f);
      v1 += s == split ? d[4 * j + 2 * h + 1] : (r + 1 < kN ? __ldcg(at(s, tok, r + 1)) : 0.0f);
    }
    storePair(out + static_cast<uint64_t>(tok) * kN, bias, r, v0, v1);
  });
}
#endif
#endif

#if defined(MINFER_DEVICE_CODE) && defined(Q8F16_K)
extern "C" __global__ void __launch_bounds__(minfer::kern::kQ8F16Threads)
    minfer_q8_to_f16(const int8_t* __restrict__ xq, const minfer::kern::Q8Meta* __restrict__ xmeta,
                     uint16_t* __restrict__ x, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  constexpr int kK = Q8F16_K;
  static_assert(kK % 32 == 0, "q8 activations come in blocks of 32");
  const uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // chunk of 16 values
  if (i >= static_cast<uint64_t>(n_tokens) * (kK / 16)) return;
  const uint64_t t = i / (kK / 16), c = (i % (kK / 16)) * 16;
  const uint4 q = *reinterpret_cast<const uint4*>(xq + t * kK + c);
  const float d = xmeta[t * (kK / 32) + c / 32].d;
  uint4 lo, hi;
  dequantQ8x4(q.x, d, lo.x, lo.y);
  dequantQ8x4(q.y, d, lo.z, lo.w);
  dequantQ8x4(q.z, d, hi.x, hi.y);
  dequantQ8x4(q.w, d, hi.z, hi.w);
  uint4* dst = reinterpret_cast<uint4*>(x + t * kK + c);
  dst[0] = lo;
  dst[1] = hi;
}
#endif
