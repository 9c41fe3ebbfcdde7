// Decode matmul straight from GGUF blocks (OpKind MatMul, one token): GEMV over a kBlocks plane of Q4_K
// or Q6_K with q8 activations, so the weight bytes streamed per token are the GGUF's own (Q4_K 144 B,
// Q6_K 210 B + 14 B of padding per 256 weights) instead of the 4-bit kPacked plane plus f32 scale and
// min planes (Q4_K: 0.75 B/weight) or the kI8 plane plus scales (Q6_K: 1.25 B/weight) of gemv.cuh.
//
//   out[r] = Σ_g [ s(r,g) · d(b) · Σ_{c∈g} q(r,c)·xq(c)  +  m(r,g) · d(b) · Σ_{c∈g} xq(c) ] (+ bias[r])
// with the decomposed values of block_formats.h: Q4_K groups of 32, s = d·sc, m = −(dmin·m), q = 0..15;
// Q6_K groups of 16, s = d·sc, q = 6-bit − 32, no m: gemv.cuh's and mmq.cuh's definition, so decode and
// prefill agree up to f32 rounding. The order differs only in where the exact integer factors go: the
// 6-bit scale multiplies the integer dot product (sc·Σq·x, exact in int32) before the one conversion to
// f32, and d (dmin) multiplies the block's sum at the end. The Q6_K offset is applied to the integer
// dot: Σ(q−32)·x = Σq·x − 32·Σx, with Σx the activation block's half sum (Q8Meta).
//
// Work split: four lanes share one GGUF block, each taking 64 of its weights ("part" p = 0..3):
//   Q4_K part p: qs bytes [32p, 32p+32) (two 16-byte loads) = sub-blocks 2p (low nibbles) and 2p+1 (high
//                nibbles), plus the 16-byte block head (d, dmin, the 12 packed scale/min bytes).
//   Q6_K part p = 2n + h: weights 128n + 32k + 16h + i (k = 0..3, i = 0..15): ql bytes [64n+16h, +16) and
//                [64n+32+16h, +16) (low nibbles k = 0, 1; high nibbles k = 2, 3), qh bytes
//                [128+32n+16h, +16) (bit pair 2k), the 8 scale bytes of half n, and d.
// so every weight byte is read by exactly one 16-byte load (block heads, Q6_K scales and d are read by
// the block's four lanes together: one L1 line). A warp covers 8 consecutive blocks per step, of
// GEMVB_ROWS rows at once: the activations of a step (64 bytes and 2 or 4 Q8Meta per lane, 16-byte loads)
// are loaded once and used for every row, so the instructions and L1 traffic per weight byte fall with
// the rows. GEMVB_ROW_WARPS warps (1 or 2) share the rows (each takes every other step), summed through
// shared memory. GEMVB_UNROLL steps of loads are in flight per lane (all issued before the first is used).
//
// Compile-time constants (-D):
//   GEMVB_N, GEMVB_K        weight rows and cols (K % 256 == 0)
//   GEMVB_TYPE              12 (Q4_K) or 14 (Q6_K): the plane's ggml_type
//   GEMVB_PITCH             the kBlocks plane's row pitch (bytes, multiple of 16)
//   GEMVB_GROUP_PITCH       its group pitch: bytes from one block to the next (multiple of 16, ≥ the block)
//   GEMVB_ROWS              rows per warp: gemvBlocksShape(N, K).rows
//   GEMVB_ROW_WARPS         warps sharing those rows: gemvBlocksShape(N, K).warps
//   GEMVB_UNROLL            steps in flight per lane: gemvBlocksShape(N, K).unroll
//   GEMVB_HAS_BIAS          bias vector (N f32)
// Launch ABI:  minfer_gemv_blocks(const uint8_t* w, const float* bias, const int8_t* xq, const Q8Meta* xmeta,
//                                 float* out)
//   w: the kBlocks plane; xq, xmeta: the q8 input buffer, row 0 (xmeta 16-byte aligned: it starts
//   max_batch·K bytes into a 256-byte aligned buffer); out: N f32.
// Launch shape: gemvBlocksLaunchRule(): 4 warps per block, 4 / GEMVB_ROW_WARPS · GEMVB_ROWS rows per block.
//
// GEMV pair (GEMVB_PAIR = 1): two decode MatMul steps of one q8 input whose weights have one type and
// geometry (e.g. gate and up) in one launch, each summed exactly as minfer_gemv_blocks sums it: the first
// half of the grid computes out0 = w0·x (+ bias0), the second out1 = w1·x (+ bias1); one kernel boundary less.
// Launch ABI:  minfer_gemv_pair(const uint8_t* w0, const float* bias0, const uint8_t* w1, const float* bias1,
//                               const int8_t* xq, const Q8Meta* xmeta, float* out0, float* out1)
// Launch shape: gemvPairLaunchRule(): twice gemvBlocksLaunchRule()'s blocks.
// Its persistent form (GEMVB_PAIR = 1 and GEMVB_PERSIST = 1; the codegen takes it where gemvPairPersists): a fixed
// grid that is resident at once, thread block b taking the blocks b, b + gridDim.x, … of gemvPairLaunchRule's grid ("items"),
// each summed exactly as that grid's block sums it (the outputs bit for bit the same), and asking L2 for the weight
// rows of its item two ahead while it sums one, so that HBM streams without a thread block's launch, ramp and exit
// between items (the block form's 9,472 short blocks on the 7B's gate|up). Launch shape:
// gemvPairPersistentLaunchRule(n, shape, kGemvPairPersistBlocks).
//
// Batched GEMV (GEMVB_BATCH = B, 1 ≤ B, GEMVB_ROWS · B ≤ 32): minfer_gemv_blocks for n_tokens ≤ B q8 rows at once,
// the small-batch form of a MatMul on the blocks (Step.small_launches, calls of 1 … kGemvBatchMaxRows rows): each
// lane loads its weight parts once per step and applies them to every row's activations, so the plane is read once
// per call; every (weight row, token) sum is minfer_gemv_blocks' for that token alone, bit for bit. GEMVB_UNROLL
// is not used (one step of loads per lane); n_tokens > B traps.
// Launch ABI:  minfer_gemv_batch(const uint8_t* w, const float* bias, const int8_t* xq, const Q8Meta* xmeta,
//                                float* out, int n_tokens)
//   xq, xmeta: the q8 input buffer (row t at xq + t·K, its metadata at xmeta + t·K/32); out: n_tokens × N f32.
// Launch shape: gemvBlocksLaunchRule(), independent of n_tokens.
//
// GEMV triple (GEMVB_TRIPLE = 1): three decode MatMul steps of one q8 input (q, k, v of a model whose q/k
// HeadRmsNorm keeps the fused QKV GEMV out) in one launch; the segments may differ in rows, type, pitches,
// rows per warp and bias. Segment s takes gemvBlocksLaunchRule(N_s, its shape)'s blocks, one after the other
// in the grid, and computes out_s = w_s·x (+ bias_s) exactly as minfer_gemv_blocks with those constants does
// (the same gemvRowsBlock), so each output is that kernel's bit for bit; one launch instead of three.
// Compile-time constants: GEMVB_K; GEMVB_ROW_WARPS, GEMVB_UNROLL (one work shape's warps and unroll for all
//   three: gemvBlocksShape gives every n the same); per segment s = 0, 1, 2: GEMVB_N<s>, GEMVB_TYPE<s>,
//   GEMVB_PITCH<s>, GEMVB_GROUP_PITCH<s>, GEMVB_ROWS<s> (gemvBlocksShape(N_s, K).rows), GEMVB_HAS_BIAS<s>.
// Launch ABI:  minfer_gemv_triple(const uint8_t* w0, const float* bias0, const uint8_t* w1, const float* bias1,
//                                 const uint8_t* w2, const float* bias2, const int8_t* xq, const Q8Meta* xmeta,
//                                 float* out0, float* out1, float* out2)
// Launch shape: gemvTripleLaunchRule(): the three segments' gemvBlocksLaunchRule() blocks added.
//
// GEMV + residual Add + deferred RMSNorm + q8 (GEMVB_NORM = 1): the decode steps MatMul (o or down), the Add of
// the residual, the RmsNorm of the sum and its QuantizeAct in one launch, the 1/rms left to the GEMVs that read the
// q8 form. RMSNorm's y = sum·inv ⊙ nw with inv = 1 / sqrt(Σ sum² / N + eps) needs the whole row's sum of squares,
// which no thread block of an 896-block GEMV has; but the q8 form of y is, up to rounding, the q8 form of
// u = sum ⊙ nw with every block's scale d times inv (q8 is scale-invariant: max|y| / 127 = inv · max|u| / 127), and a
// GEMV of that input is inv times the GEMV of q8(u). So this kernel computes out = W·x (+ bias) as minfer_gemv_blocks
// does with the same shape (gemvBlocksShape: four rows per block), sum = res + out, and per q8 block b of 32 rows
// (its 8 thread blocks counted in counters[b], an acquire-release atomic after a block barrier, as minfer_gemv_glu;
// the one completing it reads the 32 sums back through L2) the q8 form of u and partial[b] = Σ sum² over the block.
// The consumers (GEMVB_RMS_EPS below) add the N / 32 partials in a fixed order and multiply their sums by inv
// before the bias. Against the unfused steps (rms_norm.cuh: a 1024-thread tree of squares, y = sum·inv·w, then
// quantize_act): the same up to f32 rounding, and q8 integers that differ only where u / d(u) and y / d(y) round
// across a half-step (GPU parity test). No launch in between, no serial tail: the last thread blocks each quantize
// one block of 32.
// Constants: as minfer_gemv_blocks (gemvBlocksShape's work shape); GEMVB_N % 32 == 0 and 32 % (rows per thread
// block) == 0; no GEMVB_RMS_EPS (its input is an attention or GLU output).
// Launch ABI:  minfer_gemv_add_norm(const uint8_t* w, const float* bias, const int8_t* xq, const Q8Meta* xmeta,
//                                   float* out, const float* res, float* sum, const float* nw, int8_t* qs,
//                                   Q8Meta* meta, float* partial, unsigned* counters)
//   out, res, sum: N f32 (res and sum may alias: the residual updated in place; out null where nothing reads the
//   product); nw: N f32, the norm weight; qs, meta: row 0 of the q8 buffer (q8 of u); partial: N / 32 f32, Σ sum²
//   per block of 32 (the RmsNorm's f32 output buffer, which no consumer reads as y); counters: N / 32 words, zero
//   on entry and again on exit.
// Launch shape: gemvBlocksLaunchRule(N, gemvBlocksShape(N, K)).
//
// Deferred RMSNorm of the input (GEMVB_RMS_EPS = the norm's eps, a float literal; minfer_gemv_blocks, _pair,
// _triple, _qkv, _glu): the q8 input is minfer_gemv_add_norm's q8(u) (or moe.cuh minfer_moe_down_dec's with
// MOE_ADD_NORM, the same form), and the kernel takes one more argument
// after the others, `const float* rms`, its K / 32 partial sums of squares: every row's sum is multiplied by
// inv = 1 / sqrt(Σ rms / K + eps) (InputRms: the same bits in every block) before its bias, RoPE or GLU.
//
// Fused gate|up GEMV (GEMVB_GLU = 1 SwiGLU or 3 GeGLU, elementwise.cuh's EW_OP codes): the decode steps
// MatMul gate, MatMul up, SwiGlu / GeGlu and QuantizeAct in one launch. A group's two "rows" are gate row r
// and up row r (GEMVB_ROWS = 2; both weights of GEMVB_TYPE with the same pitches, no bias), so each is
// summed exactly as minfer_gemv_blocks sums it; out[r] = ewApply<GEMVB_GLU>(gate_r, up_r), bit for bit the
// unfused steps' value. The q8 form of out (common.cuh quantizeBlock, the QuantizeAct definition) needs
// whole blocks of 32 rows, which span 32 / (4 / GEMVB_ROW_WARPS) thread blocks: each thread block counts
// itself done in counters[r / 32] (an acquire-release atomic after a block barrier), and the one that
// completes a block of 32 quantizes it (reading out through L2) and sets its counter back to 0.
// Launch ABI:  minfer_gemv_glu(const uint8_t* wg, const uint8_t* wu, const int8_t* xq, const Q8Meta* xmeta,
//                              float* gate, float* up, float* out, int8_t* qs, Q8Meta* meta, unsigned* counters)
//   wg, wu: the kBlocks planes of gate and up; gate, up: N f32, the two products (as the unfused MatMul
//   steps write them; gate null when out is the gate buffer); out: N f32 (N % 32 == 0); qs, meta: row 0
//   of out's q8 buffer; counters: N / 32 words, zero on entry (ArgKind Counters), zero again on exit.
// Launch shape: gemvGluLaunchRule(N, gemvGluShape(N, K)): 4 / GEMVB_ROW_WARPS outputs per block.
//
// Fused QKV GEMV (GEMVB_QKV = 1): the decode steps MatMul q, MatMul k, MatMul v (one q8 input), their
// Rope and the Attention's KV-cache store in one launch. A group's two rows are a rotation pair of one
// head (rope.cuh: NeoX (i, i + n_rot/2), norm (2i, 2i + 1); rows ≥ n_rot and V rows in consecutive
// pairs), so it rotates its own two sums after the bias with rope.cuh's ropeCosSin and ropeRotate (explicitly
// rounded: minfer_rope's values); compiled as minfer_gemv_blocks is, its sums are that kernel's bit for bit.
// It writes q, k, v as the unfused steps leave them (q and k rotated) and k, v as f16 into the caches at
// position pos[0] (attention.cuh kv_store). Each of q, k, v has its own type, pitches and bias.
// With QKV_KV_RING = R (a ring cache, attention.cuh ATT_KV_RING) the store goes to slot pos[0] % R.
// Compile-time constants: GEMVB_K (cols), QKV_NHEAD, QKV_NHEAD_KV, QKV_HEAD_DIM, GEMVB_ROW_WARPS,
//   GEMVB_UNROLL; GEMVB_{Q,K,V}_TYPE, _PITCH, _GROUP_PITCH, _HAS_BIAS; rope.cuh's ROPE_NROT, ROPE_NEOX,
//   ROPE_BASE, ROPE_SCALE, ROPE_FREQ_FACTORS and the optional YaRN / MSCALE constants.
// Launch ABI:  minfer_gemv_qkv(const uint8_t* wq, const float* bq, const uint8_t* wk, const float* bk,
//                              const uint8_t* wv, const float* bv, const int8_t* xq, const Q8Meta* xmeta,
//                              const float* freq_factors, float* q, float* k, float* v, uint16_t* kc,
//                              uint16_t* vc, const int* pos)
//   biases: rows f32 or null (as _HAS_BIAS); q: NHEAD·HEAD_DIM f32, k, v: NHEAD_KV·HEAD_DIM f32; kc, vc:
//   the layer's f16 caches, (n_ctx, NHEAD_KV·HEAD_DIM) position-major.
// Launch shape: gemvQkvLaunchRule(): 4 / GEMVB_ROW_WARPS row pairs per block of 4 + 1 warps: the fifth
// computes the pairs' cos and sin (double precision: ~2 µs of dependent latency, measured as a slower
// kernel when the group's own lane did it after its sums) while the others wait for their loads.
#pragma once

