// Top-k sampling candidates on the device: the K highest (id, logit) pairs of one row of logits after the
// repetition penalty, so a sampled decode step copies K pairs back instead of the whole logits row and the
// host runs only the sampler's steps after top-k (runtime/include/minfer/sampler.h steps 4–6).
//
// What it computes, exactly as Sampler::sample steps 1 and 3 (runtime/sampler.cpp):
//   v_i = logits[i], NaN read as −∞; for each id in the request's penalized list (distinct ids, the
//   repetition penalty's history): v_id = v_id > 0 ? v_id / penalty : v_id · penalty (IEEE division and
//   multiplication, rounded to nearest, as the host's float ops); then the k pairs (i, v_i) that
//   std::partial_sort leaves first under "logit desc, then id asc". The pairs come back in that order.
//   −0 comes back as +0 (the two compare equal, and every later step gives the same result for both).
//
// Algorithm: bitonic top-k (Shanbhag, Pirk, Madden, "Efficient Top-K Query Processing on Massively Parallel
// Hardware", SIGMOD 2018; the same rebuild-by-max step as FAISS's WarpSelect merge). Each (logit, id) pair is
// one 64-bit key whose unsigned order is the sampler's order (topkKey). With kp = k rounded up to a power of
// two, a block
//   1. loads kTopKChunk keys of the row (the penalty applied to the ids of its range), bitonic-sorts every run
//      of kp keys descending,
//   2. halves the runs until one is left: run s and run s + half combine as max(a[j], b[kp−1−j]) (a bitonic
//      sequence that holds the top kp of both), then a bitonic merge sorts it again (log2 kp + 1 stages);
//   3. writes its top kp keys to the scratch and counts itself done in the counter word; the last block to
//      finish (the threadFenceReduction pattern of the CUDA samples) loads the blocks' lists into its runs,
//      kTopKChunk / kp at a time, and reduces them the same way, then writes the k pairs and re-zeroes the word.
// Cost on n_vocab 152,064 (k ≤ 64): 38 blocks each read 16 KB once and run ~63 synchronized stages of two
// compare-exchanges per thread; the last block one more reduction of ≤ 64 lists. Bytes moved: the row
// (608 KB) once, 38 · kp · 8 bytes of scratch, and K · 8 bytes back to the host.
//
// Compile-time constants: TK_N (row width, n_vocab).
// Launch ABI:  minfer_topk(const float* logits, TopKSlot* slot, unsigned long long* scratch, unsigned* counters)
//   logits: one row of TK_N f32 (the runtime points it at the last token's row); slot: the session's
//   request (k, penalty, penalized ids; read) and result (out; written); scratch: topkScratchBytes(TK_N)
//   bytes; counters: one word, zero at the start, left zero.
// Launch shape: topkLaunchRule(TK_N): ⌈TK_N / kTopKChunk⌉ blocks of kTopKThreads threads, whatever n_tokens.
#pragma once

#include "kernels/common.cuh"

