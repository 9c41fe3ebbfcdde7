// GPU parity (test_cuda_kernels): the quantized matmuls on derived planes (MMQ, GEMV, gemm_small), the dense float
// matmuls and the Hopper f16 matmul (wgmma).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/dense_matmul.cuh"
#include "kernels/gemm_small.cuh"
#include "kernels/gemv.cuh"
#include "kernels/mmq.cuh"
#include "kernels/wgmma_matmul.cuh"
#include "tests/cuda/kernel_test_support.h"

namespace minfer::test::gpu {
namespace {

// MMQ (prefill) and GEMV (decode) on one quantized weight; returns nothing, checks inside.
void checkQuantizedMatmul(GgmlType type, uint64_t n_rows, uint64_t k_cols, bool bias, bool padded, unsigned tm) {
  const std::string type_name = ggmlTypeTraits(type).name;
  CAPTURE(type_name);
  CAPTURE(n_rows);
  CAPTURE(k_cols);
  CAPTURE(bias);
  CAPTURE(padded);
  const GpuWeight g = makeWeight(type, n_rows, k_cols, planes::TensorRole::kMatMul, padded);
  const StrideTable* q = g.table(PlaneKind::kI8);
  const StrideTable* s = g.table(PlaneKind::kScale);
  const StrideTable* m = g.table(PlaneKind::kMin);
  const StrideTable* packed = g.table(PlaneKind::kPacked);
  REQUIRE(q);
  REQUIRE(s);
  REQUIRE(s->group_pitch == 4);
  const std::string tag = codegen::typeTag(static_cast<uint32_t>(type)) + "_n" + str(n_rows) + "_k" + str(k_cols) +
                          (bias ? "_bias" : "") + (padded ? "_pad" : "");
  const std::string has_min = m ? "1" : "0", m_pitch = m ? str(m->row_pitch) : "0";
  std::vector<codegen::KernelSpec> specs;
  specs.push_back(spec("mmq_test_" + tag, "kernels/mmq.cuh", "minfer_mmq",
                       {{"MMQ_N", str(n_rows)}, {"MMQ_K", str(k_cols)}, {"MMQ_GROUP", str(s->group_size)},
                        {"MMQ_HAS_MIN", has_min}, {"MMQ_HAS_BIAS", bias ? "1" : "0"},
                        {"MMQ_Q_PITCH", str(q->row_pitch)}, {"MMQ_S_PITCH", str(s->row_pitch)},
                        {"MMQ_M_PITCH", m_pitch}, {"MMQ_TM", str(tm)}, {"MMQ_TN", "64"}}));
  const bool four = packed && packed->bits == 4;
  const StrideTable* read = four ? packed : q;
  specs.push_back(spec("gemv_test_" + tag, "kernels/gemv.cuh", "minfer_gemv",
                       {{"GEMV_N", str(n_rows)}, {"GEMV_K", str(k_cols)}, {"GEMV_BITS", four ? "4" : "8"},
                        {"GEMV_PITCH", str(read->row_pitch)}, {"GEMV_Q_OFFSET", std::to_string(four ? packed->q_offset : 0)},
                        {"GEMV_GROUP", str(s->group_size)}, {"GEMV_S_PITCH", str(s->row_pitch)},
                        {"GEMV_HAS_MIN", has_min}, {"GEMV_M_PITCH", m_pitch}, {"GEMV_HAS_BIAS", bias ? "1" : "0"}}));
  std::vector<Kernel> k = compile(specs);

  const std::vector<float> bias_v = randomFloats(n_rows, rng());
  DeviceArray d_bias = DeviceArray::of(bias_v), out(kMaxBatch * n_rows * 4);
  CUdeviceptr wq = g.ptr(PlaneKind::kI8), ws = g.ptr(PlaneKind::kScale), wm = g.ptr(PlaneKind::kMin),
              wb = bias ? d_bias.ptr() : 0, wp = four ? g.ptr(PlaneKind::kPacked) : wq;
  for (int n : kTokenCounts) {
    CAPTURE(n);
    const std::vector<float> x = activations(n, static_cast<int>(k_cols));
    const HostQ8 hq = quantizeHost(x, n, static_cast<int>(k_cols));
    DeviceArray xq = DeviceArray::of(hq.qs), xm = DeviceArray::of(hq.meta);
    out.poison();
    CUdeviceptr a = xq.ptr(), b = xm.ptr(), o = out.ptr();
    launch(k[0], kern::mmqLaunch(n_rows, n, tm, 64, static_cast<unsigned>(s->group_size), m != nullptr),
           {&wq, &ws, &wm, &wb, &a, &b, &o, &n});
    const std::vector<float> got = out.download<float>(static_cast<size_t>(n) * n_rows);
    const std::vector<float> ref = cpuMatmul(g, cpu::RowSource::kQuantized, bias ? bias_v.data() : nullptr, hq.deq, n);
    const double err = relError(got.data(), ref.data(), ref.size());
    CHECK(track("mmq", err) <= kMmqTol);
    const std::vector<float> ref_f = cpuMatmul(g, cpu::RowSource::kQuantized, bias ? bias_v.data() : nullptr, x, n);
    CHECK(track("mmq vs f32 activations", relError(got.data(), ref_f.data(), ref_f.size())) <= kQ8ActTol);
    if (n == 1) {  // decode GEMV on the same input
      out.poison();
      launch(k[1], kern::gemvLaunch(n_rows), {&wp, &ws, &wm, &wb, &a, &b, &o});
      const std::vector<float> got1 = out.download<float>(n_rows);
      CHECK(track("gemv", relError(got1.data(), ref.data(), n_rows)) <= kGemvTol);
    }
  }
}

TEST_CASE("mmq and gemv: every quantized type, planner planes") {
  MINFER_REQUIRE_GPU(G);
  int i = 0;
  for (GgmlType t : kQuantTypes) {
    const bool small_blocks = ggmlTypeTraits(t).block_size == 32;
    checkQuantizedMatmul(t, 328, 768, i % 2 == 0, false, i % 2 ? 64 : 128);
    if (small_blocks) checkQuantizedMatmul(t, 200, 352, i % 2 == 1, false, 64);  // K % 64 == 32: partial stage
    ++i;
  }
}

TEST_CASE("mmq and gemv: padded row pitches (offset gate)") {
  MINFER_REQUIRE_GPU(G);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q4_1, GgmlType::Q2_K})
    checkQuantizedMatmul(t, 136, 512, true, true, 64);
}

