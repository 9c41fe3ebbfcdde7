// Mixture of experts (OpKind MoeRoute, MoeFfn; qwen3moe): the softmax router's top-k, and the expert FFN
// computed per expert over the token slots routed to it (a grouped matrix-vector product over the slots
// sorted by expert: each expert's weight rows are read once per group of kMoeGroup slots, and only the
// experts some slot chose are launched, so decode reads only the selected experts' rows).
// The f32 references are cpu::moeRoute and cpu::moeFfn (runtime/cpu/cpu_ops.h); the formulas are
// llama.cpp's build_moe_ffn with softmax gating and SiLU.
//
// One step MoeFfn is four launches sharing the step's scratch (layout: moeScratch* below, in 4-byte words):
//   minfer_moe_sort     slots s = t·K + j (token t, choice j) grouped by expert: counting sort of ids in
//                       thread block 0 (shared-memory counts, one warp's scan): offsets[e] .. offsets[e+1]
//                       index list[] (slot order within an expert is not fixed; every slot's result is
//                       computed alone, so results do not depend on it), and the chosen experts in id
//                       order: used[0] = their count u, used[1 .. u]. With MOE_X_Q8 the further thread
//                       blocks write the q8 form of x (common.cuh quantizeBlock, QuantizeAct's
//                       definition) into the scratch's Xq buffer.
//   minfer_moe_gate_up  per (chosen expert e, row r of the expert width F), for every slot s of e:
//                       A[s][r] = silu(gate_e(r)·x[t]) · (up_e(r)·x[t])   (and, with MOE_A_Q8, the q8
//                       form of A[s] in the scratch's Aq buffer, for a down weight read from blocks)
//   minfer_moe_down     per (chosen expert e, row r of n_embd E), for every slot s of e: Y[s][r] = down_e(r)·A[s]
//   minfer_moe_combine  out[t][r] = Σ_j w[t][j]·Y[t·K + j][r], j = 0..K−1 in order (slots whose id is not
//                       an expert are skipped, as cpu::moeFfn does)
// In the decode plan the router MatMul, MoeRoute and the sort are one launch, minfer_moe_router_sort
// (MOE_ROUTER_SORT; minfer_moe_route_sort, MOE_ROUTE_SORT, without the router GEMV), and the last two are one
// launch, minfer_moe_down_combine (MOE_DOWN_COMBINE): down, then the
// last thread block of each row tile (all chosen experts' blocks of those rows counted done in a counter word,
// the acquire-release pattern of gemv_blocks.cuh's minfer_gemv_glu) computes the combine of the tile's rows with
// minfer_moe_combine's expression and order (combineValue), so out is the same bit for bit.
// When gate, up and down are all read from blocks, the decode plan's experts run instead as two GEMVs over the
// token's K chosen experts' rows, which need no slot lists (the router launch then skips the sort,
// MOE_SORT_SLOTS 0): minfer_moe_gate_up_dec (two outputs j·F + r of A per warp or pair of warps, gemv_blocks.cuh's
// sums and minfer_gemv_glu's q8 tail; each block also moves its share of the chosen experts' down rows to L2), then
// minfer_moe_down_dec (two output rows per warp over all K experts' rows, the combine's weights applied per part).
// The expert kernels' grid.y walks the chosen experts (used[1 + blockIdx.y]; thread blocks past u exit):
// min(n_tokens·K, NEXP) of them (moeExpertsLaunchRule), so an expert no slot chose costs nothing.
// A weight element (e, r, c) is read through its planes' stride tables with the expert axis
// (kernels/stride_table.h): row bytes at e·EPITCH + r·PITCH of each plane, from one of two plane sets:
//   * kBlocks (Q4_K, Q6_K; MOE_X_PLANE 7): the GGUF blocks, decoded as kernels/gemv_blocks.cuh decodes
//     them (its gemvb:: device functions: 16-byte loads, four lanes per block, int8 dot products with
//     the q8 activations, then the block's scales), so a token reads the chosen experts' GGUF bytes
//     (Q4_K 0.5625 B/weight, Q6_K 0.875) and nothing else. Activations are q8 (x for gate/up, A for down):
//     the result is W·(d·q) up to f32 rounding, as every quantized matmul of minfer (and llama.cpp's
//     GPU matmuls) computes it; the f32 reference differs by the activation rounding (tests: kQ8ActTol).
//     Lanes: a row of cols/256 blocks takes L = moeBlocksLanes(cols) consecutive lanes (four per block,
//     rounded up to a power of two ≤ 32; with more than 8 blocks each lane steps over blocks 8 apart),
//     so a warp computes 32 / L rows at once and a thread block of kMoeWarps warps 8·32 / L rows per
//     pass; gate_up's thread block covers moeBlocksRows(E, a_q8) rows (a multiple of 32 with
//     MOE_A_Q8, so that it quantizes whole blocks of A from shared memory). Each thread block first asks
//     for its rows (consecutive bytes of one expert) to be moved to L2 (prefetchL2), so that gate_up's
//     passes after the first find them there.
//   * the derived kI8 + kScale [+ kMin] planes as s·q [+ m], or a float weight's dense plane, with f32
//     activations and f32 dot products, one warp per row: where the width is a multiple of 4 and the
//     plane is i8 or f32, each lane loads 4 consecutive weights at once (one 4-byte i8 word or one
//     float4) and the matching float4 of each slot's input; otherwise one element per lane and load.
// Gate and up are read from the same plane set (blocks, or not); down may differ (MOE_A_Q8 says blocks).
//
// Compile-time constants (-D):
//   all:      MOE_NEXP (experts), MOE_K (experts per token), MOE_F (expert width), MOE_E (n_embd),
//             MOE_MAX_BATCH (the plan's max batch: sizes the scratch regions)
//   router:   MOE_ROUTE, MOE_NORM (1: divide the chosen p by their sum)
//   gate_up:  MOE_GATE_UP; MOE_A_Q8 (1: also write A's q8 form); per weight X ∈ {G (gate), U (up)}:
//             MOE_X_PLANE (PlaneKind of the plane read first: 0 kI8, 4 kF32, 5 kF16, 6 kBF16, 7 kBlocks),
//             MOE_X_PITCH, MOE_X_EPITCH (its row and expert pitch), MOE_X_S_PITCH, MOE_X_S_EPITCH (scale
//             plane), MOE_X_M_PITCH, MOE_X_M_EPITCH (min plane; 0: none), MOE_X_GS (scale group size);
//             kBlocks: MOE_X_TYPE (12 Q4_K, 14 Q6_K), MOE_X_GP (bytes from one block to the next)
//   down:     MOE_DOWN; the same constants for X = D
//   sort:     MOE_SORT, MOE_X_Q8 (1: quantize x, for gate/up read from blocks);  combine: MOE_COMBINE
//   down + combine: MOE_DOWN and MOE_DOWN_COMBINE = 1 (down's constants)
//   route + sort: MOE_ROUTE_SORT, MOE_NORM, MOE_X_Q8;  router + route + sort: MOE_ROUTER_SORT, MOE_NORM, MOE_X_Q8,
//             MOE_R_PLANE (4 kF32, 5 kF16, 6 kBF16), MOE_R_PITCH, MOE_R_HAS_BIAS (the router weight's dense plane),
//             MOE_SORT_SLOTS (default 1; 0: no slot sort, for the decode expert GEMVs, which read the ids)
//   decode expert GEMVs: MOE_GATE_UP_DEC (MOE_X_TYPE, _GP, _PITCH, _EPITCH for X = G, U, D) and MOE_DOWN_DEC (those of D;
//             MOE_ADD_NORM = 1: the residual Add and the deferred RMSNorm's q8 form and partial sums too)
// Launch ABI (x, out: n_tokens × E f32; ids: n_tokens × K i32; w: n_tokens × K f32; logits n_tokens × NEXP):
//   minfer_moe_route(const float* logits, int* ids, float* w)                 grid n_tokens × 32 threads
//   minfer_moe_sort(const int* ids, const float* x, float* scratch, int n_tokens)
//                                                   moeSortLaunchRule(E, x_q8): 1 (+ ⌈n_tokens·E/8192⌉) × 1024
//   minfer_moe_gate_up(const float* x, const uint8_t* gq, const uint8_t* gs, const uint8_t* gm,
//                      const uint8_t* uq, const uint8_t* us, const uint8_t* um, float* scratch)
//                                   grid (⌈F/rows⌉, min(n_tokens·K, NEXP)) × 256, rows = moeGateUpRows()
//   minfer_moe_down(const uint8_t* dq, const uint8_t* ds, const uint8_t* dm, float* scratch)
//                                   grid (⌈E/rows⌉, min(n_tokens·K, NEXP)) × 256, rows = moeDownRows()
//   minfer_moe_combine(const int* ids, const float* w, const float* scratch, float* out, int n_tokens)
//                                                                              grid ⌈n_tokens·E/256⌉ × 256
//   minfer_moe_route_sort(const float* logits, int* ids, float* w, const float* x, float* scratch, int n_tokens)
//                                                                                     the sort's grid and block
//   minfer_moe_router_sort(const uint8_t* rw, const float* rbias, const float* x, float* logits, int* ids,
//                          float* w, float* scratch, unsigned* counters, int n_tokens)   moeRouterSortLaunchRule();
//                          one token (the decode plan's): n_tokens ≠ 1 traps; rw: the router's dense plane,
//                          rbias: NEXP f32 or null; counters: 1 word, zero on entry and on exit
//   minfer_moe_down_combine(const uint8_t* dq, const uint8_t* ds, const uint8_t* dm, float* scratch,
//                           const int* ids, const float* w, float* out, unsigned* counters, int n_tokens)
//                                   minfer_moe_down's grid; counters: ⌈E/rows⌉ words, zero on entry and on exit
//   minfer_moe_gate_up_dec(const int* ids, const uint8_t* gq, const uint8_t* uq, const uint8_t* dq, float* scratch,
//                          unsigned* counters)       moeGateUpDecLaunchRule(K, F, E); one token (the decode plan's):
//                          A and its q8 form into the scratch; counters: K·F/32 words, zero on entry and on exit
//   minfer_moe_down_dec(const int* ids, const float* w, const uint8_t* dq, float* scratch, float* out)
//                                                    moeDownDecLaunchRule(E); one token: out = E f32
//     with MOE_ADD_NORM = 1, after out: (const float* res, float* sum, const float* nw, int8_t* qs, Q8Meta* meta,
//     float* partial, unsigned* counters): res, sum E f32 (may alias: the residual in place), nw E f32 (the norm
//     weight), qs, meta: row 0 of the q8 buffer (q8 of sum ⊙ nw), partial E / 32 f32, counters E / 32 words, zero
//     on entry and on exit (gemv_blocks.cuh minfer_gemv_add_norm's arguments after its product)
//   gs/gm/us/um/ds/dm are null for kBlocks and float weights and for absent min planes; x of the
//   gate_up kernel is unused when gate/up are read from blocks (it reads the scratch's Xq).
#pragma once

