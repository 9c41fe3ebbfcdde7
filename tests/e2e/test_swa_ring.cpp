// Sliding-window layers with a ring KV cache (schema Step.kv_ring) on the CPU backend: the gemma fixtures
// compiled with a small max batch (a ring of window + max_batch − 1 positions) against the same fixtures
// compiled with --swa-full (every layer n_ctx positions), over contexts several rings long. Only the slot
// indexing differs, so the logits must be bit-identical, in any chunking and across rewinds (a rewind past
// what the rings hold re-evaluates from position 0). Also: the plan's kv_ring, the session's KV bytes (the
// rings', not n_ctx's), minfer-inspect's memory plan, and the ring tracker's arithmetic.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "compiler/compile_model.h"
#include "compiler/gguf/gguf_writer.h"
#include "minfer/artifact.h"
#include "minfer/runtime.h"
#include "runtime/kv_ring.h"
#include "tests/e2e/golden_support.h"
#include "tests/test_support.h"

namespace minfer::test {
namespace {

// fixtures/arch/models/<model> compiled for max_batch, with rings or --swa-full; window > 0 overrides
// <arch>.attention.sliding_window first (the GGUF is copied key by key with the GGUF writer).
std::string compileSwa(const std::string& model, uint32_t max_batch, bool swa_full, uint32_t window = 0) {
  static std::map<std::string, std::string> done;
  const std::string stem = model + ".b" + std::to_string(max_batch) + (swa_full ? ".full" : ".ring") +
                           (window ? ".w" + std::to_string(window) : "");
  if (auto it = done.find(stem); it != done.end()) return it->second;
  std::string input = fixturesDir() + "/arch/models/" + model;
  if (window > 0) {
    const std::string arch = model.rfind("tiny-gemma3", 0) == 0 ? "gemma3" : "gemma2";
    input = ggufCopy("arch/models/" + model, stem, [&](gguf::GgufWriter& w) {
      w.set(arch + ".attention.sliding_window", gguf::MetaValue::u32(window));
    });
  }
  CompileOptions o;
  o.input = input;
  o.output = scratchDir() + "/" + stem + ".mfb";
  o.max_batch = max_batch;
  o.swa_full = swa_full;
  o.jobs = 2;
  auto s = compileModel(o);
  REQUIRE_MESSAGE(bool(s), "compiling " << stem << ": " << llvm::toString(s.takeError()));
  done[stem] = o.output;
  return o.output;
}

// The KV figures of an artifact's memory plan (schema MemoryPlan; the ring ones from format 1.8).
struct KvPlan {
  uint64_t per_token = 0, ring_per_token = 0, ring_bytes = 0;
};
KvPlan kvPlan(const std::string& artifact) {
  auto art = ArtifactFile::open(artifact);
  REQUIRE_MESSAGE(art.isOk(), art.status().message());
  const fb::MemoryPlan* mem = (*art)->manifest()->memory();
  REQUIRE(mem);
  return {mem->kv_bytes_per_token(), mem->kv_ring_bytes_per_token(), mem->kv_ring_bytes()};
}

// Deterministic token ids in [1, n_vocab).
std::vector<int32_t> tokenIds(int n, uint32_t seed, int n_vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) {
    seed = seed * 1664525u + 1013904223u;
    id = 1 + static_cast<int32_t>((seed >> 8) % static_cast<uint32_t>(n_vocab - 1));
  }
  return ids;
}

// One step of a schedule: evaluate `n` tokens (decode when 1, else one prefill with every row's logits), or
// rewind to position `rewind_to` (n == 0).
struct Op {
  int n = 0;
  int rewind_to = 0;
};

// Runs `ops` on a fresh CPU session of n_ctx positions; tokens are taken from `ids` at the session's
// position (so a rewind re-feeds the same ids unless `alt` is set: then ids are taken from alt after it).
// Returns every logit row produced, in order.
std::vector<float> runSchedule(const std::string& artifact, int n_ctx, const std::vector<int32_t>& ids,
                               const std::vector<Op>& ops, const std::vector<int32_t>* alt = nullptr) {
  auto m = Model::open(artifact, BackendKind::kCpu);
  REQUIRE_MESSAGE(m.isOk(), m.status().message());
  auto s = (*m)->createSession({.n_ctx = n_ctx, .n_threads = 2});
  REQUIRE_MESSAGE(s.isOk(), s.status().message());
  const int n_vocab = (*m)->info().n_vocab;
  std::vector<float> out;
  bool rewound = false;
  for (const Op& op : ops) {
    if (op.n == 0) {
      Status st = (*s)->rewind(op.rewind_to);
      REQUIRE_MESSAGE(st.isOk(), "rewind to " << op.rewind_to << ": " << st.message());
      rewound = true;
      continue;
    }
    const int pos = (*s)->position();
    const std::vector<int32_t>& src = rewound && alt ? *alt : ids;
    REQUIRE(pos + op.n <= static_cast<int>(src.size()));
    const std::span<const int32_t> chunk(src.data() + pos, static_cast<size_t>(op.n));
    if (op.n == 1) {
      Status st = (*s)->decode(chunk[0]);
      REQUIRE_MESSAGE(st.isOk(), "decode at " << pos << ": " << st.message());
      out.insert(out.end(), (*s)->logits().begin(), (*s)->logits().end());
    } else {
      std::vector<float> rows(static_cast<size_t>(op.n) * n_vocab);
      Status st = (*s)->prefill(chunk, rows);
      REQUIRE_MESSAGE(st.isOk(), "prefill of " << op.n << " at " << pos << ": " << st.message());
      out.insert(out.end(), rows.begin(), rows.end());
    }
  }
  return out;
}

// Bit-identical logits, or a message with the first differing row and the largest difference.
void checkIdentical(const std::string& what, const std::vector<float>& ring, const std::vector<float>& full, int n_vocab) {
  REQUIRE(ring.size() == full.size());
  if (std::memcmp(ring.data(), full.data(), ring.size() * sizeof(float)) == 0) return;
  size_t first = 0;
  double max_abs = 0;
  for (size_t i = ring.size(); i-- > 0;)
    if (std::memcmp(&ring[i], &full[i], sizeof(float)) != 0) {
      first = i;
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(ring[i]) - full[i]));
    }
  FAIL_CHECK(what << ": the ring cache's logits differ from the full-size cache's, first in row "
                  << first / static_cast<size_t>(n_vocab) << " (of " << ring.size() / static_cast<size_t>(n_vocab)
                  << "), max |diff| " << max_abs << "; only the slot indexing should differ");
}

