// GPU parity (test_cuda_kernels): the GEMVs on GGUF blocks (kernels/gemv_blocks.cuh) and their fused forms (GLU, pair,
// batch, triple, Add + RMSNorm, QKV + RoPE + KV store), and the small-batch matmul on the same blocks
// (kernels/mmq_blocks.cuh).
#include <doctest/doctest.h>

#include "kernels/attention.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/gemv_blocks.cuh"
#include "kernels/mmq_blocks.cuh"
#include "kernels/rope.cuh"
#include "tests/cuda/kernel_test_support.h"

namespace minfer::test::gpu {
namespace {

// The kBlocks plane of a quantized matmul weight as the layout planner makes it for the decode GEMV: the
// GGUF blocks unchanged, each at a 16-byte aligned group pitch (Q4_K 144; Q6_K 224: the 210-byte block
// then 14 zero bytes). `padded`: 32 more bytes per row and every pad byte 0xCD instead of 0, so a kernel
// that ignores either pitch, or reads a pad byte, gives wrong sums.
BuiltPlane alignedBlocksPlane(const RandomWeight& w, bool padded) {
  const GgmlTypeTraits tr = ggmlTypeTraits(w.type);
  const uint64_t blocks = w.cols / tr.block_size;
  BuiltPlane p;
  p.table.kind = PlaneKind::kBlocks;
  p.table.elem = ElemType::kU8;
  p.table.rows = w.rows;
  p.table.cols = w.cols;
  p.table.group_size = tr.block_size;
  p.table.group_pitch = static_cast<uint32_t>(alignUp(tr.type_size, 16));
  p.table.row_pitch = blocks * p.table.group_pitch + (padded ? 32 : 0);
  p.table.ggml_type = static_cast<uint32_t>(w.type);
  p.bytes.assign(p.table.bytes(), padded ? 0xCD : 0);
  for (uint64_t r = 0; r < w.rows; ++r)
    for (uint64_t b = 0; b < blocks; ++b)
      std::memcpy(p.bytes.data() + elementOffset(p.table, r, b * tr.block_size),
                  w.source.data() + (r * blocks + b) * tr.type_size, tr.type_size);
  return p;
}

// The CPU reference of the kBlocks kernels: cpu::matmul on the dense f32 view of w's reference values
// (dequantizeBlock of the same blocks) over n rows of activations x, bias or null.
std::vector<float> cpuBlocksMatmul(const RandomWeight& w, const float* bias, const std::vector<float>& x, int n) {
  cpu::WeightPlanes view;
  view.name = "test weight";
  view.rows = w.rows;
  view.cols = w.cols;
  StrideTable dense;
  dense.kind = PlaneKind::kF32;
  dense.rows = w.rows;
  dense.cols = w.cols;
  dense.row_pitch = w.cols * 4;
  view.dense = {dense, reinterpret_cast<const uint8_t*>(w.values.data()), w.values.size() * 4};
  std::vector<float> ref(static_cast<size_t>(n) * w.rows), scratch(w.cols);
  cpu::matmul(view, cpu::RowSource::kDense, bias, x.data(), n, ref.data(), nullptr, scratch.data());
  return ref;
}

// minfer_gemv_blocks against the CPU matmul (dense f32 view of the reference values, dequantizeBlock of
// the same blocks) on the dequantized q8 activations: W·(d·q) as for GEMV. Rows 7 … 4100 and K = 256·k,
// k = 1, 3, 14, 40, 74 (one block; fewer blocks than a warp covers in one step; the 7B's K = 3584 and
// 18944), both types, with and without bias and padding, each case with one of six work shapes (rows per
// warp 1, 2, 4, so row counts not divisible by them; 1 or 2 warps per row; unroll 1 or 2) besides
// the codegen's gemvBlocksShape.
TEST_CASE("gemv_blocks: Q4_K and Q6_K kBlocks planes vs the CPU") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    GgmlType type;
    uint64_t rows, cols;
    bool bias, padded;
    kern::GemvBlocksShape shape;
  };
  const kern::GemvBlocksShape shapes[] = {{1, 1, 1}, {2, 1, 1}, {4, 1, 2}, {2, 2, 1}, {1, 2, 2}, {4, 2, 1}};
  std::vector<Case> cases;
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K})
    for (uint64_t rows : {7, 33, 257, 4100})
      for (uint64_t kb : {1, 3, 14, 40, 74}) {
        if (rows == 4100 && kb == 40) continue;
        const size_t i = cases.size();
        cases.push_back({t, rows, 256 * kb, i % 2 == 0, i % 3 == 1, shapes[i % 6]});
        cases.push_back({t, rows, 256 * kb, i % 2 == 1, i % 3 == 2,
                         kern::gemvBlocksShape(static_cast<unsigned>(rows), static_cast<unsigned>(256 * kb))});
      }
  std::vector<codegen::KernelSpec> specs;
  for (const Case& c : cases) {
    const uint32_t gp = static_cast<uint32_t>(alignUp(ggmlTypeTraits(c.type).type_size, 16));
    const uint64_t pitch = c.cols / 256 * gp + (c.padded ? 32 : 0);
    specs.push_back(spec("gemv_blocks_test_" + codegen::typeTag(static_cast<uint32_t>(c.type)) + "_n" + str(c.rows) +
                             "_k" + str(c.cols) + (c.bias ? "_bias" : "") + (c.padded ? "_pad" : "") + "_r" +
                             str(c.shape.rows) + "w" + str(c.shape.warps) + "u" + str(c.shape.unroll),
                         "kernels/gemv_blocks.cuh", "minfer_gemv_blocks",
                         {{"GEMVB_N", str(c.rows)}, {"GEMVB_K", str(c.cols)},
                          {"GEMVB_TYPE", str(static_cast<unsigned>(c.type))}, {"GEMVB_PITCH", str(pitch)},
                          {"GEMVB_GROUP_PITCH", str(gp)},
                          {"GEMVB_ROWS", str(c.shape.rows)}, {"GEMVB_ROW_WARPS", str(c.shape.warps)},
                          {"GEMVB_UNROLL", str(c.shape.unroll)},
                          {"GEMVB_HAS_BIAS", c.bias ? "1" : "0"}}));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    CAPTURE(k[i].key);  // type, rows, cols, bias, padding, work shape
    const RandomWeight w = makeRandomWeight(c.type, c.rows, c.cols, rng(), 0.5f);
    const BuiltPlane plane = alignedBlocksPlane(w, c.padded);
    REQUIRE(plane.table.row_pitch % 16 == 0);
    const std::vector<float> x = activations(1, static_cast<int>(c.cols));
    const HostQ8 hq = quantizeHost(x, 1, static_cast<int>(c.cols));
    const std::vector<float> bias_v = randomFloats(c.rows, rng());
    const std::vector<float> ref = cpuBlocksMatmul(w, c.bias ? bias_v.data() : nullptr, hq.deq, 1);
    DeviceArray d_w = DeviceArray::of(plane.bytes), d_bias = DeviceArray::of(bias_v), xq = DeviceArray::of(hq.qs),
                xm = DeviceArray::of(hq.meta), out(c.rows * 4);
    out.poison();
    CUdeviceptr pw = d_w.ptr(), pb = c.bias ? d_bias.ptr() : 0, a = xq.ptr(), b = xm.ptr(), o = out.ptr();
    launch(k[i], kern::gemvBlocksLaunch(static_cast<unsigned>(c.rows), c.shape), {&pw, &pb, &a, &b, &o});
    const std::vector<float> got = out.download<float>(c.rows);
    CHECK(track("gemv_blocks", relError(got.data(), ref.data(), c.rows)) <= kGemvBlocksTol);
  }
}

// minfer_gemv_glu (gemv_blocks.cuh GEMVB_GLU: the decode steps MatMul gate, MatMul up, SwiGlu / GeGlu and
// QuantizeAct in one launch) against those steps' own kernels: gate and up products bit-identical to two
// minfer_gemv_blocks launches, the GLU output bit-identical to the plain elementwise kernel on them, and
// its q8 form bit-identical to the host mirror of quantize_act (checkFusedQ8). Rows 32 … 18944 (1 … 592
// blocks of 32, each completed by 16 thread blocks), K 256 … 3584, both types, padded planes, the gate
// buffer separate or the output's (null). Launched twice: the counters must be back to zero after each
// launch (the second launch's q8 depends on it).
TEST_CASE("gemv_glu: fused gate|up GEMV, GLU and q8, bit-identical to the unfused kernels; counters left zero") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    GgmlType type;
    uint64_t rows, cols;
    int op;  // 1 swiglu, 3 geglu
    bool padded, separate_gate;
  };
  std::vector<Case> cases;
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K})
    for (uint64_t rows : {32, 96, 224, 18944})
      for (uint64_t kb : {1, 3, 14}) {
        if (rows == 18944 && kb != 14) continue;
        const size_t i = cases.size();
        cases.push_back({t, rows, 256 * kb, i % 2 ? 3 : 1, i % 3 == 1, i % 4 < 2});
      }
  std::vector<codegen::KernelSpec> specs;
  for (const Case& c : cases) {
    const uint32_t gp = static_cast<uint32_t>(alignUp(ggmlTypeTraits(c.type).type_size, 16));
    const uint64_t pitch = c.cols / 256 * gp + (c.padded ? 32 : 0);
    const kern::GemvBlocksShape sh = kern::gemvGluShape(static_cast<unsigned>(c.rows), static_cast<unsigned>(c.cols));
    std::vector<std::pair<std::string, std::string>> defs = {
        {"GEMVB_N", str(c.rows)}, {"GEMVB_K", str(c.cols)}, {"GEMVB_TYPE", str(static_cast<unsigned>(c.type))},
        {"GEMVB_PITCH", str(pitch)}, {"GEMVB_GROUP_PITCH", str(gp)}, {"GEMVB_ROWS", str(sh.rows)},
        {"GEMVB_ROW_WARPS", str(sh.warps)}, {"GEMVB_UNROLL", str(sh.unroll)}, {"GEMVB_HAS_BIAS", "0"}};
    const std::string tag = codegen::typeTag(static_cast<uint32_t>(c.type)) + "_n" + str(c.rows) + "_k" + str(c.cols) +
                            (c.padded ? "_pad" : "") + "_op" + str(static_cast<uint64_t>(c.op));
    specs.push_back(spec("gemv_glu_test_plain_" + tag, "kernels/gemv_blocks.cuh", "minfer_gemv_blocks", defs));
    defs.push_back({"GEMVB_GLU", str(static_cast<uint64_t>(c.op))});
    specs.push_back(spec("gemv_glu_test_fused_" + tag, "kernels/gemv_blocks.cuh", "minfer_gemv_glu", defs));
    specs.push_back(spec("gemv_glu_test_ew_" + tag, "kernels/elementwise.cuh", c.op == 1 ? "minfer_swiglu" : "minfer_geglu",
                         {{"EW_WIDTH", str(c.rows)}, {"EW_OP", str(static_cast<uint64_t>(c.op))}}));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Kernel &plain = k[3 * i], &fused = k[3 * i + 1], &ew = k[3 * i + 2];
    CAPTURE(fused.key);
    CAPTURE(c.separate_gate);
    const unsigned n = static_cast<unsigned>(c.rows);
    const BuiltPlane pg = alignedBlocksPlane(makeRandomWeight(c.type, c.rows, c.cols, rng(), 0.5f), c.padded);
    const BuiltPlane pu = alignedBlocksPlane(makeRandomWeight(c.type, c.rows, c.cols, rng(), 0.5f), c.padded);
    const HostQ8 hq = quantizeHost(activations(1, static_cast<int>(c.cols)), 1, static_cast<int>(c.cols));
    DeviceArray wg = DeviceArray::of(pg.bytes), wu = DeviceArray::of(pu.bytes), xq = DeviceArray::of(hq.qs),
                xm = DeviceArray::of(hq.meta), ref_g(n * 4), ref_u(n * 4), ref_out(n * 4), gate(n * 4), up(n * 4),
                out(n * 4), qs(n), meta(n / 32 * 8), counters(n / 32 * 4);
    for (DeviceArray* a : {&ref_g, &ref_u, &ref_out}) a->poison();
    CUdeviceptr pwg = wg.ptr(), pwu = wu.ptr(), null = 0, a = xq.ptr(), b = xm.ptr(), prg = ref_g.ptr(),
                pru = ref_u.ptr(), pro = ref_out.ptr();
    const kern::GemvBlocksShape sh = kern::gemvGluShape(n, static_cast<unsigned>(c.cols));
    launch(plain, kern::gemvBlocksLaunch(n, sh), {&pwg, &null, &a, &b, &prg});
    launch(plain, kern::gemvBlocksLaunch(n, sh), {&pwu, &null, &a, &b, &pru});
    int one = 1;
    launch(ew, kern::elementwiseLaunch(1, n), {&prg, &pru, &pro, &one});
    const std::vector<uint32_t> zeros(n / 32, 0);
    counters.upload(zeros.data(), zeros.size() * 4);
    for (int round = 0; round < 2; ++round) {
      CAPTURE(round);
      for (DeviceArray* d : {&gate, &up, &out, &qs, &meta}) d->poison();
      CUdeviceptr pg_out = c.separate_gate ? gate.ptr() : 0, pu_out = up.ptr(), po = out.ptr(), pq = qs.ptr(),
                  pm = meta.ptr(), pc = counters.ptr();
      launch(fused, kern::gemvGluLaunchRule(n, sh).at(1), {&pwg, &pwu, &a, &b, &pg_out, &pu_out, &po, &pq, &pm, &pc});
      checkFusedQ8(ref_out, out, qs, meta, 1, static_cast<int>(n));
      const std::vector<float> ru = ref_u.download<float>(n), gu = up.download<float>(n);
      CHECK(std::memcmp(ru.data(), gu.data(), n * 4) == 0);
      if (c.separate_gate) {
        const std::vector<float> rg = ref_g.download<float>(n), gg = gate.download<float>(n);
        CHECK(std::memcmp(rg.data(), gg.data(), n * 4) == 0);
      }
      CHECK(counters.download<uint32_t>(n / 32) == zeros);
    }
  }
}

