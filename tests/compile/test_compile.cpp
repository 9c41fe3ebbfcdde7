// minfer-compile's pipeline on real and edited GGUFs: every fixture compiles to a verified,
// deterministic artifact; tied embeddings; unsupported architectures and types are refused clearly;
// gemma's sliding_window_pattern as a period or a per-layer array.
#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <set>

#include "compiler/compile_model.h"
#include "compiler/gguf/gguf_reader.h"
#include "compiler/gguf/gguf_writer.h"
#include "minfer/artifact.h"
#include "minfer/runtime.h"
#include "tests/test_support.h"

using namespace minfer;

namespace {

std::string model(const std::string& name) { return test::fixturesDir() + "/models/" + name; }

llvm::Expected<CompileSummary> compile(const std::string& in, const std::string& out, unsigned jobs = 2) {
  CompileOptions options;
  options.input = in;
  options.output = out;
  options.jobs = jobs;
  options.max_batch = 32;
  return compileModel(options);
}

// Copies `src` through the GGUF writer, letting `edit` change metadata and tensors.
std::string rewrite(const std::string& src, const std::string& out,
                    const std::function<void(const gguf::GgufFile&, gguf::GgufWriter&)>& edit,
                    const std::function<bool(const gguf::TensorInfo&)>& keep_tensor = nullptr) {
  auto file = gguf::GgufFile::open(src);
  REQUIRE(bool(file));
  gguf::GgufWriter w;
  for (const gguf::KeyValue& kv : (*file)->metadata()) w.set(llvm::StringRef(kv.key.data(), kv.key.size()),
                                                             gguf::MetaValue::fromParsed(kv.value));
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    if (keep_tensor && !keep_tensor(t)) continue;
    auto data = (*file)->tensorData(t);
    w.addTensor(llvm::StringRef(t.name.data(), t.name.size()), t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims),
                std::vector<uint8_t>(data.begin(), data.end()));
  }
  edit(**file, w);
  auto err = w.write(out);
  REQUIRE_MESSAGE(!err, llvm::toString(std::move(err)));
  return out;
}

std::vector<float> lastLogits(const std::string& artifact, const std::vector<int32_t>& ids) {
  auto m = Model::open(artifact, BackendKind::kCpu);
  REQUIRE_MESSAGE(m.isOk(), m.status().message());
  auto s = (*m)->createSession({.n_ctx = 64, .n_threads = 1});
  REQUIRE(s.isOk());
  REQUIRE((*s)->prefill(ids).isOk());
  return std::vector<float>((*s)->logits().begin(), (*s)->logits().end());
}

}  // namespace

TEST_CASE("every fixture model compiles to a verified artifact, byte-identical for any -j") {
  if (!test::haveFixtures()) return;
  const std::string dir = test::scratchDir();
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(test::fixturesDir() + "/models")) {
    if (entry.path().extension() != ".gguf") continue;
    const std::string name = entry.path().filename().string();
    CAPTURE(name);
    ++n;
    const std::string a = dir + "/" + name + ".j1.mfb", b = dir + "/" + name + ".j2.mfb";
    auto s1 = compile(entry.path().string(), a, 1);
    REQUIRE_MESSAGE(bool(s1), llvm::toString(s1.takeError()));
    auto s2 = compile(entry.path().string(), b, 2);
    REQUIRE(bool(s2));
    CHECK(test::readFile(a) == test::readFile(b));
    auto art = ArtifactFile::open(a);
    REQUIRE_MESSAGE(art.isOk(), art.status().message());
    Status v = (*art)->verifyChecksums();
    CHECK_MESSAGE(v.isOk(), v.message());
    CHECK((*art)->manifest()->tensors()->size() == s1->tensors);
    CHECK(s1->planes >= s1->tensors);
    std::filesystem::remove(a);
    std::filesystem::remove(b);
  }
  CHECK(n == 19);
}