// Per layer (Attention steps of both plans, which must agree): kv_ring.
std::vector<uint32_t> planRings(const std::string& artifact) {
  auto art = ArtifactFile::open(artifact);
  REQUIRE_MESSAGE(art.isOk(), art.status().message());
  std::vector<uint32_t> prefill, decode;
  for (const fb::Step* s : *(*art)->manifest()->prefill()->steps())
    if (s->op() == fb::OpKind::Attention) prefill.push_back(s->kv_ring());
  for (const fb::Step* s : *(*art)->manifest()->decode()->steps())
    if (s->op() == fb::OpKind::Attention) decode.push_back(s->kv_ring());
  CHECK(prefill == decode);
  return prefill;
}

struct Case {
  const char* model;
  uint32_t max_batch, window;       // window 0: the fixture's (16)
  std::vector<uint32_t> rings;      // expected kv_ring per layer
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"tiny-gemma2-F32.gguf", 4, 0, {19, 0}},          // layer 0 local (window 16), layer 1 global
      {"tiny-gemma3-F32.gguf", 4, 0, {19, 19, 0}},      // layers 0, 1 local, layer 2 global
      {"tiny-gemma3-Q4_K_M.gguf", 8, 0, {23, 23, 0}},   // quantized matmuls, a larger batch
      {"tiny-gemma2-Q8_0.gguf", 2, 3, {4, 0}},          // window 3: a ring of 4 wraps every 4 positions
      {"tiny-gemma2-F32.gguf", 1, 5, {5, 0}},           // max batch 1: the ring is the window itself
  };
  return c;
}

std::string caseName(const Case& c) {
  return std::string(c.model) + " max_batch " + std::to_string(c.max_batch) + " window " +
         std::to_string(c.window ? c.window : 16);
}

}  // namespace

TEST_CASE("ring KV caches: the plan's kv_ring is window + max_batch - 1 on local layers, 0 with --swa-full") {
  if (!haveFixtures()) return;
  for (const Case& c : cases()) {
    CAPTURE(caseName(c));
    CHECK(planRings(compileSwa(c.model, c.max_batch, false, c.window)) == c.rings);
    CHECK(planRings(compileSwa(c.model, c.max_batch, true, c.window)) == std::vector<uint32_t>(c.rings.size(), 0));
  }
}

