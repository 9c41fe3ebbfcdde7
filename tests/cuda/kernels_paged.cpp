// GPU parity (test_cuda_kernels): the paged (batched) kernels, kernels/paged_attention.cuh, and the fused head-norm
// RoPE (+ KV store) launches.
#include <doctest/doctest.h>

#include "kernels/attention.cuh"
#include "kernels/paged_attention.cuh"
#include "kernels/rms_norm.cuh"
#include "kernels/rope.cuh"
#include "tests/cuda/kernel_test_support.h"

namespace minfer::test::gpu {
namespace {

// ---------------------------------------------------------------------------------------------
// Paged (batched) kernels, kernels/paged_attention.cuh: rows of several sequences, each at its own position
// with its own block table into a pool of KV blocks scattered in shuffled order, against cpu::rope /
// cpu::kvStore / cpu::attention with a paged cpu::KvRows over the same slots.

constexpr double kPagedRopeTol = 1e-6;  // minfer_rope's rotation at per-row positions (same double θ, no FMA)
constexpr double kPagedAttnTol = 2e-5;  // online vs two-pass softmax in f32 over the same f16 K/V (as kAttnTol)

// A step of several sequences over a paged pool: per sequence its length before the step and its new rows;
// the pool's blocks handed out in a shuffled order (so no table is contiguous and blocks of different
// sequences interleave); the rows of the step in a shuffled order too (the kernels must not assume rows of
// one sequence are adjacent or sorted).
struct PagedStep {
  int block_size = 0, n_ctx = 0, n_blocks = 0;
  std::vector<int> len, add;                  // per sequence
  std::vector<std::vector<int32_t>> tables;   // per sequence: pool blocks of its positions 0, bs, 2·bs, …
  std::vector<int32_t> row_seq, row_pos;      // per row
  std::vector<int32_t> words;                 // BlockTables: rows' table indices, then the tables
  std::vector<const int32_t*> row_table;      // per row, for cpu::KvRows
  int rows() const { return static_cast<int>(row_seq.size()); }
  int64_t slots() const { return int64_t{n_blocks} * block_size; }
  cpu::KvRows kvRows() const { return {row_pos.data(), row_table.data(), block_size, n_ctx}; }
};

std::string joined(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

PagedStep pagedStep(int block_size, std::vector<int> len, std::vector<int> add, int spare_blocks) {
  PagedStep s;
  s.block_size = block_size;
  s.len = std::move(len);
  s.add = std::move(add);
  int need = 0;
  for (size_t i = 0; i < s.len.size(); ++i) {
    s.n_ctx = std::max(s.n_ctx, s.len[i] + s.add[i]);
    need += (s.len[i] + s.add[i] + block_size - 1) / block_size;
  }
  s.n_blocks = need + spare_blocks;
  std::vector<int32_t> pool(static_cast<size_t>(s.n_blocks));
  for (int b = 0; b < s.n_blocks; ++b) pool[static_cast<size_t>(b)] = b;
  std::shuffle(pool.begin(), pool.end(), rng());
  size_t next = 0;
  // Blocks are taken round-robin across sequences, one at a time, as a scheduler growing them step by step would.
  s.tables.resize(s.len.size());
  for (bool more = true; more;) {
    more = false;
    for (size_t i = 0; i < s.len.size(); ++i)
      if (static_cast<int>(s.tables[i].size()) * block_size < s.len[i] + s.add[i]) {
        s.tables[i].push_back(pool[next++]);
        more = true;
      }
  }
  for (size_t i = 0; i < s.len.size(); ++i)
    for (int j = 0; j < s.add[i]; ++j) {
      s.row_seq.push_back(static_cast<int32_t>(i));
      s.row_pos.push_back(s.len[i] + j);
    }
  std::vector<size_t> order(s.row_seq.size());
  for (size_t r = 0; r < order.size(); ++r) order[r] = r;
  std::shuffle(order.begin(), order.end(), rng());
  std::vector<int32_t> seq(order.size()), pos(order.size());
  for (size_t r = 0; r < order.size(); ++r) seq[r] = s.row_seq[order[r]], pos[r] = s.row_pos[order[r]];
  s.row_seq = seq;
  s.row_pos = pos;
  s.words.assign(static_cast<size_t>(s.rows()), 0);
  std::vector<int32_t> at(s.len.size());
  for (size_t i = 0; i < s.len.size(); ++i) {
    at[i] = static_cast<int32_t>(s.words.size());
    s.words.insert(s.words.end(), s.tables[i].begin(), s.tables[i].end());
  }
  for (int r = 0; r < s.rows(); ++r) {
    s.words[static_cast<size_t>(r)] = at[static_cast<size_t>(s.row_seq[static_cast<size_t>(r)])];
    s.row_table.push_back(s.tables[static_cast<size_t>(s.row_seq[static_cast<size_t>(r)])].data());
  }
  return s;
}

// Step shapes: block sizes 1 (a table entry per position), 16 and 64 (a block larger than some sequences);
// lengths 0, 1, odd, crossing blocks; a decode row beside prompt chunks; 1 to 5 sequences.
struct PagedShape {
  int block_size;
  std::vector<int> len, add;
};
const PagedShape kPagedShapes[] = {
    {16, {0, 37, 130, 5}, {1, 19, 1, 70}},  // mixed: a first token, a prompt continuation, decode rows
    {1, {0, 3}, {7, 1}},
    {64, {200, 0, 63, 64, 9}, {1, 33, 1, 1, 1}},
    {16, {511}, {1}},                       // one sequence, one decode row deep into its context
    {4, {0, 0, 0}, {1, 1, 1}},              // three first tokens
};

TEST_CASE("rope_paged: per-row positions of several sequences vs cpu::rope, norm and neox, factors, YaRN") {
  MINFER_REQUIRE_GPU(G);
  const int h = 10, hkv = 2, d = 64;
  struct Case {
    bool neox;
    int n_rot;
    float scale;
    bool ff;
    float ext_factor;
  };
  const Case cases[] = {{false, 64, 1.0f, false, 0.0f}, {true, 48, 0.5f, true, 0.0f}, {true, 64, 0.25f, false, 1.0f}};
  std::vector<codegen::KernelSpec> specs;
  std::vector<kern::RopeYarn> yarns;
  for (const Case& c : cases) {
    const kern::RopeYarn y = kern::ropeYarn(c.n_rot, 10000.0f, c.scale, c.ext_factor, 1.0f, 32.0f, 1.0f, 4096);
    yarns.push_back(y);
    std::vector<std::pair<std::string, std::string>> defs = {
        {"PA_ROPE", "1"}, {"PA_NHEAD", str(h)}, {"PA_NHEAD_KV", str(hkv)}, {"PA_HEAD_DIM", str(d)}};
    const auto rot = ropeDefines(c.n_rot, c.neox, 10000.0f, c.scale, c.ff, y);
    defs.insert(defs.end(), rot.begin(), rot.end());
    specs.push_back(spec("rope_paged_test_" + str(specs.size()), "kernels/paged_attention.cuh", "minfer_rope_paged", defs,
                         {"--fmad=false"}));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t ci = 0; ci < std::size(cases); ++ci)
    for (const PagedShape& shape : kPagedShapes) {
      CAPTURE(ci);
      CAPTURE(shape.block_size);
      const Case& c = cases[ci];
      const PagedStep st = pagedStep(shape.block_size, shape.len, shape.add, 0);
      int n = st.rows();
      std::vector<float> ff(static_cast<size_t>(c.n_rot / 2));
      for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 0.25f * static_cast<float>(i % 9);
      std::vector<float> q = activations(n, h * d), kk = activations(n, hkv * d);
      DeviceArray d_q = DeviceArray::of(q), d_k = DeviceArray::of(kk), d_pos = DeviceArray::of(st.row_pos), d_ff = DeviceArray::of(ff);
      CUdeviceptr a = d_q.ptr(), b = d_k.ptr(), f = c.ff ? d_ff.ptr() : CUdeviceptr{0}, p = d_pos.ptr();
      launch(k[ci], kern::ropeLaunch(n, h, hkv), {&a, &b, &f, &p, &n});
      const cpu::RopeStyle style = c.neox ? cpu::RopeStyle::kNeox : cpu::RopeStyle::kNorm;
      const float* ffp = c.ff ? ff.data() : nullptr;
      cpu::rope(q.data(), n, h, d, c.n_rot, style, 10000.0f, c.scale, st.row_pos.data(), ffp, yarns[ci]);
      cpu::rope(kk.data(), n, hkv, d, c.n_rot, style, 10000.0f, c.scale, st.row_pos.data(), ffp, yarns[ci]);
      const std::vector<float> gq = d_q.download<float>(q.size()), gk = d_k.download<float>(kk.size());
      CHECK_MESSAGE(track("rope_paged", relError(gq.data(), q.data(), q.size())) <= kPagedRopeTol,
                    "q rows, positions " << joined(st.row_pos));
      CHECK_MESSAGE(track("rope_paged", relError(gk.data(), kk.data(), kk.size())) <= kPagedRopeTol, "k rows");
    }
}

// minfer_head_norm_rope (kernels/rope.cuh ROPE_NORM_EPS: the HeadRmsNorm of q, the HeadRmsNorm of k and their
// Rope as one launch, ops/fusion.cpp) against those steps' own kernels as the codegen compiles them:
// minfer_head_rms_norm twice (default flags) and minfer_rope (--fmad=false), q and k bit for bit; with
// ROPE_ROW_POSITIONS, minfer_rope_paged at per-row positions (the batch session's launch). Also within the
// CPU's tolerances of cpu::headRmsNorm then cpu::rope, so a shared mistake cannot pass. Shapes: qwen3-30b's
// (32/4 heads of 128), gemma3-like 256-wide heads with linear scaling, partial rotation in norm and NeoX style,
// frequency factors, YaRN with its cos/sin scale, head sizes 80 and 64 that are not whole 4-head blocks;
// 1 to 513 tokens (minfer_rope's groups of 8 heads from 64 on), positions from 0 and from 1000.
TEST_CASE("head_norm_rope: fused q/k HeadRmsNorm and RoPE, bit-identical to head_rms_norm ×2 + rope (and rope_paged)") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    int h, hkv, d, n_rot;
    bool neox;
    float base, scale;
    bool ff;
    float ext_factor;
  };
  const Case cases[] = {{32, 4, 128, 128, true, 1000000.0f, 1.0f, false, 0.0f},
                        {8, 4, 256, 256, true, 10000.0f, 0.125f, false, 0.0f},
                        {10, 2, 64, 32, false, 500000.0f, 1.0f, true, 0.0f},
                        {6, 2, 80, 48, true, 10000.0f, 0.25f, false, 1.0f},
                        {3, 2, 64, 64, false, 10000.0f, 0.5f, true, 0.0f}};
  constexpr float kEps = 1e-6f;
  constexpr size_t kPerCase = 6;  // fused, fused paged, head_rms_norm q, head_rms_norm k, rope, rope_paged
  std::vector<codegen::KernelSpec> specs;
  std::vector<kern::RopeYarn> yarns;
  for (size_t ci = 0; ci < std::size(cases); ++ci) {
    const Case& c = cases[ci];
    const kern::RopeYarn y = kern::ropeYarn(c.n_rot, c.base, c.scale, c.ext_factor, 1.0f, 32.0f, 1.0f, 4096);
    yarns.push_back(y);
    const auto rot = ropeDefines(c.n_rot, c.neox, c.base, c.scale, c.ff, y);
    const std::string tag = "_" + str(ci);
    auto heads = [&](const char* prefix) {
      std::vector<std::pair<std::string, std::string>> d = {{std::string(prefix) + "NHEAD", str(c.h)},
                                                            {std::string(prefix) + "NHEAD_KV", str(c.hkv)},
                                                            {std::string(prefix) + "HEAD_DIM", str(c.d)}};
      d.insert(d.end(), rot.begin(), rot.end());
      return d;
    };
    auto fused = heads("ROPE_");
    fused.push_back({"ROPE_NORM_EPS", codegen::floatLiteral(kEps)});
    specs.push_back(spec("head_norm_rope_test" + tag, "kernels/rope.cuh", "minfer_head_norm_rope", fused, {"--fmad=false"}));
    fused.push_back({"ROPE_ROW_POSITIONS", "1"});
    specs.push_back(
        spec("head_norm_rope_paged_test" + tag, "kernels/rope.cuh", "minfer_head_norm_rope", fused, {"--fmad=false"}));
    for (int n_head : {c.h, c.hkv})
      specs.push_back(spec("head_norm_rope_test_hrms" + tag + "_h" + str(n_head), "kernels/rms_norm.cuh",
                           "minfer_head_rms_norm",
                           {{"HRMS_NHEAD", str(n_head)}, {"HRMS_HEAD_DIM", str(c.d)}, {"HRMS_EPS", codegen::floatLiteral(kEps)}}));
    specs.push_back(spec("head_norm_rope_test_rope" + tag, "kernels/rope.cuh", "minfer_rope", heads("ROPE_"), {"--fmad=false"}));
    auto paged = heads("PA_");
    paged.push_back({"PA_ROPE", "1"});
    specs.push_back(spec("head_norm_rope_test_rope_paged" + tag, "kernels/paged_attention.cuh", "minfer_rope_paged", paged,
                         {"--fmad=false"}));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t ci = 0; ci < std::size(cases); ++ci) {
    const Case& c = cases[ci];
    const Kernel* kk = &k[kPerCase * ci];
    CAPTURE(kk[0].key);
    const std::vector<float> wq = randomFloats(c.d, rng(), 0.5f, 1.5f), wk = randomFloats(c.d, rng(), 0.5f, 1.5f);
    std::vector<float> ff(static_cast<size_t>(c.n_rot / 2));
    for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 0.25f * static_cast<float>(i % 9);
    DeviceArray d_wq = DeviceArray::of(wq), d_wk = DeviceArray::of(wk), d_ff = DeviceArray::of(ff);
    CUdeviceptr pwq = d_wq.ptr(), pwk = d_wk.ptr(), f = c.ff ? d_ff.ptr() : CUdeviceptr{0};
    const cpu::RopeStyle style = c.neox ? cpu::RopeStyle::kNeox : cpu::RopeStyle::kNorm;
    // Rows at positions `pos` (pos0 + t, or one per row): the unfused launches on one copy, the fused on another.
    auto run = [&](int n, const std::vector<int32_t>& pos, bool rows) {
      const std::vector<float> q = activations(n, c.h * c.d), kv = activations(n, c.hkv * c.d);
      DeviceArray rq = DeviceArray::of(q), rk = DeviceArray::of(kv), gq = DeviceArray::of(q), gk = DeviceArray::of(kv),
                  d_pos = DeviceArray::of(rows ? pos : std::vector<int32_t>{pos[0]});
      CUdeviceptr a = rq.ptr(), b = rk.ptr(), ga = gq.ptr(), gb = gk.ptr(), p = d_pos.ptr();
      launch(kk[2], kern::headRmsNormLaunch(n, c.h), {&a, &pwq, &n});
      launch(kk[3], kern::headRmsNormLaunch(n, c.hkv), {&b, &pwk, &n});
      launch(kk[rows ? 5 : 4], kern::ropeLaunch(n, c.h, c.hkv), {&a, &b, &f, &p, &n});
      launch(kk[rows ? 1 : 0], kern::headNormRopeLaunch(n, c.h, c.hkv), {&ga, &gb, &pwq, &pwk, &f, &p, &n});
      const std::vector<float> ref_q = rq.download<float>(q.size()), ref_k = rk.download<float>(kv.size()),
                               got_q = gq.download<float>(q.size()), got_k = gk.download<float>(kv.size());
      CHECK_MESSAGE(std::memcmp(ref_q.data(), got_q.data(), q.size() * 4) == 0, "q");
      CHECK_MESSAGE(std::memcmp(ref_k.data(), got_k.data(), kv.size() * 4) == 0, "k");
      std::vector<float> cq = q, ck = kv;
      cpu::headRmsNorm(cq.data(), wq.data(), n, c.h, c.d, kEps);
      cpu::headRmsNorm(ck.data(), wk.data(), n, c.hkv, c.d, kEps);
      const float* ffp = c.ff ? ff.data() : nullptr;
      cpu::rope(cq.data(), n, c.h, c.d, c.n_rot, style, c.base, c.scale, pos.data(), ffp, yarns[ci]);
      cpu::rope(ck.data(), n, c.hkv, c.d, c.n_rot, style, c.base, c.scale, pos.data(), ffp, yarns[ci]);
      // The norm's tolerance then an exact-θ rotation of the normalized values (kRopeTol): their sum bounds it.
      CHECK(track("head_norm_rope", relError(got_q.data(), cq.data(), cq.size())) <= kRmsNormTol + kRopeTol);
      CHECK(track("head_norm_rope", relError(got_k.data(), ck.data(), ck.size())) <= kRmsNormTol + kRopeTol);
    };
    for (int pos0 : {0, 1000})
      for (int n : {1, 7, 33, 64, 513}) {
        CAPTURE(pos0);
        CAPTURE(n);
        run(n, positions(pos0, n), false);
      }
    for (const PagedShape& shape : kPagedShapes) {
      CAPTURE(shape.block_size);
      const PagedStep st = pagedStep(shape.block_size, shape.len, shape.add, 0);
      run(st.rows(), st.row_pos, true);
    }
  }
}

// minfer_head_norm_rope_kv (rope.cuh ROPE_KV_STORE: the decode plan's HeadRmsNorm q, HeadRmsNorm k, Rope and the
// Attention's KV store in one launch) against the unfused kernels as the codegen compiles them: minfer_head_rms_norm
// twice, minfer_rope (--fmad=false) and minfer_kv_store (ATT_KV_RING with a ring). q and k bit-identical, and the
// whole K and V caches bit-identical (both poisoned first: the rows of the positions as kv_store wrote them, no
// other row touched). Decode (one token) and 7 tokens (the kernel takes n_tokens as minfer_head_norm_rope does), at
// positions 0 and 1000 (a ring wraps there), GQA groups 8, 2, 5, 1, head sizes 64, 80, 128, 256, partial rotation,
// norm and NeoX style, frequency factors and YaRN, rings of 7 and 9 slots.
TEST_CASE("head_norm_rope_kv: fused q/k HeadRmsNorm, RoPE and KV store, bit-identical to head_rms_norm ×2 + rope + kv_store") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    int h, hkv, d, n_rot;
    bool neox;
    float base, scale;
    bool ff;
    float ext_factor;
    int ring;  // 0: a cache of every position
  };
  const Case cases[] = {{32, 4, 128, 128, true, 1000000.0f, 1.0f, false, 0.0f, 0},
                        {8, 4, 256, 256, true, 10000.0f, 0.125f, false, 0.0f, 9},
                        {10, 2, 64, 32, false, 500000.0f, 1.0f, true, 0.0f, 0},
                        {10, 2, 80, 48, true, 10000.0f, 0.25f, false, 1.0f, 7},
                        {3, 3, 64, 64, false, 10000.0f, 0.5f, true, 0.0f, 0}};
  constexpr float kEps = 1e-6f;
  constexpr size_t kPerCase = 5;  // fused, head_rms_norm q, head_rms_norm k, rope, kv_store
  std::vector<codegen::KernelSpec> specs;
  for (size_t ci = 0; ci < std::size(cases); ++ci) {
    const Case& c = cases[ci];
    const kern::RopeYarn y = kern::ropeYarn(c.n_rot, c.base, c.scale, c.ext_factor, 1.0f, 32.0f, 1.0f, 4096);
    auto rot = ropeDefines(c.n_rot, c.neox, c.base, c.scale, c.ff, y);
    rot.insert(rot.begin(), {{"ROPE_NHEAD", str(c.h)}, {"ROPE_NHEAD_KV", str(c.hkv)}, {"ROPE_HEAD_DIM", str(c.d)}});
    const std::string tag = "_" + str(ci);
    auto fused = rot;
    fused.insert(fused.end(), {{"ROPE_NORM_EPS", codegen::floatLiteral(kEps)}, {"ROPE_KV_STORE", "1"}});
    if (c.ring) fused.push_back({"ROPE_KV_RING", str(c.ring)});
    specs.push_back(spec("head_norm_rope_kv_test" + tag, "kernels/rope.cuh", "minfer_head_norm_rope_kv", fused, {"--fmad=false"}));
    for (int n_head : {c.h, c.hkv})
      specs.push_back(spec("head_norm_rope_kv_test_hrms" + tag + "_h" + str(n_head), "kernels/rms_norm.cuh",
                           "minfer_head_rms_norm",
                           {{"HRMS_NHEAD", str(n_head)}, {"HRMS_HEAD_DIM", str(c.d)}, {"HRMS_EPS", codegen::floatLiteral(kEps)}}));
    specs.push_back(spec("head_norm_rope_kv_test_rope" + tag, "kernels/rope.cuh", "minfer_rope", rot, {"--fmad=false"}));
    std::vector<std::pair<std::string, std::string>> store = {
        {"ATT_NHEAD", str(c.h)}, {"ATT_NHEAD_KV", str(c.hkv)}, {"ATT_HEAD_DIM", str(c.d)}, {"ATT_KV_STORE", "1"}};
    if (c.ring) store.push_back({"ATT_KV_RING", str(c.ring)});
    specs.push_back(spec("head_norm_rope_kv_test_store" + tag, "kernels/attention.cuh", "minfer_kv_store", store));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t ci = 0; ci < std::size(cases); ++ci) {
    const Case& c = cases[ci];
    const Kernel* kk = &k[kPerCase * ci];
    CAPTURE(kk[0].key);
    const std::vector<float> wq = randomFloats(c.d, rng(), 0.5f, 1.5f), wk = randomFloats(c.d, rng(), 0.5f, 1.5f);
    std::vector<float> ff(static_cast<size_t>(c.n_rot / 2));
    for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 0.25f * static_cast<float>(i % 9);
    DeviceArray d_wq = DeviceArray::of(wq), d_wk = DeviceArray::of(wk), d_ff = DeviceArray::of(ff);
    CUdeviceptr pwq = d_wq.ptr(), pwk = d_wk.ptr(), f = c.ff ? d_ff.ptr() : CUdeviceptr{0};
    const uint64_t kv_w = static_cast<uint64_t>(c.hkv) * c.d;
    for (int pos0 : {0, 1000})
      for (int n : {1, 7}) {
        CAPTURE(pos0);
        CAPTURE(n);
        const uint64_t slots = c.ring ? static_cast<uint64_t>(c.ring) : static_cast<uint64_t>(pos0 + n + 3);
        const std::vector<float> q = activations(n, c.h * c.d), kv = activations(n, c.hkv * c.d),
                                 v = activations(n, c.hkv * c.d);
        DeviceArray rq = DeviceArray::of(q), rk = DeviceArray::of(kv), gq = DeviceArray::of(q), gk = DeviceArray::of(kv),
                    dv = DeviceArray::of(v), d_pos = DeviceArray::of(std::vector<int32_t>{pos0}), rkc(slots * kv_w * 2),
                    rvc(slots * kv_w * 2), gkc(slots * kv_w * 2), gvc(slots * kv_w * 2);
        for (DeviceArray* a : {&rkc, &rvc, &gkc, &gvc}) a->poison();
        CUdeviceptr a = rq.ptr(), b = rk.ptr(), ga = gq.ptr(), gb = gk.ptr(), pv = dv.ptr(), p = d_pos.ptr(),
                    prk = rkc.ptr(), prv = rvc.ptr(), pgk = gkc.ptr(), pgv = gvc.ptr();
        launch(kk[1], kern::headRmsNormLaunch(n, c.h), {&a, &pwq, &n});
        launch(kk[2], kern::headRmsNormLaunch(n, c.hkv), {&b, &pwk, &n});
        launch(kk[3], kern::ropeLaunch(n, c.h, c.hkv), {&a, &b, &f, &p, &n});
        launch(kk[4], kern::kvStoreLaunch(n, c.hkv, c.d), {&b, &pv, &prk, &prv, &p, &n});
        launch(kk[0], kern::headNormRopeLaunch(n, c.h, c.hkv), {&ga, &gb, &pv, &pwq, &pwk, &f, &pgk, &pgv, &p, &n});
        const std::vector<float> ref_q = rq.download<float>(q.size()), ref_k = rk.download<float>(kv.size()),
                                 got_q = gq.download<float>(q.size()), got_k = gk.download<float>(kv.size());
        CHECK_MESSAGE(std::memcmp(ref_q.data(), got_q.data(), q.size() * 4) == 0, "q");
        CHECK_MESSAGE(std::memcmp(ref_k.data(), got_k.data(), kv.size() * 4) == 0, "k");
        CHECK(gkc.download<uint16_t>(slots * kv_w) == rkc.download<uint16_t>(slots * kv_w));
        CHECK(gvc.download<uint16_t>(slots * kv_w) == rvc.download<uint16_t>(slots * kv_w));
        CHECK(dv.download<float>(v.size()) == v);  // v is read only
      }
  }
}

