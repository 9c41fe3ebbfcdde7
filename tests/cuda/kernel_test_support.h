// Shared helpers of the test_cuda_kernels suite (kernels_*.cpp, test_cuda_kernels.cpp): per-family tolerances,
// the run's one random generator and error record, random activations, K/V caches and weights (host and device),
// the host mirror of quantize_act. One instance of each across the suite's files (inline functions), so the
// random draws and the measured errors are shared as in one file.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "compiler/planes/layout_planner.h"
#include "compiler/planes/plane_transforms.h"
#include "compiler/planes/plane_workers.h"
#include "kernels/quantize_act.cuh"
#include "kernels/rope.cuh"
#include "runtime/cpu/cpu_ops.h"
#include "tests/cuda/gpu_harness.h"
#include "tests/runtime/weight_builder.h"

namespace minfer::test::gpu {


// Positions pos0 .. pos0 + n − 1, as cpu::rope takes them.
inline std::vector<int32_t> positions(int pos0, int n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) p[static_cast<size_t>(t)] = pos0 + t;
  return p;
}

// The rotation constants of kernels/rope.cuh as compiler/codegen/ops/rope.cpp defines them (not the heads).
inline std::vector<std::pair<std::string, std::string>> ropeDefines(int n_rot, bool neox, float base, float scale, bool ff,
                                                             const kern::RopeYarn& y) {
  std::vector<std::pair<std::string, std::string>> d = {
      {"ROPE_NROT", std::to_string(n_rot)}, {"ROPE_NEOX", neox ? "1" : "0"}, {"ROPE_BASE", codegen::floatLiteral(base)},
      {"ROPE_SCALE", codegen::floatLiteral(scale)}, {"ROPE_FREQ_FACTORS", ff ? "1" : "0"}};
  if (y.ext_factor != 0)
    d.insert(d.end(), {{"ROPE_YARN", "1"}, {"ROPE_EXT_FACTOR", codegen::floatLiteral(y.ext_factor)},
                       {"ROPE_CORR_LO", codegen::floatLiteral(y.corr_lo)}, {"ROPE_CORR_HI", codegen::floatLiteral(y.corr_hi)}});
  if (y.mscale != 1.0f) d.push_back({"ROPE_MSCALE", codegen::floatLiteral(y.mscale)});
  return d;
}

// Tolerances (relative to max|reference|), per family; "measured" is the largest error over the suite's
// cases on an H200 (the last test case prints them).
constexpr double kEmbedTol = 0.0;        // bit-identical (same dequantizeBlock, --fmad=false); measured 0
constexpr double kRmsNormTol = 2e-6;     // f32 tree vs sequential sum of squares; measured 3.0e-7 (head 2.1e-7)
constexpr double kMmqTol = 2e-5;         // vs W·dequant(q8(x)) in f32, summation order only; measured 5.7e-7
constexpr double kGemvTol = 2e-5;        // same definition as MMQ; measured 3.8e-7
constexpr double kGemmSmallTol = 2e-5;   // same definition and q8 activations as MMQ / GEMV: f32 summation
                                         // order only (split-K partials summed in split order)
constexpr double kGemvBlocksTol = 1e-5;  // GEMV's definition on GGUF blocks, K ≤ 18944; measured 1.4e-6–1.6e-6
// A deferred RMSNorm's consumers (GEMVB_RMS_EPS) against the same kernels on block scales the host multiplied by
// 1/rms: inv·Σ d·dot against Σ (d·inv)·dot, f32 rounding only (each term within an ulp, ~6e-8, over K / 32 ≤ 112
// blocks, and the kernel's 1/rms from its partials in f32 against the host's in double: a few ulps), ~1e-6 at
// most; the K/V cache rows also through f16 rounding (2⁻¹¹ per element). Measured on the H200 (2026-12-01):
// 2.6e-7, and 7.7e-5 on the f16 cache rows; bounds ~10× the first, two f16 half-ulps (2⁻¹⁰) for the second.
constexpr double kDeferredRmsTol = 3e-6;
constexpr double kDeferredRmsF16Tol = 1e-3;
constexpr double kMmqBlocksBoundFraction = 1.0;  // mmq_blocks: each output within its f16 rounding bound (f16MatmulBound); measured 0.061
constexpr double kQ8ActTol = 2.5e-2;     // vs W·x: int8 activation rounding (README §4: 3e-2); measured 6.4e-3
constexpr double kDenseTol = 1e-5;       // f32 FMA chain vs 8 partial sums; measured 1.0e-6 (GEMV 2.2e-7)
constexpr double kRopeTol = 1e-6;        // same double θ, f32 rotation without FMA; measured 0
constexpr double kAttnTol = 2e-5;        // online vs two-pass softmax in f32 over the same f16 K/V;
                                         // measured 2.6e-6 prefill, 1.7e-6 decode
