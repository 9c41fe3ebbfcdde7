// minfer-synth's generator: shapes, llama.cpp type mixes, tokenizer handling, determinism, sane weights.
//
// Independent oracles: llama.cpp's own files in ../shared/fixtures (tensor names, shapes, types and
// hyperparameters of tiny-llama / tiny-qwen2 per type mix), the Q4_K_M layer list from llama.cpp's
// rule for 28 layers, and the reference dequantization in kernels/block_formats.h.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "compiler/gguf/gguf_reader.h"
#include "compiler/gguf/gguf_writer.h"
#include "compiler/tools/synth_model.h"
#include "tests/test_support.h"

using minfer::GgmlType;
using minfer::gguf::GgufFile;
using minfer::gguf::GgufWriter;
using namespace minfer::synth;

namespace {

std::unique_ptr<GgufFile> parseBytes(const std::vector<uint8_t>& bytes, const std::string& name) {
  auto buffer = llvm::MemoryBuffer::getMemBufferCopy(
      llvm::StringRef(reinterpret_cast<const char*>(bytes.data()), bytes.size()), name);
  auto file = GgufFile::parse(std::move(buffer), name);
  if (!file) {
    FAIL_CHECK(llvm::toString(file.takeError()));
    return nullptr;
  }
  return std::move(*file);
}

std::vector<uint8_t> synthBytes(const ModelShape& shape, TypeMix mix, uint64_t seed, unsigned threads = 2,
                                const GgufFile* vocab = nullptr, std::vector<std::string>* notes = nullptr,
                                uint64_t chunk = 0) {
  SynthOptions o;
  o.shape = shape;
  o.mix = mix;
  o.seed = seed;
  o.threads = threads;
  o.vocab = vocab;
  GgufWriter w;
  if (chunk) w.setChunkBytes(chunk);
  llvm::cantFail(buildSynthModel(o, w, notes));
  return llvm::cantFail(w.toBytes());
}

std::vector<uint8_t> synthBytes(const std::string& model, TypeMix mix, uint64_t seed, unsigned threads = 2,
                                const GgufFile* vocab = nullptr, std::vector<std::string>* notes = nullptr,
                                uint64_t chunk = 0) {
  return synthBytes(llvm::cantFail(modelShape(model)), mix, seed, threads, vocab, notes, chunk);
}

const std::vector<TypeMix> kMixes = {TypeMix::kF32, TypeMix::kF16, TypeMix::kQ8_0,
                                     TypeMix::kQ4_0, TypeMix::kQ6_K, TypeMix::kQ4_K_M};

// Matrix type per mix for a tensor name, written out from llama.cpp's behaviour (fixtures README).
GgmlType expectedTinyType(TypeMix mix, const std::string& name) {
  if (name.find("norm") != std::string::npos || name.find(".bias") != std::string::npos) return GgmlType::F32;
  switch (mix) {
    case TypeMix::kF32: return GgmlType::F32;
    case TypeMix::kF16: return GgmlType::F16;
    case TypeMix::kQ8_0: return GgmlType::Q8_0;
    case TypeMix::kQ6_K: return GgmlType::Q6_K;
    case TypeMix::kQ4_0: return name == "output.weight" ? GgmlType::Q6_K : GgmlType::Q4_0;
    case TypeMix::kQ4_K_M:
      return (name == "output.weight" || name == "blk.1.attn_v.weight" || name == "blk.1.ffn_down.weight")
                 ? GgmlType::Q6_K
                 : GgmlType::Q4_K;
  }
  return GgmlType::F32;
}

const char* fixtureFor(const std::string& model, TypeMix mix) {
  static const std::map<std::pair<std::string, TypeMix>, const char*> files = {
      {{"tiny-llama", TypeMix::kF32}, "tiny-llama-F32.gguf"},   {{"tiny-llama", TypeMix::kF16}, "tiny-llama-F16.gguf"},
      {{"tiny-llama", TypeMix::kQ8_0}, "tiny-llama-Q8_0.gguf"}, {{"tiny-llama", TypeMix::kQ4_0}, "tiny-llama-Q4_0.gguf"},
      {{"tiny-llama", TypeMix::kQ6_K}, "tiny-llama-Q6_K.gguf"}, {{"tiny-llama", TypeMix::kQ4_K_M}, "tiny-llama-Q4_K_M.gguf"},
      {{"tiny-qwen2", TypeMix::kF32}, "tiny-qwen2-F32.gguf"},   {{"tiny-qwen2", TypeMix::kQ8_0}, "tiny-qwen2-Q8_0.gguf"},
      {{"tiny-qwen2", TypeMix::kQ6_K}, "tiny-qwen2-Q6_K.gguf"}, {{"tiny-qwen2", TypeMix::kQ4_K_M}, "tiny-qwen2-Q4_K_M.gguf"},
  };
  auto it = files.find({model, mix});
  return it == files.end() ? nullptr : it->second;
}

// Dequantizes every block of a tensor (reference in block_formats.h) into doubles.
std::vector<double> dequantize(const GgufFile& f, const minfer::gguf::TensorInfo& t) {
  const auto traits = minfer::ggmlTypeTraits(t.type);
  const auto bytes = f.tensorData(t);
  std::vector<double> out;
  out.reserve(t.elements());
  std::vector<float> block(traits.block_size);
  bool ok = true;
  for (uint64_t off = 0; off < bytes.size(); off += traits.type_size) {
    ok &= minfer::dequantizeBlock(t.type, bytes.data() + off, block.data());
    out.insert(out.end(), block.begin(), block.end());
  }
  CHECK(ok);
  return out;
}

// `f` has exactly the tensors of llama.cpp's file `ref`: names, types, dimensions.
void checkSameTensors(const GgufFile& f, const GgufFile& ref) {
  CHECK(ref.tensors().size() == f.tensors().size());
  for (const auto& rt : ref.tensors()) {
    CAPTURE(rt.name);
    const auto* t = f.findTensor(llvm::StringRef(rt.name.data(), rt.name.size()));
    REQUIRE(t);
    CHECK(t->type == rt.type);
    CHECK(t->n_dims == rt.n_dims);
    for (int d = 0; d < 4; ++d) CHECK(t->ne[d] == rt.ne[d]);
  }
}

}  // namespace