#include "kernels/common.cuh"
#include "kernels/dense_matmul.cuh"
#include "kernels/gemv_blocks.cuh"

namespace minfer::kern {

constexpr unsigned kMoeWarps = 8;      // rows per block of the expert matvec kernels (one warp each)
constexpr unsigned kMoeGroup = 8;      // slots whose dot products share one pass over a weight row
constexpr unsigned kMoeSortThreads = 1024;
constexpr unsigned kMoeCombineThreads = 256;

// Scratch layout of a MoeFfn step, in 4-byte words: offsets (NEXP + 1 ints), the sorted slot list (max_batch·K ints), the chosen experts (NEXP + 1 ints: the count, then the ids), A
// (max_batch·K × F floats), Y (max_batch·K × E floats), Xq (the q8 buffer of x: common.cuh layout,
// max_batch rows of E), Aq (the q8 buffer of A: max_batch·K rows of F). Regions from A on start 16-byte
// aligned (q8 meta rows are 16-byte aligned inside Xq and Aq when E and F are multiples of 256).
MINFER_HD unsigned long long moeScratchList(unsigned n_exp) { return n_exp + 1ull; }
MINFER_HD unsigned long long moeScratchUsed(unsigned n_exp, unsigned max_batch, unsigned k) {
  return moeScratchList(n_exp) + 1ull * max_batch * k;
}
MINFER_HD unsigned long long moeAlign4(unsigned long long words) { return (words + 3) / 4 * 4; }
MINFER_HD unsigned long long moeScratchA(unsigned n_exp, unsigned max_batch, unsigned k) {
  return moeAlign4(moeScratchUsed(n_exp, max_batch, k) + n_exp + 1);
}
MINFER_HD unsigned long long moeScratchY(unsigned n_exp, unsigned max_batch, unsigned k, unsigned f) {
  return moeScratchA(n_exp, max_batch, k) + 1ull * max_batch * k * f;
}
MINFER_HD unsigned long long moeScratchXq(unsigned n_exp, unsigned max_batch, unsigned k, unsigned f, unsigned e) {
  return moeAlign4(moeScratchY(n_exp, max_batch, k, f) + 1ull * max_batch * k * e);
}
MINFER_HD unsigned long long moeScratchAq(unsigned n_exp, unsigned max_batch, unsigned k, unsigned f, unsigned e) {
  return moeAlign4(moeScratchXq(n_exp, max_batch, k, f, e) + (q8BufferBytes(max_batch, e) + 3) / 4);
}
MINFER_HD unsigned long long moeScratchBytes(unsigned n_exp, unsigned max_batch, unsigned k, unsigned f, unsigned e) {
  return 4ull * moeAlign4(moeScratchAq(n_exp, max_batch, k, f, e) + (q8BufferBytes(max_batch * k, f) + 3) / 4);
}

// kBlocks expert matvec: lanes per row of `cols` weights (four per 256-weight block, rounded up to a
// power of two, at most 32), and rows per thread block: one pass of kMoeWarps warps (32 / lanes rows
// each), at least 32 rows when the kernel quantizes its output (gate_up with MOE_A_Q8).
MINFER_HD constexpr unsigned moeBlocksLanes(unsigned cols) {
  unsigned l = 4;
  while (l < 32 && l < 4 * (cols / 256)) l *= 2;
  return l;
}
MINFER_HD constexpr unsigned moeBlocksRows(unsigned cols, bool q8_out) {
  const unsigned pass = kMoeWarps * 32 / moeBlocksLanes(cols);
  return q8_out && pass < 32 ? 32 : pass;
}
// Rows per thread block of gate_up (F rows of E weights) and down (E rows of F weights), by plane set.
MINFER_HD constexpr unsigned moeGateUpRows(bool blocks, unsigned e, bool a_q8) {
  return blocks ? moeBlocksRows(e, a_q8) : a_q8 ? 32 : kMoeWarps;
}
MINFER_HD constexpr unsigned moeDownRows(bool blocks, unsigned f) { return blocks ? moeBlocksRows(f, false) : kMoeWarps; }

MINFER_HD LaunchRule moeRouteLaunchRule() {
  LaunchRule r;
  r.grid[0] = perToken(1);
  r.block.x = 32;
  return r;
}
// Thread block 0 sorts; with x_q8, ⌈n_tokens·E/8192⌉ more quantize x (256 blocks of 32 values each).
MINFER_HD LaunchRule moeSortLaunchRule(unsigned e, bool x_q8) {
  LaunchRule r;
  constexpr unsigned kPerCta = kMoeSortThreads / 4;  // q8 blocks of 32 values per thread block
  r.grid[0] = x_q8 ? GridExtent{e / kQ8Block, kPerCta, kPerCta} : fixedExtent(1);
  r.block.x = kMoeSortThreads;
  return r;
}
// The router + route + sort launch of one token (minfer_moe_router_sort): moeRouterBlocks(n_exp) thread blocks of
// kMoeRouterThreads threads compute the router's rows, one warp each (dense_gemv's 4 rows per block, so the rows'
// weight loads spread over as many SMs), then with x_q8 the blocks quantizing x (32 q8 blocks each).
constexpr unsigned kMoeRouterThreads = 128;
MINFER_HD constexpr unsigned moeRouterBlocks(unsigned n_exp) {
  return (n_exp + kMoeRouterThreads / 32 - 1) / (kMoeRouterThreads / 32);
}
MINFER_HD LaunchRule moeRouterSortLaunchRule(unsigned n_exp, unsigned e, bool x_q8) {
  LaunchRule r;
  r.grid[0] = fixedExtent(moeRouterBlocks(n_exp) + (x_q8 ? ceilDiv(e / kQ8Block, kMoeRouterThreads / 4) : 0));
  r.block.x = kMoeRouterThreads;
  return r;
}
// The expert matvec kernels: `rows` output rows per expert (F for gate_up, E for down), `per_cta` of them
// per thread block; grid.y = min(n_tokens·K, NEXP) chosen experts (all NEXP from ⌈NEXP / K⌉ tokens on).
MINFER_HD LaunchRule moeExpertsLaunchRule(unsigned rows, unsigned per_cta, unsigned n_exp, unsigned k) {
  LaunchRule r;
  r.grid[0] = r.grid_large[0] = fixedExtent(ceilDiv(rows, per_cta));
  r.grid[1] = perToken(k);
  r.grid_large[1] = fixedExtent(n_exp);
  r.large_from = ceilDiv(n_exp, k);
  r.block.x = 32 * kMoeWarps;
  return r;
}
// The decode expert GEMVs (one token's K chosen experts, minfer_moe_gate_up_dec / minfer_moe_down_dec):
// kGemvBlocksWarps warps per thread block. gate_up: kMoeGateUpDecGroupOutputs consecutive outputs (each a gate and an up
// row of E weights, all summed in one pass) per group of moeDecRowWarps(E) warps (one warp covers 8 blocks of a row
// per step: two from 16 blocks on, as the dense GEMV's two warps per row); down: kMoeDownDecRows output rows per
// warp, each over all K experts' rows.
MINFER_HD constexpr unsigned moeDecRowWarps(unsigned e) { return e / 256 >= 16 ? 2u : 1u; }
// Measured on the H200 (qwen3-30b-a3b tg128): 2 outputs per warp group 489.3 t/s, 1 output 476.2 (its 1,536
// thread blocks of 50 registers took 1.29 waves; 1 output with 12 blocks per SM forced, 467.4; BENCHMARKS.md).
constexpr unsigned kMoeGateUpDecGroupOutputs = 2;
MINFER_HD constexpr unsigned moeGateUpDecOutputs(unsigned e) {
  return kGemvBlocksWarps / moeDecRowWarps(e) * kMoeGateUpDecGroupOutputs;
}
// Measured on the H200 (qwen3-30b-a3b tg128): 2 rows per warp 459.5 t/s, 1 row 448.6 (BENCHMARKS.md).
constexpr unsigned kMoeDownDecRows = 2;
MINFER_HD LaunchRule moeGateUpDecLaunchRule(unsigned k, unsigned f, unsigned e) {
  LaunchRule r;
  r.grid[0] = fixedExtent(ceilDiv(k * f, moeGateUpDecOutputs(e)));
  r.block.x = 32 * kGemvBlocksWarps;
  return r;
}
MINFER_HD LaunchRule moeDownDecLaunchRule(unsigned e) {
  LaunchRule r;
  r.grid[0] = fixedExtent(ceilDiv(e, kGemvBlocksWarps * kMoeDownDecRows));
  r.block.x = 32 * kGemvBlocksWarps;
  return r;
}
MINFER_HD LaunchRule moeCombineLaunchRule(unsigned e) {
  LaunchRule r;
  r.grid[0] = perToken(e, kMoeCombineThreads);
  r.block.x = kMoeCombineThreads;
  return r;
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(MOE_NEXP)
namespace minfer::kern::moe {

constexpr unsigned kNexp = MOE_NEXP, kK = MOE_K, kF = MOE_F, kE = MOE_E, kMaxBatch = MOE_MAX_BATCH;

// One expert weight tensor read through its planes: element (e, r, c) = s·q [+ m] (kI8) or the dense value.
template <int kPlane, unsigned long long kPitch, unsigned long long kEPitch, unsigned long long kSPitch,
          unsigned long long kSEPitch, unsigned long long kMPitch, unsigned long long kMEPitch, unsigned kGS>
struct ExpertWeight {
  const uint8_t* q;
  const uint8_t* s;
  const uint8_t* m;
  // Pointers to row r of expert e in each plane.
  struct Row {
    const uint8_t* q;
    const float* s;
    const float* m;
  };
  __device__ __forceinline__ Row row(unsigned e, unsigned r) const {
    Row w;
    w.q = q + e * kEPitch + r * kPitch;
    w.s = kPlane == 0 ? reinterpret_cast<const float*>(s + e * kSEPitch + r * kSPitch) : nullptr;
    w.m = kPlane == 0 && kMPitch != 0 ? reinterpret_cast<const float*>(m + e * kMEPitch + r * kMPitch) : nullptr;
    return w;
  }
  // Planes whose 4 consecutive elements of a row load as one 4- or 16-byte word (i8 with scale groups of
  // a multiple of 4, or f32).
  static constexpr bool kVec4 = (kPlane == 0 && kGS % 4 == 0) || kPlane == 4;
  // Elements c .. c + 3 of a row (c a multiple of 4; kVec4 planes only).
  __device__ __forceinline__ void at4(const Row& w, unsigned c, float* v) const {
    if constexpr (kPlane == 4) {
      const float4 f = *reinterpret_cast<const float4*>(w.q + 4ull * c);
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
      const int q4 = *reinterpret_cast<const int*>(w.q + c);
      const float sc = w.s[c / kGS];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float p = __fmul_rn(sc, static_cast<float>(static_cast<int8_t>(q4 >> (8 * k))));
        v[k] = kMPitch != 0 ? __fadd_rn(p, w.m[c / kGS]) : p;
      }
    }
  }
  __device__ __forceinline__ float at(const Row& w, unsigned c) const {
    if (kPlane == 4) return reinterpret_cast<const float*>(w.q)[c];
    if (kPlane == 5) return h2f(reinterpret_cast<const uint16_t*>(w.q)[c]);
    if (kPlane == 6) return bf2f(reinterpret_cast<const uint16_t*>(w.q)[c]);
    const float v = __fmul_rn(w.s[c / kGS], static_cast<float>(static_cast<const int8_t*>(
                                                static_cast<const void*>(w.q))[c]));
    return kMPitch != 0 ? __fadd_rn(v, w.m[c / kGS]) : v;
  }
};

__device__ __forceinline__ int* offsets(float* scratch) { return reinterpret_cast<int*>(scratch); }
__device__ __forceinline__ int* slotList(float* scratch) { return reinterpret_cast<int*>(scratch) + moeScratchList(kNexp); }
__device__ __forceinline__ float* regionA(float* scratch) { return scratch + moeScratchA(kNexp, kMaxBatch, kK); }
__device__ __forceinline__ float* regionY(float* scratch) { return scratch + moeScratchY(kNexp, kMaxBatch, kK, kF); }
// The chosen experts: used[0] = their count, used[1 ..] their ids (written by the sort).
__device__ __forceinline__ int* usedExperts(float* scratch) {
  return reinterpret_cast<int*>(scratch) + moeScratchUsed(kNexp, kMaxBatch, kK);
}
// The q8 buffers of x (kMaxBatch rows of E) and of A (kMaxBatch·K rows of F): common.cuh's layout.
__device__ __forceinline__ int8_t* xqOf(float* scratch) {
  return reinterpret_cast<int8_t*>(scratch + moeScratchXq(kNexp, kMaxBatch, kK, kF, kE));
}
__device__ __forceinline__ Q8Meta* xmetaOf(float* scratch) {
  return reinterpret_cast<Q8Meta*>(xqOf(scratch) + q8MetaOffset(kMaxBatch, kE));
}
__device__ __forceinline__ int8_t* aqOf(float* scratch) {
  return reinterpret_cast<int8_t*>(scratch + moeScratchAq(kNexp, kMaxBatch, kK, kF, kE));
}
__device__ __forceinline__ Q8Meta* ametaOf(float* scratch) {
  return reinterpret_cast<Q8Meta*>(aqOf(scratch) + q8MetaOffset(kMaxBatch * kK, kF));
}
// The expert thread block blockIdx.y works on (its chosen expert), or −1 past the chosen ones.
__device__ __forceinline__ int blockExpert(float* scratch) {
  const int* used = usedExperts(scratch);
  return static_cast<int>(blockIdx.y) < used[0] ? used[1 + blockIdx.y] : -1;
}

}  // namespace minfer::kern::moe

#if defined(MOE_ROUTE) || defined(MOE_ROUTE_SORT) || defined(MOE_ROUTER_SORT)
namespace minfer::kern::moe {
// The router of token t, by one warp (`lane`: threadIdx.x % 32): lane l holds experts l, l + 32, …; softmax as
// ggml_soft_max (max subtracted, e^x, times the reciprocal of the sum), then K rounds of a warp arg-max (larger
// p, then lower id); lane 0 writes the token's ids and weights. kL2: the logits are read through L2 (__ldcg:
// other thread blocks of the same launch wrote them).
template <bool kL2 = false>
__device__ __forceinline__ void routeToken(const float* logits, int* ids, float* w, unsigned t, unsigned lane) {
  constexpr unsigned kPer = (kNexp + 31) / 32;
  const float* row = logits + static_cast<unsigned long long>(t) * kNexp;
  float p[kPer];
  float mx = -MINFER_INF;
#pragma unroll
  for (unsigned i = 0; i < kPer; ++i) {
    const unsigned e = lane + 32 * i;
    p[i] = e < kNexp ? (kL2 ? __ldcg(row + e) : row[e]) : -MINFER_INF;
    mx = fmaxf(mx, p[i]);
  }
  mx = warpMax(mx);
  float sum = 0;
#pragma unroll
  for (unsigned i = 0; i < kPer; ++i) {
    const unsigned e = lane + 32 * i;
    p[i] = e < kNexp ? expf(p[i] - mx) : 0.0f;
    sum += p[i];
  }
  const float inv = 1.0f / warpSum(sum);
  bool taken[kPer];
#pragma unroll
  for (unsigned i = 0; i < kPer; ++i) p[i] *= inv, taken[i] = lane + 32 * i >= kNexp;
  float chosen_p[kK];
  int chosen_id[kK];
  float chosen = 0;
  for (unsigned j = 0; j < kK; ++j) {
    float best = -1.0f;
    int best_id = 0x7fffffff;
#pragma unroll
    for (unsigned i = 0; i < kPer; ++i)
      if (!taken[i] && p[i] > best) best = p[i], best_id = static_cast<int>(lane + 32 * i);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (ob > best || (ob == best && oi < best_id)) best = ob, best_id = oi;
    }
#pragma unroll
    for (unsigned i = 0; i < kPer; ++i)
      if (static_cast<int>(lane + 32 * i) == best_id) taken[i] = true;
    chosen_p[j] = best;
    chosen_id[j] = best_id;
    chosen += best;
  }
  if (lane == 0)
    for (unsigned j = 0; j < kK; ++j) {
      ids[t * kK + j] = chosen_id[j];
      w[t * kK + j] = MOE_NORM ? chosen_p[j] / chosen : chosen_p[j];
    }
}
}  // namespace minfer::kern::moe
#endif

