// Sampler: llama.cpp-order sampling chain over a candidate array, with a xoshiro256** PRNG.
#include "minfer/sampler.h"

#include <algorithm>
#include <cmath>

namespace minfer {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// The candidates' order: logit descending, then id ascending (step 3's and the device top-k's).
constexpr auto higher = [](const auto& a, const auto& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
};

}  // namespace

Xoshiro256::Xoshiro256(uint64_t seed) {
  uint64_t state = seed;
  for (uint64_t& s : s_) s = splitmix64(state);
}

Xoshiro256 Xoshiro256::fromState(uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3) {
  Xoshiro256 g(0);
  g.s_[0] = s0;
  g.s_[1] = s1;
  g.s_[2] = s2;
  g.s_[3] = s3;
  return g;
}

uint64_t Xoshiro256::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Xoshiro256::nextDouble() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

bool samplesArgmax(const SamplerParams& params) {
  return params.temperature <= 0.0f && (params.repeat_penalty == 1.0f || params.repeat_last_n <= 0);
}

Sampler::Sampler(const SamplerParams& params, int32_t n_vocab)
    : params_(params),
      n_vocab_(n_vocab < 1 ? 1 : n_vocab),
      rng_(params.seed),
      candidates_(static_cast<size_t>(n_vocab_)),
      history_(static_cast<size_t>(std::max(params.repeat_last_n, 0))),
      penalized_(static_cast<size_t>(n_vocab_), 0),
      distinct_(history_.size()) {
  heap_.reserve(static_cast<size_t>(std::clamp(params.top_k, 0, n_vocab_)));
}

void Sampler::reset() {
  rng_ = Xoshiro256(params_.seed);
  history_next_ = 0;
  history_size_ = 0;
}

void Sampler::accept(int32_t token) {
  if (history_.empty()) return;
  history_[history_next_] = token;
  history_next_ = (history_next_ + 1) % history_.size();
  history_size_ = std::min(history_size_ + 1, history_.size());
}

namespace {
// A logit as the candidates hold it: NaN counts as −∞.
float candidateLogit(float l) { return std::isnan(l) ? -INFINITY : l; }
}  // namespace

// Step 1's operation on one penalized token's logit (llama.cpp's: divide a positive logit, multiply a negative one).
float Sampler::penalize(float l) const { return l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty; }

int32_t Sampler::sample(std::span<const float> logits) {
  const int32_t n = std::min<int32_t>(n_vocab_, static_cast<int32_t>(logits.size()));
  if (params_.temperature <= 0.0f) return greedy(logits.first(static_cast<size_t>(n)));
  // 1 and 3 (top-k) without the full list where top-k keeps fewer than all.
  if (params_.top_k > 0 && params_.top_k < n)
    return sampleCandidates(selectTopK(logits.first(static_cast<size_t>(n))), /*sorted=*/true);
  // 1. on the whole list, indexed by id (entry i is written after its value is read, so the penalized values
  // forEachValue keeps in later entries are still there); 2. greedy ran above, in greedy(); 3. top-k keeps every
  // candidate here.
  Candidate* cand = candidates_.data();
  forEachValue(logits.first(static_cast<size_t>(n)), [&](int32_t i, float v) { cand[i] = {i, v, 0.0f}; });
  return sampleCandidates(n, /*sorted=*/false);
}

// Step 1, the repetition penalty once per distinct token of the history, without the candidate list (a served step
// of 32 rows of a 152,064-token vocabulary filled 58 MB of candidates): the penalized tokens' values wait in their
// candidates_ entries, marked in penalized_, and one scan reads either those or the logits (NaN as −∞); the marks
// are cleared before returning. The device top-k (kernels/topk.cuh) applies the same float operations.
template <class Visit>
void Sampler::forEachValue(std::span<const float> logits, Visit visit) {
  const std::span<const int32_t> pen = penalizedTokens();
  const int32_t n = static_cast<int32_t>(logits.size());
  if (pen.empty()) {
    for (int32_t i = 0; i < n; ++i) visit(i, candidateLogit(logits[i]));
    return;
  }
  for (const int32_t tok : pen) {
    if (tok >= n) continue;
    candidates_[tok].logit = penalize(candidateLogit(logits[tok]));
    penalized_[tok] = 1;
  }
  for (int32_t i = 0; i < n; ++i) visit(i, penalized_[i] ? candidates_[i].logit : candidateLogit(logits[i]));
  for (const int32_t tok : pen)
    if (tok < n) penalized_[tok] = 0;
}

// Steps 1 and 2 for temperature ≤ 0: the same token as the list would give, the first index of the highest value
// (0 when every value is −∞).
int32_t Sampler::greedy(std::span<const float> logits) {
  // No penalty (penalizedTokens() would be empty): the values are the logits, and NaN never wins either way.
  if (params_.repeat_penalty == 1.0f || history_size_ == 0) return greedyToken(logits);
  int32_t best = 0;
  float best_value = -INFINITY;
  forEachValue(logits, [&](int32_t i, float v) {
    if (v > best_value) best = i, best_value = v;
  });
  return best;
}

