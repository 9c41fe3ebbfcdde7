// GPU parity (test_cuda_kernels): the mixture-of-experts kernels (kernels/moe.cuh): route, sort, the fused router
// launches, the expert FFN.
#include <doctest/doctest.h>

#include <limits>
#include <tuple>

#include "kernels/dense_matmul.cuh"
#include "kernels/moe.cuh"
#include "tests/cuda/kernel_test_support.h"

namespace minfer::test::gpu {
namespace {

// An expert weight (n_expert slices of `rows` rows × cols) planned with the expert axis by the compiler's
// planner and transforms, every plane on the device.
GpuWeight makeExpertWeight(GgmlType type, uint32_t n_expert, uint64_t rows, uint64_t cols) {
  GpuWeight g;
  g.w = makeRandomWeight(type, n_expert * rows, cols, rng(), 0.5f);
  auto layout = planes::planLayout({"test.exps", type, n_expert * rows, cols, planes::TensorRole::kMatMul, n_expert});
  REQUIRE_MESSAGE(static_cast<bool>(layout), llvm::toString(layout.takeError()));
  transformAndUpload(g, *layout, "test expert weight");
  return g;
}

// The planes the expert kernels read and their -D constants (kernels/moe.cuh MOE_<X>_*), as
// compiler/codegen/ops/moe.cpp takes them from the stride tables: kBlocks for Q4_K and Q6_K (their only
// plane, layout_planner.h), else kI8 + kScale [+ kMin], else the dense plane.
struct ExpertArgs {
  CUdeviceptr q = 0, s = 0, m = 0;
  PlaneKind kind = PlaneKind::kF32;  // of the plane read first
  bool blocks() const { return kind == PlaneKind::kBlocks; }
};
ExpertArgs expertDefines(const GpuWeight& g, const char* x, std::vector<std::pair<std::string, std::string>>& d) {
  const StrideTable* blocks = g.table(PlaneKind::kBlocks);
  const bool from_blocks = blocks && (blocks->ggml_type == static_cast<uint32_t>(GgmlType::Q4_K) ||
                                      blocks->ggml_type == static_cast<uint32_t>(GgmlType::Q6_K));
  const StrideTable* q = from_blocks ? blocks : g.table(PlaneKind::kI8);
  const StrideTable* s = from_blocks ? nullptr : g.table(PlaneKind::kScale);
  const StrideTable* m = from_blocks ? nullptr : g.table(PlaneKind::kMin);
  ExpertArgs a;
  if (q) {
    a = {g.ptr(q->kind), s ? g.ptr(PlaneKind::kScale) : 0, m ? g.ptr(PlaneKind::kMin) : 0, q->kind};
  } else {
    q = g.table(PlaneKind::kF32);
    REQUIRE(q);
    a.q = g.ptr(PlaneKind::kF32);
  }
  const std::string p = std::string("MOE_") + x + "_";
  d.push_back({p + "PLANE", str(static_cast<uint64_t>(q->kind))});
  d.push_back({p + "PITCH", str(q->row_pitch)});
  d.push_back({p + "EPITCH", str(q->expert_pitch)});
  d.push_back({p + "S_PITCH", str(s ? s->row_pitch : 0)});
  d.push_back({p + "S_EPITCH", str(s ? s->expert_pitch : 0)});
  d.push_back({p + "M_PITCH", str(m ? m->row_pitch : 0)});
  d.push_back({p + "M_EPITCH", str(m ? m->expert_pitch : 0)});
  d.push_back({p + "GS", str(s ? s->group_size : 1)});
  if (from_blocks) {
    d.push_back({p + "TYPE", str(q->ggml_type)});
    d.push_back({p + "GP", str(q->group_pitch)});
  }
  return a;
}

// Every row of an expert weight dequantized (cpu::dequantizeRow from the planes cpu::moeFfn reads).
std::vector<float> dequantizeAll(const GpuWeight& g) {
  auto src = cpu::pickRowSource(g.view, /*for_gather=*/false);
  REQUIRE(static_cast<bool>(src));
  std::vector<float> w(g.view.rows * g.view.cols);
  for (uint64_t r = 0; r < g.view.rows; ++r) cpu::dequantizeRow(g.view, *src, r, w.data() + r * g.view.cols);
  return w;
}

// The expert FFN with the kernels' q8 activations (x when gate/up are read from blocks, A when down is:
// quantizeHost, bit-identical to common.cuh quantizeBlock), otherwise cpu::moeFfn's formula: sums in double
// over the dequantized weights (gate, up: n_expert·F × E; down: n_expert·E × F, dequantizeAll), slot order.
std::vector<float> moeFfnQ8Ref(const std::vector<float>& gate, const std::vector<float>& up,
                               const std::vector<float>& down, const std::vector<float>& x,
                               const std::vector<int32_t>& ids, const std::vector<float>& w, int n, uint32_t k,
                               uint64_t f, uint64_t e, bool x_q8, bool a_q8) {
  const std::vector<float> xin = x_q8 ? quantizeHost(x, n, static_cast<int>(e)).deq : x;
  std::vector<float> out(static_cast<size_t>(n) * e, 0.0f), a(f);
  for (int t = 0; t < n; ++t)
    for (uint32_t j = 0; j < k; ++j) {
      const uint64_t ex = static_cast<uint64_t>(ids[t * k + j]);
      const float* xt = xin.data() + static_cast<size_t>(t) * e;
      for (uint64_t r = 0; r < f; ++r) {
        const float* gr = gate.data() + (ex * f + r) * e;
        const float* ur = up.data() + (ex * f + r) * e;
        double dg = 0, du = 0;
        for (uint64_t c = 0; c < e; ++c) dg += static_cast<double>(gr[c]) * xt[c], du += static_cast<double>(ur[c]) * xt[c];
        const float gf = static_cast<float>(dg);
        a[r] = gf / (1.0f + std::exp(-gf)) * static_cast<float>(du);
      }
      const std::vector<float> ain = a_q8 ? quantizeHost(a, 1, static_cast<int>(f)).deq : a;
      for (uint64_t r = 0; r < e; ++r) {
        const float* dr = down.data() + (ex * e + r) * f;
        double dd = 0;
        for (uint64_t c = 0; c < f; ++c) dd += static_cast<double>(dr[c]) * ain[c];
        out[static_cast<size_t>(t) * e + r] += static_cast<float>(dd) * w[t * k + j];
      }
    }
  return out;
}

std::vector<std::pair<std::string, std::string>> moeCommon(uint32_t nexp, uint32_t k, uint64_t f, uint64_t e,
                                                           const char* which) {
  return {{"MOE_NEXP", str(nexp)}, {"MOE_K", str(k)},   {"MOE_F", str(f)},
          {"MOE_E", str(e)},       {"MOE_MAX_BATCH", str(kMaxBatch)}, {which, "1"}};
}

// An expert FFN case: the types of gate, up and down, experts, choices per token, expert width F and n_embd E.
struct MoeCase {
  GgmlType gate, up, down;
  uint32_t nexp, k;
  uint64_t f, e;
  std::string tag() const {
    return std::string(ggmlTypeTraits(gate).name) + "_" + ggmlTypeTraits(up).name + "_" + ggmlTypeTraits(down).name +
           "_e" + str(nexp) + "_k" + str(k) + "_f" + str(f) + "_n" + str(e);
  }
  // The case's three expert weights on the device (gate, up: nexp·F × E; down: nexp·E × F).
  std::tuple<GpuWeight, GpuWeight, GpuWeight> weights() const {
    return {makeExpertWeight(gate, nexp, f, e), makeExpertWeight(up, nexp, f, e), makeExpertWeight(down, nexp, e, f)};
  }
};

TEST_CASE("moe_route: softmax top-k ids and (renormalised) weights vs the CPU, odd expert counts") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    uint32_t nexp, k;
    bool norm;
  };
  const Case cases[] = {{8, 2, true}, {37, 3, true}, {37, 3, false}, {128, 8, true}};
  for (const Case& c : cases) {
    CAPTURE(c.nexp);
    CAPTURE(c.k);
    CAPTURE(c.norm);
    auto d = moeCommon(c.nexp, c.k, 1, 1, "MOE_ROUTE");
    d.push_back({"MOE_NORM", c.norm ? "1" : "0"});
    std::vector<Kernel> k = compile({spec("moe_route_test_e" + str(c.nexp) + "_k" + str(c.k) + (c.norm ? "_n" : ""),
                                          "kernels/moe.cuh", "minfer_moe_route", d)});
    for (int n : kTokenCounts) {
      CAPTURE(n);
      const std::vector<float> logits = randomFloats(static_cast<size_t>(n) * c.nexp, rng(), -4.0f, 4.0f);
      std::vector<int32_t> ids(static_cast<size_t>(n) * c.k);
      std::vector<float> w(ids.size());
      cpu::moeRoute(logits.data(), n, static_cast<int>(c.nexp), static_cast<int>(c.k), c.norm, ids.data(), w.data());
      DeviceArray dl = DeviceArray::of(logits), di(kMaxBatch * c.k * 4), dw(kMaxBatch * c.k * 4);
      di.poison();
      dw.poison();
      CUdeviceptr pl = dl.ptr(), pi = di.ptr(), pw = dw.ptr();
      launch(k[0], kern::moeRouteLaunchRule().at(n), {&pl, &pi, &pw});
      CHECK(di.download<int32_t>(ids.size()) == ids);
      const std::vector<float> got = dw.download<float>(w.size());
      CHECK(track("moe_route", relError(got.data(), w.data(), w.size())) <= kMoeRouteTol);
    }
  }
}