namespace minfer::kern {

constexpr unsigned kTopKMax = 256;             // the largest k a request may ask for
constexpr unsigned kTopKMaxPenalized = 1024;   // the most distinct penalized ids a request may carry
constexpr unsigned kTopKChunk = 4096;          // logits per block (its 64-bit keys: 32 KiB of shared memory)
constexpr unsigned kTopKThreads = 1024;        // threads per block: four keys of the chunk each

// One candidate of the result: token id and its penalized logit.
struct TopKPair {
  int32_t id;
  float logit;
};
static_assert(sizeof(TopKPair) == 8, "TopKPair is 8 bytes");

// The session's device slot (schema ArgKind TopK): the host writes the request (k, repeat_penalty,
// n_penalized and penalized[0 .. n_penalized)) before each launch and reads out[0 .. k) after it.
struct TopKSlot {
  int32_t k;                            // 1 ≤ k ≤ min(kTopKMax, TK_N); clamped into that range
  float repeat_penalty;                 // applied to the penalized ids (> 0; 1 with n_penalized 0: none)
  int32_t n_penalized;                  // 0 … kTopKMaxPenalized (clamped)
  int32_t reserved;                     // 0
  int32_t penalized[kTopKMaxPenalized]; // distinct token ids; ids outside [0, TK_N) are ignored
  TopKPair out[kTopKMax];               // the k highest pairs, logit desc then id asc
};
static_assert(sizeof(TopKSlot) == 16 + 4 * kTopKMaxPenalized + 8 * kTopKMax, "TopKSlot has no padding");
constexpr unsigned kTopKRequestHeader = 16;  // bytes of TopKSlot before `penalized`

MINFER_HD unsigned topkBlocks(unsigned n_vocab) { return ceilDiv(n_vocab, kTopKChunk); }
// The per-block lists (kTopKMax keys of 8 bytes each) the last block merges.
MINFER_HD unsigned long long topkScratchBytes(unsigned n_vocab) {
  return static_cast<unsigned long long>(topkBlocks(n_vocab)) * kTopKMax * 8;
}
constexpr unsigned kTopKCounterBytes = 4;

// One row per launch: a fixed grid.
MINFER_HD LaunchRule topkLaunchRule(unsigned n_vocab) {
  LaunchRule r;
  r.grid[0] = fixedExtent(topkBlocks(n_vocab));
  r.block.x = kTopKThreads;
  return r;
}
MINFER_HD LaunchShape topkLaunch(unsigned n_vocab) { return topkLaunchRule(n_vocab).at(1); }

}  // namespace minfer::kern

#if defined(MINFER_DEVICE_CODE) && defined(TK_N)
namespace minfer::kern::topk_detail {

// A 64-bit key whose unsigned order is "logit desc, then id asc" read from the top: the logit's bits made
// monotonic (sign flipped for positives, all bits flipped for negatives; −0 first turned into +0, which it
// equals), then 0xFFFFFFFF − id. Every real key is above 0, the padding key.
__device__ __forceinline__ unsigned long long key(float v, unsigned id) {
  if (v == 0.0f) v = 0.0f;
  const unsigned u = __float_as_uint(v);
  const unsigned ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(ord) << 32) | (0xFFFFFFFFu - id);
}
__device__ __forceinline__ unsigned keyId(unsigned long long k) { return 0xFFFFFFFFu - static_cast<unsigned>(k); }
__device__ __forceinline__ float keyLogit(unsigned long long k) {
  const unsigned ord = static_cast<unsigned>(k >> 32);
  return __uint_as_float((ord & 0x80000000u) ? (ord & 0x7FFFFFFFu) : ~ord);
}

// Sampler::sample step 1 on one logit: NaN → −∞, then the penalty with round-to-nearest division or product.
__device__ __forceinline__ float penalized(float v, float penalty) {
  if (v != v) v = -MINFER_INF;
  return v > 0.0f ? __fdiv_rn(v, penalty) : __fmul_rn(v, penalty);
}

// Sorts every run of kp keys (a power of two dividing kTopKChunk) descending: bitonic sort, all runs at once.
__device__ void sortRuns(unsigned long long* keys, unsigned kp) {
  for (unsigned size = 2; size <= kp; size <<= 1)
    for (unsigned j = size >> 1; j > 0; j >>= 1) {
      for (unsigned i = threadIdx.x; i < kTopKChunk / 2; i += kTopKThreads) {
        const unsigned lo = 2 * j * (i / j) + (i % j), hi = lo + j;
        const bool desc = size == kp || (lo & size) == 0;  // the last merge of each run: descending
        const unsigned long long a = keys[lo], b = keys[hi];
        if ((a < b) == desc) {
          keys[lo] = b;
          keys[hi] = a;
        }
      }
      __syncthreads();
    }
}