// The -D constants of a gemv_blocks.cuh kernel on an aligned test plane of `type` (rows × cols, padded or not).
std::vector<std::pair<std::string, std::string>> gemvBlocksDefs(GgmlType type, uint64_t rows, uint64_t cols,
                                                                bool padded, kern::GemvBlocksShape sh, bool bias) {
  const uint32_t gp = static_cast<uint32_t>(alignUp(ggmlTypeTraits(type).type_size, 16));
  const uint64_t pitch = cols / 256 * gp + (padded ? 32 : 0);
  return {{"GEMVB_N", str(rows)},         {"GEMVB_K", str(cols)},          {"GEMVB_TYPE", str(static_cast<unsigned>(type))},
          {"GEMVB_PITCH", str(pitch)},     {"GEMVB_GROUP_PITCH", str(gp)},  {"GEMVB_ROWS", str(sh.rows)},
          {"GEMVB_ROW_WARPS", str(sh.warps)}, {"GEMVB_UNROLL", str(sh.unroll)}, {"GEMVB_HAS_BIAS", bias ? "1" : "0"}};
}

// A test kernel key's tail: type, rows, cols, bias, padding.
std::string gemvBlocksTag(GgmlType type, uint64_t rows, uint64_t cols, bool bias, bool padded) {
  return codegen::typeTag(static_cast<uint32_t>(type)) + "_n" + str(rows) + "_k" + str(cols) + (bias ? "_bias" : "") +
         (padded ? "_pad" : "");
}

// minfer_gemv_pair (gemv_blocks.cuh GEMVB_PAIR: two decode MatMuls of one input in one launch) against two
// minfer_gemv_blocks launches of the same constants: both outputs bit-identical. Odd row counts (the last
// block of each half partly empty), both types, biases, padded planes.
TEST_CASE("gemv_pair: two GEMVs of one input in one launch, bit-identical to two minfer_gemv_blocks launches") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    GgmlType type;
    uint64_t rows, cols;
    bool bias, padded;
  };
  const std::vector<Case> cases = {{GgmlType::Q4_K, 7, 256, false, false},   {GgmlType::Q6_K, 33, 768, true, true},
                                   {GgmlType::Q4_K, 257, 3584, true, false}, {GgmlType::Q6_K, 512, 3584, false, true},
                                   {GgmlType::Q4_K, 4100, 1024, false, true}};
  std::vector<codegen::KernelSpec> specs;
  for (const Case& c : cases) {
    const kern::GemvBlocksShape sh = kern::gemvBlocksShape(static_cast<unsigned>(c.rows), static_cast<unsigned>(c.cols));
    auto defs = gemvBlocksDefs(c.type, c.rows, c.cols, c.padded, sh, c.bias);
    const std::string tag = gemvBlocksTag(c.type, c.rows, c.cols, c.bias, c.padded);
    specs.push_back(spec("gemv_pair_test_plain_" + tag, "kernels/gemv_blocks.cuh", "minfer_gemv_blocks", defs));
    defs.push_back({"GEMVB_PAIR", "1"});
    specs.push_back(spec("gemv_pair_test_fused_" + tag, "kernels/gemv_blocks.cuh", "minfer_gemv_pair", defs));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Kernel &plain = k[2 * i], &fused = k[2 * i + 1];
    CAPTURE(fused.key);
    const unsigned n = static_cast<unsigned>(c.rows);
    const kern::GemvBlocksShape sh = kern::gemvBlocksShape(n, static_cast<unsigned>(c.cols));
    const BuiltPlane p0 = alignedBlocksPlane(makeRandomWeight(c.type, c.rows, c.cols, rng(), 0.5f), c.padded);
    const BuiltPlane p1 = alignedBlocksPlane(makeRandomWeight(c.type, c.rows, c.cols, rng(), 0.5f), c.padded);
    const HostQ8 hq = quantizeHost(activations(1, static_cast<int>(c.cols)), 1, static_cast<int>(c.cols));
    DeviceArray w0 = DeviceArray::of(p0.bytes), w1 = DeviceArray::of(p1.bytes), b0 = DeviceArray::of(randomFloats(n, rng())),
                b1 = DeviceArray::of(randomFloats(n, rng())), xq = DeviceArray::of(hq.qs), xm = DeviceArray::of(hq.meta),
                r0(n * 4), r1(n * 4), o0(n * 4), o1(n * 4);
    for (DeviceArray* a : {&r0, &r1, &o0, &o1}) a->poison();
    CUdeviceptr pw0 = w0.ptr(), pw1 = w1.ptr(), pb0 = c.bias ? b0.ptr() : 0, pb1 = c.bias ? b1.ptr() : 0, a = xq.ptr(),
                b = xm.ptr(), pr0 = r0.ptr(), pr1 = r1.ptr(), po0 = o0.ptr(), po1 = o1.ptr();
    launch(plain, kern::gemvBlocksLaunch(n, sh), {&pw0, &pb0, &a, &b, &pr0});
    launch(plain, kern::gemvBlocksLaunch(n, sh), {&pw1, &pb1, &a, &b, &pr1});
    launch(fused, kern::gemvPairLaunchRule(n, sh).at(1), {&pw0, &pb0, &pw1, &pb1, &a, &b, &po0, &po1});
    CHECK(r0.download<float>(n) == o0.download<float>(n));
    CHECK(r1.download<float>(n) == o1.download<float>(n));
  }
}

// minfer_gemv_pair's persistent form (gemv_blocks.cuh GEMVB_PERSIST: a fixed grid whose blocks each take every
// gridDim.x-th block of gemvPairLaunchRule's grid) against the block grid form: both outputs bit-identical, with a plain
// q8 input and with a deferred RMSNorm's (GEMVB_RMS_EPS: the partial sums staged once per block). Grids of 1, 5 and 37
// blocks (items left over for some blocks, the last item partly empty) and the codegen's kGemvPairPersistBlocks on the
// 7B's gate|up (18944 × 3584, 9,472 items, the shape gemvPairPersists takes); odd rows, both types, biases, padding.
TEST_CASE("gemv_pair persistent: a resident grid over the block grid's items, bit-identical to the block grid") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    GgmlType type;
    uint64_t rows, cols;
    bool bias, padded;
    std::vector<unsigned> grids;
  };
  const std::vector<Case> cases = {{GgmlType::Q4_K, 257, 3584, true, false, {1, 5, 37}},
                                   {GgmlType::Q6_K, 33, 768, true, true, {1, 5}},
                                   {GgmlType::Q4_K, 4100, 1024, false, true, {5, 37}},
                                   {GgmlType::Q4_K, 18944, 3584, false, false, {kern::kGemvPairPersistBlocks}}};
  REQUIRE(kern::gemvPairPersists(18944, kern::gemvBlocksShape(18944, 3584)));
  std::vector<codegen::KernelSpec> specs;  // per case: block grid, persistent; each plain, then with the deferred norm
  for (const Case& c : cases) {
    const kern::GemvBlocksShape sh = kern::gemvBlocksShape(static_cast<unsigned>(c.rows), static_cast<unsigned>(c.cols));
    const std::string tag = gemvBlocksTag(c.type, c.rows, c.cols, c.bias, c.padded);
    for (bool rms : {false, true}) {
      auto defs = gemvBlocksDefs(c.type, c.rows, c.cols, c.padded, sh, c.bias);
      defs.push_back({"GEMVB_PAIR", "1"});
      if (rms) defs.push_back({"GEMVB_RMS_EPS", codegen::floatLiteral(1e-6f)});
      const std::string name = tag + (rms ? "_rms" : "");
      specs.push_back(spec("gemv_pair_persist_test_grid_" + name, "kernels/gemv_blocks.cuh", "minfer_gemv_pair", defs));
      defs.push_back({"GEMVB_PERSIST", "1"});
      specs.push_back(spec("gemv_pair_persist_test_resident_" + name, "kernels/gemv_blocks.cuh", "minfer_gemv_pair", defs));
    }
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const unsigned n = static_cast<unsigned>(c.rows);
    const kern::GemvBlocksShape sh = kern::gemvBlocksShape(n, static_cast<unsigned>(c.cols));
    const BuiltPlane p0 = alignedBlocksPlane(makeRandomWeight(c.type, c.rows, c.cols, rng(), 0.5f), c.padded);
    const BuiltPlane p1 = alignedBlocksPlane(makeRandomWeight(c.type, c.rows, c.cols, rng(), 0.5f), c.padded);
    const HostQ8 hq = quantizeHost(activations(1, static_cast<int>(c.cols)), 1, static_cast<int>(c.cols));
    std::vector<float> partials(c.cols / 32);
    for (float& v : partials) v = 0.5f + std::abs(randomFloats(1, rng())[0]);  // Σ sum² of a block: positive
    DeviceArray w0 = DeviceArray::of(p0.bytes), w1 = DeviceArray::of(p1.bytes), b0 = DeviceArray::of(randomFloats(n, rng())),
                b1 = DeviceArray::of(randomFloats(n, rng())), xq = DeviceArray::of(hq.qs), xm = DeviceArray::of(hq.meta),
                rms = DeviceArray::of(partials), r0(n * 4), r1(n * 4), o0(n * 4), o1(n * 4);
    CUdeviceptr pw0 = w0.ptr(), pw1 = w1.ptr(), pb0 = c.bias ? b0.ptr() : 0, pb1 = c.bias ? b1.ptr() : 0, a = xq.ptr(),
                b = xm.ptr(), pr = rms.ptr(), pr0 = r0.ptr(), pr1 = r1.ptr(), po0 = o0.ptr(), po1 = o1.ptr();
    for (int rms_input = 0; rms_input < 2; ++rms_input) {
      const Kernel &grid = k[4 * i + 2 * rms_input], &resident = k[4 * i + 2 * rms_input + 1];
      CAPTURE(resident.key);
      std::vector<void*> ref_args = {&pw0, &pb0, &pw1, &pb1, &a, &b, &pr0, &pr1};
      if (rms_input) ref_args.push_back(&pr);
      for (DeviceArray* x : {&r0, &r1}) x->poison();
      launch(grid, kern::gemvPairLaunchRule(n, sh).at(1), ref_args);
      const std::vector<float> want0 = r0.download<float>(n), want1 = r1.download<float>(n);
      for (unsigned g : c.grids) {
        CAPTURE(g);
        std::vector<void*> args = {&pw0, &pb0, &pw1, &pb1, &a, &b, &po0, &po1};
        if (rms_input) args.push_back(&pr);
        for (DeviceArray* x : {&o0, &o1}) x->poison();
        const kern::LaunchShape ls = kern::gemvPairPersistentLaunchRule(n, sh, g).at(1);
        CHECK(ls.grid.x == g);
        launch(resident, ls, args);
        CHECK(o0.download<float>(n) == want0);
        CHECK(o1.download<float>(n) == want1);
      }
    }
  }
}