#include "kernels/common.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/rope.cuh"

namespace minfer::kern {

constexpr unsigned kGemvBlocksWarps = 4;
// The batched GEMV's most q8 rows per launch (GEMVB_BATCH in the codegen; Step.small_rows of a weight read from
// its blocks): the small-batch steps of 2 … 8 rows, above which the Hopper f16 GEMM or mmq run.
constexpr unsigned kGemvBatchMaxRows = 8;

// The kernel's work shape for n rows of k weights (its -D constants GEMVB_ROWS, _ROW_WARPS, _UNROLL).
struct GemvBlocksShape {
  unsigned rows = 1;    // rows per warp
  unsigned warps = 1;   // warps per group of rows (1 or 2)
  unsigned unroll = 1;  // steps of 8 blocks in flight per lane
};
// Measured on an H200 (bench/gemv_bench.cpp --variants, BENCHMARKS.md): 2 rows per warp, 2 warps per
// group, 1 step in flight was the best of 12 shapes (or within 1%) on the 7B's 3584- and 18944-row
// matrices; on the 152064-row output head 4 rows per warp are 16% faster than 2. 1 row: 4–13% slower.
MINFER_HD GemvBlocksShape gemvBlocksShape(unsigned n, unsigned k) {
  (void)k;
  return {n >= 65536 ? 4u : 2u, 2, 1};
}

// The fused gate|up GEMV's shape: two rows per warp (gate, up), as gemvBlocksShape's below 65536 rows.
MINFER_HD GemvBlocksShape gemvGluShape(unsigned n, unsigned k) {
  (void)n;
  (void)k;
  return {2, 2, 1};
}

// Rows per thread block of gemvBlocksLaunchRule's grid.
MINFER_HD unsigned gemvBlocksRowsPerCta(GemvBlocksShape s) { return kGemvBlocksWarps / s.warps * s.rows; }
MINFER_HD LaunchRule gemvBlocksLaunchRule(unsigned n, GemvBlocksShape s) {
  LaunchRule r;
  r.grid[0] = fixedExtent(ceilDiv(n, gemvBlocksRowsPerCta(s)));
  r.block.x = 32 * kGemvBlocksWarps;
  return r;
}
MINFER_HD LaunchShape gemvBlocksLaunch(unsigned n, GemvBlocksShape s) { return gemvBlocksLaunchRule(n, s).at(1); }
// Two GEMVs of n rows in one launch (GEMVB_PAIR): twice gemvBlocksLaunchRule's blocks.
MINFER_HD LaunchRule gemvPairLaunchRule(unsigned n, GemvBlocksShape s) {
  LaunchRule r = gemvBlocksLaunchRule(n, s);
  r.grid[0] = fixedExtent(2 * ceilDiv(n, kGemvBlocksWarps / s.warps * s.rows));
  return r;
}
// The GEMV pair's persistent grid (GEMVB_PERSIST): 8 thread blocks per SM of a 132-SM H100 / H200 (at 44 registers
// per thread 10 fit; the previous launch's blocks share the SMs while it ends). Measured on an H200 (BENCHMARKS.md,
// 2026-12-04; the 7B's 18944 × 3584 gate|up): tg128 +3.0% at 1,056 blocks; 1,320 −1.2%, 528 −16% against the
// block grid. On GPUs with fewer SMs the blocks past the resident ones run after them, still correct.
constexpr unsigned kGemvPairPersistBlocks = 1056;
// True when the pair takes its persistent form: its block grid (gemvPairLaunchRule) exceeds kGemvPairPersistBlocks.
// The persistent form sums a group's two warps (GEMVB_ROW_WARPS 2).
MINFER_HD bool gemvPairPersists(unsigned n, GemvBlocksShape s) {
  return s.warps == 2 && gemvPairLaunchRule(n, s).grid[0].constant > kGemvPairPersistBlocks;
}
// The persistent form's grid: `blocks` thread blocks (at most the block grid's).
MINFER_HD LaunchRule gemvPairPersistentLaunchRule(unsigned n, GemvBlocksShape s, unsigned blocks) {
  LaunchRule r = gemvPairLaunchRule(n, s);
  r.grid[0] = fixedExtent(blocks < r.grid[0].constant ? blocks : r.grid[0].constant);
  return r;
}
// Three GEMVs of one input in one launch (GEMVB_TRIPLE): the blocks of gemvBlocksLaunchRule(n[s], shape[s]),
// segment after segment.
MINFER_HD LaunchRule gemvTripleLaunchRule(const unsigned (&n)[3], const GemvBlocksShape (&shape)[3]) {
  LaunchRule r = gemvBlocksLaunchRule(n[0], shape[0]);
  unsigned blocks = 0;
  for (int s = 0; s < 3; ++s) blocks += ceilDiv(n[s], kGemvBlocksWarps / shape[s].warps * shape[s].rows);
  r.grid[0] = fixedExtent(blocks);
  return r;
}
// The fused gate|up GEMV: one output (a gate row and an up row) per group of s.warps warps.
MINFER_HD LaunchRule gemvGluLaunchRule(unsigned n, GemvBlocksShape s) {
  LaunchRule r;
  r.grid[0] = fixedExtent(ceilDiv(n, kGemvBlocksWarps / s.warps));
  r.block.x = 32 * kGemvBlocksWarps;
  return r;
}

// The fused QKV GEMV's shape: two rows per warp (a rotation pair), two warps per pair.
MINFER_HD GemvBlocksShape gemvQkvShape() { return {2, 2, 1}; }
// The fused QKV GEMV: one row pair (two rows of one head) per group of s.warps warps, and one more warp
// per block for the rotation angles.
constexpr unsigned kGemvQkvWarps = kGemvBlocksWarps + 1;
MINFER_HD LaunchRule gemvQkvLaunchRule(unsigned n_head, unsigned n_head_kv, unsigned head_dim, GemvBlocksShape s) {
  LaunchRule r;
  r.grid[0] = fixedExtent(ceilDiv((n_head + 2 * n_head_kv) * head_dim / 2, kGemvBlocksWarps / s.warps));
  r.block.x = 32 * kGemvQkvWarps;
  return r;
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE)
#ifdef GEMVB_RMS_EPS  // the input is a deferred RMSNorm's q8 form: the kernel takes its partial sums too
#define MINFER_GEMVB_RMS_PARAM , const float* __restrict__ rms
#define MINFER_GEMVB_RMS rms
#else
#define MINFER_GEMVB_RMS_PARAM
#define MINFER_GEMVB_RMS nullptr
#endif

namespace minfer::kern::gemvb {

// One lane's weight bytes of one block (see the header comment), loaded before use.
struct Part {
  uint4 a, b, c;  // Q4_K: head, qs[32p..], qs[32p+16..];  Q6_K: ql (k 0, 2), ql (k 1, 3), qh
  uint2 sc;       // Q6_K: scales 8n .. 8n+7
  uint16_t d;     // Q6_K: d
};

// 16 weight bytes. GEMVB_L2_FETCH = 128 or 256 (optional, for measurement: minfer-bench-gemv --l2-fetch):
// through the read-only path with that L2 fetch granule (PTX ld's .L2::128B / .L2::256B prefetch-size
// qualifier), so a miss brings the neighbouring sectors the other lanes' loads need.
__device__ __forceinline__ uint4 loadWeight16(const uint8_t* p) {
#if defined(GEMVB_L2_FETCH) && (GEMVB_L2_FETCH == 128 || GEMVB_L2_FETCH == 256)
  uint4 v;
#if GEMVB_L2_FETCH == 256
  asm("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#else
  asm("ld.global.nc.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#endif
  return v;
#else
  return *reinterpret_cast<const uint4*>(p);
#endif
}

template <bool kQ4K>
__device__ __forceinline__ Part load(const uint8_t* blk, int p) {
  Part w;
  if (kQ4K) {
    w.a = loadWeight16(blk);
    w.b = loadWeight16(blk + 16 + 32 * p);
    w.c = loadWeight16(blk + 32 + 32 * p);
  } else {
    const int n = p >> 1, h = p & 1;
    w.a = loadWeight16(blk + 64 * n + 16 * h);
    w.b = loadWeight16(blk + 64 * n + 32 + 16 * h);
    w.c = loadWeight16(blk + 128 + 32 * n + 16 * h);
    w.sc = *reinterpret_cast<const uint2*>(blk + 192 + 8 * n);
    w.d = *reinterpret_cast<const uint16_t*>(blk + 208);
  }
  return w;
}

// One lane's activations for its part of one block, shared by the rows: the 64 int8 its weights meet,
// and per activation block met (Q4_K: 2 whole blocks; Q6_K: one half of 4) the scale d and the sum term
// (Q4_K: d·Σx of the block, for the min; Q6_K: 32·Σx of the half, the q − 32 offset).
struct Act {
  int4 x[4];
  float d[4];
  float ds[2];
  int s32[4];
};

__device__ __forceinline__ int sumLo(int w) { return static_cast<short>(w & 0xFFFF); }
__device__ __forceinline__ int sumHi(int w) { return w >> 16; }

template <bool kQ4K>
__device__ __forceinline__ Act loadAct(const int8_t* xq, const Q8Meta* xm, int p) {
  Act a;
  if (kQ4K) {
    const int4* x = reinterpret_cast<const int4*>(xq + 64 * p);
    const int4 m = *reinterpret_cast<const int4*>(xm + 2 * p);  // Q8Meta 2p, 2p+1: {d, sum_lo | sum_hi << 16}
#pragma unroll
    for (int i = 0; i < 4; ++i) a.x[i] = x[i];
    a.d[0] = __int_as_float(m.x);
    a.d[1] = __int_as_float(m.z);
    a.ds[0] = a.d[0] * static_cast<float>(sumLo(m.y) + sumHi(m.y));
    a.ds[1] = a.d[1] * static_cast<float>(sumLo(m.w) + sumHi(m.w));
  } else {
    const int n = p >> 1, h = p & 1;
    const int4* m = reinterpret_cast<const int4*>(xm + 4 * n);  // Q8Meta 4n … 4n+3
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int4 mm = m[j];
      a.d[2 * j] = __int_as_float(mm.x);
      a.d[2 * j + 1] = __int_as_float(mm.z);
      a.s32[2 * j] = 32 * (h ? sumHi(mm.y) : sumLo(mm.y));
      a.s32[2 * j + 1] = 32 * (h ? sumHi(mm.w) : sumLo(mm.w));
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) a.x[k] = *reinterpret_cast<const int4*>(xq + 128 * n + 32 * k + 16 * h);
  }
  return a;
}

__device__ __forceinline__ int dot16(uint4 q, int4 x) {
  int s = dp4a(static_cast<int>(q.x), x.x, 0);
  s = dp4a(static_cast<int>(q.y), x.y, s);
  s = dp4a(static_cast<int>(q.z), x.z, s);
  return dp4a(static_cast<int>(q.w), x.w, s);
}
__device__ __forceinline__ uint4 mask4(uint4 v, int shift, unsigned m) {
  return {(v.x >> shift) & m, (v.y >> shift) & m, (v.z >> shift) & m, (v.w >> shift) & m};
}

// One lane's weight part decoded for its dot products: the int8-ready quants of its sub-blocks and their integer
// scales (Q4_K: q[0..1] the low nibbles = sub-block 2p, q[2..3] the high nibbles = sub-block 2p + 1, sc and mn
// their 6-bit scales and mins, d and dmin; Q6_K: q[k] the 6-bit values of group 2k + h of the lane's half, sc[k]
// their signed scales, d), so that the batched GEMV decodes a Q6_K part once for all its tokens (decodedDot per
// token).
struct Decoded {
  uint4 q[4];
  int sc[4];
  int mn[2];
  float d, dmin;
};

template <bool kQ4K>
__device__ __forceinline__ Decoded decodePart(const Part& w, int p) {
  Decoded r;
  if (kQ4K) {
    // Sub-blocks 2p and 2p+1. The 6-bit scale/min pairs (block_formats.h kScaleMin) of all eight
    // sub-blocks, one byte each: head word 1 = scale bytes 0..3, word 2 = bytes 4..7, word 3 = bytes 8..11.
    const unsigned s03 = w.a.y & 0x3F3F3F3Fu, m03 = w.a.z & 0x3F3F3F3Fu;
    const unsigned s47 = (w.a.w & 0x0F0F0F0Fu) | ((w.a.y >> 2) & 0x30303030u);
    const unsigned m47 = ((w.a.w >> 4) & 0x0F0F0F0Fu) | ((w.a.z >> 2) & 0x30303030u);
    const int sh = 16 * (p & 1);  // byte 2p % 4
    const unsigned sw = (p < 2 ? s03 : s47) >> sh, mw = (p < 2 ? m03 : m47) >> sh;
    r.q[0] = mask4(w.b, 0, 0x0F0F0F0Fu);
    r.q[1] = mask4(w.c, 0, 0x0F0F0F0Fu);
    r.q[2] = mask4(w.b, 4, 0x0F0F0F0Fu);
    r.q[3] = mask4(w.c, 4, 0x0F0F0F0Fu);
    r.sc[0] = static_cast<int>(sw & 0xFF);
    r.sc[1] = static_cast<int>((sw >> 8) & 0xFF);
    r.mn[0] = static_cast<int>(mw & 0xFF);
    r.mn[1] = static_cast<int>((mw >> 8) & 0xFF);
    r.d = h2f(static_cast<uint16_t>(w.a.x));
    r.dmin = h2f(static_cast<uint16_t>(w.a.x >> 16));
  } else {
    const int h = p & 1;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint4 lo = mask4(k & 1 ? w.b : w.a, 4 * (k >> 1), 0x0F0F0F0Fu);
      const uint4 hi = mask4(w.c, 2 * k, 0x03030303u);
      r.q[k] = {lo.x | (hi.x << 4), lo.y | (hi.y << 4), lo.z | (hi.z << 4), lo.w | (hi.w << 4)};
      // Scale 8n + 2k + h: byte 2k + h of the lane's 8 scale bytes (signed).
      const unsigned word = k < 2 ? w.sc.x : w.sc.y;
      r.sc[k] = static_cast<int>(static_cast<signed char>((word >> (8 * (2 * (k & 1) + h))) & 0xFF));
    }
    r.d = h2f(w.d);
  }
  return r;
}

// Contribution of a decoded part of one block of one row against one token's activations.
template <bool kQ4K>
__device__ __forceinline__ float decodedDot(const Decoded& w, const Act& a) {
  if (kQ4K) {
    const int dot0 = dot16(w.q[0], a.x[0]) + dot16(w.q[1], a.x[1]);
    const int dot1 = dot16(w.q[2], a.x[2]) + dot16(w.q[3], a.x[3]);
    const float dots = fmaf(a.d[1], static_cast<float>(w.sc[1] * dot1), a.d[0] * static_cast<float>(w.sc[0] * dot0));
    const float mins = fmaf(static_cast<float>(w.mn[1]), a.ds[1], static_cast<float>(w.mn[0]) * a.ds[0]);
    return fmaf(w.d, dots, -(w.dmin * mins));
  } else {
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) v = fmaf(a.d[k], static_cast<float>(w.sc[k] * (dot16(w.q[k], a.x[k]) - a.s32[k])), v);
    return w.d * v;
  }
}

// Contribution of part p of one block of one row.
template <bool kQ4K>
__device__ __forceinline__ float partDot(const Part& w, const Act& a, int p) {
  return decodedDot<kQ4K>(decodePart<kQ4K>(w, p), a);
}

// One lane's share of kRows dot products: rows wr[0 .. kRows) of kBlocksPerRow GGUF blocks each
// (kGroupPitch bytes apart) against the q8 activations xq / xm. Lane t of a group of 32·kRowWarps lanes
// takes part p = t % 4 of blocks b = t / 4, t / 4 + 8·kRowWarps, … (the header comment), kUnroll steps of
// loads in flight. The caller sums acc over the group (groupSum).
template <bool kQ4K, int kRows, int kRowWarps, int kUnroll, int kBlocksPerRow, int kGroupPitch>
__device__ __forceinline__ void accumulateRows(const uint8_t* const (&wr)[kRows], const int8_t* xq, const Q8Meta* xm,
                                               int p, int b, float (&acc)[kRows]) {
  constexpr int kStep = 8 * kRowWarps;  // blocks one group's lanes cover per step
  for (; b + kStep * (kUnroll - 1) < kBlocksPerRow; b += kStep * kUnroll) {
    Part part[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int i = 0; i < kRows; ++i)
        part[u][i] = load<kQ4K>(wr[i] + static_cast<uint64_t>(b + kStep * u) * kGroupPitch, p);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Act a = loadAct<kQ4K>(xq + 256 * (b + kStep * u), xm + 8 * (b + kStep * u), p);
#pragma unroll
      for (int i = 0; i < kRows; ++i) acc[i] += partDot<kQ4K>(part[u][i], a, p);
    }
  }
  for (; b < kBlocksPerRow; b += kStep) {
    Part part[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) part[i] = load<kQ4K>(wr[i] + static_cast<uint64_t>(b) * kGroupPitch, p);
    const Act a = loadAct<kQ4K>(xq + 256 * b, xm + 8 * b, p);
#pragma unroll
    for (int i = 0; i < kRows; ++i) acc[i] += partDot<kQ4K>(part[i], a, p);
  }
}

