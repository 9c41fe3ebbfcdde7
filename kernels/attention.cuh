// Causal grouped-query attention over an f16 KV cache (OpKind Attention): four kernels.
//
// KV cache of one layer: K and V, each (slots, n_head_kv, head_dim) f16, slot-major (position p of kv head g
// at element (slot(p)·NHEAD_KV + g)·HEAD_DIM), the CPU reference's KvLayer layout in f16. slot(p) = p, or
// with ATT_KV_RING = R (a sliding-window layer's ring, schema Step.kv_ring) slot(p) = p % R: the cache has
// min(n_ctx, R) slots and R ≥ ATT_WINDOW + n_tokens − 1, so the keys any query of one call attends to never
// share a slot (the tensor-core prefill's first tile may load older slots below the window, which its window
// mask zeroes).
// For token t at position p = pos0 + t and query head j (kv head g = j / (NHEAD / NHEAD_KV)):
//   s_i = q[t, j]·K[i, g]·scale for i = lo..p;  a = softmax(s);  out[t, j] = Σ_i a_i·V[i, g],
// scale = ATT_SCALE (default 1/sqrt(HEAD_DIM)); with ATT_SOFTCAP = c > 0 (gemma2) s_i = c·tanh(s_i / c)
// before the softmax; lo = 0, or with ATT_WINDOW = W > 0 (sliding window) lo = max(0, p − W + 1).
//
// kv_store (ATT_KV_STORE):  K, V rows of the batch (f32) → f16 cache at the slots of positions pos0 + t.
//   minfer_kv_store(const float* k, const float* v, uint16_t* kc, uint16_t* vc, const int* pos, int n_tokens)
//   launch: kvStoreLaunch(), one thread per element.
// attn_prefill (ATT_PREFILL): flash-attention-style (Dao et al. 2022) online softmax, in one of two forms
//   chosen by the head size (attnPrefillUsesMma):
//   - tensor cores (HEAD_DIM a multiple of 16, at most 256; FlashAttention-2's loop order, Dao 2023):
//     a block takes kAttnMmaBQ = 64 query tokens of one query head, 16 per warp; K and V tiles of
//     attnMmaBKV positions stream through shared memory as f16 (cp.async, double-buffered: tile i + 1 is
//     copied while tile i is multiplied, one barrier per tile; rows padded by 16 bytes for ldmatrix).
//     S = Q·Kᵀ with mma.m16n8k16 (Q rounded to f16 after scaling by log2(e)·scale, f32 accumulation),
//     online softmax in f32 on the accumulator fragments (exp2), P rounded to f16 and O += P·V with
//     mma.m16n8k16 (V fragments by ldmatrix.trans), O in f32.
//     The two f16 roundings (Q, P) are what separates it from the f32 form (tolerance in the tests).
//     Heads ≤ 128: 64-key tiles, each warp's Q fragments held in registers (HEAD_DIM / 4 per lane).
//     Heads > 128 (attnMmaQInSmem; gemma2/gemma3's 256): the O accumulator alone is HEAD_DIM / 2 f32 per
//     lane (128 at 256), so each warp keeps its 16 Q rows in shared memory (after the K/V stages) and
//     re-reads them by ldmatrix per k16 step of every tile, and tiles are 32 keys (16 score registers).
//     At 256: 221 registers, no spills (sm_90), 101,376 bytes of shared memory: two blocks (8 warps) per SM,
//     as at 128 (173 registers; both limited by registers, 128 also by its 69,632 bytes to three).
//     A warp skips the arithmetic of tiles none of its valid tokens sees (exact: their scores are all −inf).
//   - SIMT (other head sizes, ≤ 256): kAttnBQ = 16 query tokens of one query head (4 warps × 4 tokens);
//     keys and values in tiles of 32 positions converted to f32. Scores: lane = key (the K tile is padded
//     to HEAD_DIM + 1 floats per row: conflict-free); output: lane = dimension d, d + 32, ….
//   Both read keys up to the block's last causal position only: a block of query tokens [qt0, qt0 + BQ)
//   loads and multiplies the key tiles up to pos0 + its last token and no further (the causal blocks above
//   the diagonal are skipped, not masked; only the tiles the diagonal crosses are masked), and with a window it
//   starts at the tile holding its first query's first visible key. Grid: (query head, query tile), the
//   tiles in reverse prompt order (attnPrefillQueryTile: the causally heaviest blocks start first).
//   minfer_attn_prefill(const float* q, const uint16_t* kc, const uint16_t* vc, float* out, const int* pos,
//                       int n_tokens)
//   q, out: n_tokens × NHEAD·HEAD_DIM f32. launch: attnPrefillLaunch(), dynamic shared memory.
// attn_decode (ATT_DECODE, one token, split-KV, in a tensor-core and a SIMT form) and attn_combine (ATT_COMBINE):
//   kernels/attention_decode.cuh, included at the end of this file (their launch rules are below).
//
// Column views (format 1.4, phi3's fused q|k|v rows): ATT_K_PITCH / ATT_V_PITCH (kv_store) and ATT_Q_PITCH
// (prefill) are the floats between rows of k, v and q (absent: dense rows, NHEAD_KV·HEAD_DIM and
// NHEAD·HEAD_DIM); the pointers address row 0's first element of the view. The decode kernels read one row.
// Compile-time constants: ATT_NHEAD, ATT_NHEAD_KV, ATT_HEAD_DIM, ATT_SPLITS (decode/combine) and one of
// ATT_KV_STORE / ATT_PREFILL / ATT_DECODE / ATT_COMBINE = 1; optional ATT_SCALE, ATT_SOFTCAP (float
// literals) and ATT_WINDOW (positions) for prefill and decode; ATT_KV_RING (slots) for kv_store, prefill and
// decode of a layer with a ring cache; ATT_PREFILL_SIMT = 1 (tests) the SIMT prefill at any head size;
// ATT_COMBINE_BATCH (tests; default kAttnCombineBatch) the most splits the combine's short-context form takes (0:
// none). A
// window skips the keys before it (whole tiles in prefill; decode splits only the window's positions); the
// f32 reference is cpu::attention.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kAttnBQ = 16;       // query tokens per prefill block
constexpr unsigned kAttnBKV = 32;      // key positions per tile (= warp width: lane = key)
constexpr unsigned kAttnWarps = 4;
// Keys per decode split at least in the SIMT form (decodeSplits): one iteration of the block's warps, two keys each.
constexpr unsigned kAttnDecodeMinKeys = 2 * kAttnWarps;
// The tensor-core decode's key tile (16 keys per warp), also its splits' least number of keys.
constexpr unsigned kAttnDecodeMmaKeys = 64;
// The most non-empty splits attn_combine's short-context form takes, all their loads at once (the general form's
// unroll; up to 64 keys of tg128 on the 7B's 64 splits of the tensor-core form, 1,024 keys at most: BENCHMARKS.md
// 2026-12-02). ATT_COMBINE_BATCH overrides it (tests: 0, the general form only).
constexpr unsigned kAttnCombineBatch = 16;
constexpr unsigned kKvStoreThreads = 256;
constexpr unsigned kAttnMmaBQ = 64;    // query tokens per tensor-core prefill block (16 per warp)