// One small-batch matmul launch (gemm_small.cuh) of `rows` rows of an N = n_rows weight,
// checked against `ref`: out (and the split-K scratch) poisoned first, the error within `tol` (tracked as
// `family`), the counters back to zero, nothing written past the call's rows.
void checkSmallBatchLaunch(const Kernel& k, const kern::LaunchShape& shape, std::vector<void*> args, DeviceArray& out,
                           DeviceArray& partial, DeviceArray& counters, int rows, uint64_t n_rows,
                           const std::vector<float>& ref, const char* family, double tol) {
  out.poison();
  partial.poison();
  launch(k, shape, std::move(args));
  const std::vector<float> got = out.download<float>(static_cast<size_t>(rows) * n_rows);
  CHECK(track(family, relError(got.data(), ref.data(), ref.size())) <= tol);
  const uint64_t words = counters.size() / 4;
  CHECK(counters.download<uint32_t>(words) == std::vector<uint32_t>(words, 0));
  const std::vector<float> after = out.download<float>(n_rows, static_cast<uint64_t>(rows) * n_rows * 4);
  CHECK(std::all_of(after.begin(), after.end(), [](float v) { return std::isnan(v); }));
}

// minfer_gemm_small (batched decode rows) on the planes the decode GEMV reads (kPacked for Q4_0 / Q4_1, else
// kI8) against the CPU matmul on the same q8 activations: row counts 1 … 64 (partial n8 tiles), N not a
// multiple of 16 or of the 128 rows of a block, the codegen's split count and one split, with and without a
// bias; the counters must be zero after every launch (the split-K epilogue resets them).
void checkGemmSmall(GgmlType type, uint64_t n_rows, uint64_t k_cols, bool bias, bool padded) {
  const std::string type_name = ggmlTypeTraits(type).name;
  CAPTURE(type_name);
  CAPTURE(n_rows);
  CAPTURE(k_cols);
  CAPTURE(bias);
  CAPTURE(padded);
  const GpuWeight g = makeWeight(type, n_rows, k_cols, planes::TensorRole::kMatMul, padded);
  const StrideTable* q = g.table(PlaneKind::kI8);
  const StrideTable* s = g.table(PlaneKind::kScale);
  const StrideTable* m = g.table(PlaneKind::kMin);
  const StrideTable* packed = g.table(PlaneKind::kPacked);
  REQUIRE(q);
  REQUIRE(s);
  const bool four = packed && packed->bits == 4 && s->group_size == 32;
  const StrideTable* read = four ? packed : q;
  const unsigned n = static_cast<unsigned>(n_rows), auto_splits = kern::gemmSmallSplits(n, static_cast<unsigned>(k_cols));
  const unsigned split_counts[2] = {1, std::max(2u, auto_splits)};
  std::vector<codegen::KernelSpec> specs;
  for (unsigned splits : split_counts)
    specs.push_back(spec("gemm_small_test_" + codegen::typeTag(static_cast<uint32_t>(type)) + "_n" + str(n_rows) + "_k" +
                             str(k_cols) + "_s" + str(splits) + (bias ? "_bias" : "") + (padded ? "_pad" : ""),
                         "kernels/gemm_small.cuh", "minfer_gemm_small",
                         {{"SB_N", str(n_rows)}, {"SB_K", str(k_cols)}, {"SB_BITS", four ? "4" : "8"},
                          {"SB_PITCH", str(read->row_pitch)}, {"SB_Q_OFFSET", std::to_string(four ? packed->q_offset : 0)},
                          {"SB_GROUP", str(s->group_size)}, {"SB_S_PITCH", str(s->row_pitch)},
                          {"SB_HAS_MIN", m ? "1" : "0"}, {"SB_M_PITCH", m ? str(m->row_pitch) : "0"},
                          {"SB_HAS_BIAS", bias ? "1" : "0"}, {"SB_SPLITS", str(splits)}}));
  std::vector<Kernel> k = compile(specs);
  const std::vector<float> bias_v = randomFloats(n_rows, rng());
  const uint64_t counter_words = kern::gemmSmallCounterBytes(n) / 4;
  const std::vector<uint32_t> zeros(counter_words, 0);
  // One row more than the kernel takes: the check that nothing is written past the call's rows reads it.
  DeviceArray d_bias = DeviceArray::of(bias_v), out((kern::kGemmSmallMaxRows + 1) * n_rows * 4),
      partial(std::max<uint64_t>(4, kern::gemmSmallScratchBytes(n, split_counts[1]))), counters(counter_words * 4);
  counters.upload(zeros.data(), zeros.size() * 4);
  CUdeviceptr wp = four ? g.ptr(PlaneKind::kPacked) : g.ptr(PlaneKind::kI8), ws = g.ptr(PlaneKind::kScale),
              wm = g.ptr(PlaneKind::kMin), wb = bias ? d_bias.ptr() : 0, pp = partial.ptr(), pc = counters.ptr();
  for (int rows : {1, 2, 7, 8, 9, 33, 64}) {
    CAPTURE(rows);
    const std::vector<float> x = activations(rows, static_cast<int>(k_cols));
    const HostQ8 hq = quantizeHost(x, rows, static_cast<int>(k_cols));
    DeviceArray xq = DeviceArray::of(hq.qs), xm = DeviceArray::of(hq.meta);
    const std::vector<float> ref = cpuMatmul(g, cpu::RowSource::kQuantized, bias ? bias_v.data() : nullptr, hq.deq, rows);
    for (size_t i = 0; i < 2; ++i) {
      CAPTURE(split_counts[i]);
      CUdeviceptr a = xq.ptr(), b = xm.ptr(), o = out.ptr();
      int nt = rows;
      checkSmallBatchLaunch(k[i], kern::gemmSmallLaunch(n, split_counts[i]), {&wp, &ws, &wm, &wb, &a, &b, &o, &pp, &pc, &nt},
                            out, partial, counters, rows, n_rows, ref, "gemm_small", kGemmSmallTol);
    }
  }
}