// Sums acc over the kRowWarps warps of each group of the block's first kGemvBlocksWarps warps (warpSum,
// then, with kRowWarps 2, warp w + 1's sums added to warp w's through shared memory after one block
// barrier). Every thread of the block must call it (warps past the first kGemvBlocksWarps take part in
// that barrier only); afterwards every lane of a group's first warp (warp % kRowWarps == 0) holds the
// group's sums, and the function returns true there. With kRowWarps 1 there is no barrier and every warp
// gets true.
template <int kRows, int kRowWarps>
__device__ __forceinline__ bool groupSum(float (&acc)[kRows]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kRows; ++i) acc[i] = warpSum(acc[i]);
  if (kRowWarps == 1) return true;
  __shared__ float partial[kGemvBlocksWarps][kRows];
  if (lane == 0 && warp < static_cast<int>(kGemvBlocksWarps))
#pragma unroll
    for (int i = 0; i < kRows; ++i) partial[warp][i] = acc[i];
  __syncthreads();
  if (warp % kRowWarps != 0 || warp >= static_cast<int>(kGemvBlocksWarps)) return false;
#pragma unroll
  for (int i = 0; i < kRows; ++i) acc[i] += partial[warp + 1][i];
  return true;
}

// The deferred RMSNorm of a GEMV's input (GEMVB_RMS_EPS; the consumer side of minfer_gemv_add_norm, see the header
// comment): the kK / 32 partial sums of squares are copied into shared memory by one warp's cp.async after
// overlapPrologue (stage: nothing held in registers while the GEMV streams its weights; 52 instead of 48 registers
// per thread when each lane kept its share, one thread block fewer per SM), waited for by the copying threads
// (wait) before a block barrier, then 1/rms = 1 / sqrt(Σ / kK + eps) (rms_norm.cuh's formula) by any warp (inv).
// The sum's order is fixed (lane l adds partials l, l + 32, …, then warpSum's butterfly, whose result is the same
// on every lane), so every warp of every consumer launch computes the same bits.
template <int kK>
struct InputRms {
  static constexpr int kGroups = kK / 32, kChunks = kGroups / 4;  // partials, 16-byte copies (kK % 128 == 0)
  static_assert(kK % 128 == 0, "16-byte copies of the partial sums");
  __device__ static float* staged() {
    __shared__ __align__(16) float part[kGroups];
    return part;
  }
  // Called by one warp of the block.
  __device__ static void stage(const float* partial) {
    for (int c = threadIdx.x % 32; c < kChunks; c += 32) cpAsync<16>(staged() + 4 * c, partial + 4 * c, true);
    cpAsyncCommit();
  }
  __device__ static void wait() { cpAsyncWait<0>(); }  // any thread (those of other warps have nothing to wait for)
  __device__ static float inv(float eps) {
    const int lane = threadIdx.x % 32;
    float t = 0.0f;
    for (int j = lane; j < kGroups; j += 32) t += staged()[j];
    return 1.0f / sqrtf(warpSum(t) / static_cast<float>(kK) + eps);
  }
};