// True when the prefill takes the tensor-core form for this head size.
MINFER_HD constexpr bool attnPrefillUsesMma(unsigned head_dim) { return head_dim % 16 == 0 && head_dim <= 256; }
// Tensor-core prefill, heads above 128: the warp's Q rows live in shared memory (re-read by ldmatrix every key
// tile) instead of registers, and key tiles are 32 positions, so that the 16 × HEAD_DIM f32 accumulator
// (HEAD_DIM / 2 registers per lane) fits beside the scores without spilling.
MINFER_HD constexpr bool attnMmaQInSmem(unsigned head_dim) { return head_dim > 128; }
// Key positions per tensor-core prefill tile.
MINFER_HD constexpr unsigned attnMmaBKV(unsigned head_dim) { return attnMmaQInSmem(head_dim) ? 32 : 64; }

MINFER_HD LaunchRule kvStoreLaunchRule(unsigned n_head_kv, unsigned head_dim) {
  LaunchRule r;
  r.grid[0] = perToken(n_head_kv * head_dim, kKvStoreThreads);
  r.block.x = kKvStoreThreads;
  return r;
}
MINFER_HD LaunchShape kvStoreLaunch(unsigned n_tokens, unsigned n_head_kv, unsigned head_dim) {
  return kvStoreLaunchRule(n_head_kv, head_dim).at(n_tokens);
}

// `simt`: the SIMT form compiled for a head size that would take tensor cores (ATT_PREFILL_SIMT = 1; tests
// and measurements only, the codegen never asks for it).
MINFER_HD unsigned attnPrefillSmemBytes(unsigned head_dim, bool simt = false) {
  // Tensor cores: 2 stages × (K, V) f16 tiles, then (large heads) the block's Q rows in f16.
  if (attnPrefillUsesMma(head_dim) && !simt)
    return 2u * 2u * attnMmaBKV(head_dim) * (head_dim + 8) * 2u +
           (attnMmaQInSmem(head_dim) ? kAttnMmaBQ * (head_dim + 8) * 2u : 0u);
  return 4u * (kAttnBQ * head_dim + kAttnBKV * (head_dim + 1) + kAttnBKV * head_dim);
}