#if defined(MOE_ROUTE)
// One warp (thread block) per token.
extern "C" __global__ void __launch_bounds__(32) minfer_moe_route(const float* logits, int* ids, float* w) {
  minfer::kern::overlapPrologue();
  minfer::kern::moe::routeToken(logits, ids, w, blockIdx.x, threadIdx.x);
}
#endif  // MOE_ROUTE

#if defined(MOE_SORT) || defined(MOE_ROUTE_SORT) || defined(MOE_ROUTER_SORT)
namespace minfer::kern::moe {
#if MOE_X_Q8
static_assert(kE % 256 == 0, "x is quantized for kBlocks gate/up weights: E is a multiple of 256");
// Quantizing thread block i of kThreads threads (thread block 1 + i of the sort's grid, moeSortLaunchRule): blocks
// kThreads/4·i … of 32 values of x into the scratch's Xq (four lanes per block).
template <unsigned kThreads = kMoeSortThreads>
__device__ __forceinline__ void quantizeX(const float* x, float* scratch, int n_tokens, unsigned i) {
  const unsigned block = i * (kThreads / 4) + threadIdx.x / 4, sub = threadIdx.x % 4;
  const bool active = block < static_cast<unsigned>(n_tokens) * (kE / 32);  // inactive lanes join the shuffles
  float v[8] = {};
  if (active) {
    const float4* p = reinterpret_cast<const float4*>(x + 32ull * block + 8 * sub);
    const float4 a = p[0], b = p[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
  quantizeBlock<8>(v, xqOf(scratch) + 32ull * block, xmetaOf(scratch) + block, active);
}
#endif
// Thread block 0 of the sort's grid: counting sort of the n_tokens·K slots by expert, and the list of chosen
// experts (ids: written before the call, by an earlier launch or by this thread block before a barrier).
__device__ __forceinline__ void sortSlots(const int* ids, float* scratch, int n_tokens) {
  int* off = offsets(scratch);
  int* list = slotList(scratch);
  int* used = usedExperts(scratch);
  __shared__ int cur[kNexp];  // slots per expert, then each expert's next place in list
  const unsigned n_slots = static_cast<unsigned>(n_tokens) * kK;
  for (unsigned e = threadIdx.x; e < kNexp; e += blockDim.x) cur[e] = 0;
  __syncthreads();
  for (unsigned s = threadIdx.x; s < n_slots; s += blockDim.x) {
    const int e = ids[s];
    if (e >= 0 && e < static_cast<int>(kNexp)) atomicAdd(&cur[e], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // exclusive scan of the counts and of the chosen experts: lane l takes kChunk of them
    constexpr unsigned kChunk = (kNexp + 31) / 32;
    const unsigned lane = threadIdx.x, first = lane * kChunk;
    int slots = 0, chosen = 0;
    for (unsigned e = first; e < first + kChunk && e < kNexp; ++e) slots += cur[e], chosen += cur[e] > 0;
    int slots_incl = slots, chosen_incl = chosen;  // inclusive warp scans
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, slots_incl, o), c = __shfl_up_sync(0xffffffffu, chosen_incl, o);
      if (static_cast<int>(lane) >= o) slots_incl += a, chosen_incl += c;
    }
    int run = slots_incl - slots, n_used = chosen_incl - chosen;
    for (unsigned e = first; e < first + kChunk && e < kNexp; ++e) {
      const int n = cur[e];
      off[e] = run;
      cur[e] = run;
      run += n;
      if (n > 0) used[1 + n_used++] = static_cast<int>(e);
    }
    if (lane == 31) off[kNexp] = slots_incl, used[0] = chosen_incl;
  }
  __syncthreads();
  for (unsigned s = threadIdx.x; s < n_slots; s += blockDim.x) {
    const int e = ids[s];
    if (e >= 0 && e < static_cast<int>(kNexp)) list[atomicAdd(&cur[e], 1)] = static_cast<int>(s);
  }
}
}  // namespace minfer::kern::moe
#endif

#if defined(MOE_SORT) || defined(MOE_ROUTE_SORT)
namespace minfer::kern::moe {
// The sort grid's first step (minfer_moe_sort, minfer_moe_route_sort): more tokens than the scratch regions hold
// (MOE_MAX_BATCH) trap; with MOE_X_Q8 thread blocks 1, 2, … quantize x (quantizeX) and are done. True for thread
// block 0, which goes on to sort.
__device__ __forceinline__ bool sortGridSorts(const float* x, float* scratch, int n_tokens) {
  if (n_tokens > static_cast<int>(kMaxBatch)) __trap();
#if MOE_X_Q8
  if (blockIdx.x > 0) {
    quantizeX(x, scratch, n_tokens, blockIdx.x - 1);
    return false;
  }
#else
  (void)x;
  (void)scratch;
#endif
  return true;
}
}  // namespace minfer::kern::moe
#endif

#if defined(MOE_SORT)
// Thread block 0: counting sort of the n_tokens·K slots by expert, and the list of chosen experts.
// With MOE_X_Q8, thread block 1 + i quantizes blocks 256·i … of 32 values of x (four lanes per block).
extern "C" __global__ void __launch_bounds__(minfer::kern::kMoeSortThreads)
    minfer_moe_sort(const int* ids, const float* x, float* scratch, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern::moe;
  if (!sortGridSorts(x, scratch, n_tokens)) return;
  sortSlots(ids, scratch, n_tokens);
}
#endif  // MOE_SORT

#if defined(MOE_ROUTE_SORT)
// The router and the sort in one launch (the decode plan's MoeRoute and MoeFfn: one launch less): the sort's
// grid; thread block 0 routes every token (warp w the tokens w, w + 32, … : routeToken, minfer_moe_route's
// computation), then after a barrier sorts the slots (sortSlots, reading the ids it wrote); with MOE_X_Q8 the
// other thread blocks quantize x (quantizeX). ids, w and the scratch's sort and Xq regions are minfer_moe_route's
// and minfer_moe_sort's bit for bit.
extern "C" __global__ void __launch_bounds__(minfer::kern::kMoeSortThreads)
    minfer_moe_route_sort(const float* logits, int* ids, float* w, const float* x, float* scratch, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  using namespace minfer::kern::moe;
  if (!sortGridSorts(x, scratch, n_tokens)) return;
  for (unsigned t = threadIdx.x / 32; t < static_cast<unsigned>(n_tokens); t += kMoeSortThreads / 32)
    routeToken(logits, ids, w, t, threadIdx.x % 32);
  __syncthreads();  // the ids (global memory, written by this thread block) are visible to all its threads
  sortSlots(ids, scratch, n_tokens);
}
#endif  // MOE_ROUTE_SORT

#if defined(MOE_ROUTER_SORT)
#ifndef MOE_R_HAS_BIAS
#define MOE_R_HAS_BIAS 0
#endif
#ifndef MOE_SORT_SLOTS
#define MOE_SORT_SLOTS 1
#endif
// The decode plan's router MatMul (a dense plane: MOE_R_PLANE 4 kF32, 5 kF16, 6 kBF16, MOE_R_PITCH its row pitch,
// MOE_R_HAS_BIAS), MoeRoute and the MoeFfn's sort in one launch, for one token (grid: moeRouterSortLaunchRule,
// kMoeRouterThreads threads per block: sortSlots and quantizeX take any block size). Its grid, counter and sort
// are one token's by construction, so n_tokens (the plan's token count) ≠ 1 traps: the codegen emits it in the
// decode plan only (ops/moe.cpp routerSortLaunch), which the runtime runs on one token.
// thread blocks [0, R) compute the NEXP logits, one warp per row (dense_gemv's dense::gemvRow, then the bias: its
// values bit for bit), and count themselves done in counters[0] (a block barrier, then one acquire-release
// atomic, as minfer_moe_down_combine); the last of them routes (routeToken, logits read through L2) and, with
// MOE_SORT_SLOTS, sorts (sortSlots), then sets the counter back to 0. With MOE_X_Q8 the thread blocks after R quantize
// x (quantizeX). Each router block first asks for its rows to be moved to L2 (before the wait: a weight plane).
extern "C" __global__ void __launch_bounds__(minfer::kern::kMoeRouterThreads)
    minfer_moe_router_sort(const uint8_t* rw, const float* rbias, const float* x, float* logits, int* ids, float* w,
                           float* scratch, unsigned* counters, int n_tokens) {
  using namespace minfer::kern;
  using namespace minfer::kern::moe;
  constexpr unsigned kRouterBlocks = moeRouterBlocks(kNexp), kRowsPerBlock = kMoeRouterThreads / 32;
  // While the previous kernel still runs, this block's router rows (a weight plane) start moving to L2.
  if (threadIdx.x == 0 && blockIdx.x < kRouterBlocks) {
    const unsigned first = blockIdx.x * kRowsPerBlock;
    prefetchL2(rw + static_cast<unsigned long long>(first) * MOE_R_PITCH, min(kRowsPerBlock, kNexp - first) * MOE_R_PITCH);
  }
  overlapPrologue();
  if (n_tokens != 1) __trap();  // one token's logits, ids, weights and sort (the decode plan only)
#if MOE_X_Q8
  if (blockIdx.x >= kRouterBlocks) {
    quantizeX<kMoeRouterThreads>(x, scratch, 1, blockIdx.x - kRouterBlocks);
    return;
  }
#endif
  const unsigned lane = threadIdx.x % 32;
  const int row = static_cast<int>(blockIdx.x * kRowsPerBlock + threadIdx.x / 32);
  if (row < static_cast<int>(kNexp)) {
    float acc = dense::gemvRow<MOE_R_PLANE, static_cast<int>(kE), MOE_R_PITCH>(rw, x, row, static_cast<int>(lane));
    if (lane == 0) {
#if MOE_R_HAS_BIAS
      acc += rbias[row];
#else
      (void)rbias;
#endif
      logits[row] = acc;
    }
  }
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counters) : "memory");
    last = before == kRouterBlocks - 1;
    if (last) counters[0] = 0;  // every router block has arrived
  }
  __syncthreads();
  if (!last) return;
  if (threadIdx.x < 32) routeToken<true>(logits, ids, w, 0, lane);
