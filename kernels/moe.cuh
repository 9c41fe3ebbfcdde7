// Mixture of experts (OpKind MoeRoute, MoeFfn; qwen3moe): the softmax router's top-k, and the expert FFN
// computed per expert over the token slots routed to it (a grouped matrix-vector product over the slots
// sorted by expert: each expert's weight rows are read once per group of kMoeGroup slots, and an
// expert no slot chose is not read at all, so decode reads only the selected experts' rows).
// The f32 references are cpu::moeRoute and cpu::moeFfn (runtime/cpu/cpu_ops.h); the formulas are
// llama.cpp's build_moe_ffn with softmax gating and SiLU.
//
// One step MoeFfn is four launches sharing the step's scratch (layout: moeScratch* below, in 4-byte words):
//   minfer_moe_sort     slots s = t·K + j (token t, choice j) grouped by expert: counting sort of ids
//                       (one block): offsets[e] .. offsets[e+1] index list[] (slot order within an expert
//                       is not fixed; every slot's result is computed alone, so results do not depend on it)
//   minfer_moe_gate_up  per (expert e, row r of the expert width F), for every slot s of e:
//                       A[s][r] = silu(gate_e(r)·x[t]) · (up_e(r)·x[t])
//   minfer_moe_down     per (expert e, row r of n_embd E), for every slot s of e: Y[s][r] = down_e(r)·A[s]
//   minfer_moe_combine  out[t][r] = Σ_j w[t][j]·Y[t·K + j][r], j = 0..K−1 in order (slots whose id is not
//                       an expert are skipped, as cpu::moeFfn does)
// A weight element (e, r, c) is read through its planes' stride tables with the expert axis
// (kernels/stride_table.h): row bytes at e·EPITCH + r·PITCH of each plane; quantized weights from the
// derived kI8 + kScale [+ kMin] planes as s·q [+ m], float weights from their dense plane. Dot products
// are f32 (activations are not quantized). Where the width is a multiple of 4 and the plane is i8 or f32,
// each lane loads 4 consecutive weights at once (one 4-byte i8 word or one float4) and the matching
// float4 of each slot's input; otherwise one element per lane and load.
//
// Compile-time constants (-D):
//   all:      MOE_NEXP (experts), MOE_K (experts per token), MOE_F (expert width), MOE_E (n_embd),
//             MOE_MAX_BATCH (the plan's max batch: sizes the scratch regions)
//   router:   MOE_ROUTE, MOE_NORM (1: divide the chosen p by their sum)
//   gate_up:  MOE_GATE_UP; per weight X ∈ {G (gate), U (up)}: MOE_X_PLANE (PlaneKind of the plane read
//             first: 0 kI8, 4 kF32, 5 kF16, 6 kBF16), MOE_X_PITCH, MOE_X_EPITCH (its row and expert
//             pitch), MOE_X_S_PITCH, MOE_X_S_EPITCH (scale plane), MOE_X_M_PITCH, MOE_X_M_EPITCH (min
//             plane; 0: none), MOE_X_GS (scale group size)
//   down:     MOE_DOWN; the same constants for X = D
//   sort:     MOE_SORT;  combine: MOE_COMBINE
// Launch ABI (x, out: n_tokens × E f32; ids: n_tokens × K i32; w: n_tokens × K f32; logits n_tokens × NEXP):
//   minfer_moe_route(const float* logits, int* ids, float* w)                 grid n_tokens × 32 threads
//   minfer_moe_sort(const int* ids, float* scratch, int n_tokens)             1 × 1024 threads
//   minfer_moe_gate_up(const float* x, const uint8_t* gq, const uint8_t* gs, const uint8_t* gm,
//                      const uint8_t* uq, const uint8_t* us, const uint8_t* um, float* scratch)
//                                                                              grid (⌈F/8⌉, NEXP) × 256
//   minfer_moe_down(const uint8_t* dq, const uint8_t* ds, const uint8_t* dm, float* scratch)
//                                                                              grid (⌈E/8⌉, NEXP) × 256
//   minfer_moe_combine(const int* ids, const float* w, const float* scratch, float* out, int n_tokens)
//                                                                              grid ⌈n_tokens·E/256⌉ × 256
//   gs/gm/us/um/ds/dm are null for float weights and for absent min planes.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kMoeWarps = 8;      // rows per block of the expert matvec kernels (one warp each)
constexpr unsigned kMoeGroup = 8;      // slots whose dot products share one pass over a weight row
constexpr unsigned kMoeSortThreads = 1024;
constexpr unsigned kMoeCombineThreads = 256;