TEST_CASE("kv_store_paged and attn_paged: scattered blocks, mixed prefill and decode rows, GQA, odd head sizes") {
  MINFER_REQUIRE_GPU(G);
  struct Heads {
    int h, hkv, d;
  };
  // GQA groups 1, 3, 4, 5, 8, 12, 16 and 32; the tensor-core form (pagedAttnUsesMma: heads of 32, 64, 80, 96 and 128,
  // groups up to 16), the SIMT form in blocks of 8 warps (heads of 36: strided lanes; 160: contiguous 2-byte loads;
  // 5 of 256) and of 4 (8 heads of 256, and a group of 32 heads of 64: their partials would not fit in 8 warps'
  // shared memory; pagedAttnWarps); in each form one case each of a query scale + soft-cap, a sliding window, and
  // q as a column view of wider rows.
  struct Case {
    Heads heads;
    float scale = 0, softcap = 0;
    int window = 0;
    int q_extra = 0;  // floats of other columns after q in each row (ATT_Q_PITCH = h·d + q_extra)
  };
  const Case cases[] = {{{6, 2, 32}}, {{6, 2, 36}}, {{8, 2, 64}}, {{4, 4, 80}}, {{6, 2, 96}}, {{32, 8, 128}},
                        {{32, 2, 64}}, {{24, 2, 128}},  // groups of 16 and 12: the m16 tile's rows 8 … 15
                        {{32, 1, 64}}, {{6, 2, 160}}, {{5, 1, 256}}, {{16, 2, 256}},
                        {{6, 2, 64}, 0.0625f, 3.0f, 0, 0}, {{6, 2, 64}, 0, 0, 7, 0}, {{6, 2, 80}, 0, 0, 40, 0},
                        {{6, 2, 64}, 0, 0, 0, 2 * 2 * 64}, {{6, 2, 36}, 0.0625f, 3.0f, 0, 0}, {{6, 2, 36}, 0, 0, 7, 0},
                        {{6, 2, 36}, 0, 0, 0, 2 * 2 * 36}};
  for (const Case& c : cases) {
    const int h = c.heads.h, hkv = c.heads.hkv, d = c.heads.d, kvw = hkv * d, q_pitch = h * d + c.q_extra;
    CAPTURE(h);
    CAPTURE(hkv);
    CAPTURE(d);
    CAPTURE(c.window);
    CAPTURE(c.softcap);
    CAPTURE(q_pitch);
    std::vector<std::pair<std::string, std::string>> heads = {
        {"ATT_NHEAD", str(h)}, {"ATT_NHEAD_KV", str(hkv)}, {"ATT_HEAD_DIM", str(d)}};
    auto defs = [&](const char* which, std::vector<std::pair<std::string, std::string>> extra) {
      auto out = heads;
      out.push_back({which, "1"});
      out.insert(out.end(), extra.begin(), extra.end());
      return out;
    };
    std::vector<std::pair<std::string, std::string>> opts;
    if (c.scale != 0) opts.push_back({"ATT_SCALE", codegen::floatLiteral(c.scale)});
    if (c.softcap != 0) opts.push_back({"ATT_SOFTCAP", codegen::floatLiteral(c.softcap)});
    if (c.window != 0) opts.push_back({"ATT_WINDOW", str(c.window)});
    if (c.q_extra != 0) opts.push_back({"ATT_Q_PITCH", str(q_pitch)});
    const std::string tag = "_h" + str(h) + "_hkv" + str(hkv) + "_d" + str(d) + "_w" + str(c.window) + "_qp" + str(q_pitch) +
                            (c.softcap != 0 ? "_cap" : "");
    // With whole blocks of 32 per head, also the form with the decode plan's QuantizeAct fused in (PA_Q8).
    const bool q8 = d % 32 == 0;
    std::vector<codegen::KernelSpec> specs = {
        spec("kv_store_paged_test" + tag, "kernels/paged_attention.cuh", "minfer_kv_store_paged", defs("PA_KV_STORE", {})),
        spec("attn_paged_test" + tag, "kernels/paged_attention.cuh", "minfer_attn_paged", defs("PA_ATTN", opts))};
    if (q8) {
      auto q8_opts = opts;
      q8_opts.push_back({"PA_Q8", "1"});
      specs.push_back(spec("attn_paged_q8_test" + tag, "kernels/paged_attention.cuh", "minfer_attn_paged",
                           defs("PA_ATTN", q8_opts)));
    }
    std::vector<Kernel> k = compile(specs);
    for (const PagedShape& shape : kPagedShapes) {
      CAPTURE(shape.block_size);
      const PagedStep st = pagedStep(shape.block_size, shape.len, shape.add, 3);
      int n = st.rows(), bs = st.block_size;
      const std::string positions_text = joined(st.row_pos);
      CAPTURE(positions_text);
      // The pool: every slot random f16 (also the spare blocks and the slots the step overwrites), the CPU
      // copy the same values as f32.
      const size_t pool_elems = static_cast<size_t>(st.slots()) * kvw;
      std::vector<uint16_t> kh(pool_elems), vh(pool_elems);
      const std::vector<float> kr = randomFloats(pool_elems, rng()), vr = randomFloats(pool_elems, rng());
      std::vector<float> ck(pool_elems), cv(pool_elems);
      for (size_t i = 0; i < pool_elems; ++i) {
        kh[i] = floatToHalf(kr[i]);
        vh[i] = floatToHalf(vr[i]);
        ck[i] = halfToFloat(kh[i]);
        cv[i] = halfToFloat(vh[i]);
      }
      DeviceArray kc = DeviceArray::of(kh), vc = DeviceArray::of(vh);
      cpu::KvLayer layer{ck.data(), cv.data(), st.slots(), hkv, d};
      // The step's K and V rows into the pool, then attention of every row over its own sequence.
      const std::vector<float> kk = activations(n, kvw), vv = activations(n, kvw), q = activations(n, q_pitch);
      DeviceArray d_k = DeviceArray::of(kk), d_v = DeviceArray::of(vv), d_q = DeviceArray::of(q);
      DeviceArray d_pos = DeviceArray::of(st.row_pos), d_tab = DeviceArray::of(st.words);
      DeviceArray out(static_cast<uint64_t>(n) * h * d * 4);
      out.poison();
      CUdeviceptr a = d_k.ptr(), b = d_v.ptr(), kp = kc.ptr(), vp = vc.ptr(), p = d_pos.ptr(), t = d_tab.ptr();
      CUdeviceptr qp = d_q.ptr(), o = out.ptr();
      launch(k[0], kern::pagedKvStoreLaunchRule(hkv, d).at(n), {&a, &b, &kp, &vp, &p, &t, &bs, &n});
      launch(k[1], kern::pagedAttnLaunchRule(h, hkv, d).at(n), {&qp, &kp, &vp, &o, &p, &t, &bs, &n});
      std::vector<float> kround(kk.size()), vround(vv.size());
      for (size_t i = 0; i < kk.size(); ++i) kround[i] = roundHalf(kk[i]), vround[i] = roundHalf(vv[i]);
      cpu::kvStore(layer, kround.data(), vround.data(), n, st.kvRows());
      // The whole pool bit for bit: the step's slots hold the f16 of its rows, every other slot is untouched.
      const std::vector<uint16_t> gk = kc.download<uint16_t>(pool_elems), gv = vc.download<uint16_t>(pool_elems);
      size_t bad = 0, first_bad = SIZE_MAX;
      for (size_t i = 0; i < pool_elems; ++i)
        if (gk[i] != floatToHalf(ck[i]) || gv[i] != floatToHalf(cv[i])) {
          ++bad;
          first_bad = std::min(first_bad, i);
        }
      CHECK_MESSAGE(bad == 0, bad << " pool values differ, first at slot " << (first_bad / kvw) << " element "
                                  << (first_bad % kvw) << " (block " << (first_bad / kvw / bs) << ")");
      std::vector<float> ref(static_cast<size_t>(n) * h * d), scratch(static_cast<size_t>(st.n_ctx));
      cpu::attention(q.data(), layer, n, st.kvRows(), h, ref.data(), nullptr, scratch.data(),
                     {.scale = c.scale, .softcap = c.softcap, .window = c.window}, q_pitch);
      const std::vector<float> got = out.download<float>(ref.size());
      const bool mma = kern::pagedAttnUsesMma(h, hkv, d);
      const double err = track(mma ? "attn_paged (tensor cores)" : "attn_paged", relError(got.data(), ref.data(), ref.size()));
      // On failure: the worst row, its sequence and position (a wrong table or slot shows as whole rows off).
      int worst_row = 0;
      double worst = -1;
      for (int r = 0; r < n; ++r) {
        const size_t off = static_cast<size_t>(r) * h * d;
        const double e = relError(got.data() + off, ref.data() + off, static_cast<size_t>(h) * d);
        if (e > worst) worst = e, worst_row = r;
      }
      // The tensor-core form (pagedAttnUsesMma) rounds Q and P to f16, as the tensor-core decode: its tolerance.
      const double tol = mma ? attnMmaTol(d) : kPagedAttnTol;
      CHECK_MESSAGE(err <= tol, "worst row " << worst_row << " (sequence " << st.row_seq[static_cast<size_t>(worst_row)]
                                                        << ", position " << st.row_pos[static_cast<size_t>(worst_row)]
                                                        << ") rel error " << worst);
      if (q8) {  // rows bit-identical to the plain form's (same pool: the store already ran), q8 = quantize_act's
        const int w = h * d;
        DeviceArray out8(static_cast<uint64_t>(n) * w * 4), qs(static_cast<uint64_t>(n) * w),
            meta(static_cast<uint64_t>(n) * w / 32 * sizeof(kern::Q8Meta));
        out8.poison();
        qs.poison();
        meta.poison();
        CUdeviceptr o8 = out8.ptr(), pq = qs.ptr(), pm = meta.ptr();
        launch(k[2], kern::pagedAttnLaunchRule(h, hkv, d).at(n), {&qp, &kp, &vp, &o8, &pq, &pm, &p, &t, &bs, &n});
        checkFusedQ8(out, out8, qs, meta, n, w);
      }
    }
  }
}

}  // namespace
}  // namespace minfer::test::gpu