TEST_CASE("gemm_small: Q4_K, Q4_0, Q4_1, Q6_K, Q8_0, Q2_K planes, 1 to 64 rows, odd N, split-K") {
  MINFER_REQUIRE_GPU(G);
  checkGemmSmall(GgmlType::Q4_K, 328, 768, true, false);
  checkGemmSmall(GgmlType::Q4_0, 200, 352, false, false);   // kPacked, q offset −8; K/32 = 11 (uneven splits)
  checkGemmSmall(GgmlType::Q4_1, 136, 1024, true, false);   // kPacked with a kMin plane
  checkGemmSmall(GgmlType::Q6_K, 211, 512, true, false);    // groups of 16: two k16 MMAs
  checkGemmSmall(GgmlType::Q8_0, 520, 4096, false, false);  // several row blocks, many splits
  checkGemmSmall(GgmlType::Q2_K, 24, 256, true, false);     // groups of 16 with mins; N < one m16 pair
}

TEST_CASE("gemm_small: padded row pitches (offset gate)") {
  MINFER_REQUIRE_GPU(G);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0}) checkGemmSmall(t, 136, 512, true, true);
}

TEST_CASE("dense_mm and dense_gemv: F32, F16, BF16") {
  MINFER_REQUIRE_GPU(G);
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
    for (uint64_t kk : {uint64_t{172}, uint64_t{512}})
      for (bool padded : {false, true}) {
        CAPTURE(ggmlTypeTraits(t).name);
        CAPTURE(kk);
        CAPTURE(padded);
        const uint64_t n_rows = 300;
        const GpuWeight g = makeWeight(t, n_rows, kk, planes::TensorRole::kMatMul, padded);
        const StrideTable& d = g.planes[0].table;
        const bool bias = kk == 512;
        const std::string tag = codegen::typeTag(static_cast<uint32_t>(t)) + "_k" + str(kk) + (padded ? "_pad" : "");
        auto defs = [&](const char* p) {
          return std::vector<std::pair<std::string, std::string>>{{std::string(p) + "N", str(n_rows)},
                                                                  {std::string(p) + "K", str(kk)},
                                                                  {std::string(p) + "PLANE", str(static_cast<unsigned>(d.kind))},
                                                                  {std::string(p) + "PITCH", str(d.row_pitch)},
                                                                  {std::string(p) + "HAS_BIAS", bias ? "1" : "0"}};
        };
        std::vector<Kernel> k = compile({spec("dense_mm_test_" + tag, "kernels/dense_matmul.cuh", "minfer_dense_mm", defs("DMM_")),
                                         spec("dense_gemv_test_" + tag, "kernels/dense_matmul.cuh", "minfer_dense_gemv",
                                              defs("DGEMV_"))});
        const std::vector<float> bias_v = randomFloats(n_rows, rng());
        DeviceArray d_bias = DeviceArray::of(bias_v), out(kMaxBatch * n_rows * 4);
        CUdeviceptr w = g.dev[0].ptr(), b = bias ? d_bias.ptr() : 0;
        for (int n : kTokenCounts) {
          CAPTURE(n);
          const std::vector<float> x = activations(n, static_cast<int>(kk));
          DeviceArray d_x = DeviceArray::of(x);
          CUdeviceptr a = d_x.ptr(), o = out.ptr();
          const std::vector<float> ref = cpuMatmul(g, cpu::RowSource::kDense, bias ? bias_v.data() : nullptr, x, n);
          out.poison();
          launch(k[0], kern::denseMmLaunch(n_rows, n), {&w, &b, &a, &o, &n});
          std::vector<float> got = out.download<float>(ref.size());
          CHECK(track("dense_mm", relError(got.data(), ref.data(), ref.size())) <= kDenseTol);
          if (n == 1) {
            out.poison();
            launch(k[1], kern::denseGemvLaunch(n_rows), {&w, &b, &a, &o});
            got = out.download<float>(n_rows);
            CHECK(track("dense_gemv", relError(got.data(), ref.data(), n_rows)) <= kDenseTol);
          }
        }
      }
}