TEST_CASE("ring KV caches: logits bit-identical to the full-size cache over contexts several rings long") {
  if (!haveFixtures()) return;
  for (const Case& c : cases()) {
    CAPTURE(caseName(c));
    const std::string ring = compileSwa(c.model, c.max_batch, false, c.window);
    const std::string full = compileSwa(c.model, c.max_batch, true, c.window);
    const int n_ctx = 100;
    const std::vector<int32_t> ids = tokenIds(n_ctx, 7, 512);
    // Prefill chunks of every size (split by max_batch), decodes, then more of both: 98 positions, > 4 rings.
    const std::vector<Op> ops = {{13}, {1}, {1}, {1}, {7}, {1}, {2}, {3}, {30}, {1}, {1}, {1}, {1}, {5}, {1}, {29}};
    int total = 0;
    for (const Op& op : ops) total += op.n;
    REQUIRE(total == 98);
    checkIdentical(caseName(c), runSchedule(ring, n_ctx, ids, ops), runSchedule(full, n_ctx, ids, ops), 512);
  }
}

TEST_CASE("ring KV caches: rewinds within the ring and past it (re-evaluated from 0) match the full-size cache") {
  if (!haveFixtures()) return;
  for (const Case& c : cases()) {
    CAPTURE(caseName(c));
    const std::string ring = compileSwa(c.model, c.max_batch, false, c.window);
    const std::string full = compileSwa(c.model, c.max_batch, true, c.window);
    const int n_ctx = 96;
    const std::vector<int32_t> ids = tokenIds(n_ctx, 11, 512), alt = tokenIds(n_ctx, 23, 512);
    const int back = static_cast<int>(c.max_batch);  // the deepest rewind the rings always hold
    // 80 positions; back by max_batch (kept), forward with other tokens; back by 50 (lost: re-evaluated from
    // 0 with the other tokens' history up to there); forward again; back to 0; forward.
    const std::vector<Op> ops = {{40}, {1}, {1}, {38}, {0, 80 - back}, {1}, {6},   {0, 37}, {1},
                                 {20}, {1}, {0, 1},  {1}, {0, 0},      {9}, {1}};
    checkIdentical(caseName(c) + " with rewinds", runSchedule(ring, n_ctx, ids, ops, &alt),
                   runSchedule(full, n_ctx, ids, ops, &alt), 512);
  }
}

TEST_CASE("ring KV caches: a session's KV bytes are the rings' for local layers, n_ctx's for global ones") {
  if (!haveFixtures()) return;
  for (const Case& c : cases()) {
    CAPTURE(caseName(c));
    const std::string ring = compileSwa(c.model, c.max_batch, false, c.window);
    const std::string full = compileSwa(c.model, c.max_batch, true, c.window);
    for (int n_ctx : {3, 20, 100, 1000}) {
      CAPTURE(n_ctx);
      auto m = Model::open(ring, BackendKind::kCpu);
      REQUIRE_MESSAGE(m.isOk(), m.status().message());
      const uint64_t kv_width = static_cast<uint64_t>((*m)->info().n_head_kv) * static_cast<uint64_t>((*m)->info().head_dim);
      uint64_t want = 0;  // f32 K and V per layer
      for (uint32_t r : c.rings) want += 2 * sizeof(float) * kv_width * (r ? std::min<uint64_t>(n_ctx, r) : n_ctx);
      auto s = (*m)->createSession({.n_ctx = n_ctx, .n_threads = 1});
      REQUIRE_MESSAGE(s.isOk(), s.status().message());
      CHECK((*s)->kvCacheBytes() == want);
      CHECK((*s)->allocatedBytes() > (*s)->kvCacheBytes());
      auto mf = Model::open(full, BackendKind::kCpu);
      REQUIRE_MESSAGE(mf.isOk(), mf.status().message());
      auto sf = (*mf)->createSession({.n_ctx = n_ctx, .n_threads = 1});
      REQUIRE_MESSAGE(sf.isOk(), sf.status().message());
      CHECK((*sf)->kvCacheBytes() == 2 * sizeof(float) * kv_width * c.rings.size() * uint64_t(n_ctx));
      // The memory plan (format 1.8) says the same, in f16 (the CPU cache is f32): with rings, the
      // full-size layers' bytes per token times n_ctx plus the rings (every ring ≤ 23 < n_ctx here);
      // with --swa-full, every layer's bytes per token times n_ctx.
      if (n_ctx >= 100) {
        const KvPlan rp = kvPlan(ring), fp = kvPlan(full);
        CHECK((rp.per_token - rp.ring_per_token) * uint64_t(n_ctx) + rp.ring_bytes == (*s)->kvCacheBytes() / 2);
        CHECK(rp.ring_per_token > 0);
        CHECK(fp.ring_per_token == 0);
        CHECK(fp.ring_bytes == 0);
        CHECK(fp.per_token * uint64_t(n_ctx) == (*sf)->kvCacheBytes() / 2);
        CHECK(fp.per_token == rp.per_token);  // what a paged batch session holds per position
      }
      MESSAGE(caseName(c) << ", n_ctx " << n_ctx << ": KV cache " << (*s)->kvCacheBytes() << " bytes with rings, "
                          << (*sf)->kvCacheBytes() << " full-size");
    }
  }
}

