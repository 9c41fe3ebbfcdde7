// Paged (batched) forms of the position-dependent kernels: RoPE, the KV store and causal GQA attention for
// a batch whose rows come from several sequences, each row with its own position and its sequence's block
// table into a pool of fixed-size KV blocks (Kwon et al. 2023, vLLM's paged attention). The CPU reference
// is cpu::rope / cpu::kvStore / cpu::attention with a paged cpu::KvRows (runtime/cpu/cpu_ops.h).
//
// Row addressing (schema ArgKind RowPositions, BlockTables, BlockSize):
//   pos[t]      position of row t in its own sequence (0-based);
//   tables[t]   index into `tables` of row t's block table: entry b = tables[tables[t] + b] is the pool block
//               holding that sequence's positions b·bs .. b·bs + bs − 1 (bs = block_size, a power of two);
//   slot(t, p)  = tables[tables[t] + p / bs]·bs + p % bs: where position p of row t's sequence lives.
// KV pool of one layer: K and V, each (n_blocks·bs, NHEAD_KV, HEAD_DIM) f16, slot-major (attention.cuh's
// cache layout with slots for positions). The rows of a batch need not be sorted, and rows of one sequence
// share its table; a row's result depends only on its own sequence's keys (positions 0..pos[t]).
//
// rope_paged (PA_ROPE): minfer_rope's rotation (rope.cuh ropeCosSin / ropeRotate, the same constants
//   ROPE_NROT, ROPE_NEOX, ROPE_BASE, ROPE_SCALE, ROPE_FREQ_FACTORS, optional ROPE_YARN…, ROPE_MSCALE) at
//   position pos[t] for row t; heads PA_NHEAD, PA_NHEAD_KV, PA_HEAD_DIM; optional PA_Q_PITCH / PA_K_PITCH
//   (column views, as ROPE_Q_PITCH / ROPE_K_PITCH). Compiled with --fmad=false like minfer_rope.
//   minfer_rope_paged(float* q, float* k, const float* freq_factors, const int* pos, int n_tokens)
//   launch: kern::ropeLaunchRule (rope.cuh): grid (n_tokens, head groups), 64 threads.
// kv_store_paged (PA_KV_STORE): row t's K and V (f32) → f16 at slot(t, pos[t]).
//   minfer_kv_store_paged(const float* k, const float* v, uint16_t* kc, uint16_t* vc, const int* pos,
//                         const int* tables, int block_size, int n_tokens)
//   ATT_NHEAD, ATT_NHEAD_KV, ATT_HEAD_DIM; optional ATT_K_PITCH / ATT_V_PITCH (column views).
//   launch: pagedKvStoreLaunchRule(), one thread per element.
// attn_paged (PA_ATTN): out[t, j] = softmax_i(q[t, j]·K[i, g]·scale)·V[i, g] over i = lo..pos[t] of row t's
//   sequence (lo = 0, or pos[t] − ATT_WINDOW + 1 with a window; soft-cap as ATT_SOFTCAP), the definitions and
//   helpers of attention.cuh (qkScale, capScore, windowStart). One block per (row t, kv head g), all kGroup query
//   heads of g at once (each K/V row read once per group: GQA), in one of two forms (pagedAttnUsesMma):
//   - tensor cores (heads a multiple of 16 up to 128, at most 16 query heads per kv head): attention_decode.cuh's
//     mmaGroupKeys over the row's keys, read from its sequence's slots in 64-key tiles (Q and P rounded to f16:
//     the tensor-core decode's tolerance); 4 warps, dynamic shared memory attnDecodeSmemBytes();
//   - SIMT (other heads): W warps (pagedAttnWarps: 8, or 4 for wide groups) take keys lo + w, lo + w + W, … two at a
//     time (two independent load/reduce chains), lanes over the dimensions, an online softmax per warp.
//   Then the warps' partials merge through shared memory into the row's output. Cost: row t reads
//   (pos[t] + 1)·2·HEAD_DIM f16 per kv head.
//   minfer_attn_paged(const float* q, const uint16_t* kc, const uint16_t* vc, float* out, const int* pos,
//                     const int* tables, int block_size, int n_tokens)
//   ATT_NHEAD, ATT_NHEAD_KV, ATT_HEAD_DIM, optional ATT_SCALE, ATT_SOFTCAP, ATT_WINDOW, ATT_Q_PITCH;
//   q: rows of ATT_Q_PITCH floats (default NHEAD·HEAD_DIM), out: n_tokens × NHEAD·HEAD_DIM f32.
//   With PA_Q8 = 1 (the decode plan's QuantizeAct of the output fused in, as attention.cuh's ATT_Q8; HEAD_DIM
//   % 32 == 0): minfer_attn_paged(q, kc, vc, out, int8_t* qs, Q8Meta* meta, pos, tables, block_size, n_tokens)
//   also writes out's q8 form (quantize_act.cuh's definition bit for bit; qs row t at t·NHEAD·HEAD_DIM).
//   launch: pagedAttnLaunchRule(): grid (n_tokens, NHEAD_KV), 32·W threads; the SIMT form's static shared memory
//   W·kGroup·(HEAD_DIM + 2) floats, the tensor-core form's dynamic attnDecodeSmemBytes().
#pragma once

