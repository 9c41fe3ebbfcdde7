// Sliding-window layers with a ring KV cache (schema Step.kv_ring) on the GPU, end to end: the gemma fixtures
// compiled with small max batches (rings of window + max_batch − 1 positions) run by the CUDA backend over
// contexts several rings long (prefill chunks, decode steps through the captured graph, rewinds within and
// past the rings), against the CPU backend on the same artifact (gemma tolerances of test_cuda_e2e), against
// the CUDA backend on the --swa-full artifact (only slot indices differ: bit-identical when the GPU is
// deterministic, which two --swa-full runs show), and the session's KV bytes. The kernels alone:
// test_cuda_kernels "attention over a ring KV cache".
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include "compiler/compile_model.h"
#include "compiler/gguf/gguf_writer.h"
#include "minfer/artifact.h"
#include "minfer/runtime.h"
#include "tests/cuda/gpu_harness.h"
#include "tests/e2e/golden_support.h"
#include "tests/test_support.h"

namespace minfer::test::gpu {
namespace {

// test_cuda_e2e's gemma bounds (max|Δ| / max|CPU|, RMS rel): F32 5e-3 (f16 KV, exact GELU on both sides);
// quantized 1e-1 / 5e-2 (int8 activations amplified by the post-norms).
constexpr double kGemmaFloatRel = 5e-3, kGemmaFloatRms = 5e-3;
constexpr double kGemmaQuantRel = 1e-1, kGemmaQuantRms = 5e-2;

struct Case {
  const char* model;
  uint32_t max_batch, window;  // window 0: the fixture's (16)
  bool gemv;                   // the fused QKV GEMV (the default) stores K and V (QKV_KV_RING) in decode; false: --fuse-gemv=none
  int n_ctx;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"tiny-gemma2-F32.gguf", 4, 0, false, 100},      // ring 19 on layer 0
      {"tiny-gemma3-F32.gguf", 4, 0, false, 100},      // rings 19 on layers 0 and 1
      {"tiny-gemma3-Q4_K_M.gguf", 8, 0, false, 100},   // ring 23, quantized matmuls
      {"tiny-gemma2-Q8_0.gguf", 2, 3, false, 60},      // window 3: ring 4
      {"tiny-gemma2-F32.gguf", 64, 0, false, 250},     // ring 79: prefill chunks of 64 wrap inside a key tile
      {"tiny-gemma2-Q4_K_M.gguf", 4, 0, true, 100},    // the fused QKV GEMV's ring store (Q4_K/Q6_K q, k, v)
      {"tiny-gemma3-Q4_K_M.gguf", 1, 0, true, 60},     // max batch 1: ring = window, decode plan only
  };
  return c;
}

std::string caseName(const Case& c) {
  return std::string(c.model) + " max_batch " + std::to_string(c.max_batch) + " window " +
         std::to_string(c.window ? c.window : 16) + (c.gemv ? "" : " --fuse-gemv=none");
}

// The case's fixture (window overridden when set) compiled with kernel images for this GPU, with rings or
// --swa-full.
std::string compiled(const Case& c, bool swa_full) {
  static std::map<std::string, std::string> done;
  const std::string stem = std::string(c.model) + ".b" + std::to_string(c.max_batch) + (swa_full ? ".full" : ".ring") +
                           (c.window ? ".w" + std::to_string(c.window) : "") + (c.gemv ? ".gemv" : "") + ".gpu";
  if (auto it = done.find(stem); it != done.end()) return it->second;
  std::string input = fixturesDir() + "/arch/models/" + c.model;
  if (c.window > 0) {
    const std::string arch = std::string(c.model).rfind("tiny-gemma3", 0) == 0 ? "gemma3" : "gemma2";
    input = ggufCopy("arch/models/" + std::string(c.model), stem, [&](gguf::GgufWriter& w) {
      w.set(arch + ".attention.sliding_window", gguf::MetaValue::u32(c.window));
    });
  }
  CompileOptions o;
  o.input = input;
  o.output = scratchDir() + "/" + stem + ".mfb";
  o.max_batch = c.max_batch;
  o.swa_full = swa_full;
  o.fuse_qkv = c.gemv;
  o.targets = {get()->arch};
  const char* cache = std::getenv("MINFER_TEST_KERNEL_CACHE");
  o.kernel_cache_dir = cache && *cache ? cache : MINFER_TEST_KERNEL_CACHE;
  auto s = compileModel(o);
  REQUIRE_MESSAGE(bool(s), "compiling " << stem << ": " << llvm::toString(s.takeError()));
  done[stem] = o.output;
  return o.output;
}

std::vector<int32_t> tokenIds(int n, uint32_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) {
    seed = seed * 1664525u + 1013904223u;
    id = 1 + static_cast<int32_t>((seed >> 8) % 511u);  // the fixtures' 512-token vocabulary
  }
  return ids;
}

// Evaluate n tokens (decode when 1, else one prefill with every row's logits), or rewind (n == 0).
struct Op {
  int n = 0;
  int rewind_to = 0;
};