// Starts moving the weight rows of thread block `bx` of gemvBlocksLaunchRule's grid to L2: kCtaRows consecutive rows
// of kPitch bytes (fewer at the end).
template <int kN, int kCtaRows, unsigned kPitch>
__device__ __forceinline__ void prefetchBlockRows(const uint8_t* w, unsigned bx) {
  const int first = static_cast<int>(bx) * kCtaRows;
  const int rows = min(kCtaRows, kN - first);
  prefetchL2(w + static_cast<uint64_t>(first) * kPitch, static_cast<unsigned>(rows) * kPitch);
}

// Lane t's (its index in its group) kRows sums of the row group starting at row0, as accumulateRows leaves them
// (rows past the end read the last row; their sums are not written); zero where row0 ≥ kN.
template <bool kQ4K, int kN, int kRows, int kRowWarps, int kUnroll, int kBlocksPerRow, unsigned kPitch, int kGroupPitch>
__device__ __forceinline__ void rowGroupSums(const uint8_t* w, int row0, const int8_t* xq, const Q8Meta* xmeta, int t,
                                             float (&acc)[kRows]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) acc[i] = 0.0f;
  if (row0 >= kN) return;
  const uint8_t* wr[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) wr[i] = w + static_cast<uint64_t>(row0 + i < kN ? row0 + i : kN - 1) * kPitch;
  accumulateRows<kQ4K, kRows, kRowWarps, kUnroll, kBlocksPerRow, kGroupPitch>(wr, xq, xmeta, t % 4, t / 4, acc);
}

// Thread block `bx` of a GEMV of kN rows on a kBlocks plane of kPitch-byte rows (grid: gemvBlocksLaunchRule for
// the shape {kRows, kRowWarps, kUnroll}): minfer_gemv_blocks' whole computation, and each segment of the GEMV
// pair and triple and minfer_gemv_add_norm's products, so that all of them sum a row in one order.
// kGemvBlocksWarps warps per block. Row r's value v (its sum, times 1/rms of the input with GEMVB_RMS_EPS, then
// + bias[r]) goes to store(r, v), called by one lane per row; `rms`: the input's partial sums of squares
// (GEMVB_RMS_EPS only, else unused).
template <bool kQ4K, int kN, int kRows, int kRowWarps, int kUnroll, int kBlocksPerRow, unsigned kPitch,
          int kGroupPitch, bool kBias, class Store>
