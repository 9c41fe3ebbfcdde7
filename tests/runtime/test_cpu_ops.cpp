// CPU reference ops vs straightforward float64 loops on random, non-square inputs.
//
// Each op's tolerance is declared in runtime/cpu/cpu_ops.h and asserted here; the measured error is
// printed (MESSAGE) so the margin is visible. Weights are read through stride tables whose row and
// group pitches are padded with garbage, so a reader that bypasses the table fails.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "runtime/cpu/cpu_ops.h"
#include "runtime/cpu/thread_pool.h"
#include "tests/runtime/weight_builder.h"

namespace minfer::cpu {
namespace {

using test::maxRelError;
using test::randomFloats;

// Positions pos0 .. pos0 + n − 1, as cpu::rope takes them.
std::vector<int32_t> positions(int pos0, int n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) p[static_cast<size_t>(t)] = pos0 + t;
  return p;
}


std::vector<double> rmsNormRef(const std::vector<float>& x, const std::vector<float>& w, int rows, int width,
                               double eps) {
  std::vector<double> out(x.size());
  for (int t = 0; t < rows; ++t) {
    double ss = 0;
    for (int i = 0; i < width; ++i) ss += double(x[t * width + i]) * x[t * width + i];
    const double inv = 1.0 / std::sqrt(ss / width + eps);
    for (int i = 0; i < width; ++i) out[t * width + i] = x[t * width + i] * inv * w[i];
  }
  return out;
}

TEST_CASE("rmsNorm and headRmsNorm match float64") {
  std::mt19937_64 rng(11);
  const int rows = 5, width = 67;
  std::vector<float> x = randomFloats(rows * width, rng, -3, 3), w = randomFloats(width, rng, 0.5f, 1.5f);
  std::vector<float> out(x.size());
  rmsNorm(x.data(), w.data(), rows, width, 1e-5f, out.data());
  const std::vector<double> ref = rmsNormRef(x, w, rows, width, 1e-5);
  const double err = maxRelError(out.data(), ref.data(), out.size());
  MESSAGE("rmsNorm max rel error " << err);
  CHECK(err < 1e-6);
  // In place gives the same bits.
  std::vector<float> inplace = x;
  rmsNorm(inplace.data(), w.data(), rows, width, 1e-5f, inplace.data());
  CHECK(std::memcmp(inplace.data(), out.data(), out.size() * 4) == 0);

  // Per head: 3 rows of 5 heads of 12; each head normalized on its own with the same weight.
  const int n_head = 5, hd = 12;
  std::vector<float> xh = randomFloats(3 * n_head * hd, rng, -2, 2), wh = randomFloats(hd, rng, 0.5f, 1.5f);
  std::vector<double> refh(xh.size());
  for (int t = 0; t < 3; ++t)
    for (int h = 0; h < n_head; ++h) {
      std::vector<float> head(xh.begin() + (t * n_head + h) * hd, xh.begin() + (t * n_head + h + 1) * hd);
      std::vector<double> r = rmsNormRef(head, wh, 1, hd, 1e-6);
      std::copy(r.begin(), r.end(), refh.begin() + (t * n_head + h) * hd);
    }
  headRmsNorm(xh.data(), wh.data(), 3, n_head, hd, 1e-6f);
  const double errh = maxRelError(xh.data(), refh.data(), xh.size());
  MESSAGE("headRmsNorm max rel error " << errh);
  CHECK(errh < 1e-6);
}

std::vector<double> ropeRef(const std::vector<float>& x, int rows, int n_head, int hd, int n_rot, RopeStyle style,
                            double base, double scale, int pos0, const std::vector<double>& ff = {}) {
  std::vector<double> out(x.begin(), x.end());
  for (int t = 0; t < rows; ++t)
    for (int h = 0; h < n_head; ++h)
      for (int i = 0; i < n_rot / 2; ++i) {
        // fixtures README §8: θ_i = freq_scale·pos·base^(−2i/n_rot) / ff_i
        const double theta = scale * (pos0 + t) * std::pow(base, -2.0 * i / n_rot) / (ff.empty() ? 1.0 : ff[i]);
        const int a = style == RopeStyle::kNorm ? 2 * i : i, b = style == RopeStyle::kNorm ? 2 * i + 1 : i + n_rot / 2;
        double* e = out.data() + (t * n_head + h) * hd;
        const double va = e[a], vb = e[b];
        e[a] = va * std::cos(theta) - vb * std::sin(theta);
        e[b] = va * std::sin(theta) + vb * std::cos(theta);
      }
  return out;
}

TEST_CASE("rope: both styles, partial rotation, positions and frequency scaling match float64") {
  std::mt19937_64 rng(12);
  const int rows = 4, n_head = 3, hd = 16, n_rot = 12, pos0 = 37;
  const std::vector<float> x = randomFloats(rows * n_head * hd, rng);
  std::vector<float> results[2];
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox})
    for (auto [base, scale] : {std::pair{10000.0f, 1.0f}, std::pair{1e6f, 0.25f}}) {
      CAPTURE(static_cast<int>(style));
      CAPTURE(base);
      std::vector<float> y = x;
      rope(y.data(), rows, n_head, hd, n_rot, style, base, scale, positions(pos0, rows).data());
      const std::vector<double> ref = ropeRef(x, rows, n_head, hd, n_rot, style, base, scale, pos0);
      const double err = maxRelError(y.data(), ref.data(), y.size());
      MESSAGE("rope max rel error " << err);
      CHECK(err < 5e-7);
      // Dimensions ≥ n_rot are untouched, bit for bit.
      for (int t = 0; t < rows * n_head; ++t)
        for (int d = n_rot; d < hd; ++d) CHECK(y[t * hd + d] == x[t * hd + d]);
      if (base == 10000.0f) results[static_cast<int>(style)] = y;
    }
  // The two styles really differ (a swapped style must be caught).
  CHECK(maxRelError(results[0].data(), std::vector<double>(results[1].begin(), results[1].end()).data(),
                    results[0].size()) > 1e-2);
}