// A schedule covering n_ctx − 3 positions: chunks of every size up to max batch and decodes, then (with
// rewinds) back by max batch (the rings keep it) and back past the rings (re-evaluated from 0).
std::vector<Op> schedule(const Case& c, bool rewinds) {
  const int b = static_cast<int>(c.max_batch), end = c.n_ctx - 3;
  std::vector<Op> ops;
  int pos = 0;
  const int sizes[] = {std::min(13, 3 * b), 1, 1, b, 1, std::max(1, b / 2), 1, 3 * b + 1, 1, 1};
  for (int i = 0; pos < end; ++i) {
    const int n = std::min(sizes[i % 10], end - pos);
    ops.push_back({n});
    pos += n;
  }
  if (rewinds) {
    ops.push_back({0, end - b});
    ops.push_back({1});
    ops.push_back({b > 1 ? b - 1 : 1});
    ops.push_back({0, end / 3});
    ops.push_back({1});
    ops.push_back({end / 3});
    ops.push_back({1});
  }
  return ops;
}

struct Trace {
  std::vector<float> logits;   // every row produced, in order
  uint64_t kv_bytes = 0;
};

// Runs `ops` on a fresh session of `backend`; tokens from ids before the first rewind, from alt after.
Trace run(const std::string& artifact, BackendKind backend, const Case& c, const std::vector<Op>& ops) {
  auto m = Model::open(artifact, backend);
  REQUIRE_MESSAGE(m.isOk(), m.status().message());
  auto s = (*m)->createSession({.n_ctx = c.n_ctx, .n_threads = 2});
  REQUIRE_MESSAGE(s.isOk(), s.status().message());
  const std::vector<int32_t> ids = tokenIds(c.n_ctx, 5), alt = tokenIds(c.n_ctx, 9);
  const int n_vocab = (*m)->info().n_vocab;
  Trace t;
  t.kv_bytes = (*s)->kvCacheBytes();
  bool rewound = false;
  for (const Op& op : ops) {
    if (op.n == 0) {
      Status st = (*s)->rewind(op.rewind_to);
      REQUIRE_MESSAGE(st.isOk(), backendKindName(backend) << " rewind to " << op.rewind_to << ": " << st.message());
      rewound = true;
      continue;
    }
    const int pos = (*s)->position();
    const std::span<const int32_t> chunk((rewound ? alt : ids).data() + pos, static_cast<size_t>(op.n));
    if (op.n == 1) {
      Status st = (*s)->decode(chunk[0]);
      REQUIRE_MESSAGE(st.isOk(), backendKindName(backend) << " decode at " << pos << ": " << st.message());
      t.logits.insert(t.logits.end(), (*s)->logits().begin(), (*s)->logits().end());
    } else {
      std::vector<float> rows(static_cast<size_t>(op.n) * n_vocab);
      Status st = (*s)->prefill(chunk, rows);
      REQUIRE_MESSAGE(st.isOk(), backendKindName(backend) << " prefill of " << op.n << " at " << pos << ": " << st.message());
      t.logits.insert(t.logits.end(), rows.begin(), rows.end());
    }
  }
  return t;
}

// Top-1 minus top-2 of each row (the argmax rule's margins).
std::vector<double> margins(const std::vector<float>& logits, int n_vocab) {
  std::vector<double> m;
  for (size_t r = 0; r + n_vocab <= logits.size(); r += n_vocab) {
    double a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < n_vocab; ++i) {
      const double x = logits[r + i];
      if (x > a) b = a, a = x;
      else if (x > b) b = x;
    }
    m.push_back(a - b);
  }
  return m;
}

double maxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// gemma2: every other layer local from layer 0; tiny-gemma3: pattern 3 (layers 0, 1 local, 2 global).
bool localLayer(const Case& c, int layer) {
  return std::string(c.model).rfind("tiny-gemma3", 0) == 0 ? layer % 3 != 2 : layer % 2 == 0;
}

bool quantized(const Case& c) { return std::string(c.model).find("-F32") == std::string::npos; }

}  // namespace