// minfer_gemv_batch (gemv_blocks.cuh GEMVB_BATCH: the small-batch MatMul on the blocks) on 1 … B q8 rows against
// one minfer_gemv_blocks launch per row with the same constants: every row's output bit-identical, and nothing
// written past the call's rows (poisoned rows stay poisoned). Odd row counts (the last block partly empty), K from
// one block to the 7B's down projection, both types, bias and padding, the codegen's work shape and three others
// (1 or 4 rows per warp, 1 or 2 warps per row), B = 8 (the codegen's) and 3.
TEST_CASE("gemv_batch: n q8 rows in one launch, each bit-identical to its own minfer_gemv_blocks launch") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    GgmlType type;
    uint64_t rows, cols;
    bool bias, padded;
    kern::GemvBlocksShape shape;
    int batch;
  };
  const std::vector<Case> cases = {
      {GgmlType::Q4_K, 7, 256, false, false, {2, 2, 1}, 8},     {GgmlType::Q6_K, 33, 768, true, true, {1, 1, 1}, 8},
      {GgmlType::Q4_K, 257, 3584, true, false, {4, 1, 1}, 8},   {GgmlType::Q6_K, 512, 3584, false, true, {2, 2, 1}, 3},
      {GgmlType::Q4_K, 4100, 1024, false, true, {1, 2, 1}, 8},  {GgmlType::Q6_K, 3584, 18944, true, false, {2, 2, 1}, 8},
      {GgmlType::Q4_K, 1000, 18944, false, false, {2, 2, 1}, 3}};
  std::vector<codegen::KernelSpec> specs;
  for (const Case& c : cases) {
    auto defs = gemvBlocksDefs(c.type, c.rows, c.cols, c.padded, c.shape, c.bias);
    const std::string tag = gemvBlocksTag(c.type, c.rows, c.cols, c.bias, c.padded) + "_r" + str(c.shape.rows) + "w" +
                            str(c.shape.warps);
    specs.push_back(spec("gemv_batch_test_plain_" + tag, "kernels/gemv_blocks.cuh", "minfer_gemv_blocks", defs));
    defs.push_back({"GEMVB_BATCH", str(c.batch)});
    specs.push_back(spec("gemv_batch_test_b" + str(c.batch) + "_" + tag, "kernels/gemv_blocks.cuh", "minfer_gemv_batch",
                         defs));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Kernel &plain = k[2 * i], &batched = k[2 * i + 1];
    CAPTURE(batched.key);
    const unsigned n = static_cast<unsigned>(c.rows);
    const BuiltPlane pw = alignedBlocksPlane(makeRandomWeight(c.type, c.rows, c.cols, rng(), 0.5f), c.padded);
    const int kb = c.batch;
    const HostQ8 hq = quantizeHost(activations(kb, static_cast<int>(c.cols)), kb, static_cast<int>(c.cols));
    DeviceArray w = DeviceArray::of(pw.bytes), bias = DeviceArray::of(randomFloats(n, rng())), xq = DeviceArray::of(hq.qs),
                xm = DeviceArray::of(hq.meta), ref(static_cast<uint64_t>(kb) * n * 4), got(static_cast<uint64_t>(kb) * n * 4);
    CUdeviceptr pw_ = w.ptr(), pb = c.bias ? bias.ptr() : 0;
    const kern::LaunchShape sh = kern::gemvBlocksLaunch(n, c.shape);
    for (int t = 0; t < kb; ++t) {  // the reference: each row alone
      CUdeviceptr a = xq.ptr() + static_cast<uint64_t>(t) * c.cols, b = xm.ptr() + static_cast<uint64_t>(t) * c.cols / 32 * 8,
                  o = ref.ptr() + static_cast<uint64_t>(t) * n * 4;
      launch(plain, sh, {&pw_, &pb, &a, &b, &o});
    }
    const std::vector<float> want = ref.download<float>(static_cast<size_t>(kb) * n);
    for (int tokens : {1, 2, kb}) {
      CAPTURE(tokens);
      got.poison();
      CUdeviceptr a = xq.ptr(), b = xm.ptr(), o = got.ptr();
      launch(batched, sh, {&pw_, &pb, &a, &b, &o, &tokens});
      const std::vector<float> all = got.download<float>(static_cast<size_t>(kb) * n);
      const size_t used = static_cast<size_t>(tokens) * n;
      CHECK(std::memcmp(all.data(), want.data(), used * sizeof(float)) == 0);
      size_t written_past = 0;  // poison is NaN: a written value past the call's rows is a number
      for (size_t j = used; j < all.size(); ++j) written_past += !std::isnan(all[j]);
      CHECK(written_past == 0);
    }
  }
}

// minfer_gemv_triple (gemv_blocks.cuh GEMVB_TRIPLE: three decode MatMuls of one input in one launch, q, k and v of
// a q/k-norm model) against three minfer_gemv_blocks launches, each with its own segment's constants as the codegen
// gives them (gemvBlocksShape of its rows): all three outputs bit-identical. Segments of different rows (odd counts:
// each segment's last block partly empty, and the segment boundaries inside the grid at odd block indices), Q4_K
// and Q6_K mixed in every order, a bias on some, padded planes on some, and one segment of ≥ 65536 rows (4 rows
// per warp beside segments of 2).
TEST_CASE("gemv_triple: three GEMVs of one input in one launch, bit-identical to three minfer_gemv_blocks launches") {
  MINFER_REQUIRE_GPU(G);
  struct Segment {
    GgmlType type;
    uint64_t rows;
    bool bias, padded;
  };
  struct Case {
    uint64_t cols;
    Segment seg[3];
  };
  const Case cases[] = {
      {256, {{GgmlType::Q4_K, 256, false, false}, {GgmlType::Q4_K, 64, false, true}, {GgmlType::Q6_K, 64, false, false}}},
      {768, {{GgmlType::Q6_K, 33, true, true}, {GgmlType::Q4_K, 7, true, false}, {GgmlType::Q4_K, 19, false, true}}},
      {2048, {{GgmlType::Q4_K, 4096, false, false}, {GgmlType::Q4_K, 512, false, false}, {GgmlType::Q6_K, 512, false, true}}},
      {1280, {{GgmlType::Q4_K, 1000, true, false}, {GgmlType::Q6_K, 131, true, true}, {GgmlType::Q6_K, 131, true, false}}},
      {256, {{GgmlType::Q6_K, 65541, false, false}, {GgmlType::Q4_K, 9, true, true}, {GgmlType::Q4_K, 70000, false, true}}},
  };
  std::vector<codegen::KernelSpec> specs;
  for (size_t ci = 0; ci < std::size(cases); ++ci) {
    const Case& c = cases[ci];
    std::vector<std::pair<std::string, std::string>> fused = {{"GEMVB_TRIPLE", "1"}, {"GEMVB_K", str(c.cols)},
                                                              {"GEMVB_ROW_WARPS", "2"}, {"GEMVB_UNROLL", "1"}};
    for (int s = 0; s < 3; ++s) {
      const Segment& g = c.seg[s];
      const kern::GemvBlocksShape sh = kern::gemvBlocksShape(static_cast<unsigned>(g.rows), static_cast<unsigned>(c.cols));
      REQUIRE(sh.warps == 2);
      REQUIRE(sh.unroll == 1);
      const auto defs = gemvBlocksDefs(g.type, g.rows, c.cols, g.padded, sh, g.bias);
      specs.push_back(spec("gemv_triple_test_plain_" + str(ci) + "_" + gemvBlocksTag(g.type, g.rows, c.cols, g.bias, g.padded),
                           "kernels/gemv_blocks.cuh", "minfer_gemv_blocks", defs));
      for (const auto& [name, value] : defs)
        if (name != "GEMVB_K" && name != "GEMVB_ROW_WARPS" && name != "GEMVB_UNROLL") fused.push_back({name + str(s), value});
    }
    specs.push_back(spec("gemv_triple_test_fused_" + str(ci), "kernels/gemv_blocks.cuh", "minfer_gemv_triple", fused));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t ci = 0; ci < std::size(cases); ++ci) {
    const Case& c = cases[ci];
    const Kernel* kk = &k[4 * ci];  // plain 0, 1, 2, fused
    CAPTURE(kk[3].key);
    const HostQ8 hq = quantizeHost(activations(1, static_cast<int>(c.cols)), 1, static_cast<int>(c.cols));
    DeviceArray xq = DeviceArray::of(hq.qs), xm = DeviceArray::of(hq.meta);
    std::vector<DeviceArray> w, bias, ref, got;
    unsigned n[3];
    kern::GemvBlocksShape shape[3];
    for (int s = 0; s < 3; ++s) {
      const Segment& g = c.seg[s];
      n[s] = static_cast<unsigned>(g.rows);
      shape[s] = kern::gemvBlocksShape(n[s], static_cast<unsigned>(c.cols));
      w.push_back(DeviceArray::of(alignedBlocksPlane(makeRandomWeight(g.type, g.rows, c.cols, rng(), 0.5f), g.padded).bytes));
      bias.push_back(DeviceArray::of(randomFloats(g.rows, rng())));
      ref.emplace_back(g.rows * 4);
      got.emplace_back(g.rows * 4);
      ref.back().poison();
      got.back().poison();
    }
    CUdeviceptr a = xq.ptr(), b = xm.ptr(), pw[3], pb[3], pr[3], pg[3];
    for (int s = 0; s < 3; ++s) {
      pw[s] = w[s].ptr();
      pb[s] = c.seg[s].bias ? bias[s].ptr() : 0;
      pr[s] = ref[s].ptr();
      pg[s] = got[s].ptr();
      launch(kk[s], kern::gemvBlocksLaunch(n[s], shape[s]), {&pw[s], &pb[s], &a, &b, &pr[s]});
    }
    launch(kk[3], kern::gemvTripleLaunchRule(n, shape).at(1),
           {&pw[0], &pb[0], &pw[1], &pb[1], &pw[2], &pb[2], &a, &b, &pg[0], &pg[1], &pg[2]});
    for (int s = 0; s < 3; ++s) {
      CAPTURE(s);
      const std::vector<float> r = ref[s].download<float>(n[s]), g = got[s].download<float>(n[s]);
      CHECK(std::memcmp(r.data(), g.data(), n[s] * 4) == 0);
      CHECK(std::isfinite(relError(g.data(), r.data(), n[s])));  // every row written (no poison left)
    }
  }
}

