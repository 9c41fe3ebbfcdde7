// GPU parity (test_cuda_kernels): embed, expand_blocks, RMSNorm, quantize_act and the elementwise kernels (SwiGLU,
// GeGLU, Add, Scale).
#include <doctest/doctest.h>

#include <tuple>

#include "kernels/elementwise.cuh"
#include "kernels/embed.cuh"
#include "kernels/expand_blocks.cuh"
#include "kernels/quantize_act.cuh"
#include "kernels/rms_norm.cuh"
#include "kernels/scale.cuh"
#include "tests/cuda/kernel_test_support.h"

namespace minfer::test::gpu {
namespace {

TEST_CASE("embed: every type, gathered rows bit-identical to the CPU") {
  MINFER_REQUIRE_GPU(G);
  const GgmlType types[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                            GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
  const uint64_t vocab = 37, cols = 4352;  // 17 K-quant blocks: 136 eighths, more than the block's 128 threads
  std::vector<GpuWeight> weights;
  std::vector<codegen::KernelSpec> specs;
  for (GgmlType t : types) {
    weights.push_back(makeWeight(t, vocab, cols, planes::TensorRole::kEmbedding));
    const GpuWeight& g = weights.back();
    const StrideTable* p = isFloatType(t) ? &g.planes[0].table : g.table(PlaneKind::kBlocks);
    REQUIRE(p);
    specs.push_back(spec("embed_test_" + codegen::typeTag(static_cast<uint32_t>(t)), "kernels/embed.cuh", "minfer_embed",
                         {{"EMBED_PLANE", str(static_cast<unsigned>(p->kind))},
                          {"EMBED_TYPE", str(static_cast<unsigned>(t))},
                          {"EMBED_COLS", str(cols)},
                          {"EMBED_ROW_PITCH", str(p->row_pitch)},
                          {"EMBED_GROUP_SIZE", str(p->group_size)},
                          {"EMBED_GROUP_PITCH", str(p->group_pitch)}},
                         {"--fmad=false"}));
  }
  std::vector<Kernel> kernels = compile(specs);
  DeviceArray out(kMaxBatch * cols * 4);
  for (size_t i = 0; i < weights.size(); ++i) {
    const GpuWeight& g = weights[i];
    const StrideTable* p = isFloatType(types[i]) ? &g.planes[0].table : g.table(PlaneKind::kBlocks);
    CUdeviceptr table = g.ptr(p->kind);
    for (int n : kTokenCounts) {
      CAPTURE(ggmlTypeTraits(types[i]).name);
      CAPTURE(n);
      std::vector<int32_t> ids(n);
      std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
      for (int32_t& id : ids) id = pick(rng());
      DeviceArray d_ids = DeviceArray::of(ids);
      out.poison();
      CUdeviceptr a = d_ids.ptr(), o = out.ptr();
      launch(kernels[i], kern::embedLaunch(n), {&a, &table, &o, &n});
      std::vector<float> got = out.download<float>(static_cast<size_t>(n) * cols);
      std::vector<float> ref(got.size());
      const auto src = *cpu::pickRowSource(g.view, /*for_gather=*/true);
      cpu::embed(g.view, src, ids.data(), n, ref.data());
      CHECK(track("embed", relError(got.data(), ref.data(), got.size())) <= kEmbedTol);
      CHECK(std::memcmp(got.data(), ref.data(), got.size() * 4) == 0);
    }
  }
}

TEST_CASE("expand_blocks: derived planes bit-identical to the compiler's, every quantized type, odd shapes") {
  // The load plan (compact artifacts) writes kI8 / kScale / kMin / kPacked / kF16 from the stored kBlocks
  // plane on the GPU; the result must equal the compiler's expanded planes byte for byte (padding
  // included: the runtime zeroes the planes first, as here).
  MINFER_REQUIRE_GPU(G);
  struct Case {
    GgmlType type;
    uint64_t rows, cols;
  };
  std::vector<Case> cases;
  for (GgmlType t : kQuantTypes) {
    const uint64_t bs = ggmlTypeTraits(t).block_size;
    cases.push_back({t, 37, 3 * bs});
    cases.push_back({t, 5, 7 * bs});
  }
  std::vector<GpuWeight> weights;
  std::vector<codegen::KernelSpec> specs;
  for (const Case& c : cases) {
    weights.push_back(makeWeight(c.type, c.rows, c.cols, planes::TensorRole::kMatMul, false, /*f16_prefill=*/true));
    const GpuWeight& g = weights.back();
    const StrideTable *b = g.table(PlaneKind::kBlocks), *q = g.table(PlaneKind::kI8), *sc = g.table(PlaneKind::kScale),
                      *mn = g.table(PlaneKind::kMin), *pk = g.table(PlaneKind::kPacked), *fh = g.table(PlaneKind::kF16);
    REQUIRE((b && fh && (q != nullptr) == (sc != nullptr)));
    specs.push_back(spec("expand_test_" + codegen::typeTag(static_cast<uint32_t>(c.type)) + "_r" + str(c.rows) + "_k" +
                             str(c.cols),
                         "kernels/expand_blocks.cuh", "minfer_expand_blocks",
                         {{"EXPAND_TYPE", str(static_cast<unsigned>(c.type))},
                          {"EXPAND_ROWS", str(c.rows)},
                          {"EXPAND_BLOCKS", str(c.cols / b->group_size)},
                          {"EXPAND_SRC_PITCH", str(b->row_pitch)},
                          {"EXPAND_SRC_GROUP_PITCH", str(b->group_pitch)},
                          {"EXPAND_HAS_I8", q ? "1" : "0"},
                          {"EXPAND_I8_PITCH", str(q ? q->row_pitch : 0)},
                          {"EXPAND_S_PITCH", str(sc ? sc->row_pitch : 0)},
                          {"EXPAND_HAS_MIN", mn ? "1" : "0"},
                          {"EXPAND_M_PITCH", str(mn ? mn->row_pitch : 0)},
                          {"EXPAND_HAS_PACKED", pk ? "1" : "0"},
                          {"EXPAND_P_PITCH", str(pk ? pk->row_pitch : 0)},
                          {"EXPAND_Q_OFFSET", std::to_string(pk ? pk->q_offset : 0)},
                          {"EXPAND_HAS_F16", "1"},
                          {"EXPAND_F_PITCH", str(fh->row_pitch)}},
                         {"--fmad=false"}));
  }
  std::vector<Kernel> kernels = compile(specs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const GpuWeight& g = weights[i];
    CAPTURE(ggmlTypeTraits(cases[i].type).name);
    CAPTURE(cases[i].rows);
    std::vector<DeviceArray> out;
    std::vector<const BuiltPlane*> want;
    CUdeviceptr ptrs[5] = {0, 0, 0, 0, 0};
    const PlaneKind kinds[5] = {PlaneKind::kI8, PlaneKind::kScale, PlaneKind::kMin, PlaneKind::kPacked, PlaneKind::kF16};
    for (int k = 0; k < 5; ++k)
      for (const BuiltPlane& p : g.planes)
        if (p.table.kind == kinds[k]) {
          out.push_back(DeviceArray::of(std::vector<uint8_t>(p.bytes.size(), 0)));
          want.push_back(&p);
          ptrs[k] = out.back().ptr();
        }
    CUdeviceptr blocks = g.ptr(PlaneKind::kBlocks);
    const uint64_t total = cases[i].rows * (cases[i].cols / g.table(PlaneKind::kBlocks)->group_size);
    launch(kernels[i], kern::expandBlocksLaunchRule(total).at(1), {&blocks, &ptrs[0], &ptrs[1], &ptrs[2], &ptrs[3], &ptrs[4]});
    for (size_t k = 0; k < out.size(); ++k) {
      CAPTURE(planeKindName(want[k]->table.kind));
      CHECK(out[k].download<uint8_t>(want[k]->bytes.size()) == want[k]->bytes);
    }
  }
}

TEST_CASE("rms_norm and head_rms_norm") {
  MINFER_REQUIRE_GPU(G);
  const int widths[] = {64, 200, 4096};
  std::vector<codegen::KernelSpec> specs;
  for (int w : widths)
    specs.push_back(spec("rms_norm_test_w" + str(w), "kernels/rms_norm.cuh", "minfer_rms_norm",
                         {{"RMS_WIDTH", str(w)}, {"RMS_EPS", codegen::floatLiteral(1e-5f)}}));
  const int head_dims[] = {64, 128};
  for (int d : head_dims)
    specs.push_back(spec("head_rms_norm_test_d" + str(d), "kernels/rms_norm.cuh", "minfer_head_rms_norm",
                         {{"HRMS_NHEAD", "6"}, {"HRMS_HEAD_DIM", str(d)}, {"HRMS_EPS", codegen::floatLiteral(1e-6f)}}));
  std::vector<Kernel> k = compile(specs);
  for (size_t wi = 0; wi < 3; ++wi) {
    const int w = widths[wi];
    const std::vector<float> weight = randomFloats(w, rng(), 0.5f, 1.5f);
    DeviceArray d_w = DeviceArray::of(weight), out(kMaxBatch * w * 4);
    for (int n : kTokenCounts) {
      CAPTURE(w);
      CAPTURE(n);
      const std::vector<float> x = activations(n, w);
      DeviceArray d_x = DeviceArray::of(x);
      out.poison();
      CUdeviceptr a = d_x.ptr(), b = d_w.ptr(), o = out.ptr();
      launch(k[wi], kern::rmsNormLaunch(n), {&a, &b, &o, &n});
      std::vector<float> got = out.download<float>(x.size()), ref(x.size());
      cpu::rmsNorm(x.data(), weight.data(), n, w, 1e-5f, ref.data());
      CHECK(track("rms_norm", relError(got.data(), ref.data(), ref.size())) <= kRmsNormTol);
    }
  }
  for (size_t di = 0; di < 2; ++di) {
    const int d = head_dims[di];
    const std::vector<float> weight = randomFloats(d, rng(), 0.5f, 1.5f);
    DeviceArray d_w = DeviceArray::of(weight);
    for (int n : kTokenCounts) {
      CAPTURE(d);
      CAPTURE(n);
      std::vector<float> x = activations(n, 6 * d);
      DeviceArray d_x = DeviceArray::of(x);
      CUdeviceptr a = d_x.ptr(), b = d_w.ptr();
      launch(k[3 + di], kern::headRmsNormLaunch(n, 6), {&a, &b, &n});
      std::vector<float> got = d_x.download<float>(x.size());
      cpu::headRmsNorm(x.data(), weight.data(), n, 6, d, 1e-6f);
      CHECK(track("head_rms_norm", relError(got.data(), x.data(), x.size())) <= kRmsNormTol);
    }
  }
}

TEST_CASE("rms_norm with the fused Add and q8 (RMS_ADD, RMS_Q8): sums, rows and q8 bit-identical to add, rms_norm, quantize_act") {
  MINFER_REQUIRE_GPU(G);
  // Widths with a partial last pass of 1024 (96, 288), a whole one (4096), and one past what the kernel
  // holds in registers (12288: read twice).
  const int widths[] = {96, 288, 4096, 12288};
  std::vector<codegen::KernelSpec> specs;
  for (int w : widths) {
    const std::vector<std::pair<std::string, std::string>> defs = {{"RMS_WIDTH", str(w)},
                                                                   {"RMS_EPS", codegen::floatLiteral(1e-6f)}};
    specs.push_back(spec("rms_norm_test_plain_w" + str(w), "kernels/rms_norm.cuh", "minfer_rms_norm", defs));
    auto fused = defs;
    fused.push_back({"RMS_Q8", "1"});
    specs.push_back(spec("rms_norm_test_q8_w" + str(w), "kernels/rms_norm.cuh", "minfer_rms_norm", fused));
    fused.push_back({"RMS_ADD", "1"});
    specs.push_back(spec("rms_norm_test_add_q8_w" + str(w), "kernels/rms_norm.cuh", "minfer_rms_norm", fused));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t wi = 0; wi < std::size(widths); ++wi) {
    const int w = widths[wi];
    const std::vector<float> weight = randomFloats(w, rng(), 0.5f, 1.5f);
    DeviceArray d_w = DeviceArray::of(weight), plain(kMaxBatch * w * 4), out(kMaxBatch * w * 4), qs(kMaxBatch * w),
        meta(kMaxBatch * w / 32 * 8);
    for (int n : kTokenCounts) {
      CAPTURE(w);
      CAPTURE(n);
      std::vector<float> x = activations(n, w);
      for (int j = 0; j < w; ++j) x[j] = 0.0f;  // an all-zero row: d = 0 in every block
      DeviceArray d_x = DeviceArray::of(x);
      plain.poison();
      out.poison();
      qs.poison();
      meta.poison();
      CUdeviceptr a = d_x.ptr(), b = d_w.ptr(), o = plain.ptr(), o2 = out.ptr(), q = qs.ptr(), m = meta.ptr();
      launch(k[3 * wi], kern::rmsNormLaunch(n), {&a, &b, &o, &n});
      launch(k[3 * wi + 1], kern::rmsNormLaunch(n), {&a, &b, &o2, &q, &m, &n});
      checkFusedQ8(plain, out, qs, meta, n, w);
      // The residual Add fused in front: sum = x + r written in place over r (as the plan's x = x + h),
      // and the norm of the sum into the plain kernel's row layout.
      const std::vector<float> r = activations(n, w);
      std::vector<float> sum(x.size());
      for (size_t j = 0; j < sum.size(); ++j) sum[j] = x[j] + r[j];
      DeviceArray d_sum = DeviceArray::of(sum), d_r = DeviceArray::of(r);
      plain.poison();
      out.poison();
      qs.poison();
      meta.poison();
      CUdeviceptr ps = d_sum.ptr(), pr = d_r.ptr();
      launch(k[3 * wi], kern::rmsNormLaunch(n), {&ps, &b, &o, &n});
      launch(k[3 * wi + 2], kern::rmsNormLaunch(n), {&a, &pr, &pr, &b, &o2, &q, &m, &n});
      const std::vector<float> got_sum = d_r.download<float>(sum.size());
      CHECK(std::memcmp(got_sum.data(), sum.data(), sum.size() * sizeof(float)) == 0);
      checkFusedQ8(plain, out, qs, meta, n, w);
    }
  }
}

TEST_CASE("quantize_act: q, d and sums bit-identical to the host mirror") {
  MINFER_REQUIRE_GPU(G);
  const int ks[] = {64, 352, 4096};
  std::vector<codegen::KernelSpec> specs;
  for (int kk : ks)
    specs.push_back(spec("quantize_act_test_k" + str(kk), "kernels/quantize_act.cuh", "minfer_quantize_act",
                         {{"QA_K", str(kk)}}));
  std::vector<Kernel> k = compile(specs);
  for (size_t i = 0; i < 3; ++i) {
    const int kk = ks[i];
    for (int n : kTokenCounts) {
      CAPTURE(kk);
      CAPTURE(n);
      std::vector<float> x = activations(n, kk);
      for (int j = 0; j < 32 && n > 1; ++j) x[32 + j] = 0.0f;  // an all-zero block: d = 0
      const HostQ8 ref = quantizeHost(x, n, kk);
      DeviceArray d_x = DeviceArray::of(x), qs(kMaxBatch * kk), meta(kMaxBatch * kk / 32 * 8);
      qs.poison();
      meta.poison();
      CUdeviceptr a = d_x.ptr(), b = qs.ptr(), c = meta.ptr();
      launch(k[i], kern::quantizeActLaunch(n, kk), {&a, &b, &c, &n});
      CHECK(qs.download<int8_t>(ref.qs.size()) == ref.qs);
      const std::vector<kern::Q8Meta> got = meta.download<kern::Q8Meta>(ref.meta.size());
      size_t bad = 0;
      for (size_t j = 0; j < got.size(); ++j)
        bad += std::memcmp(&got[j], &ref.meta[j], sizeof(kern::Q8Meta)) != 0;
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("swiglu and geglu with the fused q8 output (EW_Q8): rows and q8 bit-identical to the plain kernel, then quantize_act") {
  MINFER_REQUIRE_GPU(G);
  // 160: a row ends inside a warp's 128 values; 18944: the 7B's FFN width.
  const int widths[] = {160, 18944};
  const char* ops[][2] = {{"1", "minfer_swiglu"}, {"3", "minfer_geglu"}};
  std::vector<codegen::KernelSpec> specs;
  for (int w : widths)
    for (const auto& op : ops) {
      const std::vector<std::pair<std::string, std::string>> defs = {{"EW_WIDTH", str(w)}, {"EW_OP", op[0]}};
      specs.push_back(spec(std::string("glu_test_plain_") + op[0] + "_w" + str(w), "kernels/elementwise.cuh", op[1], defs));
      auto fused = defs;
      fused.push_back({"EW_Q8", "1"});
      specs.push_back(spec(std::string("glu_test_q8_") + op[0] + "_w" + str(w), "kernels/elementwise.cuh", op[1], fused));
    }
  std::vector<Kernel> k = compile(specs);
  for (size_t wi = 0; wi < 2; ++wi)
    for (size_t oi = 0; oi < 2; ++oi)
      for (int n : kTokenCounts) {
        const int w = widths[wi];
        CAPTURE(w);
        CAPTURE(ops[oi][1]);
        CAPTURE(n);
        std::vector<float> a = activations(n, w);
        const std::vector<float> b = activations(n, w);
        for (int j = 0; j < 32; ++j) a[j] = 0.0f;  // an all-zero block: d = 0
        DeviceArray da = DeviceArray::of(a), db = DeviceArray::of(b), plain(kMaxBatch * w * 4), out(kMaxBatch * w * 4),
            qs(kMaxBatch * w), meta(kMaxBatch * w / 32 * 8);
        plain.poison();
        out.poison();
        qs.poison();
        meta.poison();
        CUdeviceptr pa = da.ptr(), pb = db.ptr(), po = plain.ptr(), po2 = out.ptr(), pq = qs.ptr(), pm = meta.ptr();
        launch(k[2 * (wi * 2 + oi)], kern::elementwiseLaunch(n, w), {&pa, &pb, &po, &n});
        launch(k[2 * (wi * 2 + oi) + 1], kern::elementwiseLaunch(n, w), {&pa, &pb, &po2, &pq, &pm, &n});
        checkFusedQ8(plain, out, qs, meta, n, w);
      }
}

TEST_CASE("swiglu and add") {
  MINFER_REQUIRE_GPU(G);
  const int widths[] = {172, 4096};
  std::vector<codegen::KernelSpec> specs;
  for (int w : widths) {
    specs.push_back(spec("swiglu_test_w" + str(w), "kernels/elementwise.cuh", "minfer_swiglu",
                         {{"EW_WIDTH", str(w)}, {"EW_OP", "1"}}));
    specs.push_back(spec("add_test_w" + str(w), "kernels/elementwise.cuh", "minfer_add", {{"EW_WIDTH", str(w)}, {"EW_OP", "2"}}));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t wi = 0; wi < 2; ++wi)
    for (int n : kTokenCounts) {
      const int w = widths[wi];
      CAPTURE(w);
      CAPTURE(n);
      const std::vector<float> a = activations(n, w), b = activations(n, w);
      DeviceArray da = DeviceArray::of(a), db = DeviceArray::of(b), out(kMaxBatch * w * 4);
      CUdeviceptr pa = da.ptr(), pb = db.ptr(), po = out.ptr();
      std::vector<float> ref(a.size());
      out.poison();
      launch(k[2 * wi], kern::elementwiseLaunch(n, w), {&pa, &pb, &po, &n});
      cpu::swiGlu(a.data(), b.data(), static_cast<int64_t>(a.size()), ref.data());
      std::vector<float> got = out.download<float>(a.size());
      CHECK(track("swiglu", relError(got.data(), ref.data(), ref.size())) <= kSwiGluTol);
      out.poison();
      launch(k[2 * wi + 1], kern::elementwiseLaunch(n, w), {&pa, &pb, &po, &n});
      cpu::add(a.data(), b.data(), static_cast<int64_t>(a.size()), ref.data());
      got = out.download<float>(a.size());
      CHECK(track("add", relError(got.data(), ref.data(), ref.size())) <= kAddTol);
      // In place (out = a), as the plan's residual adds run.
      launch(k[2 * wi + 1], kern::elementwiseLaunch(n, w), {&pa, &pb, &pa, &n});
      got = da.download<float>(a.size());
      CHECK(relError(got.data(), ref.data(), ref.size()) <= kAddTol);
    }
}

TEST_CASE("geglu and scale (plain and soft-capped, in place)") {
  MINFER_REQUIRE_GPU(G);
  const int widths[] = {130, 2304};  // 130: rows not a multiple of 4 floats
  std::vector<codegen::KernelSpec> specs;
  for (int w : widths) {
    specs.push_back(spec("geglu_test_w" + str(w), "kernels/elementwise.cuh", "minfer_geglu",
                         {{"EW_WIDTH", str(w)}, {"EW_OP", "3"}}));
    specs.push_back(spec("scale_test_w" + str(w), "kernels/scale.cuh", "minfer_scale",
                         {{"SC_WIDTH", str(w)}, {"SC_SCALE", "48.0f"}, {"SC_SOFTCAP", "0.0f"}}));
    specs.push_back(spec("softcap_test_w" + str(w), "kernels/scale.cuh", "minfer_scale",
                         {{"SC_WIDTH", str(w)}, {"SC_SCALE", "1.5f"}, {"SC_SOFTCAP", "2.0f"}}));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t wi = 0; wi < 2; ++wi)
    for (int n : kTokenCounts) {
      const int w = widths[wi];
      CAPTURE(w);
      CAPTURE(n);
      std::vector<float> a = activations(n, w), b = activations(n, w);
      for (float& v : a) v *= 3.0f;  // GELU's negative tail and tanh's saturation both reached
      DeviceArray da = DeviceArray::of(a), db = DeviceArray::of(b), out(kMaxBatch * w * 4);
      CUdeviceptr pa = da.ptr(), pb = db.ptr(), po = out.ptr();
      std::vector<float> ref(a.size());
      out.poison();
      launch(k[3 * wi], kern::elementwiseLaunch(n, w), {&pa, &pb, &po, &n});
      cpu::geGlu(a.data(), b.data(), static_cast<int64_t>(a.size()), ref.data());
      std::vector<float> got = out.download<float>(a.size());
      CHECK(track("geglu", relError(got.data(), ref.data(), ref.size())) <= kGeGluTol);
      for (const auto& [ki, s, c] : {std::tuple{3 * wi + 1, 48.0f, 0.0f}, std::tuple{3 * wi + 2, 1.5f, 2.0f}}) {
        out.poison();
        launch(k[ki], kern::scaleLaunchRule(w).at(n), {&pa, &po, &n});
        cpu::scale(a.data(), static_cast<int64_t>(a.size()), s, c, ref.data());
        got = out.download<float>(a.size());
        CHECK(track("scale", relError(got.data(), ref.data(), ref.size())) <= kScaleTol);
      }
      // In place (out = x), as the plan scales the embeddings and caps the logits.
      launch(k[3 * wi + 2], kern::scaleLaunchRule(w).at(n), {&pa, &pa, &n});
      got = da.download<float>(a.size());
      CHECK(track("scale", relError(got.data(), ref.data(), ref.size())) <= kScaleTol);
    }
}

}  // namespace
}  // namespace minfer::test::gpu