TEST_CASE("Q4_K_M gives attn_v and ffn_down Q6_K exactly in llama.cpp's layers") {
  // llama.cpp's list for 28 layers (qwen2-7b).
  const std::set<uint32_t> want28 = {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27};
  for (uint32_t i = 0; i < 28; ++i) CHECK_MESSAGE(q4kmMoreBits(i, 28) == (want28.count(i) == 1), "layer " << i);
  // 2 layers (the fixtures): only layer 1.
  CHECK_FALSE(q4kmMoreBits(0, 2));
  CHECK(q4kmMoreBits(1, 2));

  ModelShape shape = llvm::cantFail(modelShape("qwen2-7b"));
  const auto plan = llvm::cantFail(planTensors(shape, TypeMix::kQ4_K_M));
  CHECK(plan.size() == 3 + 28 * 12);
  int q6 = 0;
  for (const TensorPlan& t : plan) {
    CAPTURE(t.name);
    if (t.kind != TensorKind::kMatrix) {
      CHECK(t.type == GgmlType::F32);
      continue;
    }
    GgmlType want = GgmlType::Q4_K;
    if (t.name == "output.weight") want = GgmlType::Q6_K;
    for (uint32_t i : want28) {
      const std::string p = "blk." + std::to_string(i) + ".";
      if (t.name == p + "attn_v.weight" || t.name == p + "ffn_down.weight") want = GgmlType::Q6_K;
    }
    CHECK(t.type == want);
    q6 += t.type == GgmlType::Q6_K;
  }
  CHECK(q6 == 1 + 2 * 14);
}