// minfer_gemv_add_norm (gemv_blocks.cuh GEMVB_NORM: a decode MatMul, the residual Add, and the RmsNorm and
// QuantizeAct with the 1/rms left to the consumers). The product bit-identical to minfer_gemv_blocks with the same work
// shape (gemvBlocksShape, as the codegen launches both), the sum bit-identical to res + out on the host, the q8 buffer
// bit-identical to the host mirror of quantize_act on u = sum ⊙ nw (f32 products), and each block's partial sum of
// squares against float64 (kRmsNormTol). Rows 32 … 3584 (1 … 112 q8 blocks, each completed by 8 thread blocks),
// K 256 … 18944, both types, bias, padding, the residual updated in place (res = sum) or not, the product written or
// not (out null); launched twice (the counters back to zero).
TEST_CASE("gemv_add_norm: fused GEMV, residual Add, the deferred RMSNorm's q8 form and partial sums; counters zero") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    GgmlType type;
    uint64_t rows, cols;
    bool bias, padded, in_place, no_out;  // no_out: out null (the norm's output reuses the product's buffer)
  };
  const std::vector<Case> cases = {{GgmlType::Q4_K, 32, 256, false, false, true, false},
                                   {GgmlType::Q6_K, 96, 768, true, true, false, true},
                                   {GgmlType::Q4_K, 224, 3584, true, false, true, false},
                                   {GgmlType::Q6_K, 3584, 3584, false, true, true, true},
                                   {GgmlType::Q4_K, 3584, 18944, false, false, false, false},
                                   {GgmlType::Q6_K, 3584, 18944, true, false, true, true}};
  const auto shape = [](const Case& c) {
    return kern::gemvBlocksShape(static_cast<unsigned>(c.rows), static_cast<unsigned>(c.cols));
  };
  std::vector<codegen::KernelSpec> specs;
  for (const Case& c : cases) {
    auto defs = gemvBlocksDefs(c.type, c.rows, c.cols, c.padded, shape(c), c.bias);
    const std::string tag = gemvBlocksTag(c.type, c.rows, c.cols, c.bias, c.padded);
    specs.push_back(spec("gemv_norm_test_plain_" + tag, "kernels/gemv_blocks.cuh", "minfer_gemv_blocks", defs));
    defs.push_back({"GEMVB_NORM", "1"});
    specs.push_back(spec("gemv_norm_test_fused_" + tag, "kernels/gemv_blocks.cuh", "minfer_gemv_add_norm", defs));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Kernel &plain = k[2 * i], &fused = k[2 * i + 1];
    CAPTURE(fused.key);
    CAPTURE(c.in_place);
    const unsigned n = static_cast<unsigned>(c.rows);
    const kern::LaunchShape ls = kern::gemvBlocksLaunch(n, shape(c));
    const BuiltPlane pw = alignedBlocksPlane(makeRandomWeight(c.type, c.rows, c.cols, rng(), 0.5f), c.padded);
    const HostQ8 hq = quantizeHost(activations(1, static_cast<int>(c.cols)), 1, static_cast<int>(c.cols));
    const std::vector<float> res_v = activations(1, static_cast<int>(n)), nw_v = randomFloats(n, rng());
    DeviceArray w = DeviceArray::of(pw.bytes), bias = DeviceArray::of(randomFloats(n, rng())), xq = DeviceArray::of(hq.qs),
                xm = DeviceArray::of(hq.meta), nw = DeviceArray::of(nw_v), ref(n * 4), out(n * 4), res(n * 4),
                sum(n * 4), qs(n), meta(n / 32 * 8), partial(n / 32 * 4);
    DeviceArray counters = DeviceArray::of(std::vector<uint32_t>(n / 32, 0));
    ref.poison();
    CUdeviceptr pw_ = w.ptr(), pb = c.bias ? bias.ptr() : 0, a = xq.ptr(), b = xm.ptr(), pref = ref.ptr();
    launch(plain, ls, {&pw_, &pb, &a, &b, &pref});
    const std::vector<float> mm = ref.download<float>(n);
    std::vector<float> want_sum(n), u(n), want_partial(n / 32, 0.0f);
    for (unsigned r = 0; r < n; ++r) {
      want_sum[r] = res_v[r] + mm[r];
      u[r] = want_sum[r] * nw_v[r];
    }
    for (unsigned blk = 0; blk < n / 32; ++blk) {
      double ss = 0;
      for (unsigned j = 0; j < 32; ++j) ss += static_cast<double>(want_sum[32 * blk + j]) * want_sum[32 * blk + j];
      want_partial[blk] = static_cast<float>(ss);
    }
    for (int round = 0; round < 2; ++round) {
      CAPTURE(round);
      for (DeviceArray* d : {&out, &sum, &qs, &meta, &partial}) d->poison();
      res.upload(res_v.data(), n * 4);
      CUdeviceptr po = c.no_out ? 0 : out.ptr(), pr = res.ptr(), ps = c.in_place ? res.ptr() : sum.ptr(),
                  pnw = nw.ptr(), pq = qs.ptr(), pm = meta.ptr(), pp = partial.ptr(), pc = counters.ptr();
      launch(fused, ls, {&pw_, &pb, &a, &b, &po, &pr, &ps, &pnw, &pq, &pm, &pp, &pc});
      if (!c.no_out) CHECK(out.download<float>(n) == mm);
      CHECK((c.in_place ? res : sum).download<float>(n) == want_sum);
      checkQ8Of(u, qs, meta, 1, static_cast<int>(n));
      const std::vector<float> got_partial = partial.download<float>(n / 32);
      CHECK(track("gemv_add_norm partial sums", relError(got_partial.data(), want_partial.data(), n / 32)) <=
            kRmsNormTol);
      CHECK(counters.download<uint32_t>(n / 32) == std::vector<uint32_t>(n / 32, 0));
    }
  }
}

// Poisoned f32 outputs of a plain launch (ref, its pointers r) and of the same kernel with a deferred RMSNorm (got,
// g), one pair per row count; compare() checks each pair within kDeferredRmsTol.
struct Outputs {
  std::vector<unsigned> rows;
  std::vector<DeviceArray> ref, got;
  CUdeviceptr r[3] = {}, g[3] = {};
  explicit Outputs(std::vector<unsigned> n) : rows(std::move(n)) {
    for (size_t i = 0; i < rows.size() && i < 3; ++i) {
      ref.emplace_back(rows[i] * 4);
      got.emplace_back(rows[i] * 4);
      ref.back().poison();
      got.back().poison();
      r[i] = ref.back().ptr();
      g[i] = got.back().ptr();
    }
  }
  void compare(const char* what) const {
    for (size_t i = 0; i < ref.size(); ++i) {
      CAPTURE(what);
      CAPTURE(i);
      const std::vector<float> want = ref[i].download<float>(rows[i]), have = got[i].download<float>(rows[i]);
      CHECK(track("deferred RMSNorm consumers", relError(have.data(), want.data(), rows[i])) <= kDeferredRmsTol);
    }
  }
};

// One case of the deferred-norm consumer test: K, the weights' type, biases, and the QKV GEMV's heads (rows h·d,
// hkv·d, hkv·d; the other forms take h·d rows).
struct DeferredCase {
  uint64_t cols;
  GgmlType type;
  bool bias;
  int h, hkv, d;
  unsigned n() const { return static_cast<unsigned>(h * d); }
  unsigned nkv() const { return static_cast<unsigned>(hkv * d); }
};
constexpr float kDeferredEps = 1e-6f;

// The case's kernels, each plain then with GEMVB_RMS_EPS: gemv_blocks, pair, triple (k padded), glu (SwiGLU), qkv
// (NeoX RoPE over the whole head).
std::vector<codegen::KernelSpec> deferredConsumerSpecs(const DeferredCase& c, const std::string& tag) {
  std::vector<codegen::KernelSpec> specs;
  using Defines = std::vector<std::pair<std::string, std::string>>;
  const auto both = [&](const std::string& name, const char* entry, Defines defs) {
    specs.push_back(spec("rms_defer_test_plain_" + name + tag, "kernels/gemv_blocks.cuh", entry, defs));
    defs.push_back({"GEMVB_RMS_EPS", codegen::floatLiteral(kDeferredEps)});
    specs.push_back(spec("rms_defer_test_deferred_" + name + tag, "kernels/gemv_blocks.cuh", entry, defs));
  };
  const auto shape = [&](uint64_t rows) {
    return kern::gemvBlocksShape(static_cast<unsigned>(rows), static_cast<unsigned>(c.cols));
  };
  auto defs = gemvBlocksDefs(c.type, c.n(), c.cols, false, shape(c.n()), c.bias);
  both("blocks", "minfer_gemv_blocks", defs);
  defs.push_back({"GEMVB_PAIR", "1"});
  both("pair", "minfer_gemv_pair", defs);
  Defines triple = {
      {"GEMVB_TRIPLE", "1"}, {"GEMVB_K", str(c.cols)}, {"GEMVB_ROW_WARPS", "2"}, {"GEMVB_UNROLL", "1"}};
  const uint64_t rows[3] = {c.n(), c.nkv(), c.nkv()};
  for (int s = 0; s < 3; ++s)
    for (const auto& [name, value] : gemvBlocksDefs(c.type, rows[s], c.cols, s == 1, shape(rows[s]), c.bias))
      if (name != "GEMVB_K" && name != "GEMVB_ROW_WARPS" && name != "GEMVB_UNROLL")
        triple.push_back({name + str(s), value});
  both("triple", "minfer_gemv_triple", triple);
  const kern::GemvBlocksShape glu_shape = kern::gemvGluShape(c.n(), static_cast<unsigned>(c.cols));
  auto glu = gemvBlocksDefs(c.type, c.n(), c.cols, false, glu_shape, false);
  glu.push_back({"GEMVB_GLU", "1"});
  both("glu", "minfer_gemv_glu", glu);
  Defines qkv = {
      {"GEMVB_QKV", "1"}, {"GEMVB_K", str(c.cols)}, {"QKV_NHEAD", str(c.h)}, {"QKV_NHEAD_KV", str(c.hkv)},
      {"QKV_HEAD_DIM", str(c.d)}, {"GEMVB_ROW_WARPS", "2"}, {"GEMVB_UNROLL", "1"}};
  const uint32_t gp = static_cast<uint32_t>(alignUp(ggmlTypeTraits(c.type).type_size, 16));
  for (const char* seg : {"Q", "K", "V"}) {
    const std::string p = std::string("GEMVB_") + seg + "_";
    qkv.insert(qkv.end(), {{p + "TYPE", str(static_cast<unsigned>(c.type))}, {p + "PITCH", str(c.cols / 256 * gp)},
                           {p + "GROUP_PITCH", str(gp)}, {p + "HAS_BIAS", c.bias ? "1" : "0"}});
  }
  const kern::RopeYarn yarn = kern::ropeYarn(c.d, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f, 4096);
  const auto rope = ropeDefines(c.d, true, 10000.0f, 1.0f, false, yarn);
  qkv.insert(qkv.end(), rope.begin(), rope.end());
  both("qkv", "minfer_gemv_qkv", qkv);
  return specs;
}