// Tensor-core prefill (head sizes 16k ≤ 256): Q and P rounded to f16 too, unit roundoff 2^-11 = 4.9e-4 each,
// the scores' error growing with the dot products' length: measured 8.3e-4 at heads ≤ 128 (H200), 1.23e-3 and
// 2.34e-3 at heads 144–256 with soft-capping and a window (two H200 runs, `d812eeb`, `b45066f`).
inline double attnMmaTol(int head_dim) { return head_dim <= 128 ? 2e-3 : 5e-3; }
constexpr double kAttnLongTol = 1e-4;    // the SIMT prefill over up to 8,192 keys: f32 sums ~7× longer than the
                                         // 1,200 of kAttnTol's cases; measured 5.6e-6 (H200, `d812eeb`)
constexpr double kSwiGluTol = 1e-6;      // expf vs std::exp; measured 1.4e-7
constexpr double kAddTol = 0.0;          // measured 0
constexpr double kGeGluTol = 1e-6;       // device tanhf vs std::tanh; measured 2.8e-8 (H200)
constexpr double kScaleTol = 1e-6;       // x·s exact; soft-capped: device tanhf vs std::tanh; measured 1.8e-7 (H200)
constexpr double kMoeRouteTol = 2e-6;    // expf and an f32 softmax sum vs std::exp and a double sum; ids exact;
                                         // measured 2.1e-7 (H200)
constexpr double kWgmmaTol = 2e-5;       // Hopper f16 matmul vs float64 on the same f16 operands: f32 summation
                                         // order only; measured 2.4e-6 (here), 5.3e-6 (bench/wgmma_bench.cu, K = 3584)
constexpr double kWgmmaF32Tol = 1e-3;    // the same vs float64 on the unrounded f32 operands (f16 unit roundoff
                                         // 2^-11 on each of w and x); measured 3.7e-4 (H200)
constexpr double kMoeFfnTol = 1e-5;      // same dequantized weights, f32 dot products in another order, expf;
                                         // measured 4.1e-7 (H200)
// The expert FFN with q8 activations (kBlocks weights) vs the host's sums over the same q8 activations
// (moeFfnQ8Ref): f32 summation order (kGemvBlocksTol's 1e-5), plus the A values that land on the other side
// of a q8 rounding boundary in the GPU's f32 and the host's double sums (not rare: ~1e-4 of the elements).
// One such flip changes one q by 1, i.e. every output of its slot by w(r, c)·d with d = max|A| / 127 of its
// block: at most max|w| / rms(w) (√3, uniform weights) · max|A| / rms(A) of a block (≈ 3.5) / 127, over
// max|ref| ≈ 3.5·√F·rms(w)·rms(A): 8.4e-4 at F = 256, less for wider A; the bound allows two flips in one
// slot. A wrong block, scale or expert gives errors of order 1. Not yet measured.
constexpr double kMoeFfnQ8Tol = 2e-3;
// The same vs cpu::moeFfn (f32 activations): the rounding of x and of A to q8 (README §4's 3e-2 per
// quantized matmul; kQ8ActTol measured 6.4e-3 for one). A host simulation of these cases' shapes (uniform
// weights, this file's activations, 7 tokens × 20 draws) gave at most 1.24e-2; not yet measured on a GPU.
constexpr double kMoeFfnQ8ActTol = 3e-2;