#include "kernels/attention.cuh"
#include "kernels/rope.cuh"

namespace minfer::kern {

// attn_paged's form: the tensor-core decode's (attention_decode.cuh mmaGroupKeys: heads a multiple of 16 up to 128, at
// most 16 query heads per kv head), else the SIMT one (WarpAttention).
MINFER_HD constexpr bool pagedAttnUsesMma(unsigned n_head, unsigned n_head_kv, unsigned head_dim) {
  return attnDecodeUsesMma(head_dim, n_head / n_head_kv);
}
// Warps of the SIMT form's block: 8 where their partials fit its 48 KiB of static shared memory (else 4; measured when
// the 7B still took this form: at 32 decode rows 4 warps took 40.8 µs per layer on the H200, each warp's keys one
// serial chain). The tensor-core form: kAttnWarps (its key tile is 16 keys per warp).
constexpr unsigned kPagedAttnMaxWarps = 8, kPagedAttnMinWarps = 4;
MINFER_HD constexpr unsigned pagedAttnPartialBytes(unsigned warps, unsigned group, unsigned head_dim) {
  return 4u * warps * group * (head_dim + 2);
}
MINFER_HD constexpr unsigned pagedAttnWarps(unsigned n_head, unsigned n_head_kv, unsigned head_dim) {
  if (pagedAttnUsesMma(n_head, n_head_kv, head_dim)) return kAttnWarps;
  return pagedAttnPartialBytes(kPagedAttnMaxWarps, n_head / n_head_kv, head_dim) <= 48u * 1024u ? kPagedAttnMaxWarps
                                                                                                 : kPagedAttnMinWarps;
}

MINFER_HD LaunchRule pagedKvStoreLaunchRule(unsigned n_head_kv, unsigned head_dim) {
  return kvStoreLaunchRule(n_head_kv, head_dim);  // same element-per-thread shape as kv_store
}

// Grid (rows, kv heads); the tensor-core form takes attnDecodeSmemBytes() of dynamic shared memory (its two stages
// of K and V tiles, where the warps' outputs merge afterwards).
MINFER_HD LaunchRule pagedAttnLaunchRule(unsigned n_head, unsigned n_head_kv, unsigned head_dim) {
  LaunchRule r;
  r.grid[0] = perToken(1);
  r.grid[1] = fixedExtent(n_head_kv);
  r.block.x = 32 * pagedAttnWarps(n_head, n_head_kv, head_dim);
  r.smem = pagedAttnUsesMma(n_head, n_head_kv, head_dim) ? attnDecodeSmemBytes(head_dim, n_head / n_head_kv) : 0u;
  return r;
}

// Static shared memory of attn_paged in bytes (the SIMT form's per-warp partials; the tensor-core form's maxima and
// sums); ≤ 48 KiB for the kernel to compile.
MINFER_HD constexpr unsigned pagedAttnSmemBytes(unsigned n_head, unsigned n_head_kv, unsigned head_dim) {
  return pagedAttnUsesMma(n_head, n_head_kv, head_dim)
             ? 2u * 4u * kAttnWarps * (n_head / n_head_kv)
             : pagedAttnPartialBytes(pagedAttnWarps(n_head, n_head_kv, head_dim), n_head / n_head_kv, head_dim);
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && (defined(PA_KV_STORE) || defined(PA_ATTN) || defined(PA_ROPE))
namespace minfer::kern::paged {
// Slot of position p of the sequence whose block table is `table` (entry b = block of positions b·bs …).
__device__ __forceinline__ uint64_t slot(const int* __restrict__ table, int p, int block_size) {
  const int b = p / block_size;
  return static_cast<uint64_t>(table[b]) * static_cast<uint64_t>(block_size) + static_cast<uint64_t>(p - b * block_size);
}
}  // namespace minfer::kern::paged
#endif

#if defined(MINFER_DEVICE_CODE) && defined(PA_ROPE)
#ifndef PA_Q_PITCH
#define PA_Q_PITCH (PA_NHEAD * PA_HEAD_DIM)
#endif
#ifndef PA_K_PITCH
#define PA_K_PITCH (PA_NHEAD_KV * PA_HEAD_DIM)
#endif
extern "C" __global__ void __launch_bounds__(minfer::kern::kRopeThreads)
    minfer_rope_paged(float* q, float* k, const float* __restrict__ freq_factors, const int* __restrict__ pos,
                      int n_tokens) {
  minfer::kern::overlapPrologue();
  static_assert(ROPE_NROT % 2 == 0 && ROPE_NROT <= PA_HEAD_DIM, "ROPE_NROT must be even and <= PA_HEAD_DIM");
  constexpr int kHeads = PA_NHEAD + PA_NHEAD_KV;
  const int per_block = (kHeads + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y);
  const int t = blockIdx.x, h0 = blockIdx.y * per_block;
  if (t >= n_tokens) return;
  const int p = pos[t];
  for (int i = threadIdx.x; i < ROPE_NROT / 2; i += blockDim.x) {
    float c, s;
    minfer::kern::ropeCosSin(i, p, freq_factors, c, s);
    const int i0 = ROPE_NEOX ? i : 2 * i;
    const int i1 = ROPE_NEOX ? i + ROPE_NROT / 2 : 2 * i + 1;
    for (int hh = 0; hh < per_block; ++hh) {
      const int h = h0 + hh;
      if (h >= kHeads) break;
      float* x = h < PA_NHEAD ? q + static_cast<uint64_t>(t) * PA_Q_PITCH + h * PA_HEAD_DIM
                              : k + static_cast<uint64_t>(t) * PA_K_PITCH + (h - PA_NHEAD) * PA_HEAD_DIM;
      minfer::kern::ropeRotate(x[i0], x[i1], c, s, x[i0], x[i1]);
    }
  }
}
#endif

#if defined(MINFER_DEVICE_CODE) && defined(PA_KV_STORE)
extern "C" __global__ void __launch_bounds__(minfer::kern::kKvStoreThreads)
    minfer_kv_store_paged(const float* __restrict__ k, const float* __restrict__ v, uint16_t* __restrict__ kc,
                          uint16_t* __restrict__ vc, const int* __restrict__ pos, const int* __restrict__ tables,
                          int block_size, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
#ifdef ATT_K_PITCH
  constexpr uint64_t kKPitch = ATT_K_PITCH, kVPitch = ATT_V_PITCH;
#else
  constexpr uint64_t kKPitch = attn::kKvW, kVPitch = attn::kKvW;
#endif
  const uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<uint64_t>(n_tokens) * attn::kKvW) return;
  const int t = static_cast<int>(i / attn::kKvW);
  const uint64_t c = i % attn::kKvW;
  const uint64_t dst = paged::slot(tables + tables[t], pos[t], block_size) * attn::kKvW + c;
  kc[dst] = f2h(k[t * kKPitch + c]);
  vc[dst] = f2h(v[t * kVPitch + c]);
}
#endif

#if defined(MINFER_DEVICE_CODE) && defined(PA_ATTN)
#ifndef PA_Q8
#define PA_Q8 0
#endif
namespace minfer::kern::paged {
using namespace minfer::kern::attn;
// The block's merge of its kW warps and the store of row t's kGroup heads of kv head g: M = max_w m_w, L =
// Σ_w e^{m_w − M}·l_w, out = Σ_w e^{m_w − M}·o_w / L (m in log2 units with kLog2, else natural; every row has
// key p itself, so some warp has a finite maximum and L ≥ 1). wm, wl: [kW][kGroup], wo: [kW][kGroup][kD] floats.
// With PA_Q8 (HEAD_DIM % 32 == 0) also out's q8 form: a warp's 32 elements are one block of 32 of one head
// (kGroup·kD is a multiple of 32, so every lane of a warp runs each iteration).
template <int kW, bool kLog2>
__device__ __forceinline__ void mergeAndStore(const float (*wm)[kGroup], const float (*wl)[kGroup], const float* wo,
                                              int t, int g, float* out, int8_t* qs, Q8Meta* meta) {
  for (int e = threadIdx.x; e < kGroup * kD; e += blockDim.x) {
    const int h = e / kD, d = e % kD;
    float mb = -MINFER_INF;
#pragma unroll
    for (int w = 0; w < kW; ++w) mb = fmaxf(mb, wm[w][h]);
    float acc = 0.0f, lb = 0.0f;
#pragma unroll
    for (int w = 0; w < kW; ++w)
      if (wm[w][h] != -MINFER_INF) {
        const float f = kLog2 ? exp2f(wm[w][h] - mb) : expf(wm[w][h] - mb);
        acc += wo[(w * kGroup + h) * kD + d] * f;
        lb += wl[w][h] * f;
      }
    const uint64_t at = (static_cast<uint64_t>(t) * kH + static_cast<uint64_t>(g) * kGroup + h) * kD + d;
    out[at] = acc / lb;
#if PA_Q8
    static_assert(kD % 32 == 0, "PA_Q8 needs heads of whole blocks of 32");
    quantizeBlock<1>({acc / lb}, qs + (at & ~uint64_t{31}), meta + at / 32, true);
#else
    (void)qs, (void)meta;
#endif
  }
}

// SIMT form: the lanes over the dimensions, each warp's keys with an online softmax: attention_decode.cuh's
// WarpAttention (the decode kernel's), two keys per iteration (key, key + kW).
template <int kW>
__device__ __forceinline__ void attendSimt(const float* q, const uint16_t* kc, const uint16_t* vc, float* out,
                                           int8_t* qs, Q8Meta* meta, int t, int g, int lo, int end, const int* table,
                                           int block_size) {
  __shared__ float wm[kW][kGroup], wl[kW][kGroup];
  __shared__ float wo[kW][kGroup][kD];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float scale = qkScale();
  const uint64_t col = static_cast<uint64_t>(g) * kD;
  WarpAttention wa;
  wa.init(q + static_cast<uint64_t>(t) * kQPitch + static_cast<uint64_t>(g) * kGroup * kD, lane);
  for (int key = lo + warp; key < end; key += 2 * kW) {
    const bool two = key + kW < end;
    const uint64_t s0 = slot(table, key, block_size) * kKvW + col;
    const uint64_t s1 = slot(table, two ? key + kW : key, block_size) * kKvW + col;
    wa.keyPair(kc + s0, kc + s1, vc + s0, vc + s1, two, scale, lane);
  }
  wa.stash(warp, lane, wm, wl, wo);
  __syncthreads();
  mergeAndStore<kW, false>(wm, wl, &wo[0][0][0], t, g, out, qs, meta);
}

#if MINFER_ATT_DECODE_MMA
// Tensor-core form: attention_decode.cuh's mmaGroupKeys over the row's keys (its sequence's slots), the warps
// merged through the K/V stages.
__device__ __forceinline__ void attendMma(const float* q, const uint16_t* kc, const uint16_t* vc, float* out, int8_t* qs,
                                          Q8Meta* meta, int t, int g, int lo, int end, const int* table, int block_size) {
  constexpr int kWarps = static_cast<int>(kAttnWarps);
  extern __shared__ __align__(16) uint16_t smem_h[];  // [2 stages][K tile, V tile]; then the warps' outputs (f32)
  __shared__ float wm[kWarps][kGroup], wl[kWarps][kGroup];
  static_assert(kQPitch % 2 == 0, "mmaGroupKeys reads the queries as float2");
  float o[kDT][4], m_run[2], l_run[2];
  mmaGroupKeys(q + static_cast<uint64_t>(t) * kQPitch + static_cast<uint64_t>(g) * kGroup * kD, kc, vc, lo, end, g,
               [=](int p) { return slot(table, p, block_size) * kKvW; }, smem_h, o, m_run, l_run);
  const float* wo = stashMmaInStages(o, m_run, l_run, wm, wl, smem_h);
  mergeAndStore<kWarps, true>(wm, wl, wo, t, g, out, qs, meta);
}
#endif
}  // namespace minfer::kern::paged

extern "C" __global__ void __launch_bounds__(32 * minfer::kern::pagedAttnWarps(ATT_NHEAD, ATT_NHEAD_KV, ATT_HEAD_DIM))
    minfer_attn_paged(const float* __restrict__ q, const uint16_t* __restrict__ kc, const uint16_t* __restrict__ vc,
                      float* __restrict__ out,
#if PA_Q8
                      int8_t* __restrict__ qs, minfer::kern::Q8Meta* __restrict__ meta,
#endif
                      const int* __restrict__ pos, const int* __restrict__ tables, int block_size, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
#if !PA_Q8
  int8_t* const qs = nullptr;
  Q8Meta* const meta = nullptr;
#endif
  const int t = blockIdx.x, g = blockIdx.y;
  if (t >= n_tokens) return;
  const int p = pos[t], lo = attn::windowStart(p), end = p + 1;  // keys [lo, end) of row t's sequence
  const int* table = tables + tables[t];
#if MINFER_ATT_DECODE_MMA
  paged::attendMma(q, kc, vc, out, qs, meta, t, g, lo, end, table, block_size);
#else
  paged::attendSimt<static_cast<int>(pagedAttnWarps(ATT_NHEAD, ATT_NHEAD_KV, ATT_HEAD_DIM))>(
      q, kc, vc, out, qs, meta, t, g, lo, end, table, block_size);
#endif
}
#endif
