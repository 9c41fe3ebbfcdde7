// Decode attention (OpKind Attention, the decode plan: one token): attn_decode in its tensor-core and SIMT forms,
// and attn_combine. Part of kernels/attention.cuh, which includes it at its end and which the codegen's specs
// name: its KV cache layout, definitions, compile-time constants, launch rules (attnDecodeLaunch,
// attnCombineLaunch) and tensor-core steps (scoresQK, softmaxStep, packP, accumulatePV) are there.
// WarpAttention is also the paged kernels' SIMT attention, mmaGroupKeys and stashMma their tensor-core one
// (paged_attention.cuh, PA_ATTN).
//
// attn_decode (ATT_DECODE): one token, split-KV (flash-decoding): block (kv head g, split s) reduces, for each
//   query head j of g's group (GQA: each K/V row read once for the group), the positions
//   lo + [s·chunk, (s+1)·chunk) ∩ [lo, kv_len), chunk = max(⌈(kv_len − lo) / SPLITS⌉, the form's least keys)
//   (decodeSplits; lo > 0 only with a window), kv_len = pos0 + 1 read from device memory, so the grid is fixed
//   and a captured graph stays valid; splits past the keys return at once. Two forms:
//   - tensor cores (attnDecodeUsesMma: HEAD_DIM a multiple of 16 up to 128, ≤ 16 query heads per kv head): the
//     group's heads as the rows of the prefill's mma.m16n8k16 steps, the keys in its double-buffered tiles of
//     kAttnDecodeMmaKeys positions (also the least keys per split); Q and P rounded to f16 as there; dynamic
//     shared memory attnDecodeSmemBytes();
//   - SIMT (other heads): each warp two keys at a time, lanes over the dimensions (WarpAttention); at least
//     kAttnDecodeMinKeys keys per split.
//   Writes the partial (max, sum, unnormalized output) of each non-empty split to `part`.
//   minfer_attn_decode(const float* q, const uint16_t* kc, const uint16_t* vc, float* part, const int* pos)
//   launch: attnDecodeLaunch(n_head_kv, SPLITS, HEAD_DIM, group); part: NHEAD × SPLITS × (HEAD_DIM + 2) f32
//   (attnDecodePartFloats).
// attn_combine (ATT_COMBINE): merges the non-empty splits' partials of each head (decodeSplits from pos):
//   out[j] = Σ_s e^{m_s−M}·o_s / L; up to kAttnCombineBatch splits (a short context) with all the loads
//   at once.
//   minfer_attn_combine(const float* part, float* out, const int* pos)       launch: attnCombineLaunch()
//   With ATT_Q8 = 1 (the QuantizeAct of the output fused into this launch; HEAD_DIM % 32 == 0):
//   minfer_attn_combine(const float* part, float* out, const int* pos, int8_t* qs, Q8Meta* meta), also writing out's q8
//   form (quantize_act.cuh's definition, bit for bit; a warp holds one block of 32 of a head).
#pragma once

#include "kernels/attention.cuh"

