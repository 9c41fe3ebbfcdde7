// Small-batch matmul straight from GGUF blocks on f16 tensor cores (OpKind MatMul, 1 … MMQB_TN q8 rows; the codegen
// gives it the batched steps of kMmqbFromRows … kMmqbMaxRows rows, and the fused forms (q, k, v; gate and up) from
// kMmqbFromRows up to kMmqbFusedMaxRows): out = x · Wᵀ for a kBlocks plane of Q4_K or Q6_K (the plane the decode
// GEMV, gemv_blocks.cuh, reads), so a step of many sequences streams the GGUF's weight bytes once instead of the f16
// plane of the Hopper prefill GEMM (3.6× the bytes at Q4_K), and its dot products run on tensor cores instead of
// the batched GEMV's dp4a (compute-bound past 4 rows).
//
//   out[t][r] = Σ_c w(r,c) · x(t,c) (+ bias[r]),  w = s·q + m (Q4_K: groups of 32, s = d·sc, m = −(dmin·mn),
//   q = 0..15) or s·(q − 32) (Q6_K: groups of 16), x = d·q8 (block_formats.h, quantize_act.cuh)
// with s, m, w, d and x rounded to f16 (w by one f16 fma of q, s and m; x by one f16 product) and f32 accumulation:
// the f16 GEMM's rounding of the weights and activations (wgmma_matmul.cuh) with the GGUF's bytes.
//
// Tiling: a thread block computes TM = 128 weight rows × TN tokens (TN = 16, 32 or 64) with 8 warps of 16 rows
// each, every warp over all TN tokens (TN / 8 MMA tiles of 16×8: the weights, the larger operand, are read from
// shared memory once). K advances one GGUF block (256 columns) per stage through a cp.async pipeline
// (mmqbStages, sized so that two blocks fit on an SM): the raw blocks of the tile's rows (whole 16-byte chunks:
// Q4_K 144 B, Q6_K 224 B) and the tokens' 256 q8 values and 8 Q8Meta. Per stage the activations are converted once
// to an f16 tile (the MMA's B fragments, by ldmatrix), each lane decodes its two rows' scales and mins once (two
// groups per f16x2 register), and dequantizes its A fragments straight from the raw bytes in registers (Q4_K: a
// 32-bit word of qs masked to its low or high nibbles; Q6_K: ql nibbles with the qh bit pairs selected in; small
// integers become f16 by their bits, 0x6400 | q = 1024 + q, one lop3 each), then mma.m16n8k16 (f16, f32
// accumulate). Every n8 tile of the block's tokens runs, also past n_tokens (those sums are never written), so the
// inner loop has no branches. Measured per instruction by Nsight Compute: BENCHMARKS.md (issue 14).
//
// Split-K (MMQB_SPLITS = S > 1, for matrices of few row tiles): grid.y = S; split s takes GGUF blocks
// [s·KB/S, (s+1)·KB/S) of every row, writes its f32 sums to partial[s][t][r], and counts itself in its row
// tile's word of `counters` (a block barrier, a fence, then one acquire-release atomic, as gemv_blocks.cuh's
// GEMVB_GLU does); the tile's last split adds the S partials in split order (+ bias), so the result does not
// depend on which split finishes last, and sets the word back to 0.
//
// Compile-time constants (-D):
//   MMQB_N, MMQB_K        weight rows and cols (K % 256 == 0)
//   MMQB_TYPE             12 (Q4_K) or 14 (Q6_K): the plane's ggml_type
//   MMQB_PITCH            the kBlocks plane's row pitch (bytes, multiple of 16)
//   MMQB_GROUP_PITCH      its group pitch: bytes from one block to the next (multiple of 16, ≥ the block)
//   MMQB_TN               tokens per tile, 16, 32 or 64: the most rows a launch takes (more trap)
//   MMQB_SPLITS           splits of K (1 … K/256): mmqbSplits(N, K) (the fused forms: mmqbSplits(128 · their row
//                         tiles, K))
//   MMQB_HAS_BIAS         bias vector (N f32)
//   MMQB_SEGMENTS         1 (default: minfer_mmq_blocks), 2 or 3 (minfer_mmq_blocks2, minfer_mmq_blocks3, below)
//   MMQB_WGMMA            1: the MMAs as Hopper warpgroup MMAs (sm_90a images only, below); 0 (default): mma.sync
//   MMQB_F16ACT           1 (with MMQB_WGMMA; CodegenOptions::mmqb_f16act): the activations come as f16, staged once
//                         per step by minfer_mmqb_f16_act (below) instead of converted from q8 by every block at every
//                         stage: `xq` points at the tokens' f16 activations (n_tokens × K halves, each group of 16 in
//                         the MMA's k order, mmqbF16ActOrder) and `xmeta` is unused. Each stage copies them straight
//                         into the warpgroup MMA's swizzled tiles (mmqbF16StageBytes): no f16 tile, no dequantization
//                         of the activations and no second barrier per stage. `partial` is then the step's scratch
//                         that also holds the activations: the partials start at mmqbF16PartialOffset(TN, K). It
//                         applies to every segment of the fused forms; the launch rules' smem with f16act true.
//                         Measured on an H100 (BENCHMARKS.md, issue 14): the plain kernel alone at 64 rows
//                         (minfer-bench-gemv --mmqb-f16act, the staging launch not counted) gate −12%, down −15%
//                         against the q8 warpgroup form, every output bit for bit equal; the 7B's aggregate decode at
//                         64 sequences with the fused launches +3.4%.
// Launch ABI:  minfer_mmq_blocks(const uint8_t* w, const float* bias, const int8_t* xq, const Q8Meta* xmeta,
//                                float* out, float* partial, unsigned* counters, int n_tokens)
//   w: the kBlocks plane; xq, xmeta: the q8 input buffer (width K; MMQB_F16ACT: xq the f16 activations, xmeta
//   unused); out: n_tokens × N f32 (row stride N);
//   partial: mmqbPartialBytes() of scratch (null with one split; MMQB_F16ACT: the scratch `xq` points at, of
//   mmqbF16ScratchBytes(TN, K, mmqbPartialBytes()) bytes, whose first mmqbF16PartialOffset(TN, K) bytes the kernel
//   skips: xq and partial alias one allocation on purpose, their ranges disjoint); counters: mmqbCounterBytes() of
//   words, zero on entry and again on exit (ArgKind Counters; unused with one split).
// Launch shape: mmqbLaunchRule(): grid (⌈N/128⌉, S), 256 threads, mmqbSmemBytes() of dynamic shared memory
// (MMQB_F16ACT: mmqbF16SmemBytes()).
//
// The warpgroup form (MMQB_WGMMA = 1, sm_90a): the same tiles, stages, dequantization and rounding, but each group of
// 16 columns is one wgmma.m64n{TN}k16 per warpgroup (the block's two warpgroups take 64 rows each) with the A fragment
// from the registers the lanes dequantized it into (wgmma's register fragment of a warp's 16 rows is mma.m16n8k16's)
// and B, the f16 activations, read by the tensor cores straight from shared memory: the f16 tile is stored as four
// K-major 64-column tiles of TN rows × 128 bytes in the 128-byte swizzle (wgmma.cuh) instead of padded rows for
// ldmatrix, so no lane loads B and a warpgroup reads it once instead of each warp. The MMAs run asynchronously while
// the lanes dequantize the next group; the accumulator layout is mma.sync's, so the epilogue is shared. The sums are
// the same f16 products in f32 (measured bit for bit mma.sync's on the H200 by minfer-bench-gemv --mmqb-wgmma; the GPU
// test holds both forms to the f16 bound).
//
// The fused forms over two or three matrices of one input (gate and up, or q, k, v of a layer; MMQB_SEGMENTS 2 or 3,
// entries minfer_mmq_blocks2 and minfer_mmq_blocks3): segment 0 takes the constants above, segment 1 MMQB_N1,
// MMQB_TYPE1, MMQB_PITCH1, MMQB_GROUP_PITCH1, MMQB_HAS_BIAS1 and segment 2 likewise …2 (K, TN and the splits are
// shared). Each tile runs as the plain kernel's with the same splits, so every output equals what minfer_mmq_blocks
// with that matrix's constants and the same MMQB_SPLITS writes; one launch instead of three fills the GPU where k and
// v alone take a few row tiles (the 7B's 512 rows: 4), and gate and up share one split count and one wave tail.
//   minfer_mmq_blocks2(w0, bias0, w1, bias1, xq, xmeta, out0, out1, partial, counters, n_tokens)
//   minfer_mmq_blocks3(w0, bias0, w1, bias1, w2, bias2, xq, xmeta, out0, out1, out2, partial, counters, n_tokens)
//   partial: mmqbFusedPartialBytes(), counters: mmqbFusedCounterBytes() (zero on entry and exit);
//   mmqbFusedLaunchRule().
//
// The activations of the MMQB_F16ACT form (MMQB_ACT_K = K, a multiple of 256; no other constant):
//   minfer_mmqb_f16_act(const int8_t* xq, const Q8Meta* xmeta, uint16_t* x16, int n_tokens)
//   x16[t][16g + p] = round_to_f16(xq[t][16g + k] · round_to_f16(d(t, (16g + k) / 32))), k = mmqbF16ActOrder(p):
//   the values and rounding the q8 form's per-stage conversion gives, in the order it stores them. x16: n_tokens × K
//   halves (mmqbF16ActBytes of the step's scratch). mmqbF16ActLaunchRule(K): one thread per group of 16 (a 16-byte
//   load of q8, two 16-byte stores of f16): one pass over the input.
#pragma once