// Scratch layout of a MoeFfn step, in 4-byte words: offsets (NEXP + 1 ints), cursors (NEXP ints), the
// sorted slot list (max_batch·K ints), A (max_batch·K × F floats), Y (max_batch·K × E floats).
MINFER_HD unsigned long long moeScratchList(unsigned n_exp) { return 2ull * n_exp + 1; }
MINFER_HD unsigned long long moeScratchA(unsigned n_exp, unsigned max_batch, unsigned k) {
  return (moeScratchList(n_exp) + 1ull * max_batch * k + 3) / 4 * 4;  // 16-byte aligned
}
MINFER_HD unsigned long long moeScratchY(unsigned n_exp, unsigned max_batch, unsigned k, unsigned f) {
  return moeScratchA(n_exp, max_batch, k) + 1ull * max_batch * k * f;
}
MINFER_HD unsigned long long moeScratchBytes(unsigned n_exp, unsigned max_batch, unsigned k, unsigned f, unsigned e) {
  return 4ull * (moeScratchY(n_exp, max_batch, k, f) + 1ull * max_batch * k * e);
}

MINFER_HD LaunchRule moeRouteLaunchRule() {
  LaunchRule r;
  r.grid[0] = perToken(1);
  r.block.x = 32;
  return r;
}
MINFER_HD LaunchRule moeSortLaunchRule() {
  LaunchRule r;
  r.block.x = kMoeSortThreads;
  return r;
}
// The expert matvec kernels: `rows` output rows per expert (F for gate_up, E for down).
MINFER_HD LaunchRule moeExpertsLaunchRule(unsigned rows, unsigned n_exp) {
  LaunchRule r;
  r.grid[0] = fixedExtent(ceilDiv(rows, kMoeWarps));
  r.grid[1] = fixedExtent(n_exp);
  r.block.x = 32 * kMoeWarps;
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
__device__ __forceinline__ int* cursors(float* scratch) { return reinterpret_cast<int*>(scratch) + kNexp + 1; }
__device__ __forceinline__ int* slotList(float* scratch) { return reinterpret_cast<int*>(scratch) + moeScratchList(kNexp); }
__device__ __forceinline__ float* regionA(float* scratch) { return scratch + moeScratchA(kNexp, kMaxBatch, kK); }
__device__ __forceinline__ float* regionY(float* scratch) { return scratch + moeScratchY(kNexp, kMaxBatch, kK, kF); }

}  // namespace minfer::kern::moe

#if defined(MOE_ROUTE)
// One warp per token: lane l holds experts l, l + 32, …; softmax as ggml_soft_max (max subtracted, e^x,
// times the reciprocal of the sum), then K rounds of a warp arg-max (larger p, then lower id).
extern "C" __global__ void __launch_bounds__(32) minfer_moe_route(const float* logits, int* ids, float* w) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  using namespace minfer::kern::moe;
  constexpr unsigned kPer = (kNexp + 31) / 32;
  const unsigned t = blockIdx.x, lane = threadIdx.x;
  const float* row = logits + static_cast<unsigned long long>(t) * kNexp;
  float p[kPer];
  float mx = -MINFER_INF;