#if MOE_SORT_SLOTS
  __syncthreads();  // the ids (global memory, written by this thread block) are visible to all its threads
  sortSlots(ids, scratch, 1);
#endif
}
#endif  // MOE_ROUTER_SORT

#if defined(MOE_GATE_UP) || defined(MOE_DOWN) || defined(MOE_GATE_UP_DEC) || defined(MOE_DOWN_DEC)
namespace minfer::kern::moe {
// Dot products of row r of expert e of W (and of V when kTwo) with the input rows of up to kMoeGroup
// slots: lane l sums columns l, l + 32, … in order, then a warp sum.
template <unsigned kCols, bool kTwo, class W, class V>
__device__ __forceinline__ void groupDots(const W& wa, const V& wb, unsigned e, unsigned r, const float* const* in,
                                          unsigned n, float* da, float* db) {
  const unsigned lane = threadIdx.x % 32;
  const auto ra = wa.row(e, r);
  const auto rb = wb.row(e, r);
  float acc_a[kMoeGroup], acc_b[kMoeGroup];
#pragma unroll
  for (unsigned i = 0; i < kMoeGroup; ++i) acc_a[i] = acc_b[i] = 0.0f;
  if constexpr (kCols % 4 == 0 && W::kVec4 && V::kVec4) {
    // Lane l takes columns 4l .. 4l + 3, then 128 further: 4-byte i8 or 16-byte f32 weight loads and
    // 16-byte activation loads (rows of a multiple of 4 floats start 16-byte aligned).
    for (unsigned c = 4 * lane; c < kCols; c += 128) {
      float a[4], b[4] = {0, 0, 0, 0};
      wa.at4(ra, c, a);
      if (kTwo) wb.at4(rb, c, b);
#pragma unroll
      for (unsigned i = 0; i < kMoeGroup; ++i)
        if (i < n) {
          const float4 x = *reinterpret_cast<const float4*>(in[i] + c);
          acc_a[i] += a[0] * x.x;
          acc_a[i] += a[1] * x.y;
          acc_a[i] += a[2] * x.z;
          acc_a[i] += a[3] * x.w;
          if (kTwo) {
            acc_b[i] += b[0] * x.x;
            acc_b[i] += b[1] * x.y;
            acc_b[i] += b[2] * x.z;
            acc_b[i] += b[3] * x.w;
          }
        }
    }
  } else {
    for (unsigned c = lane; c < kCols; c += 32) {
      const float a = wa.at(ra, c);
      const float b = kTwo ? wb.at(rb, c) : 0.0f;
#pragma unroll
      for (unsigned i = 0; i < kMoeGroup; ++i)
        if (i < n) {
          const float x = in[i][c];
          acc_a[i] += a * x;
          if (kTwo) acc_b[i] += b * x;
        }
    }
  }
#pragma unroll
  for (unsigned i = 0; i < kMoeGroup; ++i) {
    da[i] = warpSum(acc_a[i]);
    db[i] = kTwo ? warpSum(acc_b[i]) : 0.0f;
  }
}

// kBlocks weights: the dot products of kR rows (wr[i]: the row's first block; all of one type, blocks
// kGP bytes apart, kBpr per row) with the q8 inputs of n ≤ kMoeGroup slots (xq[i], xm[i]: the slot's row
// of a q8 buffer), on kL = moeBlocksLanes lanes per row: lane u of the row's lanes takes part u % 4 of
// blocks u / 4, u / 4 + kL / 4, … (gemv_blocks.cuh's split), every row's parts loaded before the slots'
// activations (each loaded once for the kR rows). Afterwards every lane of the kL holds the sums.
template <bool kQ4K, int kR, unsigned kBpr, unsigned kL, unsigned long long kGP>
__device__ __forceinline__ void blockDots(const uint8_t* const (&wr)[kR], const int8_t* const (&xq)[kMoeGroup],
                                          const Q8Meta* const (&xm)[kMoeGroup], unsigned n,
                                          float (&acc)[kR][kMoeGroup]) {
  static_assert(kGP % 16 == 0 && kGP >= (kQ4K ? 144 : 210), "blocks start 16-byte aligned, kGP ≥ the block");
  const unsigned u = threadIdx.x % kL;
  const int p = static_cast<int>(u % 4);
#pragma unroll
  for (int i = 0; i < kR; ++i)
#pragma unroll
    for (unsigned s = 0; s < kMoeGroup; ++s) acc[i][s] = 0.0f;
  for (unsigned b = u / 4; b < kBpr; b += kL / 4) {
    gemvb::Part part[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) part[i] = gemvb::load<kQ4K>(wr[i] + b * kGP, p);
#pragma unroll
    for (unsigned s = 0; s < kMoeGroup; ++s)
      if (s < n) {
        const gemvb::Act a = gemvb::loadAct<kQ4K>(xq[s] + 256 * b, xm[s] + 8 * b, p);
#pragma unroll
        for (int i = 0; i < kR; ++i) acc[i][s] += gemvb::partDot<kQ4K>(part[i], a, p);
      }
  }
#pragma unroll
  for (int i = 0; i < kR; ++i)
#pragma unroll
    for (unsigned s = 0; s < kMoeGroup; ++s)
#pragma unroll
      for (unsigned o = kL / 2; o > 0; o >>= 1) acc[i][s] += __shfl_xor_sync(0xffffffffu, acc[i][s], o);
}

// A kBlocks expert weight: its type and pitches (MOE_X_TYPE, _GP, _PITCH, _EPITCH).
template <int kType, unsigned long long kGP, unsigned long long kPitch, unsigned long long kEPitch>
struct BlocksWeight {
  static_assert(kType == 12 || kType == 14, "kBlocks expert weights are Q4_K (12) or Q6_K (14)");
  static_assert(kPitch % 16 == 0 && kEPitch % 16 == 0, "kBlocks rows start 16-byte aligned");
  static constexpr bool kQ4K = kType == 12;
  static constexpr unsigned long long kGroupPitch = kGP;
  __device__ static const uint8_t* row(const uint8_t* w, unsigned e, unsigned r) { return w + e * kEPitch + r * kPitch; }
};

// The slots of one group (list[g] … list[g + n − 1]) and their rows of a q8 buffer of kWidth values per row
// (q0, m0: its values and meta): row slot / kK (x: kTokenRows) or row slot (A).
template <unsigned kWidth, bool kTokenRows>
struct Q8Rows {
  int slot[kMoeGroup];
  const int8_t* q[kMoeGroup];
  const Q8Meta* m[kMoeGroup];
  __device__ __forceinline__ Q8Rows(const int* list, int g, unsigned n, const int8_t* q0, const Q8Meta* m0) {
#pragma unroll
    for (unsigned i = 0; i < kMoeGroup; ++i) {
      slot[i] = i < n ? list[g + i] : 0;
      const unsigned long long row = kTokenRows ? static_cast<unsigned>(slot[i]) / kK : static_cast<unsigned>(slot[i]);
      q[i] = q0 + row * kWidth;
      m[i] = m0 + row * (kWidth / 32);
    }
  }
};
}  // namespace minfer::kern::moe
#endif