#include "kernels/common.cuh"
#include "kernels/wgmma.cuh"

namespace minfer::kern {

constexpr unsigned kMmqbThreads = 256;
constexpr unsigned kMmqbTM = 128;  // weight rows per thread block: 16 per warp
// The rows of a small-batch step it takes (compiler/codegen/ops/matmul.cpp smallBatchBlocksMatmul): from
// kMmqbFromRows (below, the batched GEMV of gemv_blocks.cuh is faster) to kMmqbMaxRows (above, the Hopper f16 GEMM of
// the prefill plan); measured on an H200, BENCHMARKS.md. Models with experts keep the batched GEMV and the GEMM: the
// f16 rounding here moved a near-tie MoE router row of tiny-qwen3moe to another expert (batched vs alone 0.11).
constexpr unsigned kMmqbFromRows = 5;
constexpr unsigned kMmqbMaxRows = 32;
// The same bound for the fused forms (minfer_mmq_blocks3: q, k and v in one launch; minfer_mmq_blocks2: gate and up,
// below): their tiles of 64 tokens serve 33 … 64 rows, where the Hopper f16 GEMMs launched one after another measured
// slower (BENCHMARKS.md, issue 14).
constexpr unsigned kMmqbFusedMaxRows = 64;
constexpr unsigned kMmqbMaxSegments = 3;  // matrices of one fused launch (MMQB_SEGMENTS)
// The tiles the warpgroup form (MMQB_WGMMA) takes where the codegen may use it: those of 64 tokens (the fused forms'
// only: the plain kernel's tiles stop at kMmqbMaxRows). Measured on an H200 against mma.sync, µs per launch
// (minfer-bench-gemv --mmqb-wgmma, BENCHMARKS.md 2026-12-05): 64 rows gate −12%, q −7%, k −3%, down −3%; 32 rows
// −3 … +2.5%; 16 rows +1.5 … +8.8%.
MINFER_HD constexpr bool mmqbWarpgroupTile(unsigned tn) { return tn == 64; }
constexpr unsigned kMmqbLD = 256 + 16;  // q8 activation row of a stage (bytes)
constexpr unsigned kMmqbLDH = 256 + 8;  // f16 tile row (halves): 132 words, so ldmatrix's 8 rows hit distinct banks
constexpr unsigned kMmqbSmemMax = 227 * 1024;  // dynamic shared memory of one block on sm_90 (opt-in)
// Shared memory one block may take so that two fit on an SM (each block also takes 1 KiB of the SM's 228 KiB, and 16
// bytes of static shared memory).
constexpr unsigned kMmqbSmemBudget = 113 * 1024;
// Dynamic shared memory reserved to align the f16 tile (MMQB_F16ACT: the stages) to 1024 bytes (the warpgroup form's
// 128-byte swizzle).
constexpr unsigned kMmqbAlignSlack = 1024;

// Shared-memory row of one raw block (bytes): Q4_K 144 (36 words: rows g = 0..7 of an A-fragment load fall on
// banks 4g + t), Q6_K 224 B padded to 240 (60 words: likewise; at 56 words rows g and g + 4 would collide).
MINFER_HD constexpr unsigned mmqbRawLd(unsigned type) { return type == 12 ? 144 : 240; }
// 16-byte chunks copied per row and block (Q6_K: its 210 bytes and the padding to 224).
MINFER_HD constexpr unsigned mmqbRawChunks(unsigned type) { return type == 12 ? 9 : 14; }
// One pipeline stage: raw blocks TM × mmqbRawLd, activations TN × kMmqbLD int8, Q8Meta 8 × TN.
MINFER_HD constexpr unsigned mmqbStageBytes(unsigned type, unsigned tn) {
  return kMmqbTM * mmqbRawLd(type) + tn * kMmqbLD + 8 * tn * 8;
}
// The f16 activation tile the MMAs read: TN × kMmqbLDH halves (the warpgroup form's four swizzled 64-column tiles,
// 4 · TN · 128 bytes, fit inside it).
MINFER_HD constexpr unsigned mmqbTileBytes(unsigned tn) { return tn * kMmqbLDH * 2; }
// Stages of `stage_bytes` in the cp.async pipeline beside `fixed_bytes` of other shared memory: as many as fit in
// kMmqbSmemBudget, 2 … 4 (2 where even those exceed it: one block per SM).
MINFER_HD constexpr unsigned mmqbStagesFitting(unsigned stage_bytes, unsigned fixed_bytes) {
  unsigned s = 4;
  while (s > 2 && s * stage_bytes + fixed_bytes > kMmqbSmemBudget) --s;
  return s;
}
// Raw stages of the q8 form: beside the f16 tile and the alignment slack (Q4_K: 4, 3, 2 at 16, 32, 64 tokens; Q6_K: 2;
// Q6_K at 64 tokens exceeds the budget: one block per SM).
MINFER_HD constexpr unsigned mmqbStages(unsigned type, unsigned tn) {
  return mmqbStagesFitting(mmqbStageBytes(type, tn), mmqbTileBytes(tn) + kMmqbAlignSlack);
}
MINFER_HD constexpr unsigned mmqbSmemBytes(unsigned type, unsigned tn) {
  return mmqbStages(type, tn) * mmqbStageBytes(type, tn) + mmqbTileBytes(tn) + kMmqbAlignSlack;
}
// MMQB_F16ACT: a stage is the raw blocks and the f16 activations of the block column as four 64-column tiles of TN
// rows × 128 bytes (TN · 512 bytes; every part 1024-byte aligned); no f16 tile; stages beside the alignment slack
// alone (the same counts as mmqbStages').
MINFER_HD constexpr unsigned mmqbF16StageBytes(unsigned type, unsigned tn) { return kMmqbTM * mmqbRawLd(type) + tn * 512; }
MINFER_HD constexpr unsigned mmqbF16Stages(unsigned type, unsigned tn) {
  return mmqbStagesFitting(mmqbF16StageBytes(type, tn), kMmqbAlignSlack);
}
MINFER_HD constexpr unsigned mmqbF16SmemBytes(unsigned type, unsigned tn) {
  return mmqbF16Stages(type, tn) * mmqbF16StageBytes(type, tn) + kMmqbAlignSlack;
}
// The k (0 … 15) of a group of 16 that f16 activation p of the group holds for MMQB_F16ACT: the MMA's k order of the
// q8 form's f16 tile (halves 2t, 2t + 1 = k 4t, 4t + 2; halves 8 + 2t, 9 + 2t = k 4t + 1, 4t + 3).
MINFER_HD constexpr unsigned mmqbF16ActOrder(unsigned p) {
  return p < 8 ? 4 * (p / 2) + 2 * (p % 2) : 4 * ((p - 8) / 2) + 1 + 2 * (p % 2);
}
// MMQB_F16ACT's scratch: the f16 activations of up to `tn` tokens (K wide) at byte 0, then, from the next 256-byte
// boundary, the split-K partials (mmqbPartialBytes or mmqbFusedPartialBytes: `partial_bytes`).
MINFER_HD constexpr unsigned long long mmqbF16ActBytes(unsigned tn, unsigned k) { return 2ull * tn * k; }
MINFER_HD constexpr unsigned long long mmqbF16PartialOffset(unsigned tn, unsigned k) {
  return (mmqbF16ActBytes(tn, k) + 255) / 256 * 256;
}
MINFER_HD constexpr unsigned long long mmqbF16ScratchBytes(unsigned tn, unsigned k, unsigned long long partial_bytes) {
  return mmqbF16PartialOffset(tn, k) + partial_bytes;
}
// Dynamic shared memory of a block of either form.
MINFER_HD constexpr unsigned mmqbFormSmemBytes(unsigned type, unsigned tn, bool f16act) {
  return f16act ? mmqbF16SmemBytes(type, tn) : mmqbSmemBytes(type, tn);
}
constexpr unsigned kMmqbActThreads = 256;
MINFER_HD LaunchRule mmqbF16ActLaunchRule(unsigned k) {
  LaunchRule r;
  r.grid[0] = perToken(k / 16, kMmqbActThreads);
  r.block.x = kMmqbActThreads;
  return r;
}
// The split-K scratch: S × TN × N f32 (none with one split); the counters: one word per row tile.
MINFER_HD unsigned long long mmqbPartialBytes(unsigned n, unsigned tn, unsigned splits) {
  return splits > 1 ? 4ull * splits * tn * n : 0;
}
MINFER_HD unsigned mmqbCounterBytes(unsigned n) { return 4 * ceilDiv(n, kMmqbTM); }

// Splits of K, each at least 2 GGUF blocks long: of the counts from half of `fill` (the fewest that give the 264
// thread blocks a 132-SM Hopper runs at once, two per SM) to twice it, the one whose last wave is fullest (the blocks
// run in waves of 264: 296 blocks take two), the fewest splits on a tie (longer blocks: fewer pipeline fills and
// split-K sums). Measured on an H200 (minfer-bench-gemv --mmqb-splits, BENCHMARKS.md 2026-12-05): the 7B's down
// projection at 32 rows 50.5 µs with 18 splits (504 blocks), 40.5 µs with 9 (252: one wave); its gate 39.9 µs with 3
// (444 blocks), 41.9 with 2, 40.3 with 4.
MINFER_HD unsigned mmqbSplits(unsigned n, unsigned k) {
  constexpr unsigned kSlots = 264;
  const unsigned tiles = ceilDiv(n, kMmqbTM), most = k / 256 / 2 < 1 ? 1 : k / 256 / 2;
  const unsigned fill = ceilDiv(kSlots, tiles);
  if (fill > most) return most;
  const unsigned first = fill / 2 < 1 ? 1 : fill / 2;
  unsigned best = first;
  double best_last_wave = 0;
  for (unsigned s = first; s <= 2 * fill && s <= most; ++s) {
    const unsigned blocks = tiles * s;
    const double last_wave = static_cast<double>(blocks) / (kSlots * ceilDiv(blocks, kSlots));
    if (last_wave > best_last_wave + 1e-9) {
      best_last_wave = last_wave;
      best = s;
    }
  }
  return best;
}

// f16act: the MMQB_F16ACT form's shared memory.
MINFER_HD LaunchRule mmqbLaunchRule(unsigned n, unsigned type, unsigned tn, unsigned splits, bool f16act) {
  LaunchRule r;
  r.grid[0] = fixedExtent(ceilDiv(n, kMmqbTM));
  r.grid[1] = fixedExtent(splits);
  r.block.x = kMmqbThreads;
  r.smem = mmqbFormSmemBytes(type, tn, f16act);
  return r;
}

// The fused forms (MMQB_SEGMENTS = segs, 2 or 3): segs matrices of one input in one launch, n[i] rows of type[i]
// each (i < segs). Their row tiles are the matrices' side by side; the scratch S × TN × (n[0] + … ) f32, the counters
// one word per row tile, the shared memory the largest segment's (each segment keeps its own stages).
MINFER_HD unsigned mmqbFusedTiles(const unsigned* n, unsigned segs) {
  unsigned tiles = 0;
  for (unsigned i = 0; i < segs; ++i) tiles += ceilDiv(n[i], kMmqbTM);
  return tiles;
}
MINFER_HD unsigned long long mmqbFusedPartialBytes(const unsigned* n, unsigned segs, unsigned tn, unsigned splits) {
  unsigned rows = 0;
  for (unsigned i = 0; i < segs; ++i) rows += n[i];
  return mmqbPartialBytes(rows, tn, splits);
}
MINFER_HD unsigned mmqbFusedCounterBytes(const unsigned* n, unsigned segs) { return 4 * mmqbFusedTiles(n, segs); }
MINFER_HD LaunchRule mmqbFusedLaunchRule(const unsigned* n, const unsigned* type, unsigned segs, unsigned tn,
                                         unsigned splits, bool f16act) {
  LaunchRule r;
  r.grid[0] = fixedExtent(mmqbFusedTiles(n, segs));
  r.grid[1] = fixedExtent(splits);
  r.block.x = kMmqbThreads;
  unsigned smem = 0;
  for (unsigned i = 0; i < segs; ++i) {
    const unsigned b = mmqbFormSmemBytes(type[i], tn, f16act);
    smem = b > smem ? b : smem;
  }
  r.smem = smem;
  return r;
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE)
namespace minfer::kern::mmqb {

// f16x2 arithmetic (PTX sub/mul/fma .f16x2, round to nearest even).
__device__ __forceinline__ unsigned hsub2(unsigned a, unsigned b) {
  unsigned d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ unsigned hmul2(unsigned a, unsigned b) {
  unsigned d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ unsigned hfma2(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ unsigned half2Of(float v) {
  const unsigned h = f2h(v);
  return h | (h << 16);
}
// prmt with an immediate selector: output byte i = byte kSel[4i..4i+3] of {b (bytes 4..7), a (bytes 0..3)}.
template <unsigned kSel>
__device__ __forceinline__ unsigned prmtImm(unsigned a, unsigned b) {
  unsigned d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "n"(kSel));
  return d;
}
// The low or the high half of an f16x2 in both halves.
__device__ __forceinline__ unsigned lowTwice(unsigned v) { return prmtImm<0x1010u>(v, v); }
__device__ __forceinline__ unsigned highTwice(unsigned v) { return prmtImm<0x3232u>(v, v); }
// Bytes 0 and 2 of q, biased by 128 (signed → unsigned), as the f16x2 (1024 + 128 + byte): one lop3 (b ? a ^ c : c
// with b = 0x00FF00FF, c = 0x64806480, the PTX ISA's truth table F(0xF0, 0xCC, 0xAA) = 0x6A).
__device__ __forceinline__ unsigned signedBytesPlus1152(unsigned q) {
  unsigned d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(q), "r"(0x00FF00FFu), "r"(0x64806480u));
  return d;
}
// Small integers as f16 by their bits: 0x6400 | b is the f16 1024 + b for 0 ≤ b < 1024, so (v & mask) | 0x64006400
// holds 1024 + the two masked fields; subtracting 1024 + an offset is exact.
constexpr unsigned kF16Of1024 = 0x64006400u;
// (v & kMask) | kF16Of1024 with the constant in a register: one lop3 ((a & b) | c, truth table 0xEA), where the compiler
// would spend two (a SASS lop3 takes one immediate).
template <unsigned kMask>
__device__ __forceinline__ unsigned bitsPlus1024(unsigned v) {
  unsigned d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(v), "r"(kMask), "r"(kF16Of1024));
  return d;
}
// The bits of a where mask is set, of b elsewhere: one lop3 ((a & c) | (b & ~c), truth table 0xE4).
__device__ __forceinline__ unsigned bitSelect(unsigned a, unsigned b, unsigned mask) {
  unsigned d;
  asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(d) : "r"(a), "r"(b), "r"(mask));
  return d;
}

// The 16 q8 values `q` (lowest byte first) times the f16x2 `d2` (d rounded to f16, twice) as 16 f16 in the MMA's k
// order (mmqbF16ActOrder): `first` the halves 0 … 7 (k 4t, 4t + 2 for t = 0 … 3), `last` 8 … 15 (k 4t + 1, 4t + 3);
// q + 1152 − 1152 is exact in f16, so each value is round_to_f16(q · d) once.
__device__ __forceinline__ void q8GroupToF16(uint4 q, unsigned d2, uint4& first, uint4& last) {
  constexpr unsigned k1152 = 0x64806480u;  // f16x2 (1152, 1152): 1024 + the byte bias 128
  const unsigned qw[4] = {q.x, q.y, q.z, q.w};
  unsigned o[8];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    o[t] = hmul2(hsub2(signedBytesPlus1152(qw[t]), k1152), d2);
    o[4 + t] = hmul2(hsub2(signedBytesPlus1152(qw[t] >> 8), k1152), d2);
  }
  first = {o[0], o[1], o[2], o[3]};
  last = {o[4], o[5], o[6], o[7]};
}

}  // namespace minfer::kern::mmqb
#endif