TEST_CASE("tied embeddings: no output.weight → the projection reads token_embd's planes") {
  if (!test::haveFixtures()) return;
  const std::string dir = test::scratchDir();
  // Q4_K token embedding: the tied artifact needs kBlocks for the gather and matmul planes.
  const std::string src = model("tiny-llama-Q4_K_M.gguf");
  const std::string tied = rewrite(src, dir + "/tied.gguf", [](const gguf::GgufFile&, gguf::GgufWriter&) {},
                                   [](const gguf::TensorInfo& t) { return t.name != "output.weight"; });
  // The same model with output.weight = a copy of token_embd: must give the same logits exactly.
  const std::string untied = rewrite(
      src, dir + "/untied.gguf",
      [](const gguf::GgufFile& f, gguf::GgufWriter& w) {
        const gguf::TensorInfo* e = f.findTensor("token_embd.weight");
        auto data = f.tensorData(*e);
        w.addTensor("output.weight", e->type, {e->ne[0], e->ne[1]}, std::vector<uint8_t>(data.begin(), data.end()));
      },
      [](const gguf::TensorInfo& t) { return t.name != "output.weight"; });
  REQUIRE(bool(compile(tied, dir + "/tied.mfb")));
  REQUIRE(bool(compile(untied, dir + "/untied.mfb")));
  auto art = ArtifactFile::open(dir + "/tied.mfb");
  REQUIRE(art.isOk());
  const fb::Artifact* m = (*art)->manifest();
  CHECK(m->config()->tied_embeddings());
  CHECK(m->tensors()->size() == 20);
  const fb::Step* last = m->prefill()->steps()->Get(m->prefill()->steps()->size() - 1);
  REQUIRE(last->weights()->size() == 1);
  const fb::Tensor* w = m->tensors()->Get(last->weights()->Get(0));
  CHECK(w->name()->str() == "token_embd.weight");
  CHECK(w->planes()->size() >= 4);  // blocks + i8 + scale + min (+ packed)
  const std::vector<int32_t> ids = {1, 69, 200, 257, 306, 346, 264, 27};
  const std::vector<float> a = lastLogits(dir + "/tied.mfb", ids), b = lastLogits(dir + "/untied.mfb", ids);
  REQUIRE(a.size() == 512);
  CHECK(a == b);
  double spread = 0;
  for (float x : a) spread = std::max(spread, std::fabs(double(x - a[0])));
  CHECK(spread > 0.1);  // real logits, not a constant row
}

TEST_CASE("unsupported architecture and tensor type are refused with what is supported") {
  if (!test::haveFixtures()) return;
  const std::string dir = test::scratchDir();
  const std::string gpt2 = rewrite(model("stories260K.gguf"), dir + "/gpt2.gguf",
                                   [](const gguf::GgufFile&, gguf::GgufWriter& w) {
                                     w.setString("general.architecture", "gpt2");
                                   });
  auto r = compile(gpt2, dir + "/gpt2.mfb");
  REQUIRE(!r);
  std::string msg = llvm::toString(r.takeError());
  CHECK(msg.find("unsupported architecture 'gpt2'") != std::string::npos);
  CHECK(msg.find("llama, qwen2, qwen3") != std::string::npos);
  CHECK(!std::filesystem::exists(dir + "/gpt2.mfb"));

  // An IQ4_NL ffn_gate (32-weight blocks of 18 bytes: ggml knows it, minfer does not compile it).
  const std::string iq = rewrite(
      model("stories260K.gguf"), dir + "/iq.gguf",
      [](const gguf::GgufFile& f, gguf::GgufWriter& w) {
        const gguf::TensorInfo* t = f.findTensor("blk.0.ffn_gate.weight");
        std::vector<uint8_t> bytes(t->rows() * t->cols() / 32 * 18, 0x11);
        w.addTensor("blk.0.ffn_gate.weight", GgmlType::IQ4_NL, {t->ne[0], t->ne[1]}, std::move(bytes));
      },
      [](const gguf::TensorInfo& t) { return t.name != "blk.0.ffn_gate.weight"; });
  r = compile(iq, dir + "/iq.mfb");
  REQUIRE(!r);
  msg = llvm::toString(r.takeError());
  CHECK(msg.find("blk.0.ffn_gate.weight") != std::string::npos);
  CHECK(msg.find("IQ4_NL") != std::string::npos);
  CHECK(msg.find("Q4_K") != std::string::npos);  // the supported list
  CHECK(!std::filesystem::exists(dir + "/iq.mfb"));

  // A tensor whose shape disagrees with the hyperparameters.
  const std::string bad_shape = rewrite(model("stories260K.gguf"), dir + "/shape.gguf",
                                        [](const gguf::GgufFile&, gguf::GgufWriter& w) {
                                          w.setU32("llama.feed_forward_length", 160);
                                        });
  r = compile(bad_shape, dir + "/shape.mfb");
  REQUIRE(!r);
  msg = llvm::toString(r.takeError());
  CHECK(msg.find("has shape [64, 172], expected [64, 160]") != std::string::npos);
}