#if defined(MINFER_DEVICE_CODE) && (defined(ATT_DECODE) || defined(PA_ATTN))
namespace minfer::kern::attn {
// Decode (and the paged kernels' attention, paged_attention.cuh): lane l holds kDL dimensions of every row, dimension i of the lane at dim(l, i): contiguous
// (l·kDL … l·kDL + kDL − 1) when HEAD_DIM is a multiple of 32 — one 2-, 4-, 8- or 16-byte load per row for
// kDL 1, 2, 4, 8, else one 2-byte load per dimension (HEAD_DIM 96, 160, …) — and strided (l + 32·i,
// 2-byte loads) otherwise; dimensions ≥ HEAD_DIM are not read (zero).
constexpr bool kContig = kD % 32 == 0;
__device__ __forceinline__ int dim(int lane, int i) { return kContig ? lane * kDL + i : lane + 32 * i; }
__device__ __forceinline__ void loadRow(const uint16_t* row, int lane, float (&x)[kDL]) {
  if constexpr (kContig && (kDL == 1 || kDL == 2 || kDL == 4 || kDL == 8)) {
    unsigned w[kDL == 8 ? 4 : kDL == 4 ? 2 : 1];
    if constexpr (kDL == 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(row + lane * 8);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (kDL == 4) {
      const uint2 v = *reinterpret_cast<const uint2*>(row + lane * 4);
      w[0] = v.x, w[1] = v.y;
    } else if constexpr (kDL == 2) {
      w[0] = *reinterpret_cast<const unsigned*>(row + lane * 2);
    } else {
      w[0] = row[lane];
    }
#pragma unroll
    for (int i = 0; i < kDL; ++i) x[i] = h2f(static_cast<uint16_t>(kDL == 1 ? w[0] : w[i / 2] >> (16 * (i % 2))));
  } else {
#pragma unroll
    for (int i = 0; i < kDL; ++i) x[i] = dim(lane, i) < kD ? h2f(row[dim(lane, i)]) : 0.0f;
  }
}

// One warp's online softmax over its keys for the kGroup query heads of a kv head (lanes over the
// dimensions, as loadRow): the queries, the running maxima m, sums l and unnormalized outputs o.
struct WarpAttention {
  float qv[kGroup][kDL], m[kGroup], l[kGroup], o[kGroup][kDL];

  // q0: the first query head's row of the group (kGroup rows of kD floats).
  __device__ __forceinline__ void init(const float* q0, int lane) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      m[h] = -MINFER_INF;
      l[h] = 0.0f;
#pragma unroll
      for (int i = 0; i < kDL; ++i) {
        const int d = dim(lane, i);
        qv[h][i] = d < kD ? q0[static_cast<uint64_t>(h) * kD + d] : 0.0f;
        o[h][i] = 0.0f;
      }
    }
  }

  // Two keys at once (rows k0/v0 and k1/v1 of this kv head): two independent chains of loads, warp sums and
  // exponentials in flight; without `two` the second key has p = 0 (pass the first key's rows again).
  __device__ __forceinline__ void keyPair(const uint16_t* k0, const uint16_t* k1, const uint16_t* v0,
                                          const uint16_t* v1, bool two, float scale, int lane) {
    float kr[2][kDL], vr[2][kDL];
    loadRow(k0, lane, kr[0]);
    loadRow(k1, lane, kr[1]);
    loadRow(v0, lane, vr[0]);
    loadRow(v1, lane, vr[1]);
    float s[2][kGroup];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      s[0][h] = s[1][h] = 0.0f;
#pragma unroll
      for (int i = 0; i < kDL; ++i) {
        s[0][h] = fmaf(qv[h][i], kr[0][i], s[0][h]);
        s[1][h] = fmaf(qv[h][i], kr[1][i], s[1][h]);
      }
    }
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      s[0][h] = warpSum(s[0][h]);
      s[1][h] = warpSum(s[1][h]);
    }
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      const float sc0 = capScore(s[0][h] * scale, 1.0f);
      const float sc1 = two ? capScore(s[1][h] * scale, 1.0f) : -MINFER_INF;
      const float m_new = fmaxf(m[h], fmaxf(sc0, sc1));
      const float p0 = expf(sc0 - m_new), p1 = two ? expf(sc1 - m_new) : 0.0f, corr = expf(m[h] - m_new);
      l[h] = l[h] * corr + p0 + p1;
#pragma unroll
      for (int i = 0; i < kDL; ++i) o[h][i] = fmaf(p1, vr[1][i], fmaf(p0, vr[0][i], o[h][i] * corr));
      m[h] = m_new;
    }
  }

  // This warp's (m, l, o) into the block's shared arrays at index `warp` (m = −inf for a warp without keys).
  template <int kWarps>
  __device__ __forceinline__ void stash(int warp, int lane, float (&wm)[kWarps][kGroup], float (&wl)[kWarps][kGroup],
                                        float (&wo)[kWarps][kGroup][kD]) const {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      if (lane == 0) {
        wm[warp][h] = m[h];
        wl[warp][h] = l[h];
      }
#pragma unroll
      for (int i = 0; i < kDL; ++i) {
        const int d = dim(lane, i);
        if (d < kD) wo[warp][h][d] = o[h][i];
      }
    }
  }
};
}  // namespace minfer::kern::attn
#endif