#if defined(MINFER_DEVICE_CODE) && defined(MMQB_ACT_K)
// The MMQB_F16ACT form's activations (see the top of this file): thread i converts group of 16 i % (K/16) of token
// i / (K/16).
extern "C" __global__ void __launch_bounds__(minfer::kern::kMmqbActThreads)
    minfer_mmqb_f16_act(const int8_t* __restrict__ xq, const minfer::kern::Q8Meta* __restrict__ xmeta,
                        uint16_t* __restrict__ x16, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern::mmqb;
  constexpr int kK = MMQB_ACT_K;
  static_assert(kK % 256 == 0, "MMQB_ACT_K must be a multiple of 256 (mmq_blocks' K)");
  const uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<uint64_t>(n_tokens) * (kK / 16)) return;
  const uint64_t t = i / (kK / 16), c = (i % (kK / 16)) * 16;
  uint4 first, last;
  q8GroupToF16(*reinterpret_cast<const uint4*>(xq + t * kK + c), half2Of(xmeta[t * (kK / 32) + c / 32].d), first, last);
  uint4* dst = reinterpret_cast<uint4*>(x16 + t * kK + c);
  dst[0] = first;
  dst[1] = last;
}
#endif

#if defined(MINFER_DEVICE_CODE) && defined(MMQB_N)
#ifndef MMQB_SEGMENTS
#define MMQB_SEGMENTS 1
#endif
#ifndef MMQB_WGMMA
#define MMQB_WGMMA 0
#endif
#if MMQB_WGMMA && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "MMQB_WGMMA needs an sm_90a image (wgmma): compile for sm_90a or leave MMQB_WGMMA 0"
#endif
namespace minfer::kern::mmqb {

constexpr int kK = MMQB_K, kTN = MMQB_TN, kS = MMQB_SPLITS;
constexpr int kTM = static_cast<int>(kMmqbTM), kLD = static_cast<int>(kMmqbLD), kLDH = static_cast<int>(kMmqbLDH);
constexpr int kNI = kTN / 8;  // n8 tiles per warp: every warp takes all the tile's tokens, 16 rows each
constexpr int kKB = kK / 256;  // GGUF blocks per row
constexpr int kThreads = static_cast<int>(kMmqbThreads);
static_assert(kK % 256 == 0, "MMQB_K must be a multiple of 256");
static_assert(kTN == 16 || kTN == 32 || kTN == 64, "MMQB_TN must be 16, 32 or 64");
static_assert(kTM == 16 * kThreads / 32, "a warp per 16 rows");
static_assert(kS >= 1 && kS <= kKB, "MMQB_SPLITS: 1 … K/256");
static_assert(MMQB_WGMMA == 0 || MMQB_WGMMA == 1, "MMQB_WGMMA must be 0 or 1");
#ifndef MMQB_F16ACT
#define MMQB_F16ACT 0
#endif
static_assert(MMQB_F16ACT == 0 || MMQB_F16ACT == 1, "MMQB_F16ACT must be 0 or 1");
static_assert(MMQB_F16ACT == 0 || MMQB_WGMMA == 1, "MMQB_F16ACT is for the warpgroup form");
constexpr bool kF16Act = MMQB_F16ACT != 0;
static_assert(4 * kTN * 128 <= static_cast<int>(mmqbTileBytes(kTN)) && mmqbTileBytes(kTN) % 16 == 0,
              "the warpgroup form's tiles fit in the f16 tile; the stages after it start 16-byte aligned");
static_assert(static_cast<unsigned long long>(kTN) * kK < (1ull << 31), "loadStage's 32-bit offsets inside a tile");

// One weight matrix of the launch (a segment: the plain kernel has one, minfer_mmq_blocks2 two, minfer_mmq_blocks3
// three): its rows, its kBlocks plane's type, row pitch and group pitch, whether it has a bias; the stage layout that
// follows from its type.
template <int kN_, int kType_, unsigned long long kPitch_, unsigned kGroupPitch_, bool kBias_>
struct Segment {
  static constexpr int kN = kN_;
  static constexpr bool kQ4K = kType_ == 12;
  static constexpr unsigned long long kPitch = kPitch_;
  static constexpr unsigned kGroupPitch = kGroupPitch_;
  static constexpr bool kBias = kBias_;
  static constexpr int kRawLd = static_cast<int>(mmqbRawLd(kType_)), kChunks = static_cast<int>(mmqbRawChunks(kType_));
  static constexpr int kStages = static_cast<int>(kF16Act ? mmqbF16Stages(kType_, kTN) : mmqbStages(kType_, kTN));
  static constexpr int kStageBytes =
      static_cast<int>(kF16Act ? mmqbF16StageBytes(kType_, kTN) : mmqbStageBytes(kType_, kTN));
  static constexpr int kActAt = kTM * kRawLd, kMetaAt = kActAt + kTN * kLD;  // byte offsets inside a stage
  static_assert(!kF16Act || (kActAt % 1024 == 0 && kStageBytes % 1024 == 0),
                "MMQB_F16ACT: each stage's activation tiles 1024-byte aligned (the 128-byte swizzle)");
  static constexpr int kTiles = (kN_ + kTM - 1) / kTM;
  static_assert(kType_ == 12 || kType_ == 14, "MMQB_TYPE must be Q4_K (12) or Q6_K (14)");
  static_assert(kN_ >= 1, "a segment has rows");
  static_assert((kF16Act ? mmqbF16SmemBytes(kType_, kTN) : mmqbSmemBytes(kType_, kTN)) <= kMmqbSmemMax,
                "dynamic shared memory above the sm_90 opt-in limit");
  static_assert(kPitch_ % 16 == 0 && kGroupPitch_ % 16 == 0, "blocks must start 16-byte aligned");
  static_assert(kGroupPitch_ >= 16 * mmqbRawChunks(kType_), "group pitch smaller than the copied chunks");
  static_assert(kPitch_ >= static_cast<unsigned long long>(kKB) * kGroupPitch_, "row pitch smaller than a row");
  static_assert(static_cast<unsigned long long>(kTM) * kPitch_ < (1ull << 31), "loadStage's 32-bit offsets inside a tile");
};

MINFER_HD constexpr int iters(int items) { return (items + kThreads - 1) / kThreads; }

struct Stage {
  uint8_t* raw;  // [TM][S::kRawLd]
  int8_t* act;   // [TN][kLD] (MMQB_F16ACT: the four swizzled f16 tiles)
  Q8Meta* x;     // [8][TN]
};
template <class S>
__device__ __forceinline__ Stage stageAt(uint8_t* smem, int i) {
  uint8_t* p = smem + i * S::kStageBytes;
  return {p, reinterpret_cast<int8_t*>(p + S::kActAt), reinterpret_cast<Q8Meta*>(p + S::kMetaAt)};
}

// Issues the cp.async copies of GGUF block column `blk` into the stage at shared address `st` (stageAt's layout; rows
// past N and tokens past n_tokens zero-filled). Each copy's source is the block column's (uniform) base plus a 32-bit
// offset, so a copy costs a few integer instructions (MMQB_F16ACT's activations: 64-bit offsets).
template <class S>
__device__ __forceinline__ void loadStage(unsigned st, int blk, int m0, int n_tokens, const uint8_t* w, const int8_t* xq,
                                          const Q8Meta* xmeta) {
  const uint8_t* wb = w + static_cast<uint64_t>(m0) * S::kPitch + static_cast<uint64_t>(blk) * S::kGroupPitch;
#pragma unroll
  for (int i = 0; i < iters(kTM * S::kChunks); ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kThreads;
    if ((kTM * S::kChunks) % kThreads != 0 && c >= kTM * S::kChunks) break;
    const int row = c / S::kChunks, ch = c % S::kChunks;
    const bool ok = S::kN % kTM == 0 || m0 + row < S::kN;
    cpAsyncShared<16>(st + row * S::kRawLd + 16 * ch,
                      ok ? wb + static_cast<unsigned>(row * static_cast<int>(S::kPitch) + 16 * ch) : w, ok);
  }
  if constexpr (kF16Act) {
    // The tokens' f16 activations of the block column (512 bytes a token) into the four swizzled 64-column tiles:
    // 16-byte chunk ch of token tok to tile ch / 8, chunk ch % 8 of row tok.
    const uint16_t* x16 = reinterpret_cast<const uint16_t*>(xq);
#pragma unroll
    for (int i = 0; i < iters(kTN * 32); ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * kThreads;
      if ((kTN * 32) % kThreads != 0 && c >= kTN * 32) break;
      const int tok = c / 32, ch = c % 32;
      const bool ok = tok < n_tokens;
      cpAsyncShared<16>(st + S::kActAt + (ch / 8) * kTN * 128 + swizzled(tok, ch % 8),
                        ok ? x16 + static_cast<uint64_t>(tok) * kK + 256 * blk + 8 * ch : x16, ok);
    }
    return;
  }
  const int8_t* xb = xq + 256 * blk;
#pragma unroll
  for (int i = 0; i < iters(kTN * 16); ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kThreads;
    if ((kTN * 16) % kThreads != 0 && c >= kTN * 16) break;
    const int tok = c / 16, ch = c % 16;
    const bool ok = tok < n_tokens;
    cpAsyncShared<16>(st + S::kActAt + tok * kLD + 16 * ch, ok ? xb + static_cast<unsigned>(tok * kK + 16 * ch) : xq, ok);
  }
  const Q8Meta* mb = xmeta + 8 * blk;
#pragma unroll
  for (int i = 0; i < iters(8 * kTN); ++i) {
    const int e = static_cast<int>(threadIdx.x) + i * kThreads;
    if ((8 * kTN) % kThreads != 0 && e >= 8 * kTN) break;
    const int tok = e % kTN, kb = e / kTN;
    const bool ok = tok < n_tokens;
    const Q8Meta* src = ok ? mb + static_cast<unsigned>(tok * (kK / 32) + kb) : xmeta;
    cpAsyncShared<8>(st + S::kMetaAt + static_cast<int>(sizeof(Q8Meta)) * e, src, ok);
  }
}

// The k order inside each group of 16 that the MMA sees (any order works when A and B agree): fragment register
// a0 / b0 (MMA k 2t, 2t + 1) holds k 4t and 4t + 2, a2 / b1 (MMA k 8 + 2t, 9 + 2t) holds k 4t + 1 and 4t + 3, so that
// one 32-bit word of four consecutive quants, masked as 0x00FF00FF and shifted by 8, gives both registers.

// The f16 tile's byte offset of the 8 halves `h` (0: the first 8 of the MMA's k order, 1: the last 8) of group of 16 `c`
// of activation block `kb` of token `tok`: mma.sync form b[TN][kLDH] (padded rows, ldmatrix); warpgroup form four
// 64-column tiles of TN rows × 128 bytes, 128-byte swizzle (group kg = 2kb + c: tile kg / 4, 16-byte chunks
// 2 (kg % 4) + h of the row).
__device__ __forceinline__ int tileOffset(int tok, int kb, int c, int h) {
  if constexpr (MMQB_WGMMA) {
    const int kg = 2 * kb + c;
    return (kg / 4) * kTN * 128 + swizzled(tok, 2 * (kg % 4) + h);
  } else {
    return 2 * (tok * kLDH + 32 * kb + 16 * c + 8 * h);
  }
}

// The tokens' q8 values of the stage as f16 d·q (one f16 rounding of d and of the product) in the f16 tile `b`
// (tileOffset's layout), each group of 16 stored in the MMA's k order above (halves 2t, 2t + 1 = k 4t, 4t + 2; halves
// 8 + 2t, 9 + 2t = k 4t + 1, 4t + 3), so ldmatrix gives the B fragments (the warpgroup MMA reads the same k order).
// Tokens past n_tokens are left as they are (their sums are not written).
__device__ __forceinline__ void dequantActivations(const Stage& st, uint8_t* b, int n_tokens) {
#pragma unroll
  for (int i = 0; i < iters(8 * kTN); ++i) {
    const int item = static_cast<int>(threadIdx.x) + i * kThreads;
    if ((8 * kTN) % kThreads != 0 && item >= 8 * kTN) break;
    const int tok = item % kTN, kb = item / kTN;
    if (tok >= n_tokens) continue;
    const unsigned d2 = half2Of(st.x[kb * kTN + tok].d);
#pragma unroll
    for (int c = 0; c < 2; ++c) {  // the two groups of 16 of the activation block
      uint4 first, last;
      q8GroupToF16(*reinterpret_cast<const uint4*>(st.act + tok * kLD + 32 * kb + 16 * c), d2, first, last);
      *reinterpret_cast<uint4*>(b + tileOffset(tok, kb, c, 0)) = first;
      *reinterpret_cast<uint4*>(b + tileOffset(tok, kb, c, 1)) = last;
    }
  }
}

// One lane's A fragment (rows g and g + 8 of its warp's 16, MMA k order above) of group c (16 weights) of activation
// block kb of the raw blocks `r0`, `r8`, as f16 weights: Q4_K w = s·q + m (one f16 fma), Q6_K w = s·(q − 32).
// s2, m2: the f16x2 scale and min of rows g (index 0) and g + 8 (index 1) for this group.
template <bool kQ4K>
__device__ __forceinline__ void weightFragment(const uint8_t* r0, const uint8_t* r8, int kb, int c, int t,
                                              const unsigned (&s2)[2], const unsigned (&m2)[2], unsigned (&a)[4]) {
  const uint8_t* rows[2] = {r0, r8};
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    unsigned e, o;  // the f16x2 1024 + q of MMA k (4t, 4t + 2) and (4t + 1, 4t + 3)
    if constexpr (kQ4K) {
      // Sub-block kb = 2p + h: qs bytes [32p, 32p + 32) at block byte 16, nibble h.
      const int p = kb / 2, h = kb % 2;
      const unsigned v = *reinterpret_cast<const unsigned*>(rows[ri] + 16 + 32 * p + 16 * c + 4 * t);
      e = bitsPlus1024<0x000F000Fu>(v >> (4 * h));
      o = bitsPlus1024<0x000F000Fu>(v >> (4 * h + 8));
    } else {
      // Activation block kb = 4n + k: ql bytes [64n + 32(k & 1), +32) nibble k >> 1, qh bytes [128 + 32n, +32) bit
      // pair k (ggml's dequantize_row_q6_K), the pair moved to bits 4..5 of each byte; bits 6..7 of q hold other
      // pairs, which the 6-bit masks below drop.
      const int n = kb / 4, k = kb % 4;
      const unsigned lo = *reinterpret_cast<const unsigned*>(rows[ri] + 64 * n + 32 * (k & 1) + 16 * c + 4 * t);
      const unsigned hi = *reinterpret_cast<const unsigned*>(rows[ri] + 128 + 32 * n + 16 * c + 4 * t);
      const unsigned q = bitSelect(lo >> (4 * (k >> 1)), k < 2 ? hi << (4 - 2 * k) : hi >> (2 * k - 4), 0x0F0F0F0Fu);
      e = bitsPlus1024<0x003F003Fu>(q);
      o = bitsPlus1024<0x003F003Fu>(q >> 8);
    }
    if constexpr (kQ4K) {
      a[ri] = hfma2(hsub2(e, kF16Of1024), s2[ri], m2[ri]);
      a[2 + ri] = hfma2(hsub2(o, kF16Of1024), s2[ri], m2[ri]);
    } else {
      constexpr unsigned k1056 = 0x64206420u;  // f16x2 (1056, 1056): 1024 + the 6-bit offset 32
      a[ri] = hmul2(hsub2(e, k1056), s2[ri]);
      a[2 + ri] = hmul2(hsub2(o, k1056), s2[ri]);
    }
  }
}