TEST_CASE("big model shapes follow llama.cpp's tensor names and ggml dims") {
  auto find = [](const std::vector<TensorPlan>& plan, const std::string& name) -> const TensorPlan* {
    for (const auto& t : plan)
      if (t.name == name) return &t;
    FAIL_CHECK("no tensor " << name);
    return nullptr;
  };
  {
    const auto plan = llvm::cantFail(planTensors(llvm::cantFail(modelShape("qwen2-7b")), TypeMix::kQ4_K_M));
    CHECK(find(plan, "token_embd.weight")->ne == std::vector<uint64_t>{3584, 152064});
    CHECK(find(plan, "output.weight")->ne == std::vector<uint64_t>{3584, 152064});
    CHECK(find(plan, "blk.27.attn_q.weight")->ne == std::vector<uint64_t>{3584, 3584});
    CHECK(find(plan, "blk.27.attn_k.weight")->ne == std::vector<uint64_t>{3584, 512});  // 4 kv heads x 128
    CHECK(find(plan, "blk.27.attn_v.bias")->ne == std::vector<uint64_t>{512});
    CHECK(find(plan, "blk.27.attn_q.bias")->ne == std::vector<uint64_t>{3584});
    CHECK(find(plan, "blk.0.ffn_down.weight")->ne == std::vector<uint64_t>{18944, 3584});
    CHECK(find(plan, "blk.0.ffn_gate.weight")->ne == std::vector<uint64_t>{3584, 18944});
  }
  {
    const auto plan = llvm::cantFail(planTensors(llvm::cantFail(modelShape("llama3-8b")), TypeMix::kQ6_K));
    CHECK(plan.size() == 3 + 32 * 9);
    CHECK(find(plan, "token_embd.weight")->ne == std::vector<uint64_t>{4096, 128256});
    CHECK(find(plan, "blk.31.attn_v.weight")->ne == std::vector<uint64_t>{4096, 1024});  // 8 kv heads x 128
    CHECK(find(plan, "blk.31.ffn_up.weight")->ne == std::vector<uint64_t>{4096, 14336});
  }
  {  // phi3-mini: fused attn_qkv (q 3072 + k 3072 + v 3072 rows) and gate|up ffn_up, no attn_q/k/v, ffn_gate
    const auto shape = llvm::cantFail(modelShape("phi3-mini"));
    CHECK(shape.arch == "phi3");
    CHECK(shape.headDim() == 96);
    const auto plan = llvm::cantFail(planTensors(shape, TypeMix::kQ4_K_M));
    CHECK(plan.size() == 3 + 32 * 6);
    CHECK(find(plan, "token_embd.weight")->ne == std::vector<uint64_t>{3072, 32064});
    CHECK(find(plan, "blk.0.attn_qkv.weight")->ne == std::vector<uint64_t>{3072, 9216});
    CHECK(find(plan, "blk.0.attn_output.weight")->ne == std::vector<uint64_t>{3072, 3072});
    CHECK(find(plan, "blk.0.ffn_up.weight")->ne == std::vector<uint64_t>{3072, 16384});
    CHECK(find(plan, "blk.0.ffn_down.weight")->ne == std::vector<uint64_t>{8192, 3072});
    for (const TensorPlan& t : plan)
      CHECK((t.name.find("attn_q.") == std::string::npos && t.name.find("ffn_gate") == std::string::npos));
    CHECK(find(plan, "blk.0.attn_qkv.weight")->type == GgmlType::Q6_K);  // attn_v's more-bits rule (layer 0 < n/8)
    CHECK(find(plan, "blk.8.attn_qkv.weight")->type == GgmlType::Q4_K);
  }
  {
    // qwen3-30b-a3b: q 32 x 128 = 4096 wide on n_embd 2048, q/k norms, F32 router, 3-D expert tensors.
    const auto plan = llvm::cantFail(planTensors(llvm::cantFail(modelShape("qwen3-30b-a3b")), TypeMix::kQ4_K_M));
    CHECK(plan.size() == 3 + 48 * 12);
    CHECK(find(plan, "blk.0.attn_q.weight")->ne == std::vector<uint64_t>{2048, 4096});
    CHECK(find(plan, "blk.0.attn_k.weight")->ne == std::vector<uint64_t>{2048, 512});
    CHECK(find(plan, "blk.0.attn_output.weight")->ne == std::vector<uint64_t>{4096, 2048});
    CHECK(find(plan, "blk.0.attn_q_norm.weight")->ne == std::vector<uint64_t>{128});
    CHECK(find(plan, "blk.5.ffn_gate_inp.weight")->ne == std::vector<uint64_t>{2048, 128});
    CHECK(find(plan, "blk.5.ffn_gate_inp.weight")->type == GgmlType::F32);
    CHECK(find(plan, "blk.5.ffn_up_exps.weight")->ne == std::vector<uint64_t>{2048, 768, 128});
    CHECK(find(plan, "blk.5.ffn_up_exps.weight")->type == GgmlType::Q4_K);
    CHECK(find(plan, "blk.5.ffn_down_exps.weight")->ne == std::vector<uint64_t>{768, 2048, 128});
    CHECK(find(plan, "blk.0.ffn_down_exps.weight")->type == GgmlType::Q6_K);  // "more bits" layer
    CHECK(find(plan, "blk.7.ffn_down_exps.weight")->type == GgmlType::Q4_K);
    for (const TensorPlan& t : plan) CHECK(t.name.find("ffn_gate.") == std::string::npos);  // experts only
  }
  auto llama3 = llvm::cantFail(modelShape("llama3-8b"));
  CHECK(llama3.rope_freq_base == 500000.0f);
  CHECK(llama3.n_head == 32);
  auto qwen = llvm::cantFail(modelShape("qwen2-7b"));
  CHECK(qwen.rope_freq_base == 1e6f);
  CHECK(qwen.rms_eps == 1e-6f);
  CHECK(qwen.arch == "qwen2");
  {
    // gemma2-9b: q is 16 x 256 = 4096 wide on n_embd 3584; sandwich norms; tied output, so token_embd is
    // typed as the output (Q6_K) and there is no output.weight. Q6_K attn_v / ffn_down in llama.cpp's
    // "more bits" layers for 42 layers (written out: i < 5, i >= 36, (i - 5) % 3 == 2).
    const std::set<uint32_t> want42 = {0, 1, 2, 3, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 36, 37, 38, 39, 40, 41};
    const auto plan = llvm::cantFail(planTensors(llvm::cantFail(modelShape("gemma2-9b")), TypeMix::kQ4_K_M));
    CHECK(plan.size() == 2 + 42 * 11);
    CHECK(find(plan, "token_embd.weight")->ne == std::vector<uint64_t>{3584, 256000});
    CHECK(find(plan, "token_embd.weight")->type == GgmlType::Q6_K);
    CHECK(find(plan, "blk.41.attn_q.weight")->ne == std::vector<uint64_t>{3584, 4096});
    CHECK(find(plan, "blk.41.attn_k.weight")->ne == std::vector<uint64_t>{3584, 2048});  // 8 kv heads x 256
    CHECK(find(plan, "blk.41.attn_output.weight")->ne == std::vector<uint64_t>{4096, 3584});
    CHECK(find(plan, "blk.41.post_attention_norm.weight")->ne == std::vector<uint64_t>{3584});
    CHECK(find(plan, "blk.41.post_ffw_norm.weight")->kind == TensorKind::kNorm);
    CHECK(find(plan, "blk.0.ffn_gate.weight")->ne == std::vector<uint64_t>{3584, 14336});
    CHECK(find(plan, "blk.0.ffn_down.weight")->ne == std::vector<uint64_t>{14336, 3584});
    int q6 = 0;
    for (const TensorPlan& t : plan) {
      CAPTURE(t.name);
      CHECK(t.name != "output.weight");
      CHECK(t.name.find("attn_q_norm") == std::string::npos);
      if (t.kind != TensorKind::kMatrix) continue;
      GgmlType want = t.name == "token_embd.weight" ? GgmlType::Q6_K : GgmlType::Q4_K;
      for (uint32_t i : want42)
        for (const char* role : {".attn_v.weight", ".ffn_down.weight"})
          if (t.name == "blk." + std::to_string(i) + role) want = GgmlType::Q6_K;
      CHECK(t.type == want);
      q6 += t.type == GgmlType::Q6_K;
    }
    CHECK(q6 == 1 + 2 * 21);
  }
  {  // gemma3-12b: gemma2's tensors plus the per-head q/k norms; q 16 x 256 = 4096 on n_embd 3840.
    const auto plan = llvm::cantFail(planTensors(llvm::cantFail(modelShape("gemma3-12b")), TypeMix::kQ4_K_M));
    CHECK(plan.size() == 2 + 48 * 13);
    CHECK(find(plan, "token_embd.weight")->ne == std::vector<uint64_t>{3840, 262208});
    CHECK(find(plan, "token_embd.weight")->type == GgmlType::Q6_K);
    CHECK(find(plan, "blk.47.attn_q.weight")->ne == std::vector<uint64_t>{3840, 4096});
    CHECK(find(plan, "blk.47.attn_v.weight")->ne == std::vector<uint64_t>{3840, 2048});
    CHECK(find(plan, "blk.47.attn_q_norm.weight")->ne == std::vector<uint64_t>{256});
    CHECK(find(plan, "blk.47.attn_k_norm.weight")->ne == std::vector<uint64_t>{256});
    CHECK(find(plan, "blk.0.ffn_up.weight")->ne == std::vector<uint64_t>{3840, 15360});
    CHECK(find(plan, "blk.0.ffn_down.weight")->type == GgmlType::Q6_K);   // 0 < 48/8
    CHECK(find(plan, "blk.6.ffn_down.weight")->type == GgmlType::Q4_K);   // (6 - 6) % 3 = 0
    CHECK(find(plan, "blk.8.attn_v.weight")->type == GgmlType::Q6_K);     // (8 - 6) % 3 = 2
    CHECK(find(plan, "blk.42.attn_v.weight")->type == GgmlType::Q6_K);    // 42 >= 7 * 48 / 8
    for (const TensorPlan& t : plan) CHECK(t.name != "output.weight");
  }
  auto unknown = modelShape("gpt-5");
  REQUIRE(!unknown);
  CHECK(llvm::toString(unknown.takeError()).find("tiny-llama, tiny-qwen2, qwen2-7b, llama3-8b, phi3-mini, qwen3-30b-a3b") !=
        std::string::npos);
  auto bad_mix = parseTypeMix("q3_k");
  REQUIRE(!bad_mix);
  CHECK(llvm::toString(bad_mix.takeError()).find("'q3_k'") != std::string::npos);
}