#if defined(MINFER_DEVICE_CODE) && (defined(ATT_DECODE) || defined(PA_ATTN)) && MINFER_ATT_DECODE_MMA
namespace minfer::kern::attn {
// The tensor-core decode's block (attnDecodeUsesMma; attn_decode below, and paged_attention.cuh's attn_paged): the
// kGroup query heads of kv head g (q0: the first one's row, kGroup rows of kD floats) as the rows of one m16 tile
// (rows ≥ kGroup are zero queries, never stored), so S = Q·Kᵀ and O += P·V are the prefill's mma.m16n8k16 steps
// with heads in place of query tokens, over the keys [begin, end) (row_of(p): the first element of the cache row
// of position p). The keys stream through shared memory (smem_h: two stages of a K and a V tile) in the
// prefill's double-buffered tiles of kAttnDecodeMmaKeys positions (cp.async: every K and V byte of a tile is in
// flight at once); warp w takes positions [16w, 16w + 16) of each tile, with its own online softmax (in log2
// units, exp2). Q is rounded to f16 after scaling by log2(e)·scale and P before P·V, as the tensor-core prefill
// does (its tolerance). Leaves this thread's rows (gr, gr + 8) of the warp's (m, l, o); a warp without keys keeps
// m = −inf, l = 0.
template <class RowOf>
__device__ __forceinline__ void mmaGroupKeys(const float* q0, const uint16_t* kc, const uint16_t* vc, int begin,
                                             int end, int g, RowOf row_of, uint16_t* smem_h, float (&o)[kDT][4],
                                             float (&m_run)[2], float (&l_run)[2]) {
  constexpr int kWarps = static_cast<int>(kAttnWarps);
  static_assert(kBKV == 16 * kWarps && kKS >= 1 && kDT % 2 == 0, "a warp's 16 keys per tile; pairs of n8 output tiles");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gr = lane / 4, t4 = lane % 4, mq = lane / 8, r8 = lane % 8;
  const int n_tiles = (end - begin + kBKV - 1) / kBKV;
  loadKvTileAt(smem_h, smem_h + kTileH, kc, vc, begin, end, g, row_of);
  cpAsyncCommit();

  // A fragments of the group's queries: row r = query head g·kGroup + r (zero for r ≥ kGroup).
  constexpr float kLog2e = 1.4426950408889634f;
  const float qscale = kLog2e * qkScale();
  unsigned qf[kKS][4];
#pragma unroll
  for (int ks = 0; ks < kKS; ++ks)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = (r % 2) ? gr + 8 : gr, d = ks * 16 + (r / 2) * 8 + 2 * t4;
      float2 v = make_float2(0.0f, 0.0f);
      if (row < kGroup) v = *reinterpret_cast<const float2*>(q0 + static_cast<uint64_t>(row) * kD + d);
      qf[ks][r] = packHalf2(v.x * qscale, v.y * qscale);
    }

#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
  m_run[0] = m_run[1] = -MINFER_INF;
  l_run[0] = l_run[1] = 0.0f;

  for (int it = 0; it < n_tiles; ++it) {
    const int kv0 = begin + it * kBKV + 16 * warp, stage = it & 1;  // this warp's first key of the tile
    // One barrier per tile, as in the prefill: tile it is visible, tile it − 1's stage is free for it + 1.
    cpAsyncWait<0>();
    __syncthreads();
    if (it + 1 < n_tiles) {
      uint16_t* nb = smem_h + (stage ^ 1) * 2 * kTileH;
      loadKvTileAt(nb, nb + kTileH, kc, vc, begin + (it + 1) * kBKV, end, g, row_of);
    }
    cpAsyncCommit();
    if (kv0 >= end) continue;  // the last tile may leave this warp no key
    const uint16_t* sk = smem_h + stage * 2 * kTileH + 16 * warp * kLDH;
    const uint16_t* sv = sk + kTileH;

    float s[2][4];  // S = Q·Kᵀ: 16 rows × this warp's 16 keys (two n8 tiles)
    scoresQK(s, qf, sk, r8, mq);
    // Keys past the end masked, then the online softmax; O = O·corr + P·V (P's two n8 accumulator tiles are the A
    // fragment of one k16 step).
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = kv0 + nt * 8 + 2 * t4 + e % 2 < end ? capScore(s[nt][e], kLog2e) : -MINFER_INF;
    softmaxStep(s, m_run, l_run, o);
    unsigned pa[4];
    packP(pa, s[0], s[1]);
    accumulatePV(o, pa, sv, r8, mq);
  }
}

