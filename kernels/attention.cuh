// Causal grouped-query attention over an f16 KV cache (OpKind Attention): four kernels.
//
// KV cache of one layer: K and V, each (n_ctx, n_head_kv, head_dim) f16, position-major (position p of
// kv head g at element (p·NHEAD_KV + g)·HEAD_DIM), the CPU reference's KvLayer layout in f16.
// For token t at position p = pos0 + t and query head j (kv head g = j / (NHEAD / NHEAD_KV)):
//   s_i = q[t, j]·K[i, g] / sqrt(HEAD_DIM) for i = 0..p;  a = softmax(s);  out[t, j] = Σ_i a_i·V[i, g].
//
// kv_store (ATT_KV_STORE):  K, V rows of the batch (f32) → f16 cache at positions pos0 + t.
//   minfer_kv_store(const float* k, const float* v, uint16_t* kc, uint16_t* vc, const int* pos, int n_tokens)
//   launch: kvStoreLaunch(), one thread per element.
// attn_prefill (ATT_PREFILL): flash-attention-style (Dao et al. 2022) online softmax. A block takes
//   kAttnBQ = 16 query tokens of one query head (4 warps × 4 tokens); keys and values stream through
//   shared memory in tiles of 32 positions (converted to f32), up to the block's last causal position.
//   Scores: lane = key (the K tile is padded to HEAD_DIM + 1 floats per row: conflict-free); output:
//   lane = dimension d, d + 32, … (HEAD_DIM ≤ 256).
//   minfer_attn_prefill(const float* q, const uint16_t* kc, const uint16_t* vc, float* out, const int* pos,
//                       int n_tokens)
//   q, out: n_tokens × NHEAD·HEAD_DIM f32. launch: attnPrefillLaunch(), dynamic shared memory.
// attn_decode (ATT_DECODE): one token, split-KV (flash-decoding): block (head j, split s) reduces the
//   positions [s·chunk, (s+1)·chunk) ∩ [0, kv_len), chunk = ⌈kv_len / SPLITS⌉, kv_len = pos0 + 1 read
//   from device memory, so the grid is fixed and a captured graph stays valid. Writes the partial
//   (max, sum, unnormalized output) to `part`.
//   minfer_attn_decode(const float* q, const uint16_t* kc, const uint16_t* vc, float* part, const int* pos)
//   launch: attnDecodeLaunch(); part: NHEAD × SPLITS × (HEAD_DIM + 2) f32 (attnDecodePartFloats).
// attn_combine (ATT_COMBINE): merges the SPLITS partials of each head: out[j] = Σ_s e^{m_s−M}·o_s / L.
//   minfer_attn_combine(const float* part, float* out)       launch: attnCombineLaunch()
//
// Compile-time constants: ATT_NHEAD, ATT_NHEAD_KV, ATT_HEAD_DIM, ATT_SPLITS (decode/combine) and one of
// ATT_KV_STORE / ATT_PREFILL / ATT_DECODE / ATT_COMBINE = 1.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kAttnBQ = 16;       // query tokens per prefill block
constexpr unsigned kAttnBKV = 32;      // key positions per tile (= warp width: lane = key)
constexpr unsigned kAttnWarps = 4;
constexpr unsigned kKvStoreThreads = 256;

MINFER_HD LaunchShape kvStoreLaunch(unsigned n_tokens, unsigned n_head_kv, unsigned head_dim) {
  LaunchShape s;
  s.grid.x = ceilDiv(n_tokens * n_head_kv * head_dim, kKvStoreThreads);
  s.block.x = kKvStoreThreads;
  return s;
}

MINFER_HD unsigned attnPrefillSmemBytes(unsigned head_dim) {
  return 4u * (kAttnBQ * head_dim + kAttnBKV * (head_dim + 1) + kAttnBKV * head_dim);
}

MINFER_HD LaunchShape attnPrefillLaunch(unsigned n_tokens, unsigned n_head, unsigned head_dim) {
  LaunchShape s;
  s.grid.x = ceilDiv(n_tokens, kAttnBQ);
  s.grid.y = n_head;
  s.block.x = 32 * kAttnWarps;
  s.smem = attnPrefillSmemBytes(head_dim);
  return s;
}

MINFER_HD unsigned long long attnDecodePartFloats(unsigned n_head, unsigned head_dim, unsigned splits) {
  return static_cast<unsigned long long>(n_head) * splits * (head_dim + 2);
}