// Bytes 2j, 2j + 1 (j = 0, 1) of v as the f16x2 (1024 + byte 2j, 1024 + byte 2j + 1).
template <int kJ>
__device__ __forceinline__ unsigned bytePairPlus1024(unsigned v) {
  return prmtImm<kJ == 0 ? 0x4140u : 0x4342u>(v, 0x64646464u);
}

// One raw block's f16 scale factors for a lane's row, computed once per stage, two groups per f16x2 register (halves:
// groups 2i, 2i + 1): Q4_K s = d·sc and m = −dmin·mn of sub-blocks 2i, 2i + 1 (the 6-bit scales and mins unpacked as
// block_formats.h kScaleMin, gemv_blocks.cuh decodePart); Q6_K s = d·sc of groups 2i, 2i + 1 (signed scales). The
// integers become f16 by their bits, then one f16 product: the value of rounding the exact f32 product once.
template <bool kQ4K>
struct RowScales {
  unsigned s[kQ4K ? 4 : 8];
  unsigned m[kQ4K ? 4 : 1];  // Q6_K: unused
};
template <bool kQ4K>
__device__ __forceinline__ RowScales<kQ4K> rowScales(const uint8_t* blk) {
  RowScales<kQ4K> r;
  if constexpr (kQ4K) {
    const uint4 head = *reinterpret_cast<const uint4*>(blk);
    const unsigned d2 = prmtImm<0x1010u>(head.x, 0);                   // (d, d)
    const unsigned dmin2 = prmtImm<0x3232u>(head.x, 0) ^ 0x80008000u;  // (−dmin, −dmin)
    const unsigned sc[4] = {head.y & 0x3F3F3F3Fu, (head.w & 0x0F0F0F0Fu) | ((head.y >> 2) & 0x30303030u),
                            head.z & 0x3F3F3F3Fu, ((head.w >> 4) & 0x0F0F0F0Fu) | ((head.z >> 2) & 0x30303030u)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // scales in sc[0..1], mins in sc[2..3], one byte each
      const unsigned sp = i % 2 ? bytePairPlus1024<1>(sc[i / 2]) : bytePairPlus1024<0>(sc[i / 2]);
      const unsigned mp = i % 2 ? bytePairPlus1024<1>(sc[2 + i / 2]) : bytePairPlus1024<0>(sc[2 + i / 2]);
      r.s[i] = hmul2(hsub2(sp, kF16Of1024), d2);
      r.m[i] = hmul2(hsub2(mp, kF16Of1024), dmin2);
    }
  } else {
    const unsigned d = *reinterpret_cast<const uint16_t*>(blk + 208);
    const uint4 sc = *reinterpret_cast<const uint4*>(blk + 192);
    const unsigned words[4] = {sc.x ^ 0x80808080u, sc.y ^ 0x80808080u, sc.z ^ 0x80808080u, sc.w ^ 0x80808080u};  // + 128
    constexpr unsigned k1152 = 0x64806480u;  // f16x2 (1152, 1152): 1024 + the byte bias 128
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const unsigned sp = i % 2 ? bytePairPlus1024<1>(words[i / 2]) : bytePairPlus1024<0>(words[i / 2]);
      r.s[i] = hmul2(hsub2(sp, k1152), d | (d << 16));
    }
    r.m[0] = 0;
  }
  return r;
}
// The f16x2 scale s2 = (s, s) and min m2 = (m, m) of the groups that activation block kb, group of 16 c, multiplies:
// Q4_K sub-block kb (register kb / 2, half kb % 2), Q6_K group 2kb + c (register kb, half c; m2 = 0).
template <bool kQ4K>
__device__ __forceinline__ void groupScale(const RowScales<kQ4K>& r, int kb, int c, unsigned& s2, unsigned& m2) {
  if constexpr (kQ4K) {
    s2 = kb % 2 ? highTwice(r.s[kb / 2]) : lowTwice(r.s[kb / 2]);
    m2 = kb % 2 ? highTwice(r.m[kb / 2]) : lowTwice(r.m[kb / 2]);
  } else {
    s2 = c ? highTwice(r.s[kb]) : lowTwice(r.s[kb]);
    m2 = 0u;
  }
}