TEST_CASE("minfer-inspect's memory plan shows the local layers' rings") {
  if (!haveFixtures()) return;
  const std::string ring = compileSwa("tiny-gemma3-F32.gguf", 4, false);
  const std::string out = scratchDir() + "/inspect-ring.txt";
  REQUIRE(std::system((std::string(MINFER_TOOLS_DIR) + "/minfer-inspect " + ring + " > " + out).c_str()) == 0);
  const std::vector<uint8_t> bytes = readFile(out);
  const std::string text(bytes.begin(), bytes.end());
  INFO(text.substr(text.find("memory plan"), 800));
  // K and V f16, 1 kv head of 64: 256 bytes per position.
  CHECK(text.find("layer   0: 256 bytes/position, ring of 19 positions (window 16): at most 4864 bytes") != std::string::npos);
  CHECK(text.find("layer   2: 256 bytes/position x n_ctx") != std::string::npos);
  CHECK(text.find("256 bytes/position x n_ctx for the full-size layers, + at most 9728 bytes for the sliding-window "
                  "layers' rings") != std::string::npos);
  CHECK(text.find("window 16 kv_ring 19") != std::string::npos);  // the Attention steps
  // The memory plan's own figures (1.8): 3 layers x 256 in a batch session; one full-size layer + 2 rings.
  CHECK(text.find("KV cache 768 bytes/token in a batch session; a single sequence: 256 bytes/token + at most 9728 "
                  "bytes of rings") != std::string::npos);
  // --json: memory.kv_layers, one per attention layer.
  const std::string json_out = scratchDir() + "/inspect-ring.json";
  REQUIRE(std::system((std::string(MINFER_TOOLS_DIR) + "/minfer-inspect --json " + ring + " > " + json_out).c_str()) == 0);
  const std::vector<uint8_t> jbytes = readFile(json_out);
  const nlohmann::json j = nlohmann::json::parse(std::string(jbytes.begin(), jbytes.end()));
  CHECK(j.at("memory").at("kv_ring_bytes_per_token") == 512);
  CHECK(j.at("memory").at("kv_ring_bytes") == 9728);
  const nlohmann::json& layers = j.at("memory").at("kv_layers");
  REQUIRE(layers.size() == 3);
  for (int l = 0; l < 3; ++l) {
    CAPTURE(l);
    CHECK(layers[l].at("layer") == l);
    CHECK(layers[l].at("bytes_per_position") == 256);
    CHECK(layers[l].at("ring") == (l < 2 ? 19 : 0));
    CHECK(layers[l].at("window") == (l < 2 ? 16 : 0));
  }
}

