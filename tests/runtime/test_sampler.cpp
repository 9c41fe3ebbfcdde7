// Sampler: PRNG known answers, greedy and its equivalents, each filter's support, distributions with
// fixed seeds, repetition penalty semantics (llama.cpp), reproducibility; sampleTopK (the device top-k's
// host half) against sample().
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "minfer/sampler.h"

namespace minfer {
namespace {

SamplerParams plain(float temperature) {
  SamplerParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.repeat_penalty = 1.0f;
  return p;
}

std::vector<float> logitsOf(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

// Frequencies of n draws.
std::map<int32_t, int> draw(Sampler& s, const std::vector<float>& logits, int n) {
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) ++counts[s.sample(logits)];
  return counts;
}

// |observed − expected| within 5 standard deviations of a binomial count.
void checkFrequency(int observed, int n, double p) {
  const double mean = n * p, sd = std::sqrt(n * p * (1 - p));
  CAPTURE(observed);
  CAPTURE(mean);
  CHECK(std::fabs(observed - mean) <= 5 * sd + 1);
}

TEST_CASE("xoshiro256** and splitmix64 seeding match the reference algorithms") {
  // Known answers computed from the published algorithms (Blackman & Vigna), independently of this code.
  Xoshiro256 g = Xoshiro256::fromState(1, 2, 3, 4);
  CHECK(g.next() == 11520ull);
  CHECK(g.next() == 0ull);
  CHECK(g.next() == 1509978240ull);
  CHECK(g.next() == 1215971899390074240ull);
  // Seed 0: state = splitmix64 outputs 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, …
  CHECK(Xoshiro256(0).next() == 0x99ec5f36cb75f2b4ull);
  Xoshiro256 u(7);
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    const double x = u.nextDouble();
    REQUIRE(x >= 0.0);
    REQUIRE(x < 1.0);
    sum += x;
  }
  CHECK(std::fabs(sum / 10000 - 0.5) < 0.02);
}

TEST_CASE("greedy: temperature 0 takes the highest logit, lowest id on ties") {
  Sampler s(plain(0.0f), 6);
  CHECK(s.sample(std::vector<float>{0.1f, 2.0f, -1.0f, 2.5f, 2.5f, 0.0f}) == 3);
  CHECK(s.sample(std::vector<float>{-3.0f, -2.0f, -2.0f, -5.0f, -9.0f, -2.5f}) == 1);
  SamplerParams neg = plain(-1.0f);
  Sampler s2(neg, 3);
  CHECK(s2.sample(std::vector<float>{0.0f, 1.0f, 0.5f}) == 1);
  // NaN counts as −∞.
  CHECK(s.sample(std::vector<float>{NAN, 0.0f, -1.0f, NAN, -2.0f, -3.0f}) == 1);
}

TEST_CASE("top-k 1, a tiny top-p and min-p ≥ 1 are greedy at any temperature") {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> logits(97);
    for (float& l : logits) l = normal(rng);
    Sampler greedy(plain(0.0f), 97);
    const int32_t best = greedy.sample(logits);
    SamplerParams k1 = plain(1.5f);
    k1.top_k = 1;
    k1.seed = trial;
    SamplerParams p0 = plain(1.5f);
    p0.top_p = 1e-6f;
    p0.seed = trial;
    // min-p ≥ 1 keeps only the maximum (above 1 it would otherwise keep nothing at all).
    SamplerParams m5 = plain(1.5f);
    m5.min_p = 5.0f;
    m5.seed = trial;
    Sampler a(k1, 97), b(p0, 97), c(m5, 97);
    CHECK(a.sample(logits) == best);
    CHECK(b.sample(logits) == best);
    CHECK(c.sample(logits) == best);
  }
}