// One thread block's tile of segment S: rows [m0, m0 + TM) of its matrix, GGUF blocks of split `split`. Split-K
// sums go to rows [prow0, prow0 + S::kN) of the launch's scratch of `pld` rows (partial[split][t][prow0 + r]; with
// MMQB_F16ACT from byte mmqbF16PartialOffset of it) and the tile counts itself in `*counter`. `smem`: 1024-byte
// aligned, the f16 tile (mmqbTileBytes; none with MMQB_F16ACT) then the stages.
template <class S>
__device__ __forceinline__ void mmqbTile(uint8_t* smem, int m0, int split, const uint8_t* __restrict__ w,
                                         const float* __restrict__ bias, const int8_t* __restrict__ xq,
                                         const Q8Meta* __restrict__ xmeta, float* __restrict__ out,
                                         float* __restrict__ partial, int prow0, int pld, unsigned* counter,
                                         int n_tokens) {
  constexpr int kStages = S::kStages, kRawLd = S::kRawLd;
  // MMQB_F16ACT: `partial` is the scratch that starts with the activations; the partials follow them.
  if constexpr (kF16Act && kS > 1)
    partial = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(partial) + mmqbF16PartialOffset(kTN, kK));
  uint8_t* const bt = smem;  // the f16 activations (tileOffset's layout; none with MMQB_F16ACT)
  uint8_t* const stages = smem + (kF16Act ? 0 : mmqbTileBytes(kTN));
  const int b0 = split * kKB / kS, b1 = (split + 1) * kKB / kS;  // this split's GGUF blocks
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int wm0 = warp * 16;  // warp's first row inside the tile
  // ldmatrix row addresses of the B fragments (shared state space), lane l → matrix mq = l / 8, row l % 8; mq = 0..3
  // → n8 tile +0/+1 (mq / 2), k +0/+8 (mq % 2): b0, b1 of each. Every n8 tile runs, also past n_tokens (those sums
  // are not written), so the loop has no branches.
  const int mq = lane / 8, mr = lane % 8;
  const unsigned b_addr =
      static_cast<unsigned>(__cvta_generic_to_shared(bt)) + 2u * (((mq / 2) * 8 + mr) * kLDH + (mq % 2) * 8);
  const unsigned smem_addr = static_cast<unsigned>(__cvta_generic_to_shared(stages));
  const uint64_t b_desc = MMQB_WGMMA ? tileDescriptor(bt) : 0;  // the warpgroup form's B tiles

  float acc[kNI][4];