TEST_CASE("tiny models for every type mix read back with llama.cpp's names, shapes, types and metadata") {
  for (const std::string model : {"tiny-llama", "tiny-qwen2"}) {
    const bool qwen = model == "tiny-qwen2";
    const std::string a = qwen ? "qwen2." : "llama.";
    for (TypeMix mix : kMixes) {
      CAPTURE(model);
      CAPTURE(typeMixName(mix));
      auto f = parseBytes(synthBytes(model, mix, 7), model + ".gguf");
      REQUIRE(f);
      CHECK(*f->getString("general.architecture") == (qwen ? "qwen2" : "llama"));
      CHECK(*f->getU32(a + "embedding_length") == 256);
      CHECK(*f->getU32(a + "block_count") == 2);
      CHECK(*f->getU32(a + "attention.head_count") == 4);
      CHECK(*f->getU32(a + "attention.head_count_kv") == 2);
      CHECK(*f->getU32(a + "feed_forward_length") == 512);
      CHECK(*f->getU32(a + "context_length") == 2048);
      CHECK(*f->getF32(a + "rope.freq_base") == (qwen ? 1e6f : 10000.0f));
      CHECK(*f->getF32(a + "attention.layer_norm_rms_epsilon") == (qwen ? 1e-6f : 1e-5f));
      const auto tokens = *f->getStringArray("tokenizer.ggml.tokens");
      REQUIRE(tokens.size() == 512);
      CHECK(tokens[0] == "<unk>");
      CHECK(tokens[1] == "<s>");
      CHECK(tokens[3] == "<0x00>");
      CHECK(tokens[258] == "<0xFF>");
      CHECK(std::set<std::string_view>(tokens.begin(), tokens.end()).size() == 512);
      CHECK(f->getF32Array("tokenizer.ggml.scores")->size() == 512);
      CHECK(f->getI32Array("tokenizer.ggml.token_type")->at(100) == 6);
      CHECK(*f->getU32("tokenizer.ggml.bos_token_id") == 1);
      CHECK(*f->getU32("tokenizer.ggml.eos_token_id") == 2);

      CHECK(f->tensors().size() == (qwen ? 3 + 2 * 12 : 3 + 2 * 9));
      for (const auto& t : f->tensors()) {
        CAPTURE(t.name);
        CHECK(t.type == expectedTinyType(mix, std::string(t.name)));
      }
      CHECK(f->findTensor("token_embd.weight")->ne[0] == 256);
      CHECK(f->findTensor("token_embd.weight")->ne[1] == 512);
      CHECK(f->findTensor("blk.1.attn_k.weight")->ne[1] == 128);
      CHECK(f->findTensor("blk.1.ffn_down.weight")->ne[0] == 512);
      CHECK(f->findTensor("blk.1.ffn_down.weight")->ne[1] == 256);
      CHECK((f->findTensor("blk.0.attn_v.bias") != nullptr) == qwen);

      // llama.cpp's own file for the same model and mix: same tensors, shapes, types, hyperparameters.
      const char* fixture = fixtureFor(model, mix);
      if (!fixture || !minfer::test::haveFixtures()) continue;
      auto ref = GgufFile::open(minfer::test::fixturesDir() + "/models/" + fixture);
      REQUIRE_MESSAGE(ref, llvm::toString(ref.takeError()));
      const GgufFile& r = **ref;
      checkSameTensors(*f, r);
      for (const char* key : {"context_length", "embedding_length", "block_count", "feed_forward_length",
                              "attention.head_count", "attention.head_count_kv"})
        CHECK(*f->getU32(a + key) == *r.getU32(a + key));
      CHECK(*f->getF32(a + "rope.freq_base") == *r.getF32(a + "rope.freq_base"));
      CHECK(*f->getF32(a + "attention.layer_norm_rms_epsilon") == *r.getF32(a + "attention.layer_norm_rms_epsilon"));
      CHECK(*f->getU32("general.file_type") == *r.getU32("general.file_type"));
      CHECK(r.getStringArray("tokenizer.ggml.tokens")->size() == tokens.size());
    }
  }
}