TEST_CASE("temperature sampling follows softmax(logits / T)") {
  const std::vector<double> probs = {0.5, 0.25, 0.15, 0.1};
  const std::vector<float> logits = logitsOf(probs);
  const int n = 20000;
  {
    Sampler s(plain(1.0f), 4);
    const auto counts = draw(s, logits, n);
    for (int i = 0; i < 4; ++i) checkFrequency(counts.count(i) ? counts.at(i) : 0, n, probs[i]);
  }
  {
    // T = 0.5: p_i ∝ probs_i².
    Sampler s(plain(0.5f), 4);
    const auto counts = draw(s, logits, n);
    double z = 0;
    for (double p : probs) z += p * p;
    for (int i = 0; i < 4; ++i) checkFrequency(counts.count(i) ? counts.at(i) : 0, n, probs[i] * probs[i] / z);
  }
}

TEST_CASE("top-k, top-p and min-p restrict the support and renormalize") {
  const std::vector<double> probs = {0.05, 0.5, 0.15, 0.3};  // sorted: 1 (0.5), 3 (0.3), 2 (0.15), 0 (0.05)
  const std::vector<float> logits = logitsOf(probs);
  const int n = 20000;
  SUBCASE("top-k 2 keeps tokens 1 and 3 in ratio 5:3") {
    SamplerParams p = plain(1.0f);
    p.top_k = 2;
    Sampler s(p, 4);
    const auto counts = draw(s, logits, n);
    CHECK(counts.size() == 2);
    checkFrequency(counts.at(1), n, 0.5 / 0.8);
    checkFrequency(counts.at(3), n, 0.3 / 0.8);
  }
  SUBCASE("top-p 0.75 keeps the smallest prefix reaching 0.75: tokens 1 and 3") {
    SamplerParams p = plain(1.0f);
    p.top_p = 0.75f;
    Sampler s(p, 4);
    const auto counts = draw(s, logits, n);
    CHECK(counts.size() == 2);
    checkFrequency(counts.at(1), n, 0.5 / 0.8);
  }
  SUBCASE("top-p 0.9 keeps three tokens") {
    SamplerParams p = plain(1.0f);
    p.top_p = 0.9f;
    Sampler s(p, 4);
    const auto counts = draw(s, logits, n);
    CHECK(counts.size() == 3);
    CHECK(counts.count(0) == 0);
  }
  SUBCASE("min-p 0.4: p ≥ 0.4 · 0.5 = 0.2 keeps tokens 1 and 3") {
    SamplerParams p = plain(1.0f);
    p.min_p = 0.4f;
    Sampler s(p, 4);
    const auto counts = draw(s, logits, n);
    CHECK(counts.size() == 2);
    checkFrequency(counts.at(3), n, 0.3 / 0.8);
  }
  SUBCASE("min-p 0.25: threshold 0.125 keeps three tokens") {
    SamplerParams p = plain(1.0f);
    p.min_p = 0.25f;
    Sampler s(p, 4);
    const auto counts = draw(s, logits, n);
    CHECK(counts.size() == 3);
    CHECK(counts.count(0) == 0);
  }
}

TEST_CASE("repetition penalty: divides positive logits, multiplies negative ones, over the last N tokens") {
  SamplerParams p = plain(0.0f);
  p.repeat_penalty = 1.1f;
  p.repeat_last_n = 2;
  {
    Sampler s(p, 3);
    const std::vector<float> logits = {5.0f, 4.8f, -9.0f};  // 5 / 1.1 = 4.545 < 4.8
    CHECK(s.sample(logits) == 0);
    s.accept(0);
    CHECK(s.sample(logits) == 1);
  }
  {
    Sampler s(p, 3);
    const std::vector<float> logits = {-1.0f, -1.05f, -9.0f};  // −1 · 1.1 = −1.1 < −1.05
    s.accept(0);
    s.accept(0);  // counted once: −1.1, not −1.21 (so −1.1 > −1.15 below still holds)
    CHECK(s.sample(logits) == 1);
    const std::vector<float> logits2 = {-1.0f, -1.15f, -9.0f};
    CHECK(s.sample(logits2) == 0);
  }
  {
    // Window of 2: after accepting 0, 2, 2, token 0 has left the window.
    Sampler s(p, 3);
    s.accept(0);
    s.accept(2);
    s.accept(2);
    CHECK(s.sample(std::vector<float>{5.0f, 4.8f, 0.0f}) == 0);
    s.accept(1);  // window {2, 1}
    CHECK(s.sample(std::vector<float>{5.0f, 4.8f, 0.0f}) == 0);
    CHECK(s.sample(std::vector<float>{4.7f, 5.0f, 0.0f}) == 0);  // 5 / 1.1 = 4.55 < 4.7
  }
}