TEST_CASE("rope with frequency factors (Llama 3.1 rope_freqs) matches float64, both styles") {
  std::mt19937_64 rng(21);
  const int rows = 5, n_head = 3, hd = 20, n_rot = 16, pos0 = 1000;  // 8 pairs, head not all rotated
  const std::vector<float> x = randomFloats(rows * n_head * hd, rng);
  // Llama 3.1's shape of factors: 1 for the fast pairs, rising to 8 for the slow ones.
  const std::vector<float> ff = {1.0f, 1.0f, 1.0f, 1.5534146f, 2.69453f, 5.257327f, 8.0f, 8.0f};
  const std::vector<double> ff64(ff.begin(), ff.end());
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox})
    for (auto [base, scale] : {std::pair{500000.0f, 1.0f}, std::pair{10000.0f, 0.5f}}) {
      CAPTURE(static_cast<int>(style));
      CAPTURE(base);
      std::vector<float> y = x;
      rope(y.data(), rows, n_head, hd, n_rot, style, base, scale, positions(pos0, rows).data(), ff.data());
      const std::vector<double> ref = ropeRef(x, rows, n_head, hd, n_rot, style, base, scale, pos0, ff64);
      const double err = maxRelError(y.data(), ref.data(), y.size());
      MESSAGE("rope with factors max rel error " << err);
      CHECK(err < 5e-7);
      for (int t = 0; t < rows * n_head; ++t)
        for (int d = n_rot; d < hd; ++d) CHECK(y[t * hd + d] == x[t * hd + d]);
      // Ignoring the factors is caught (fixtures README §8.6: 1.6% on the logits of tiny-llama31).
      const std::vector<double> plain = ropeRef(x, rows, n_head, hd, n_rot, style, base, scale, pos0);
      CHECK(maxRelError(y.data(), plain.data(), y.size()) > 1e-2);
    }
  // Factors of 1 are the plain rotation, bit for bit.
  const std::vector<float> ones(n_rot / 2, 1.0f);
  std::vector<float> a = x, b = x;
  rope(a.data(), rows, n_head, hd, n_rot, RopeStyle::kNorm, 1e4f, 1.0f, positions(7, rows).data(), ones.data());
  rope(b.data(), rows, n_head, hd, n_rot, RopeStyle::kNorm, 1e4f, 1.0f, positions(7, rows).data());
  CHECK(a == b);
}

// YaRN restated in float64 from the paper's definitions, as llama.cpp parameterizes them (ggml_rope_ext):
// the pair whose wavelength 2π·base^(2i/n_rot) fits β times into n_ctx_orig is
// i(β) = n_rot·ln(n_ctx_orig / (2πβ)) / (2·ln base); the ramp runs from ⌊i(beta_fast)⌋ (γ = 1: the
// original angle) to ⌈i(beta_slow)⌉ (γ = 0: the angle times freq_scale); mscale = attn_factor·(1 + 0.1·ln(1/s)).
struct Yarn64 {
  double lo, hi, mscale;
  Yarn64(int n_rot, double base, double s, double attn, double beta_fast, double beta_slow, double n_ctx_orig) {
    auto pair = [&](double beta) { return n_rot * std::log(n_ctx_orig / (2 * M_PI * beta)) / (2 * std::log(base)); };
    lo = std::max(0.0, std::floor(pair(beta_fast)));
    hi = std::min(n_rot - 1.0, std::ceil(pair(beta_slow)));
    mscale = attn * (1 + 0.1 * std::log(1 / s));
  }
  double gamma(int i) const { return 1 - std::clamp((i - lo) / std::max(0.001, hi - lo), 0.0, 1.0); }
  double theta(int i, int n_rot, double base, double s, double pos) const {
    const double extrap = pos * std::pow(base, -2.0 * i / n_rot);
    return extrap * s * (1 - gamma(i)) + extrap * gamma(i);
  }
};