// The decode expert GEMVs (minfer_moe_gate_up_dec / _down_dec) vs the sorted kernels on the same q8 x: the same
// block dot products, summed in another order (the combine's weights applied per part before the warp sum instead
// of to each expert's sum), f32 rounding only, plus the rare A element whose q8 rounding flips between the two
// (kMoeFfnQ8Tol's argument). Measured on an H200 (2026-12-01, two runs): 2.5e-7, 1.8e-7 (no flip in these cases);
// against the host's sums 2.7e-7, 2.0e-7; against f32 activations 8.2e-3, 1.5e-2 (kMoeFfnQ8ActTol).
constexpr double kMoeDecVsSortedTol = 2e-3;

inline constexpr int kTokenCounts[] = {1, 7, 33, 512, 513};

// Largest error measured per family in this run (printed by the last test case, so the tolerances
// above can be compared with what the GPU actually does).
inline std::map<std::string, double>& worst() {
  static std::map<std::string, double> m;
  return m;
}
inline double track(const char* family, double err) {
  double& w = worst()[family];
  w = std::max(w, err);
  return err;
}
constexpr int kMaxBatch = 513;

inline std::mt19937_64& rng() {
  static std::mt19937_64 r(20261129);
  return r;
}

inline std::string str(uint64_t v) { return std::to_string(v); }

// Random activations: rows of values in [−1, 1] scaled per 32-block by factors in [0.05, 4], so
// q8 block scales differ from block to block.
inline std::vector<float> activations(int n, int k) {
  std::vector<float> x = randomFloats(static_cast<size_t>(n) * k, rng());
  std::uniform_real_distribution<float> scale(0.05f, 4.0f);
  for (size_t b = 0; b < x.size() / 32 + 1; ++b) {
    const float s = scale(rng());
    for (size_t i = b * 32; i < std::min(x.size(), (b + 1) * 32); ++i) x[i] *= s;
  }
  return x;
}

// Random K and V caches of n rows of width w (activations()): their f16 bits for the device and the same
// values as f32 for the CPU reference.
struct F16Kv {
  std::vector<uint16_t> kh, vh;
  std::vector<float> ck, cv;
};
inline F16Kv randomF16Kv(int n, int w) {
  const std::vector<float> kr = activations(n, w), vr = activations(n, w);
  F16Kv kv{std::vector<uint16_t>(kr.size()), std::vector<uint16_t>(kr.size()), std::vector<float>(kr.size()),
           std::vector<float>(kr.size())};
  for (size_t i = 0; i < kr.size(); ++i) {
    kv.kh[i] = floatToHalf(kr[i]);
    kv.vh[i] = floatToHalf(vr[i]);
    kv.ck[i] = halfToFloat(kv.kh[i]);
    kv.cv[i] = halfToFloat(kv.vh[i]);
  }
  return kv;
}

// v rounded to f16 (the KV caches' element type).
inline float roundHalf(float v) { return halfToFloat(floatToHalf(v)); }

// Host mirror of quantize_act.cuh (same float operations, so q and d match bit for bit).
struct HostQ8 {
  std::vector<int8_t> qs;
  std::vector<kern::Q8Meta> meta;
  std::vector<float> deq;  // d·q
};
inline HostQ8 quantizeHost(const std::vector<float>& x, int n, int k) {
  HostQ8 h;
  h.qs.resize(static_cast<size_t>(n) * k);
  h.deq.resize(h.qs.size());
  for (int64_t b = 0; b < static_cast<int64_t>(n) * k / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int lo = 0, hi = 0;
    for (int i = 0; i < 32; ++i) {
      int q = static_cast<int>(std::nearbyint(x[b * 32 + i] * id));
      q = std::clamp(q, -127, 127);
      h.qs[b * 32 + i] = static_cast<int8_t>(q);
      h.deq[b * 32 + i] = d * static_cast<float>(q);
      (i < 16 ? lo : hi) += q;
    }
    h.meta.push_back({d, static_cast<short>(lo), static_cast<short>(hi)});
  }
  return h;
}

// A q8 buffer (qs / meta) bit-identical to the host mirror of quantize_act on n rows of w values.
inline void checkQ8Of(const std::vector<float>& values, const DeviceArray& qs, const DeviceArray& meta, int n, int w) {
  const HostQ8 hq = quantizeHost(values, n, w);
  CHECK(qs.download<int8_t>(hq.qs.size()) == hq.qs);
  const std::vector<kern::Q8Meta> gm = meta.download<kern::Q8Meta>(hq.meta.size());
  size_t bad = 0;
  for (size_t j = 0; j < gm.size(); ++j) bad += std::memcmp(&gm[j], &hq.meta[j], sizeof(kern::Q8Meta)) != 0;
  CHECK(bad == 0);
}