// Step 3 as a selection: a heap (std::push_heap with `higher`: its front is the lowest-ranked kept candidate) of
// the k best values so far; the scan runs in id order, so a later value enters only when it is higher than the
// front's. The same k candidates in the same order as std::partial_sort of the whole list (`higher` is a total
// order: ids differ), so the same token; O(n) compares instead of filling and ordering n candidates.
int32_t Sampler::selectTopK(std::span<const float> logits) {
  const size_t k = static_cast<size_t>(params_.top_k);
  heap_.clear();
  forEachValue(logits, [&](int32_t i, float v) {
    if (heap_.size() < k) {
      heap_.push_back({i, v, 0.0f});
      std::push_heap(heap_.begin(), heap_.end(), higher);
    } else if (v > heap_.front().logit) {
      std::pop_heap(heap_.begin(), heap_.end(), higher);
      heap_.back() = {i, v, 0.0f};
      std::push_heap(heap_.begin(), heap_.end(), higher);
    }
  });
  std::sort_heap(heap_.begin(), heap_.end(), higher);
  std::copy(heap_.begin(), heap_.end(), candidates_.begin());
  return static_cast<int32_t>(heap_.size());
}

int32_t Sampler::sampleTopK(std::span<const TokenLogit> top) {
  const int32_t size = static_cast<int32_t>(std::min<size_t>(top.size(), static_cast<size_t>(n_vocab_)));
  if (size == 0) return 0;  // no candidates: the all −∞ row's answer
  Candidate* cand = candidates_.data();
  for (int32_t i = 0; i < size; ++i) cand[i] = {top[i].id, top[i].logit, 0.0f};
  if (params_.temperature <= 0.0f) return cand[0].id;  // step 2 on the list's head: the highest, lowest id
  return sampleCandidates(size, /*sorted=*/true);
}

std::span<const int32_t> Sampler::penalizedTokens() {
  if (params_.repeat_penalty == 1.0f) return {};
  size_t count = 0;
  for (size_t h = 0; h < history_size_; ++h) {
    const int32_t tok = history_[h];
    if (tok < 0 || tok >= n_vocab_ || penalized_[tok]) continue;
    penalized_[tok] = 1;
    distinct_[count++] = tok;
  }
  for (size_t i = 0; i < count; ++i) penalized_[distinct_[i]] = 0;
  return {distinct_.data(), count};
}

int32_t Sampler::sampleCandidates(int32_t size, bool sorted) {
  Candidate* cand = candidates_.data();
  // 4. Top-p over the softmax of the kept logits.
  if (params_.top_p < 1.0f) {
    if (!sorted) std::sort(cand, cand + size, higher);
    sorted = true;
    const float max_l = cand[0].logit;
    if (std::isfinite(max_l)) {
      double sum = 0;
      for (int32_t i = 0; i < size; ++i) sum += std::exp(static_cast<double>(cand[i].logit) - max_l);
      double cum = 0;
      for (int32_t i = 0; i < size; ++i) {
        cum += std::exp(static_cast<double>(cand[i].logit) - max_l) / sum;
        if (cum >= params_.top_p) {
          size = i + 1;
          break;
        }
      }
    }
  }
  // 5. Min-p: logit ≥ max + ln(min_p), order preserved.
  float max_l = -INFINITY;
  for (int32_t i = 0; i < size; ++i) max_l = std::max(max_l, cand[i].logit);
  if (!std::isfinite(max_l)) {  // every candidate is −∞: fall back to the lowest id among them
    int32_t best = 0;
    for (int32_t i = 1; i < size; ++i)
      if (cand[i].id < cand[best].id) best = i;
    return cand[best].id;
  }
  if (params_.min_p > 0.0f) {
    // min_p above 1 would drop every token, the maximum included: it keeps only the maximum instead.
    const float threshold = max_l + std::log(std::min(params_.min_p, 1.0f));
    int32_t kept = 0;
    for (int32_t i = 0; i < size; ++i)
      if (cand[i].logit >= threshold) cand[kept++] = cand[i];
    size = kept;  // ≥ 1: the maximum always passes
  }
  // 6. Temperature and one draw.
  const double inv_t = 1.0 / params_.temperature;
  double sum = 0;
  for (int32_t i = 0; i < size; ++i) {
    cand[i].p = static_cast<float>(std::exp((static_cast<double>(cand[i].logit) - max_l) * inv_t));
    sum += cand[i].p;
  }
  const double u = rng_.nextDouble() * sum;
  double cum = 0;
  for (int32_t i = 0; i < size; ++i) {
    cum += cand[i].p;
    if (u < cum) return cand[i].id;
  }
  return cand[size - 1].id;
}

}  // namespace minfer