#pragma unroll
  for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[ni][e] = 0.0f;

  // Pipeline: stages 0 … S − 2 in flight before the loop; iteration `it` waits for its raw stage, refills the
  // buffer of stage it − 1 with stage it + S − 1, converts the activations to f16 (MMQB_F16ACT: they came as f16),
  // and runs the MMAs with the weights dequantized in registers.
  const int n_blk = b1 - b0;
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n_blk) loadStage<S>(smem_addr + i * S::kStageBytes, b0 + i, m0, n_tokens, w, xq, xmeta);
    cpAsyncCommit();
  }
  for (int it = 0; it < n_blk; ++it) {
    cpAsyncWait<kStages - 2>();
    if constexpr (kF16Act) fenceProxyAsync();  // this thread's copies of the stage before the tensor cores read them
    if constexpr (MMQB_WGMMA) wgmmaWait<0>();  // this warpgroup's MMAs have read the f16 tile (MMQB_F16ACT: the stage)
    __syncthreads();  // the stage is visible to all; everyone's MMAs on the previous f16 activations are done
    const int next = it + kStages - 1;
    if (next < n_blk)
      loadStage<S>(smem_addr + (next % kStages) * S::kStageBytes, b0 + next, m0, n_tokens, w, xq, xmeta);
    cpAsyncCommit();
    const Stage st = stageAt<S>(stages, it % kStages);
    uint64_t desc = b_desc;  // the warpgroup form's B tiles of this stage
    if constexpr (kF16Act) {
      desc = tileDescriptor(st.act);
    } else {
      dequantActivations(st, bt, n_tokens);
      if constexpr (MMQB_WGMMA) fenceProxyAsync();  // the tile's stores before the tensor cores read it
      __syncthreads();
    }
    const uint8_t* r0 = st.raw + (wm0 + g) * kRawLd;
    const uint8_t* r8 = r0 + 8 * kRawLd;
    const RowScales<S::kQ4K> rs[2] = {rowScales<S::kQ4K>(r0), rowScales<S::kQ4K>(r8)};
#pragma unroll
    for (int kb = 0; kb < 8; ++kb)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        unsigned s2[2], m2[2];  // of rows g, g + 8
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) groupScale<S::kQ4K>(rs[ri], kb, c, s2[ri], m2[ri]);
        // The warpgroup form: at most the previous group's MMA still reads its A registers (so they can be reused).
        if constexpr (MMQB_WGMMA) wgmmaWait<1>();
        unsigned a[4];
        weightFragment<S::kQ4K>(r0, r8, kb, c, t, s2, m2, a);
        if constexpr (MMQB_WGMMA) {
          // The group's B: its first 16 bytes' offset in the tile (row 0: no swizzle) in the descriptor's 16-byte units.
          wgmmaFence();  // the A registers just written, before the MMA reads them
          wgmmaRegA<kNI>(acc, a, desc + (tileOffset(0, kb, c, 0) >> 4));
          wgmmaCommit();
        } else {
#pragma unroll
          for (int ni = 0; ni < kNI; ni += 2) {
            int r[4];
            ldmatrixX4Shared(r, b_addr + 2u * (ni * 8 * kLDH + kb * 32 + c * 16));
            mmaF16(acc[ni], a, r[0], r[1]);
            mmaF16(acc[ni + 1], a, r[2], r[3]);
          }
        }
      }
  }
  if constexpr (MMQB_WGMMA) wgmmaWait<0>();

  // Epilogue: element (ni, e) is row m0 + wm0 + g + 8·(e / 2), token 8·ni + 2t + e % 2.
  constexpr int kN = S::kN;
  if (kS == 1) {
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = m0 + wm0 + g + (e / 2) * 8, tok = ni * 8 + 2 * t + (e % 2);
        if (row < kN && tok < n_tokens) {
          float v = acc[ni][e];
          if constexpr (S::kBias) v += bias[row];
          out[static_cast<uint64_t>(tok) * kN + row] = v;
        }
      }
    return;
  }
