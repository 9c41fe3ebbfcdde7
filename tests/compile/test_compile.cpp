// minfer-compile's pipeline on real and edited GGUFs: every fixture compiles to a verified,
// deterministic artifact; tied embeddings; unsupported architectures and types are refused clearly.
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