// Greedy sampling reads the logits directly (Sampler::greedy, no candidate list): against the definition written out
// here (NaN as −∞, each distinct penalized token of the window divided or multiplied once, then the first index of
// the highest value) on 2,000 random rows with ties, NaNs, −∞ rows, windows longer and shorter than the history
// and penalties below and above 1 — and the penalty marks must not leak into the next call.
TEST_CASE("greedy with a repetition penalty: the definition's token on random rows with ties, NaN and −∞") {
  std::mt19937 rng(20261202);
  const int32_t n_vocab = 37;
  for (int trial = 0; trial < 2000; ++trial) {
    CAPTURE(trial);
    SamplerParams p = plain(0.0f);
    p.repeat_penalty = std::vector<float>{1.0f, 1.3f, 0.7f, 2.0f}[trial % 4];
    p.repeat_last_n = static_cast<int32_t>(rng() % 8);
    Sampler s(p, n_vocab);
    std::vector<int32_t> history;
    for (int h = static_cast<int>(rng() % 12); h > 0; --h) {
      history.push_back(static_cast<int32_t>(rng() % n_vocab));
      s.accept(history.back());
    }
    for (int call = 0; call < 3; ++call) {
      std::vector<float> logits(n_vocab);
      for (float& l : logits) {
        const uint32_t r = rng() % 16;
        l = r == 0 ? NAN : r == 1 ? -INFINITY : static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.5f;  // ties
      }
      if (trial % 97 == 0) std::fill(logits.begin(), logits.end(), -INFINITY);
      std::vector<float> v(n_vocab);
      for (int32_t i = 0; i < n_vocab; ++i) v[i] = std::isnan(logits[i]) ? -INFINITY : logits[i];
      std::vector<bool> done(n_vocab, false);
      const size_t window = std::min(history.size(), static_cast<size_t>(std::max(0, p.repeat_last_n)));
      if (p.repeat_penalty != 1.0f)
        for (size_t h = history.size() - window; h < history.size(); ++h) {
          const int32_t t = history[h];
          if (done[t]) continue;
          done[t] = true;
          v[t] = v[t] > 0 ? v[t] / p.repeat_penalty : v[t] * p.repeat_penalty;
        }
      int32_t want = 0;
      for (int32_t i = 1; i < n_vocab; ++i)
        if (v[i] > v[want]) want = i;
      CHECK(s.sample(logits) == want);
    }
  }
}

TEST_CASE("same seed gives the same tokens; another seed does not; reset() re-seeds") {
  std::vector<float> logits(100, 0.0f);  // uniform over 100 tokens
  SamplerParams p = plain(1.0f);
  p.seed = 1234;
  auto run = [&](Sampler& s) {
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) {
      out.push_back(s.sample(logits));
      s.accept(out.back());
    }
    return out;
  };
  Sampler a(p, 100), b(p, 100);
  const std::vector<int32_t> ra = run(a);
  CHECK(ra == run(b));
  a.reset();
  CHECK(run(a) == ra);
  p.seed = 1235;
  Sampler c(p, 100);
  CHECK(run(c) != ra);
}