__device__ __forceinline__ void gemvRows(const uint8_t* w, const float* bias, const int8_t* xq, const Q8Meta* xmeta,
                                         const float* rms, unsigned bx, Store store) {
  constexpr int kGroupsPerCta = static_cast<int>(kGemvBlocksWarps) / kRowWarps;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = (bx * kGroupsPerCta + warp / kRowWarps) * kRows;
  // While the previous kernel still runs (programmatic launch), this block's weight rows start moving to L2.
  if (threadIdx.x == 0) prefetchBlockRows<kN, kGroupsPerCta * kRows, kPitch>(w, bx);
  overlapPrologue();
  const int t = (warp % kRowWarps) * 32 + lane;  // this lane's index in its group
#ifdef GEMVB_RMS_EPS
  using Rms = InputRms<256 * kBlocksPerRow>;
  if (warp == 0) Rms::stage(rms);
#else
  (void)rms;
#endif
  float acc[kRows];
  rowGroupSums<kQ4K, kN, kRows, kRowWarps, kUnroll, kBlocksPerRow, kPitch, kGroupPitch>(w, row0, xq, xmeta, t, acc);
#ifdef GEMVB_RMS_EPS
  static_assert(kRowWarps == 2, "the staged partials become visible at groupSum's block barrier");
  Rms::wait();
#endif
  if (!groupSum<kRows, kRowWarps>(acc)) return;
#ifdef GEMVB_RMS_EPS
  const float inv = Rms::inv(GEMVB_RMS_EPS);
#pragma unroll
  for (int i = 0; i < kRows; ++i) acc[i] = __fmul_rn(acc[i], inv);  // rounded here: never fused with the bias's add
#endif
  // Lane i stores row row0 + i.
#pragma unroll
  for (int i = 0; i < kRows; ++i)
    if (lane == i && row0 + i < kN) {
      if (kBias) acc[i] += bias[row0 + i];
      store(row0 + i, acc[i]);
    }
}

// gemvRows writing out[r].
template <bool kQ4K, int kN, int kRows, int kRowWarps, int kUnroll, int kBlocksPerRow, unsigned kPitch,
          int kGroupPitch, bool kBias>
__device__ __forceinline__ void gemvRowsBlock(const uint8_t* w, const float* bias, const int8_t* xq,
                                              const Q8Meta* xmeta, float* out, const float* rms, unsigned bx) {
  gemvRows<kQ4K, kN, kRows, kRowWarps, kUnroll, kBlocksPerRow, kPitch, kGroupPitch, kBias>(
      w, bias, xq, xmeta, rms, bx, [out](int r, float v) { out[r] = v; });
}

// The deferred RMSNorm's producer side (minfer_gemv_add_norm, moe.cuh's minfer_moe_down_dec with MOE_ADD_NORM),
// called by every thread of a block once its sums of q8 block `blk` (32 rows, written by kCtas thread blocks) are
// written: the block counts itself in counters[blk] (a block barrier, then one thread's acquire-release atomic, as
// minfer_gemv_glu), and the block completing the 32 rows writes the q8 form of u = sum ⊙ nw (reading the sums
// back through L2) and partial[blk] = Σ sum², then sets the counter back to 0.
template <int kCtas>
__device__ __forceinline__ void addNormComplete(int blk, const float* sum, const float* __restrict__ nw,
                                                int8_t* __restrict__ qs, Q8Meta* __restrict__ meta,
                                                float* __restrict__ partial, unsigned* __restrict__ counters) {
  static_assert(kCtas >= 1 && 32 % kCtas == 0, "whole q8 blocks of 32 rows in whole thread blocks");
  __shared__ bool completes;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counters + blk) : "memory");
    completes = before == kCtas - 1;
  }
  __syncthreads();
  if (!completes || threadIdx.x >= 32) return;
  const int lane = threadIdx.x % 32;
  // The norm weight loaded here, beside the sums (one round trip for both), not held in a register through the
  // GEMV (52 instead of 44 registers for Q4_K 3584 × 3584).
  const float wn = nw[32 * blk + lane], s = __ldcg(sum + 32 * blk + lane);
  quantizeBlock<1>({s * wn}, qs + 32 * blk, meta + blk, true);
  const float ss = warpSum(s * s);
  if (lane == 0) {
    partial[blk] = ss;
    counters[blk] = 0;
  }
}

}  // namespace minfer::kern::gemvb
#endif  // MINFER_DEVICE_CODE

#if defined(MINFER_DEVICE_CODE) && defined(GEMVB_N)
#if defined(GEMVB_PERSIST) && GEMVB_PERSIST && (!GEMVB_PAIR || GEMVB_BATCH || GEMVB_NORM || GEMVB_GLU)
#error "GEMVB_PERSIST: the GEMV pair's form only (GEMVB_PAIR = 1, none of GEMVB_BATCH, GEMVB_NORM, GEMVB_GLU)"
#endif
namespace minfer::kern::gemvb {

constexpr int kN = GEMVB_N, kK = GEMVB_K, kType = GEMVB_TYPE;
constexpr int kRows = GEMVB_ROWS, kRowWarps = GEMVB_ROW_WARPS, kUnroll = GEMVB_UNROLL;
constexpr int kBlocksPerRow = kK / 256;
constexpr int kGroupsPerCta = static_cast<int>(kGemvBlocksWarps) / kRowWarps;
constexpr bool kQ4K = kType == 12;
static_assert(kK % 256 == 0, "GEMVB_K must be a multiple of 256");
static_assert(kType == 12 || kType == 14, "GEMVB_TYPE must be Q4_K (12) or Q6_K (14)");
static_assert(kRowWarps == 1 || kRowWarps == 2, "GEMVB_ROW_WARPS must be 1 or 2");
static_assert(kRows >= 1 && kRows <= 4 && kUnroll >= 1 && kUnroll <= 4, "GEMVB_ROWS, GEMVB_UNROLL: 1 … 4");
static_assert(GEMVB_PITCH % 16 == 0 && GEMVB_GROUP_PITCH % 16 == 0, "blocks must start 16-byte aligned");
static_assert(GEMVB_GROUP_PITCH >= (kQ4K ? 144 : 210), "group pitch smaller than the block");
static_assert(GEMVB_PITCH >= static_cast<unsigned long long>(kBlocksPerRow) * GEMVB_GROUP_PITCH,
              "row pitch smaller than a row of blocks");

}  // namespace minfer::kern::gemvb
// GEMVB_MIN_BLOCKS (optional, for measurement: minfer-bench-gemv --min-blocks): blocks per SM the
// register allocation must allow (__launch_bounds__' second operand).
#ifdef GEMVB_MIN_BLOCKS
#define MINFER_GEMVB_BOUNDS __launch_bounds__(32 * minfer::kern::kGemvBlocksWarps, GEMVB_MIN_BLOCKS)
#else
#define MINFER_GEMVB_BOUNDS __launch_bounds__(32 * minfer::kern::kGemvBlocksWarps)
#endif