MINFER_HD LaunchRule attnPrefillLaunchRule(unsigned n_head, unsigned head_dim, bool simt = false) {
  LaunchRule r;
  r.grid[0] = fixedExtent(n_head);
  r.grid[1] = perToken(1, attnPrefillUsesMma(head_dim) && !simt ? kAttnMmaBQ : kAttnBQ);
  r.block.x = 32 * kAttnWarps;
  r.smem = attnPrefillSmemBytes(head_dim, simt);
  return r;
}
MINFER_HD LaunchShape attnPrefillLaunch(unsigned n_tokens, unsigned n_head, unsigned head_dim, bool simt = false) {
  return attnPrefillLaunchRule(n_head, head_dim, simt).at(n_tokens);
}

MINFER_HD unsigned long long attnDecodePartFloats(unsigned n_head, unsigned head_dim, unsigned splits) {
  return static_cast<unsigned long long>(n_head) * splits * (head_dim + 2);
}

// True when attn_decode takes the tensor-core form: the group's query heads as the 16 rows of an
// mma.m16n8k16 tile (so at most 16 per kv head), heads a multiple of 16 up to 128 (the output accumulator
// and the Q fragments in registers, as the prefill's register form).
MINFER_HD constexpr bool attnDecodeUsesMma(unsigned head_dim, unsigned group) {
  return head_dim % 16 == 0 && head_dim <= 128 && group <= 16;
}
// Dynamic shared memory of attn_decode: the tensor-core form's two stages of K and V tiles (the prefill's
// tiles of kAttnDecodeMmaKeys positions, rows padded by 16 bytes); none for the SIMT form.
MINFER_HD unsigned attnDecodeSmemBytes(unsigned head_dim, unsigned group) {
  return attnDecodeUsesMma(head_dim, group) ? 2u * 2u * kAttnDecodeMmaKeys * (head_dim + 8) * 2u : 0u;
}

// One block per (kv head, split): the query heads sharing a kv head are done together.
// (4 warps: 8 measured no faster at a depth of 4096 and slower at a short context, BENCHMARKS.md.)
MINFER_HD LaunchRule attnDecodeLaunchRule(unsigned n_head_kv, unsigned splits, unsigned head_dim, unsigned group) {
  LaunchRule r;
  r.grid[0] = fixedExtent(n_head_kv);
  r.grid[1] = fixedExtent(splits);
  r.block.x = 32 * kAttnWarps;
  r.smem = attnDecodeSmemBytes(head_dim, group);
  return r;
}
MINFER_HD LaunchShape attnDecodeLaunch(unsigned n_head_kv, unsigned splits, unsigned head_dim, unsigned group) {
  return attnDecodeLaunchRule(n_head_kv, splits, head_dim, group).at(1);
}