TEST_CASE("--target sm_90a: kF16 planes derived at load, prefill matmuls on wgmma, same CPU logits") {
  if (!test::haveFixtures()) return;
  const std::string dir = test::scratchDir();
  const std::string src = model("tiny-llama-Q4_K_M.gguf");
  CompileOptions options;
  options.input = src;
  options.output = dir + "/hopper.mfb";
  options.jobs = 2;
  options.max_batch = 32;
  options.targets = {"sm_90a"};
  options.kernel_cache_dir = "off";
  CHECK(usesHopperPrefill(options.targets));
  CHECK_FALSE(usesHopperPrefill({"sm_90"}));
  CHECK_FALSE(usesHopperPrefill({"sm_80", "sm_90a"}));
  CHECK_FALSE(usesHopperPrefill({}));
  auto summary = compileModel(options);
  REQUIRE_MESSAGE(bool(summary), llvm::toString(summary.takeError()));
  auto art = ArtifactFile::open(options.output);
  REQUIRE_MESSAGE(art.isOk(), art.status().message());
  const fb::Artifact* m = (*art)->manifest();
  // Every quantized matmul weight has a derived kF16 plane; no float tensor or vector does.
  int f16_planes = 0;
  for (const fb::Tensor* t : *m->tensors())
    for (const fb::Plane* p : *t->planes())
      if (static_cast<PlaneKind>(p->layout()->kind()) == PlaneKind::kF16) {
        CHECK(p->derived());
        CHECK(p->data()->size() == 0);
        ++f16_planes;
      }
  CHECK(f16_planes >= 7 * 2 + 1);  // 2 layers × 7 projections + the output head
  // Every prefill MatMul before the last-token tail stages its q8 input as f16 and launches the Hopper
  // kernel; in the tail (no scratch) the Hopper kernel dequantizes the q8 input itself; decode never uses it.
  auto kernelEntries = [&](const fb::Plan* plan, fb::OpKind op, bool tail) {
    std::set<std::string> entries;
    for (const fb::Step* s : *plan->steps())
      if (s->op() == op && s->tail() == tail && s->launches())
        for (const fb::Launch* l : *s->launches())
          for (uint32_t image : *l->images()) entries.insert(m->kernels()->Get(image)->entry()->str());
    return entries;
  };
  CHECK(kernelEntries(m->prefill(), fb::OpKind::MatMul, false) ==
        std::set<std::string>{"minfer_q8_to_f16", "minfer_wgmma_matmul"});
  CHECK(kernelEntries(m->prefill(), fb::OpKind::MatMul, true) == std::set<std::string>{"minfer_wgmma_matmul"});
  CHECK(kernelEntries(m->decode(), fb::OpKind::MatMul, false).count("minfer_wgmma_matmul") == 0);
  for (const fb::KernelImage* k : *m->kernels()) CHECK(k->arch()->str() == "sm_90a");
  // The CPU reads the kBlocks planes: the logits equal those of the CPU-only artifact bit for bit.
  REQUIRE(bool(compile(src, dir + "/plain.mfb")));
  const std::vector<int32_t> ids = {1, 69, 200, 257, 306, 346, 264, 27};
  CHECK(lastLogits(options.output, ids) == lastLogits(dir + "/plain.mfb", ids));
}