#if defined(MOE_GATE_UP)
#ifndef MOE_A_Q8
#define MOE_A_Q8 0
#endif
static_assert(!MOE_A_Q8 || MOE_F % 256 == 0, "A is quantized for a kBlocks down weight: F is a multiple of 256");
namespace minfer::kern::moe {
// The thread block's shared kMoeGroup × kRows floats of A for quantizeStaged with MOE_A_Q8, else null.
template <unsigned kRows>
__device__ __forceinline__ float* stagingRows() {
#if MOE_A_Q8
  __shared__ float staged[kMoeGroup * kRows];
  return staged;
#else
  return nullptr;
#endif
}
// With MOE_A_Q8: the q8 form of the A rows r0 … r0 + kRows − 1 (kRows a multiple of 32) of the group's n
// slots (slots[0 .. n)), whose values the thread block staged in shared memory (staged[i·kRows + r − r0]):
// one warp per block of 32 rows of one slot, after a barrier; a second barrier frees `staged` for the next
// group. Every thread of the block calls it.
template <unsigned kRows>
__device__ __forceinline__ void quantizeStaged(const float* staged, unsigned n, const int* slots, unsigned r0,
                                               float* scratch) {
  static_assert(kRows % 32 == 0, "whole blocks of 32 rows");
  __syncthreads();
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (unsigned job = warp; job < n * (kRows / 32); job += kMoeWarps) {  // (slot i, rows 32·j …): one warp
    const unsigned i = job / (kRows / 32), j = job % (kRows / 32), rb = r0 + 32 * j;
    if (rb >= kF) continue;  // kF % 32 == 0: a block of 32 rows is whole or past the end
    const float v[1] = {staged[i * kRows + 32 * j + lane]};
    const unsigned long long s = static_cast<unsigned>(slots[i]);
    quantizeBlock<1>(v, aqOf(scratch) + s * kF + rb, ametaOf(scratch) + s * (kF / 32) + rb / 32, true);
  }
  __syncthreads();
}
// A[s][r] = silu(g)·u of the group's n slots from their gate and up sums (one lane per row calls it),
// also into staged (kMoeGroup × kRows floats; rl = r − r0) when that is not null (MOE_A_Q8).
template <unsigned kRows>
__device__ __forceinline__ void writeA(const float (&dg)[kMoeGroup], const float (&du)[kMoeGroup], unsigned n,
                                       const int (&slot)[kMoeGroup], unsigned r, unsigned rl, float* a_out,
                                       float* staged) {
#pragma unroll
  for (unsigned i = 0; i < kMoeGroup; ++i)
    if (i < n) {
      const float a = dg[i] / (1.0f + expf(-dg[i])) * du[i];
      a_out[static_cast<unsigned long long>(slot[i]) * kF + r] = a;
      if (staged) staged[i * kRows + rl] = a;
    }
}
}  // namespace minfer::kern::moe
#endif