MINFER_HD LaunchRule attnCombineLaunchRule(unsigned n_head) {
  LaunchRule r;
  r.grid[0] = fixedExtent(n_head);
  r.block.x = 128;
  return r;
}
MINFER_HD LaunchShape attnCombineLaunch(unsigned n_head) { return attnCombineLaunchRule(n_head).at(1); }

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(ATT_HEAD_DIM)
namespace minfer::kern::attn {
constexpr int kD = ATT_HEAD_DIM, kH = ATT_NHEAD, kHkv = ATT_NHEAD_KV;
constexpr int kKvW = kHkv * kD;               // cache row: all kv heads of one position
constexpr int kGroup = kH / kHkv;             // query heads per kv head
constexpr int kDL = (kD + 31) / 32;           // output dimensions per lane
#ifdef ATT_Q_PITCH
constexpr uint64_t kQPitch = ATT_Q_PITCH;     // floats between rows of q (a column view)
#else
constexpr uint64_t kQPitch = kH * kD;
#endif
static_assert(kH % kHkv == 0, "ATT_NHEAD must be a multiple of ATT_NHEAD_KV");
static_assert(kD <= 256, "ATT_HEAD_DIM must be at most 256");
#ifdef ATT_SOFTCAP
constexpr float kCap = ATT_SOFTCAP;
#else
constexpr float kCap = 0.0f;
#endif
#ifdef ATT_WINDOW
constexpr int kWindow = ATT_WINDOW;
#else
constexpr int kWindow = 0;
#endif
static_assert(kCap >= 0.0f && kWindow >= 0, "ATT_SOFTCAP and ATT_WINDOW must be ≥ 0");
#ifdef ATT_KV_RING
constexpr int kRing = ATT_KV_RING;  // slots of the ring cache (position p in slot p % kRing)
static_assert(kRing > 0, "ATT_KV_RING must be > 0");
#if !defined(ATT_KV_STORE)
static_assert(kWindow > 0 && kRing >= kWindow, "a ring cache belongs to a sliding-window layer: ATT_KV_RING ≥ ATT_WINDOW > 0");
#endif
#else
constexpr int kRing = 0;  // no ring: position p in slot p
#endif
// First element of the cache row (all kv heads) that holds position p (≥ 0).
__device__ __forceinline__ uint64_t kvRow(int p) {
  return static_cast<uint64_t>(kRing > 0 ? p % kRing : p) * static_cast<uint64_t>(kKvW);
}
// The query scale: ATT_SCALE, else 1/sqrt(HEAD_DIM).
__device__ __forceinline__ float qkScale() {
#ifdef ATT_SCALE
  return ATT_SCALE;
#else
  return 1.0f / sqrtf(static_cast<float>(kD));
#endif
}
// A scaled score s (in units of `unit`: 1, or log2(e) in the tensor-core form) soft-capped:
// c·tanh(s / c) in the same units; s itself without ATT_SOFTCAP.
__device__ __forceinline__ float capScore(float s, float unit) {
  if constexpr (kCap > 0.0f) return (kCap * unit) * tanhf(s * (1.0f / (kCap * unit)));
  return s;
}
// The prefill block's query tile, heaviest first: block (head j, y) takes tile gridDim.y − 1 − y, so that
// blocks start (in order of linear id: x = head fastest) with the last tiles of every head, which read
// the most keys, and end with the first tiles, the lightest (longest-processing-time-first list
// scheduling: the tail of the launch is short blocks; with tiles in prompt order it was the longest).
__device__ __forceinline__ int attnPrefillQueryTile() { return static_cast<int>(gridDim.y - 1 - blockIdx.y); }
// True when the key at position key is inside the window of the query at position qp (≤ qp assumed).
__device__ __forceinline__ bool inWindow(int qp, int key) { return kWindow == 0 || qp - key < kWindow; }
// First key position any query at positions ≥ qp0 can see.
__device__ __forceinline__ int windowStart(int qp0) { return kWindow == 0 ? 0 : max(0, qp0 - kWindow + 1); }
#ifdef ATT_SPLITS
// The split-KV geometry of a decode step whose query is at position kv_len − 1 (attn_decode and
// attn_combine compute it alike from pos): keys [lo, kv_len) in splits of `chunk` keys, at least
// kAttnDecodeMinKeys (the tensor-core form: kAttnDecodeMmaKeys), so that a short context uses fewer, fuller splits
// rather than all SPLITS with one or two keys each; splits [0, active) are non-empty, the rest idle.
struct DecodeSplits {
  int lo, chunk, active;
};
__device__ __forceinline__ DecodeSplits decodeSplits(int kv_len) {
  constexpr int kMinKeys = static_cast<int>(attnDecodeUsesMma(kD, kGroup) ? kAttnDecodeMmaKeys : kAttnDecodeMinKeys);
  const int lo = windowStart(kv_len - 1), n = kv_len - lo;
  const int chunk = max((n + ATT_SPLITS - 1) / ATT_SPLITS, kMinKeys);
  return {lo, chunk, (n + chunk - 1) / chunk};
}
#endif
}  // namespace minfer::kern::attn
// Which prefill form this compilation holds (preprocessor form of attnPrefillUsesMma, checked equal);
// ATT_PREFILL_SIMT = 1 forces the SIMT form (attnPrefillLaunch's `simt`).
#ifndef ATT_PREFILL_SIMT
#define ATT_PREFILL_SIMT 0
#endif
#define MINFER_ATT_PREFILL_MMA (ATT_HEAD_DIM % 16 == 0 && ATT_HEAD_DIM <= 256 && !ATT_PREFILL_SIMT)
static_assert((minfer::kern::attnPrefillUsesMma(ATT_HEAD_DIM) && !ATT_PREFILL_SIMT) == MINFER_ATT_PREFILL_MMA,
              "prefill form predicate");
// Which decode form (preprocessor form of attnDecodeUsesMma, checked equal).
#define MINFER_ATT_DECODE_MMA \
  (ATT_HEAD_DIM % 16 == 0 && ATT_HEAD_DIM <= 128 && ATT_NHEAD / ATT_NHEAD_KV <= 16)
static_assert(minfer::kern::attnDecodeUsesMma(ATT_HEAD_DIM, ATT_NHEAD / ATT_NHEAD_KV) == MINFER_ATT_DECODE_MMA,
              "decode form predicate");
#endif