TEST_CASE("CUDA ring KV caches: logits match the CPU backend over contexts several rings long, with rewinds") {
  MINFER_REQUIRE_GPU(G);
  if (!haveFixtures()) return;
  for (const Case& c : cases())
    for (bool rewinds : {false, true}) {
      CAPTURE(caseName(c));
      CAPTURE(rewinds);
      const std::string ring = compiled(c, false);
      const std::vector<Op> ops = schedule(c, rewinds);
      const Trace cpu = run(ring, BackendKind::kCpu, c, ops), gpu = run(ring, BackendKind::kCuda, c, ops);
      REQUIRE(cpu.logits.size() == gpu.logits.size());
      const int rows = static_cast<int>(cpu.logits.size() / 512);
      const double rel = quantized(c) ? kGemmaQuantRel : kGemmaFloatRel, rms = quantized(c) ? kGemmaQuantRms : kGemmaFloatRms;
      double max_ref = 0;
      for (float x : cpu.logits) max_ref = std::max(max_ref, static_cast<double>(std::fabs(x)));
      const LogitDiff d = compareLogits(gpu.logits.data(), cpu.logits.data(), rows, 512, margins(cpu.logits, 512), rel * max_ref);
      INFO(caseName(c) << (rewinds ? " with rewinds" : "") << ": " << rows << " rows, rel " << d.rel() << " (bound "
                       << rel << "), RMS rel " << d.rms_rel << " (bound " << rms << "), argmax " << d.argmax_mismatch
                       << " of " << d.argmax_checked << " checked rows differ");
      CHECK(d.rel() <= rel);
      CHECK(d.rms_rel <= rms);
      CHECK(d.argmax_mismatch == 0);
      MESSAGE(caseName(c) << (rewinds ? " with rewinds" : "") << ": GPU vs CPU rel " << d.rel() << ", RMS rel "
                          << d.rms_rel);
    }
}

TEST_CASE("CUDA ring KV caches: the same logits as the --swa-full artifact (only slot indices differ)") {
  MINFER_REQUIRE_GPU(G);
  if (!haveFixtures()) return;
  for (const Case& c : cases()) {
    CAPTURE(caseName(c));
    // Without rewinds: a rewind past what a ring holds re-evaluates the prefix through the prefill plan (the
    // full-size artifact keeps its decode-computed K and V), which rounds differently; the first case
    // covers rewinds against the CPU's bounds.
    const std::vector<Op> ops = schedule(c, false);
    const Trace ring = run(compiled(c, false), BackendKind::kCuda, c, ops);
    const Trace full = run(compiled(c, true), BackendKind::kCuda, c, ops);
    const Trace full2 = run(compiled(c, true), BackendKind::kCuda, c, ops);
    REQUIRE(ring.logits.size() == full.logits.size());
    const double noise = maxAbsDiff(full.logits, full2.logits);  // run-to-run differences of the GPU itself
    const double diff = maxAbsDiff(ring.logits, full.logits);
    INFO(caseName(c) << ": max |ring - full| " << diff << ", max |full - full (second run)| " << noise
                     << "; the rings change only where K and V live, so the logits must be as reproducible as two "
                        "runs of one artifact");
    CHECK(diff <= 2 * noise);
    MESSAGE(caseName(c) << ": ring vs --swa-full max |diff| " << diff << " (run-to-run " << noise << ")");
  }
}

TEST_CASE("CUDA ring KV caches: the session's KV bytes are the rings' (f16) for local layers") {
  MINFER_REQUIRE_GPU(G);
  if (!haveFixtures()) return;
  for (const Case& c : cases()) {
    CAPTURE(caseName(c));
    for (bool swa_full : {false, true}) {
      const std::string path = compiled(c, swa_full);
      auto art = ArtifactFile::open(path);
      REQUIRE_MESSAGE(art.isOk(), art.status().message());
      std::map<int, std::pair<uint64_t, uint32_t>> layers;  // layer → (f16 values per position, kv_ring)
      for (const fb::Step* s : *(*art)->manifest()->decode()->steps())
        if (s->op() == fb::OpKind::Attention) layers[s->layer()] = {uint64_t{s->n_head_kv()} * s->head_dim(), s->kv_ring()};
      for (int n_ctx : {2, 30, c.n_ctx}) {
        CAPTURE(n_ctx);
        uint64_t want = 0;
        for (const auto& [layer, l] : layers) {
          CHECK((l.second != 0) == (!swa_full && localLayer(c, layer)));
          want += 2 * 2 * l.first * (l.second ? std::min<uint64_t>(n_ctx, l.second) : uint64_t(n_ctx));
        }
        // The memory plan (format 1.8) gives the same figure once n_ctx covers every ring.
        const fb::MemoryPlan& mem = *(*art)->manifest()->memory();
        uint32_t max_ring = 0;
        for (const auto& [layer, l] : layers) max_ring = std::max(max_ring, l.second);
        if (static_cast<uint32_t>(n_ctx) >= max_ring)
          CHECK((mem.kv_bytes_per_token() - mem.kv_ring_bytes_per_token()) * uint64_t(n_ctx) + mem.kv_ring_bytes() ==
                want);
        auto m = Model::open(path, BackendKind::kCuda);
        REQUIRE_MESSAGE(m.isOk(), m.status().message());
        auto s = (*m)->createSession({.n_ctx = n_ctx, .n_threads = 1});
        REQUIRE_MESSAGE(s.isOk(), s.status().message());
        INFO("KV bytes: session " << (*s)->kvCacheBytes() << ", expected " << want << " (the arena aligns each of K and "
                                  "V to 256 bytes, so the session may hold up to 512 bytes more per layer)");
        CHECK((*s)->kvCacheBytes() >= want);
        CHECK((*s)->kvCacheBytes() <= want + 512 * layers.size());
      }
    }
  }
}

}  // namespace minfer::test::gpu