// The consumers of a deferred RMSNorm (gemv_blocks.cuh GEMVB_RMS_EPS: minfer_gemv_blocks, _pair, _triple, _glu and
// _qkv reading minfer_gemv_add_norm's q8(u) and partial sums of squares): each against the same kernel without the
// constant on the q8 input whose block scales the host multiplied by inv = 1 / sqrt(Σ partials / K + eps), so every
// output (biases, RoPE, GLU, the K/V cache row) must agree up to f32 rounding (kDeferredRmsTol; the f16 cache rows
// within f16 rounding), and the GLU's q8 form is bit-identical to the host mirror of quantize_act on its output.
// K 256, 768 and 3584 (8 … 112 partials: lanes with 1 … 4 each), both types, biases or none.
TEST_CASE("deferred RMSNorm consumers: gemv_blocks, pair, triple, glu and qkv scale their sums by 1/rms") {
  MINFER_REQUIRE_GPU(G);
  const DeferredCase cases[] = {{256, GgmlType::Q4_K, true, 4, 2, 64}, {768, GgmlType::Q6_K, false, 6, 2, 64},
                                {3584, GgmlType::Q4_K, true, 28, 4, 128}};
  constexpr int kCtx = 8, kPos = 5;
  std::vector<codegen::KernelSpec> specs;
  for (size_t ci = 0; ci < std::size(cases); ++ci) {
    const std::vector<codegen::KernelSpec> s = deferredConsumerSpecs(cases[ci], "_" + str(ci));
    specs.insert(specs.end(), s.begin(), s.end());
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t ci = 0; ci < std::size(cases); ++ci) {
    const DeferredCase& c = cases[ci];
    const Kernel* kk = &k[10 * ci];  // plain / deferred: blocks, pair, triple, glu, qkv
    CAPTURE(kk[1].key);
    const unsigned n = c.n(), nkv = c.nkv();
    const int K = static_cast<int>(c.cols);
    // The input as minfer_gemv_add_norm leaves it: q8(sum ⊙ nw) and Σ sum² per block of 32; the reference input:
    // the same q8 with every scale times inv.
    const std::vector<float> sum_v = activations(1, K), nw_v = randomFloats(c.cols, rng());
    std::vector<float> u(c.cols), partial_v(c.cols / 32, 0.0f);
    for (int j = 0; j < K; ++j) {
      u[j] = sum_v[j] * nw_v[j];
      partial_v[j / 32] += sum_v[j] * sum_v[j];
    }
    double total = 0;
    for (float p : partial_v) total += p;
    const float inv = static_cast<float>(1.0 / std::sqrt(total / K + kDeferredEps));
    const HostQ8 hq = quantizeHost(u, 1, K);
    std::vector<kern::Q8Meta> scaled = hq.meta;
    for (kern::Q8Meta& m : scaled) m.d *= inv;
    DeviceArray xq = DeviceArray::of(hq.qs), xm = DeviceArray::of(hq.meta), xs = DeviceArray::of(scaled),
                rms = DeviceArray::of(partial_v);
    CUdeviceptr a = xq.ptr(), b_def = xm.ptr(), b_ref = xs.ptr(), pr = rms.ptr(), null = 0;
    const auto plane = [&](uint64_t rows, bool padded) {
      return DeviceArray::of(alignedBlocksPlane(makeRandomWeight(c.type, rows, c.cols, rng(), 0.5f), padded).bytes);
    };
    const kern::GemvBlocksShape sh = kern::gemvBlocksShape(n, static_cast<unsigned>(c.cols));
    DeviceArray w0 = plane(n, false), w1 = plane(n, false), wk = plane(nkv, true), wv = plane(nkv, false),
                b0 = DeviceArray::of(randomFloats(n, rng())), b1 = DeviceArray::of(randomFloats(n, rng())),
                bk = DeviceArray::of(randomFloats(nkv, rng())), bv = DeviceArray::of(randomFloats(nkv, rng()));
    CUdeviceptr pw0 = w0.ptr(), pw1 = w1.ptr(), pwk = wk.ptr(), pwv = wv.ptr(), pb0 = c.bias ? b0.ptr() : 0,
                pb1 = c.bias ? b1.ptr() : 0, pbk = c.bias ? bk.ptr() : 0, pbv = c.bias ? bv.ptr() : 0;
    {  // minfer_gemv_blocks and minfer_gemv_pair
      Outputs o({n, n, n});
      const kern::LaunchShape pair = kern::gemvPairLaunchRule(n, sh).at(1);
      launch(kk[0], kern::gemvBlocksLaunch(n, sh), {&pw0, &pb0, &a, &b_ref, &o.r[0]});
      launch(kk[1], kern::gemvBlocksLaunch(n, sh), {&pw0, &pb0, &a, &b_def, &o.g[0], &pr});
      launch(kk[2], pair, {&pw0, &pb0, &pw1, &pb1, &a, &b_ref, &o.r[1], &o.r[2]});
      launch(kk[3], pair, {&pw0, &pb0, &pw1, &pb1, &a, &b_def, &o.g[1], &o.g[2], &pr});
      o.compare("blocks, pair");
    }
    const unsigned qkv_rows[3] = {n, nkv, nkv};
    {  // minfer_gemv_triple (q, k, v shapes; k padded)
      Outputs o({n, nkv, nkv});
      kern::GemvBlocksShape shapes[3];
      for (int s = 0; s < 3; ++s) shapes[s] = kern::gemvBlocksShape(qkv_rows[s], static_cast<unsigned>(c.cols));
      const kern::LaunchShape ls = kern::gemvTripleLaunchRule(qkv_rows, shapes).at(1);
      launch(kk[4], ls, {&pw0, &pb0, &pwk, &pbk, &pwv, &pbv, &a, &b_ref, &o.r[0], &o.r[1], &o.r[2]});
      launch(kk[5], ls, {&pw0, &pb0, &pwk, &pbk, &pwv, &pbv, &a, &b_def, &o.g[0], &o.g[1], &o.g[2], &pr});
      o.compare("triple");
    }
    {  // minfer_gemv_glu (SwiGLU): gate, up, out and out's q8 form
      Outputs o({n, n, n});
      DeviceArray rq(n), rm(n / 32 * 8), gq(n), gm(n / 32 * 8);
      DeviceArray counters = DeviceArray::of(std::vector<uint32_t>(n / 32, 0));
      CUdeviceptr prq = rq.ptr(), prm = rm.ptr(), pgq = gq.ptr(), pgm = gm.ptr(), pc = counters.ptr();
      const kern::GemvBlocksShape glu_shape = kern::gemvGluShape(n, static_cast<unsigned>(c.cols));
      const kern::LaunchShape ls = kern::gemvGluLaunchRule(n, glu_shape).at(1);
      launch(kk[6], ls, {&pw0, &pw1, &a, &b_ref, &o.r[0], &o.r[1], &o.r[2], &prq, &prm, &pc});
      launch(kk[7], ls, {&pw0, &pw1, &a, &b_def, &o.g[0], &o.g[1], &o.g[2], &pgq, &pgm, &pc, &pr});
      o.compare("glu");
      checkQ8Of(o.got[2].download<float>(n), gq, gm, 1, static_cast<int>(n));
      CHECK(counters.download<uint32_t>(n / 32) == std::vector<uint32_t>(n / 32, 0));
    }
    {  // minfer_gemv_qkv (NeoX RoPE at kPos, K and V stored as f16)
      Outputs o({n, nkv, nkv});
      DeviceArray rkc(kCtx * nkv * 2), rvc(kCtx * nkv * 2), gkc(kCtx * nkv * 2), gvc(kCtx * nkv * 2),
          pos = DeviceArray::of(std::vector<int32_t>{kPos});
      for (DeviceArray* x : {&rkc, &rvc, &gkc, &gvc}) x->poison();
      CUdeviceptr prk = rkc.ptr(), prv = rvc.ptr(), pgk = gkc.ptr(), pgv = gvc.ptr(), pp = pos.ptr();
      const kern::LaunchShape ls = kern::gemvQkvLaunchRule(c.h, c.hkv, c.d, kern::gemvQkvShape()).at(1);
      // The QKV kernels were compiled with unpadded pitches: w1's first nkv rows serve as k (wk, padded, is the
      // triple's).
      launch(kk[8], ls,
             {&pw0, &pb0, &pw1, &pbk, &pwv, &pbv, &a, &b_ref, &null, &o.r[0], &o.r[1], &o.r[2], &prk, &prv, &pp});
      launch(kk[9], ls,
             {&pw0, &pb0, &pw1, &pbk, &pwv, &pbv, &a, &b_def, &null, &o.g[0], &o.g[1], &o.g[2], &pgk, &pgv, &pp, &pr});
      o.compare("qkv");
      const auto row = [&](const DeviceArray& cache) {  // the stored position as floats
        const std::vector<uint16_t> h = cache.download<uint16_t>(static_cast<size_t>(kCtx) * nkv);
        std::vector<float> f(nkv);
        for (unsigned j = 0; j < nkv; ++j) f[j] = halfToFloat(h[static_cast<size_t>(kPos) * nkv + j]);
        return f;
      };
      for (const auto& [rc, gc] : {std::pair<const DeviceArray*, const DeviceArray*>{&rkc, &gkc}, {&rvc, &gvc}}) {
        const std::vector<float> rr = row(*rc), gg = row(*gc);
        CHECK(track("deferred RMSNorm consumers (f16 cache rows)", relError(gg.data(), rr.data(), nkv)) <=
              kDeferredRmsF16Tol);
      }
    }
  }
}

