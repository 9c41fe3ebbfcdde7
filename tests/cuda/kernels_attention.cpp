// GPU parity (test_cuda_kernels): RoPE, the KV store and attention (prefill and decode, column views, soft-capping,
// windows, ring caches, long prompts).
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <limits>

#include "kernels/attention.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/rope.cuh"
#include "tests/cuda/kernel_test_support.h"

namespace minfer::test::gpu {
namespace {

TEST_CASE("rope: norm and neox, full and partial rotation, scaled positions, frequency factors, YaRN") {
  MINFER_REQUIRE_GPU(G);
  struct Case {
    bool neox;
    int n_rot;
    float base, scale;
    bool ff;  // ROPE_FREQ_FACTORS: per-pair divisors of θ (Llama 3.1 rope_freqs)
    float ext_factor = 0, attn_factor = 1;  // YaRN (kernels/rope.cuh ropeYarn): ext 0 = none
    unsigned n_ctx_orig = 0;
  };
  const Case cases[] = {{false, 64, 10000.0f, 1.0f, false}, {true, 64, 1000000.0f, 1.0f, false},
                        {false, 32, 10000.0f, 0.25f, false}, {true, 48, 500000.0f, 0.5f, false},
                        {false, 64, 500000.0f, 1.0f, true},  {true, 48, 10000.0f, 0.5f, true},
                        // YaRN x4 (ramp over pairs 10..23), x8 with factors and attn_factor, scale alone
                        {false, 64, 10000.0f, 0.25f, false, 1.0f, 1.0f, 4096},
                        {true, 64, 500000.0f, 0.125f, true, 1.0f, 0.9f, 8192},
                        {true, 48, 1000000.0f, 0.25f, false, 1.0f, 1.0f, 32768},
                        {false, 64, 10000.0f, 1.0f, false, 0.0f, 2.0f, 0}};
  constexpr size_t kCases = sizeof(cases) / sizeof(cases[0]);
  const int h = 10, hkv = 2, d = 64;  // 12 heads: from 64 tokens on, groups of 8 (the second partial)
  std::vector<codegen::KernelSpec> specs;
  std::vector<kern::RopeYarn> yarns;
  for (size_t ci = 0; ci < kCases; ++ci) {
    const Case& c = cases[ci];
    const kern::RopeYarn y = kern::ropeYarn(c.n_rot, c.base, c.scale, c.ext_factor, c.attn_factor, 32.0f, 1.0f,
                                            c.n_ctx_orig);
    yarns.push_back(y);
    std::vector<std::pair<std::string, std::string>> defs = {
        {"ROPE_NHEAD", str(h)}, {"ROPE_NHEAD_KV", str(hkv)}, {"ROPE_HEAD_DIM", str(d)}};
    const auto rot = ropeDefines(c.n_rot, c.neox, c.base, c.scale, c.ff, y);
    defs.insert(defs.end(), rot.begin(), rot.end());
    specs.push_back(spec(std::string("rope_test_") + str(ci) + (c.neox ? "_neox" : "_norm") + str(c.n_rot) +
                             (c.ff ? "_ff" : ""),
                         "kernels/rope.cuh", "minfer_rope", defs, {"--fmad=false"}));
  }
  std::vector<Kernel> k = compile(specs);
  for (size_t ci = 0; ci < kCases; ++ci)
    for (int pos0 : {0, 1000})
      for (int n : kTokenCounts) {
        CAPTURE(ci);
        CAPTURE(pos0);
        CAPTURE(n);
        const Case& c = cases[ci];
        // Llama 3.1's profile over n_rot/2 pairs: 1 for the fast pairs, a ramp, then 8.
        std::vector<float> ff(c.n_rot / 2);
        for (int i = 0; i < c.n_rot / 2; ++i) {
          const float v = 1.0f + 0.7f * static_cast<float>(i - c.n_rot / 4);
          ff[i] = v < 1.0f ? 1.0f : v > 8.0f ? 8.0f : v;
        }
        std::vector<float> q = activations(n, h * d), kk = activations(n, hkv * d);
        DeviceArray d_q = DeviceArray::of(q), d_k = DeviceArray::of(kk), d_pos = DeviceArray::of(std::vector<int32_t>{pos0});
        DeviceArray d_ff = DeviceArray::of(ff);
        CUdeviceptr a = d_q.ptr(), b = d_k.ptr(), f = c.ff ? d_ff.ptr() : CUdeviceptr{0}, p = d_pos.ptr();
        launch(k[ci], kern::ropeLaunch(n, h, hkv), {&a, &b, &f, &p, &n});
        const cpu::RopeStyle style = c.neox ? cpu::RopeStyle::kNeox : cpu::RopeStyle::kNorm;
        const float* ffp = c.ff ? ff.data() : nullptr;
        cpu::rope(q.data(), n, h, d, c.n_rot, style, c.base, c.scale, positions(pos0, n).data(), ffp, yarns[ci]);
        cpu::rope(kk.data(), n, hkv, d, c.n_rot, style, c.base, c.scale, positions(pos0, n).data(), ffp, yarns[ci]);
        std::vector<float> gq = d_q.download<float>(q.size()), gk = d_k.download<float>(kk.size());
        CHECK(track("rope", relError(gq.data(), q.data(), q.size())) <= kRopeTol);
        CHECK(track("rope", relError(gk.data(), kk.data(), kk.size())) <= kRopeTol);
      }
}

TEST_CASE("attention: kv_store, prefill (tiled) and decode (split-KV) vs the CPU over the same f16 values") {
  MINFER_REQUIRE_GPU(G);
  const int h = 6, hkv = 2, n_ctx = 1200;
  // Prefill: 8, 36 SIMT; 16 … 128 tensor cores with Q fragments in registers (112: an odd number of k16 steps);
  // 144, 256 tensor cores with Q rows in shared memory and 32-key tiles (144: odd k16 steps there too).
  // Decode: 16 … 128 tensor cores (attnDecodeUsesMma; 112: odd k16 steps); SIMT at 256 (contiguous vector
  // loads), 8, 36, 144 (strided lanes).
  for (int d : {8, 16, 32, 36, 64, 80, 96, 112, 128, 144, 256}) {
    CAPTURE(d);
    auto att = [&](const char* name, const char* which) {
      std::vector<std::pair<std::string, std::string>> defs = {
          {"ATT_NHEAD", str(h)}, {"ATT_NHEAD_KV", str(hkv)}, {"ATT_HEAD_DIM", str(d)}, {which, "1"}};
      if (std::string(which) == "ATT_DECODE" || std::string(which) == "ATT_COMBINE") defs.push_back({"ATT_SPLITS", "32"});
      return spec(std::string(name) + "_test_d" + str(d), "kernels/attention.cuh", name, defs);
    };
    // Decode also with 4 splits: at 600 and 1,199 keys each split takes several key tiles of the tensor-core form.
    auto att4 = [&](const char* name, const char* which) {
      return spec(std::string(name) + "_test_s4_d" + str(d), "kernels/attention.cuh", name,
                  {{"ATT_NHEAD", str(h)}, {"ATT_NHEAD_KV", str(hkv)}, {"ATT_HEAD_DIM", str(d)}, {which, "1"},
                   {"ATT_SPLITS", "4"}});
    };
    // The combine's general form alone (ATT_COMBINE_BATCH 0), against which the short-context form is bit for bit.
    codegen::KernelSpec general = att("minfer_attn_combine", "ATT_COMBINE");
    general.key += "_general";
    general.defines.push_back({"ATT_COMBINE_BATCH", "0"});
    std::vector<Kernel> k = compile({att("minfer_kv_store", "ATT_KV_STORE"), att("minfer_attn_prefill", "ATT_PREFILL"),
                                     att("minfer_attn_decode", "ATT_DECODE"), att("minfer_attn_combine", "ATT_COMBINE"),
                                     att4("minfer_attn_decode", "ATT_DECODE"), att4("minfer_attn_combine", "ATT_COMBINE"),
                                     general});
    const bool decode_mma = kern::attnDecodeUsesMma(static_cast<unsigned>(d), h / hkv);
    const double decode_tol = decode_mma ? attnMmaTol(d) : kAttnTol;
    const int kvw = hkv * d;
    DeviceArray kc(static_cast<uint64_t>(n_ctx) * kvw * 2), vc(static_cast<uint64_t>(n_ctx) * kvw * 2);
    DeviceArray out(kMaxBatch * h * d * 4), part(kern::attnDecodePartFloats(h, d, 32) * 4);
    std::vector<float> ck(static_cast<size_t>(n_ctx) * kvw), cv(ck.size());  // CPU cache (f16-rounded values)
    cpu::KvLayer layer{ck.data(), cv.data(), n_ctx, hkv, d};

    // Fills positions [0, pos0) of both caches with random keys/values (device: their f16 bits).
    auto prefix = [&](int pos0) {
      std::vector<uint16_t> kh(static_cast<size_t>(pos0) * kvw), vh(kh.size());
      const std::vector<float> kr = activations(std::max(pos0, 1), kvw), vr = activations(std::max(pos0, 1), kvw);
      for (size_t i = 0; i < kh.size(); ++i) {
        kh[i] = floatToHalf(kr[i]);
        vh[i] = floatToHalf(vr[i]);
        ck[i] = halfToFloat(kh[i]);
        cv[i] = halfToFloat(vh[i]);
      }
      if (pos0 > 0) {
        kc.upload(kh.data(), kh.size() * 2);
        vc.upload(vh.data(), vh.size() * 2);
      }
    };
    auto store = [&](const std::vector<float>& kk, const std::vector<float>& vv, int n, int pos0) {
      DeviceArray d_k = DeviceArray::of(kk), d_v = DeviceArray::of(vv), d_pos = DeviceArray::of(std::vector<int32_t>{pos0});
      CUdeviceptr a = d_k.ptr(), b = d_v.ptr(), c = kc.ptr(), e = vc.ptr(), p = d_pos.ptr();
      launch(k[0], kern::kvStoreLaunch(n, hkv, d), {&a, &b, &c, &e, &p, &n});
      std::vector<float> kr(kk.size()), vr(vv.size());
      for (size_t i = 0; i < kk.size(); ++i) {
        kr[i] = roundHalf(kk[i]);
        vr[i] = roundHalf(vv[i]);
      }
      cpu::kvStore(layer, kr.data(), vr.data(), n, cpu::KvRowStorage(n).contiguous(pos0, n, int(layer.n_ctx)));
      // The device cache holds exactly the f16 bits of the stored rows, at positions pos0 … pos0+n−1.
      const std::vector<uint16_t> got = kc.download<uint16_t>(static_cast<size_t>(n) * kvw, static_cast<uint64_t>(pos0) * kvw * 2);
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != floatToHalf(kk[i]);
      CHECK(bad == 0);
    };
    std::vector<float> scratch(n_ctx);
    for (int pos0 : {0, 37})
      for (int n : kTokenCounts) {
        CAPTURE(pos0);
        CAPTURE(n);
        prefix(pos0);
        const std::vector<float> q = activations(n, h * d), kk = activations(n, kvw), vv = activations(n, kvw);
        store(kk, vv, n, pos0);
        DeviceArray d_q = DeviceArray::of(q), d_pos = DeviceArray::of(std::vector<int32_t>{pos0});
        out.poison();
        CUdeviceptr a = d_q.ptr(), c = kc.ptr(), e = vc.ptr(), o = out.ptr(), p = d_pos.ptr();
        launch(k[1], kern::attnPrefillLaunch(n, h, d), {&a, &c, &e, &o, &p, &n});
        std::vector<float> got = out.download<float>(q.size()), ref(q.size());
        cpu::attention(q.data(), layer, n, cpu::KvRowStorage(n).contiguous(pos0, n, int(layer.n_ctx)), h, ref.data(), nullptr, scratch.data());
        const double err = relError(got.data(), ref.data(), ref.size());
        if (kern::attnPrefillUsesMma(static_cast<unsigned>(d)))
          CHECK(track("attn_prefill (tensor cores)", err) <= attnMmaTol(d));
        else
          CHECK(track("attn_prefill", err) <= kAttnTol);
      }
    for (int pos0 : {0, 1, 31, 33, 600, 1199}) {
      CAPTURE(pos0);
      prefix(pos0);
      const std::vector<float> q = activations(1, h * d), kk = activations(1, kvw), vv = activations(1, kvw);
      store(kk, vv, 1, pos0);
      DeviceArray d_q = DeviceArray::of(q), d_pos = DeviceArray::of(std::vector<int32_t>{pos0});
      out.poison();
      part.poison();
      CUdeviceptr a = d_q.ptr(), c = kc.ptr(), e = vc.ptr(), o = out.ptr(), p = d_pos.ptr(), pt = part.ptr();
      launch(k[2], kern::attnDecodeLaunch(hkv, 32, d, h / hkv), {&a, &c, &e, &pt, &p});
      launch(k[3], kern::attnCombineLaunch(h), {&pt, &o, &p});
      std::vector<float> got = out.download<float>(q.size()), ref(q.size());
      cpu::attention(q.data(), layer, 1, cpu::KvRowStorage(1).contiguous(pos0, 1, int(layer.n_ctx)), h, ref.data(), nullptr, scratch.data());
      CHECK(track(decode_mma ? "attn_decode (tensor cores)" : "attn_decode", relError(got.data(), ref.data(), ref.size())) <=
            decode_tol);
      out.poison();
      launch(k[6], kern::attnCombineLaunch(h), {&pt, &o, &p});
      const std::vector<float> general_out = out.download<float>(q.size());
      CHECK(std::memcmp(general_out.data(), got.data(), got.size() * 4) == 0);
      out.poison();
      launch(k[4], kern::attnDecodeLaunch(hkv, 4, d, h / hkv), {&a, &c, &e, &pt, &p});
      launch(k[5], kern::attnCombineLaunch(h), {&pt, &o, &p});
      got = out.download<float>(q.size());
      CHECK(track(decode_mma ? "attn_decode (tensor cores)" : "attn_decode", relError(got.data(), ref.data(), ref.size())) <=
            decode_tol);
    }
  }
}

// Column views (format 1.4, phi3): one fused q|k|v row and one gate|up row per token, read in place with
// the row pitch constants the codegen sets (ops/rope.cpp, attention.cpp, elementwise.cpp), against the
// CPU reference on the same views (cpu::rope / kvStore / attention take the pitch, cpu::swiGlu one row
// at a time). Tolerances: each family's own.
TEST_CASE("column views: rope, kv_store, prefill attention and swiglu on rows wider than their operands") {
  MINFER_REQUIRE_GPU(G);
  const int h = 3, hkv = 1, d = 64, qw = h * d, kvw = hkv * d, pitch = qw + 2 * kvw, n_ctx = 600;
  const float base = 10000.0f;
  auto att = [&](const char* name, const char* which, std::vector<std::pair<std::string, std::string>> extra) {
    std::vector<std::pair<std::string, std::string>> defs = {
        {"ATT_NHEAD", str(h)}, {"ATT_NHEAD_KV", str(hkv)}, {"ATT_HEAD_DIM", str(d)}, {which, "1"}};
    defs.insert(defs.end(), extra.begin(), extra.end());
    return spec(std::string(name) + "_view_test", "kernels/attention.cuh", name, defs);
  };
  const int widths[] = {20, 172};  // 20: not float4-aligned at column 20 (EW_VEC4 0); 172: vec4
  std::vector<codegen::KernelSpec> specs = {
      spec("rope_view_test", "kernels/rope.cuh", "minfer_rope",
           {{"ROPE_NHEAD", str(h)}, {"ROPE_NHEAD_KV", str(hkv)}, {"ROPE_HEAD_DIM", str(d)}, {"ROPE_NROT", str(d)},
            {"ROPE_NEOX", "1"}, {"ROPE_BASE", codegen::floatLiteral(base)}, {"ROPE_SCALE", codegen::floatLiteral(1.0f)},
            {"ROPE_FREQ_FACTORS", "0"}, {"ROPE_Q_PITCH", str(pitch)}, {"ROPE_K_PITCH", str(pitch)}},
           {"--fmad=false"}),
      att("minfer_kv_store", "ATT_KV_STORE", {{"ATT_K_PITCH", str(pitch)}, {"ATT_V_PITCH", str(pitch)}}),
      att("minfer_attn_prefill", "ATT_PREFILL", {{"ATT_Q_PITCH", str(pitch)}})};
  for (int w : widths)
    specs.push_back(spec("swiglu_view_test_w" + str(w), "kernels/elementwise.cuh", "minfer_swiglu",
                         {{"EW_WIDTH", str(w)}, {"EW_OP", "1"}, {"EW_A_PITCH", str(2 * w)}, {"EW_B_PITCH", str(2 * w)},
                          {"EW_OUT_PITCH", str(w)}, {"EW_VEC4", w % 4 == 0 ? "1" : "0"}}));
  std::vector<Kernel> k = compile(specs);
  DeviceArray kc(static_cast<uint64_t>(n_ctx) * kvw * 2), vc(static_cast<uint64_t>(n_ctx) * kvw * 2);
  std::vector<float> ck(static_cast<size_t>(n_ctx) * kvw), cv(ck.size()), scratch(n_ctx);
  cpu::KvLayer layer{ck.data(), cv.data(), n_ctx, hkv, d};
  for (int n : kTokenCounts) {
    CAPTURE(n);
    const int pos0 = 0;
    std::vector<float> qkv = activations(n, pitch);
    DeviceArray d_qkv = DeviceArray::of(qkv), d_pos = DeviceArray::of(std::vector<int32_t>{pos0});
    CUdeviceptr q = d_qkv.ptr(), kp = q + qw * 4, vp = q + (qw + kvw) * 4, none = 0, p = d_pos.ptr();
    launch(k[0], kern::ropeLaunch(n, h, hkv), {&q, &kp, &none, &p, &n});
    cpu::rope(qkv.data(), n, h, d, d, cpu::RopeStyle::kNeox, base, 1.0f, positions(pos0, n).data(), nullptr, {}, pitch);
    cpu::rope(qkv.data() + qw, n, hkv, d, d, cpu::RopeStyle::kNeox, base, 1.0f, positions(pos0, n).data(), nullptr, {}, pitch);
    const std::vector<float> got = d_qkv.download<float>(qkv.size());
    CHECK(track("rope", relError(got.data(), qkv.data(), qkv.size())) <= kRopeTol);  // v columns untouched too
    // K and V rows from the rotated buffer into the cache; the CPU stores the same f16-rounded values.
    CUdeviceptr c = kc.ptr(), e = vc.ptr();
    launch(k[1], kern::kvStoreLaunch(n, hkv, d), {&kp, &vp, &c, &e, &p, &n});
    std::vector<float> rounded(got.begin(), got.end());
    for (int t = 0; t < n; ++t)
      for (int i = qw; i < pitch; ++i) rounded[static_cast<size_t>(t) * pitch + i] = roundHalf(got[static_cast<size_t>(t) * pitch + i]);
    cpu::kvStore(layer, rounded.data() + qw, rounded.data() + qw + kvw, n, cpu::KvRowStorage(n).contiguous(pos0, n, int(layer.n_ctx)), pitch, pitch);
    // Both caches, bit for bit: K from columns qw.., V from columns qw + kvw.. (a swapped or wrong pitch
    // or offset shows in either).
    const std::vector<uint16_t> kbits = kc.download<uint16_t>(static_cast<size_t>(n) * kvw);
    const std::vector<uint16_t> vbits = vc.download<uint16_t>(static_cast<size_t>(n) * kvw);
    size_t bad = 0;
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < kvw; ++i) {
        bad += kbits[static_cast<size_t>(t) * kvw + i] != floatToHalf(got[static_cast<size_t>(t) * pitch + qw + i]);
        bad += vbits[static_cast<size_t>(t) * kvw + i] != floatToHalf(got[static_cast<size_t>(t) * pitch + qw + kvw + i]);
      }
    CHECK(bad == 0);
    DeviceArray out(static_cast<uint64_t>(n) * qw * 4);
    out.poison();
    CUdeviceptr o = out.ptr();
    launch(k[2], kern::attnPrefillLaunch(n, h, d), {&q, &c, &e, &o, &p, &n});
    std::vector<float> ref(static_cast<size_t>(n) * qw);
    cpu::attention(got.data(), layer, n, cpu::KvRowStorage(n).contiguous(pos0, n, int(layer.n_ctx)), h, ref.data(), nullptr, scratch.data(), {}, pitch);
    const std::vector<float> att_got = out.download<float>(ref.size());
    CHECK(track("attn_prefill (tensor cores)", relError(att_got.data(), ref.data(), ref.size())) <= attnMmaTol(d));
    for (size_t wi = 0; wi < 2; ++wi) {
      const int w = widths[wi];
      CAPTURE(w);
      const std::vector<float> gu = activations(n, 2 * w);
      DeviceArray d_gu = DeviceArray::of(gu), d_out(static_cast<uint64_t>(n) * w * 4);
      d_out.poison();
      CUdeviceptr a = d_gu.ptr(), b = a + static_cast<CUdeviceptr>(w) * 4, po = d_out.ptr();
      launch(k[3 + wi], kern::elementwiseLaunch(n, w), {&a, &b, &po, &n});
      std::vector<float> sref(static_cast<size_t>(n) * w);
      for (int t = 0; t < n; ++t)
        cpu::swiGlu(gu.data() + static_cast<size_t>(t) * 2 * w, gu.data() + static_cast<size_t>(t) * 2 * w + w, w,
                    sref.data() + static_cast<size_t>(t) * w);
      const std::vector<float> sg = d_out.download<float>(sref.size());
      CHECK(track("swiglu", relError(sg.data(), sref.data(), sref.size())) <= kSwiGluTol);
    }
  }
}

TEST_CASE("attention with query scale, soft-capping and a sliding window (gemma2) vs the CPU") {
  MINFER_REQUIRE_GPU(G);
  // Odd shapes: 5 query heads over 1 kv head; head sizes for both prefill forms (64, 128: tensor cores, Q in
  // registers; 256: tensor cores, Q in shared memory, gemma2/gemma3's head; 72: SIMT); windows shorter and
  // longer than a key tile; the query scale and cap of gemma2.
  const int h = 5, hkv = 1, n_ctx = 1300;
  const float q_scale = 0.0625f, cap = 3.0f;
  for (int d : {64, 72, 128, 256})
    for (int window : {16, 100}) {
      CAPTURE(d);
      CAPTURE(window);
      auto att = [&](const char* name, const char* which) {
        std::vector<std::pair<std::string, std::string>> defs = {
            {"ATT_NHEAD", str(h)},        {"ATT_NHEAD_KV", str(hkv)}, {"ATT_HEAD_DIM", str(d)},
            {"ATT_SCALE", "0.0625f"},     {"ATT_SOFTCAP", "3.0f"},    {"ATT_WINDOW", str(window)},
            {which, "1"}};
        if (std::string(which) == "ATT_DECODE" || std::string(which) == "ATT_COMBINE") defs.push_back({"ATT_SPLITS", "32"});
        return spec(std::string(name) + "_gemma_test_d" + str(d) + "_w" + str(window), "kernels/attention.cuh", name,
                    defs);
      };
      std::vector<Kernel> k = compile({att("minfer_attn_prefill", "ATT_PREFILL"), att("minfer_attn_decode", "ATT_DECODE"),
                                       att("minfer_attn_combine", "ATT_COMBINE")});
      const int kvw = hkv * d;
      // The whole cache random (f16 values on both sides); positions past a query are never read.
      F16Kv kv = randomF16Kv(n_ctx, kvw);
      std::vector<float>&ck = kv.ck, &cv = kv.cv;
      DeviceArray kc = DeviceArray::of(kv.kh), vc = DeviceArray::of(kv.vh);
      DeviceArray out(kMaxBatch * h * d * 4), part(kern::attnDecodePartFloats(h, d, 32) * 4);
      cpu::KvLayer layer{ck.data(), cv.data(), n_ctx, hkv, d};
      const cpu::AttentionOptions options{.scale = q_scale, .softcap = cap, .window = window};
      std::vector<float> scratch(n_ctx);
      for (int pos0 : {0, 37, 700})
        for (int n : {1, 7, 33, 200, 513}) {
          if (pos0 + n > n_ctx) continue;
          CAPTURE(pos0);
          CAPTURE(n);
          // Queries 4× larger than unit scale so that the cap bends the scores.
          std::vector<float> q = activations(n, h * d);
          for (float& v : q) v *= 4.0f;
          DeviceArray d_q = DeviceArray::of(q), d_pos = DeviceArray::of(std::vector<int32_t>{pos0});
          out.poison();
          CUdeviceptr a = d_q.ptr(), c = kc.ptr(), e = vc.ptr(), o = out.ptr(), p = d_pos.ptr();
          launch(k[0], kern::attnPrefillLaunch(n, h, d), {&a, &c, &e, &o, &p, &n});
          std::vector<float> got = out.download<float>(q.size()), ref(q.size());
          cpu::attention(q.data(), layer, n, cpu::KvRowStorage(n).contiguous(pos0, n, int(layer.n_ctx)), h, ref.data(), nullptr, scratch.data(), options);
          const double err = relError(got.data(), ref.data(), ref.size());
          if (kern::attnPrefillUsesMma(static_cast<unsigned>(d)))
            CHECK(track("attn_prefill softcap+window (tensor cores)", err) <= attnMmaTol(d));
          else
            CHECK(track("attn_prefill softcap+window", err) <= kAttnTol);
        }
      for (int pos0 : {0, 1, 15, 16, 17, 99, 100, 101, 600, 1299}) {
        CAPTURE(pos0);
        std::vector<float> q = activations(1, h * d);
        for (float& v : q) v *= 4.0f;
        DeviceArray d_q = DeviceArray::of(q), d_pos = DeviceArray::of(std::vector<int32_t>{pos0});
        out.poison();
        part.poison();
        CUdeviceptr a = d_q.ptr(), c = kc.ptr(), e = vc.ptr(), o = out.ptr(), p = d_pos.ptr(), pt = part.ptr();
        launch(k[1], kern::attnDecodeLaunch(hkv, 32, d, h / hkv), {&a, &c, &e, &pt, &p});
        launch(k[2], kern::attnCombineLaunch(h), {&pt, &o, &p});
        std::vector<float> got = out.download<float>(q.size()), ref(q.size());
        cpu::attention(q.data(), layer, 1, cpu::KvRowStorage(1).contiguous(pos0, 1, int(layer.n_ctx)), h, ref.data(), nullptr, scratch.data(), options);
        if (kern::attnDecodeUsesMma(static_cast<unsigned>(d), h / hkv))
          CHECK(track("attn_decode softcap+window (tensor cores)", relError(got.data(), ref.data(), ref.size())) <=
                attnMmaTol(d));
        else
          CHECK(track("attn_decode softcap+window", relError(got.data(), ref.data(), ref.size())) <= kAttnTol);
      }
    }
}

// A sliding-window layer's ring cache (ATT_KV_RING = R = window + B − 1, schema Step.kv_ring): a sequence
// several rings long goes through kv_store, prefill and decode in chunks of up to B tokens at growing pos0,
// on the GPU into R f16 slots and on the CPU into a ring KvLayer of the same f16-rounded values. After every
// chunk: both rings bit for bit (the store's slot p % R), and the chunk's attention against cpu::attention on
// the CPU ring (whose bit-identity with a full-size cache tests/e2e/test_swa_ring.cpp shows), with the same
// tolerances as the full-size cache. B up to 200 with window 100 makes a tensor-core prefill tile of 64 keys
// wrap inside the ring; head 256 with window 40 and B 70 a tile of 32 keys (the form with Q in shared memory).
TEST_CASE("attention over a ring KV cache (ATT_KV_RING): kv_store slots, prefill and decode vs the CPU's ring") {
  MINFER_REQUIRE_GPU(G);
  const int h = 4, hkv = 2;
  const float q_scale = 0.125f, cap = 3.0f;
  struct RingCase {
    int d, window, batch;
  };
  for (const RingCase rc : {RingCase{64, 16, 4}, RingCase{64, 16, 64}, RingCase{128, 100, 200}, RingCase{72, 16, 7},
                            RingCase{256, 5, 1}, RingCase{256, 40, 70}, RingCase{64, 3, 2}}) {
    const int d = rc.d, window = rc.window, batch = rc.batch, ring = window + batch - 1, kvw = hkv * d;
    CAPTURE(d);
    CAPTURE(window);
    CAPTURE(batch);
    CAPTURE(ring);
    auto att = [&](const char* name, const char* which) {
      std::vector<std::pair<std::string, std::string>> defs = {
          {"ATT_NHEAD", str(h)}, {"ATT_NHEAD_KV", str(hkv)}, {"ATT_HEAD_DIM", str(d)}, {"ATT_KV_RING", str(ring)},
          {which, "1"}};
      if (std::string(which) != "ATT_KV_STORE")
        defs.insert(defs.end(), {{"ATT_SCALE", "0.125f"}, {"ATT_SOFTCAP", "3.0f"}, {"ATT_WINDOW", str(window)}});
      if (std::string(which) == "ATT_DECODE" || std::string(which) == "ATT_COMBINE") defs.push_back({"ATT_SPLITS", "16"});
      return spec(std::string(name) + "_ring_test_d" + str(d) + "_w" + str(window) + "_r" + str(ring),
                  "kernels/attention.cuh", name, defs);
    };
    std::vector<Kernel> k = compile({att("minfer_kv_store", "ATT_KV_STORE"), att("minfer_attn_prefill", "ATT_PREFILL"),
                                     att("minfer_attn_decode", "ATT_DECODE"), att("minfer_attn_combine", "ATT_COMBINE")});
    // Both rings start zeroed (as the sessions' do), so that every slot compares from the first chunk on.
    const std::vector<uint16_t> zeros(static_cast<size_t>(ring) * kvw, 0);
    DeviceArray kc = DeviceArray::of(zeros), vc = DeviceArray::of(zeros);
    std::vector<float> ck(zeros.size(), 0.0f), cv(zeros.size(), 0.0f);
    cpu::KvLayer layer{ck.data(), cv.data(), ring, hkv, d, ring};
    const cpu::AttentionOptions options{.scale = q_scale, .softcap = cap, .window = window};
    const int total = 3 * ring + 11;
    std::vector<float> scratch(static_cast<size_t>(total));
    DeviceArray out(static_cast<uint64_t>(batch) * h * d * 4), part(kern::attnDecodePartFloats(h, d, 16) * 4);
    // Chunk sizes cycle through a full batch, single tokens and odd sizes.
    const int sizes[] = {batch, 1, std::max(1, batch / 2 + 1), 1, 1, std::max(1, batch - 1), std::min(3, batch)};
    int pos0 = 0, chunk = 0;
    size_t bad_slots = 0;
    while (pos0 < total) {
      int n = std::min(sizes[chunk++ % 7], total - pos0);
      CAPTURE(pos0);
      CAPTURE(n);
      // K and V rows, f16-rounded so that both sides store the same values.
      std::vector<float> kr = activations(n, kvw), vr = activations(n, kvw);
      for (float& x : kr) x = roundHalf(x);
      for (float& x : vr) x = roundHalf(x);
      DeviceArray d_k = DeviceArray::of(kr), d_v = DeviceArray::of(vr), d_pos = DeviceArray::of(std::vector<int32_t>{pos0});
      CUdeviceptr a = d_k.ptr(), b = d_v.ptr(), c = kc.ptr(), e = vc.ptr(), p = d_pos.ptr();
      launch(k[0], kern::kvStoreLaunch(n, hkv, d), {&a, &b, &c, &e, &p, &n});
      cpu::KvRowStorage storage(n);  // owns the arrays rows points into
      const cpu::KvRows rows = storage.contiguous(pos0, n, total);
      cpu::kvStore(layer, kr.data(), vr.data(), n, rows);
      // The whole ring, bit for bit (a wrong slot shows as a mismatch in the slot written or the one missed).
      const std::vector<uint16_t> kbits = kc.download<uint16_t>(ck.size()), vbits = vc.download<uint16_t>(cv.size());
      for (size_t i = 0; i < ck.size(); ++i) bad_slots += (kbits[i] != floatToHalf(ck[i])) + (vbits[i] != floatToHalf(cv[i]));
      REQUIRE_MESSAGE(bad_slots == 0, bad_slots << " f16 values of the GPU ring differ from the CPU ring after storing "
                                                << n << " tokens at " << pos0 << " (slot = position % " << ring << ")");
      std::vector<float> q = activations(n, h * d);
      for (float& v : q) v *= 4.0f;  // the cap bends the scores
      DeviceArray d_q = DeviceArray::of(q);
      out.poison();
      CUdeviceptr qp = d_q.ptr(), o = out.ptr(), pt = part.ptr();
      std::vector<float> ref(q.size());
      cpu::attention(q.data(), layer, n, rows, h, ref.data(), nullptr, scratch.data(), options);
      if (n == 1) {
        part.poison();
        launch(k[2], kern::attnDecodeLaunch(hkv, 16, d, h / hkv), {&qp, &c, &e, &pt, &p});
        launch(k[3], kern::attnCombineLaunch(h), {&pt, &o, &p});
        const std::vector<float> got = out.download<float>(q.size());
        if (kern::attnDecodeUsesMma(static_cast<unsigned>(d), h / hkv))
          CHECK(track("attn_decode ring (tensor cores)", relError(got.data(), ref.data(), ref.size())) <= attnMmaTol(d));
        else
          CHECK(track("attn_decode ring", relError(got.data(), ref.data(), ref.size())) <= kAttnTol);
      } else {
        launch(k[1], kern::attnPrefillLaunch(n, h, d), {&qp, &c, &e, &o, &p, &n});
        const std::vector<float> got = out.download<float>(q.size());
        const double err = relError(got.data(), ref.data(), ref.size());
        if (kern::attnPrefillUsesMma(static_cast<unsigned>(d)))
          CHECK(track("attn_prefill ring (tensor cores)", err) <= attnMmaTol(d));
        else
          CHECK(track("attn_prefill ring", err) <= kAttnTol);
      }
      pos0 += n;
    }
  }
}

// The tensor-core prefill of both Q placements (head 128: fragments in registers; 256: rows in shared memory)
// through a query column view (ATT_Q_PITCH: q at column 2 of rows wider than h·d, as in phi3's fused q|k|v
// rows; the columns beside the view NaN, so a read outside it shows) and the dense form, over prompts up to
// 2,048 tokens after 5 cached positions (32 query blocks: the first reads one key tile, the last all of
// them up to its own causal diagonal), against cpu::attention on the dense q.
TEST_CASE("attention prefill at heads 128 and 256: query column view (ATT_Q_PITCH) and a long prompt vs the CPU") {
  MINFER_REQUIRE_GPU(G);
  const int h = 4, hkv = 2, col = 2;
  for (int d : {128, 256}) {
    CAPTURE(d);
    const int kvw = hkv * d, pitch = h * d + 6;
    auto att = [&](bool view) {
      std::vector<std::pair<std::string, std::string>> defs = {
          {"ATT_NHEAD", str(h)}, {"ATT_NHEAD_KV", str(hkv)}, {"ATT_HEAD_DIM", str(d)}, {"ATT_PREFILL", "1"}};
      if (view) defs.push_back({"ATT_Q_PITCH", str(pitch)});
      return spec("minfer_attn_prefill_view_test_d" + str(d) + (view ? "_qp" + str(pitch) : ""),
                  "kernels/attention.cuh", "minfer_attn_prefill", defs);
    };
    std::vector<Kernel> k = compile({att(false), att(true)});
    for (const std::pair<int, int>& shape : {std::pair{0, 33}, std::pair{5, 513}, std::pair{5, 2048}}) {
      const int pos0 = shape.first, n = shape.second;
      CAPTURE(pos0);
      CAPTURE(n);
      const int n_ctx = pos0 + n;
      F16Kv kv = randomF16Kv(n_ctx, kvw);
      std::vector<float>&ck = kv.ck, &cv = kv.cv;
      DeviceArray kc = DeviceArray::of(kv.kh), vc = DeviceArray::of(kv.vh);
      cpu::KvLayer layer{ck.data(), cv.data(), n_ctx, hkv, d};
      const std::vector<float> q = activations(n, h * d);
      std::vector<float> wide(static_cast<size_t>(n) * pitch, std::numeric_limits<float>::quiet_NaN());
      for (int t = 0; t < n; ++t)
        std::copy_n(q.data() + static_cast<size_t>(t) * h * d, h * d,
                    wide.data() + static_cast<size_t>(t) * pitch + col);
      std::vector<float> ref(q.size()), scratch(static_cast<size_t>(n_ctx));
      cpu::attention(q.data(), layer, n, cpu::KvRowStorage(n).contiguous(pos0, n, n_ctx), h, ref.data(), nullptr,
                     scratch.data());
      DeviceArray d_q = DeviceArray::of(q), d_wide = DeviceArray::of(wide),
                  d_pos = DeviceArray::of(std::vector<int32_t>{pos0});
      DeviceArray out(static_cast<uint64_t>(n) * h * d * 4);
      for (int view : {0, 1}) {
        CAPTURE(view);
        out.poison();
        CUdeviceptr a = view ? d_wide.ptr() + static_cast<CUdeviceptr>(col) * 4 : d_q.ptr(), c = kc.ptr(), e = vc.ptr(),
                    o = out.ptr(), p = d_pos.ptr();
        int nn = n;
        launch(k[view], kern::attnPrefillLaunch(n, h, d), {&a, &c, &e, &o, &p, &nn});
        const std::vector<float> got = out.download<float>(q.size());
        CHECK(track("attn_prefill (tensor cores)", relError(got.data(), ref.data(), ref.size())) <= attnMmaTol(d));
      }
    }
  }
}

// One 8,192-token prompt through the prefill at two models' attention shapes: qwen2-7b (28 query heads over 4,
// head 128: Q in registers, 64-key tiles) and gemma2-9b (16 over 8, head 256: Q in shared memory, 32-key tiles;
// query scale 1/16 and cap 50, and its sliding-window layers' 4,096 positions). A CPU reference of every token
// would take minutes, so the rows of sampled tokens (the first, both ends of a query block, the window's edge,
// the last) are checked, each against cpu::attention of that token alone at its position over the same cache.
// Both forms run: the tensor-core one and the SIMT one forced (ATT_PREFILL_SIMT, the form head 256 took
// before), each checked with its own tolerance. Each kernel's time (mean of 3 synchronized launches after a
// warm-up, host clock) and its rate in causal FLOP (4·h·d per visible key) are printed: an A/B measure, not a
// bound.
TEST_CASE("attention prefill of an 8192-token prompt (qwen2-7b and gemma2-9b shapes): sampled tokens vs the CPU") {
  MINFER_REQUIRE_GPU(G);
  struct Shape {
    const char* name;
    int h, hkv, d;
    const char* scale;  // ATT_SCALE / ATT_SOFTCAP literals ("" = not set)
    const char* cap;
    int window;
  };
  const int n = 8192;
  for (const Shape& sh : {Shape{"qwen2-7b", 28, 4, 128, "", "", 0},
                          Shape{"gemma2-9b global", 16, 8, 256, "0.0625f", "50.0f", 0},
                          Shape{"gemma2-9b sliding", 16, 8, 256, "0.0625f", "50.0f", 4096}}) {
    CAPTURE(sh.name);
    const int h = sh.h, hkv = sh.hkv, d = sh.d, kvw = hkv * d;
    std::vector<std::pair<std::string, std::string>> defs = {
        {"ATT_NHEAD", str(h)}, {"ATT_NHEAD_KV", str(hkv)}, {"ATT_HEAD_DIM", str(d)}, {"ATT_PREFILL", "1"}};
    if (*sh.scale) defs.push_back({"ATT_SCALE", sh.scale});
    if (*sh.cap) defs.push_back({"ATT_SOFTCAP", sh.cap});
    if (sh.window) defs.push_back({"ATT_WINDOW", str(sh.window)});
    auto simt = defs;
    simt.push_back({"ATT_PREFILL_SIMT", "1"});
    const std::string tag = "_h" + str(h) + "_d" + str(d) + "_w" + str(sh.window);
    const char *src = "kernels/attention.cuh", *entry = "minfer_attn_prefill";
    std::vector<Kernel> k = compile({spec("minfer_attn_prefill_long_test" + tag, src, entry, defs),
                                     spec("minfer_attn_prefill_long_test_simt" + tag, src, entry, simt)});
    F16Kv kv = randomF16Kv(n, kvw);
    std::vector<float>&ck = kv.ck, &cv = kv.cv;
    const std::vector<float> q = activations(n, h * d);
    DeviceArray kc = DeviceArray::of(kv.kh), vc = DeviceArray::of(kv.vh), d_q = DeviceArray::of(q),
                d_pos = DeviceArray::of(std::vector<int32_t>{0}), out(static_cast<uint64_t>(n) * h * d * 4);
    cpu::KvLayer layer{ck.data(), cv.data(), n, hkv, d};
    const cpu::AttentionOptions options{.scale = *sh.scale ? std::stof(sh.scale) : 0.0f,
                                        .softcap = *sh.cap ? std::stof(sh.cap) : 0.0f, .window = sh.window};
    double keys = 0;  // Σ over tokens of the keys each sees
    for (int t = 0; t < n; ++t) keys += sh.window ? std::min(t + 1, sh.window) : t + 1;
    double ms[2] = {0, 0};
    for (int form : {0, 1}) {  // 0: tensor cores, 1: SIMT
      CAPTURE(form);
      out.poison();
      CUdeviceptr a = d_q.ptr(), c = kc.ptr(), e = vc.ptr(), o = out.ptr(), p = d_pos.ptr();
      int nn = n;
      const kern::LaunchShape shape = kern::attnPrefillLaunch(n, h, d, form == 1);
      launch(k[form], shape, {&a, &c, &e, &o, &p, &nn});  // warm-up (and the result checked below)
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < 3; ++r) launch(k[form], shape, {&a, &c, &e, &o, &p, &nn});
      ms[form] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 3;
      const std::string line = std::string(sh.name) + ": attn_prefill (" + (form ? "SIMT" : "tensor cores") + ") of " +
                               std::to_string(n) + " tokens " + std::to_string(ms[form]) + " ms, " +
                               std::to_string(4.0 * h * d * keys / (ms[form] * 1e-3) / 1e12) + " TFLOP/s (causal)";
      MESSAGE(line);
      const std::vector<float> got = out.download<float>(q.size());
      std::vector<float> ref(static_cast<size_t>(h) * d), scratch(static_cast<size_t>(n));
      for (int t : {0, 63, 64, 4095, 4096, 5000, n - 1}) {
        CAPTURE(t);
        const size_t row = static_cast<size_t>(t) * h * d;
        cpu::attention(q.data() + row, layer, 1, cpu::KvRowStorage(1).contiguous(t, 1, n), h, ref.data(), nullptr,
                       scratch.data(), options);
        const double err = relError(got.data() + row, ref.data(), ref.size());
        if (form == 0)
          CHECK(track("attn_prefill (tensor cores)", err) <= attnMmaTol(d));
        else
          CHECK(track("attn_prefill 8,192 keys (SIMT)", err) <= kAttnLongTol);
      }
    }
    const std::string speedup = std::string(sh.name) + ": tensor cores " + std::to_string(ms[1] / ms[0]) + "x the SIMT form's speed";
    MESSAGE(speedup);
  }
}

}  // namespace
}  // namespace minfer::test::gpu