// A kernel with a fused q8 output (RMS_Q8, EW_Q8) against its plain form: `fused` rows bit-identical to
// `plain` rows, and qs / meta bit-identical to the host mirror of quantize_act on those rows.
inline void checkFusedQ8(const DeviceArray& plain, const DeviceArray& fused, const DeviceArray& qs, const DeviceArray& meta,
                  int n, int w) {
  const size_t count = static_cast<size_t>(n) * w;
  const std::vector<float> ref = plain.download<float>(count), got = fused.download<float>(count);
  CHECK(std::memcmp(ref.data(), got.data(), count * sizeof(float)) == 0);
  checkQ8Of(ref, qs, meta, n, w);
}

// A random weight on host and device. `padded`: planes from test::buildPlanes with 16 extra bytes per
// row (no kPacked plane); otherwise the compiler's planner and transforms.
struct GpuWeight {
  RandomWeight w;
  std::vector<BuiltPlane> planes;
  std::vector<DeviceArray> dev;
  cpu::WeightPlanes view;
  const StrideTable* table(PlaneKind k) const {
    for (const BuiltPlane& p : planes)
      if (p.table.kind == k) return &p.table;
    return nullptr;
  }
  CUdeviceptr ptr(PlaneKind k) const {
    for (size_t i = 0; i < planes.size(); ++i)
      if (planes[i].table.kind == k) return dev[i].ptr();
    return 0;
  }
};

// g.w's planes by the compiler's planner layout and transforms (appended to g.planes), every plane of g on the device,
// and g.view over them named `name`.
inline void transformAndUpload(GpuWeight& g, const planes::TensorLayout& layout, const char* name) {
  planes::PlaneWorkers workers(2);
  auto bytes = planes::transformTensor(layout, g.w.source, workers);
  REQUIRE_MESSAGE(static_cast<bool>(bytes), llvm::toString(bytes.takeError()));
  for (size_t i = 0; i < layout.planes.size(); ++i) g.planes.push_back({layout.planes[i], std::move((*bytes)[i])});
  for (const BuiltPlane& p : g.planes) g.dev.push_back(DeviceArray::of(p.bytes));
  g.view = viewPlanes(g.planes, name);
}

// f16_prefill: the planner's kF16 plane of quantized matmul weights too (layout_planner.h).
inline GpuWeight makeWeight(GgmlType type, uint64_t rows, uint64_t cols, planes::TensorRole role, bool padded = false,
                     bool f16_prefill = false) {
  GpuWeight g;
  g.w = makeRandomWeight(type, rows, cols, rng(), 0.5f);
  if (padded) {
    PlaneOptions o;
    o.extra_pitch = 16;
    g.planes = buildPlanes(g.w, o);
    for (const BuiltPlane& p : g.planes) g.dev.push_back(DeviceArray::of(p.bytes));
    g.view = viewPlanes(g.planes, "test weight");
  } else {
    auto layout = planes::planLayout({"test." + std::string(ggmlTypeTraits(type).name), type, rows, cols, role},
                                     planes::PlaneForm::kCompact, f16_prefill);
    REQUIRE_MESSAGE(static_cast<bool>(layout), llvm::toString(layout.takeError()));
    transformAndUpload(g, *layout, "test weight");
  }
  return g;
}

inline bool isFloatType(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

inline constexpr GgmlType kQuantTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                           GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                                           GgmlType::Q5_K, GgmlType::Q6_K};

inline std::vector<float> cpuMatmul(const GpuWeight& g, cpu::RowSource src, const float* bias, const std::vector<float>& x,
                             int n) {
  std::vector<float> out(static_cast<size_t>(n) * g.w.rows), scratch(g.w.cols);
  cpu::matmul(g.view, src, bias, x.data(), n, out.data(), nullptr, scratch.data());
  return out;
}

}  // namespace minfer::test::gpu