#if defined(MINFER_DEVICE_CODE) && defined(ATT_KV_STORE)
extern "C" __global__ void __launch_bounds__(minfer::kern::kKvStoreThreads)
    minfer_kv_store(const float* __restrict__ k, const float* __restrict__ v, uint16_t* __restrict__ kc,
                    uint16_t* __restrict__ vc, const int* __restrict__ pos, int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
#ifdef ATT_K_PITCH
  constexpr uint64_t kKPitch = ATT_K_PITCH, kVPitch = ATT_V_PITCH;
#else
  constexpr uint64_t kKPitch = attn::kKvW, kVPitch = attn::kKvW;
#endif
  const uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<uint64_t>(n_tokens) * attn::kKvW) return;
  const uint64_t t = i / attn::kKvW, c = i % attn::kKvW;
  const uint64_t dst = attn::kvRow(pos[0] + static_cast<int>(t)) + c;  // row t lands at position pos0 + t
  kc[dst] = f2h(k[t * kKPitch + c]);
  vc[dst] = f2h(v[t * kVPitch + c]);
}
#endif

#if defined(MINFER_DEVICE_CODE) && defined(ATT_PREFILL) && !MINFER_ATT_PREFILL_MMA
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kAttnWarps)
    minfer_attn_prefill(const float* __restrict__ q, const uint16_t* __restrict__ kc,
                        const uint16_t* __restrict__ vc, float* __restrict__ out, const int* __restrict__ pos,
                        int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  using namespace minfer::kern::attn;
  constexpr int kBQ = kAttnBQ, kBKV = kAttnBKV, kRows = kBQ / kAttnWarps;
  extern __shared__ float smem[];
  float* sq = smem;                        // [kBQ][kD]
  float* sk = sq + kBQ * kD;               // [kBKV][kD + 1]
  float* sv = sk + kBKV * (kD + 1);        // [kBKV][kD]

  const int qt0 = attnPrefillQueryTile() * kBQ, j = blockIdx.x, g = j / kGroup;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pos0 = pos[0];
  const float scale = qkScale();

  for (int e = threadIdx.x; e < kBQ * kD; e += blockDim.x) {
    const int r = e / kD, d = e % kD, t = qt0 + r;
    sq[e] = t < n_tokens ? q[static_cast<uint64_t>(t) * kQPitch + j * kD + d] : 0.0f;
  }
  const int last_t = min(qt0 + kBQ, n_tokens) - 1;
  const int kv_end = pos0 + last_t + 1;  // keys [0, kv_end) are visible to some query of this block

  float m[kRows], l[kRows], o[kRows][kDL];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -MINFER_INF;
    l[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < kDL; ++i) o[r][i] = 0.0f;
  }

  for (int kv0 = windowStart(pos0 + qt0); kv0 < kv_end; kv0 += kBKV) {
    __syncthreads();  // previous tile fully consumed (and sq written, first time)
    for (int e = threadIdx.x; e < kBKV * kD; e += blockDim.x) {
      const int i = e / kD, d = e % kD, p = kv0 + i;
      const bool ok = p < kv_end;
      const uint64_t src = ok ? kvRow(p) + g * kD + d : 0;
      sk[i * (kD + 1) + d] = ok ? h2f(kc[src]) : 0.0f;
      sv[i * kD + d] = ok ? h2f(vc[src]) : 0.0f;
    }
    __syncthreads();

    float s[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = 0.0f;
    for (int d = 0; d < kD; ++d) {
      const float kf = sk[lane * (kD + 1) + d];
#pragma unroll
      for (int r = 0; r < kRows; ++r) s[r] = fmaf(sq[(warp * kRows + r) * kD + d], kf, s[r]);
    }
    const int key = kv0 + lane;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int t = qt0 + warp * kRows + r;
      const bool valid = t < n_tokens && key <= pos0 + t && inWindow(pos0 + t, key);
      const float sc = valid ? capScore(s[r] * scale, 1.0f) : -MINFER_INF;
      const float m_new = fmaxf(m[r], warpMax(sc));
      const float m_use = m_new == -MINFER_INF ? 0.0f : m_new;  // row without any visible key yet
      const float p = valid ? expf(sc - m_use) : 0.0f;
      const float corr = expf(m[r] - m_use);
      l[r] = l[r] * corr + warpSum(p);
#pragma unroll
      for (int i = 0; i < kDL; ++i) o[r][i] *= corr;
      for (int jj = 0; jj < kBKV; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
        for (int i = 0; i < kDL; ++i) {
          const int d = lane + 32 * i;
          if (d < kD) o[r][i] = fmaf(pj, sv[jj * kD + d], o[r][i]);
        }
      }
      m[r] = m_new;
    }
  }

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int t = qt0 + warp * kRows + r;
    if (t >= n_tokens) continue;
    const float inv = 1.0f / l[r];
#pragma unroll
    for (int i = 0; i < kDL; ++i) {
      const int d = lane + 32 * i;
      if (d < kD) out[(static_cast<uint64_t>(t) * kH + j) * kD + d] = o[r][i] * inv;
    }
  }
}
#endif

#if defined(MINFER_DEVICE_CODE) &&                                                             \
    ((defined(ATT_PREFILL) && MINFER_ATT_PREFILL_MMA) || (defined(ATT_DECODE) && MINFER_ATT_DECODE_MMA) || \
     (defined(PA_ATTN) && MINFER_ATT_DECODE_MMA))
