// GGUF reader on the real fixture models: metadata, tensor infos and data ranges as the fixtures README states.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "compiler/gguf/gguf_reader.h"
#include "tests/test_support.h"

using minfer::GgmlType;
using minfer::gguf::GgufFile;

namespace {

std::unique_ptr<GgufFile> openModel(const std::string& name) {
  auto file = GgufFile::open(minfer::test::fixturesDir() + "/models/" + name);
  if (!file) {
    FAIL_CHECK(llvm::toString(file.takeError()));
    return nullptr;
  }
  return std::move(*file);
}

}  // namespace

TEST_CASE("stories260K: hyperparameters, vocabulary and tensors") {
  if (!minfer::test::haveFixtures()) return;
  auto f = openModel("stories260K.gguf");
  REQUIRE(f);
  CHECK(f->version() == 3);
  CHECK(*f->getString("general.architecture") == "llama");
  CHECK(*f->getU32("llama.embedding_length") == 64);
  CHECK(*f->getU32("llama.block_count") == 5);
  CHECK(*f->getU32("llama.attention.head_count") == 8);
  CHECK(*f->getU32("llama.attention.head_count_kv") == 4);
  CHECK(*f->getU32("llama.feed_forward_length") == 172);
  CHECK(*f->getF32("llama.attention.layer_norm_rms_epsilon") == doctest::Approx(1e-5));
  auto tokens = f->getStringArray("tokenizer.ggml.tokens");
  REQUIRE(tokens);
  CHECK(tokens->size() == 512);
  CHECK((*tokens)[1] == "<s>");
  CHECK((*tokens)[3] == "<0x00>");
  CHECK(f->getF32Array("tokenizer.ggml.scores")->size() == 512);
  CHECK(f->getI32Array("tokenizer.ggml.token_type")->size() == 512);
  // 2 global matrices + output_norm + 9 tensors per layer.
  CHECK(f->tensors().size() == 3 + 5 * 9);
  const auto* gate = f->findTensor("blk.0.ffn_gate.weight");
  REQUIRE(gate);
  CHECK(gate->type == GgmlType::F32);
  CHECK(gate->cols() == 64);
  CHECK(gate->rows() == 172);
  CHECK(gate->size == 64 * 172 * 4);
  CHECK(f->tensorData(*gate).size() == gate->size);
  CHECK(gate->offset % f->alignment() == 0);
}

TEST_CASE("every fixture model parses; tensors lie inside the file and match their types") {
  if (!minfer::test::haveFixtures()) return;
  int models = 0;
  for (const auto& entry : std::filesystem::directory_iterator(minfer::test::fixturesDir() + "/models")) {
    if (entry.path().extension() != ".gguf") continue;
    ++models;
    CAPTURE(entry.path().string());
    auto f = openModel(entry.path().filename().string());
    REQUIRE(f);
    CHECK(f->tensors().size() > 10);
    for (const auto& t : f->tensors()) {
      const auto traits = minfer::ggmlTypeTraits(t.type);
      CHECK(traits.supported);
      CHECK(t.size == t.elements() / traits.block_size * traits.type_size);
      CHECK(f->dataOffset() + t.offset + t.size <= f->fileSize());
    }
  }
  CHECK(models == 19);
}

TEST_CASE("tiny-llama-Q4_K_M has llama.cpp's Q4_K_M type mix") {
  if (!minfer::test::haveFixtures()) return;
  auto f = openModel("tiny-llama-Q4_K_M.gguf");
  REQUIRE(f);
  CHECK(f->findTensor("output.weight")->type == GgmlType::Q6_K);
  CHECK(f->findTensor("blk.1.attn_v.weight")->type == GgmlType::Q6_K);
  CHECK(f->findTensor("blk.1.ffn_down.weight")->type == GgmlType::Q6_K);
  CHECK(f->findTensor("blk.0.attn_v.weight")->type == GgmlType::Q4_K);
  CHECK(f->findTensor("token_embd.weight")->type == GgmlType::Q4_K);
  CHECK(f->findTensor("blk.0.attn_norm.weight")->type == GgmlType::F32);
  const auto* down = f->findTensor("blk.1.ffn_down.weight");
  CHECK(down->cols() == 512);
  CHECK(down->rows() == 256);
}

TEST_CASE("typed accessors name the key and the types") {
  if (!minfer::test::haveFixtures()) return;
  auto f = openModel("stories260K.gguf");
  REQUIRE(f);
  auto missing = f->getU32("llama.no_such_key");
  REQUIRE(!missing);
  const std::string m1 = llvm::toString(missing.takeError());
  CHECK(m1.find("llama.no_such_key") != std::string::npos);
  CHECK(m1.find("missing") != std::string::npos);
  auto wrong = f->getU32("general.architecture");
  REQUIRE(!wrong);
  const std::string m2 = llvm::toString(wrong.takeError());
  CHECK(m2.find("STRING") != std::string::npos);
  CHECK(m2.find("general.architecture") != std::string::npos);
  CHECK(*f->getU32Or("llama.no_such_key", 77) == 77);
}