// minfer_gemv_qkv (gemv_blocks.cuh GEMVB_QKV: the decode steps MatMul q, k, v, their Rope and the
// attention's KV store in one launch) against those steps' own kernels as the codegen compiles them: three
// minfer_gemv_blocks launches (with the biases), minfer_rope (--fmad=false) and minfer_kv_store.
// q, k, v and the two cache rows at the position must be bit-identical, and no other cache row written
// (the caches are poisoned). NeoX and norm style, full and partial rotation, frequency factors and YaRN,
// head sizes 64 and 128, GQA groups 2 and 7, mixed types (Q6_K v as Q4_K_M makes), biases or none.
TEST_CASE("gemv_qkv: fused q, k, v GEMV, RoPE and KV store, bit-identical to the unfused kernels") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    int h, hkv, d, n_rot;
    bool neox, ff, bias, yarn;
    GgmlType tq, tk, tv;
    uint64_t cols;
  };
  const Case cases[] = {
      {4, 2, 64, 64, true, false, true, false, GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K, 256},
      {28, 4, 128, 128, true, false, true, false, GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K, 3584},
      {6, 2, 64, 32, true, true, false, false, GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::Q4_K, 768},
      {6, 2, 128, 96, false, false, true, true, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q6_K, 512},
      {14, 2, 64, 64, false, true, false, false, GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q4_K, 1280},
  };
  constexpr int kCtx = 50, kPos = 37;
  std::vector<codegen::KernelSpec> specs;
  for (size_t ci = 0; ci < std::size(cases); ++ci) {
    const Case& c = cases[ci];
    const kern::RopeYarn y = kern::ropeYarn(c.n_rot, 10000.0f, c.yarn ? 0.25f : 1.0f, c.yarn ? 1.0f : 0.0f, 1.0f, 32.0f,
                                            1.0f, 4096);
    const auto rope = ropeDefines(c.n_rot, c.neox, 10000.0f, c.yarn ? 0.25f : 1.0f, c.ff, y);
    const std::string tag = "_" + str(ci);
    std::vector<std::pair<std::string, std::string>> fused = {
        {"GEMVB_QKV", "1"}, {"GEMVB_K", str(c.cols)}, {"QKV_NHEAD", str(c.h)}, {"QKV_NHEAD_KV", str(c.hkv)},
        {"QKV_HEAD_DIM", str(c.d)}, {"GEMVB_ROW_WARPS", "2"}, {"GEMVB_UNROLL", "1"}};
    const GgmlType types[3] = {c.tq, c.tk, c.tv};
    const uint64_t rows[3] = {uint64_t(c.h * c.d), uint64_t(c.hkv * c.d), uint64_t(c.hkv * c.d)};
    const char* seg[3] = {"Q", "K", "V"};
    for (int i = 0; i < 3; ++i) {
      const uint32_t gp = static_cast<uint32_t>(alignUp(ggmlTypeTraits(types[i]).type_size, 16));
      const std::string pitch = str(c.cols / 256 * gp + (i == 1 ? 32 : 0));  // k padded
      const std::string p = std::string("GEMVB_") + seg[i] + "_";
      fused.insert(fused.end(), {{p + "TYPE", str(static_cast<unsigned>(types[i]))}, {p + "PITCH", pitch},
                                 {p + "GROUP_PITCH", str(gp)}, {p + "HAS_BIAS", c.bias ? "1" : "0"}});
      specs.push_back(spec("gemv_qkv_test_plain" + tag + seg[i], "kernels/gemv_blocks.cuh", "minfer_gemv_blocks",
                           {{"GEMVB_N", str(rows[i])}, {"GEMVB_K", str(c.cols)},
                            {"GEMVB_TYPE", str(static_cast<unsigned>(types[i]))}, {"GEMVB_PITCH", pitch},
                            {"GEMVB_GROUP_PITCH", str(gp)}, {"GEMVB_ROWS", "2"}, {"GEMVB_ROW_WARPS", "2"},
                            {"GEMVB_UNROLL", "1"}, {"GEMVB_HAS_BIAS", c.bias ? "1" : "0"}}));
    }
    fused.insert(fused.end(), rope.begin(), rope.end());
    specs.push_back(spec("gemv_qkv_test_fused" + tag, "kernels/gemv_blocks.cuh", "minfer_gemv_qkv", fused));
    auto rope_defs = rope;
    rope_defs.insert(rope_defs.end(), {{"ROPE_NHEAD", str(c.h)}, {"ROPE_NHEAD_KV", str(c.hkv)}, {"ROPE_HEAD_DIM", str(c.d)}});
    specs.push_back(spec("gemv_qkv_test_rope" + tag, "kernels/rope.cuh", "minfer_rope", rope_defs, {"--fmad=false"}));
    specs.push_back(spec("gemv_qkv_test_store" + tag, "kernels/attention.cuh", "minfer_kv_store",
                         {{"ATT_NHEAD", str(c.h)}, {"ATT_NHEAD_KV", str(c.hkv)}, {"ATT_HEAD_DIM", str(c.d)},
                          {"ATT_KV_STORE", "1"}}));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t ci = 0; ci < std::size(cases); ++ci) {
    const Case& c = cases[ci];
    const Kernel* kk = &k[6 * ci];  // plain q, k, v, fused, rope, store
    CAPTURE(kk[3].key);
    const uint64_t rows[3] = {uint64_t(c.h * c.d), uint64_t(c.hkv * c.d), uint64_t(c.hkv * c.d)};
    const GgmlType types[3] = {c.tq, c.tk, c.tv};
    std::vector<DeviceArray> w, bias, ref, got;
    for (int i = 0; i < 3; ++i) {
      w.push_back(DeviceArray::of(alignedBlocksPlane(makeRandomWeight(types[i], rows[i], c.cols, rng(), 0.5f), i == 1).bytes));
      bias.push_back(DeviceArray::of(randomFloats(rows[i], rng())));
      ref.emplace_back(rows[i] * 4);
      got.emplace_back(rows[i] * 4);
      ref.back().poison();
      got.back().poison();
    }
    const HostQ8 hq = quantizeHost(activations(1, static_cast<int>(c.cols)), 1, static_cast<int>(c.cols));
    std::vector<float> ff(c.n_rot / 2);
    for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 0.25f * static_cast<float>(i % 9);
    const uint64_t kv_w = rows[1];
    DeviceArray xq = DeviceArray::of(hq.qs), xm = DeviceArray::of(hq.meta), d_ff = DeviceArray::of(ff),
                d_pos = DeviceArray::of(std::vector<int32_t>{kPos}), ref_kc(kCtx * kv_w * 2), ref_vc(kCtx * kv_w * 2),
                kc(kCtx * kv_w * 2), vc(kCtx * kv_w * 2);
    for (DeviceArray* a : {&ref_kc, &ref_vc, &kc, &vc}) a->poison();
    CUdeviceptr a = xq.ptr(), b = xm.ptr(), f = c.ff ? d_ff.ptr() : 0, p = d_pos.ptr();
    CUdeviceptr pw[3], pb[3], pr[3], pg[3];
    for (int i = 0; i < 3; ++i) {
      pw[i] = w[i].ptr();
      pb[i] = c.bias ? bias[i].ptr() : 0;
      pr[i] = ref[i].ptr();
      pg[i] = got[i].ptr();
    }
    for (int i = 0; i < 3; ++i)
      launch(kk[i], kern::gemvBlocksLaunch(static_cast<unsigned>(rows[i]), {2, 2, 1}), {&pw[i], &pb[i], &a, &b, &pr[i]});
    int one = 1;
    launch(kk[4], kern::ropeLaunch(1, c.h, c.hkv), {&pr[0], &pr[1], &f, &p, &one});
    CUdeviceptr rkc = ref_kc.ptr(), rvc = ref_vc.ptr(), gkc = kc.ptr(), gvc = vc.ptr();
    launch(kk[5], kern::kvStoreLaunch(1, c.hkv, c.d), {&pr[1], &pr[2], &rkc, &rvc, &p, &one});
    launch(kk[3], kern::gemvQkvLaunchRule(c.h, c.hkv, c.d, {2, 2, 1}).at(1),
           {&pw[0], &pb[0], &pw[1], &pb[1], &pw[2], &pb[2], &a, &b, &f, &pg[0], &pg[1], &pg[2], &gkc, &gvc, &p});
    for (int i = 0; i < 3; ++i) {
      const std::vector<float> r = ref[i].download<float>(rows[i]), g = got[i].download<float>(rows[i]);
      CHECK_MESSAGE(std::memcmp(r.data(), g.data(), rows[i] * 4) == 0, "qkv"[i]);
      CHECK(std::isfinite(relError(g.data(), r.data(), rows[i])));
    }
    // The whole caches: the row at kPos as kv_store wrote it, every other row still the poison pattern.
    CHECK(kc.download<uint16_t>(kCtx * kv_w) == ref_kc.download<uint16_t>(kCtx * kv_w));
    CHECK(vc.download<uint16_t>(kCtx * kv_w) == ref_vc.download<uint16_t>(kCtx * kv_w));
  }
}


// The per-output error bound of a matmul whose kernel rounds the decomposed weights (s, m and w = s·q + m) and the
// activations (d and d·q) to f16 and accumulates in f32 (mmq_blocks): 4·2⁻¹¹ · Σ_k (|s·q| + |m|)·|x_k| + K·2⁻²⁴ ·
// Σ_k |w_k·x_k|, for n rows of activations x; row t, weight row r at t·rows + r.
std::vector<double> f16MatmulBound(const RandomWeight& w, const std::vector<float>& x, int n) {
  const GgmlTypeTraits tr = ggmlTypeTraits(w.type);
  const uint64_t blocks = w.cols / tr.block_size, group = static_cast<uint64_t>(groupSize(w.type));
  std::vector<double> terms(w.cols);  // |s·q| + |m| of one row
  std::vector<double> bound(static_cast<size_t>(n) * w.rows);
  std::vector<int8_t> q(tr.block_size);
  std::vector<float> scale(tr.block_size), mn(tr.block_size, 0.0f);
  for (uint64_t r = 0; r < w.rows; ++r) {
    for (uint64_t b = 0; b < blocks; ++b) {
      REQUIRE(decomposeBlock(w.type, w.source.data() + (r * blocks + b) * tr.type_size, q.data(), scale.data(), mn.data()));
      for (uint64_t i = 0; i < tr.block_size; ++i)
        terms[b * tr.block_size + i] = std::fabs(static_cast<double>(scale[i / group]) * q[i]) +
                                       (hasMin(w.type) ? std::fabs(static_cast<double>(mn[i / group])) : 0.0);
    }
    for (int t = 0; t < n; ++t) {
      double rounding = 0, accumulation = 0;
      for (uint64_t k = 0; k < w.cols; ++k) {
        const double ax = std::fabs(static_cast<double>(x[t * w.cols + k]));
        rounding += terms[k] * ax;
        accumulation += std::fabs(static_cast<double>(w.values[r * w.cols + k])) * ax;
      }
      bound[static_cast<size_t>(t) * w.rows + r] = 4.0 * std::ldexp(rounding, -11) +
                                                   static_cast<double>(w.cols) * std::ldexp(accumulation, -24) + 1e-30;
    }
  }
  return bound;
}

// The mmq_blocks forms this GPU runs: mma.sync (MMQB_WGMMA 0, the GPU's own arch) everywhere, and on Hopper (sm_90)
// also the warpgroup form (MMQB_WGMMA 1, sm_90a images).
std::vector<bool> mmqbForms() {
  if (get()->arch == "sm_90") return {false, true};
  MESSAGE("the warpgroup form of mmq_blocks (MMQB_WGMMA, sm_90a) is not tested: this GPU is " << get()->arch);
  return {false};
}
// Kernels of `specs` in a form: the warpgroup form's keys end in _wg, define MMQB_WGMMA 1 and compile for sm_90a.
std::vector<Kernel> compileMmqbForm(std::vector<codegen::KernelSpec> specs, bool wgmma) {
  if (!wgmma) return compile(specs);
  for (codegen::KernelSpec& s : specs) {
    s.key += "_wg";
    s.defines.emplace_back("MMQB_WGMMA", "1");
  }
  return compile(specs, "sm_90a");
}