#if GEMVB_NORM
namespace minfer::kern::gemvb {
constexpr int kNormRowsPerCta = kGroupsPerCta * kRows;  // rows per thread block; 32 / it blocks per q8 block
static_assert(kN % 32 == 0 && 32 % kNormRowsPerCta == 0, "the GEMV + Add + RMSNorm: whole q8 blocks of 32 rows");
#ifdef GEMVB_RMS_EPS
static_assert(false, "the GEMV + Add + RMSNorm reads a plain q8 input (an attention or GLU output)");
#endif
}  // namespace minfer::kern::gemvb
// Row r's product o (minfer_gemv_blocks' value for the same shape, bit for bit), sum[r] = res[r] + o, and per q8
// block of 32 rows (its thread blocks counted in counters[b]; the one completing it reads the 32 sums back through
// L2) the q8 form of u = sum ⊙ nw and partial[b] = Σ sum² over the block. `res` and `sum` may alias (each element
// is read, then written, by one thread).
extern "C" __global__ void MINFER_GEMVB_BOUNDS
    minfer_gemv_add_norm(const uint8_t* __restrict__ w, const float* __restrict__ bias, const int8_t* __restrict__ xq,
                         const minfer::kern::Q8Meta* __restrict__ xmeta, float* __restrict__ out, const float* res,
                         float* sum, const float* __restrict__ nw, int8_t* __restrict__ qs,
                         minfer::kern::Q8Meta* __restrict__ meta, float* __restrict__ partial,
                         unsigned* __restrict__ counters) {
  using namespace minfer::kern;
  using namespace minfer::kern::gemvb;
  const int blk = static_cast<int>(blockIdx.x) * kNormRowsPerCta / 32;  // this block's q8 block
  gemvRows<kQ4K, kN, kRows, kRowWarps, kUnroll, kBlocksPerRow, GEMVB_PITCH, GEMVB_GROUP_PITCH, GEMVB_HAS_BIAS>(
      w, bias, xq, xmeta, nullptr, blockIdx.x, [&](int r, float o) {
        if (out) out[r] = o;
        sum[r] = res[r] + o;
      });
  addNormComplete<32 / kNormRowsPerCta>(blk, sum, nw, qs, meta, partial, counters);
}
#elif GEMVB_GLU
static_assert(minfer::kern::gemvb::kRows == 2 && !GEMVB_HAS_BIAS, "the gate|up GEMV takes two rows (gate, up), no bias");
static_assert(GEMVB_N % 32 == 0, "the q8 output needs whole blocks of 32 rows");
extern "C" __global__ void MINFER_GEMVB_BOUNDS
    minfer_gemv_glu(const uint8_t* __restrict__ wg, const uint8_t* __restrict__ wu, const int8_t* __restrict__ xq,
                    const minfer::kern::Q8Meta* __restrict__ xmeta, float* __restrict__ gate, float* __restrict__ up,
                    float* __restrict__ out, int8_t* __restrict__ qs, minfer::kern::Q8Meta* __restrict__ meta,
                    unsigned* __restrict__ counters MINFER_GEMVB_RMS_PARAM) {
  using namespace minfer::kern;
  using namespace minfer::kern::gemvb;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first = blockIdx.x * kGroupsPerCta, row = first + warp / kRowWarps;  // kN % 32 == 0: rows < kN
  if (threadIdx.x == 0) {
    prefetchL2(wg + static_cast<uint64_t>(first) * GEMVB_PITCH, kGroupsPerCta * GEMVB_PITCH);
    prefetchL2(wu + static_cast<uint64_t>(first) * GEMVB_PITCH, kGroupsPerCta * GEMVB_PITCH);
  }
  overlapPrologue();
#ifdef GEMVB_RMS_EPS
  using Rms = InputRms<kK>;
  if (warp == 0) Rms::stage(rms);
#endif
  float acc[2] = {0.0f, 0.0f};
  const uint8_t* wr[2] = {wg + static_cast<uint64_t>(row) * GEMVB_PITCH, wu + static_cast<uint64_t>(row) * GEMVB_PITCH};
  const int t = (warp % kRowWarps) * 32 + lane;  // this lane's index in its group
  accumulateRows<kQ4K, 2, kRowWarps, kUnroll, kBlocksPerRow, GEMVB_GROUP_PITCH>(wr, xq, xmeta, t % 4, t / 4, acc);
#ifdef GEMVB_RMS_EPS
  static_assert(kRowWarps == 2, "the staged partials become visible at groupSum's block barrier");
  Rms::wait();
#endif
  const bool sums = groupSum<2, kRowWarps>(acc);
#ifdef GEMVB_RMS_EPS
  const float inv = Rms::inv(GEMVB_RMS_EPS);  // every lane of the warp: warpSum's shuffles
  acc[0] *= inv;
  acc[1] *= inv;
#endif
  if (sums && lane == 0) {
    if (gate) gate[row] = acc[0];
    up[row] = acc[1];
    out[row] = ewApply<GEMVB_GLU>(acc[0], acc[1]);
  }
  // This block's rows are written. Count it in its block of 32 rows (a grid barrier's arrival, as
  // cooperative_groups' grid sync does it: a block barrier, then one thread's release atomic, here
  // acquire-release so that the block completing the 32 sees the others' rows); that block quantizes them.
  __shared__ bool completes;
  const int blk = first / 32;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counters + blk) : "memory");
    completes = before == 32 / kGroupsPerCta - 1;
  }
  __syncthreads();
  if (!completes || warp != 0) return;
  const float v[1] = {__ldcg(out + 32 * blk + lane)};
  quantizeBlock<1>(v, qs + 32 * blk, meta + blk, true);
  if (lane == 0) counters[blk] = 0;
}
#else
namespace minfer::kern::gemvb {
// Thread block `bx` of the GEMV of weight w (the kernel's grid, gemvBlocksLaunchRule).
__device__ __forceinline__ void gemvBlock(const uint8_t* w, const float* bias,
                                          const int8_t* xq, const Q8Meta* xmeta,
                                          float* out, const float* rms, unsigned bx) {
  gemvRowsBlock<kQ4K, kN, kRows, kRowWarps, kUnroll, kBlocksPerRow, GEMVB_PITCH, GEMVB_GROUP_PITCH, GEMVB_HAS_BIAS>(
      w, bias, xq, xmeta, out, rms, bx);
}
}  // namespace minfer::kern::gemvb

#if GEMVB_BATCH
namespace minfer::kern::gemvb {
constexpr int kBatch = GEMVB_BATCH;  // the most tokens a launch takes
static_assert(kBatch >= 1 && kRows * kBatch <= 32, "GEMVB_BATCH: a lane per (row, token) sum at the end");
#ifdef GEMVB_RMS_EPS
static_assert(false, "the batched GEMV (prefill small launches) reads plain q8 rows");
#endif
}  // namespace minfer::kern::gemvb
// The batched GEMV: minfer_gemv_blocks for n_tokens ≤ GEMVB_BATCH q8 rows at once. Each lane loads its weight
// parts once per step and applies them to every token's activations (loadAct per token, from L1/L2), so the plane
// is streamed once per call; each (row, token) sum is the one minfer_gemv_blocks computes for that token alone,
// bit for bit (the same parts, steps and group sums). Token loops are warp-uniform (n_tokens is a launch argument).
extern "C" __global__ void MINFER_GEMVB_BOUNDS
    minfer_gemv_batch(const uint8_t* __restrict__ w, const float* __restrict__ bias, const int8_t* __restrict__ xq,
                      const minfer::kern::Q8Meta* __restrict__ xmeta, float* __restrict__ out, int n_tokens) {
  using namespace minfer::kern;
  using namespace minfer::kern::gemvb;
  if (n_tokens > kBatch) __trap();  // more rows than its sums hold (Step.small_rows ≤ GEMVB_BATCH in the codegen)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kGroupsPerCta + warp / kRowWarps) * kRows;
  if (threadIdx.x == 0) {
    const int first = blockIdx.x * kGroupsPerCta * kRows;
    const int rows = min(kGroupsPerCta * kRows, kN - first);
    prefetchL2(w + static_cast<uint64_t>(first) * GEMVB_PITCH, static_cast<unsigned>(rows) * GEMVB_PITCH);
  }
  overlapPrologue();
  const int t = (warp % kRowWarps) * 32 + lane, p = t % 4;
  constexpr int kStep = 8 * kRowWarps;
  float acc[kRows * kBatch];  // acc[i * kBatch + tok]
#pragma unroll
  for (int i = 0; i < kRows * kBatch; ++i) acc[i] = 0.0f;
  if (row0 < kN) {
    const uint8_t* wr[kRows];  // rows past the end read the last row (their sums are not written)
#pragma unroll
    for (int i = 0; i < kRows; ++i) wr[i] = w + static_cast<uint64_t>(row0 + i < kN ? row0 + i : kN - 1) * GEMVB_PITCH;
    for (int b = t / 4; b < kBlocksPerRow; b += kStep) {
      Part part[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i) part[i] = load<kQ4K>(wr[i] + static_cast<uint64_t>(b) * GEMVB_GROUP_PITCH, p);
      // Q6_K parts decoded once for every token; Q4_K parts decoded per token (their decoded nibbles, 16 more
      // registers per row, measured slower: BENCHMARKS.md).
      Decoded dec[kQ4K ? 1 : kRows];
      if constexpr (!kQ4K) {
#pragma unroll
        for (int i = 0; i < kRows; ++i) dec[i] = decodePart<false>(part[i], p);
      }
#pragma unroll
      for (int tok = 0; tok < kBatch; ++tok) {
        if (tok >= n_tokens) break;
        const Act a = loadAct<kQ4K>(xq + static_cast<uint64_t>(tok) * kK + 256 * b,
                                    xmeta + static_cast<uint64_t>(tok) * (kK / 32) + 8 * b, p);
#pragma unroll
        for (int i = 0; i < kRows; ++i)
          acc[i * kBatch + tok] += kQ4K ? partDot<true>(part[i], a, p) : decodedDot<false>(dec[i], a);
      }
    }
  }
  if (!groupSum<kRows * kBatch, kRowWarps>(acc)) return;
  // Lane i writes (row row0 + i / kBatch, token i % kBatch).
#pragma unroll
  for (int i = 0; i < kRows * kBatch; ++i) {
    const int r = row0 + i / kBatch, tok = i % kBatch;
    if (lane == i && r < kN && tok < n_tokens) {
#if GEMVB_HAS_BIAS
      acc[i] += bias[r];
#endif
      out[static_cast<uint64_t>(tok) * kN + r] = acc[i];
    }
  }
}
#elif GEMVB_PERSIST
namespace minfer::kern::gemvb {
static_assert(kRowWarps == 2, "the persistent form sums a group's two warps through shared memory");
constexpr unsigned kCtaRows = kGroupsPerCta * kRows;
constexpr unsigned kCtas = (kN + kCtaRows - 1) / kCtaRows;  // gemvBlocksLaunchRule's blocks per GEMV
// Item j of the persistent grid: gemvBlocksLaunchRule's block `bx` of one GEMV's (w, bias, out).
struct Item {
  const uint8_t* w;
  const float* bias;
  float* out;
  unsigned bx;
};
__device__ __forceinline__ void prefetchItem(const Item& it) {
  prefetchBlockRows<kN, static_cast<int>(kCtaRows), GEMVB_PITCH>(it.w, it.bx);
}
// The persistent form (GEMVB_PERSIST = 1; gridDim.x ≤ kItems, the grid resident at once): thread block b takes the
// items b, b + gridDim.x, … < kItems (item(j): an Item), each summed exactly as gemvRows sums that block (the same
// lanes, steps and group sums, so each output is minfer_gemv_blocks' bit for bit; the deferred norm's partials staged
// and 1/rms computed once per block), and asks L2 for the rows of the item two ahead while it sums one.
template <unsigned kItems, class ItemOf>
__device__ __forceinline__ void persistentRows(ItemOf item, const int8_t* xq, const Q8Meta* xmeta, const float* rms) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned stride = gridDim.x;
  if (threadIdx.x == 0)
    for (unsigned j = blockIdx.x, i = 0; i < 2 && j < kItems; ++i, j += stride) prefetchItem(item(j));
  overlapPrologue();
  const int t = (warp % kRowWarps) * 32 + lane;  // this lane's index in its group
#ifdef GEMVB_RMS_EPS
  using Rms = InputRms<kK>;
  if (warp == 0) Rms::stage(rms);
  Rms::wait();
  __syncthreads();
  const float inv = Rms::inv(GEMVB_RMS_EPS);
#else
  (void)rms;
#endif
  __shared__ float partial[2][kGemvBlocksWarps][kRows];  // by item parity: a warp may run one item ahead
  int parity = 0;
  for (unsigned j = blockIdx.x; j < kItems; j += stride, parity ^= 1) {
    if (threadIdx.x == 0 && j + 2 * stride < kItems) prefetchItem(item(j + 2 * stride));
    const Item it = item(j);
    const int row0 = (it.bx * kGroupsPerCta + warp / kRowWarps) * kRows;
    float acc[kRows];
    rowGroupSums<kQ4K, kN, kRows, kRowWarps, kUnroll, kBlocksPerRow, GEMVB_PITCH, GEMVB_GROUP_PITCH>(it.w, row0, xq, xmeta,
                                                                                                     t, acc);
    // groupSum's sums, through the parity's buffer.
#pragma unroll
    for (int i = 0; i < kRows; ++i) acc[i] = warpSum(acc[i]);
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) partial[parity][warp][i] = acc[i];
    }
    __syncthreads();  // every warp reaches it each item (the loop bounds are the block's); the sums' warps go on
    if (warp % kRowWarps != 0) continue;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      acc[i] += partial[parity][warp + 1][i];