namespace {

std::string archModel(const std::string& name) { return test::fixturesDir() + "/arch/models/" + name; }

constexpr const char* kGemma3Pattern = "gemma3.attention.sliding_window_pattern";

// Per layer, from a compiled artifact: the Attention window of the prefill and decode plans and the
// RoPE base of the prefill plan.
struct LayerWindows {
  std::vector<uint32_t> prefill, decode;
  std::vector<float> rope_base;
};
LayerWindows layerWindows(const std::string& artifact) {
  auto art = ArtifactFile::open(artifact);
  REQUIRE_MESSAGE(art.isOk(), art.status().message());
  const fb::Artifact* m = (*art)->manifest();
  LayerWindows r;
  for (const fb::Step* s : *m->prefill()->steps()) {
    if (s->op() == fb::OpKind::Attention) r.prefill.push_back(s->window());
    if (s->op() == fb::OpKind::Rope) r.rope_base.push_back(s->rope_freq_base());
  }
  for (const fb::Step* s : *m->decode()->steps())
    if (s->op() == fb::OpKind::Attention) r.decode.push_back(s->window());
  return r;
}

// `src` with `key` replaced by `value`, compiled; "" when the compiler refused it (message in `error`).
std::string compileWithKey(const std::string& src, const std::string& stem, const std::string& key,
                           const gguf::MetaValue& value, std::string* error = nullptr) {
  const std::string dir = test::scratchDir();
  const std::string gguf_path = rewrite(src, dir + "/" + stem + ".gguf",
                                        [&](const gguf::GgufFile&, gguf::GgufWriter& w) { w.set(key, value); });
  const std::string out = dir + "/" + stem + ".mfb";
  auto r = compile(gguf_path, out);
  if (!r) {
    const std::string msg = llvm::toString(r.takeError());
    if (error) *error = msg;
    else FAIL_CHECK(msg);
    CHECK(!std::filesystem::exists(out));
    return "";
  }
  return out;
}

gguf::MetaValue boolArray(std::vector<uint8_t> flags) {
  return gguf::MetaValue::scalarArray(gguf::ValueType::BOOL, std::move(flags));
}

// 40 prompt ids: longer than the fixtures' window of 16, so a local layer sees fewer keys than a global one.
const std::vector<int32_t> kLongPrompt = {69,  200, 257, 306, 346, 264, 27,  13,  100, 150, 300, 411, 12, 88,
                                          471, 5,   90,  222, 333, 444, 55,  66,  77,  123, 234, 345, 456, 17,
                                          28,  39,  140, 251, 362, 473, 84,  95,  106, 117, 128, 139};

// The fixture `src` compiled as it is: its layers' windows and the last logits of kLongPrompt.
struct Compiled {
  LayerWindows windows;
  std::vector<float> logits;
};
Compiled compileAsIs(const std::string& src, const std::string& stem) {
  const std::string out = test::scratchDir() + "/" + stem + ".mfb";
  auto r = compile(src, out);
  REQUIRE_MESSAGE(bool(r), llvm::toString(r.takeError()));
  Compiled c{layerWindows(out), lastLogits(out, kLongPrompt)};
  CHECK(c.windows.decode == c.windows.prefill);
  return c;
}

}  // namespace

TEST_CASE("gemma3 sliding_window_pattern as a per-layer array: the plan and logits of the period it spells") {
  if (!test::haveFixtures()) return;
  // tiny-gemma3 carries the period 3 (layers 0, 1 local, layer 2 global; window 16, local base 1e4).
  const std::string src = archModel("tiny-gemma3-F32.gguf");
  const Compiled as_is = compileAsIs(src, "period");
  const LayerWindows& period = as_is.windows;
  CHECK(period.prefill == std::vector<uint32_t>{16, 16, 0});
  CHECK(period.rope_base == std::vector<float>{1e4f, 1e4f, 1e6f});
  const std::vector<float>& expected = as_is.logits;
  // The same layers spelled as BOOL, INT32 and UINT32 arrays (1 = sliding window, 0 = global).
  const std::vector<std::pair<std::string, gguf::MetaValue>> spellings = {
      {"bool", boolArray({1, 1, 0})},
      {"i32", gguf::MetaValue::i32Array(std::vector<int32_t>{1, 1, 0})},
      {"u32", gguf::MetaValue::u32Array(std::vector<uint32_t>{1, 1, 0})}};
  for (const auto& [stem, value] : spellings) {
    CAPTURE(stem);
    const std::string art = compileWithKey(src, "array_" + stem, kGemma3Pattern, value);
    REQUIRE(!art.empty());
    const LayerWindows w = layerWindows(art);
    CHECK(w.prefill == period.prefill);
    CHECK(w.decode == period.decode);
    CHECK(w.rope_base == period.rope_base);
    CHECK(lastLogits(art, kLongPrompt) == expected);  // bit for bit
  }
}

TEST_CASE("gemma3 sliding_window_pattern: an array unlike the period changes the windows it names") {
  if (!test::haveFixtures()) return;
  const std::string src = archModel("tiny-gemma3-F32.gguf");
  const std::string period = compileWithKey(src, "p3", kGemma3Pattern, gguf::MetaValue::u32(3));
  REQUIRE(!period.empty());
  const std::vector<float> period_logits = lastLogits(period, kLongPrompt);
  // Every layer global: no window anywhere, every layer on the global RoPE base; other logits.
  const std::string global = compileWithKey(src, "global", kGemma3Pattern, boolArray({0, 0, 0}));
  REQUIRE(!global.empty());
  LayerWindows w = layerWindows(global);
  CHECK(w.prefill == std::vector<uint32_t>{0, 0, 0});
  CHECK(w.decode == w.prefill);
  CHECK(w.rope_base == std::vector<float>{1e6f, 1e6f, 1e6f});
  CHECK(lastLogits(global, kLongPrompt) != period_logits);
  // Only the middle layer local: a layout no period gives.
  const std::string middle = compileWithKey(src, "middle", kGemma3Pattern, boolArray({0, 1, 0}));
  REQUIRE(!middle.empty());
  w = layerWindows(middle);
  CHECK(w.prefill == std::vector<uint32_t>{0, 16, 0});
  CHECK(w.rope_base == std::vector<float>{1e6f, 1e4f, 1e6f});
  // Every layer local: the array [1, 1, 1] and the period 0 (llama.cpp's "every layer local") agree.
  const std::string local = compileWithKey(src, "local", kGemma3Pattern, boolArray({1, 1, 1}));
  const std::string zero = compileWithKey(src, "zero", kGemma3Pattern, gguf::MetaValue::u32(0));
  REQUIRE(!local.empty());
  REQUIRE(!zero.empty());
  CHECK(layerWindows(local).prefill == std::vector<uint32_t>{16, 16, 16});
  CHECK(layerWindows(zero).prefill == layerWindows(local).prefill);
  CHECK(lastLogits(local, kLongPrompt) == lastLogits(zero, kLongPrompt));
}