// f16 values of `v` on the host (the binary16 bits and their float values).
struct HostF16 {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};
HostF16 toF16(const std::vector<float>& v, uint64_t rows, uint64_t cols, uint64_t pitch_elems) {
  HostF16 h;
  h.bits.assign(rows * pitch_elems, 0x7E00);  // NaN in the padding: a kernel reading it poisons its output
  h.values.resize(rows * cols);
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t c = 0; c < cols; ++c) {
      const uint16_t b = floatToHalf(v[r * cols + c]);
      h.bits[r * pitch_elems + c] = b;
      h.values[r * cols + c] = halfToFloat(b);
    }
  return h;
}
// out[t][r] = Σ_c w[r][c]·x[t][c] (+ bias) in float64, rounded to f32.
std::vector<float> referenceMatmul(const std::vector<float>& w, const std::vector<float>& x, const float* bias, int n,
                                   uint64_t rows, uint64_t cols) {
  std::vector<float> out(static_cast<size_t>(n) * rows);
  for (int t = 0; t < n; ++t)
    for (uint64_t r = 0; r < rows; ++r) {
      double acc = bias ? bias[r] : 0.0;
      for (uint64_t c = 0; c < cols; ++c) acc += static_cast<double>(w[r * cols + c]) * x[static_cast<size_t>(t) * cols + c];
      out[static_cast<size_t>(t) * rows + r] = static_cast<float>(acc);
    }
  return out;
}