TEST_CASE("YaRN: ramp ends, mscale and angles match a float64 restatement, both styles") {
  const int n_rot = 64, hd = 72, n_head = 2;
  const float base = 10000.0f, s = 0.25f, attn = 1.0f;  // factor 4 over an original context of 4096
  const kern::RopeYarn y = kern::ropeYarn(n_rot, base, s, 1.0f, attn, 32.0f, 1.0f, 4096);
  const Yarn64 y64(n_rot, base, s, attn, 32, 1, 4096);
  // i(32) = 10.47, i(1) = 22.51: the ramp runs over pairs 10..23.
  CHECK(y.corr_lo == 10.0f);
  CHECK(y.corr_hi == 23.0f);
  CHECK(y64.lo == 10.0);
  CHECK(y64.hi == 23.0);
  CHECK(std::abs(y.mscale - y64.mscale) < 1e-6);
  CHECK(std::abs(y64.mscale - (1 + 0.1 * std::log(4.0))) < 1e-15);
  // The ramp: both ends and the middle.
  CHECK(kern::ropeYarnRamp(y.corr_lo, y.corr_hi, 0) == 1.0f);
  CHECK(kern::ropeYarnRamp(y.corr_lo, y.corr_hi, 10) == 1.0f);
  CHECK(std::abs(kern::ropeYarnRamp(y.corr_lo, y.corr_hi, 16) - (1 - 6.0 / 13)) < 1e-7);
  CHECK(kern::ropeYarnRamp(y.corr_lo, y.corr_hi, 23) == 0.0f);
  CHECK(kern::ropeYarnRamp(y.corr_lo, y.corr_hi, 31) == 0.0f);
  CHECK(y64.gamma(10) == 1.0);
  CHECK(y64.gamma(23) == 0.0);

  // Angles: a unit vector (1, 0) in every pair comes out as mscale·(cos θ_i, sin θ_i).
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox})
    for (int pos0 : {0, 3000}) {
      CAPTURE(static_cast<int>(style));
      CAPTURE(pos0);
      const int rows = 3;
      std::vector<float> x(rows * n_head * hd, 0.0f);
      for (int r = 0; r < rows * n_head; ++r)
        for (int i = 0; i < n_rot / 2; ++i) x[r * hd + (style == RopeStyle::kNorm ? 2 * i : i)] = 1.0f;
      rope(x.data(), rows, n_head, hd, n_rot, style, base, s, positions(pos0, rows).data(), nullptr, y);
      // Error allowed: cos/sin and mscale rounded to f32 (3e-7), plus γ_i rounded to f32 as ggml's
      // rope_yarn_ramp does, which moves θ_i by up to θ_extrap·(1 − s)·2^−24.
      double worst = 0;  // in units of the allowance
      for (int t = 0; t < rows; ++t)
        for (int i : {0, 5, 10, 11, 16, 22, 23, 31}) {
          const double th = y64.theta(i, n_rot, base, s, pos0 + t);
          const double allowed = 3e-7 + (pos0 + t) * std::pow(double(base), -2.0 * i / n_rot) * (1 - s) * 0x1p-24;
          const float* e = x.data() + (t * n_head + 1) * hd;
          const int a = style == RopeStyle::kNorm ? 2 * i : i, b = style == RopeStyle::kNorm ? 2 * i + 1 : i + n_rot / 2;
          worst = std::max({worst, std::abs(e[a] - y64.mscale * std::cos(th)) / allowed,
                            std::abs(e[b] - y64.mscale * std::sin(th)) / allowed});
        }
      MESSAGE("YaRN angles: max error " << worst << " of the allowance");
      CHECK(worst <= 1.0);
    }

  // Random vectors with frequency factors: the whole rotation against float64 (tolerance of cpu::rope).
  std::mt19937_64 rng(31);
  const int rows = 4, pos0 = 2000;
  const std::vector<float> x = randomFloats(rows * n_head * hd, rng);
  std::vector<float> ff(n_rot / 2);
  for (int i = 0; i < n_rot / 2; ++i) ff[i] = 1.0f + 0.25f * static_cast<float>(i % 5);
  const kern::RopeYarn y2 = kern::ropeYarn(n_rot, 500000.0f, 0.125f, 1.0f, 0.9f, 32.0f, 1.0f, 8192);
  const Yarn64 y2_64(n_rot, 500000.0, 0.125, 0.9, 32, 1, 8192);
  CHECK(y2.corr_lo == y2_64.lo);
  CHECK(y2.corr_hi == y2_64.hi);
  CHECK(y2_64.lo > 0);
  CHECK(y2_64.hi < n_rot / 2 - 1);  // both ends inside: pairs on each side of the ramp
  for (RopeStyle style : {RopeStyle::kNorm, RopeStyle::kNeox}) {
    std::vector<float> got = x;
    rope(got.data(), rows, n_head, hd, n_rot, style, 500000.0f, 0.125f, positions(pos0, rows).data(), ff.data(), y2);
    std::vector<double> ref(x.begin(), x.end());
    for (int t = 0; t < rows; ++t)
      for (int h = 0; h < n_head; ++h)
        for (int i = 0; i < n_rot / 2; ++i) {
          const double th = y2_64.theta(i, n_rot, 500000.0, 0.125, pos0 + t) / ff[i];
          const int a = style == RopeStyle::kNorm ? 2 * i : i, b = style == RopeStyle::kNorm ? 2 * i + 1 : i + n_rot / 2;
          double* e = ref.data() + (t * n_head + h) * hd;
          const double va = e[a], vb = e[b];
          e[a] = y2_64.mscale * (va * std::cos(th) - vb * std::sin(th));
          e[b] = y2_64.mscale * (va * std::sin(th) + vb * std::cos(th));
        }
    const double err = maxRelError(got.data(), ref.data(), got.size());
    MESSAGE("YaRN rope max rel error " << err);
    CHECK(err < 5e-7);
    for (int r = 0; r < rows * n_head; ++r)
      for (int d = n_rot; d < hd; ++d) CHECK(got[r * hd + d] == x[r * hd + d]);
    // Plain linear scaling is a different rotation (the ramp matters).
    std::vector<float> linear = x;
    rope(linear.data(), rows, n_head, hd, n_rot, style, 500000.0f, 0.125f, positions(pos0, rows).data(), ff.data());
    CHECK(maxRelError(linear.data(), ref.data(), ref.size()) > 1e-2);
  }

  // attn_factor alone (no YaRN mix) scales cos and sin: 2x the plain rotation, bit for bit.
  const kern::RopeYarn scaled = kern::ropeYarn(n_rot, base, 0.5f, 0.0f, 2.0f, 32.0f, 1.0f, 0);
  CHECK(scaled.mscale == 2.0f);
  std::vector<float> a = x, b = x;
  rope(a.data(), rows, n_head, hd, n_rot, RopeStyle::kNorm, base, 0.5f, positions(9, rows).data(), nullptr, scaled);
  rope(b.data(), rows, n_head, hd, n_rot, RopeStyle::kNorm, base, 0.5f, positions(9, rows).data());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == (i % hd < size_t(n_rot) ? 2.0f * b[i] : b[i]));
}

TEST_CASE("swiGlu and add match float64, in place too") {
  std::mt19937_64 rng(13);
  const int n = 3 * 77;
  std::vector<float> g = randomFloats(n, rng, -6, 6), u = randomFloats(n, rng, -2, 2), out(n);
  swiGlu(g.data(), u.data(), n, out.data());
  std::vector<double> ref(n), ref_add(n);
  for (int i = 0; i < n; ++i) {
    ref[i] = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
    ref_add[i] = double(g[i]) + u[i];
  }
  const double err = maxRelError(out.data(), ref.data(), n);
  MESSAGE("swiGlu max rel error " << err);
  CHECK(err < 5e-7);
  std::vector<float> inplace = g;
  swiGlu(inplace.data(), u.data(), n, inplace.data());
  CHECK(std::memcmp(inplace.data(), out.data(), n * 4) == 0);
  std::vector<float> sum = g;
  add(sum.data(), u.data(), n, sum.data());
  CHECK(maxRelError(sum.data(), ref_add.data(), n) < 1e-7);
}