// The sort's part of two MoE scratches (32-bit words: ref `rs`, got `gs`) for nexp experts, k per token: the expert
// offsets and the chosen-expert list equal, and each expert's slots equal as a set (the slot order inside an expert
// follows the sort's atomics, not fixed; results do not depend on it).
void checkSortScratch(const std::vector<int32_t>& rs, const std::vector<int32_t>& gs, uint32_t nexp, uint32_t k) {
  const size_t list0 = kern::moeScratchList(nexp), used0 = kern::moeScratchUsed(nexp, kMaxBatch, k);
  CHECK(std::equal(rs.begin(), rs.begin() + list0, gs.begin()));                            // offsets
  CHECK(std::equal(rs.begin() + used0, rs.begin() + used0 + nexp + 1, gs.begin() + used0));  // chosen experts
  for (uint32_t ex = 0; ex < nexp; ++ex) {  // each expert's slots, as a set
    std::vector<int32_t> a(rs.begin() + list0 + rs[ex], rs.begin() + list0 + rs[ex + 1]),
        b(gs.begin() + list0 + gs[ex], gs.begin() + list0 + gs[ex + 1]);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    CHECK(a == b);
  }
}

// minfer_moe_route_sort (MOE_ROUTE_SORT: the decode plan's MoeRoute with its MoeFfn's sort launch) against
// minfer_moe_route then minfer_moe_sort on a copy of the same poisoned scratch: ids and weights bit-identical, the
// scratch's expert offsets, chosen-expert list and (with MOE_X_Q8) the q8 form of x bit-identical, and each
// expert's slots the same set (their order inside an expert is not fixed: atomics; results do not depend on it).
// Expert counts 8, 37 and 128 choosing 2, 3 and 8, renormalised or not, x quantized or not, every token count
// (decode launches one; the kernel serves any), and a token with NaN logits (no expert chosen: ids past the
// experts, skipped by the sort).
TEST_CASE("moe_route_sort: router and slot sort in one launch, bit-identical to moe_route + moe_sort") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    uint32_t nexp, k;
    bool norm, x_q8;
    uint64_t e;
  };
  const Case cases[] = {{8, 2, true, true, 256}, {37, 3, false, false, 96}, {37, 3, true, true, 512},
                        {128, 8, true, true, 2048}, {128, 8, false, false, 72}};
  for (const Case& c : cases) {
    const std::string tag = "e" + str(c.nexp) + "_k" + str(c.k) + (c.norm ? "_n" : "") + (c.x_q8 ? "_q8" : "") + "_n" +
                            str(c.e);
    CAPTURE(tag);
    auto dr = moeCommon(c.nexp, c.k, 1, 1, "MOE_ROUTE");
    dr.push_back({"MOE_NORM", c.norm ? "1" : "0"});
    auto ds = moeCommon(c.nexp, c.k, 64, c.e, "MOE_SORT");
    ds.push_back({"MOE_X_Q8", c.x_q8 ? "1" : "0"});
    auto drs = moeCommon(c.nexp, c.k, 64, c.e, "MOE_ROUTE_SORT");
    drs.insert(drs.end(), {{"MOE_NORM", c.norm ? "1" : "0"}, {"MOE_X_Q8", c.x_q8 ? "1" : "0"}});
    std::vector<Kernel> k = compile({spec("moe_rs_test_route_" + tag, "kernels/moe.cuh", "minfer_moe_route", dr),
                                     spec("moe_rs_test_sort_" + tag, "kernels/moe.cuh", "minfer_moe_sort", ds),
                                     spec("moe_rs_test_fused_" + tag, "kernels/moe.cuh", "minfer_moe_route_sort", drs)});
    const unsigned e32 = static_cast<unsigned>(c.e);
    const uint64_t scratch_bytes = kern::moeScratchBytes(c.nexp, kMaxBatch, c.k, 64, e32);
    for (int n : kTokenCounts) {
      CAPTURE(n);
      std::vector<float> logits = randomFloats(static_cast<size_t>(n) * c.nexp, rng(), -4.0f, 4.0f);
      if (n > 1) logits[c.nexp] = std::numeric_limits<float>::quiet_NaN();  // token 1: no expert chosen
      const std::vector<float> x = activations(n, static_cast<int>(c.e));
      DeviceArray dl = DeviceArray::of(logits), dx = DeviceArray::of(x), ref_ids(kMaxBatch * c.k * 4),
                  ref_w(kMaxBatch * c.k * 4), ids(kMaxBatch * c.k * 4), w(kMaxBatch * c.k * 4), ref_scratch(scratch_bytes),
                  scratch(scratch_bytes);
      for (DeviceArray* a : {&ref_ids, &ref_w, &ids, &w, &ref_scratch, &scratch}) a->poison();
      CUdeviceptr pl = dl.ptr(), px = dx.ptr(), pri = ref_ids.ptr(), prw = ref_w.ptr(), pi = ids.ptr(), pw = w.ptr(),
                  prs = ref_scratch.ptr(), ps = scratch.ptr();
      launch(k[0], kern::moeRouteLaunchRule().at(n), {&pl, &pri, &prw});
      launch(k[1], kern::moeSortLaunchRule(e32, c.x_q8).at(n), {&pri, &px, &prs, &n});
      launch(k[2], kern::moeSortLaunchRule(e32, c.x_q8).at(n), {&pl, &pi, &pw, &px, &ps, &n});
      const size_t slots = static_cast<size_t>(n) * c.k;
      const std::vector<int32_t> got_ids = ids.download<int32_t>(slots);
      CHECK(got_ids == ref_ids.download<int32_t>(slots));
      const std::vector<float> rw = ref_w.download<float>(slots), gw = w.download<float>(slots);
      CHECK(std::memcmp(rw.data(), gw.data(), slots * 4) == 0);
      // The scratch as 32-bit words: offsets, the slot list, the chosen experts, then (after A and Y) Xq.
      const std::vector<int32_t> rs = ref_scratch.download<int32_t>(scratch_bytes / 4), gs = scratch.download<int32_t>(scratch_bytes / 4);
      checkSortScratch(rs, gs, c.nexp, c.k);
      CHECK(rs[c.nexp] == static_cast<int32_t>(std::count_if(got_ids.begin(), got_ids.end(), [&](int32_t id) {
              return id >= 0 && id < static_cast<int32_t>(c.nexp);
            })));
      const size_t xq0 = kern::moeScratchXq(c.nexp, kMaxBatch, c.k, 64, e32),
                   xq1 = kern::moeScratchAq(c.nexp, kMaxBatch, c.k, 64, e32);
      CHECK(std::equal(rs.begin() + xq0, rs.begin() + xq1, gs.begin() + xq0));  // Xq (poison both when not written)
    }
  }
}