namespace {

// Metadata keys under "<arch>." of a GGUF.
std::set<std::string> archKeys(const GgufFile& f, const std::string& arch) {
  std::set<std::string> keys;
  for (const auto& kv : f.metadata()) {
    const std::string key(kv.key);
    if (key.rfind(arch + ".", 0) == 0) keys.insert(key.substr(arch.size() + 1));
  }
  return keys;
}

// A gemma benchmark shape at the sizes of its tiny fixture (fixtures README §8.1): the benchmark shape's
// keys and tensor list, the fixture's dimensions.
ModelShape atTinyGemmaSize(const std::string& model, uint32_t n_layer) {
  ModelShape s = llvm::cantFail(modelShape(model));
  s.n_embd = 256, s.n_layer = n_layer, s.n_head = 2, s.n_head_kv = 1, s.head_dim = 64, s.n_ff = 128, s.n_vocab = 512;
  return s;
}

}  // namespace

TEST_CASE("gemma2-9b and gemma3-12b: the real models' keys as llama.cpp's converter writes them") {
  // Real hyperparameters, smaller sizes (K-quant rows stay multiples of 256; q is 16 x 256 wide).
  for (const std::string model : {"gemma2-9b", "gemma3-12b"}) {
    CAPTURE(model);
    ModelShape shape = llvm::cantFail(modelShape(model));
    const bool g3 = model == "gemma3-12b";
    const std::string arch = g3 ? "gemma3" : "gemma2", a = arch + ".";
    CHECK(shape.arch == arch);
    CHECK(shape.n_layer == (g3 ? 48u : 42u));
    CHECK(shape.n_embd == (g3 ? 3840u : 3584u));
    CHECK(shape.n_ff == (g3 ? 15360u : 14336u));
    shape.n_layer = 2, shape.n_embd = 256, shape.n_ff = 256, shape.n_vocab = 300;
    auto f = parseBytes(synthBytes(shape, TypeMix::kQ4_K_M, 5), model + ".gguf");
    REQUIRE(f);
    CHECK(*f->getString("general.architecture") == arch);
    CHECK(*f->getU32(a + "context_length") == (g3 ? 131072u : 8192u));
    CHECK(*f->getU32(a + "attention.head_count") == 16);
    CHECK(*f->getU32(a + "attention.head_count_kv") == 8);
    CHECK(*f->getU32(a + "attention.key_length") == 256);
    CHECK(*f->getU32(a + "attention.value_length") == 256);
    CHECK(*f->getF32(a + "attention.layer_norm_rms_epsilon") == 1e-6f);
    CHECK(*f->getU32(a + "attention.sliding_window") == (g3 ? 1024u : 4096u));
    CHECK(*f->getU32("general.file_type") == 15);
    CHECK(f->findTensor("output.weight") == nullptr);
    CHECK(f->findTensor("token_embd.weight")->type == GgmlType::Q6_K);
    CHECK(f->findTensor("blk.1.post_ffw_norm.weight")->ne[0] == 256);
    CHECK((f->findTensor("blk.1.attn_k_norm.weight") != nullptr) == g3);
    if (!g3) {
      CHECK(*f->getF32(a + "attn_logit_softcapping") == 50.0f);
      CHECK(*f->getF32(a + "final_logit_softcapping") == 30.0f);
      CHECK(f->find(a + "rope.freq_base") == nullptr);  // llama.cpp's default 10000 is Gemma 2's rope_theta
    } else {
      CHECK(*f->getF32(a + "rope.freq_base") == 1e6f);
      CHECK(*f->getString(a + "rope.scaling.type") == "linear");
      CHECK(*f->getF32(a + "rope.scaling.factor") == 8.0f);
      // Absent as in real gemma3 files: llama.cpp's period 6 and local base 10000 are Gemma 3's values.
      CHECK(f->find(a + "attention.sliding_window_pattern") == nullptr);
      CHECK(f->find(a + "rope.freq_base_swa") == nullptr);
      CHECK(f->find(a + "attn_logit_softcapping") == nullptr);
      CHECK(f->find(a + "final_logit_softcapping") == nullptr);
    }
  }
}