// This thread's rows (< kGroup) of the warp's (m in log2 units, l, o) from mmaGroupKeys into the block's shared
// arrays: wm, wl [kAttnWarps][kGroup], wo [kAttnWarps][kGroup][kD] floats. Call after a barrier that every warp
// has passed since its last read of the K/V stages when wo lies there.
__device__ __forceinline__ void stashMma(const float (&o)[kDT][4], const float (&m_run)[2], const float (&l_run)[2],
                                         float (*wm)[kGroup], float (*wl)[kGroup], float* wo) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = h ? gr + 8 : gr;
    if (row >= kGroup) continue;
    if (t4 == 0) {
      wm[warp][row] = m_run[h];
      wl[warp][row] = l_run[h];
    }
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
      *reinterpret_cast<float2*>(wo + (warp * kGroup + row) * kD + dt * 8 + 2 * t4) =
          make_float2(o[dt][h * 2], o[dt][h * 2 + 1]);
  }
}
// The block's warps' (m, l, o) after mmaGroupKeys in shared memory: wm, wl, and the outputs in the K/V stages
// `smem_h` (free once every warp has passed the first barrier here), visible to the block on return (the second
// barrier). Returns the outputs, [kAttnWarps][kGroup][kD] floats.
__device__ __forceinline__ const float* stashMmaInStages(const float (&o)[kDT][4], const float (&m_run)[2],
                                                         const float (&l_run)[2], float (*wm)[kGroup], float (*wl)[kGroup],
                                                         uint16_t* smem_h) {
  static_assert(kAttnWarps * kGroup * kD * 4 <= 2 * 2 * kTileH * 2, "the warps' outputs fit the K/V stages");
  __syncthreads();
  float* wo = reinterpret_cast<float*>(smem_h);
  stashMma(o, m_run, l_run, wm, wl, wo);
  __syncthreads();
  return wo;
}
}  // namespace minfer::kern::attn
#endif

#if defined(MINFER_DEVICE_CODE) && defined(ATT_DECODE)
namespace minfer::kern::attn {
// The block's partial of each query head of kv head g's group, split `split`, from its warps' (m, l, o) in shared
// memory (wm, wl: [kWarps][kGroup]; wo: [kWarps][kGroup][kD] floats; m in log2 units with kLog2, else natural):
// M = max_w m_w (written in natural units), L = Σ_w e^{m_w − M}·l_w, o = Σ_w e^{m_w − M}·o_w (warps without keys,
// m = −inf, skipped).
template <int kWarps, bool kLog2>
__device__ __forceinline__ void writeSplitPartial(const float (*wm)[kGroup], const float (*wl)[kGroup], const float* wo,
                                                  int g, int split, float* part) {
  constexpr float kLn2 = 0.6931471805599453f;
  for (int h = 0; h < kGroup; ++h) {
    float mb = -MINFER_INF;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mb = fmaxf(mb, wm[w][h]);
    float* dst = part + ((static_cast<uint64_t>(g) * kGroup + h) * ATT_SPLITS + split) * (kD + 2);
    for (int d = threadIdx.x; d < kD; d += blockDim.x) {
      float acc = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        if (wm[w][h] != -MINFER_INF)
          acc += wo[(w * kGroup + h) * kD + d] * (kLog2 ? exp2f(wm[w][h] - mb) : expf(wm[w][h] - mb));
      dst[2 + d] = acc;
    }
    if (threadIdx.x == 0) {
      float lb = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        if (wm[w][h] != -MINFER_INF) lb += wl[w][h] * (kLog2 ? exp2f(wm[w][h] - mb) : expf(wm[w][h] - mb));
      dst[0] = kLog2 ? mb * kLn2 : mb;  // −inf only where no warp had keys
      dst[1] = lb;
    }
  }
}
}  // namespace minfer::kern::attn