MINFER_HD LaunchShape attnDecodeLaunch(unsigned n_head, unsigned splits) {
  LaunchShape s;
  s.grid.x = n_head;
  s.grid.y = splits;
  s.block.x = 32 * kAttnWarps;
  return s;
}

MINFER_HD LaunchShape attnCombineLaunch(unsigned n_head) {
  LaunchShape s;
  s.grid.x = n_head;
  s.block.x = 128;
  return s;
}

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(ATT_HEAD_DIM)
namespace minfer::kern::attn {
constexpr int kD = ATT_HEAD_DIM, kH = ATT_NHEAD, kHkv = ATT_NHEAD_KV;
constexpr int kKvW = kHkv * kD;               // cache row: all kv heads of one position
constexpr int kGroup = kH / kHkv;             // query heads per kv head
constexpr int kDL = (kD + 31) / 32;           // output dimensions per lane
static_assert(kH % kHkv == 0, "ATT_NHEAD must be a multiple of ATT_NHEAD_KV");
static_assert(kD <= 256, "ATT_HEAD_DIM must be at most 256");
}  // namespace minfer::kern::attn
#endif

#if defined(MINFER_DEVICE_CODE) && defined(ATT_KV_STORE)
extern "C" __global__ void __launch_bounds__(minfer::kern::kKvStoreThreads)
    minfer_kv_store(const float* __restrict__ k, const float* __restrict__ v, uint16_t* __restrict__ kc,
                    uint16_t* __restrict__ vc, const int* __restrict__ pos, int n_tokens) {
  using namespace minfer::kern;
  const uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<uint64_t>(n_tokens) * attn::kKvW) return;
  const uint64_t dst = static_cast<uint64_t>(pos[0]) * attn::kKvW + i;  // row t lands at position pos0 + t
  kc[dst] = f2h(k[i]);
  vc[dst] = f2h(v[i]);
}
#endif