#pragma unroll
  for (unsigned i = 0; i < kPer; ++i) {
    const unsigned e = lane + 32 * i;
    p[i] = e < kNexp ? row[e] : -MINFER_INF;
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
#endif  // MOE_ROUTE

#if defined(MOE_SORT)
// Counting sort of the n_tokens·K slots by expert, in one block.
extern "C" __global__ void __launch_bounds__(minfer::kern::kMoeSortThreads)
    minfer_moe_sort(const int* ids, float* scratch, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern::moe;
  int* off = offsets(scratch);
  int* cur = cursors(scratch);
  int* list = slotList(scratch);
  if (n_tokens > static_cast<int>(kMaxBatch)) __trap();  // the scratch regions hold MOE_MAX_BATCH tokens
  const unsigned n_slots = static_cast<unsigned>(n_tokens) * kK;
  for (unsigned e = threadIdx.x; e < kNexp; e += blockDim.x) cur[e] = 0;
  __syncthreads();
  for (unsigned s = threadIdx.x; s < n_slots; s += blockDim.x) {
    const int e = ids[s];
    if (e >= 0 && e < static_cast<int>(kNexp)) atomicAdd(&cur[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (unsigned e = 0; e < kNexp; ++e) {
      const int n = cur[e];
      off[e] = run;
      cur[e] = run;
      run += n;
    }
    off[kNexp] = run;
  }
  __syncthreads();
  for (unsigned s = threadIdx.x; s < n_slots; s += blockDim.x) {
    const int e = ids[s];
    if (e >= 0 && e < static_cast<int>(kNexp)) list[atomicAdd(&cur[e], 1)] = static_cast<int>(s);
  }
}
#endif  // MOE_SORT

#if defined(MOE_GATE_UP) || defined(MOE_DOWN)
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
}  // namespace minfer::kern::moe
#endif

#if defined(MOE_GATE_UP)
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
  const unsigned e = blockIdx.y, r = blockIdx.x * kMoeWarps + threadIdx.x / 32;
  if (r >= kF) return;
  const int begin = offsets(scratch)[e], end = offsets(scratch)[e + 1];
  const int* list = slotList(scratch);
  float* a_out = regionA(scratch);
  for (int g = begin; g < end; g += kMoeGroup) {
    const unsigned n = min(static_cast<unsigned>(end - g), kMoeGroup);
    const float* in[kMoeGroup];
    int slot[kMoeGroup];
#pragma unroll
    for (unsigned i = 0; i < kMoeGroup; ++i) {
      slot[i] = i < n ? list[g + i] : 0;
      in[i] = x + static_cast<unsigned long long>(slot[i] / kK) * kE;
    }
    float dg[kMoeGroup], du[kMoeGroup];
    groupDots<kE, true>(gate, up, e, r, in, n, dg, du);
    if (threadIdx.x % 32 == 0)
#pragma unroll
      for (unsigned i = 0; i < kMoeGroup; ++i)
        if (i < n) a_out[static_cast<unsigned long long>(slot[i]) * kF + r] = dg[i] / (1.0f + expf(-dg[i])) * du[i];
  }
}
#endif  // MOE_GATE_UP

#if defined(MOE_DOWN)
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kMoeWarps)
    minfer_moe_down(const uint8_t* dq, const uint8_t* ds, const uint8_t* dm, float* scratch) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  using namespace minfer::kern::moe;
  const ExpertWeight<MOE_D_PLANE, MOE_D_PITCH, MOE_D_EPITCH, MOE_D_S_PITCH, MOE_D_S_EPITCH, MOE_D_M_PITCH,
                     MOE_D_M_EPITCH, MOE_D_GS>
      down{dq, ds, dm};
  const unsigned e = blockIdx.y, r = blockIdx.x * kMoeWarps + threadIdx.x / 32;
  if (r >= kE) return;
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
#endif  // MOE_DOWN

#if defined(MOE_COMBINE)
extern "C" __global__ void __launch_bounds__(minfer::kern::kMoeCombineThreads)
    minfer_moe_combine(const int* ids, const float* w, const float* scratch, float* out, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern::moe;
  const unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<unsigned long long>(n_tokens) * kE) return;
  const unsigned long long t = i / kE, r = i % kE;
  const float* y = regionY(const_cast<float*>(scratch));
  float acc = 0.0f;
  for (unsigned j = 0; j < kK; ++j) {
    const int e = ids[t * kK + j];
    if (e < 0 || e >= static_cast<int>(kNexp)) continue;
    acc += y[(t * kK + j) * kE + r] * w[t * kK + j];
  }
  out[i] = acc;
}
#endif  // MOE_COMBINE

#endif  // MINFER_DEVICE_CODE && MOE_NEXP