// With kernel images (NVRTC, no GPU needed): the ring layers' kv_store, prefill, decode and fused QKV GEMV
// images are specialized with the ring (key suffix _ring<R>, ATT_KV_RING / QKV_KV_RING = R) and compile; the
// global layer's launches keep the plain images; every KV cache argument of a ring layer is bound to those.
TEST_CASE("ring KV caches: the local layers' kernel images carry ATT_KV_RING / QKV_KV_RING, the global layer's do not") {
  if (!haveFixtures()) return;
  CompileOptions o;
  o.input = fixturesDir() + "/arch/models/tiny-gemma2-Q4_K_M.gguf";
  o.output = scratchDir() + "/gemma2-q4km-ring-sm90.mfb";
  o.max_batch = 4;
  o.fuse_qkv = true;  // the decode's q, k, v GEMV stores K and V itself (the default)
  o.targets = {"sm_90"};
  o.kernel_cache_dir = "off";
  o.jobs = 2;
  auto summary = compileModel(o);
  REQUIRE_MESSAGE(bool(summary), llvm::toString(summary.takeError()));
  auto art = ArtifactFile::open(o.output);
  REQUIRE_MESSAGE(art.isOk(), art.status().message());
  const fb::Artifact* m = (*art)->manifest();
  // The image each launch uses, and whether its options define the ring.
  auto ringOf = [&](const fb::Launch* l) -> std::string {
    const fb::KernelImage* k = m->kernels()->Get(l->images()->Get(0));  // the one target, sm_90
    std::string defined;
    if (k->options())
      for (const auto* opt : *k->options())
        if (opt->str().find("ATT_KV_RING=") != std::string::npos || opt->str().find("QKV_KV_RING=") != std::string::npos ||
            opt->str().find("ROPE_KV_RING=") != std::string::npos)  // the last: the q/k-norm models' head_norm_rope_kv
          defined += opt->str();
    INFO(k->key()->str() << " options with a ring: '" << defined << "'");
    CHECK((k->key()->str().find("_ring19") != std::string::npos) == !defined.empty());
    return defined;
  };
  std::map<uint32_t, int> ring_launches, plain_launches;  // KV layer → launches binding its cache
  int gemv_qkv_ring = 0;
  for (const fb::Plan* plan : {m->prefill(), m->decode()})
    for (const fb::Step* s : *plan->steps())
      if (s->launches())
        for (const fb::Launch* l : *s->launches()) {
          if (!l->args()) continue;
          for (const fb::KernelArg* a : *l->args()) {
            if (a->kind() != fb::ArgKind::KCache) continue;
            const std::string ring = ringOf(l);
            CAPTURE(s->name()->str());
            CAPTURE(a->layer());
            if (a->layer() == 0) {
              CHECK(ring.find("_KV_RING=19") != std::string::npos);
              ++ring_launches[a->layer()];
            } else {
              CHECK(ring.empty());
              ++plain_launches[a->layer()];
            }
            if (m->kernels()->Get(l->images()->Get(0))->entry()->str() == "minfer_gemv_qkv" && !ring.empty()) ++gemv_qkv_ring;
          }
        }
  // Layer 0: prefill kv_store + attn_prefill, decode (kv_store or the QKV GEMV) + attn_decode; layer 1 likewise.
  CHECK(ring_launches[0] >= 4);
  CHECK(plain_launches[1] >= 4);
  MESSAGE("ring layer launches " << ring_launches[0] << ", plain " << plain_launches[1] << ", fused QKV GEMV with ring "
                                 << gemv_qkv_ring);
  // The ring artifact still runs on the CPU like the full-size one (its kernels are for the GPU).
  const std::vector<int32_t> ids = tokenIds(60, 3, 512);
  const std::vector<Op> ops = {{20}, {1}, {1}, {30}, {1}, {1}};
  const std::string full = compileSwa("tiny-gemma2-Q4_K_M.gguf", 4, true);
  checkIdentical("tiny-gemma2-Q4_K_M with kernel images", runSchedule(o.output, 60, ids, ops),
                 runSchedule(full, 60, ids, ops), 512);
}

TEST_CASE("KvRingTracker: resumable positions after writes and rewinds") {
  KvRingTracker t;
  t.addLayer(/*ring=*/10, /*window=*/4, /*n_ctx=*/100);
  t.addLayer(/*ring=*/200, /*window=*/4, /*n_ctx=*/100);  // never wraps: not tracked
  CHECK(t.canResumeAt(0));
  t.advance(0, 8);  // positions 0..7
  for (int p = 0; p <= 8; ++p) CHECK(t.canResumeAt(p));
  t.advance(8, 7);  // 8..14 overwrite 0..4: positions 5..14 kept
  CHECK(t.canResumeAt(15));
  CHECK(t.canResumeAt(8));  // needs 5..7
  CHECK_FALSE(t.canResumeAt(7));  // needs 4..6
  CHECK(t.canResumeAt(0));
  const Status st = t.check(7);
  CHECK(st.message().find("holds positions from 5 on, but position 7 attends to positions from 4") != std::string::npos);
  t.advance(8, 2);  // a rewind to 8, then 8..9: still 5..9 kept
  CHECK(t.canResumeAt(8));
  CHECK(t.canResumeAt(10));
  t.advance(0, 3);  // back to 0: 0..2 kept, nothing older matters
  CHECK(t.canResumeAt(3));
  CHECK(t.canResumeAt(1));
  t.advance(3, 9);  // 3..11 overwrite 0, 1: 2..11 kept
  CHECK(t.canResumeAt(5));  // needs 2..4
  CHECK_FALSE(t.canResumeAt(4));
}

}  // namespace minfer::test