// The first `used` values of a launch's output `got` against `want`, each within its f16 bound (f16MatmulBound; the
// worst fraction tracked as `what`, at most kMmqBlocksBoundFraction), and nothing written past them (poison is NaN: a
// written value there is a number).
void checkWithinF16Bound(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<double>& bound, size_t used) {
  double worst = 0;  // the largest |got − want| as a fraction of its bound
  for (size_t j = 0; j < used; ++j) {
    if (!std::isfinite(got[j])) worst = INFINITY;
    worst = std::max(worst, std::fabs(static_cast<double>(got[j]) - want[j]) / bound[j]);
  }
  CHECK(track(what, worst) <= kMmqBlocksBoundFraction);
  size_t written_past = 0;
  for (size_t j = used; j < got.size(); ++j) written_past += !std::isnan(got[j]);
  CHECK(written_past == 0);
}

// minfer_mmq_blocks (mmq_blocks.cuh: the small-batch MatMul on the blocks, f16 tensor cores; the activations converted
// to an f16 tile in shared memory, the weights dequantized in registers) against the CPU matmul on the exact block
// values and the dequantized q8 activations (cpuBlocksMatmul). The kernel rounds s, m, each weight (one f16 fma), d and each activation (one f16 product) to
// f16, so each output must lie within its own bound: 4·2⁻¹¹ · Σ_k (|s·q| + |m|)·|x_k| (the f16 roundings, relative
// to each term's operands) + K·2⁻²⁴ · Σ_k |w_k·x_k| (f32 accumulation); the worst measured fraction of that bound is
// tracked. Both types; row counts not multiples of the 128-row tile (7, 130, 4100) and the 7B's; K from one block to
// the 7B's down projection; one split and several (split-K with the last-split sum; counters zero again: each
// launched twice); tiles of 16, 32 and 64 tokens at 1, 9, past half a tile and a full tile; bias and padding. Nothing
// is written past the call's rows (poisoned rows stay poisoned). Both forms (mmqbForms: mma.sync, and on Hopper the
// warpgroup MMAs) on the same data, each within the bound, and the two (and a repeated launch) the same bits.
TEST_CASE("mmq_blocks: Q4_K and Q6_K blocks on f16 tensor cores, 1 … 64 rows, split-K, vs the CPU within the f16 bound") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    GgmlType type;
    uint64_t rows, cols;
    bool bias, padded;
    unsigned tn, splits;
  };
  const std::vector<Case> cases = {
      {GgmlType::Q4_K, 7, 256, false, false, 32, 1},     {GgmlType::Q6_K, 130, 768, true, true, 64, 3},
      {GgmlType::Q4_K, 512, 3584, true, false, 64, 7},   {GgmlType::Q6_K, 512, 3584, false, true, 32, 2},
      {GgmlType::Q4_K, 4100, 1024, false, true, 16, 1},  {GgmlType::Q6_K, 3584, 18944, true, false, 64, 4},
      {GgmlType::Q4_K, 3584, 3584, false, false, 32, 5}, {GgmlType::Q4_K, 1000, 18944, true, true, 64, 74},
      {GgmlType::Q6_K, 100, 512, false, false, 16, 1},   {GgmlType::Q4_K, 300, 2048, true, false, 16, 8}};
  std::vector<codegen::KernelSpec> specs;
  for (const Case& c : cases) {
    const uint32_t gp = static_cast<uint32_t>(alignUp(ggmlTypeTraits(c.type).type_size, 16));
    const uint64_t pitch = c.cols / 256 * gp + (c.padded ? 32 : 0);
    specs.push_back(spec("mmq_blocks_test_" + codegen::typeTag(static_cast<uint32_t>(c.type)) + "_n" + str(c.rows) +
                             "_k" + str(c.cols) + (c.bias ? "_bias" : "") + (c.padded ? "_pad" : "") + "_tn" + str(c.tn) +
                             "_s" + str(c.splits),
                         "kernels/mmq_blocks.cuh", "minfer_mmq_blocks",
                         {{"MMQB_N", str(c.rows)}, {"MMQB_K", str(c.cols)},
                          {"MMQB_TYPE", str(static_cast<unsigned>(c.type))}, {"MMQB_PITCH", str(pitch)},
                          {"MMQB_GROUP_PITCH", str(gp)}, {"MMQB_TN", str(c.tn)},
                          {"MMQB_SPLITS", str(c.splits)},
                          {"MMQB_HAS_BIAS", c.bias ? "1" : "0"}}));
  }
  const std::vector<bool> forms = mmqbForms();
  std::vector<std::vector<Kernel>> k;  // [form][case]
  for (const bool wgmma : forms) k.push_back(compileMmqbForm(specs, wgmma));
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    CAPTURE(k[0][i].key);
    const unsigned n = static_cast<unsigned>(c.rows);
    const RandomWeight rw = makeRandomWeight(c.type, c.rows, c.cols, rng(), 0.5f);
    const BuiltPlane pw = alignedBlocksPlane(rw, c.padded);
    const int max_rows = static_cast<int>(c.tn);
    const HostQ8 hq = quantizeHost(activations(max_rows, static_cast<int>(c.cols)), max_rows, static_cast<int>(c.cols));
    const std::vector<float> bias_v = randomFloats(n, rng());
    const std::vector<float> want = cpuBlocksMatmul(rw, c.bias ? bias_v.data() : nullptr, hq.deq, max_rows);
    const std::vector<double> bound = f16MatmulBound(rw, hq.deq, max_rows);
    DeviceArray w = DeviceArray::of(pw.bytes), bias = DeviceArray::of(bias_v), xq = DeviceArray::of(hq.qs),
                xm = DeviceArray::of(hq.meta), got(static_cast<uint64_t>(max_rows) * n * 4),
                partial(std::max<uint64_t>(16, kern::mmqbPartialBytes(n, c.tn, c.splits))),
                counters = DeviceArray::of(std::vector<uint32_t>(kern::mmqbCounterBytes(n) / 4, 0));
    const kern::LaunchShape sh = kern::mmqbLaunchRule(n, static_cast<unsigned>(c.type), c.tn, c.splits, false).at(1);
    for (int tokens : {1, 9, max_rows / 2 + 3, max_rows}) {
      const size_t used = static_cast<size_t>(tokens) * n;
      std::vector<float> first;  // the mma.sync form's outputs: the warpgroup form's must be the same bits
      for (size_t f = 0; f < forms.size(); ++f)
        for (int rep = 0; rep < 2; ++rep) {  // the counters must be zero again for the second launch's sums
          CAPTURE(tokens);
          CAPTURE(rep);
          CAPTURE(k[f][i].key);
          got.poison();
          CUdeviceptr pw_ = w.ptr(), pb = c.bias ? bias.ptr() : 0, a = xq.ptr(), b = xm.ptr(), o = got.ptr(),
                      pp = c.splits > 1 ? partial.ptr() : 0, pc = counters.ptr();
          launch(k[f][i], sh, {&pw_, &pb, &a, &b, &o, &pp, &pc, &tokens});
          const std::vector<float> all = got.download<float>(static_cast<size_t>(max_rows) * n);
          checkWithinF16Bound(forms[f] ? "mmq_blocks, warpgroup form (fraction of the f16 bound)"
                                       : "mmq_blocks (fraction of the f16 bound)",
                              all, want, bound, used);
          if (f == 0 && rep == 0) first = all;
          else CHECK(std::memcmp(all.data(), first.data(), used * 4) == 0);
        }
    }
    const size_t words = kern::mmqbCounterBytes(n) / 4;
    CHECK(counters.download<uint32_t>(words) == std::vector<uint32_t>(words, 0));
  }
}

