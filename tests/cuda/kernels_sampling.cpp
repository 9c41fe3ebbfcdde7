// GPU parity (test_cuda_kernels): the device sampling kernels, argmax and top-k.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "kernels/argmax.cuh"
#include "kernels/topk.cuh"
#include "minfer/sampler.h"
#include "tests/cuda/kernel_test_support.h"

namespace minfer::test::gpu {
namespace {

TEST_CASE("argmax: lowest index among ties") {
  MINFER_REQUIRE_GPU(G);
  for (int vocab : {1000, 152064}) {
    CAPTURE(vocab);
    std::vector<Kernel> k = compile({spec("argmax_test_n" + str(vocab), "kernels/argmax.cuh", "minfer_argmax",
                                          {{"AM_N", str(vocab)}})});
    const int rows = 5;
    std::vector<float> x = randomFloats(static_cast<size_t>(rows) * vocab, rng());
    std::uniform_int_distribution<int> pick(0, vocab - 1);
    for (int r = 0; r < rows; ++r) {  // plant a maximum, tied at two or three places in some rows
      const int a = pick(rng()), b = pick(rng());
      x[static_cast<size_t>(r) * vocab + a] = 5.0f;
      if (r % 2) x[static_cast<size_t>(r) * vocab + b] = 5.0f;
    }
    x[static_cast<size_t>(4) * vocab + vocab - 1] = 7.0f;  // maximum in the last column
    DeviceArray dx = DeviceArray::of(x), out(rows * 4);
    out.poison();
    CUdeviceptr a = dx.ptr(), o = out.ptr();
    int n = rows;
    launch(k[0], kern::argmaxLaunch(rows), {&a, &o, &n});
    const std::vector<int32_t> got = out.download<int32_t>(rows);
    for (int r = 0; r < rows; ++r) {
      const float* row = x.data() + static_cast<size_t>(r) * vocab;
      CHECK(got[r] == std::max_element(row, row + vocab) - row);  // max_element returns the first maximum
    }
  }
}

// The rows BatchSession::Output::argmax promises the host's greedyToken for (runtime/batch_session.h): NaN that never
// wins, +∞ tied at two places, −∞ everywhere, NaN everywhere, −0 before +0, a maximum past NaN, one finite value among
// −∞; each row also with the special values scattered over random values. The kernel must give greedyToken's index.
TEST_CASE("argmax: NaN, infinities and signed zeros give greedyToken's index") {
  MINFER_REQUIRE_GPU(G);
  const float inf = INFINITY, nan = NAN;
  for (int vocab : {777, 152064}) {
    CAPTURE(vocab);
    std::vector<Kernel> k = compile({spec("argmax_special_n" + str(vocab), "kernels/argmax.cuh", "minfer_argmax",
                                          {{"AM_N", str(vocab)}})});
    std::vector<std::vector<float>> rows;
    auto filled = [&](float v) { return std::vector<float>(static_cast<size_t>(vocab), v); };
    rows.push_back(filled(-inf));                               // nothing finite: 0
    rows.push_back(filled(nan));                                // likewise
    rows.push_back(filled(0.0f));                               // all ties: 0
    std::vector<float> r = filled(-inf);
    r[static_cast<size_t>(vocab) - 2] = -3.0f;                  // one finite value among −∞
    rows.push_back(r);
    r = filled(nan);
    r[static_cast<size_t>(vocab) / 2] = -1e30f;                 // a maximum past NaN
    rows.push_back(r);
    r = filled(-1.0f);
    r[5] = -0.0f, r[9] = 0.0f;                                  // −0 and +0 tie: the lower index
    rows.push_back(r);
    std::mt19937_64& g = rng();
    std::uniform_int_distribution<int> pick(0, vocab - 1), kind(0, 9);
    for (int t = 0; t < 4; ++t) {  // random values with NaN, ±∞ and signed zeros scattered, +∞ at two places
      r = randomFloats(static_cast<size_t>(vocab), g);
      for (int j = 0; j < vocab / 50 + 4; ++j) {
        const int c = kind(g);
        r[static_cast<size_t>(pick(g))] = c < 4 ? nan : c < 6 ? -inf : c < 8 ? -0.0f : 0.0f;
      }
      if (t % 2) r[static_cast<size_t>(pick(g))] = inf, r[static_cast<size_t>(pick(g))] = inf;
      rows.push_back(r);
    }
    std::vector<float> x;
    for (const auto& row : rows) x.insert(x.end(), row.begin(), row.end());
    const int n = static_cast<int>(rows.size());
    DeviceArray dx = DeviceArray::of(x), out(static_cast<size_t>(n) * 4);
    out.poison();
    CUdeviceptr a = dx.ptr(), o = out.ptr();
    int n_rows = n;
    launch(k[0], kern::argmaxLaunch(static_cast<unsigned>(n)), {&a, &o, &n_rows});
    const std::vector<int32_t> got = out.download<int32_t>(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      CAPTURE(i);
      CHECK(got[static_cast<size_t>(i)] == greedyToken(rows[static_cast<size_t>(i)]));
    }
    CHECK(got[0] == 0);
    CHECK(got[1] == 0);
    CHECK(got[3] == vocab - 2);
    CHECK(got[4] == vocab / 2);
    CHECK(got[5] == 5);
  }
}

// The device top-k (kernels/topk.cuh) against Sampler::sample's steps 1 and 3 done the plain way: NaN → −∞,
// the penalty on each listed id (float division / product, as the host), std::partial_sort's first k under
// "logit desc, id asc". Ids and logits must be equal (bit for bit but for −0 == +0: the kernel returns +0).
std::vector<kern::TopKPair> topkReference(const std::vector<float>& row, const std::vector<int32_t>& penalized,
                                          float penalty, unsigned k) {
  std::vector<kern::TopKPair> c;
  for (size_t i = 0; i < row.size(); ++i) c.push_back({static_cast<int32_t>(i), std::isnan(row[i]) ? -INFINITY : row[i]});
  for (int32_t id : penalized) {
    if (id < 0 || static_cast<size_t>(id) >= row.size()) continue;  // the kernel ignores ids outside the row
    float& l = c[static_cast<size_t>(id)].logit;
    l = l > 0 ? l / penalty : l * penalty;
  }
  std::partial_sort(c.begin(), c.begin() + k, c.end(), [](const kern::TopKPair& a, const kern::TopKPair& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  });
  c.resize(k);
  return c;
}

TEST_CASE("topk: the partial_sort top-k of the penalized row (ties, -inf, NaN, odd vocab sizes, k = 1 … 256)") {
  MINFER_REQUIRE_GPU(G);
  for (unsigned vocab : {7u, 1000u, 4097u, 32000u, 152064u}) {
    CAPTURE(vocab);
    std::vector<Kernel> kn = compile({spec("topk_test_n" + str(vocab), "kernels/topk.cuh", "minfer_topk", {{"TK_N", str(vocab)}})});
    DeviceArray slot(sizeof(kern::TopKSlot)), scratch(kern::topkScratchBytes(vocab)), counters(kern::kTopKCounterBytes);
    const uint32_t zero = 0;
    counters.upload(&zero, sizeof zero);
    std::uniform_int_distribution<int> pick(0, static_cast<int>(vocab) - 1);
    // Rows: random with planted ties / −∞ / NaN / ±0; every value equal; every value −∞ or NaN.
    for (int kind = 0; kind < 3; ++kind) {
      CAPTURE(kind);
      std::vector<float> row = randomFloats(vocab, rng());
      if (kind == 0) {
        for (unsigned i = 0; i < vocab / 5 + 1; ++i) row[static_cast<size_t>(pick(rng()))] = 0.75f;  // a tied block
        for (unsigned i = 0; i < vocab / 20 + 1; ++i) row[static_cast<size_t>(pick(rng()))] = -INFINITY;
        for (unsigned i = 0; i < vocab / 20 + 1; ++i) row[static_cast<size_t>(pick(rng()))] = NAN;
        row[static_cast<size_t>(pick(rng()))] = -0.0f;
        row[static_cast<size_t>(pick(rng()))] = 0.0f;
        row[vocab - 1] = 3.0f;  // the maximum in the last column
      } else if (kind == 1) {
        std::fill(row.begin(), row.end(), -1.5f);
      } else {
        for (size_t i = 0; i < row.size(); ++i) row[i] = i % 3 ? -INFINITY : NAN;
      }
      DeviceArray logits = DeviceArray::of(row);
      for (unsigned k : {1u, 2u, 40u, 64u, 100u, kern::kTopKMax}) {
        k = std::min(k, vocab);
        for (const float penalty : {1.0f, 1.1f, 0.8f}) {
          CAPTURE(k);
          CAPTURE(penalty);
          kern::TopKSlot h{};
          h.k = static_cast<int32_t>(k);
          h.repeat_penalty = penalty;
          std::vector<int32_t> penalized;
          if (penalty != 1.0f) {  // distinct ids, a few near the maximum, two outside the row (ignored)
            std::vector<int32_t> all(vocab);
            for (unsigned i = 0; i < vocab; ++i) all[i] = static_cast<int32_t>(i);
            std::shuffle(all.begin(), all.end(), rng());
            all.resize(std::min<size_t>(all.size(), 200));
            if (std::find(all.begin(), all.end(), static_cast<int32_t>(vocab - 1)) == all.end()) all.push_back(static_cast<int32_t>(vocab - 1));
            penalized = all;
            penalized.push_back(-1);
            penalized.push_back(static_cast<int32_t>(vocab) + 5);
          }
          h.n_penalized = static_cast<int32_t>(penalized.size());
          std::copy(penalized.begin(), penalized.end(), h.penalized);
          for (kern::TopKPair& o : h.out) o = {-7, NAN};
          slot.upload(&h, sizeof h);
          scratch.poison();
          CUdeviceptr l = logits.ptr(), sl = slot.ptr(), sc = scratch.ptr(), co = counters.ptr();
          const std::vector<kern::TopKPair> want = topkReference(row, penalized, penalty, k);
          for (int again = 0; again < 2; ++again) {  // the counter word is left zero: a second launch agrees
            launch(kn[0], kern::topkLaunch(vocab), {&l, &sl, &sc, &co});
            const std::vector<kern::TopKPair> got = slot.download<kern::TopKPair>(kern::kTopKMax, offsetof(kern::TopKSlot, out));
            int bad = 0;
            for (unsigned i = 0; i < k; ++i)
              if (got[i].id != want[i].id || !(got[i].logit == want[i].logit)) {
                if (bad++ < 3)
                  MESSAGE("rank " << i << ": got (" << got[i].id << ", " << got[i].logit << "), want (" << want[i].id << ", "
                                  << want[i].logit << ")");
              }
            CHECK(bad == 0);
            for (unsigned i = k; i < kern::kTopKMax; ++i) REQUIRE(got[i].id == -7);  // nothing past k is written
            CHECK(counters.download<uint32_t>(1)[0] == 0u);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace minfer::test::gpu