#ifdef GEMVB_RMS_EPS
      acc[i] = __fmul_rn(acc[i], inv);  // as gemvRows: never fused with the bias's add
#endif
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      if (lane == i && row0 + i < kN) it.out[row0 + i] = GEMVB_HAS_BIAS ? acc[i] + it.bias[row0 + i] : acc[i];
  }
}
}  // namespace minfer::kern::gemvb
// The GEMV pair's persistent form: items [0, kCtas) the first GEMV's blocks, [kCtas, 2·kCtas) the second's.
extern "C" __global__ void MINFER_GEMVB_BOUNDS
    minfer_gemv_pair(const uint8_t* __restrict__ w0, const float* __restrict__ bias0, const uint8_t* __restrict__ w1,
                     const float* __restrict__ bias1, const int8_t* __restrict__ xq,
                     const minfer::kern::Q8Meta* __restrict__ xmeta, float* __restrict__ out0,
                     float* __restrict__ out1 MINFER_GEMVB_RMS_PARAM) {
  using namespace minfer::kern::gemvb;
  persistentRows<2 * kCtas>(
      [&](unsigned j) { return j < kCtas ? Item{w0, bias0, out0, j} : Item{w1, bias1, out1, j - kCtas}; }, xq, xmeta,
      MINFER_GEMVB_RMS);
}
#elif GEMVB_PAIR
// Two GEMVs of one input and one shape in one launch (the first gridDim.x / 2 blocks the first, the rest
// the second): each computed exactly as minfer_gemv_blocks computes it.
extern "C" __global__ void MINFER_GEMVB_BOUNDS
    minfer_gemv_pair(const uint8_t* __restrict__ w0, const float* __restrict__ bias0, const uint8_t* __restrict__ w1,
                     const float* __restrict__ bias1, const int8_t* __restrict__ xq,
                     const minfer::kern::Q8Meta* __restrict__ xmeta, float* __restrict__ out0,
                     float* __restrict__ out1 MINFER_GEMVB_RMS_PARAM) {
  const unsigned half = gridDim.x / 2, bx = blockIdx.x;
  if (bx < half)
    minfer::kern::gemvb::gemvBlock(w0, bias0, xq, xmeta, out0, MINFER_GEMVB_RMS, bx);
  else
    minfer::kern::gemvb::gemvBlock(w1, bias1, xq, xmeta, out1, MINFER_GEMVB_RMS, bx - half);
}
#else
extern "C" __global__ void MINFER_GEMVB_BOUNDS
    minfer_gemv_blocks(const uint8_t* __restrict__ w, const float* __restrict__ bias, const int8_t* __restrict__ xq,
                       const minfer::kern::Q8Meta* __restrict__ xmeta, float* __restrict__ out MINFER_GEMVB_RMS_PARAM) {
  minfer::kern::gemvb::gemvBlock(w, bias, xq, xmeta, out, MINFER_GEMVB_RMS, blockIdx.x);
}
#endif  // GEMVB_PAIR
#endif  // GEMVB_GLU
#endif

#if defined(MINFER_DEVICE_CODE) && defined(GEMVB_TRIPLE)
namespace minfer::kern::gemv3 {

constexpr int kRowWarps = GEMVB_ROW_WARPS, kUnroll = GEMVB_UNROLL, kBlocksPerRow = GEMVB_K / 256;
constexpr int kGroupsPerCta = static_cast<int>(kGemvBlocksWarps) / kRowWarps;
static_assert(GEMVB_K % 256 == 0, "GEMVB_K must be a multiple of 256");
static_assert(kRowWarps == 1 || kRowWarps == 2, "GEMVB_ROW_WARPS must be 1 or 2");
static_assert(kUnroll >= 1 && kUnroll <= 4, "GEMVB_UNROLL: 1 … 4");

// One of the three GEMVs: its constants (as minfer_gemv_blocks' GEMVB_N, _TYPE, _PITCH, _GROUP_PITCH, _ROWS,
// _HAS_BIAS) and its blocks of the grid.
template <int kN, int kType, unsigned kPitch, int kGroupPitch, int kRows, bool kBias>
struct Segment {
  static_assert(kN >= 1 && (kType == 12 || kType == 14), "rows ≥ 1; types Q4_K (12) or Q6_K (14)");
  static_assert(kRows >= 1 && kRows <= 4, "rows per warp: 1 … 4");
  static_assert(kPitch % 16 == 0 && kGroupPitch % 16 == 0 && kGroupPitch >= (kType == 12 ? 144 : 210) &&
                    kPitch >= static_cast<unsigned long long>(kBlocksPerRow) * kGroupPitch,
                "blocks must start 16-byte aligned inside their rows");
  static constexpr unsigned kBlocks = (kN + kGroupsPerCta * kRows - 1) / (kGroupsPerCta * kRows);
  __device__ static void run(const uint8_t* w, const float* bias, const int8_t* xq, const Q8Meta* xmeta, float* out,
                             const float* rms, unsigned bx) {
    gemvb::gemvRowsBlock<kType == 12, kN, kRows, kRowWarps, kUnroll, kBlocksPerRow, kPitch, kGroupPitch, kBias>(
        w, bias, xq, xmeta, out, rms, bx);
  }
};
using Seg0 = Segment<GEMVB_N0, GEMVB_TYPE0, GEMVB_PITCH0, GEMVB_GROUP_PITCH0, GEMVB_ROWS0, GEMVB_HAS_BIAS0>;
using Seg1 = Segment<GEMVB_N1, GEMVB_TYPE1, GEMVB_PITCH1, GEMVB_GROUP_PITCH1, GEMVB_ROWS1, GEMVB_HAS_BIAS1>;
using Seg2 = Segment<GEMVB_N2, GEMVB_TYPE2, GEMVB_PITCH2, GEMVB_GROUP_PITCH2, GEMVB_ROWS2, GEMVB_HAS_BIAS2>;

}  // namespace minfer::kern::gemv3

// Blocks [0, B0) run segment 0, [B0, B0 + B1) segment 1, the rest segment 2 (a block's segment is uniform, so
// the branch costs no divergence).
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kGemvBlocksWarps)
    minfer_gemv_triple(const uint8_t* __restrict__ w0, const float* __restrict__ bias0, const uint8_t* __restrict__ w1,
                       const float* __restrict__ bias1, const uint8_t* __restrict__ w2, const float* __restrict__ bias2,
                       const int8_t* __restrict__ xq, const minfer::kern::Q8Meta* __restrict__ xmeta,
                       float* __restrict__ out0, float* __restrict__ out1,
                       float* __restrict__ out2 MINFER_GEMVB_RMS_PARAM) {
  using namespace minfer::kern::gemv3;
  const unsigned bx = blockIdx.x;
  if (bx < Seg0::kBlocks)
    Seg0::run(w0, bias0, xq, xmeta, out0, MINFER_GEMVB_RMS, bx);
  else if (bx < Seg0::kBlocks + Seg1::kBlocks)
    Seg1::run(w1, bias1, xq, xmeta, out1, MINFER_GEMVB_RMS, bx - Seg0::kBlocks);
  else
    Seg2::run(w2, bias2, xq, xmeta, out2, MINFER_GEMVB_RMS, bx - Seg0::kBlocks - Seg1::kBlocks);
}
#endif  // GEMVB_TRIPLE