// Every supported type, rows ≠ cols ≠ block count, padded pitches, group pitch 8 (garbage between groups).
struct TypeCase {
  GgmlType type;
  uint64_t cols;
};
const TypeCase kTypes[] = {
    {GgmlType::F32, 72},   {GgmlType::F16, 72},   {GgmlType::BF16, 72},  {GgmlType::Q4_0, 96},
    {GgmlType::Q4_1, 96},  {GgmlType::Q5_0, 96},  {GgmlType::Q5_1, 96},  {GgmlType::Q8_0, 96},
    {GgmlType::Q2_K, 512}, {GgmlType::Q3_K, 512}, {GgmlType::Q4_K, 512}, {GgmlType::Q5_K, 512},
    {GgmlType::Q6_K, 512},
};

TEST_CASE("dequantizeRow through stride tables equals dequantizeBlock for every element and source") {
  std::mt19937_64 rng(14);
  for (const TypeCase& tc : kTypes) {
    const GgmlTypeTraits tr = ggmlTypeTraits(tc.type);
    const std::string type_name = tr.name;
    CAPTURE(type_name);
    const uint64_t rows = 37;
    const test::RandomWeight w = test::makeRandomWeight(tc.type, rows, tc.cols, rng);
    const auto planes = test::buildPlanes(w, {.matmul = true, .blocks = true, .extra_pitch = 48, .group_pitch = 8});
    const WeightPlanes view = test::viewPlanes(planes, tr.name);
    REQUIRE(checkWeightPlanes(view).isOk());
    for (bool gather : {false, true}) {
      Result<RowSource> src = pickRowSource(view, gather);
      REQUIRE(src.isOk());
      CHECK(*src == (gather ? RowSource::kBlocks : (tr.block_size == 1 ? RowSource::kDense : RowSource::kQuantized)));
      std::vector<float> row(tc.cols);
      int mismatches = 0;
      for (uint64_t r = 0; r < rows; ++r) {
        dequantizeRow(view, *src, r, row.data());
        mismatches += std::memcmp(row.data(), w.values.data() + r * tc.cols, tc.cols * 4) != 0;
      }
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("matmul through stride tables matches a float64 loop over the dequantized weights") {
  std::mt19937_64 rng(15);
  ThreadPool pool(3);
  for (const TypeCase& tc : kTypes) {
    const GgmlTypeTraits tr = ggmlTypeTraits(tc.type);
    const std::string type_name = tr.name;
    CAPTURE(type_name);
    const int rows = 41, n_tok = 5;
    const int64_t cols = static_cast<int64_t>(tc.cols);
    const test::RandomWeight w = test::makeRandomWeight(tc.type, rows, tc.cols, rng);
    const auto planes = test::buildPlanes(w, {.matmul = true, .blocks = true, .extra_pitch = 32, .group_pitch = 8});
    const WeightPlanes view = test::viewPlanes(planes, tr.name);
    const std::vector<float> in = randomFloats(n_tok * cols, rng), bias = randomFloats(rows, rng);
    std::vector<double> ref(n_tok * rows);
    for (int t = 0; t < n_tok; ++t)
      for (int r = 0; r < rows; ++r) {
        double acc = bias[r];
        for (int64_t c = 0; c < cols; ++c) acc += double(w.values[r * cols + c]) * in[t * cols + c];
        ref[t * rows + r] = acc;
      }
    // Tolerance (cpu_ops.h): float32 dot products of `cols` terms; bound 1e-6·sqrt(cols/64).
    const double tol = 1e-6 * std::sqrt(double(cols) / 64.0);
    std::vector<float> first;
    for (RowSource src : {RowSource::kDense, RowSource::kQuantized, RowSource::kBlocks}) {
      if (src == RowSource::kDense && tr.block_size != 1) continue;
      if (src == RowSource::kQuantized && tr.block_size == 1) continue;
      std::vector<float> scratch(3 * cols), out(n_tok * rows), out1(n_tok * rows);
      matmul(view, src, bias.data(), in.data(), n_tok, out.data(), &pool, scratch.data());
      matmul(view, src, bias.data(), in.data(), n_tok, out1.data(), nullptr, scratch.data());
      const double err = maxRelError(out.data(), ref.data(), out.size());
      MESSAGE(type_name << " source " << int(src) << ": matmul max rel error " << err << " (bound " << tol << ")");
      CHECK(err < tol);
      // The thread count does not change a bit; neither does the plane set read.
      CHECK(std::memcmp(out.data(), out1.data(), out.size() * 4) == 0);
      if (first.empty()) first = out;
      CHECK(std::memcmp(out.data(), first.data(), out.size() * 4) == 0);
    }
  }
}

TEST_CASE("embed gathers exact rows from blocks and dense planes") {
  std::mt19937_64 rng(16);
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::F16}) {
    const uint64_t cols = type == GgmlType::Q6_K ? 256 : 64, rows = 29;
    const test::RandomWeight w = test::makeRandomWeight(type, rows, cols, rng);
    const auto planes = test::buildPlanes(w, {.matmul = type == GgmlType::F16, .blocks = type != GgmlType::F16});
    const WeightPlanes view = test::viewPlanes(planes, "token_embd");
    Result<RowSource> src = pickRowSource(view, true);
    REQUIRE(src.isOk());
    const int32_t ids[] = {28, 0, 5, 5, 17};
    std::vector<float> out(5 * cols);
    embed(view, *src, ids, 5, out.data());
    for (int t = 0; t < 5; ++t)
      CHECK(std::memcmp(out.data() + t * cols, w.values.data() + ids[t] * cols, cols * 4) == 0);
  }
}

// Float64 attention for one batch, given the full K/V history (positions 0 .. pos0+n−1).
std::vector<double> attentionRef(const std::vector<float>& q, const std::vector<float>& k_all,
                                 const std::vector<float>& v_all, int n, int pos0, int n_head, int n_head_kv, int hd,
                                 double scale = 0, double cap = 0, int window = 0) {
  std::vector<double> out(size_t(n) * n_head * hd, 0.0);
  const int kvw = n_head_kv * hd;
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < n_head; ++j) {
      const int g = j / (n_head / n_head_kv);
      const int n_keys = pos0 + t + 1;
      std::vector<double> s(n_keys, -INFINITY);
      double mx = -INFINITY;
      for (int i = 0; i < n_keys; ++i) {
        if (window > 0 && pos0 + t - i >= window) continue;  // outside the sliding window
        double acc = 0;
        for (int d = 0; d < hd; ++d) acc += double(q[(t * n_head + j) * hd + d]) * k_all[i * kvw + g * hd + d];
        s[i] = scale != 0 ? acc * scale : acc / std::sqrt(double(hd));
        if (cap > 0) s[i] = cap * std::tanh(s[i] / cap);
        mx = std::max(mx, s[i]);
      }
      double sum = 0;
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int i = 0; i < n_keys; ++i)
        for (int d = 0; d < hd; ++d) out[(t * n_head + j) * hd + d] += s[i] / sum * v_all[i * kvw + g * hd + d];
    }
  return out;
}