#if defined(MINFER_DEVICE_CODE) && defined(ATT_PREFILL)
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kAttnWarps)
    minfer_attn_prefill(const float* __restrict__ q, const uint16_t* __restrict__ kc,
                        const uint16_t* __restrict__ vc, float* __restrict__ out, const int* __restrict__ pos,
                        int n_tokens) {
  using namespace minfer::kern;
  using namespace minfer::kern::attn;
  constexpr int kBQ = kAttnBQ, kBKV = kAttnBKV, kRows = kBQ / kAttnWarps;
  extern __shared__ float smem[];
  float* sq = smem;                        // [kBQ][kD]
  float* sk = sq + kBQ * kD;               // [kBKV][kD + 1]
  float* sv = sk + kBKV * (kD + 1);        // [kBKV][kD]

  const int qt0 = blockIdx.x * kBQ, j = blockIdx.y, g = j / kGroup;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pos0 = pos[0];
  const float scale = 1.0f / sqrtf(static_cast<float>(kD));

  for (int e = threadIdx.x; e < kBQ * kD; e += blockDim.x) {
    const int r = e / kD, d = e % kD, t = qt0 + r;
    sq[e] = t < n_tokens ? q[(static_cast<uint64_t>(t) * kH + j) * kD + d] : 0.0f;
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

  for (int kv0 = 0; kv0 < kv_end; kv0 += kBKV) {
    __syncthreads();  // previous tile fully consumed (and sq written, first time)
    for (int e = threadIdx.x; e < kBKV * kD; e += blockDim.x) {
      const int i = e / kD, d = e % kD, p = kv0 + i;
      const bool ok = p < kv_end;
      const uint64_t src = static_cast<uint64_t>(p) * kKvW + g * kD + d;
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
      const bool valid = t < n_tokens && key <= pos0 + t;
      const float sc = valid ? s[r] * scale : -MINFER_INF;
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

#if defined(MINFER_DEVICE_CODE) && defined(ATT_DECODE)
extern "C" __global__ void __launch_bounds__(32 * minfer::kern::kAttnWarps)
    minfer_attn_decode(const float* __restrict__ q, const uint16_t* __restrict__ kc, const uint16_t* __restrict__ vc,
                       float* __restrict__ part, const int* __restrict__ pos) {
  using namespace minfer::kern;
  using namespace minfer::kern::attn;
  constexpr int kSplits = ATT_SPLITS;
  __shared__ float sq[kD];
  __shared__ float wm[kAttnWarps], wl[kAttnWarps];
  __shared__ float wo[kAttnWarps][kD];

  const int j = blockIdx.x, split = blockIdx.y, g = j / kGroup;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kv_len = pos[0] + 1;
  const int chunk = (kv_len + kSplits - 1) / kSplits;
  const int begin = split * chunk, end = min(kv_len, begin + chunk);
  const float scale = 1.0f / sqrtf(static_cast<float>(kD));

  for (int d = threadIdx.x; d < kD; d += blockDim.x) sq[d] = q[static_cast<uint64_t>(j) * kD + d];
  __syncthreads();

  float m = -MINFER_INF, l = 0.0f, o[kDL];
#pragma unroll
  for (int i = 0; i < kDL; ++i) o[i] = 0.0f;
  for (int base = begin + warp * 32; base < end; base += 32 * kAttnWarps) {
    const int key = base + lane;
    const bool valid = key < end;
    float s = 0.0f;
    if (valid) {
      const uint16_t* kr = kc + static_cast<uint64_t>(key) * kKvW + g * kD;
      for (int d = 0; d < kD; ++d) s = fmaf(sq[d], h2f(kr[d]), s);
    }
    const float sc = valid ? s * scale : -MINFER_INF;
    const float m_new = fmaxf(m, warpMax(sc));  // finite: key `base` < end is valid
    const float p = valid ? expf(sc - m_new) : 0.0f;
    const float corr = expf(m - m_new);
    l = l * corr + warpSum(p);
#pragma unroll
    for (int i = 0; i < kDL; ++i) o[i] *= corr;
    const int n_keys = min(32, end - base);
    for (int jj = 0; jj < n_keys; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      const uint16_t* vr = vc + static_cast<uint64_t>(base + jj) * kKvW + g * kD;
#pragma unroll
      for (int i = 0; i < kDL; ++i) {
        const int d = lane + 32 * i;
        if (d < kD) o[i] = fmaf(pj, h2f(vr[d]), o[i]);
      }
    }
    m = m_new;
  }
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kDL; ++i) {
    const int d = lane + 32 * i;
    if (d < kD) wo[warp][d] = o[i];
  }
  __syncthreads();
  float mb = -MINFER_INF;
#pragma unroll
  for (int w = 0; w < static_cast<int>(kAttnWarps); ++w) mb = fmaxf(mb, wm[w]);
  float* dst = part + (static_cast<uint64_t>(j) * kSplits + split) * (kD + 2);
  for (int d = threadIdx.x; d < kD; d += blockDim.x) {
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < static_cast<int>(kAttnWarps); ++w)
      if (wm[w] != -MINFER_INF) acc += wo[w][d] * expf(wm[w] - mb);
    dst[2 + d] = acc;
  }
  if (threadIdx.x == 0) {
    float lb = 0.0f;
#pragma unroll
    for (int w = 0; w < static_cast<int>(kAttnWarps); ++w)
      if (wm[w] != -MINFER_INF) lb += wl[w] * expf(wm[w] - mb);
    dst[0] = mb;  // −inf for an empty split
    dst[1] = lb;
  }
}
#endif

#if defined(MINFER_DEVICE_CODE) && defined(ATT_COMBINE)
extern "C" __global__ void __launch_bounds__(128)
    minfer_attn_combine(const float* __restrict__ part, float* __restrict__ out) {
  using namespace minfer::kern::attn;
  constexpr int kSplits = ATT_SPLITS;
  const int j = blockIdx.x;
  const float* src = part + static_cast<uint64_t>(j) * kSplits * (kD + 2);
  float mb = -MINFER_INF;
  for (int s = 0; s < kSplits; ++s) mb = fmaxf(mb, src[s * (kD + 2)]);
  float lb = 0.0f;
  for (int s = 0; s < kSplits; ++s) {
    const float ms = src[s * (kD + 2)];
    if (ms != -MINFER_INF) lb += src[s * (kD + 2) + 1] * expf(ms - mb);
  }
  const float inv = 1.0f / lb;
  for (int d = threadIdx.x; d < kD; d += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < kSplits; ++s) {
      const float ms = src[s * (kD + 2)];
      if (ms != -MINFER_INF) acc += src[s * (kD + 2) + 2 + d] * expf(ms - mb);
    }
    out[static_cast<uint64_t>(j) * kD + d] = acc * inv;
  }
}
#endif