// minfer_moe_router_sort (MOE_ROUTER_SORT: the decode plan's router MatMul, MoeRoute and the MoeFfn's sort in one
// launch) against minfer_dense_gemv (the router's own kernel, its constants as ops/matmul.cpp gives them),
// minfer_moe_route and minfer_moe_sort: the logits, ids and weights bit-identical, the scratch's offsets, chosen
// experts and q8 x bit-identical, each expert's slots the same set, the counter word back to zero (launched
// twice). Expert counts 8, 37 (the last router block partly empty) and 128, F32, F16 and BF16 router planes,
// padded rows, a bias, widths with a scalar tail (74) and x quantized or not.
TEST_CASE("moe_router_sort: router GEMV, top-k and slot sort in one launch, bit-identical to dense_gemv + moe_route + moe_sort") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    uint32_t nexp, k;
    bool norm, x_q8;
    uint64_t e;
    GgmlType type;
    bool padded, bias;
  };
  const Case cases[] = {{8, 2, true, true, 256, GgmlType::F32, false, false},
                        {37, 3, false, false, 74, GgmlType::F32, true, true},
                        {37, 3, true, true, 512, GgmlType::F16, false, false},
                        {128, 8, true, true, 2048, GgmlType::F32, false, false},
                        {128, 8, true, false, 96, GgmlType::BF16, true, true}};
  for (const Case& c : cases) {
    const GpuWeight router = makeWeight(c.type, c.nexp, c.e, planes::TensorRole::kMatMul, c.padded);
    const StrideTable& plane = router.planes[0].table;
    const std::string tag = std::string(ggmlTypeTraits(c.type).name) + "_e" + str(c.nexp) + "_k" + str(c.k) +
                            (c.norm ? "_n" : "") + (c.x_q8 ? "_q8" : "") + "_n" + str(c.e) + (c.padded ? "_pad" : "") +
                            (c.bias ? "_bias" : "");
    CAPTURE(tag);
    const std::vector<std::pair<std::string, std::string>> dg = {
        {"DGEMV_N", str(c.nexp)}, {"DGEMV_K", str(c.e)}, {"DGEMV_PLANE", str(static_cast<unsigned>(plane.kind))},
        {"DGEMV_PITCH", str(plane.row_pitch)}, {"DGEMV_HAS_BIAS", c.bias ? "1" : "0"}};
    auto dr = moeCommon(c.nexp, c.k, 1, 1, "MOE_ROUTE");
    dr.push_back({"MOE_NORM", c.norm ? "1" : "0"});
    auto ds = moeCommon(c.nexp, c.k, 64, c.e, "MOE_SORT");
    ds.push_back({"MOE_X_Q8", c.x_q8 ? "1" : "0"});
    auto drs = moeCommon(c.nexp, c.k, 64, c.e, "MOE_ROUTER_SORT");
    drs.insert(drs.end(), {{"MOE_NORM", c.norm ? "1" : "0"}, {"MOE_X_Q8", c.x_q8 ? "1" : "0"},
                           {"MOE_R_PLANE", str(static_cast<unsigned>(plane.kind))}, {"MOE_R_PITCH", str(plane.row_pitch)},
                           {"MOE_R_HAS_BIAS", c.bias ? "1" : "0"}});
    auto drs_nosort = drs;  // the decode expert GEMVs' form: no slot sort
    drs_nosort.push_back({"MOE_SORT_SLOTS", "0"});
    std::vector<Kernel> k = compile({spec("moe_rts_test_gemv_" + tag, "kernels/dense_matmul.cuh", "minfer_dense_gemv", dg),
                                     spec("moe_rts_test_route_" + tag, "kernels/moe.cuh", "minfer_moe_route", dr),
                                     spec("moe_rts_test_sort_" + tag, "kernels/moe.cuh", "minfer_moe_sort", ds),
                                     spec("moe_rts_test_fused_" + tag, "kernels/moe.cuh", "minfer_moe_router_sort", drs),
                                     spec("moe_rts_test_nosort_" + tag, "kernels/moe.cuh", "minfer_moe_router_sort",
                                          drs_nosort)});
    const unsigned e32 = static_cast<unsigned>(c.e);
    const uint64_t scratch_bytes = kern::moeScratchBytes(c.nexp, kMaxBatch, c.k, 64, e32);
    const std::vector<float> bias_v = randomFloats(c.nexp, rng());
    DeviceArray d_bias = DeviceArray::of(bias_v), counters = DeviceArray::of(std::vector<uint32_t>{0});
    for (int round = 0; round < 2; ++round) {
      CAPTURE(round);
      const std::vector<float> x = activations(1, static_cast<int>(c.e));
      DeviceArray dx = DeviceArray::of(x), ref_logits(c.nexp * 4), logits(c.nexp * 4), ref_ids(c.k * 4), ref_w(c.k * 4),
                  ids(c.k * 4), w(c.k * 4), ref_scratch(scratch_bytes), scratch(scratch_bytes);
      for (DeviceArray* a : {&ref_logits, &logits, &ref_ids, &ref_w, &ids, &w, &ref_scratch, &scratch}) a->poison();
      CUdeviceptr rw = router.dev[0].ptr(), rb = c.bias ? d_bias.ptr() : 0, px = dx.ptr(), prl = ref_logits.ptr(),
                  pl = logits.ptr(), pri = ref_ids.ptr(), prw = ref_w.ptr(), pi = ids.ptr(), pw = w.ptr(),
                  prs = ref_scratch.ptr(), ps = scratch.ptr(), pc = counters.ptr();
      int one = 1;
      launch(k[0], kern::denseGemvLaunch(c.nexp), {&rw, &rb, &px, &prl});
      launch(k[1], kern::moeRouteLaunchRule().at(1), {&prl, &pri, &prw});
      launch(k[2], kern::moeSortLaunchRule(e32, c.x_q8).at(1), {&pri, &px, &prs, &one});
      launch(k[3], kern::moeRouterSortLaunchRule(c.nexp, e32, c.x_q8).at(1), {&rw, &rb, &px, &pl, &pi, &pw, &ps, &pc, &one});
      const std::vector<float> rlg = ref_logits.download<float>(c.nexp), glg = logits.download<float>(c.nexp);
      CHECK(std::memcmp(rlg.data(), glg.data(), c.nexp * 4) == 0);
      CHECK(ids.download<int32_t>(c.k) == ref_ids.download<int32_t>(c.k));
      const std::vector<float> rw_ = ref_w.download<float>(c.k), gw = w.download<float>(c.k);
      CHECK(std::memcmp(rw_.data(), gw.data(), c.k * 4) == 0);
      const std::vector<int32_t> rs = ref_scratch.download<int32_t>(scratch_bytes / 4), gs = scratch.download<int32_t>(scratch_bytes / 4);
      checkSortScratch(rs, gs, c.nexp, c.k);
      const size_t xq0 = kern::moeScratchXq(c.nexp, kMaxBatch, c.k, 64, e32),
                   xq1 = kern::moeScratchAq(c.nexp, kMaxBatch, c.k, 64, e32);
      CHECK(std::equal(rs.begin() + xq0, rs.begin() + xq1, gs.begin() + xq0));  // Xq (poison both when not written)
      CHECK(counters.download<uint32_t>(1)[0] == 0u);
      // MOE_SORT_SLOTS 0: the same logits, ids, weights and Xq; the sort's regions left as they were (poisoned).
      DeviceArray ns_logits(c.nexp * 4), ns_ids(c.k * 4), ns_w(c.k * 4), ns_scratch(scratch_bytes);
      for (DeviceArray* a : {&ns_logits, &ns_ids, &ns_w, &ns_scratch}) a->poison();
      const std::vector<int32_t> poisoned = ns_scratch.download<int32_t>(scratch_bytes / 4);
      CUdeviceptr nl = ns_logits.ptr(), ni = ns_ids.ptr(), nw = ns_w.ptr(), nsc = ns_scratch.ptr();
      launch(k[4], kern::moeRouterSortLaunchRule(c.nexp, e32, c.x_q8).at(1), {&rw, &rb, &px, &nl, &ni, &nw, &nsc, &pc, &one});
      const std::vector<float> nlg = ns_logits.download<float>(c.nexp), nwv = ns_w.download<float>(c.k);
      CHECK(std::memcmp(nlg.data(), glg.data(), c.nexp * 4) == 0);
      CHECK(ns_ids.download<int32_t>(c.k) == ref_ids.download<int32_t>(c.k));
      CHECK(std::memcmp(nwv.data(), gw.data(), c.k * 4) == 0);
      const std::vector<int32_t> ns = ns_scratch.download<int32_t>(scratch_bytes / 4);
      CHECK(std::equal(ns.begin(), ns.begin() + xq0, poisoned.begin()));  // offsets, list, used: not written
      CHECK(std::equal(rs.begin() + xq0, rs.begin() + xq1, ns.begin() + xq0));
      CHECK(counters.download<uint32_t>(1)[0] == 0u);
    }
  }
}