#if defined(MINFER_DEVICE_CODE) && defined(GEMVB_QKV)
namespace minfer::kern::qkv {

constexpr int kD = QKV_HEAD_DIM, kNq = QKV_NHEAD * kD, kNkv = QKV_NHEAD_KV * kD;
constexpr int kPairs = (kNq + 2 * kNkv) / 2;
constexpr int kRowWarps = GEMVB_ROW_WARPS, kUnroll = GEMVB_UNROLL;
constexpr int kGroupsPerCta = static_cast<int>(kGemvBlocksWarps) / kRowWarps;
constexpr int kBlocksPerRow = GEMVB_K / 256;
static_assert(GEMVB_K % 256 == 0 && kD % 2 == 0, "GEMVB_K must be a multiple of 256, QKV_HEAD_DIM even");
static_assert(ROPE_NROT % 2 == 0 && ROPE_NROT <= QKV_HEAD_DIM, "ROPE_NROT must be even and <= QKV_HEAD_DIM");
static_assert(kRowWarps == 2,
              "the QKV GEMV runs gemvQkvShape(): GEMVB_ROW_WARPS 2 (groupSum's barrier pairs the angle warp's)");

// One of q, k, v: its plane and bias.
template <int kType, int kPitch, int kGroupPitch, bool kBias>
struct Segment {
  static_assert(kType == 12 || kType == 14, "types Q4_K (12) or Q6_K (14)");
  static_assert(kPitch % 16 == 0 && kGroupPitch % 16 == 0 && kGroupPitch >= (kType == 12 ? 144 : 210) &&
                    kPitch >= kBlocksPerRow * kGroupPitch,
                "blocks must start 16-byte aligned inside their rows");
  static constexpr bool kQ4K = kType == 12;
  static constexpr int kRowPitch = kPitch;

  __device__ static void sums(const uint8_t* w, int ra, int rb, const int8_t* xq, const Q8Meta* xm, int t, float (&acc)[2]) {
    const uint8_t* wr[2] = {w + static_cast<uint64_t>(ra) * kPitch, w + static_cast<uint64_t>(rb) * kPitch};
    gemvb::accumulateRows<kQ4K, 2, kRowWarps, kUnroll, kBlocksPerRow, kGroupPitch>(wr, xq, xm, t % 4, t / 4, acc);
  }
  __device__ static void bias(const float* b, int ra, int rb, float (&acc)[2]) {
    if (kBias) {
      acc[0] += b[ra];
      acc[1] += b[rb];
    }
  }
};
using SegQ = Segment<GEMVB_Q_TYPE, GEMVB_Q_PITCH, GEMVB_Q_GROUP_PITCH, GEMVB_Q_HAS_BIAS>;
using SegK = Segment<GEMVB_K_TYPE, GEMVB_K_PITCH, GEMVB_K_GROUP_PITCH, GEMVB_K_HAS_BIAS>;
using SegV = Segment<GEMVB_V_TYPE, GEMVB_V_PITCH, GEMVB_V_GROUP_PITCH, GEMVB_V_HAS_BIAS>;

// The rows of pair j of a head (j < HEAD_DIM / 2) and whether RoPE rotates them (by pair j's angle).
struct Pair {
  int a, b;
  bool rotate;
};
__device__ __forceinline__ Pair pairRows(int j, bool rope) {
  if (!rope) return {2 * j, 2 * j + 1, false};
  if (ROPE_NEOX)
    return j < ROPE_NROT / 2 ? Pair{j, j + ROPE_NROT / 2, true} : Pair{2 * j, 2 * j + 1, false};  // j ≥ n_rot/2: rows n_rot …
  return {2 * j, 2 * j + 1, 2 * j < ROPE_NROT};
}

}  // namespace minfer::kern::qkv

extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kGemvQkvWarps)
    minfer_gemv_qkv(const uint8_t* __restrict__ wq, const float* __restrict__ bq, const uint8_t* __restrict__ wk,
                    const float* __restrict__ bk, const uint8_t* __restrict__ wv, const float* __restrict__ bv,
                    const int8_t* __restrict__ xq, const minfer::kern::Q8Meta* __restrict__ xmeta,
                    const float* __restrict__ freq_factors, float* __restrict__ q, float* __restrict__ k,
                    float* __restrict__ v, uint16_t* __restrict__ kc, uint16_t* __restrict__ vc,
                    const int* __restrict__ pos MINFER_GEMVB_RMS_PARAM) {
  using namespace minfer::kern;
  using namespace minfer::kern::qkv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Group g of this block: pair blockIdx.x · kGroupsPerCta + g; segment 0 q, 1 k, 2 v; p = the pair's
  // index in its segment; the rows of its head.
  struct Where {
    bool active;
    int seg, p;
    Pair rows;
  };
  const auto where = [](int g) {
    const int pair = blockIdx.x * kGroupsPerCta + g;
    Where w;
    w.active = pair < kPairs;
    w.seg = pair < kNq / 2 ? 0 : pair < kNq / 2 + kNkv / 2 ? 1 : 2;
    w.p = pair - (w.seg == 0 ? 0 : w.seg == 1 ? kNq / 2 : kNq / 2 + kNkv / 2);
    w.rows = pairRows(w.p % (kD / 2), w.seg < 2);
    w.rows.a += w.p / (kD / 2) * kD;
    w.rows.b += w.p / (kD / 2) * kD;
    return w;
  };
  __shared__ float angle[kGroupsPerCta][2];  // cos, sin of each group's pair
#ifdef GEMVB_RMS_EPS
  __shared__ float input_inv;  // 1/rms of the deferred norm's input, from the angle warp too
#endif
  if (warp == static_cast<int>(kGemvBlocksWarps)) {  // the angle warp: lane g for group g
    overlapPrologue();
#ifdef GEMVB_RMS_EPS
    using Rms = gemvb::InputRms<GEMVB_K>;
    Rms::stage(rms);
#endif
    const Where w = where(lane);
    if (lane < kGroupsPerCta && w.active && w.rows.rotate)
      ropeCosSin(w.p % (kD / 2), pos[0], freq_factors, angle[lane][0], angle[lane][1]);
#ifdef GEMVB_RMS_EPS
    Rms::wait();
    __syncwarp();
    const float inv = Rms::inv(GEMVB_RMS_EPS);
    if (lane == 0) input_inv = inv;
#endif
    __syncthreads();
    float none[2] = {0.0f, 0.0f};
    gemvb::groupSum<2, kRowWarps>(none);  // its barrier
    return;
  }
  const int g = warp / kRowWarps;
  const Where w = where(g);
  const uint8_t* wt = w.seg == 0 ? wq : w.seg == 1 ? wk : wv;
  const int pitch = w.seg == 0 ? SegQ::kRowPitch : w.seg == 1 ? SegK::kRowPitch : SegV::kRowPitch;
  if (w.active && threadIdx.x % (32 * kRowWarps) == 0) {  // the group's rows start moving to L2 (weights only)
    prefetchL2(wt + static_cast<uint64_t>(w.rows.a) * pitch, static_cast<unsigned>(pitch));
    prefetchL2(wt + static_cast<uint64_t>(w.rows.b) * pitch, static_cast<unsigned>(pitch));
  }
  overlapPrologue();
  const int t = (warp % kRowWarps) * 32 + lane;
  float acc[2] = {0.0f, 0.0f};
  if (w.active) {
    if (w.seg == 0) SegQ::sums(wq, w.rows.a, w.rows.b, xq, xmeta, t, acc);
    else if (w.seg == 1) SegK::sums(wk, w.rows.a, w.rows.b, xq, xmeta, t, acc);
    else SegV::sums(wv, w.rows.a, w.rows.b, xq, xmeta, t, acc);
  }
  __syncthreads();  // the angles (and the input's 1/rms) are in shared memory
  if (!gemvb::groupSum<2, kRowWarps>(acc) || lane != 0 || !w.active) return;
#ifdef GEMVB_RMS_EPS
  acc[0] = __fmul_rn(acc[0], input_inv);  // as gemvRows: never fused with the bias's add
  acc[1] = __fmul_rn(acc[1], input_inv);
#endif
  if (w.seg == 0) SegQ::bias(bq, w.rows.a, w.rows.b, acc);
  else if (w.seg == 1) SegK::bias(bk, w.rows.a, w.rows.b, acc);
  else SegV::bias(bv, w.rows.a, w.rows.b, acc);
  float a = acc[0], b = acc[1];
  if (w.rows.rotate) ropeRotate(acc[0], acc[1], angle[g][0], angle[g][1], a, b);
  float* out = w.seg == 0 ? q : w.seg == 1 ? k : v;
  out[w.rows.a] = a;
  out[w.rows.b] = b;
  if (w.seg == 0) return;
#ifdef QKV_KV_RING  // a sliding-window layer's ring cache (schema Step.kv_ring): position p in slot p % ring
  uint16_t* cache = (w.seg == 1 ? kc : vc) + static_cast<uint64_t>(pos[0] % QKV_KV_RING) * kNkv;
#else
  uint16_t* cache = (w.seg == 1 ? kc : vc) + static_cast<uint64_t>(pos[0]) * kNkv;
#endif
  cache[w.rows.a] = f2h(a);
  cache[w.rows.b] = f2h(b);
}
#endif  // GEMVB_QKV

#if defined(MINFER_DEVICE_CODE)
#undef MINFER_GEMVB_RMS_PARAM
#undef MINFER_GEMVB_RMS
#endif