// minfer_mmq_blocks2 and minfer_mmq_blocks3 (mmq_blocks.cuh MMQB_SEGMENTS 2 and 3: gate and up, or q, k and v of one
// q8 input in one launch) against one minfer_mmq_blocks launch per matrix with the same constants and splits: every
// output bit for bit theirs (the same tiles, the same split order), and each within its f16 bound of the CPU
// (f16MatmulBound). Segments of mixed types (the Q4_K_M mix gives some layers a Q6_K v), row counts not multiples of
// the 128-row tile, biases on some, padded pitches; one split and several (the counters zero again after each launch:
// each runs twice); tiles of 16, 32 and 64 tokens at 1, 9, past half a tile and a full tile; nothing written past the
// call's rows. Both forms (mmqbForms), the fused launch against the alone launches of its own form; on Hopper the
// 64-token cases also with MMQB_F16ACT (the activations staged once by minfer_mmqb_f16_act, equal to the host's
// rounding, into the scratch that also holds the partials): every output bit for bit the q8 warpgroup form's.
TEST_CASE("mmq_blocks2 and mmq_blocks3: two or three matrices in one launch, bit for bit one mmq_blocks launch each") {
  MINFER_REQUIRE_GPU(G);
  struct Seg {
    GgmlType type;
    uint64_t rows;
    bool bias, padded;
  };
  struct Case {
    std::vector<Seg> seg;
    uint64_t cols;
    unsigned tn, splits;
  };
  const std::vector<Case> cases = {
      {{{GgmlType::Q4_K, 300, true, false}, {GgmlType::Q4_K, 130, true, true}, {GgmlType::Q6_K, 100, true, false}}, 768, 32, 3},
      {{{GgmlType::Q4_K, 3584, true, false}, {GgmlType::Q4_K, 512, true, false}, {GgmlType::Q6_K, 512, true, true}}, 3584, 16, 7},
      {{{GgmlType::Q6_K, 7, false, true}, {GgmlType::Q6_K, 200, false, false}, {GgmlType::Q4_K, 129, true, false}}, 512, 32, 1},
      {{{GgmlType::Q4_K, 1000, false, false}, {GgmlType::Q4_K, 256, false, true}, {GgmlType::Q4_K, 256, false, false}}, 2048, 16, 8},
      {{{GgmlType::Q4_K, 3584, true, false}, {GgmlType::Q4_K, 512, true, false}, {GgmlType::Q6_K, 512, true, false}}, 3584, 64, 7},
      {{{GgmlType::Q6_K, 50, false, false}, {GgmlType::Q4_K, 333, true, true}, {GgmlType::Q6_K, 64, true, false}}, 1024, 64, 2},
      // gate and up: equal rows and types as in a model, and odd ones
      {{{GgmlType::Q4_K, 1300, false, false}, {GgmlType::Q4_K, 1300, false, true}}, 1536, 32, 2},
      {{{GgmlType::Q4_K, 2000, false, false}, {GgmlType::Q6_K, 2000, false, false}}, 1024, 64, 2},
      {{{GgmlType::Q6_K, 77, true, true}, {GgmlType::Q4_K, 260, false, false}}, 768, 16, 3},
      {{{GgmlType::Q4_K, 640, false, false}, {GgmlType::Q4_K, 640, false, false}}, 512, 64, 1}};
  std::vector<codegen::KernelSpec> specs;
  std::vector<size_t> first;  // per case: its index in specs (the alone kernels, then the fused one)
  for (const Case& c : cases) {
    const std::string segs = str(c.seg.size());
    std::vector<std::pair<std::string, std::string>> defs = {
        {"MMQB_SEGMENTS", segs}, {"MMQB_K", str(c.cols)}, {"MMQB_TN", str(c.tn)}, {"MMQB_SPLITS", str(c.splits)}};
    std::string key = "mmq_blocks" + segs + "_test_k" + str(c.cols) + "_tn" + str(c.tn) + "_s" + str(c.splits);
    first.push_back(specs.size());
    for (size_t j = 0; j < c.seg.size(); ++j) {
      const Seg& g = c.seg[j];
      const uint32_t gp = static_cast<uint32_t>(alignUp(ggmlTypeTraits(g.type).type_size, 16));
      const uint64_t pitch = c.cols / 256 * gp + (g.padded ? 32 : 0);
      const std::string x = j == 0 ? "" : str(j);
      for (const auto& d : std::vector<std::pair<std::string, std::string>>{
               {"MMQB_N" + x, str(g.rows)}, {"MMQB_TYPE" + x, str(static_cast<unsigned>(g.type))},
               {"MMQB_PITCH" + x, str(pitch)}, {"MMQB_GROUP_PITCH" + x, str(gp)}, {"MMQB_HAS_BIAS" + x, g.bias ? "1" : "0"}})
        defs.push_back(d);
      key += "_" + codegen::typeTag(static_cast<uint32_t>(g.type)) + "n" + str(g.rows) + (g.bias ? "b" : "") +
             (g.padded ? "p" : "");
      specs.push_back(spec(key + "_alone" + str(j), "kernels/mmq_blocks.cuh", "minfer_mmq_blocks",
                           {{"MMQB_N", str(g.rows)}, {"MMQB_K", str(c.cols)}, {"MMQB_TYPE", str(static_cast<unsigned>(g.type))},
                            {"MMQB_PITCH", str(pitch)}, {"MMQB_GROUP_PITCH", str(gp)}, {"MMQB_TN", str(c.tn)},
                            {"MMQB_SPLITS", str(c.splits)}, {"MMQB_HAS_BIAS", g.bias ? "1" : "0"}}));
    }
    const char* entry = c.seg.size() == 2 ? "minfer_mmq_blocks2" : "minfer_mmq_blocks3";
    specs.push_back(spec(key, "kernels/mmq_blocks.cuh", entry, defs));
  }
  for (const bool wgmma : mmqbForms()) {
    std::vector<Kernel> k = compileMmqbForm(specs, wgmma);
    // The warpgroup form's 64-token cases also run MMQB_F16ACT (the codegen's form for them): each fused kernel
    // (f16) with its activations staged by minfer_mmqb_f16_act (act) into the scratch that holds its partials.
    std::vector<codegen::KernelSpec> act_specs, f16_specs;
    std::vector<size_t> f16_at(cases.size(), SIZE_MAX);  // case → its kernels' index in act and f16
    for (size_t i = 0; wgmma && i < cases.size(); ++i) {
      if (!kern::mmqbWarpgroupTile(cases[i].tn)) continue;
      const std::string k_cols = str(cases[i].cols);
      f16_at[i] = f16_specs.size();
      act_specs.push_back(spec("mmqb_f16_act_test_k" + k_cols, "kernels/mmq_blocks.cuh", "minfer_mmqb_f16_act",
                               {{"MMQB_ACT_K", k_cols}}));
      codegen::KernelSpec f = specs[first[i] + cases[i].seg.size()];
      f.key += "_f16";
      f.defines.emplace_back("MMQB_F16ACT", "1");
      f16_specs.push_back(std::move(f));
    }
    const std::vector<Kernel> act = act_specs.empty() ? std::vector<Kernel>{} : compile(act_specs);
    const std::vector<Kernel> f16 = f16_specs.empty() ? std::vector<Kernel>{} : compileMmqbForm(f16_specs, true);
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const size_t segs = c.seg.size();
      const unsigned nseg = static_cast<unsigned>(segs);
      const Kernel& fused = k[first[i] + segs];
      CAPTURE(fused.key);
      const int max_rows = static_cast<int>(c.tn);
      const HostQ8 hq = quantizeHost(activations(max_rows, static_cast<int>(c.cols)), max_rows, static_cast<int>(c.cols));
      DeviceArray xq = DeviceArray::of(hq.qs), xm = DeviceArray::of(hq.meta);
      std::vector<unsigned> n(segs), type(segs);
      std::vector<RandomWeight> rw;
      std::vector<DeviceArray> w, bias, got, alone;
      std::vector<std::vector<float>> want;
      std::vector<std::vector<double>> bound;
      for (size_t j = 0; j < segs; ++j) {
        const Seg& g = c.seg[j];
        n[j] = static_cast<unsigned>(g.rows);
        type[j] = static_cast<unsigned>(g.type);
        rw.push_back(makeRandomWeight(g.type, g.rows, c.cols, rng(), 0.5f));
        const std::vector<float> bias_v = randomFloats(n[j], rng());
        w.push_back(DeviceArray::of(alignedBlocksPlane(rw.back(), g.padded).bytes));
        bias.push_back(DeviceArray::of(bias_v));
        got.emplace_back(static_cast<uint64_t>(max_rows) * n[j] * 4);
        alone.emplace_back(static_cast<uint64_t>(max_rows) * n[j] * 4);
        want.push_back(cpuBlocksMatmul(rw.back(), g.bias ? bias_v.data() : nullptr, hq.deq, max_rows));
        bound.push_back(f16MatmulBound(rw.back(), hq.deq, max_rows));
      }
      DeviceArray partial(std::max<uint64_t>(16, kern::mmqbFusedPartialBytes(n.data(), nseg, c.tn, c.splits))),
          counters = DeviceArray::of(std::vector<uint32_t>(kern::mmqbFusedCounterBytes(n.data(), nseg) / 4, 0));
      std::vector<DeviceArray> alone_partial, alone_counters;
      for (size_t j = 0; j < segs; ++j) {
        alone_partial.emplace_back(std::max<uint64_t>(16, kern::mmqbPartialBytes(n[j], c.tn, c.splits)));
        alone_counters.push_back(DeviceArray::of(std::vector<uint32_t>(kern::mmqbCounterBytes(n[j]) / 4, 0)));
      }
      const kern::LaunchShape sh = kern::mmqbFusedLaunchRule(n.data(), type.data(), nseg, c.tn, c.splits, false).at(1);
      CHECK(sh.grid.x == kern::mmqbFusedTiles(n.data(), nseg));
      // MMQB_F16ACT: the activations at byte 0 of the scratch, the partials after them; the activations as the host
      // rounds them (the q8 form's per-stage conversion: round_to_f16(q · round_to_f16(d)), mmqbF16ActOrder).
      DeviceArray scratch(kern::mmqbF16ScratchBytes(c.tn, static_cast<unsigned>(c.cols),
                                                    kern::mmqbFusedPartialBytes(n.data(), nseg, c.tn, c.splits)));
      std::vector<uint16_t> x16(hq.qs.size());
      for (size_t e = 0; e < x16.size(); ++e) {
        const size_t q = e / 16 * 16 + kern::mmqbF16ActOrder(static_cast<unsigned>(e % 16));
        x16[e] = floatToHalf(static_cast<float>(hq.qs[q]) * roundHalf(hq.meta[q / 32].d));
      }
      for (int tokens : {1, 9, max_rows / 2 + 3, max_rows}) {
        for (int rep = 0; rep < 2; ++rep) {  // the counters must be zero again for the second launch's sums
          CAPTURE(tokens);
          CAPTURE(rep);
          std::vector<CUdeviceptr> pw(segs), pb(segs), po(segs);
          for (size_t j = 0; j < segs; ++j) {
            got[j].poison();
            alone[j].poison();
            pw[j] = w[j].ptr();
            pb[j] = c.seg[j].bias ? bias[j].ptr() : 0;
            po[j] = got[j].ptr();
          }
          CUdeviceptr a = xq.ptr(), b = xm.ptr(), pp = c.splits > 1 ? partial.ptr() : 0, pc = counters.ptr();
          std::vector<void*> args;  // the kernel's order: w0, bias0, …, xq, xmeta, out0 …, partial, counters, n_tokens
          for (size_t j = 0; j < segs; ++j) args.insert(args.end(), {&pw[j], &pb[j]});
          args.insert(args.end(), {&a, &b});
          for (size_t j = 0; j < segs; ++j) args.push_back(&po[j]);
          args.insert(args.end(), {&pp, &pc, &tokens});
          launch(fused, sh, args);
          for (size_t j = 0; j < segs; ++j) {
            CAPTURE(j);
            CUdeviceptr o = alone[j].ptr(), ap = c.splits > 1 ? alone_partial[j].ptr() : 0, ac = alone_counters[j].ptr();
            launch(k[first[i] + j], kern::mmqbLaunchRule(n[j], type[j], c.tn, c.splits, false).at(1),
                   {&pw[j], &pb[j], &a, &b, &o, &ap, &ac, &tokens});
            const std::vector<float> all = got[j].download<float>(static_cast<size_t>(max_rows) * n[j]);
            const std::vector<float> ref = alone[j].download<float>(static_cast<size_t>(max_rows) * n[j]);
            const size_t used = static_cast<size_t>(tokens) * n[j];
            CHECK(std::memcmp(all.data(), ref.data(), used * 4) == 0);
            checkWithinF16Bound("mmq_blocks2/3 (fraction of the f16 bound)", all, want[j], bound[j], used);
          }
          if (f16_at[i] == SIZE_MAX) continue;
          // MMQB_F16ACT: the staged activations equal the host's (and nothing is staged past the call's rows), and
          // every output the q8 form's (alone[j]) bit for bit.
          scratch.poison();
          for (size_t j = 0; j < segs; ++j) got[j].poison();
          CUdeviceptr ps = scratch.ptr(), pnull = 0, psplit = c.splits > 1 ? scratch.ptr() : 0;
          launch(act[f16_at[i]], kern::mmqbF16ActLaunchRule(static_cast<unsigned>(c.cols)).at(tokens),
                 {&a, &b, &ps, &tokens});
          const size_t halves = static_cast<size_t>(tokens) * c.cols;
          CHECK(scratch.download<uint16_t>(halves) == std::vector<uint16_t>(x16.begin(), x16.begin() + halves));
          const size_t words = kern::mmqbF16PartialOffset(c.tn, static_cast<unsigned>(c.cols)) / 4;
          const std::vector<uint32_t> staged = scratch.download<uint32_t>(words);
          CHECK(std::count(staged.begin() + halves / 2, staged.end(), 0x7FC00000u) ==
                static_cast<std::ptrdiff_t>(words - halves / 2));
          std::vector<void*> args16;  // as above, with xq the scratch, xmeta null and partial the scratch
          for (size_t j = 0; j < segs; ++j) args16.insert(args16.end(), {&pw[j], &pb[j]});
          args16.insert(args16.end(), {&ps, &pnull});
          for (size_t j = 0; j < segs; ++j) args16.push_back(&po[j]);
          args16.insert(args16.end(), {&psplit, &pc, &tokens});
          launch(f16[f16_at[i]], kern::mmqbFusedLaunchRule(n.data(), type.data(), nseg, c.tn, c.splits, true).at(1),
                 args16);
          for (size_t j = 0; j < segs; ++j) {
            CAPTURE(j);
            const size_t all_rows = static_cast<size_t>(max_rows) * n[j];
            const std::vector<float> all = got[j].download<float>(all_rows);
            const std::vector<float> ref = alone[j].download<float>(all_rows);
            CHECK(std::memcmp(all.data(), ref.data(), all_rows * 4) == 0);  // poison past the rows in both
          }
        }
      }
      const size_t words = kern::mmqbFusedCounterBytes(n.data(), nseg) / 4;
      CHECK(counters.download<uint32_t>(words) == std::vector<uint32_t>(words, 0));
    }
  }
}

}  // namespace
}  // namespace minfer::test::gpu