// Block (kv head g, split s): the kGroup query heads that share kv head g, over the split's keys (decodeSplits), so
// each K and V row is read once for all of them (GQA), in one of two forms (attnDecodeUsesMma), then the warps'
// (max, sum, output) merge through shared memory into the block's partial (writeSplitPartial):
// - tensor cores (the flash-decoding split of the SIMT form, FlashAttention-2's tile arithmetic): mmaGroupKeys over
//   the split's keys (4 warps, m in log2 units);
// - SIMT: a warp takes two keys at a time (keys begin + w, begin + w + kWarps, …), its lanes splitting the
//   dimensions: the kGroup scores are warp sums, the online softmax runs in every lane, and each lane accumulates
//   P·V for its own dimensions. (The earlier form, lane = key, ran HEAD_DIM · kGroup dependent FMAs per key on one
//   lane: 14 µs per layer at a depth of a few keys on the 7B, measured with Nsight Compute.)
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kAttnWarps)
    minfer_attn_decode(const float* __restrict__ q, const uint16_t* __restrict__ kc, const uint16_t* __restrict__ vc,
                       float* __restrict__ part, const int* __restrict__ pos) {
  using namespace minfer::kern;
  using namespace minfer::kern::attn;
  constexpr int kWarps = static_cast<int>(kAttnWarps);
  __shared__ float wm[kWarps][kGroup], wl[kWarps][kGroup];

  // The position (the host's: read before the wait, common.cuh overlapPrologue) and this block's keys.
  const int g = blockIdx.x, split = blockIdx.y;
  const int kv_len = pos[0] + 1;
  const DecodeSplits sp = decodeSplits(kv_len);
  if (split >= sp.active) return;  // idle: the combine reads splits [0, active) only
  overlapPrologue();
  const int begin = sp.lo + split * sp.chunk, end = min(kv_len, begin + sp.chunk);
#if MINFER_ATT_DECODE_MMA
  extern __shared__ __align__(16) uint16_t smem_h[];  // [2 stages][K tile, V tile]; then the warps' outputs (f32)
  float o[kDT][4], m_run[2], l_run[2];
  mmaGroupKeys(q + static_cast<uint64_t>(g) * kGroup * kD, kc, vc, begin, end, g, [](int p) { return kvRow(p); },
               smem_h, o, m_run, l_run);
  writeSplitPartial<kWarps, true>(wm, wl, stashMmaInStages(o, m_run, l_run, wm, wl, smem_h), g, split, part);
#else
  __shared__ float wo[kWarps][kGroup][kD];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float scale = qkScale();
  WarpAttention wa;
  wa.init(q + static_cast<uint64_t>(g) * kGroup * kD, lane);
  // Two keys per iteration (key, key + kWarps).
  const uint64_t col = static_cast<uint64_t>(g) * kD;
  for (int key = begin + warp; key < end; key += 2 * kWarps) {
    const bool two = key + kWarps < end;
    const uint64_t row = kvRow(key) + col, row2 = kvRow(two ? key + kWarps : key) + col;
    wa.keyPair(kc + row, kc + row2, vc + row, vc + row2, two, scale, lane);
  }
  wa.stash(warp, lane, wm, wl, wo);
  __syncthreads();
  writeSplitPartial<kWarps, false>(wm, wl, &wo[0][0][0], g, split, part);
#endif
}
#endif