#if defined(MOE_GATE_UP) && MOE_G_PLANE == 7
static_assert(MOE_U_PLANE == 7, "gate and up are read from the same plane set");
static_assert(MOE_E % 256 == 0, "kBlocks rows are whole 256-weight blocks");
namespace minfer::kern::moe {
using GateW = BlocksWeight<MOE_G_TYPE, MOE_G_GP, MOE_G_PITCH, MOE_G_EPITCH>;
using UpW = BlocksWeight<MOE_U_TYPE, MOE_U_GP, MOE_U_PITCH, MOE_U_EPITCH>;
constexpr unsigned kL = moeBlocksLanes(kE), kPassRows = kMoeWarps * 32 / kL;
constexpr unsigned kCtaRows = moeBlocksRows(kE, MOE_A_Q8), kPasses = kCtaRows / kPassRows;
}  // namespace minfer::kern::moe
// Thread block (x, y): rows kCtaRows·x … of chosen expert y, in kPasses passes of kPassRows rows (lanes
// kL·j … of warp w: row w·32/kL + j of the pass). With MOE_A_Q8 the block's A values of each slot group
// are staged in shared memory and quantized in blocks of 32 rows (one warp each) after a barrier.
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kMoeWarps)
    minfer_moe_gate_up(const float* x, const uint8_t* gq, const uint8_t* gs, const uint8_t* gm, const uint8_t* uq,
                       const uint8_t* us, const uint8_t* um, float* scratch) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  using namespace minfer::kern::moe;
  (void)x, (void)gs, (void)gm, (void)us, (void)um;
  const int ex = blockExpert(scratch);
  if (ex < 0) return;
  const unsigned e = static_cast<unsigned>(ex), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned r0 = blockIdx.x * kCtaRows;
  if (threadIdx.x == 0) {  // the block's gate and up rows (consecutive) start moving to L2 for the passes
    const unsigned rows = min(kCtaRows, kF - r0);
    prefetchL2(GateW::row(gq, e, r0), static_cast<unsigned>(rows * MOE_G_PITCH));
    prefetchL2(UpW::row(uq, e, r0), static_cast<unsigned>(rows * MOE_U_PITCH));
  }
  const int begin = offsets(scratch)[e], end = offsets(scratch)[e + 1];
  const int* list = slotList(scratch);
  float* a_out = regionA(scratch);
  const int8_t* xq0 = xqOf(scratch);
  const Q8Meta* xm0 = xmetaOf(scratch);
  float* const staged = stagingRows<kCtaRows>();
  for (int g = begin; g < end; g += kMoeGroup) {
    const unsigned n = min(static_cast<unsigned>(end - g), kMoeGroup);
    const Q8Rows<kE, true> in(list, g, n, xq0, xm0);
    const int(&slot)[kMoeGroup] = in.slot;
#pragma unroll
    for (unsigned pass = 0; pass < kPasses; ++pass) {
      const unsigned rl = pass * kPassRows + warp * (32 / kL) + lane / kL, r = r0 + rl;  // rl: row in the block
      const unsigned rr = r < kF ? r : kF - 1;  // rows past the end read the last row (not written)
      float dg[1][kMoeGroup], du[1][kMoeGroup];
      if constexpr (MOE_G_TYPE == MOE_U_TYPE && MOE_G_GP == MOE_U_GP) {  // one pass over both rows' blocks
        const uint8_t* wr[2] = {GateW::row(gq, e, rr), UpW::row(uq, e, rr)};
        float acc[2][kMoeGroup];
        blockDots<GateW::kQ4K, 2, kE / 256, kL, GateW::kGroupPitch>(wr, in.q, in.m, n, acc);
#pragma unroll
        for (unsigned i = 0; i < kMoeGroup; ++i) dg[0][i] = acc[0][i], du[0][i] = acc[1][i];
      } else {
        const uint8_t* wg[1] = {GateW::row(gq, e, rr)};
        const uint8_t* wu[1] = {UpW::row(uq, e, rr)};
        blockDots<GateW::kQ4K, 1, kE / 256, kL, GateW::kGroupPitch>(wg, in.q, in.m, n, dg);
        blockDots<UpW::kQ4K, 1, kE / 256, kL, UpW::kGroupPitch>(wu, in.q, in.m, n, du);
      }
      if (lane % kL == 0 && r < kF) writeA<kCtaRows>(dg[0], du[0], n, slot, r, rl, a_out, staged);
    }
#if MOE_A_Q8
    quantizeStaged<kCtaRows>(staged, n, list + g, r0, scratch);
#endif
  }
}
#elif defined(MOE_GATE_UP)
namespace minfer::kern::moe {
constexpr unsigned kCtaRows = moeGateUpRows(false, kE, MOE_A_Q8);  // rows per thread block: kCtaRows / 8 passes
}
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kMoeWarps)
    minfer_moe_gate_up(const float* x, const uint8_t* gq, const uint8_t* gs, const uint8_t* gm, const uint8_t* uq,
                       const uint8_t* us, const uint8_t* um, float* scratch) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  using namespace minfer::kern::moe;
  const ExpertWeight<MOE_G_PLANE, MOE_G_PITCH, MOE_G_EPITCH, MOE_G_S_PITCH, MOE_G_S_EPITCH, MOE_G_M_PITCH,
                     MOE_G_M_EPITCH, MOE_G_GS>
      gate{gq, gs, gm};
  const ExpertWeight<MOE_U_PLANE, MOE_U_PITCH, MOE_U_EPITCH, MOE_U_S_PITCH, MOE_U_S_EPITCH, MOE_U_M_PITCH,
                     MOE_U_M_EPITCH, MOE_U_GS>
      up{uq, us, um};
  const int ex = blockExpert(scratch);
  if (ex < 0) return;
  const unsigned e = static_cast<unsigned>(ex), r0 = blockIdx.x * kCtaRows;
  const int begin = offsets(scratch)[e], end = offsets(scratch)[e + 1];
  const int* list = slotList(scratch);
  float* a_out = regionA(scratch);
  float* const staged = stagingRows<kCtaRows>();
  for (int g = begin; g < end; g += kMoeGroup) {
    const unsigned n = min(static_cast<unsigned>(end - g), kMoeGroup);
    const float* in[kMoeGroup];
    int slot[kMoeGroup];
#pragma unroll
    for (unsigned i = 0; i < kMoeGroup; ++i) {
      slot[i] = i < n ? list[g + i] : 0;
      in[i] = x + static_cast<unsigned long long>(slot[i] / kK) * kE;
    }
    for (unsigned rl = threadIdx.x / 32; rl < kCtaRows; rl += kMoeWarps) {  // one warp per row
      const unsigned r = r0 + rl;
      if (r >= kF) break;
      float dg[kMoeGroup], du[kMoeGroup];
      groupDots<kE, true>(gate, up, e, r, in, n, dg, du);
      if (threadIdx.x % 32 == 0) writeA<kCtaRows>(dg, du, n, slot, r, rl, a_out, staged);
    }
#if MOE_A_Q8
    quantizeStaged<kCtaRows>(staged, n, list + g, r0, scratch);
#endif
  }
}
#endif  // MOE_GATE_UP