#pragma unroll
  for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = m0 + wm0 + g + (e / 2) * 8, tok = ni * 8 + 2 * t + (e % 2);
      if (row < kN && tok < n_tokens)
        partial[(static_cast<uint64_t>(split) * kTN + tok) * pld + prow0 + row] = acc[ni][e];
    }
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    unsigned before;
    asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
    last = before == kS - 1;
  }
  __syncthreads();
  if (!last) return;
  if (threadIdx.x == 0) *counter = 0;
#pragma unroll
  for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = m0 + wm0 + g + (e / 2) * 8, tok = ni * 8 + 2 * t + (e % 2);
      if (row >= kN || tok >= n_tokens) continue;
      float v = 0.0f;
      for (int s = 0; s < kS; ++s)
        v += s == split ? acc[ni][e] : __ldcg(partial + (static_cast<uint64_t>(s) * kTN + tok) * pld + prow0 + row);
      if constexpr (S::kBias) v += bias[row];
      out[static_cast<uint64_t>(tok) * kN + row] = v;
    }
}

using Segment0 = Segment<MMQB_N, MMQB_TYPE, MMQB_PITCH, MMQB_GROUP_PITCH, MMQB_HAS_BIAS != 0>;
#if MMQB_SEGMENTS >= 2
using Segment1 = Segment<MMQB_N1, MMQB_TYPE1, MMQB_PITCH1, MMQB_GROUP_PITCH1, MMQB_HAS_BIAS1 != 0>;
#endif
#if MMQB_SEGMENTS == 3
using Segment2 = Segment<MMQB_N2, MMQB_TYPE2, MMQB_PITCH2, MMQB_GROUP_PITCH2, MMQB_HAS_BIAS2 != 0>;
#endif

}  // namespace minfer::kern::mmqb