TEST_CASE("gemma2-9b and gemma3-12b at the tiny gemma fixtures' sizes: llama.cpp's tensors, types and keys") {
  // Oracle: llama.cpp's Q8_0 files (every matrix Q8_0, tied token_embd included; no K-quant fallbacks).
  if (!minfer::test::haveFixtures()) return;
  for (const auto& [model, fixture, n_layer] :
       {std::tuple<std::string, std::string, uint32_t>{"gemma2-9b", "tiny-gemma2-Q8_0.gguf", 2},
        {"gemma3-12b", "tiny-gemma3-Q8_0.gguf", 3}}) {
    CAPTURE(model);
    auto f = parseBytes(synthBytes(atTinyGemmaSize(model, n_layer), TypeMix::kQ8_0, 3), model + ".gguf");
    REQUIRE(f);
    auto ref = GgufFile::open(minfer::test::fixturesDir() + "/arch/models/" + fixture);
    REQUIRE_MESSAGE(ref, llvm::toString(ref.takeError()));
    const GgufFile& r = **ref;
    checkSameTensors(*f, r);
    // The same architecture keys, except the two the fixture writes on purpose (§8.1: pattern 3 and the
    // local base) and real gemma3 files lack; the fixture gemma2 lacks rope.freq_base as real files do.
    const std::string arch(*r.getString("general.architecture"));
    std::set<std::string> want = archKeys(r, arch);
    want.erase("attention.sliding_window_pattern");
    want.erase("rope.freq_base_swa");
    CHECK(archKeys(*f, arch) == want);
    for (const auto& key : want) {
      CAPTURE(key);
      CHECK(f->find(arch + "." + key)->value.type == r.find(arch + "." + key)->value.type);
    }
  }
}