#if defined(MOE_DOWN) && MOE_D_PLANE == 7
static_assert(MOE_F % 256 == 0, "kBlocks rows are whole 256-weight blocks");
namespace minfer::kern::moe {
using DownW = BlocksWeight<MOE_D_TYPE, MOE_D_GP, MOE_D_PITCH, MOE_D_EPITCH>;
constexpr unsigned kL = moeBlocksLanes(kF), kCtaRows = moeBlocksRows(kF, false);
}  // namespace minfer::kern::moe
namespace minfer::kern::moe {
constexpr unsigned kDownCtaRows = kCtaRows;
// Thread block (x, y): rows kCtaRows·x … of chosen expert y (lanes kL·j … of warp w: row w·32/kL + j),
// against the q8 rows of A that gate_up wrote (MOE_A_Q8).
__device__ __forceinline__ void downBlock(const uint8_t* dq, const uint8_t* ds, const uint8_t* dm, float* scratch) {
  overlapPrologue();
  (void)ds, (void)dm;
  const int ex = blockExpert(scratch);
  if (ex < 0) return;
  const unsigned e = static_cast<unsigned>(ex), lane = threadIdx.x % 32;
  const unsigned r = blockIdx.x * kCtaRows + threadIdx.x / 32 * (32 / kL) + lane / kL;
  const unsigned rr = r < kE ? r : kE - 1;  // rows past the end read the last row (not written)
  if (threadIdx.x == 0)  // the block's rows (consecutive) start moving to L2
    prefetchL2(DownW::row(dq, e, blockIdx.x * kCtaRows),
               static_cast<unsigned>(min(kCtaRows, kE - blockIdx.x * kCtaRows) * MOE_D_PITCH));
  const int begin = offsets(scratch)[e], end = offsets(scratch)[e + 1];
  const int* list = slotList(scratch);
  const int8_t* aq0 = aqOf(scratch);
  const Q8Meta* am0 = ametaOf(scratch);
  float* y_out = regionY(scratch);
  const uint8_t* wr[1] = {DownW::row(dq, e, rr)};
  for (int g = begin; g < end; g += kMoeGroup) {
    const unsigned n = min(static_cast<unsigned>(end - g), kMoeGroup);
    const Q8Rows<kF, false> in(list, g, n, aq0, am0);
    const int(&slot)[kMoeGroup] = in.slot;
    float dd[1][kMoeGroup];
    blockDots<DownW::kQ4K, 1, kF / 256, kL, DownW::kGroupPitch>(wr, in.q, in.m, n, dd);
    if (lane % kL == 0 && r < kE)
#pragma unroll
      for (unsigned i = 0; i < kMoeGroup; ++i)
        if (i < n) y_out[static_cast<unsigned long long>(slot[i]) * kE + r] = dd[0][i];
  }
}
}  // namespace minfer::kern::moe
#elif defined(MOE_DOWN)
namespace minfer::kern::moe {
constexpr unsigned kDownCtaRows = kMoeWarps;  // one warp per row
// Thread block (x, y): rows kMoeWarps·x … of chosen expert y, one warp each.
__device__ __forceinline__ void downBlock(const uint8_t* dq, const uint8_t* ds, const uint8_t* dm, float* scratch) {
  overlapPrologue();
  const ExpertWeight<MOE_D_PLANE, MOE_D_PITCH, MOE_D_EPITCH, MOE_D_S_PITCH, MOE_D_S_EPITCH, MOE_D_M_PITCH,
                     MOE_D_M_EPITCH, MOE_D_GS>
      down{dq, ds, dm};
  const int ex = blockExpert(scratch);
  const unsigned e = static_cast<unsigned>(ex), r = blockIdx.x * kMoeWarps + threadIdx.x / 32;
  if (ex < 0 || r >= kE) return;
  const int begin = offsets(scratch)[e], end = offsets(scratch)[e + 1];
  const int* list = slotList(scratch);
  const float* a_in = regionA(scratch);
  float* y_out = regionY(scratch);
  for (int g = begin; g < end; g += kMoeGroup) {
    const unsigned n = min(static_cast<unsigned>(end - g), kMoeGroup);
    const float* in[kMoeGroup];
    int slot[kMoeGroup];
#pragma unroll
    for (unsigned i = 0; i < kMoeGroup; ++i) {
      slot[i] = i < n ? list[g + i] : 0;
      in[i] = a_in + static_cast<unsigned long long>(slot[i]) * kF;
    }
    float dd[kMoeGroup], unused[kMoeGroup];
    groupDots<kF, false>(down, down, e, r, in, n, dd, unused);
    if (threadIdx.x % 32 == 0)
#pragma unroll
      for (unsigned i = 0; i < kMoeGroup; ++i)
        if (i < n) y_out[static_cast<unsigned long long>(slot[i]) * kE + r] = dd[i];
  }
}
}  // namespace minfer::kern::moe
#endif

#if defined(MOE_DOWN) || defined(MOE_COMBINE)
namespace minfer::kern::moe {
// out[t][r] of the combine: Σ_j w[t][j]·Y[t·K + j][r], j = 0..K−1 in order, skipping ids that are not an expert
// (cpu::moeFfn's order); Y read through L2 (__ldcg) when kL2 (another thread block of the same launch wrote it).
template <bool kL2>
__device__ __forceinline__ float combineValue(const int* ids, const float* w, const float* y, unsigned long long t,
                                              unsigned long long r) {
  float acc = 0.0f;
  for (unsigned j = 0; j < kK; ++j) {
    const int e = ids[t * kK + j];
    if (e < 0 || e >= static_cast<int>(kNexp)) continue;
    const float* p = y + (t * kK + j) * kE + r;
    acc += (kL2 ? __ldcg(p) : *p) * w[t * kK + j];
  }
  return acc;
}
}  // namespace minfer::kern::moe
#endif

#if defined(MOE_DOWN) && !MOE_DOWN_COMBINE
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kMoeWarps)
    minfer_moe_down(const uint8_t* dq, const uint8_t* ds, const uint8_t* dm, float* scratch) {
  minfer::kern::moe::downBlock(dq, ds, dm, scratch);
}
#elif defined(MOE_DOWN)
// down, then the combine of the block's rows: the thread blocks of one row tile (blockIdx.x, every y) count
// themselves done in counters[blockIdx.x] (a block barrier, then one acquire-release atomic, as gemv_blocks.cuh's
// minfer_gemv_glu), and the last of them computes out[t][r] for every token t and the tile's rows r exactly as
// minfer_moe_combine does (combineValue), then sets the counter back to 0.
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kMoeWarps)
    minfer_moe_down_combine(const uint8_t* dq, const uint8_t* ds, const uint8_t* dm, float* scratch, const int* ids,
                            const float* w, float* out, unsigned* counters, int n_tokens) {
  using namespace minfer::kern;
  using namespace minfer::kern::moe;
  downBlock(dq, ds, dm, scratch);
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counters + blockIdx.x) : "memory");
    last = before == gridDim.y - 1;
    if (last) counters[blockIdx.x] = 0;  // every block of the tile has arrived: none reads it again
  }
  __syncthreads();
  if (!last) return;
  const unsigned r0 = blockIdx.x * kDownCtaRows;
  const unsigned rows = min(kDownCtaRows, kE - r0);
  const float* y = regionY(scratch);
  for (unsigned i = threadIdx.x; i < static_cast<unsigned>(n_tokens) * rows; i += blockDim.x) {
    const unsigned long long t = i / rows, r = r0 + i % rows;
    out[t * kE + r] = combineValue<true>(ids, w, y, t, r);
  }
}
#endif  // MOE_DOWN

#if defined(MOE_COMBINE)
extern "C" __global__ void __launch_bounds__(minfer::kern::kMoeCombineThreads)
    minfer_moe_combine(const int* ids, const float* w, const float* scratch, float* out, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern::moe;
  const unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<unsigned long long>(n_tokens) * kE) return;
  const unsigned long long t = i / kE, r = i % kE;
  out[i] = combineValue<false>(ids, w, regionY(const_cast<float*>(scratch)), t, r);
}
#endif  // MOE_COMBINE

#if defined(MOE_GATE_UP_DEC) || defined(MOE_DOWN_DEC)
static_assert(MOE_E % 256 == 0 && MOE_F % 256 == 0, "the decode expert GEMVs read whole 256-weight blocks");
namespace minfer::kern::moe {
using DecDownW = BlocksWeight<MOE_D_TYPE, MOE_D_GP, MOE_D_PITCH, MOE_D_EPITCH>;
// Token 0's chosen expert j (ids[j]) where it is an expert, else −1 (its slot is skipped, as cpu::moeFfn does).
__device__ __forceinline__ int decExpert(const int* ids, unsigned j) {
  const int e = ids[j];
  return e >= 0 && e < static_cast<int>(kNexp) ? e : -1;
}
}  // namespace minfer::kern::moe
#endif