TEST_CASE("gemma3 sliding_window_pattern: malformed arrays are refused naming the file, key and values") {
  if (!test::haveFixtures()) return;
  const std::string src = archModel("tiny-gemma3-F32.gguf");
  struct Case {
    std::string stem;
    gguf::MetaValue value;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"short", boolArray({1, 0}), {"ARRAY of 2 BOOL elements", "block_count = 3"}},
      {"long", gguf::MetaValue::i32Array(std::vector<int32_t>{1, 1, 0, 1}), {"ARRAY of 4 INT32", "block_count = 3"}},
      {"empty", boolArray({}), {"ARRAY of 0 BOOL", "block_count = 3"}},
      {"float", gguf::MetaValue::f32Array(std::vector<float>{1, 1, 0}), {"has type ARRAY of FLOAT32"}},
      {"string", gguf::MetaValue::stringArray({"sliding", "sliding", "full"}), {"has type ARRAY of STRING"}},
      {"int8", gguf::MetaValue::scalarArray(gguf::ValueType::INT8, {1, 1, 0}), {"has type ARRAY of INT8"}},
      {"u64", gguf::MetaValue::scalarArray(gguf::ValueType::UINT64, std::vector<uint8_t>(24, 0)),
       {"has type ARRAY of UINT64"}},
      {"nested", gguf::MetaValue::arrayOfArrays({boolArray({1}), boolArray({1}), boolArray({0})}),
       {"has type ARRAY of ARRAY"}},
      {"two", gguf::MetaValue::i32Array(std::vector<int32_t>{1, 2, 0}), {"element 1 = 2", "0 (global) or 1"}},
      {"negative", gguf::MetaValue::i32Array(std::vector<int32_t>{1, 1, -1}), {"element 2 = -1"}},
      {"scalar_string", gguf::MetaValue::string("3"), {"has type STRING"}},
      {"scalar_float", gguf::MetaValue::f32(3), {"has type FLOAT32"}},
      {"scalar_huge", gguf::MetaValue::u64(uint64_t{1} << 40), {"does not fit UINT32"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.stem);
    std::string error;
    CHECK(compileWithKey(src, "bad_" + c.stem, kGemma3Pattern, c.value, &error).empty());
    CAPTURE(error);
    CHECK(error.find(test::scratchDir() + "/bad_" + c.stem + ".gguf") != std::string::npos);  // the file
    CHECK(error.find(kGemma3Pattern) != std::string::npos);                                   // the key
    for (const std::string& s : c.says) CHECK(error.find(s) != std::string::npos);            // the values
  }
}

TEST_CASE("gemma2 ignores sliding_window_pattern in either form, as llama.cpp does (set_swa_pattern(2))") {
  if (!test::haveFixtures()) return;
  // tiny-gemma2 has no pattern key: layer 0 local (window 16), layer 1 global.
  const std::string src = archModel("tiny-gemma2-F32.gguf");
  const Compiled as_is = compileAsIs(src, "gemma2");
  CHECK(as_is.windows.prefill == std::vector<uint32_t>{16, 0});
  for (const auto& [stem, value] : std::vector<std::pair<std::string, gguf::MetaValue>>{
           {"g2_bool", boolArray({1, 0})}, {"g2_global", boolArray({0, 0})}, {"g2_period", gguf::MetaValue::u32(1)}}) {
    CAPTURE(stem);
    const std::string art = compileWithKey(src, stem, "gemma2.attention.sliding_window_pattern", value);
    REQUIRE(!art.empty());
    CHECK(layerWindows(art).prefill == as_is.windows.prefill);
    CHECK(lastLogits(art, kLongPrompt) == as_is.logits);
  }
}