TEST_CASE("attention with GQA over several calls at increasing positions matches float64") {
  std::mt19937_64 rng(17);
  const int n_head = 6, n_head_kv = 2, hd = 16, n_ctx = 40, kvw = n_head_kv * hd;
  ThreadPool pool(3);
  std::vector<float> kv(2 * n_ctx * kvw, 0.0f);
  const KvLayer cache{kv.data(), kv.data() + n_ctx * kvw, n_ctx, n_head_kv, hd};
  std::vector<float> scratch(3 * n_ctx);
  std::vector<float> k_all, v_all;  // the test's own history
  int pos = 0;
  for (int n : {7, 1, 3, 1}) {
    CAPTURE(pos);
    const std::vector<float> q = randomFloats(n * n_head * hd, rng, -2, 2);
    const std::vector<float> k = randomFloats(n * kvw, rng, -2, 2), v = randomFloats(n * kvw, rng);
    k_all.insert(k_all.end(), k.begin(), k.end());
    v_all.insert(v_all.end(), v.begin(), v.end());
    kvStore(cache, k.data(), v.data(), n, KvRowStorage(n).contiguous(pos, n, int(cache.n_ctx)));
    std::vector<float> out(n * n_head * hd), out1(out.size());
    attention(q.data(), cache, n, KvRowStorage(n).contiguous(pos, n, int(cache.n_ctx)), n_head, out.data(), &pool, scratch.data());
    attention(q.data(), cache, n, KvRowStorage(n).contiguous(pos, n, int(cache.n_ctx)), n_head, out1.data(), nullptr, scratch.data());
    const std::vector<double> ref = attentionRef(q, k_all, v_all, n, pos, n_head, n_head_kv, hd);
    const double err = maxRelError(out.data(), ref.data(), out.size());
    MESSAGE("attention (" << n << " tokens at " << pos << ") max rel error " << err);
    CHECK(err < 1e-6);
    CHECK(std::memcmp(out.data(), out1.data(), out.size() * 4) == 0);
    // A wrong kv-head mapping (j % n_head_kv instead of j / group) must be detectable: heads 1 and 3
    // use kv head 0 and 1 respectively, so their outputs differ.
    CHECK(std::memcmp(out.data() + 1 * hd, out.data() + 3 * hd, hd * 4) != 0);
    pos += n;
  }
}

// Paged KV (BatchSession): rows of two sequences interleaved in one call, each sequence's positions in
// blocks scattered over a pool by its block table, give bit for bit what each sequence gives alone in a
// contiguous cache, and nothing outside their blocks is written.
TEST_CASE("kvStore and attention through block tables equal one contiguous cache per sequence") {
  std::mt19937_64 rng(29);
  const int n_head = 6, n_head_kv = 2, hd = 8, kvw = n_head_kv * hd, bs = 4, n_ctx = 20, pool_blocks = 11;
  const int32_t table_a[] = {7, 2, 9, 0}, table_b[] = {5, 1, 10};  // 13 and 9 positions
  const int len_a = 13, len_b = 9, n = len_a + len_b;
  // Rows: A and B alternating where both have positions left, in position order within each sequence.
  KvRowStorage paged_rows(n);
  std::vector<int> seq_of(n), pos_of(n);
  for (int t = 0, a = 0, b = 0; t < n; ++t) {
    const bool take_a = a < len_a && (b >= len_b || t % 2 == 0);
    seq_of[t] = take_a ? 0 : 1;
    pos_of[t] = take_a ? a++ : b++;
    paged_rows.pos[t] = pos_of[t];
    paged_rows.tables[t] = take_a ? table_a : table_b;
  }
  const std::vector<float> k = randomFloats(n * kvw, rng, -2, 2), v = randomFloats(n * kvw, rng);
  const std::vector<float> q = randomFloats(n * n_head * hd, rng, -2, 2);
  std::vector<float> pool(2 * size_t(pool_blocks) * bs * kvw, NAN);
  const KvLayer paged{pool.data(), pool.data() + pool_blocks * bs * kvw, pool_blocks * bs, n_head_kv, hd};
  const KvRows rows = paged_rows.paged(bs, n_ctx);
  kvStore(paged, k.data(), v.data(), n, rows);
  for (const AttentionOptions options : {AttentionOptions{}, AttentionOptions{.scale = 0.4f, .softcap = 3.0f, .window = 6}}) {
    CAPTURE(options.window);
    std::vector<float> scratch(2 * n_ctx), out(n * n_head * hd);
    ThreadPool threads(2);
    attention(q.data(), paged, n, rows, n_head, out.data(), &threads, scratch.data(), options);
    // Each sequence alone: its rows in position order, a contiguous cache, one row per call.
    for (int s = 0; s < 2; ++s) {
      std::vector<float> cache(2 * n_ctx * kvw, 0.0f);
      const KvLayer one{cache.data(), cache.data() + n_ctx * kvw, n_ctx, n_head_kv, hd};
      for (int t = 0; t < n; ++t) {
        if (seq_of[t] != s) continue;
        kvStore(one, k.data() + t * kvw, v.data() + t * kvw, 1, KvRowStorage(1).contiguous(pos_of[t], 1, n_ctx));
        std::vector<float> alone(n_head * hd);
        attention(q.data() + t * n_head * hd, one, 1, KvRowStorage(1).contiguous(pos_of[t], 1, n_ctx), n_head,
                  alone.data(), nullptr, scratch.data(), options);
        CHECK(std::memcmp(alone.data(), out.data() + t * n_head * hd, alone.size() * 4) == 0);
      }
    }
  }
  // Each row's K and V sit in slot table[p / 4]·4 + p % 4, and no other slot was written.
  int written = 0;
  for (int slot = 0; slot < pool_blocks * bs; ++slot) written += !std::isnan(pool[size_t(slot) * kvw]);
  CHECK(written == n);
  for (int t = 0; t < n; ++t) {
    const int32_t* table = seq_of[t] == 0 ? table_a : table_b;
    const size_t slot = size_t(table[pos_of[t] / bs]) * bs + size_t(pos_of[t] % bs);
    CHECK(std::memcmp(paged.k + slot * kvw, k.data() + t * kvw, kvw * 4) == 0);
    CHECK(std::memcmp(paged.v + slot * kvw, v.data() + t * kvw, kvw * 4) == 0);
  }
}