namespace minfer::kern::attn {
constexpr int kBQ = kAttnMmaBQ, kBKV = attnMmaBKV(kD);
#if defined(ATT_DECODE) || defined(PA_ATTN)
static_assert(kBKV == static_cast<int>(kAttnDecodeMmaKeys), "the decode's key tile is the prefill's");
#endif
constexpr bool kQSmem = attnMmaQInSmem(kD);  // Q rows in shared memory (after the K/V stages), not registers
constexpr int kLDH = kD + 8;        // smem row pitch in halves (16 bytes of padding: ldmatrix rows hit distinct banks)
constexpr int kTileH = kBKV * kLDH;  // halves per K or V tile
constexpr int kKS = kD / 16;         // k16 steps over the head dimension
constexpr int kDT = kD / 8;          // n8 tiles of the output (dimensions)
constexpr int kNT = kBKV / 8;        // n8 tiles of the scores (positions)

__device__ __forceinline__ unsigned packHalf2(float lo, float hi) {
  return static_cast<unsigned>(f2h(lo)) | (static_cast<unsigned>(f2h(hi)) << 16);
}
// ldmatrix of four 8×8 f16 matrices (lanes 8q..8q+7 address the rows of matrix q); .trans gives each
// lane the column-major view (elements of rows 2t, 2t+1 in column g).
__device__ __forceinline__ void ldsmX4(unsigned r[4], const uint16_t* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsmX4T(unsigned r[4], const uint16_t* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// Copies positions [kv0, kv0 + BKV) of kv head g into a K and a V tile (rows past kv_end zero-filled); row_of(p) is
// the first element of the cache row holding position p (kvRow, or a paged sequence's slot).
template <class RowOf>
__device__ __forceinline__ void loadKvTileAt(uint16_t* sk, uint16_t* sv, const uint16_t* kc, const uint16_t* vc, int kv0,
                                             int kv_end, int g, RowOf row_of) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < kBKV * kChunks; c += 32 * kAttnWarps) {
    const int i = c / kChunks, col = (c % kChunks) * 8, p = kv0 + i;
    const bool ok = p < kv_end;
    const uint64_t src = ok ? row_of(p) + g * kD + col : 0;
    cpAsync<16>(sk + i * kLDH + col, kc + src, ok);
    cpAsync<16>(sv + i * kLDH + col, vc + src, ok);
  }
}
__device__ __forceinline__ void loadKvTile(uint16_t* sk, uint16_t* sv, const uint16_t* kc, const uint16_t* vc,
                                           int kv0, int kv_end, int g) {
  loadKvTileAt(sk, sv, kc, vc, kv0, kv_end, g, [](int p) { return kvRow(p); });
}

// S = Q·Kᵀ for kTiles n8 tiles of keys (rows of sk, kLDH halves apart) with the Q fragments held in registers
// (qf: the A fragments of the k16 steps over the head dimension): K fragments by ldmatrix x4 = (keys nt·8..,
// dims ks·16 + 0/8/16/24); an odd last k16 step alone (matrices 2, 3 re-read 0, 1). s is overwritten.
template <int kTiles, int kSteps>
__device__ __forceinline__ void scoresQK(float (&s)[kTiles][4], const unsigned (&qf)[kSteps][4], const uint16_t* sk,
                                         int r8, int mq) {
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kSteps; ks += 2) {
      unsigned b[4];
      if (ks + 1 < kSteps) {
        ldsmX4(b, sk + (nt * 8 + r8) * kLDH + ks * 16 + mq * 8);
        mmaF16(s[nt], qf[ks], b[0], b[1]);
        mmaF16(s[nt], qf[ks + 1], b[2], b[3]);
      } else {
        ldsmX4(b, sk + (nt * 8 + r8) * kLDH + ks * 16 + (mq % 2) * 8);
        mmaF16(s[nt], qf[ks], b[0], b[1]);
      }
    }
  }
}

