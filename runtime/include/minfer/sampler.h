// Sampler: picks the next token from a row of logits (greedy, temperature, top-k, top-p, min-p,
// repetition penalty), reproducibly from a seed.
//
// Semantics follow llama.cpp's sampler chain (src/llama-sampling.cpp, common/sampling.cpp defaults),
// applied in this order:
//   1. repetition penalty: each distinct token among the last `repeat_last_n` accepted tokens has its
//      logit divided by `repeat_penalty` when > 0, multiplied by it otherwise (CTRL, Keskar et al.
//      2019, as llama.cpp implements it). Off when repeat_penalty == 1 or repeat_last_n == 0.
//   2. temperature ≤ 0 → greedy: the highest (penalized) logit, lowest id on ties. Steps 3–6 skipped.
//   3. top-k: keep the k highest logits (ties broken by lower id). Off when top_k ≤ 0 or ≥ n_vocab.
//   4. top-p (nucleus, Holtzman et al. 2019): softmax over the kept tokens; keep the smallest prefix,
//      highest first, whose probability sum is ≥ top_p (always ≥ 1 token). Off when top_p ≥ 1.
//   5. min-p: keep the tokens whose probability is ≥ min_p × the highest probability (on logits:
//      logit ≥ max + ln(min_p)). Off when min_p ≤ 0.
//   6. temperature: logits / temperature, softmax, one draw from the PRNG.
// Like llama.cpp, top-p and min-p see the distribution before temperature.
//
// PRNG: xoshiro256** (Blackman & Vigna 2018) seeded by splitmix64(seed); a draw is the top 53 bits
// as a double in [0, 1). Same seed + same logits + same accepted tokens → same tokens, on every
// platform (no std:: distributions, whose output is implementation-defined).
//
// Device sampling: a backend that computes steps 1 and 3 on the GPU (the CUDA backend's top-k kernel,
// kernels/topk.cuh) hands the sorted top-k candidates to sampleTopK(), which runs steps 4–6 with the same
// code as sample(): for the same seed, logits and history both give the same token.
//
// Allocation: the constructor allocates n_vocab candidates and the penalty history; sample(),
// sampleTopK(), penalizedTokens() and accept() never allocate. Thread-safety: a Sampler is mutable state; one per generation stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace minfer {

struct SamplerParams {
  float temperature = 0.8f;     // ≤ 0: greedy
  int32_t top_k = 40;           // ≤ 0: off
  float top_p = 0.95f;          // ≥ 1: off
  float min_p = 0.05f;          // ≤ 0: off
  float repeat_penalty = 1.0f;  // 1: off (llama.cpp's default since 2024)
  int32_t repeat_last_n = 64;   // tokens of history the penalty looks at; 0: off
  uint64_t seed = 0x5EED;       // PRNG seed
};

// A sampling candidate: token id and its logit (after the repetition penalty).
struct TokenLogit {
  int32_t id;
  float logit;
};

// True when Sampler::sample gives the row's argmax (highest logit, lowest id on ties, NaN never wins) whatever the
// history: temperature ≤ 0 and the repetition penalty off (repeat_penalty 1 or repeat_last_n ≤ 0). Greedy sampling on
// the device (Session's forwardArgmax, BatchSession::Output::argmax) stands in for sample() exactly then.
bool samplesArgmax(const SamplerParams& params);
// That argmax of `row` (logits): the index of its highest value, the lowest on ties; NaN never wins; 0 when every
// value is −∞ or NaN (and for an empty row). BatchSession::Output::argmax on the host; kernels/argmax.cuh on the GPU.
// Inline: the batch sessions (minfer_batch) take it without the runtime library.
inline int32_t greedyToken(std::span<const float> row) {
  int32_t best = 0;
  float best_value = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < row.size(); ++i)
    if (row[i] > best_value) best = static_cast<int32_t>(i), best_value = row[i];  // NaN compares false: never wins
  return best;
}

// xoshiro256** with splitmix64 seeding.
class Xoshiro256 {
 public:
  // State = four successive splitmix64 outputs starting from `seed` (the authors' recommendation).
  explicit Xoshiro256(uint64_t seed);
  // Explicit state (not all zero), for known-answer tests.
  static Xoshiro256 fromState(uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3);
  uint64_t next();
  double nextDouble();  // uniform in [0, 1), 53 bits

 private:
  uint64_t s_[4];
};

class Sampler {
 public:
  // n_vocab ≥ 1: the length of every logits row passed to sample().
  Sampler(const SamplerParams& params, int32_t n_vocab);

  // The next token for `logits` (n_vocab floats; not modified). Does not record the token: call
  // accept() with the token actually used. NaN logits count as −∞; when every logit is −∞ the
  // result is the greedy one (token 0).
  int32_t sample(std::span<const float> logits);

  // The same token as sample() gives on the full row, from the candidates steps 1–3 leave: `top` holds the
  // k = params().top_k highest penalized logits (NaN as −∞), ordered by logit descending then id ascending
  // (std::partial_sort's order in step 3; k = 1 when temperature ≤ 0: the greedy token is top[0]). Requires
  // 1 ≤ top.size() ≤ n_vocab (candidates past n_vocab are ignored; an empty list gives token 0, as sample() does
  // when every logit is −∞). Runs steps 4–6 (one PRNG draw when temperature > 0).
  int32_t sampleTopK(std::span<const TokenLogit> top);

  // The distinct tokens of the history that step 1 penalizes, in history order (ids in [0, n_vocab)); empty
  // when the penalty is off. Valid until the next call of any member.
  std::span<const int32_t> penalizedTokens();

  // Appends a token (prompt or generated) to the repetition-penalty history.
  void accept(int32_t token);

  // Clears the history and re-seeds the PRNG with params().seed.
  void reset();

  const SamplerParams& params() const { return params_; }

 private:
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };
  float penalize(float logit) const;  // step 1 on one penalized token
  // visit(i, v) for every token i of `logits` in id order, v its value after step 1 (NaN as −∞), without filling
  // the candidate list.
  template <class Visit>
  void forEachValue(std::span<const float> logits, Visit visit);
  // Steps 1 and 2 (temperature ≤ 0) straight from the logits: the repetition penalty, then the argmax.
  int32_t greedy(std::span<const float> logits);
  // Steps 1 and 3 straight from the logits (0 < top_k < the row's length): the k highest values into
  // candidates_[0 .. k) in step 3's order; returns k.
  int32_t selectTopK(std::span<const float> logits);
  // Steps 4–6 on candidates_[0 .. size) (sorted: in step 3's order).
  int32_t sampleCandidates(int32_t size, bool sorted);
  SamplerParams params_;
  int32_t n_vocab_;
  Xoshiro256 rng_;
  std::vector<Candidate> candidates_;  // (n_vocab) scratch
  std::vector<int32_t> history_;       // ring buffer of the last repeat_last_n tokens
  size_t history_next_ = 0;
  size_t history_size_ = 0;
  std::vector<uint8_t> penalized_;     // (n_vocab) scratch: token already penalized this call
  std::vector<int32_t> distinct_;      // (repeat_last_n) scratch: penalizedTokens()
  std::vector<Candidate> heap_;        // (top_k) scratch: selectTopK's k best so far
};

}  // namespace minfer