// Also the decode plan's minfer_moe_down_combine (MOE_DOWN_COMBINE) after the same sort and gate_up: its output
// bit-identical to down + combine, its counters left zero.
TEST_CASE("moe_ffn: sort, gate_up, down, combine vs cpu::moeFfn; decode reads only the chosen experts") {
  MINFER_REQUIRE_GPU(G);
  // The fixture's mix (Q4_K gate/up from blocks, Q5_0 down of 32 columns), Q8_0, F32 with widths that are
  // not multiples of 32 (4-wide loads) and not multiples of 4 (one element per load), Q6_K (blocks) /
  // Q8_0, and 128 experts choosing 8. kBlocks (Q4_K, Q6_K): both kernels from blocks with 16 (down) and 8
  // (gate/up) lanes per row; gate Q6_K with up Q4_K and n_embd of 9 blocks (32 lanes stepping over blocks)
  // with 4 lanes per down row; i8 gate/up writing q8 A for a Q6_K down whose 96 rows end inside its second
  // thread block of 64 (37 experts: the sort scan's lanes hold 2 each, the last ones none); Q4_K gate/up
  // with an F32 down and 40 rows of A; and 128 experts choosing 8.
  const MoeCase cases[] = {{GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q5_0, 8, 2, 32, 256},
                          {GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0, 5, 3, 64, 96},
                          {GgmlType::F32, GgmlType::F32, GgmlType::F32, 5, 3, 40, 72},
                          {GgmlType::F32, GgmlType::F32, GgmlType::F32, 5, 3, 42, 74},
                          {GgmlType::Q6_K, GgmlType::Q6_K, GgmlType::Q8_0, 7, 3, 96, 256},
                          {GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q8_0, 128, 8, 64, 256},
                          {GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K, 9, 3, 768, 512},
                          {GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::Q4_K, 6, 2, 256, 2304},
                          {GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q6_K, 37, 3, 256, 96},
                          {GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::F32, 5, 2, 40, 256},
                          {GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K, 128, 8, 256, 512}};
  for (const MoeCase& c : cases) {
    const std::string tag = c.tag();
    CAPTURE(tag);
    const auto [gate, up, down] = c.weights();
    auto dsort = moeCommon(c.nexp, c.k, c.f, c.e, "MOE_SORT");
    auto dgu = moeCommon(c.nexp, c.k, c.f, c.e, "MOE_GATE_UP");
    auto ddn = moeCommon(c.nexp, c.k, c.f, c.e, "MOE_DOWN");
    auto dcomb = moeCommon(c.nexp, c.k, c.f, c.e, "MOE_COMBINE");
    const ExpertArgs ga = expertDefines(gate, "G", dgu), ua = expertDefines(up, "U", dgu);
    const ExpertArgs da = expertDefines(down, "D", ddn);
    auto ddn_comb = ddn;  // the decode plan's down + combine launch
    ddn_comb.push_back({"MOE_DOWN_COMBINE", "1"});
    REQUIRE(ga.blocks() == ua.blocks());
    const bool x_q8 = ga.blocks(), a_q8 = da.blocks(), q8 = x_q8 || a_q8;
    dsort.push_back({"MOE_X_Q8", x_q8 ? "1" : "0"});
    dgu.push_back({"MOE_A_Q8", a_q8 ? "1" : "0"});
    std::vector<Kernel> k = compile({spec("moe_sort_test_" + tag, "kernels/moe.cuh", "minfer_moe_sort", dsort),
                                     spec("moe_gate_up_test_" + tag, "kernels/moe.cuh", "minfer_moe_gate_up", dgu),
                                     spec("moe_down_test_" + tag, "kernels/moe.cuh", "minfer_moe_down", ddn),
                                     spec("moe_combine_test_" + tag, "kernels/moe.cuh", "minfer_moe_combine", dcomb),
                                     spec("moe_down_combine_test_" + tag, "kernels/moe.cuh", "minfer_moe_down_combine",
                                          ddn_comb)});
    const auto f32 = static_cast<unsigned>(c.f), e32 = static_cast<unsigned>(c.e);
    const kern::LaunchRule sort_rule = kern::moeSortLaunchRule(e32, x_q8),
                           gu_rule = kern::moeExpertsLaunchRule(f32, kern::moeGateUpRows(x_q8, e32, a_q8), c.nexp, c.k),
                           dn_rule = kern::moeExpertsLaunchRule(e32, kern::moeDownRows(a_q8, f32), c.nexp, c.k),
                           comb_rule = kern::moeCombineLaunchRule(e32);
    // Only the chosen experts are launched: min(n·K, NEXP) thread blocks along y.
    CHECK(gu_rule.at(1).grid.y == std::min(c.k, c.nexp));
    CHECK(dn_rule.at(513).grid.y == std::min(513 * c.k, c.nexp));
    DeviceArray scratch(kern::moeScratchBytes(c.nexp, kMaxBatch, c.k, f32, e32));
    const std::vector<float> dense_gate = q8 ? dequantizeAll(gate) : std::vector<float>(),
                             dense_up = q8 ? dequantizeAll(up) : std::vector<float>(),
                             dense_down = q8 ? dequantizeAll(down) : std::vector<float>();
    // One MoeFfn step on device: x (n × E), ids and w (n × K) → out (n × E).
    auto run = [&](const std::vector<float>& x, const std::vector<int32_t>& ids, const std::vector<float>& w, int n,
                   const ExpertArgs& gw, const ExpertArgs& uw, const ExpertArgs& dw) {
      DeviceArray dx = DeviceArray::of(x), di = DeviceArray::of(ids), dwt = DeviceArray::of(w), out(kMaxBatch * c.e * 4);
      scratch.poison();
      out.poison();
      CUdeviceptr px = dx.ptr(), pi = di.ptr(), pw = dwt.ptr(), ps = scratch.ptr(), po = out.ptr();
      CUdeviceptr gq = gw.q, gs = gw.s, gm = gw.m, uq = uw.q, us = uw.s, um = uw.m, dq = dw.q, ds = dw.s, dm = dw.m;
      launch(k[0], sort_rule.at(n), {&pi, &px, &ps, &n});
      launch(k[1], gu_rule.at(n), {&px, &gq, &gs, &gm, &uq, &us, &um, &ps});
      launch(k[2], dn_rule.at(n), {&dq, &ds, &dm, &ps});
      launch(k[3], comb_rule.at(n), {&pi, &pw, &ps, &po, &n});
      const std::vector<float> got = out.download<float>(static_cast<size_t>(n) * c.e);
      // minfer_moe_down_combine on the same scratch (Y rewritten with the same values): out bit-identical, the
      // counters (one word per row tile) back to zero. Run for every token count, though decode launches one.
      const unsigned tiles = kern::ceilDiv(e32, kern::moeDownRows(a_q8, f32));
      const std::vector<uint32_t> zeros(tiles, 0);
      DeviceArray fused_out(kMaxBatch * c.e * 4), counters = DeviceArray::of(zeros);
      fused_out.poison();
      CUdeviceptr pfo = fused_out.ptr(), pc = counters.ptr();
      launch(k[4], dn_rule.at(n), {&dq, &ds, &dm, &ps, &pi, &pw, &pfo, &pc, &n});
      const std::vector<float> fused = fused_out.download<float>(static_cast<size_t>(n) * c.e);
      CHECK(std::memcmp(fused.data(), got.data(), got.size() * 4) == 0);
      CHECK(counters.download<uint32_t>(tiles) == zeros);
      return got;
    };
    // The GPU result vs cpu::moeFfn (f32 activations) and, with q8 activations, vs moeFfnQ8Ref.
    auto check = [&](const std::vector<float>& got, const std::vector<float>& x, const std::vector<int32_t>& ids,
                     const std::vector<float>& w, int n) {
      const cpu::RowSource gs = *cpu::pickRowSource(gate.view, false), us = *cpu::pickRowSource(up.view, false),
                           ds = *cpu::pickRowSource(down.view, false);
      std::vector<float> ref(static_cast<size_t>(n) * c.e),
          cpu_scratch(static_cast<size_t>(cpu::moeScratchFloats(static_cast<int64_t>(c.e), static_cast<int64_t>(c.f))));
      cpu::moeFfn(gate.view, gs, up.view, us, down.view, ds, x.data(), ids.data(), w.data(), n, static_cast<int>(c.k),
                  ref.data(), nullptr, cpu_scratch.data());
      if (!q8) {
        CHECK(track("moe_ffn", relError(got.data(), ref.data(), ref.size())) <= kMoeFfnTol);
        return;
      }
      CHECK(track("moe_ffn q8 vs f32 activations", relError(got.data(), ref.data(), ref.size())) <= kMoeFfnQ8ActTol);
      const std::vector<float> ref_q8 = moeFfnQ8Ref(dense_gate, dense_up, dense_down, x, ids, w, n, c.k, c.f, c.e,
                                                    x_q8, a_q8);
      CHECK(track("moe_ffn q8", relError(got.data(), ref_q8.data(), ref_q8.size())) <= kMoeFfnQ8Tol);
    };
    for (int n : kTokenCounts) {
      if (q8 && n == 513 && c.nexp == 128) continue;  // the host reference's time: 512 tokens cover the case
      CAPTURE(n);
      const std::vector<float> x = activations(n, static_cast<int>(c.e));
      const std::vector<float> logits = randomFloats(static_cast<size_t>(n) * c.nexp, rng(), -3.0f, 3.0f);
      std::vector<int32_t> ids(static_cast<size_t>(n) * c.k);
      std::vector<float> w(ids.size());
      cpu::moeRoute(logits.data(), n, static_cast<int>(c.nexp), static_cast<int>(c.k), true, ids.data(), w.data());
      check(run(x, ids, w, n, ga, ua, da), x, ids, w, n);
    }
    // Decode: every plane byte of the experts the token did not choose is poisoned (0xFF: NaN scales,
    // floats and block scales d), so reading any of them would make the output NaN.
    const int n = 1;
    const std::vector<float> x = activations(n, static_cast<int>(c.e));
    std::vector<int32_t> ids(c.k);
    std::vector<float> w(c.k);
    for (uint32_t j = 0; j < c.k; ++j) ids[j] = static_cast<int32_t>((3 * j + 1) % c.nexp), w[j] = 1.0f / (j + 2);
    std::vector<DeviceArray> poisoned;  // per weight, per plane: the chosen experts' bytes only
    poisoned.reserve(16);
    auto poison = [&](const GpuWeight& g, const ExpertArgs& a) {
      ExpertArgs p = a;
      for (const BuiltPlane& pl : g.planes) {
        std::vector<uint8_t> bytes(pl.bytes.size(), 0xFF);
        for (int32_t e : ids) {
          const uint64_t off = expertOffset(pl.table, static_cast<uint64_t>(e));
          std::memcpy(bytes.data() + off, pl.bytes.data() + off, pl.table.expert_pitch);
        }
        poisoned.push_back(DeviceArray::of(bytes));
        const CUdeviceptr ptr = poisoned.back().ptr();
        if (pl.table.kind == a.kind) p.q = ptr;
        if (pl.table.kind == PlaneKind::kScale && a.s) p.s = ptr;
        if (pl.table.kind == PlaneKind::kMin && a.m) p.m = ptr;
      }
      return p;
    };
    const ExpertArgs gp = poison(gate, ga), upp = poison(up, ua), dp = poison(down, da);
    check(run(x, ids, w, n, gp, upp, dp), x, ids, w, n);
  }
}