// O += P·V for one k16 step of keys: pa = P's accumulator fragments of two n8 tiles (rounded to f16), the A
// fragment; V fragments by ldmatrix.trans from sv (the step's first key row): x4 = (keys 0/8, dims (dt + 0/1)·8).
__device__ __forceinline__ void accumulatePV(float (&o)[kDT][4], const unsigned (&pa)[4], const uint16_t* sv, int r8,
                                             int mq) {
#pragma unroll
  for (int dt = 0; dt < kDT; dt += 2) {
    unsigned b[4];
    ldsmX4T(b, sv + ((mq % 2) * 8 + r8) * kLDH + (dt + mq / 2) * 8);
    mmaF16(o[dt], pa, b[0], b[1]);
    mmaF16(o[dt + 1], pa, b[2], b[3]);
  }
}
// One online-softmax step (FlashAttention-2) of the rows gr and gr + 8 of this thread's fragments (h = 0, 1) over
// kTiles n8 tiles of scores in log2 units, already soft-capped and masked (−inf): the row maxima over the tile and
// m_run (the 4 lanes of a row group hold its 2·kTiles scores), s becomes P = 2^(s − m), l_run and m_run advance,
// and o is rescaled by 2^(m_old − m). A row without any visible key yet keeps m = −inf and P = 0.
template <int kTiles>
__device__ __forceinline__ void softmaxStep(float (&s)[kTiles][4], float (&m_run)[2], float (&l_run)[2],
                                            float (&o)[kDT][4]) {
  float corr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = m_run[h];
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) mx = fmaxf(mx, fmaxf(s[nt][h * 2], s[nt][h * 2 + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_use = mx == -MINFER_INF ? 0.0f : mx;
    corr[h] = exp2f(m_run[h] - m_use);
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float& v = s[nt][h * 2 + c];
        v = exp2f(v - m_use);
        sum += v;
      }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    l_run[h] = l_run[h] * corr[h] + sum;
    m_run[h] = mx;
  }
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
    o[dt][0] *= corr[0];
    o[dt][1] *= corr[0];
    o[dt][2] *= corr[1];
    o[dt][3] *= corr[1];
  }
}
// P's accumulator fragments of n8 tiles t and t + 1 as the A fragment of a k16 step (f16).
__device__ __forceinline__ void packP(unsigned (&pa)[4], const float (&t0)[4], const float (&t1)[4]) {
  pa[0] = packHalf2(t0[0], t0[1]);
  pa[1] = packHalf2(t0[2], t0[3]);
  pa[2] = packHalf2(t1[0], t1[1]);
  pa[3] = packHalf2(t1[2], t1[3]);
}
}  // namespace minfer::kern::attn
#endif