// Runs 0 .. runs−1 of kp keys, each sorted descending → run 0 holds the top kp of them all, sorted. Each
// level pairs run s with run s + half: max(a[j], b[kp−1−j]) is bitonic and holds the top kp of both, and a
// bitonic merge sorts it. runs is a power of two.
__device__ void reduceRuns(unsigned long long* keys, unsigned runs, unsigned kp) {
  for (unsigned half = runs / 2; half > 0; half /= 2) {
    for (unsigned i = threadIdx.x; i < half * kp; i += kTopKThreads) {
      const unsigned s = i / kp, j = i % kp;
      const unsigned long long a = keys[s * kp + j], b = keys[(s + half) * kp + kp - 1 - j];
      keys[s * kp + j] = a > b ? a : b;
    }
    __syncthreads();
    for (unsigned j = kp / 2; j > 0; j >>= 1) {
      for (unsigned i = threadIdx.x; i < half * kp / 2; i += kTopKThreads) {
        const unsigned s = i / (kp / 2), r = i % (kp / 2);
        const unsigned lo = s * kp + 2 * j * (r / j) + (r % j), hi = lo + j;
        const unsigned long long a = keys[lo], b = keys[hi];
        if (a < b) {
          keys[lo] = b;
          keys[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace minfer::kern::topk_detail

extern "C" __global__ void __launch_bounds__(minfer::kern::kTopKThreads)
    minfer_topk(const float* __restrict__ logits, minfer::kern::TopKSlot* __restrict__ slot,
                unsigned long long* __restrict__ scratch, unsigned* __restrict__ counters) {
  using namespace minfer::kern;
  using namespace minfer::kern::topk_detail;
  overlapPrologue();
  __shared__ unsigned long long keys[kTopKChunk];
  __shared__ bool last;
  const unsigned k_max = kTopKMax < TK_N ? kTopKMax : TK_N;
  const unsigned k_asked = slot->k < 1 ? 1u : static_cast<unsigned>(slot->k);
  const unsigned k = k_asked < k_max ? k_asked : k_max;
  unsigned kp = 1;
  while (kp < k) kp <<= 1;
  const float penalty = slot->repeat_penalty;
  const int n_pen = min(max(slot->n_penalized, 0), static_cast<int>(kTopKMaxPenalized));

  // 1. This block's range, penalized, as keys; the positions past the row are padding (key 0).
  const unsigned c0 = blockIdx.x * kTopKChunk;
  for (unsigned i = threadIdx.x; i < kTopKChunk; i += kTopKThreads) {
    float v = c0 + i < TK_N ? logits[c0 + i] : 0.0f;
    if (v != v) v = -MINFER_INF;
    keys[i] = c0 + i < TK_N ? key(v, c0 + i) : 0ull;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < n_pen; p += kTopKThreads) {  // distinct ids: no two threads write one key
    const int id = slot->penalized[p];
    if (id >= static_cast<int>(c0) && id < static_cast<int>(c0 + kTopKChunk) && id < static_cast<int>(TK_N))
      keys[id - c0] = key(penalized(logits[id], penalty), static_cast<unsigned>(id));
  }
  __syncthreads();
  // 2. The block's top kp, sorted, into run 0; then to the scratch.
  sortRuns(keys, kp);
  reduceRuns(keys, kTopKChunk / kp, kp);
  for (unsigned i = threadIdx.x; i < kp; i += kTopKThreads) scratch[blockIdx.x * kTopKMax + i] = keys[i];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counters, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  // 3. The last block: every block's list (read from L2: other SMs wrote them), kTopKChunk / kp lists a round,
  // run 0 carrying the best so far from one round to the next.
  if (threadIdx.x == 0) counters[0] = 0;
  const unsigned runs = kTopKChunk / kp;
  for (unsigned next = 0, first = 1; next < gridDim.x; first = 0) {
    const unsigned from_run = first ? 0 : 1;
    for (unsigned i = threadIdx.x; i < (runs - from_run) * kp; i += kTopKThreads) {
      const unsigned list = next + i / kp;
      keys[from_run * kp + i] = list < gridDim.x ? __ldcg(&scratch[list * kTopKMax + i % kp]) : 0ull;
    }
    next += runs - from_run;
    __syncthreads();
    reduceRuns(keys, runs, kp);
  }
  for (unsigned i = threadIdx.x; i < k; i += kTopKThreads) {
    slot->out[i].id = static_cast<int32_t>(keyId(keys[i]));
    slot->out[i].logit = keyLogit(keys[i]);
  }
}
#endif