TEST_CASE("synthetic weights are finite, centred and about 0.02 wide for every type") {
  for (TypeMix mix : kMixes) {
    CAPTURE(typeMixName(mix));
    auto f = parseBytes(synthBytes("tiny-qwen2", mix, 11), "weights.gguf");
    REQUIRE(f);
    for (const auto& t : f->tensors()) {
      CAPTURE(t.name);
      const std::vector<double> v = dequantize(*f, t);
      REQUIRE(v.size() == t.elements());
      double sum = 0, sum2 = 0;
      bool finite = true;
      for (double x : v) {
        finite &= std::isfinite(x);
        sum += x;
      }
      CHECK(finite);
      const double mean = sum / static_cast<double>(v.size());
      for (double x : v) sum2 += (x - mean) * (x - mean);
      const double stddev = std::sqrt(sum2 / static_cast<double>(v.size()));
      // Sampling error of the mean (5 sigma) plus Q4_0's own offset (q - 8 spans -8..7: mean -d/2).
      const double tolerance = 5 * 0.02 / std::sqrt(static_cast<double>(v.size())) + 0.003;
      const bool norm = std::string(t.name).find("norm") != std::string::npos;
      CHECK(std::abs(mean - (norm ? 1.0 : 0.0)) < tolerance);
      CHECK(stddev > 0.01);
      CHECK(stddev < 0.035);
    }
  }
}

TEST_CASE("same seed gives identical bytes (any thread count or chunking); another seed changes every tensor") {
  for (TypeMix mix : {TypeMix::kQ4_K_M, TypeMix::kF16, TypeMix::kQ8_0}) {
    CAPTURE(typeMixName(mix));
    const std::vector<uint8_t> a = synthBytes("tiny-llama", mix, 42, 1);
    CHECK(synthBytes("tiny-llama", mix, 42, 4, nullptr, nullptr, 1000) == a);
    const std::vector<uint8_t> b = synthBytes("tiny-llama", mix, 43, 1);
    REQUIRE(a.size() == b.size());
    CHECK(a != b);
    auto fa = parseBytes(a, "a.gguf"), fb = parseBytes(b, "b.gguf");
    REQUIRE(fa);
    REQUIRE(fb);
    for (size_t k = 0; k < fa->tensors().size(); ++k) {
      const auto da = fa->tensorData(fa->tensors()[k]), db = fb->tensorData(fb->tensors()[k]);
      CHECK_MESSAGE(std::memcmp(da.data(), db.data(), da.size()) != 0, fa->tensors()[k].name);
    }
    // Tensors of one file differ from each other too (seeds depend on the name).
    const auto& t0 = fa->tensors()[fa->tensors().size() - 1];
    const auto* t1 = fa->findTensor("token_embd.weight");
    if (t0.type == t1->type)
      CHECK(std::memcmp(fa->tensorData(t0).data(), fa->tensorData(*t1).data(), t0.size) != 0);
  }
  // Threads actually split large tensors: 4096 blocks per thread minimum, so use a larger chunk.
  std::vector<uint8_t> one(144 * 20000), many(144 * 20000);
  fillBlocks(GgmlType::Q4_K, TensorKind::kMatrix, 99, 5, one, 1);
  fillBlocks(GgmlType::Q4_K, TensorKind::kMatrix, 99, 5, many, 4);
  CHECK(one == many);
  std::vector<uint8_t> shifted(144 * 19999);
  fillBlocks(GgmlType::Q4_K, TensorKind::kMatrix, 99, 6, shifted, 3);
  CHECK(std::memcmp(shifted.data(), one.data() + 144, shifted.size()) == 0);
}