TEST_CASE("wgmma_matmul (sm_90a): f16 and q8 activations vs float64 on the same f16 values, odd shapes and tiles") {
  MINFER_REQUIRE_GPU(G);
  if (G->arch != "sm_90") {
    MESSAGE("skipped: wgmma_matmul needs an sm_90 GPU (sm_90a image); this one is " << G->arch);
    return;
  }
  struct Case {
    GgmlType type;
    uint64_t rows, cols;
    unsigned bm, bn, stages;
    bool bias;
  };
  // Rows not a multiple of the tile; K a multiple of 64 or not (the last stage partly past K).
  const Case cases[] = {{GgmlType::Q4_K, 300, 768, 64, 64, 4, false},
                        {GgmlType::Q6_K, 333, 1280, 128, 128, 6, true},
                        {GgmlType::Q5_0, 260, 800, 128, 256, 4, true},
                        {GgmlType::Q8_0, 72, 1056, 64, 128, 5, false}};
  for (const Case& cs : cases) {
    CAPTURE(ggmlTypeTraits(cs.type).name);
    CAPTURE(cs.rows);
    CAPTURE(cs.cols);
    CAPTURE(cs.bm);
    CAPTURE(cs.bn);
    const RandomWeight w = makeRandomWeight(cs.type, cs.rows, cs.cols, rng(), 0.5f);
    const uint64_t pitch = alignUp(cs.cols * 2, 16) + 16;  // padded rows: the offset gate
    const HostF16 wh = toF16(w.values, cs.rows, cs.cols, pitch / 2);
    std::vector<codegen::KernelSpec> specs;
    for (int act : {0, 1}) {
      const std::string tag = codegen::typeTag(static_cast<uint32_t>(cs.type)) + "_n" + str(cs.rows) + "_k" +
                              str(cs.cols) + "_a" + std::to_string(act);
      specs.push_back(spec("wgmma_test_" + tag, "kernels/wgmma_matmul.cuh", "minfer_wgmma_matmul",
                           {{"WG_N", str(cs.rows)}, {"WG_K", str(cs.cols)}, {"WG_W_PITCH", str(pitch)},
                            {"WG_BM", str(cs.bm)}, {"WG_BN", str(cs.bn)}, {"WG_STAGES", str(cs.stages)},
                            {"WG_ACT", std::to_string(act)}, {"WG_HAS_BIAS", cs.bias ? "1" : "0"}}));
    }
    specs.push_back(spec("q8_to_f16_test_k" + str(cs.cols), "kernels/wgmma_matmul.cuh", "minfer_q8_to_f16",
                         {{"Q8F16_K", str(cs.cols)}}));
    std::vector<Kernel> k = compile(specs, "sm_90a");
    const std::vector<float> bias_v = randomFloats(cs.rows, rng());
    DeviceArray d_w = DeviceArray::of(wh.bits), d_bias = DeviceArray::of(bias_v), out(kMaxBatch * cs.rows * 4);
    const float* bias = cs.bias ? bias_v.data() : nullptr;
    CUdeviceptr pw = d_w.ptr(), pb = cs.bias ? d_bias.ptr() : 0, po = out.ptr();
    for (int n : kTokenCounts) {
      CAPTURE(n);
      const std::vector<float> x = activations(n, static_cast<int>(cs.cols));
      const std::vector<float> exact = referenceMatmul(w.values, x, bias, n, cs.rows, cs.cols);
      // f16 activations.
      const HostF16 xh = toF16(x, static_cast<uint64_t>(n), cs.cols, cs.cols);
      DeviceArray d_x = DeviceArray::of(xh.bits);
      CUdeviceptr px = d_x.ptr(), pm = 0;
      out.poison();
      launch(k[0], kern::wgmmaMatmulLaunch(cs.rows, n, cs.bm, cs.bn, cs.stages), {&pw, &pb, &px, &pm, &po, &n});
      std::vector<float> got = out.download<float>(static_cast<size_t>(n) * cs.rows);
      std::vector<float> ref = referenceMatmul(wh.values, xh.values, bias, n, cs.rows, cs.cols);
      CHECK(track("wgmma f16", relError(got.data(), ref.data(), ref.size())) <= kWgmmaTol);
      CHECK(track("wgmma f16 vs f32 operands", relError(got.data(), exact.data(), exact.size())) <= kWgmmaF32Tol);
      // q8 activations, dequantized to f16 in the kernel: round(q·d) per value.
      if (cs.cols % 32 != 0) continue;
      const HostQ8 hq = quantizeHost(x, n, static_cast<int>(cs.cols));
      const HostF16 xq16 = toF16(hq.deq, static_cast<uint64_t>(n), cs.cols, cs.cols);
      DeviceArray d_q = DeviceArray::of(hq.qs), d_m = DeviceArray::of(hq.meta);
      px = d_q.ptr();
      pm = d_m.ptr();
      out.poison();
      launch(k[1], kern::wgmmaMatmulLaunch(cs.rows, n, cs.bm, cs.bn, cs.stages), {&pw, &pb, &px, &pm, &po, &n});
      got = out.download<float>(static_cast<size_t>(n) * cs.rows);
      ref = referenceMatmul(wh.values, xq16.values, bias, n, cs.rows, cs.cols);
      CHECK(track("wgmma q8", relError(got.data(), ref.data(), ref.size())) <= kWgmmaTol);
      // The plan's staging launch (minfer_q8_to_f16) writes exactly the f16 values the q8 kernel stages.
      DeviceArray x16(static_cast<size_t>(n) * cs.cols * 2 + 64);
      x16.poison();
      CUdeviceptr pq = d_q.ptr(), p16 = x16.ptr();
      launch(k[2], kern::q8ToF16LaunchRule(static_cast<unsigned>(cs.cols)).at(static_cast<unsigned>(n)),
             {&pq, &pm, &p16, &n});
      CHECK(x16.download<uint16_t>(xq16.bits.size()) == xq16.bits);
    }
  }
}