#if defined(MINFER_DEVICE_CODE) && defined(ATT_COMBINE)
namespace minfer::kern::attn {
// Output dimension d of query head j, and with ATT_Q8 its q8 form (every lane of the warp holding the block of 32
// calls it together: quantize_act.cuh's definition, bit for bit).
__device__ __forceinline__ void combineStore(float* out, int j, int d, float v
#if ATT_Q8
                                             , int8_t* qs, Q8Meta* meta
#endif
) {
  out[static_cast<uint64_t>(j) * kD + d] = v;
#if ATT_Q8
  static_assert(kD % 32 == 0, "the q8 form needs heads of whole blocks of 32");
  const uint64_t at = static_cast<uint64_t>(j) * kD + (d & ~31);  // this warp's block
  quantizeBlock<1>({v}, qs + at, meta + at / 32, true);
#endif
}
}  // namespace minfer::kern::attn
#if ATT_Q8
#define MINFER_ATT_COMBINE_Q8_ARGS , qs, meta
#else
#define MINFER_ATT_COMBINE_Q8_ARGS
#endif
extern "C" __global__ void __launch_bounds__(128)
    minfer_attn_combine(const float* __restrict__ part, float* __restrict__ out, const int* __restrict__ pos
#if ATT_Q8
                        , int8_t* __restrict__ qs, minfer::kern::Q8Meta* __restrict__ meta
#endif
    ) {
  using namespace minfer::kern;
  using namespace minfer::kern::attn;
  constexpr int kSplits = ATT_SPLITS;
  __shared__ float w[kSplits];  // e^{m_s − M} of the active splits
  const int j = blockIdx.x;
  // Every one of them non-empty, its partial written; the position is the host's (read before the wait).
  const int active = decodeSplits(pos[0] + 1).active;
  overlapPrologue();
  const float* src = part + static_cast<uint64_t>(j) * kSplits * (kD + 2);
  // Up to kBatch splits (a short context): every thread loads the splits' m, l and its dimension's output at once
  // (one L2 round trip instead of three) and computes the same M, weights, L and output as the general form below,
  // in its order, so the bits are the same.
#ifdef ATT_COMBINE_BATCH
  constexpr int kMost = ATT_COMBINE_BATCH;
#else
  constexpr int kMost = static_cast<int>(kAttnCombineBatch);
#endif
  constexpr int kBatch = kSplits < kMost ? kSplits : kMost, kSlots = kBatch > 0 ? kBatch : 1;
  if (kBatch > 0 && active <= kBatch) {
    for (int d = threadIdx.x; d < kD; d += blockDim.x) {
      float ms[kSlots], ls[kSlots], os[kSlots];
#pragma unroll
      for (int s = 0; s < kBatch; ++s) {
        const bool on = s < active;
        ms[s] = on ? src[s * (kD + 2)] : -MINFER_INF;
        ls[s] = on ? src[s * (kD + 2) + 1] : 0.0f;
        os[s] = on ? src[s * (kD + 2) + 2 + d] : 0.0f;
      }
      float m = -MINFER_INF;
#pragma unroll
      for (int s = 0; s < kBatch; ++s) m = fmaxf(m, ms[s]);
      float lb = 0.0f, acc = 0.0f;
#pragma unroll
      for (int s = 0; s < kBatch; ++s)
        if (s < active) {
          const float ws = expf(ms[s] - m);
          lb += ls[s] * ws;
          acc += os[s] * ws;
        }
      combineStore(out, j, d, acc * (1.0f / lb) MINFER_ATT_COMBINE_Q8_ARGS);
    }
    return;
  }
  if (threadIdx.x < 32) {  // M = max_s m_s, then the weights, by the first warp
    float m = -MINFER_INF;
    for (int s = threadIdx.x; s < active; s += 32) m = fmaxf(m, src[s * (kD + 2)]);
    m = warpMax(m);
    for (int s = threadIdx.x; s < active; s += 32) w[s] = expf(src[s * (kD + 2)] - m);
  }
  __syncthreads();
  // L = Σ_s e^{m_s − M}·l_s and the outputs, in split order, in one loop: sixteen splits' l and o loads in flight per
  // iteration (the loop is a chain of L2 round trips: four per iteration measured 6.3 µs per layer at 64 splits; L
  // in a loop of its own before the outputs', twice the round trips).
  for (int d = threadIdx.x; d < kD; d += blockDim.x) {
    float lb = 0.0f, acc = 0.0f;  // lb: every thread the same sum
#pragma unroll 16
    for (int s = 0; s < active; ++s) {
      lb += src[s * (kD + 2) + 1] * w[s];
      acc += src[s * (kD + 2) + 2 + d] * w[s];
    }
    combineStore(out, j, d, acc * (1.0f / lb) MINFER_ATT_COMBINE_Q8_ARGS);
  }
}
#endif