// Column views (format 1.4, phi3's fused rows): rope, kvStore and attention on q|k|v rows of one wider
// buffer give bit for bit what they give on the dense q, k and v, and leave the other columns alone.
TEST_CASE("rope, kvStore and attention with a row pitch equal the dense rows (column views)") {
  std::mt19937_64 rng(23);
  const int n_head = 3, n_head_kv = 1, hd = 12, n = 5, pos0 = 2, n_ctx = 8;
  const int qw = n_head * hd, kvw = n_head_kv * hd, pitch = qw + 2 * kvw + 3;  // 3 spare columns at the end
  const std::vector<float> rows = randomFloats(n * pitch, rng, -2, 2);
  std::vector<float> q(n * qw), k(n * kvw), v(n * kvw);
  for (int t = 0; t < n; ++t) {
    std::copy_n(rows.begin() + t * pitch, qw, q.begin() + t * qw);
    std::copy_n(rows.begin() + t * pitch + qw, kvw, k.begin() + t * kvw);
    std::copy_n(rows.begin() + t * pitch + qw + kvw, kvw, v.begin() + t * kvw);
  }
  std::vector<float> fused = rows;
  rope(q.data(), n, n_head, hd, hd, RopeStyle::kNeox, 1e4f, 1.0f, positions(pos0, n).data());
  rope(k.data(), n, n_head_kv, hd, hd, RopeStyle::kNeox, 1e4f, 1.0f, positions(pos0, n).data());
  rope(fused.data(), n, n_head, hd, hd, RopeStyle::kNeox, 1e4f, 1.0f, positions(pos0, n).data(), nullptr, {}, pitch);
  rope(fused.data() + qw, n, n_head_kv, hd, hd, RopeStyle::kNeox, 1e4f, 1.0f, positions(pos0, n).data(), nullptr, {}, pitch);
  for (int t = 0; t < n; ++t) {
    CHECK(std::memcmp(fused.data() + t * pitch, q.data() + t * qw, qw * 4) == 0);
    CHECK(std::memcmp(fused.data() + t * pitch + qw, k.data() + t * kvw, kvw * 4) == 0);
    CHECK(std::memcmp(fused.data() + t * pitch + qw + kvw, rows.data() + t * pitch + qw + kvw, (kvw + 3) * 4) == 0);
  }
  std::vector<float> kv_dense(2 * n_ctx * kvw, 0.0f), kv_view(kv_dense.size(), 0.0f);
  const KvLayer dense{kv_dense.data(), kv_dense.data() + n_ctx * kvw, n_ctx, n_head_kv, hd};
  const KvLayer view{kv_view.data(), kv_view.data() + n_ctx * kvw, n_ctx, n_head_kv, hd};
  kvStore(dense, k.data(), v.data(), n, KvRowStorage(n).contiguous(pos0, n, int(dense.n_ctx)));
  kvStore(view, fused.data() + qw, fused.data() + qw + kvw, n, KvRowStorage(n).contiguous(pos0, n, int(view.n_ctx)), pitch, pitch);
  CHECK(kv_view == kv_dense);
  std::vector<float> scratch(n_ctx), out_dense(n * qw), out_view(n * qw);
  attention(q.data(), dense, n, KvRowStorage(n).contiguous(pos0, n, int(dense.n_ctx)), n_head, out_dense.data(), nullptr, scratch.data());
  attention(fused.data(), view, n, KvRowStorage(n).contiguous(pos0, n, int(view.n_ctx)), n_head, out_view.data(), nullptr, scratch.data(), {}, pitch);
  CHECK(out_view == out_dense);
}