#if defined(MINFER_DEVICE_CODE) && defined(ATT_PREFILL) && MINFER_ATT_PREFILL_MMA
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kAttnWarps)
    minfer_attn_prefill(const float* __restrict__ q, const uint16_t* __restrict__ kc,
                        const uint16_t* __restrict__ vc, float* __restrict__ out, const int* __restrict__ pos,
                        int n_tokens) {
  minfer::kern::overlapPrologue();
  using namespace minfer::kern;
  using namespace minfer::kern::attn;
  // [2 stages][K tile, V tile], then (kQSmem) [4 warps][16 rows][kLDH] of Q
  extern __shared__ __align__(16) uint16_t smem_h[];

  const int qt0 = attnPrefillQueryTile() * kBQ, j = blockIdx.x, g = j / kGroup;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gr = lane / 4, t4 = lane % 4;  // fragment row group and column pair
  const int pos0 = pos[0];
  const int last_t = min(qt0 + kBQ, n_tokens) - 1;
  const int kv_end = pos0 + last_t + 1;  // keys [0, kv_end) are visible to some query of this block
  const int n_tiles = (kv_end + kBKV - 1) / kBKV;
  const int first_tile = windowStart(pos0 + qt0) / kBKV;  // tiles wholly before every query's window: skipped
  // Keys [warp_lo, warp_hi) are the only ones this warp's valid tokens see (none when all its 16 rows are past
  // n_tokens): a tile outside them it skips (barriers and copies kept). That is exact: every score of such a
  // tile would be −inf, leaving m, l and O as they were.
  const int warp_t0 = qt0 + warp * 16, warp_last = min(warp_t0 + 15, n_tokens - 1);
  const int warp_lo = windowStart(pos0 + warp_t0), warp_hi = warp_last < warp_t0 ? 0 : pos0 + warp_last + 1;

  loadKvTile(smem_h, smem_h + kTileH, kc, vc, first_tile * kBKV, kv_end, g);
  cpAsyncCommit();

  // This warp's 16 query tokens (rows gr and gr + 8 of its fragments), scaled by log2(e)·scale, as f16:
  // A fragments in registers, or (kQSmem) the warp's own 16 rows of shared memory, which only it reads.
  constexpr float kLog2e = 1.4426950408889634f;
  const float qscale = kLog2e * qkScale();
  const int t_lo = qt0 + warp * 16 + gr, t_hi = t_lo + 8;  // this thread's two query tokens
  unsigned qf[kQSmem ? 1 : kKS][4];
  uint16_t* const sq = smem_h + 4 * kTileH + warp * 16 * kLDH;  // kQSmem: [16][kLDH] halves
  if constexpr (kQSmem) {
    for (int e = lane; e < 16 * (kD / 2); e += 32) {  // a warp reads whole rows: coalesced
      const int r = e / (kD / 2), d = 2 * (e % (kD / 2)), tok = qt0 + warp * 16 + r;
      float2 v = make_float2(0.0f, 0.0f);
      if (tok < n_tokens) v = *reinterpret_cast<const float2*>(q + static_cast<uint64_t>(tok) * kQPitch + j * kD + d);
      *reinterpret_cast<unsigned*>(sq + r * kLDH + d) = packHalf2(v.x * qscale, v.y * qscale);
    }
    __syncwarp();
  } else {
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int tok = (r % 2) ? t_hi : t_lo, d = ks * 16 + (r / 2) * 8 + 2 * t4;
        float2 v = make_float2(0.0f, 0.0f);
        if (tok < n_tokens) v = *reinterpret_cast<const float2*>(q + static_cast<uint64_t>(tok) * kQPitch + j * kD + d);
        qf[ks][r] = packHalf2(v.x * qscale, v.y * qscale);
      }
  }

  float o[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
  float m_run[2] = {-MINFER_INF, -MINFER_INF}, l_run[2] = {0.0f, 0.0f};
  const int qpos[2] = {pos0 + t_lo, pos0 + t_hi};  // last visible key position of each row
  const int mq = lane / 8, r8 = lane % 8;        // ldmatrix: matrix and row of this lane's address

  for (int it = first_tile; it < n_tiles; ++it) {
    const int kv0 = it * kBKV, stage = (it - first_tile) & 1;
    // One barrier per tile: past it, this tile's copies (each thread's own waited for) are visible to all, and
    // every warp has finished tile it − 1, so its stage can take tile it + 1, whose copies then overlap this
    // tile's arithmetic.
    cpAsyncWait<0>();
    __syncthreads();
    if (it + 1 < n_tiles) {
      uint16_t* nb = smem_h + (stage ^ 1) * 2 * kTileH;
      loadKvTile(nb, nb + kTileH, kc, vc, kv0 + kBKV, kv_end, g);
    }
    cpAsyncCommit();
    if (kv0 >= warp_hi || kv0 + kBKV <= warp_lo) continue;
    const uint16_t* sk = smem_h + stage * 2 * kTileH;
    const uint16_t* sv = sk + kTileH;

    // S = Q·Kᵀ: 16 × BKV per warp.
    float s[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    if constexpr (kQSmem) {
      // Per k16 step: the A fragment by ldmatrix x4 = (rows 0/8, dims ks·16 + 0/8), then K fragments x4 =
      // (positions (nt + 0/1)·8.., dims ks·16 + 0/8) for two n8 tiles at a time.
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks) {
        unsigned a[4];
        ldsmX4(a, sq + ((mq % 2) * 8 + r8) * kLDH + ks * 16 + (mq / 2) * 8);
#pragma unroll
        for (int nt = 0; nt < kNT; nt += 2) {
          unsigned b[4];
          ldsmX4(b, sk + ((nt + mq / 2) * 8 + r8) * kLDH + ks * 16 + (mq % 2) * 8);
          mmaF16(s[nt], a, b[0], b[1]);
          mmaF16(s[nt + 1], a, b[2], b[3]);
        }
      }
    } else {
      scoresQK(s, qf, sk, r8, mq);  // Q fragments held
    }

    // Causal mask (only tiles that reach past the first query's position need it), then the online softmax.
    const bool needs_mask = kv0 + kBKV - 1 > pos0 + qt0 + warp * 16 || kv0 + kBKV > kv_end || kWindow > 0;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float& v = s[nt][h * 2 + c];
          v = capScore(v, kLog2e);
          const int key = kv0 + nt * 8 + 2 * t4 + c;
          if (needs_mask && (key > qpos[h] || !inWindow(qpos[h], key))) v = -MINFER_INF;
        }
    softmaxStep(s, m_run, l_run, o);

    // O += P·V: P's accumulator fragments of n-tiles 2kk, 2kk+1 are the A fragment of k-step kk.
    // V fragments by ldmatrix.trans: x4 = (positions kk·16 + 0/8, dims (dt + 0/1)·8).
#pragma unroll
    for (int kk = 0; kk < kBKV / 16; ++kk) {
      unsigned pa[4];
      packP(pa, s[2 * kk], s[2 * kk + 1]);
      accumulatePV(o, pa, sv + kk * 16 * kLDH, r8, mq);
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int tok = h ? t_hi : t_lo;
    if (tok >= n_tokens) continue;
    const float inv = 1.0f / l_run[h];
    float* dst = out + (static_cast<uint64_t>(tok) * kH + j) * kD + 2 * t4;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
      *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][h * 2] * inv, o[dt][h * 2 + 1] * inv);
  }
}
#endif

// The decode forms and the combine (device code; the launch rules above).
#include "kernels/attention_decode.cuh"