// The decode plan's expert GEMVs on the GGUF blocks (minfer_moe_gate_up_dec, minfer_moe_down_dec; one token): after
// the sort launch's q8 x, out = Σ_j w[j]·down_e(silu(gate_e·x)·up_e·x) of the chosen experts e = ids[j], against the
// host on the same q8 activations (kMoeFfnQ8Tol), against cpu::moeFfn (kMoeFfnQ8ActTol), and against the sorted
// kernels' result (minfer_moe_gate_up + minfer_moe_down_combine, the same dot products summed in another order:
// kMoeDecVsSortedTol). Every byte of the experts not chosen is poisoned (0xFF: NaN block scales), the counters are
// zero again afterwards, and an id that is not an expert (−1) drops its slot as cpu::moeFfn does. Shapes: the
// qwen3-30b-a3b layer (128 experts choosing 8 of 768 × 2048: two gate|up outputs per warp, 96 down parts per row);
// n_embd 4096 (two per pair of warps); gate Q6_K with up Q4_K at n_embd 2304 (9 blocks: a second step for one lane
// group); an expert width of 5 blocks (40 down parts per row: lanes 8 … 31 idle in the second step). The down
// launch with the residual Add and deferred RMSNorm after it (MOE_ADD_NORM) is checked on each run (checkAddNorm).
TEST_CASE("moe decode expert GEMVs on the GGUF blocks vs the host, cpu::moeFfn and the sorted kernels") {
  MINFER_REQUIRE_GPU(G);
  const MoeCase cases[] = {{GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K, 128, 8, 768, 2048},
                          {GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K, 16, 4, 512, 4096},
                          {GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::Q6_K, 9, 3, 256, 2304},
                          {GgmlType::Q6_K, GgmlType::Q6_K, GgmlType::Q4_K, 6, 2, 1280, 256}};
  for (const MoeCase& c : cases) {
    const std::string tag = c.tag();
    CAPTURE(tag);
    const auto [gate, up, down] = c.weights();
    auto dsort = moeCommon(c.nexp, c.k, c.f, c.e, "MOE_SORT");
    auto dgu = moeCommon(c.nexp, c.k, c.f, c.e, "MOE_GATE_UP");
    auto ddn = moeCommon(c.nexp, c.k, c.f, c.e, "MOE_DOWN");
    const ExpertArgs ga = expertDefines(gate, "G", dgu), ua = expertDefines(up, "U", dgu);
    const ExpertArgs da = expertDefines(down, "D", ddn);
    REQUIRE((ga.blocks() && ua.blocks() && da.blocks()));
    dsort.push_back({"MOE_X_Q8", "1"});
    dgu.push_back({"MOE_A_Q8", "1"});
    ddn.push_back({"MOE_DOWN_COMBINE", "1"});
    // The decode kernels' constants: each weight's TYPE, GP, PITCH and EPITCH (ops/moe.cpp defineBlocksWeight).
    auto blocksDefines = [&](std::vector<std::pair<std::string, std::string>> from, const char* which,
                             std::initializer_list<const char*> weights) {
      auto d = moeCommon(c.nexp, c.k, c.f, c.e, which);
      for (const char* x : weights)
        for (const char* name : {"TYPE", "GP", "PITCH", "EPITCH"})
          for (const auto& [key, value] : from)
            if (key == std::string("MOE_") + x + "_" + name) d.push_back({key, value});
      return d;
    };
    auto dall = dgu;
    dall.insert(dall.end(), ddn.begin(), ddn.end());
    auto add_norm_defines = blocksDefines(dall, "MOE_DOWN_DEC", {"D"});
    add_norm_defines.push_back({"MOE_ADD_NORM", "1"});
    std::vector<Kernel> k = compile(
        {spec("moe_sort_dec_test_" + tag, "kernels/moe.cuh", "minfer_moe_sort", dsort),
         spec("moe_gate_up_dec_test_" + tag, "kernels/moe.cuh", "minfer_moe_gate_up_dec",
              blocksDefines(dall, "MOE_GATE_UP_DEC", {"G", "U", "D"})),
         spec("moe_down_dec_test_" + tag, "kernels/moe.cuh", "minfer_moe_down_dec",
              blocksDefines(dall, "MOE_DOWN_DEC", {"D"})),
         spec("moe_gate_up_sorted_test_" + tag, "kernels/moe.cuh", "minfer_moe_gate_up", dgu),
         spec("moe_down_sorted_test_" + tag, "kernels/moe.cuh", "minfer_moe_down_combine", ddn),
         spec("moe_down_dec_add_norm_test_" + tag, "kernels/moe.cuh", "minfer_moe_down_dec", add_norm_defines)});
    const auto f32 = static_cast<unsigned>(c.f), e32 = static_cast<unsigned>(c.e);
    const unsigned n_counters = c.k * f32 / 32, tiles = kern::ceilDiv(e32, kern::moeDownRows(true, f32));
    const std::vector<float> dense_gate = dequantizeAll(gate), dense_up = dequantizeAll(up),
                             dense_down = dequantizeAll(down);
    const std::vector<float> x = activations(1, static_cast<int>(c.e));
    std::vector<int32_t> ids(c.k);
    std::vector<float> w(c.k);
    for (uint32_t j = 0; j < c.k; ++j) ids[j] = static_cast<int32_t>((5 * j + 2) % c.nexp), w[j] = 1.0f / (j + 1.5f);
    // Every expert's bytes poisoned but the chosen ones'.
    std::vector<DeviceArray> poisoned;
    auto poison = [&](const GpuWeight& g) {
      const BuiltPlane& pl = g.planes.at(0);
      REQUIRE(pl.table.kind == PlaneKind::kBlocks);
      std::vector<uint8_t> bytes(pl.bytes.size(), 0xFF);
      for (int32_t e : ids) {
        const uint64_t off = expertOffset(pl.table, static_cast<uint64_t>(e));
        std::memcpy(bytes.data() + off, pl.bytes.data() + off, pl.table.expert_pitch);
      }
      poisoned.push_back(DeviceArray::of(bytes));
      return poisoned.back().ptr();
    };
    poisoned.reserve(3);
    CUdeviceptr gq = poison(gate), uq = poison(up), dq = poison(down), null = 0;
    // The down launch with the residual Add and the deferred RMSNorm after it (MOE_ADD_NORM; its first four
    // arguments `head`, on the scratch minfer_moe_gate_up_dec left), twice (the counters back to zero), the residual
    // updated in place and not: its output bit-identical to the plain launch's `plain`, the sum to res + plain on the
    // host, the q8 buffer to the host mirror of quantize_act on u = sum ⊙ nw, each block's Σ sum² against float64
    // (kRmsNormTol).
    const std::vector<float> res_v = activations(1, static_cast<int>(c.e)), nw_v = randomFloats(c.e, rng());
    auto checkAddNorm = [&](const Kernel& kernel, const std::vector<float>& plain, std::vector<void*> head) {
      std::vector<float> want_sum(c.e), u(c.e), want_partial(c.e / 32);
      for (size_t r = 0; r < c.e; ++r) want_sum[r] = res_v[r] + plain[r], u[r] = want_sum[r] * nw_v[r];
      for (size_t b = 0; b < c.e / 32; ++b) {
        double ss = 0;
        for (size_t j = 0; j < 32; ++j) ss += static_cast<double>(want_sum[32 * b + j]) * want_sum[32 * b + j];
        want_partial[b] = static_cast<float>(ss);
      }
      DeviceArray nw = DeviceArray::of(nw_v), counters = DeviceArray::of(std::vector<uint32_t>(c.e / 32, 0));
      for (int in_place = 0; in_place < 2; ++in_place) {
        CAPTURE(in_place);
        DeviceArray out(c.e * 4), res = DeviceArray::of(res_v), sum(c.e * 4), qs(c.e), meta(c.e / 32 * 8),
            partial(c.e / 32 * 4);
        for (DeviceArray* d : {&out, &sum, &qs, &meta, &partial}) d->poison();
        CUdeviceptr po = out.ptr(), pr = res.ptr(), psum = in_place ? res.ptr() : sum.ptr(), pnw = nw.ptr(),
                    pq = qs.ptr(), pm = meta.ptr(), pp = partial.ptr(), pc = counters.ptr();
        std::vector<void*> args = head;
        args.insert(args.end(), {&po, &pr, &psum, &pnw, &pq, &pm, &pp, &pc});
        launch(kernel, kern::moeDownDecLaunchRule(e32).at(1), args);
        CHECK(out.download<float>(c.e) == plain);
        CHECK((in_place ? res : sum).download<float>(c.e) == want_sum);
        checkQ8Of(u, qs, meta, 1, static_cast<int>(c.e));
        const std::vector<float> got_partial = partial.download<float>(c.e / 32);
        CHECK(track("moe down + add + norm partial sums",
                    relError(got_partial.data(), want_partial.data(), want_partial.size())) <= kRmsNormTol);
        CHECK(counters.download<uint32_t>(c.e / 32) == std::vector<uint32_t>(c.e / 32, 0));
      }
    };
    // The decode kernels, then the sorted ones on the same sort, for ids `use` (the sort and the sorted kernels
    // see only valid ids: −1 is given to the decode kernels alone).
    auto run = [&](const std::vector<int32_t>& use) {
      DeviceArray dx = DeviceArray::of(x), di = DeviceArray::of(use), dw = DeviceArray::of(w), out(c.e * 4),
                  sorted_out(c.e * 4), scratch(kern::moeScratchBytes(c.nexp, kMaxBatch, c.k, f32, e32));
      std::vector<int32_t> valid = use;
      for (int32_t& id : valid) id = id < 0 ? ids[0] : id;
      DeviceArray dvalid = DeviceArray::of(valid);
      const std::vector<uint32_t> zeros(std::max(n_counters, tiles), 0);
      DeviceArray counters = DeviceArray::of(zeros), tile_counters = DeviceArray::of(zeros);
      scratch.poison();
      out.poison();
      sorted_out.poison();
      int n = 1;
      CUdeviceptr px = dx.ptr(), pi = di.ptr(), pv = dvalid.ptr(), pw = dw.ptr(), ps = scratch.ptr(), po = out.ptr(),
                  pso = sorted_out.ptr(), pc = counters.ptr(), ptc = tile_counters.ptr();
      launch(k[0], kern::moeSortLaunchRule(e32, true).at(1), {&pv, &px, &ps, &n});
      launch(k[1], kern::moeGateUpDecLaunchRule(c.k, f32, e32).at(1), {&pi, &gq, &uq, &dq, &ps, &pc});
      launch(k[2], kern::moeDownDecLaunchRule(e32).at(1), {&pi, &pw, &dq, &ps, &po});
      CHECK(counters.download<uint32_t>(n_counters) == std::vector<uint32_t>(n_counters, 0));
      checkAddNorm(k[5], out.download<float>(c.e), {&pi, &pw, &dq, &ps});
      launch(k[3], kern::moeExpertsLaunchRule(f32, kern::moeGateUpRows(true, e32, true), c.nexp, c.k).at(1),
             {&px, &gq, &null, &null, &uq, &null, &null, &ps});
      launch(k[4], kern::moeExpertsLaunchRule(e32, kern::moeDownRows(true, f32), c.nexp, c.k).at(1),
             {&dq, &null, &null, &ps, &pv, &pw, &pso, &ptc, &n});
      return std::pair{out.download<float>(c.e), sorted_out.download<float>(c.e)};
    };
    const auto [got, sorted] = run(ids);
    const std::vector<float> ref_q8 = moeFfnQ8Ref(dense_gate, dense_up, dense_down, x, ids, w, 1, c.k, c.f, c.e, true, true);
    CHECK(track("moe decode experts q8", relError(got.data(), ref_q8.data(), ref_q8.size())) <= kMoeFfnQ8Tol);
    CHECK(track("moe decode experts vs sorted", relError(got.data(), sorted.data(), sorted.size())) <=
          kMoeDecVsSortedTol);
    const cpu::RowSource gs = *cpu::pickRowSource(gate.view, false), us = *cpu::pickRowSource(up.view, false),
                         ds = *cpu::pickRowSource(down.view, false);
    std::vector<float> ref(c.e),
        cpu_scratch(static_cast<size_t>(cpu::moeScratchFloats(static_cast<int64_t>(c.e), static_cast<int64_t>(c.f))));
    cpu::moeFfn(gate.view, gs, up.view, us, down.view, ds, x.data(), ids.data(), w.data(), 1, static_cast<int>(c.k),
                ref.data(), nullptr, cpu_scratch.data());
    CHECK(track("moe decode experts q8 vs f32 activations", relError(got.data(), ref.data(), ref.size())) <=
          kMoeFfnQ8ActTol);
    // Slot 1 not an expert: the host's sum without it (its weight 0).
    std::vector<int32_t> dropped = ids;
    dropped[1] = -1;
    std::vector<float> w0 = w;
    w0[1] = 0.0f;
    const std::vector<float> got_dropped = run(dropped).first;
    const std::vector<float> ref_dropped =
        moeFfnQ8Ref(dense_gate, dense_up, dense_down, x, ids, w0, 1, c.k, c.f, c.e, true, true);
    CHECK(track("moe decode experts q8", relError(got_dropped.data(), ref_dropped.data(), ref_dropped.size())) <=
          kMoeFfnQ8Tol);
  }
}

}  // namespace
}  // namespace minfer::test::gpu