TEST_CASE("attention with a query scale, soft-capping and a sliding window (gemma2) matches float64") {
  std::mt19937_64 rng(19);
  const int n_head = 4, n_head_kv = 1, hd = 24, n_ctx = 48, kvw = n_head_kv * hd;
  ThreadPool pool(2);
  std::vector<float> kv(2 * n_ctx * kvw, 0.0f);
  const KvLayer cache{kv.data(), kv.data() + n_ctx * kvw, n_ctx, n_head_kv, hd};
  std::vector<float> scratch(2 * n_ctx);
  for (int window : {1, 5, 100}) {
    CAPTURE(window);
    const AttentionOptions options{.scale = 0.3f, .softcap = 2.5f, .window = window};
    std::vector<float> k_all, v_all;
    int pos = 0;
    for (int n : {11, 1, 20, 1}) {
      CAPTURE(pos);
      const std::vector<float> q = randomFloats(n * n_head * hd, rng, -2, 2);
      const std::vector<float> k = randomFloats(n * kvw, rng, -2, 2), v = randomFloats(n * kvw, rng);
      k_all.insert(k_all.end(), k.begin(), k.end());
      v_all.insert(v_all.end(), v.begin(), v.end());
      kvStore(cache, k.data(), v.data(), n, KvRowStorage(n).contiguous(pos, n, int(cache.n_ctx)));
      std::vector<float> out(n * n_head * hd), out1(out.size());
      attention(q.data(), cache, n, KvRowStorage(n).contiguous(pos, n, int(cache.n_ctx)), n_head, out.data(), &pool, scratch.data(), options);
      attention(q.data(), cache, n, KvRowStorage(n).contiguous(pos, n, int(cache.n_ctx)), n_head, out1.data(), nullptr, scratch.data(), options);
      const std::vector<double> ref = attentionRef(q, k_all, v_all, n, pos, n_head, n_head_kv, hd, 0.3, 2.5, window);
      const double err = maxRelError(out.data(), ref.data(), out.size());
      MESSAGE("attention window " << window << " (" << n << " tokens at " << pos << ") max rel error " << err);
      CHECK(err < 1e-6);
      CHECK(std::memcmp(out.data(), out1.data(), out.size() * 4) == 0);
      // The window and the cap both change the result (so the check above is not vacuous).
      const std::vector<double> no_window = attentionRef(q, k_all, v_all, n, pos, n_head, n_head_kv, hd, 0.3, 2.5);
      const std::vector<double> no_cap = attentionRef(q, k_all, v_all, n, pos, n_head, n_head_kv, hd, 0.3, 0, window);
      if (window < pos + n) CHECK(maxRelError(out.data(), no_window.data(), out.size()) > 1e-3);
      if (window > 1) CHECK(maxRelError(out.data(), no_cap.data(), out.size()) > 1e-3);  // 1 key: a = 1 whatever s
      pos += n;
    }
  }
}

TEST_CASE("geGlu and scale (plain and soft-capped) match float64, in place too") {
  std::mt19937_64 rng(23);
  const int n = 5 * 61;
  std::vector<float> g = randomFloats(n, rng, -8, 8), u = randomFloats(n, rng, -2, 2), out(n);
  geGlu(g.data(), u.data(), n, out.data());
  std::vector<double> ref(n);
  for (int i = 0; i < n; ++i) {
    const double x = g[i];
    ref[i] = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * x * (1 + 0.044715 * x * x))) * u[i];
  }
  double err = maxRelError(out.data(), ref.data(), n);
  MESSAGE("geGlu max rel error " << err);
  CHECK(err < 5e-7);
  std::vector<float> inplace = g;
  geGlu(inplace.data(), u.data(), n, inplace.data());
  CHECK(std::memcmp(inplace.data(), out.data(), n * 4) == 0);
  for (const auto& [s, cap] : {std::pair{16.0, 0.0}, std::pair{1.0, 15.0}, std::pair{0.7, 2.0}}) {
    CAPTURE(s);
    CAPTURE(cap);
    scale(g.data(), n, static_cast<float>(s), static_cast<float>(cap), out.data());
    for (int i = 0; i < n; ++i) ref[i] = cap > 0 ? cap * std::tanh(g[i] * s / cap) : g[i] * s;
    err = maxRelError(out.data(), ref.data(), n);
    MESSAGE("scale max rel error " << err);
    CHECK(err < 5e-7);
    inplace = g;
    scale(inplace.data(), n, static_cast<float>(s), static_cast<float>(cap), inplace.data());
    CHECK(std::memcmp(inplace.data(), out.data(), n * 4) == 0);
  }
}

TEST_CASE("moeRoute: softmax, top-k by falling p, renormalised or not, matches float64") {
  std::mt19937_64 rng(31);
  const int n_expert = 7, n_used = 3, n_tok = 5;  // odd counts
  std::vector<float> logits = randomFloats(n_tok * n_expert, rng, -4.0f, 4.0f);
  logits[2 * n_expert + 1] = logits[2 * n_expert + 4] = 9.0f;  // an exact tie: the lower id comes first
  for (bool norm : {true, false}) {
    std::vector<int32_t> ids(n_tok * n_used, -1);
    std::vector<float> w(n_tok * n_used);
    moeRoute(logits.data(), n_tok, n_expert, n_used, norm, ids.data(), w.data());
    std::vector<double> ref(n_tok * n_used);
    for (int t = 0; t < n_tok; ++t) {
      const float* r = logits.data() + t * n_expert;
      double p[n_expert], sum = 0, mx = *std::max_element(r, r + n_expert);
      for (int e = 0; e < n_expert; ++e) sum += p[e] = std::exp(double(r[e]) - mx);
      std::vector<int> order(n_expert);
      for (int e = 0; e < n_expert; ++e) order[e] = e, p[e] /= sum;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return r[a] > r[b]; });
      double chosen = 0;
      for (int j = 0; j < n_used; ++j) chosen += p[order[j]];
      for (int j = 0; j < n_used; ++j) {
        CHECK(ids[t * n_used + j] == order[j]);
        ref[t * n_used + j] = norm ? p[order[j]] / chosen : p[order[j]];
      }
    }
    CHECK(ids[2 * n_used] == 1);
    CHECK(ids[2 * n_used + 1] == 4);
    const double err = maxRelError(w.data(), ref.data(), w.size());
    MESSAGE("moeRoute norm " << norm << ": max rel error " << err << " (bound 5e-7)");
    CHECK(err < 5e-7);
  }
}