#if MMQB_SEGMENTS == 1
extern "C" __global__ void __launch_bounds__(minfer::kern::kMmqbThreads, 2)
    minfer_mmq_blocks(const uint8_t* __restrict__ w, const float* __restrict__ bias, const int8_t* __restrict__ xq,
                      const minfer::kern::Q8Meta* __restrict__ xmeta, float* __restrict__ out,
                      float* __restrict__ partial, unsigned* __restrict__ counters, int n_tokens) {
  using namespace minfer::kern::mmqb;
  if (n_tokens > kTN) __trap();  // more rows than a tile holds (the launch's max_rows is MMQB_TN)
  minfer::kern::overlapPrologue();
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* const smem = minfer::kern::align1024(smem_raw);
  mmqbTile<Segment0>(smem, blockIdx.x * kTM, blockIdx.y, w, bias, xq, xmeta, out, partial, 0, Segment0::kN,
                 counters + blockIdx.x, n_tokens);
}
#elif MMQB_SEGMENTS == 2
// Two matrices of one input (gate and up): the row tiles of segment 0, then 1 along grid.x, each as the plain kernel
// runs it with the same splits; the split-K scratch holds the two side by side (N0 + N1 rows).
extern "C" __global__ void __launch_bounds__(minfer::kern::kMmqbThreads, 2)
    minfer_mmq_blocks2(const uint8_t* __restrict__ w0, const float* __restrict__ bias0, const uint8_t* __restrict__ w1,
                       const float* __restrict__ bias1, const int8_t* __restrict__ xq,
                       const minfer::kern::Q8Meta* __restrict__ xmeta, float* __restrict__ out0,
                       float* __restrict__ out1, float* __restrict__ partial, unsigned* __restrict__ counters,
                       int n_tokens) {
  using namespace minfer::kern::mmqb;
  if (n_tokens > kTN) __trap();  // more rows than a tile holds (the launch's max_rows is MMQB_TN)
  minfer::kern::overlapPrologue();
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* const smem = minfer::kern::align1024(smem_raw);
  constexpr int kRows = Segment0::kN + Segment1::kN;
  const int tile = blockIdx.x, split = blockIdx.y;
  unsigned* const counter = counters + tile;
  if (tile < Segment0::kTiles)
    mmqbTile<Segment0>(smem, tile * kTM, split, w0, bias0, xq, xmeta, out0, partial, 0, kRows, counter, n_tokens);
  else
    mmqbTile<Segment1>(smem, (tile - Segment0::kTiles) * kTM, split, w1, bias1, xq, xmeta, out1, partial, Segment0::kN,
                       kRows, counter, n_tokens);
}
#elif MMQB_SEGMENTS == 3
// Three matrices of one input (q, k and v): the row tiles of segment 0, then 1, then 2 along grid.x, each as the
// plain kernel runs it with the same splits; the split-K scratch holds the three side by side (N0 + N1 + N2 rows).
extern "C" __global__ void __launch_bounds__(minfer::kern::kMmqbThreads, 2)
    minfer_mmq_blocks3(const uint8_t* __restrict__ w0, const float* __restrict__ bias0, const uint8_t* __restrict__ w1,
                       const float* __restrict__ bias1, const uint8_t* __restrict__ w2, const float* __restrict__ bias2,
                       const int8_t* __restrict__ xq, const minfer::kern::Q8Meta* __restrict__ xmeta,
                       float* __restrict__ out0, float* __restrict__ out1, float* __restrict__ out2,
                       float* __restrict__ partial, unsigned* __restrict__ counters, int n_tokens) {
  using namespace minfer::kern::mmqb;
  if (n_tokens > kTN) __trap();  // more rows than a tile holds (the launch's max_rows is MMQB_TN)
  minfer::kern::overlapPrologue();
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* const smem = minfer::kern::align1024(smem_raw);
  constexpr int kRows = Segment0::kN + Segment1::kN + Segment2::kN;
  const int tile = blockIdx.x, split = blockIdx.y;
  unsigned* const counter = counters + tile;
  if (tile < Segment0::kTiles)
    mmqbTile<Segment0>(smem, tile * kTM, split, w0, bias0, xq, xmeta, out0, partial, 0, kRows, counter, n_tokens);
  else if (tile < Segment0::kTiles + Segment1::kTiles)
    mmqbTile<Segment1>(smem, (tile - Segment0::kTiles) * kTM, split, w1, bias1, xq, xmeta, out1, partial, Segment0::kN, kRows,
                   counter, n_tokens);
  else
    mmqbTile<Segment2>(smem, (tile - Segment0::kTiles - Segment1::kTiles) * kTM, split, w2, bias2, xq, xmeta, out2, partial,
                   Segment0::kN + Segment1::kN, kRows, counter, n_tokens);
}
#else
#error "MMQB_SEGMENTS must be 1, 2 or 3"
#endif
#endif