// minfer_wgmma_matmul_split (the small-batch form of the Hopper matmul: one token tile of 64, split over K) against
// float64 on the same f16 operands, as minfer_wgmma_matmul is: N not a multiple of the 64-row tile (and odd: the
// scalar stores), K not a multiple of 64 (the last stage partly past K) and split unevenly (13 stages into 5; 17 into
// 16, splits of one stage), padded weight rows (the offset gate), with and without a bias, 1 … 64 tokens. The staged
// activations sit at the start of the scratch as minfer_q8_to_f16 leaves them, the rest of it poisoned (rows past
// the call included: the kernel must not read them); the counters must be zero after every launch, nothing may be
// written past the call's rows, two launches must give the same bits (the splits are added in split order whichever
// finishes last), and the result must match minfer_wgmma_matmul's on the same tile (one split) within the bound.
TEST_CASE("wgmma_matmul_split (sm_90a): split over K vs float64 and vs one split, odd shapes, counters reset") {
  MINFER_REQUIRE_GPU(G);
  if (G->arch != "sm_90") {
    MESSAGE("skipped: wgmma_matmul_split needs an sm_90 GPU (sm_90a image); this one is " << G->arch);
    return;
  }
  struct Case {
    GgmlType type;
    uint64_t rows, cols;
    unsigned splits;
    bool bias;
  };
  const Case cases[] = {{GgmlType::Q4_K, 300, 1280, 4, false},  // 20 stages into 4
                        {GgmlType::Q5_0, 333, 800, 5, true},    // 13 stages (the last half past K) into 5; odd N
                        {GgmlType::Q8_0, 72, 1056, 16, true},   // 17 stages into 16
                        {GgmlType::Q4_K, 256, 4096, 2, false}};
  const kern::WgmmaTile t = kern::kWgmmaSplitTile;
  for (const Case& cs : cases) {
    CAPTURE(ggmlTypeTraits(cs.type).name);
    CAPTURE(cs.rows);
    CAPTURE(cs.cols);
    CAPTURE(cs.splits);
    const RandomWeight w = makeRandomWeight(cs.type, cs.rows, cs.cols, rng(), 0.5f);
    const uint64_t pitch = alignUp(cs.cols * 2, 16) + 16;  // padded rows: the offset gate
    const HostF16 wh = toF16(w.values, cs.rows, cs.cols, pitch / 2);
    const std::string tag =
        codegen::typeTag(static_cast<uint32_t>(cs.type)) + "_n" + str(cs.rows) + "_k" + str(cs.cols);
    const std::vector<std::pair<std::string, std::string>> defs = {
        {"WG_N", str(cs.rows)},     {"WG_K", str(cs.cols)},         {"WG_W_PITCH", str(pitch)},
        {"WG_BM", str(t.bm)},       {"WG_BN", str(t.bn)},           {"WG_STAGES", str(t.stages)},
        {"WG_ACT", "0"},            {"WG_HAS_BIAS", cs.bias ? "1" : "0"}};
    std::vector<std::pair<std::string, std::string>> split_defs = defs;
    split_defs.push_back({"WG_SPLITS", str(cs.splits)});
    std::vector<Kernel> k = compile({spec("wgmma_split_test_" + tag + "_x" + str(cs.splits), "kernels/wgmma_matmul.cuh",
                                          "minfer_wgmma_matmul_split", split_defs),
                                     spec("wgmma_split_test_" + tag + "_x1", "kernels/wgmma_matmul.cuh",
                                          "minfer_wgmma_matmul", defs)},
                                    "sm_90a");
    const unsigned n_rows = static_cast<unsigned>(cs.rows), k_cols = static_cast<unsigned>(cs.cols);
    const std::vector<float> bias_v = randomFloats(cs.rows, rng());
    const float* bias = cs.bias ? bias_v.data() : nullptr;
    const uint64_t scratch_bytes = kern::wgmmaSplitScratchBytes(n_rows, k_cols, cs.splits);
    const uint64_t counter_words = kern::wgmmaSplitCounterBytes(n_rows) / 4;
    const std::vector<uint32_t> zeros(counter_words, 0);
    // One token row more than the kernel takes: the check that nothing is written past the call's rows reads it.
    DeviceArray d_w = DeviceArray::of(wh.bits), d_bias = DeviceArray::of(bias_v), out((t.bm + 1) * cs.rows * 4),
                scratch(scratch_bytes), counters(counter_words * 4), x16(kern::q8ToF16Bytes(t.bm, k_cols));
    counters.upload(zeros.data(), zeros.size() * 4);
    CUdeviceptr pw = d_w.ptr(), pb = cs.bias ? d_bias.ptr() : 0, ps = scratch.ptr(), pc = counters.ptr(),
                po = out.ptr(), px = x16.ptr(), null_ptr = 0;
    for (int n : {1, 7, 33, 64}) {
      CAPTURE(n);
      const std::vector<float> x = activations(n, static_cast<int>(cs.cols));
      const HostF16 xh = toF16(x, static_cast<uint64_t>(n), cs.cols, cs.cols);
      const std::vector<float> ref = referenceMatmul(wh.values, xh.values, bias, n, cs.rows, cs.cols);
      const size_t outs = static_cast<size_t>(n) * cs.rows;
      std::vector<float> first;
      for (int run = 0; run < 2; ++run) {
        CAPTURE(run);
        scratch.poison();
        scratch.upload(xh.bits.data(), xh.bits.size() * 2);
        out.poison();
        launch(k[0], kern::wgmmaSplitLaunchRule(n_rows, cs.splits).at(static_cast<unsigned>(n)),
               {&pw, &pb, &ps, &po, &pc, &n});
        std::vector<float> got = out.download<float>(outs);
        CHECK(track("wgmma split", relError(got.data(), ref.data(), ref.size())) <= kWgmmaTol);
        CHECK(counters.download<uint32_t>(counter_words) == zeros);
        const std::vector<float> after = out.download<float>(cs.rows, outs * 4);
        CHECK(std::all_of(after.begin(), after.end(), [](float v) { return std::isnan(v); }));
        if (run == 0) first = std::move(got);
        else CHECK(std::memcmp(first.data(), got.data(), outs * 4) == 0);
      }
      // One split on the same tile (the plain entry), its activations in a buffer of their own.
      x16.upload(xh.bits.data(), xh.bits.size() * 2);
      out.poison();
      launch(k[1], kern::wgmmaMatmulLaunch(n_rows, static_cast<unsigned>(n), t.bm, t.bn, t.stages),
             {&pw, &pb, &px, &null_ptr, &po, &n});
      const std::vector<float> one = out.download<float>(outs);
      CHECK(track("wgmma split vs one split", relError(first.data(), one.data(), outs)) <= kWgmmaTol);
    }
  }
}

}  // namespace
}  // namespace minfer::test::gpu