#if defined(MOE_GATE_UP_DEC)
namespace minfer::kern::moe {
using DecGateW = BlocksWeight<MOE_G_TYPE, MOE_G_GP, MOE_G_PITCH, MOE_G_EPITCH>;
using DecUpW = BlocksWeight<MOE_U_TYPE, MOE_U_GP, MOE_U_PITCH, MOE_U_EPITCH>;
constexpr int kDecRowWarps = static_cast<int>(moeDecRowWarps(kE));
constexpr unsigned kDecOutputs = moeGateUpDecOutputs(kE);  // outputs per thread block
static_assert((kK * kF) % 32 == 0 && 32 % kDecOutputs == 0, "a q8 block of A spans whole thread blocks");
}  // namespace minfer::kern::moe
// The decode plan's gate|up of the chosen experts (one token): output o = j·F + r of the K·F is
// A[j][r] = silu(gate_e(r)·x) · (up_e(r)·x) with e = ids[j] (writeA's expression), the two rows summed on x's q8
// row (the scratch's Xq, written by the sort launch) as minfer_gemv_glu sums them (gemvb::accumulateRows,
// kDecRowWarps warps per kMoeGateUpDecGroupOutputs consecutive outputs of one expert); the q8 form of A (the
// scratch's Aq, row j) as minfer_gemv_glu makes it: the thread block completing a block of 32 outputs
// (counters[o / 32]) quantizes it and sets its counter back to 0.
// Each thread block then starts moving its share of expert e's down rows to L2 for the next launch.
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kGemvBlocksWarps)
    minfer_moe_gate_up_dec(const int* __restrict__ ids, const uint8_t* __restrict__ gq, const uint8_t* __restrict__ uq,
                           const uint8_t* __restrict__ dq, float* __restrict__ scratch,
                           unsigned* __restrict__ counters) {
  using namespace minfer::kern;
  using namespace minfer::kern::moe;
  constexpr unsigned kPer = kMoeGateUpDecGroupOutputs;
  static_assert(kF % kPer == 0, "a warp group's outputs are rows of one expert");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned first = blockIdx.x * kDecOutputs, o = first + warp / kDecRowWarps * kPer, j = o / kF, r = o % kF;
  overlapPrologue();
  const int e = decExpert(ids, j);
  const unsigned ee = e < 0 ? 0u : static_cast<unsigned>(e);
  const int8_t* xq = xqOf(scratch);
  const Q8Meta* xm = xmetaOf(scratch);
  const int t = (warp % kDecRowWarps) * 32 + lane;  // this lane's index in its output's lanes
  float acc[2 * kPer] = {};  // gate, up of output o, then of o + 1, …
  if constexpr (MOE_G_TYPE == MOE_U_TYPE && MOE_G_GP == MOE_U_GP) {  // one pass over all the rows' blocks
    const uint8_t* wr[2 * kPer];
#pragma unroll
    for (unsigned i = 0; i < kPer; ++i) {
      wr[2 * i] = DecGateW::row(gq, ee, r + i);
      wr[2 * i + 1] = DecUpW::row(uq, ee, r + i);
    }
    gemvb::accumulateRows<DecGateW::kQ4K, 2 * kPer, kDecRowWarps, 1, kE / 256, MOE_G_GP>(wr, xq, xm, t % 4, t / 4, acc);
  } else {
    const uint8_t *wg[kPer], *wu[kPer];
#pragma unroll
    for (unsigned i = 0; i < kPer; ++i) {
      wg[i] = DecGateW::row(gq, ee, r + i);
      wu[i] = DecUpW::row(uq, ee, r + i);
    }
    float ag[kPer] = {}, au[kPer] = {};
    gemvb::accumulateRows<DecGateW::kQ4K, kPer, kDecRowWarps, 1, kE / 256, MOE_G_GP>(wg, xq, xm, t % 4, t / 4, ag);
    gemvb::accumulateRows<DecUpW::kQ4K, kPer, kDecRowWarps, 1, kE / 256, MOE_U_GP>(wu, xq, xm, t % 4, t / 4, au);
#pragma unroll
    for (unsigned i = 0; i < kPer; ++i) {
      acc[2 * i] = ag[i];
      acc[2 * i + 1] = au[i];
    }
  }
  // Once this block's own weight rows have arrived (so that they go first), its share of the expert's E down rows
  // (kF / kDecOutputs shares) starts moving to L2 for minfer_moe_down_dec (measured: 452 t/s against 434 with the
  // prefetch before the dot products and 446 without it; BENCHMARKS.md).
  if (threadIdx.x == 0 && e >= 0) {
    constexpr unsigned long long kBytes = static_cast<unsigned long long>(kE) * MOE_D_PITCH;
    constexpr unsigned long long kShare = (kBytes / (kF / kDecOutputs) + 15) / 16 * 16;
    const unsigned long long off = (first % kF) / kDecOutputs * kShare;
    if (off < kBytes) prefetchL2(DecDownW::row(dq, ee, 0) + off, static_cast<unsigned>(min(kShare, kBytes - off)));
  }
  float* a = regionA(scratch);
  if (gemvb::groupSum<2 * kPer, kDecRowWarps>(acc) && lane < static_cast<int>(kPer))
#pragma unroll
    for (unsigned i = 0; i < kPer; ++i)
      if (lane == static_cast<int>(i))  // row j of A: o + i = j·F + r + i
        a[o + i] = e < 0 ? 0.0f : acc[2 * i] / (1.0f + expf(-acc[2 * i])) * acc[2 * i + 1];
  // Count this block in its block of 32 outputs (minfer_gemv_glu's pattern); the block completing it quantizes.
  __shared__ bool completes;
  const unsigned blk = first / 32;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counters + blk) : "memory");
    completes = before == 32 / kDecOutputs - 1;
  }
  __syncthreads();
  if (!completes || warp != 0) return;
  const float v[1] = {__ldcg(a + 32 * blk + lane)};
  quantizeBlock<1>(v, aqOf(scratch) + 32 * blk, ametaOf(scratch) + blk, true);
  if (lane == 0) counters[blk] = 0;
}
#endif  // MOE_GATE_UP_DEC

#if defined(MOE_DOWN_DEC)
namespace minfer::kern::moe {
constexpr unsigned kDecBlocks = kF / 256;             // blocks per down row
constexpr unsigned kDecParts = kK * kDecBlocks * 4;   // (expert j, block b, part p) of one output row
constexpr unsigned kDecSteps = (kDecParts + 31) / 32;  // parts per lane
static_assert(kK <= 32, "lane j < K holds choice j's id and weight");
}  // namespace minfer::kern::moe
// The decode plan's down and combine of the chosen experts (one token): out[r] = Σ_j w[j] · down_e(r)·A[j] with
// e = ids[j], A[j] the q8 row j of the scratch's Aq (minfer_moe_gate_up_dec). A warp computes kMoeDownDecRows
// consecutive rows: lane l takes the parts l, l + 32, … of the row's K·F/256·4 (expert j, block b, part p)
// (gemvb's four lanes per block; lane j < K loads id j and weight j, the others take them by shuffles), issues
// all its weight loads, then its activation loads, adds w[j]·partDot for every row and part, then a warp sum. So
// the combine's sum runs in another order than minfer_moe_combine's (Σ_j w[j]·Y[j][r]): equal up to f32 rounding.
// With MOE_ADD_NORM = 1 it also does the residual Add after the MoeFfn step and the RmsNorm and QuantizeAct of the
// sum, the norm deferred to the GEMVs that read its q8 form, as gemv_blocks.cuh's minfer_gemv_add_norm does after
// a GEMV: sum[r] = res[r] + out[r], and per q8 block of 32 rows (4 thread blocks, counted in counters[b]) the q8
// form of u = sum ⊙ nw and partial[b] = Σ sum² (gemvb::addNormComplete).
#ifndef MOE_ADD_NORM
#define MOE_ADD_NORM 0
#endif
#if MOE_ADD_NORM
#define MINFER_MOE_ADD_NORM_PARAMS                                                                              \
  , const float *res, float *sum, const float *__restrict__ nw, int8_t *__restrict__ qs,                        \
      minfer::kern::Q8Meta *__restrict__ meta, float *__restrict__ partial, unsigned *__restrict__ counters
#else
#define MINFER_MOE_ADD_NORM_PARAMS
#endif
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kGemvBlocksWarps)
    minfer_moe_down_dec(const int* __restrict__ ids, const float* __restrict__ w, const uint8_t* __restrict__ dq,
                        float* __restrict__ scratch, float* __restrict__ out MINFER_MOE_ADD_NORM_PARAMS) {
  using namespace minfer::kern;
  using namespace minfer::kern::moe;
  const unsigned lane = threadIdx.x % 32;
  const unsigned r0 = (blockIdx.x * kGemvBlocksWarps + threadIdx.x / 32) * kMoeDownDecRows;
  const int p = static_cast<int>(lane % 4);
  overlapPrologue();
  const int my_e = lane < kK ? decExpert(ids, lane) : -1;
  const float my_w = lane < kK ? w[lane] : 0.0f;
  const int8_t* aq = aqOf(scratch);
  const Q8Meta* am = ametaOf(scratch);
  gemvb::Part part[kDecSteps][kMoeDownDecRows];
  unsigned jb[kDecSteps][2];  // the part's choice j and block b
  float wj[kDecSteps];        // its weight, 0 where the part is past the row's or its choice is not an expert
#pragma unroll
  for (unsigned step = 0; step < kDecSteps; ++step) {
    const unsigned u = 32 * step + lane;  // (j·kDecBlocks + b)·4 + p
    const unsigned j = min(u / (4 * kDecBlocks), kK - 1), b = u / 4 % kDecBlocks;
    const int e = __shfl_sync(0xffffffffu, my_e, static_cast<int>(j));
    const float wt = __shfl_sync(0xffffffffu, my_w, static_cast<int>(j));
    const bool use = u < kDecParts && e >= 0;
    jb[step][0] = j, jb[step][1] = b, wj[step] = use ? wt : 0.0f;
    const unsigned ee = e < 0 ? 0u : static_cast<unsigned>(e);
#pragma unroll
    for (unsigned i = 0; i < kMoeDownDecRows; ++i) {
      const unsigned r = min(r0 + i, kE - 1);  // rows past the end read the last row (not written)
      part[step][i] = gemvb::load<DecDownW::kQ4K>(DecDownW::row(dq, ee, r) + b * MOE_D_GP, p);
    }
  }
  float acc[kMoeDownDecRows] = {};
#pragma unroll
  for (unsigned step = 0; step < kDecSteps; ++step) {
    const unsigned j = jb[step][0], b = jb[step][1];
    const gemvb::Act x = gemvb::loadAct<DecDownW::kQ4K>(aq + j * kF + 256 * b, am + j * (kF / 32) + 8 * b, p);
    if (wj[step] != 0.0f)  // a part without a weight adds nothing (and its bytes may be another expert's)
#pragma unroll
      for (unsigned i = 0; i < kMoeDownDecRows; ++i)
        acc[i] = fmaf(wj[step], gemvb::partDot<DecDownW::kQ4K>(part[step][i], x, p), acc[i]);
  }
#pragma unroll
  for (unsigned i = 0; i < kMoeDownDecRows; ++i) {
    const float s = warpSum(acc[i]);
    if (lane == 0 && r0 + i < kE) {
      out[r0 + i] = s;
#if MOE_ADD_NORM
      sum[r0 + i] = res[r0 + i] + s;
#endif
    }
  }
#if MOE_ADD_NORM
  constexpr int kRowsPerCta = static_cast<int>(kGemvBlocksWarps * kMoeDownDecRows);
  gemvb::addNormComplete<32 / kRowsPerCta>(static_cast<int>(blockIdx.x) * kRowsPerCta / 32, sum, nw, qs, meta,
                                           partial, counters);
#endif
}
#endif  // MOE_DOWN_DEC

#endif  // MINFER_DEVICE_CODE && MOE_NEXP