// What the device top-k (kernels/topk.cuh) returns, computed the plain way: NaN → −∞, the penalty on
// `penalized`, then std::partial_sort's first k under "logit desc, id asc".
std::vector<TokenLogit> topKReference(const std::vector<float>& logits, std::span<const int32_t> penalized,
                                      float penalty, int k) {
  std::vector<TokenLogit> c;
  for (size_t i = 0; i < logits.size(); ++i)
    c.push_back({static_cast<int32_t>(i), std::isnan(logits[i]) ? -INFINITY : logits[i]});
  for (int32_t id : penalized) {
    float& l = c[static_cast<size_t>(id)].logit;
    l = l > 0 ? l / penalty : l * penalty;
  }
  std::partial_sort(c.begin(), c.begin() + k, c.end(), [](const TokenLogit& a, const TokenLogit& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  });
  c.resize(static_cast<size_t>(k));
  return c;
}

// A row with a spread, ties, −∞ and NaN.
std::vector<float> awkwardRow(std::mt19937& rng, int n) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> row(static_cast<size_t>(n));
  for (float& v : row) {
    switch (rng() % 10) {
      case 0: v = 2.5f; break;  // ties
      case 1: v = -INFINITY; break;
      case 2: v = NAN; break;
      case 3: v = 0.0f; break;
      default: v = normal(rng);
    }
  }
  return row;
}

TEST_CASE("penalizedTokens: the distinct tokens of the window, in history order; empty without a penalty") {
  SamplerParams p = plain(1.0f);
  p.repeat_penalty = 1.1f;
  p.repeat_last_n = 4;
  Sampler s(p, 10);
  for (int32_t t : {7, 3, 7, 9, 3, 2}) s.accept(t);  // window: the last 4 accepted, 7 9 3 2
  std::vector<int32_t> got(s.penalizedTokens().begin(), s.penalizedTokens().end());
  std::sort(got.begin(), got.end());
  CHECK(got == std::vector<int32_t>{2, 3, 7, 9});
  s.accept(2);  // window 9 3 2 2
  CHECK(s.penalizedTokens().size() == 3);
  p.repeat_penalty = 1.0f;
  Sampler off(p, 10);
  off.accept(1);
  CHECK(off.penalizedTokens().empty());
}

TEST_CASE("sampleTopK on the device top-k's candidates gives sample()'s token, step after step") {
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p, min_p, penalty;
  };
  for (const Case c : {Case{0.8f, 40, 0.95f, 0.05f, 1.1f}, Case{0.8f, 40, 0.95f, 0.05f, 1.0f}, Case{1.5f, 1, 1.0f, 0.0f, 1.3f},
                       Case{1.0f, 256, 1.0f, 0.0f, 0.9f}, Case{0.0f, 1, 1.0f, 0.0f, 1.1f}, Case{2.0f, 7, 0.5f, 0.2f, 1.1f}}) {
    for (const int n : {7, 300, 5000}) {
      CAPTURE(n);
      CAPTURE(c.top_k);
      CAPTURE(c.temperature);
      SamplerParams p;
      p.temperature = c.temperature;
      p.top_k = std::min(c.top_k, n - 1);
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      p.repeat_penalty = c.penalty;
      p.repeat_last_n = 64;
      p.seed = 99;
      Sampler host(p, n), device(p, n);
      std::mt19937 rng(static_cast<unsigned>(n));
      for (int step = 0; step < 60; ++step) {
        const std::vector<float> row = awkwardRow(rng, n);
        const int k = c.temperature <= 0.0f ? 1 : p.top_k;
        const std::vector<TokenLogit> top = topKReference(row, device.penalizedTokens(), p.repeat_penalty, k);
        const int32_t want = host.sample(row);
        REQUIRE(device.sampleTopK(top) == want);
        host.accept(want);
        device.accept(want);
      }
    }
  }
}

TEST_CASE("sampleTopK without candidates gives token 0 and reads nothing") {
  for (const float t : {0.0f, 0.8f}) {
    SamplerParams p;
    p.temperature = t;
    Sampler s(p, 100);
    CHECK(s.sampleTopK({}) == 0);
  }
}

}  // namespace
}  // namespace minfer