TEST_CASE("--vocab copies every tokenizer key and sets n_vocab from it") {
  GgufWriter v;
  v.setString("general.architecture", "llama");
  v.setU32("llama.block_count", 99);
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  for (int i = 0; i < 297; ++i) tokens.push_back("tok" + std::to_string(i));
  v.setString("tokenizer.ggml.model", "gpt2");
  v.setString("tokenizer.ggml.pre", "qwen2");
  v.setStringArray("tokenizer.ggml.tokens", tokens);
  v.setStringArray("tokenizer.ggml.merges", {"t o", "to k"});
  v.setU32("tokenizer.ggml.eos_token_id", 2);
  v.setString("tokenizer.chat_template", "{{ messages }}");
  auto vocab = parseBytes(llvm::cantFail(v.toBytes()), "vocab.gguf");
  REQUIRE(vocab);

  std::vector<std::string> notes;
  auto f = parseBytes(synthBytes("tiny-qwen2", TypeMix::kQ4_K_M, 3, 2, vocab.get(), &notes), "with-vocab.gguf");
  REQUIRE(f);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].find("512 -> 300") != std::string::npos);
  CHECK(notes[0].find("vocab.gguf") != std::string::npos);
  CHECK(f->findTensor("token_embd.weight")->ne[1] == 300);
  CHECK(f->findTensor("output.weight")->ne[1] == 300);
  CHECK(*f->getU32("qwen2.block_count") == 2);  // only tokenizer.* keys are copied
  CHECK(*f->getString("tokenizer.ggml.model") == "gpt2");
  CHECK(*f->getString("tokenizer.ggml.pre") == "qwen2");
  CHECK(*f->getString("tokenizer.chat_template") == "{{ messages }}");
  CHECK(f->getStringArray("tokenizer.ggml.merges")->at(1) == "to k");
  const auto got = *f->getStringArray("tokenizer.ggml.tokens");
  REQUIRE(got.size() == tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) CHECK(got[i] == tokens[i]);
  CHECK(f->find("tokenizer.ggml.scores") == nullptr);  // the built-in tokenizer is not mixed in

  GgufWriter empty;
  empty.setString("general.architecture", "llama");
  auto no_tokens = parseBytes(llvm::cantFail(empty.toBytes()), "no-tokens.gguf");
  REQUIRE(no_tokens);
  SynthOptions o;
  o.shape = llvm::cantFail(modelShape("tiny-llama"));
  o.vocab = no_tokens.get();
  GgufWriter w;
  llvm::Error err = buildSynthModel(o, w, nullptr);
  REQUIRE(static_cast<bool>(err));
  const std::string message = llvm::toString(std::move(err));
  CHECK(message.find("tokenizer.ggml.tokens") != std::string::npos);
  CHECK(message.find("no-tokens.gguf") != std::string::npos);
}

TEST_CASE("a real vocabulary GGUF (llama-spm, 32000 tokens) becomes the model's tokenizer") {
  if (!minfer::test::haveFixtures()) return;
  auto vocab = GgufFile::open(minfer::test::fixturesDir() + "/tokenizer/ggml-vocab-llama-spm.gguf");
  REQUIRE_MESSAGE(vocab, llvm::toString(vocab.takeError()));
  std::vector<std::string> notes;
  auto f = parseBytes(synthBytes("tiny-llama", TypeMix::kQ4_K_M, 5, 2, vocab->get(), &notes), "spm.gguf");
  REQUIRE(f);
  CHECK(f->findTensor("token_embd.weight")->ne[1] == 32000);
  CHECK(notes.size() == 1);
  for (const auto& kv : (*vocab)->metadata()) {
    if (!llvm::StringRef(kv.key.data(), kv.key.size()).startswith("tokenizer.")) continue;
    CAPTURE(kv.key);
    const auto* mine = f->find(llvm::StringRef(kv.key.data(), kv.key.size()));
    REQUIRE(mine);
    CHECK(mine->value.type == kv.value.type);
    CHECK(mine->value.count == kv.value.count);
  }
  CHECK(f->getStringArray("tokenizer.ggml.tokens")->at(31999) == (*vocab)->getStringArray("tokenizer.ggml.tokens")->at(31999));
  CHECK(f->getF32Array("tokenizer.ggml.scores")->at(1000) == (*vocab)->getF32Array("tokenizer.ggml.scores")->at(1000));
}

TEST_CASE("a synthetic model written to disk equals the in-memory bytes") {
  SynthOptions o;
  o.shape = llvm::cantFail(modelShape("tiny-llama"));
  o.mix = TypeMix::kQ6_K;
  o.seed = 9;
  o.threads = 3;
  GgufWriter w;
  llvm::cantFail(buildSynthModel(o, w, nullptr));
  const std::string path = minfer::test::scratchDir() + "/synth-q6_k.gguf";
  llvm::cantFail(w.write(path));
  CHECK(minfer::test::readFile(path) == llvm::cantFail(w.toBytes()));
  std::filesystem::remove(path);
}