TEST_CASE("moeFfn reads only the chosen experts through the expert axis and matches float64, every source") {
  std::mt19937_64 rng(32);
  ThreadPool pool(3);
  // 5 experts, top-3; expert width 64 (two Q8_0 / Q5_0 blocks), n_embd 96 (three blocks).
  const int n_expert = 5, n_used = 3, n_tok = 4, n_ff = 64, n_embd = 96;
  for (GgmlType type : {GgmlType::F32, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_0}) {
    const std::string type_name = ggmlTypeTraits(type).name;
    CAPTURE(type_name);
    const test::RandomWeight gate = test::makeRandomWeight(type, n_expert * n_ff, n_embd, rng);
    const test::RandomWeight up = test::makeRandomWeight(type, n_expert * n_ff, n_embd, rng);
    const test::RandomWeight down = test::makeRandomWeight(type, n_expert * n_embd, n_ff, rng);
    auto build = [&](const test::RandomWeight& w) {
      auto planes = test::buildPlanes(w, {.matmul = true, .blocks = true, .extra_pitch = 32, .group_pitch = 8});
      for (test::BuiltPlane& p : planes) {
        p.table.experts = n_expert;
        p.table.expert_pitch = p.table.rows / n_expert * p.table.row_pitch;
      }
      return planes;
    };
    const auto gp = build(gate), upp = build(up), dp = build(down);
    const WeightPlanes gv = test::viewPlanes(gp, "gate_exps"), uv = test::viewPlanes(upp, "up_exps"),
                       dv = test::viewPlanes(dp, "down_exps");
    const std::vector<float> x = randomFloats(n_tok * n_embd, rng);
    std::vector<int32_t> ids(n_tok * n_used);
    std::vector<float> w(n_tok * n_used);
    for (int t = 0; t < n_tok; ++t)
      for (int j = 0; j < n_used; ++j) ids[t * n_used + j] = (t * 2 + j * 3) % n_expert, w[t * n_used + j] = 0.2f + 0.3f * j;
    ids[n_used] = n_expert;  // out of range: skipped
    std::vector<double> ref(n_tok * n_embd, 0.0);
    for (int t = 0; t < n_tok; ++t)
      for (int j = 0; j < n_used; ++j) {
        const int e = ids[t * n_used + j];
        if (e >= n_expert) continue;
        std::vector<double> a(n_ff);
        for (int r = 0; r < n_ff; ++r) {
          double g = 0, u = 0;
          for (int c = 0; c < n_embd; ++c) {
            g += double(gate.values[(e * n_ff + r) * n_embd + c]) * x[t * n_embd + c];
            u += double(up.values[(e * n_ff + r) * n_embd + c]) * x[t * n_embd + c];
          }
          a[r] = g / (1.0 + std::exp(-g)) * u;
        }
        for (int r = 0; r < n_embd; ++r) {
          double y = 0;
          for (int c = 0; c < n_ff; ++c) y += double(down.values[(e * n_embd + r) * n_ff + c]) * a[c];
          ref[t * n_embd + r] += y * w[t * n_used + j];
        }
      }
    const double tol = 1e-6 * std::sqrt(double(n_embd) / 64.0);
    for (RowSource src : {RowSource::kDense, RowSource::kQuantized, RowSource::kBlocks}) {
      if ((src == RowSource::kDense) != (type == GgmlType::F32)) continue;
      std::vector<float> scratch(3 * moeScratchFloats(n_embd, n_ff)), out(n_tok * n_embd), out1(n_tok * n_embd);
      moeFfn(gv, src, uv, src, dv, src, x.data(), ids.data(), w.data(), n_tok, n_used, out.data(), &pool, scratch.data());
      moeFfn(gv, src, uv, src, dv, src, x.data(), ids.data(), w.data(), n_tok, n_used, out1.data(), nullptr,
             scratch.data());
      const double err = maxRelError(out.data(), ref.data(), out.size());
      MESSAGE(type_name << " source " << int(src) << ": moeFfn max rel error " << err << " (bound " << tol << ")");
      CHECK(err < tol);
      CHECK(std::memcmp(out.data(), out1.data(), out.size() * 4) == 0);
    }
  }
}

TEST_CASE("checkWeightPlanes names the tensor, the plane and the numbers") {
  std::mt19937_64 rng(18);
  const test::RandomWeight w = test::makeRandomWeight(GgmlType::Q4_1, 6, 64, rng);
  auto planes = test::buildPlanes(w, {});
  {
    WeightPlanes v = test::viewPlanes(planes, "blk.0.attn_k.weight");
    v.scale.table.row_pitch = 4;  // two groups need 8 bytes
    Status s = checkWeightPlanes(v);
    REQUIRE_FALSE(s.isOk());
    CHECK(s.message().find("blk.0.attn_k.weight") != std::string::npos);
    CHECK(s.message().find("scale") != std::string::npos);
    CHECK(s.message().find("row_pitch 4") != std::string::npos);
  }
  {
    WeightPlanes v = test::viewPlanes(planes, "t");
    v.q.size -= 1;
    Status s = checkWeightPlanes(v);
    REQUIRE_FALSE(s.isOk());
    CHECK(s.message().find(std::to_string(v.q.size)) != std::string::npos);
  }
  {
    WeightPlanes v = test::viewPlanes(planes, "t");
    v.scale = PlaneView{};
    CHECK_FALSE(checkWeightPlanes(v).isOk());
    CHECK_FALSE(pickRowSource(v, false).isOk());
  }
  {
    WeightPlanes v = test::viewPlanes(planes, "t");
    v.min.table.cols = 63;
    Status s = checkWeightPlanes(v);
    REQUIRE_FALSE(s.isOk());
    CHECK(s.message().find("63") != std::string::npos);
  }
  {
    WeightPlanes v = test::viewPlanes(planes, "t");
    v.scale.table.group_size = 24;  // min groups of 32 do not nest with scale groups of 24
    Status s = checkWeightPlanes(v);
    REQUIRE_FALSE(s.isOk());
    CHECK(s.message().find("do not nest") != std::string::npos);
  }
  CHECK(checkWeightPlanes(test::viewPlanes(planes, "t")).isOk());
}

TEST_CASE("ThreadPool covers every index exactly once, for any n and thread count") {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 3, 4, 17, 1000}) {
      std::vector<int> hits(size_t(n), 0);
      std::set<int> used;
      std::mutex mu;
      pool.parallelFor(n, [&](int64_t b, int64_t e, int t) {
        for (int64_t i = b; i < e; ++i) ++hits[size_t(i)];
        std::lock_guard<std::mutex> lock(mu);
        used.insert(t);
      });
      for (int h : hits) CHECK(h == 1);
      CHECK(int(used.size()) <= threads);
      if (n >= threads) CHECK(int(used.size()) == threads);
    }
  }
}

}  // namespace
}  // namespace minfer::cpu
