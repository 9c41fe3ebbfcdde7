// GGUF writer round trips and the reader's named corruption cases, built from a writer-made model.
//
// Every corrupt file is derived from one valid file (a small llama-like model: tensors of six types,
// rows != cols, several blocks per row, string arrays, nested arrays). Each case states the words the
// reader's error must contain (the field and the numbers involved), and the byte offset it must name
// where that offset is known from the writer's layout.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "compiler/gguf/gguf_reader.h"
#include "compiler/gguf/gguf_writer.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "tests/test_support.h"

using minfer::GgmlType;
using minfer::gguf::GgufFile;
using minfer::gguf::GgufLayout;
using minfer::gguf::GgufWriter;
using minfer::gguf::MetaValue;
using minfer::gguf::ValueType;

namespace {

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<uint8_t> randomBytes(uint64_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  uint64_t s = seed;
  for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(splitmix64(&s) >> 56);
  return out;
}

uint64_t dataSize(GgmlType t, const std::vector<uint64_t>& ne) {
  auto size = GgufWriter::tensorDataSize(t, ne);
  REQUIRE(size);
  return *size;
}

struct TensorSpec {
  const char* name;
  GgmlType type;
  std::vector<uint64_t> ne;
};

// Tensors of the base model: rows != cols, several blocks per row, 1-D, 2-D and 3-D.
const std::vector<TensorSpec>& baseTensors() {
  static const std::vector<TensorSpec> specs = {
      {"token_embd.weight", GgmlType::Q4_K, {768, 40}},         // 3 super-blocks per row
      {"blk.0.attn_norm.weight", GgmlType::F32, {768}},
      {"blk.0.attn_q.weight", GgmlType::Q8_0, {768, 24}},       // 24 blocks per row
      {"blk.0.attn_k.weight", GgmlType::F16, {96, 20}},
      {"blk.0.ffn_down.weight", GgmlType::Q6_K, {512, 48}},     // 2 super-blocks per row
      {"blk.0.ffn_gate_exps.weight", GgmlType::F32, {64, 3, 2}},
      {"output.weight", GgmlType::Q4_0, {768, 40}},
  };
  return specs;
}

std::vector<uint8_t> tensorBytes(size_t k) {
  const TensorSpec& s = baseTensors()[k];
  return randomBytes(dataSize(s.type, s.ne), 1000 + k);
}

std::vector<std::string> tokenList() {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  for (int i = 0; i < 37; ++i) tokens.push_back("\xE2\x96\x81tok" + std::to_string(i * 7));
  return tokens;
}

MetaValue nestedValue() {
  std::vector<MetaValue> inner = {MetaValue::i32Array({-1, 7}), MetaValue::f32Array({})};
  return MetaValue::arrayOfArrays({
      MetaValue::scalarArray(ValueType::UINT8, {1, 2, 3}),
      MetaValue::stringArray({"x", "yz", ""}),
      MetaValue::arrayOfArrays(std::move(inner)),
  });
}

// The valid base model, before any tensors or extra keys are added.
GgufWriter baseWriter(uint32_t version = 3) {
  GgufWriter w(version);
  w.setString("general.architecture", "llama");
  w.setString("general.name", "corruption-base");
  w.setU32("general.alignment", 32);
  w.setU32("llama.block_count", 1);
  w.setU32("llama.context_length", 4096);
  w.setU32("llama.embedding_length", 768);
  w.setF32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.setF32("llama.rope.freq_base", 10000.0f);
  w.setString("tokenizer.ggml.model", "llama");
  const std::vector<std::string> tokens = tokenList();
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (size_t i = 0; i < tokens.size(); ++i) {
    scores.push_back(-0.25f * static_cast<float>(i));
    types.push_back(i < 3 ? 3 : 1);
  }
  w.setStringArray("tokenizer.ggml.tokens", tokens);
  w.setF32Array("tokenizer.ggml.scores", scores);
  w.setI32Array("tokenizer.ggml.token_type", types);
  w.setBool("tokenizer.ggml.add_bos_token", true);
  w.setU8("test.u8", 200);
  w.setI8("test.i8", -100);
  w.setU16("test.u16", 60000);
  w.setI16("test.i16", -30000);
  w.setI32("test.i32", -2000000000);
  w.setU64("test.u64", 0xFEDCBA9876543210ull);
  w.setI64("test.i64", -0x123456789ABCDEFll);
  w.setF64("test.f64", -2.5e-300);
  w.setBool("test.false", false);
  w.setString("test.empty_string", "");
  w.set("test.u64_array", MetaValue::scalarArray(ValueType::UINT64, randomBytes(5 * 8, 77)));
  w.set("test.nested", nestedValue());
  return w;
}

void addBaseTensors(GgufWriter& w) {
  for (size_t k = 0; k < baseTensors().size(); ++k) {
    const TensorSpec& s = baseTensors()[k];
    w.addTensor(s.name, s.type, s.ne, tensorBytes(k));
  }
}

struct Base {
  std::vector<uint8_t> bytes;
  GgufLayout layout;
};

const Base& base() {
  static const Base b = [] {
    GgufWriter w = baseWriter();
    addBaseTensors(w);
    Base out;
    out.bytes = llvm::cantFail(w.toBytes());
    out.layout = llvm::cantFail(w.layout());
    return out;
  }();
  return b;
}

llvm::Expected<std::unique_ptr<GgufFile>> parseBytes(const std::vector<uint8_t>& bytes, const std::string& name) {
  auto buffer = llvm::MemoryBuffer::getMemBufferCopy(
      llvm::StringRef(reinterpret_cast<const char*>(bytes.data()), bytes.size()), name);
  return GgufFile::parse(std::move(buffer), name);
}

void patchU32(std::vector<uint8_t>& b, uint64_t at, uint32_t v) { std::memcpy(b.data() + at, &v, 4); }
void patchU64(std::vector<uint8_t>& b, uint64_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); }

// "" for success, else the error's message (consumes the error).
std::string errorText(llvm::Error e) { return e ? llvm::toString(std::move(e)) : std::string(); }

std::string hex(uint64_t v) { return llvm::formatv("{0:x}", v).str(); }

const minfer::gguf::KvOffsets& kvAt(const char* key) {
  const auto* kv = base().layout.kv(key);
  REQUIRE_MESSAGE(kv, key);
  return *kv;
}
const minfer::gguf::TensorInfoOffsets& tensorAt(const char* name) {
  const auto* t = base().layout.tensor(name);
  REQUIRE_MESSAGE(t, name);
  return *t;
}

// Parses `bytes` as `name`; the parse must fail and the message name the file, contain every word,
// and (when at_offset is given) name that byte offset.
void expectError(const std::string& name, const std::vector<uint8_t>& bytes, const std::vector<std::string>& words,
                 std::optional<uint64_t> at_offset = std::nullopt) {
  auto file = parseBytes(bytes, name);
  if (file) {
    FAIL_CHECK("case '" << name << "' parsed without error; expected: " << words.front());
    return;
  }
  const std::string message = llvm::toString(file.takeError());
  INFO("case '" << name << "': " << message);
  CHECK(message.rfind(name + ": ", 0) == 0);
  for (const std::string& w : words) CHECK_MESSAGE(message.find(w) != std::string::npos, "missing '" << w << "'");
  if (at_offset) CHECK_MESSAGE(message.find("at offset " + hex(*at_offset)) != std::string::npos,
                               "expected offset " << hex(*at_offset));
}

std::vector<uint8_t> buildInvalid(const std::function<void(GgufWriter&)>& edit) {
  GgufWriter w = baseWriter();
  w.setValidate(false);
  addBaseTensors(w);
  edit(w);
  return llvm::cantFail(w.toBytes());
}

// ---------------------------------------------------------------------------------------------
// Comparison of a parsed value with the value that was written.

void checkSameValue(const MetaValue& want, const minfer::gguf::Value& got, const std::string& where) {
  INFO(where);
  REQUIRE(got.type == want.type);
  switch (want.type) {
    case ValueType::STRING:
      CHECK(got.str == want.str);
      return;
    case ValueType::ARRAY: {
      REQUIRE(got.elem_type == want.elem_type);
      REQUIRE(got.count == want.count);
      if (want.elem_type == ValueType::STRING) {
        REQUIRE(got.strings.size() == want.strings.size());
        for (size_t k = 0; k < want.strings.size(); ++k) CHECK(got.strings[k] == want.strings[k]);
      } else if (want.elem_type == ValueType::ARRAY) {
        REQUIRE(got.arrays.size() == want.arrays.size());
        for (size_t k = 0; k < want.arrays.size(); ++k)
          checkSameValue(want.arrays[k], got.arrays[k], where + "[" + std::to_string(k) + "]");
      } else if (!want.raw.empty()) {
        REQUIRE(got.raw != nullptr);
        CHECK(std::memcmp(got.raw, want.raw.data(), want.raw.size()) == 0);
      }
      return;
    }
    case ValueType::FLOAT32: {
      float f;
      std::memcpy(&f, &want.bits, 4);
      CHECK(got.f == static_cast<double>(f));
      return;
    }
    case ValueType::FLOAT64: {
      double f;
      std::memcpy(&f, &want.bits, 8);
      CHECK(got.f == f);
      return;
    }
    case ValueType::INT8: CHECK(got.i == static_cast<int8_t>(want.bits)); return;
    case ValueType::INT16: CHECK(got.i == static_cast<int16_t>(want.bits)); return;
    case ValueType::INT32: CHECK(got.i == static_cast<int32_t>(want.bits)); return;
    case ValueType::INT64: CHECK(got.i == static_cast<int64_t>(want.bits)); return;
    default: CHECK(got.u == want.bits); return;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Round trips.

TEST_CASE("writer -> reader round trip gives back every key, value and tensor (v2 and v3)") {
  for (uint32_t version : {2u, 3u}) {
    CAPTURE(version);
    GgufWriter w = baseWriter(version);
    addBaseTensors(w);
    const std::vector<uint8_t> bytes = llvm::cantFail(w.toBytes());
    const GgufLayout layout = llvm::cantFail(w.layout());
    CHECK(layout.file_size == bytes.size());
    auto parsed = parseBytes(bytes, "roundtrip.gguf");
    REQUIRE_MESSAGE(parsed, llvm::toString(parsed.takeError()));
    const GgufFile& f = **parsed;
    CHECK(f.version() == version);
    CHECK(f.alignment() == 32);
    CHECK(f.dataOffset() == layout.data_start);
    CHECK(layout.data_start % 32 == 0);

    REQUIRE(f.metadata().size() == w.kvCount());
    REQUIRE(layout.kvs.size() == w.kvCount());
    for (size_t k = 0; k < layout.kvs.size(); ++k) {
      const auto& kv = f.metadata()[k];
      CHECK(kv.key == layout.kvs[k].key);
      CHECK(kv.offset == layout.kvs[k].key_length);
      CHECK(kv.value.offset == layout.kvs[k].value);
      const MetaValue* want = w.get(layout.kvs[k].key);
      REQUIRE(want);
      checkSameValue(*want, kv.value, layout.kvs[k].key);
    }
    CHECK(*f.getString("general.name") == "corruption-base");
    CHECK(*f.getI64("test.i64") == -0x123456789ABCDEFll);
    CHECK(*f.getU64("test.u64") == 0xFEDCBA9876543210ull);
    CHECK(f.getStringArray("tokenizer.ggml.tokens")->at(5) == tokenList()[5]);
    CHECK(f.getF32Array("tokenizer.ggml.scores")->at(9) == -2.25f);

    REQUIRE(f.tensors().size() == baseTensors().size());
    for (size_t k = 0; k < baseTensors().size(); ++k) {
      const TensorSpec& s = baseTensors()[k];
      const auto& t = f.tensors()[k];
      CAPTURE(s.name);
      CHECK(t.name == s.name);
      CHECK(t.type == s.type);
      REQUIRE(t.n_dims == s.ne.size());
      for (size_t d = 0; d < 4; ++d) CHECK(t.ne[d] == (d < s.ne.size() ? s.ne[d] : 1));
      CHECK(t.info_offset == layout.tensors[k].name_length);
      CHECK(f.dataOffset() + t.offset == layout.tensors[k].data);
      CHECK(t.offset % 32 == 0);
      const std::vector<uint8_t> want = tensorBytes(k);
      CHECK(t.size == want.size());
      const auto got = f.tensorData(t);
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
    }
  }
}

TEST_CASE("version is the only difference between v2 and v3 files") {
  GgufWriter w2 = baseWriter(2), w3 = baseWriter(3);
  addBaseTensors(w2);
  addBaseTensors(w3);
  std::vector<uint8_t> b2 = llvm::cantFail(w2.toBytes()), b3 = llvm::cantFail(w3.toBytes());
  REQUIRE(b2.size() == b3.size());
  CHECK(b2[4] == 2);
  CHECK(b3[4] == 3);
  b2[4] = 3;
  CHECK(b2 == b3);
}

TEST_CASE("a larger general.alignment moves the data section and every tensor offset") {
  GgufWriter w = baseWriter();
  w.setU32("general.alignment", 256);
  addBaseTensors(w);
  const std::vector<uint8_t> bytes = llvm::cantFail(w.toBytes());
  auto parsed = parseBytes(bytes, "align256.gguf");
  REQUIRE_MESSAGE(parsed, llvm::toString(parsed.takeError()));
  CHECK((*parsed)->alignment() == 256);
  CHECK((*parsed)->dataOffset() % 256 == 0);
  for (const auto& t : (*parsed)->tensors()) CHECK(t.offset % 256 == 0);
  // 768*4 bytes of attn_norm are not a multiple of 256: the next tensor must have been padded.
  CHECK((*parsed)->tensors()[2].offset == (*parsed)->tensors()[1].offset + 3072);
  CHECK((*parsed)->tensors()[3].offset % 256 == 0);
}

TEST_CASE("streamed tensors (producer callbacks, small chunks) equal owned ones; write() renames into place") {
  GgufWriter owned = baseWriter();
  addBaseTensors(owned);
  GgufWriter streamed = baseWriter();
  streamed.setChunkBytes(1000);  // rounded down to whole blocks: chunks of several sizes
  std::vector<std::vector<uint64_t>> calls(baseTensors().size());
  for (size_t k = 0; k < baseTensors().size(); ++k) {
    const TensorSpec& s = baseTensors()[k];
    const uint64_t block_bytes = minfer::ggmlTypeTraits(s.type).type_size;
    streamed.addTensor(s.name, s.type, s.ne, dataSize(s.type, s.ne),
                       [k, block_bytes, &calls](uint64_t offset, llvm::MutableArrayRef<uint8_t> out) -> llvm::Error {
                         CHECK(offset % block_bytes == 0);
                         calls[k].push_back(offset);
                         const std::vector<uint8_t> all = tensorBytes(k);
                         std::memcpy(out.data(), all.data() + offset, out.size());
                         return llvm::Error::success();
                       });
  }
  const std::vector<uint8_t> want = llvm::cantFail(owned.toBytes());
  CHECK(llvm::cantFail(streamed.toBytes()) == want);
  CHECK(calls[0].size() > 10);  // 17280 bytes of Q4_K in chunks of 864

  const std::string dir = minfer::test::scratchDir() + "/writer";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/model.gguf";
  REQUIRE(errorText(streamed.write(path)) == "");
  CHECK(minfer::test::readFile(path) == want);
  auto opened = GgufFile::open(path);
  REQUIRE_MESSAGE(opened, llvm::toString(opened.takeError()));
  CHECK((*opened)->tensors().size() == baseTensors().size());
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  CHECK(entries == 1);  // no temporary left behind
  std::filesystem::remove_all(dir);
}

TEST_CASE("a failed write leaves neither the file nor a temporary") {
  const std::string dir = minfer::test::scratchDir() + "/failed-write";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/model.gguf";

  GgufWriter w = baseWriter();
  w.setChunkBytes(4096);
  w.addTensor("a.weight", GgmlType::F32, {1024, 8}, 1024 * 8 * 4,
              [](uint64_t offset, llvm::MutableArrayRef<uint8_t> out) -> llvm::Error {
                std::memset(out.data(), 0x3F, out.size());
                if (offset >= 8192)
                  return llvm::createStringError(llvm::inconvertibleErrorCode(), "producer gave up at %llu",
                                                 static_cast<unsigned long long>(offset));
                return llvm::Error::success();
              });
  const std::string message = errorText(w.write(path));
  REQUIRE(!message.empty());
  CHECK(message.find("a.weight") != std::string::npos);
  CHECK(message.find("producer gave up at 8192") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(path));

  GgufWriter bad = baseWriter();
  bad.addTensor("b.weight", GgmlType::Q4_K, {100, 3}, std::vector<uint8_t>(300, 1));
  const std::string message2 = errorText(bad.write(path));
  REQUIRE(!message2.empty());
  CHECK(message2.find("b.weight") != std::string::npos);
  CHECK(message2.find("ne[0] = 100") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(path));

  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  CHECK(entries == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the writer's validation names the rule a tensor or key breaks") {
  struct Bad {
    std::function<void(GgufWriter&)> edit;
    std::vector<std::string> words;
  };
  const std::vector<Bad> cases = {
      {[](GgufWriter& w) { w.addTensor("t", GgmlType::F32, {4, 0}, std::vector<uint8_t>{}); }, {"'t'", "ne[1] is 0"}},
      {[](GgufWriter& w) { w.addTensor("t", GgmlType::F32, {}, std::vector<uint8_t>(4)); }, {"'t'", "0 dims"}},
      {[](GgufWriter& w) { w.addTensor("t", GgmlType::F32, {2, 2}, std::vector<uint8_t>(15)); },
       {"'t'", "15 data bytes", "need 16"}},
      {[](GgufWriter& w) { w.addTensor("t", static_cast<GgmlType>(4), {32}, std::vector<uint8_t>(18)); },
       {"'t'", "unknown ggml type 4"}},
      {[](GgufWriter& w) {
         w.addTensor("t", GgmlType::F32, {1}, std::vector<uint8_t>(4));
         w.addTensor("t", GgmlType::F32, {1}, std::vector<uint8_t>(4));
       },
       {"duplicate tensor name 't'"}},
      {[](GgufWriter& w) { w.append("general.name", MetaValue::string("again")); }, {"duplicate key 'general.name'"}},
      {[](GgufWriter& w) { w.setU32("general.alignment", 48); }, {"general.alignment"}},
      {[](GgufWriter& w) { w.setVersion(4); }, {"version 4"}},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    CAPTURE(k);
    GgufWriter w = baseWriter();
    cases[k].edit(w);
    auto bytes = w.toBytes();
    REQUIRE(!bytes);
    const std::string message = llvm::toString(bytes.takeError());
    INFO(message);
    for (const std::string& word : cases[k].words) CHECK(message.find(word) != std::string::npos);
  }
}

TEST_CASE("MetaValue::fromParsed copies every value exactly (as minfer-synth copies a tokenizer)") {
  GgufWriter w = baseWriter();
  addBaseTensors(w);
  auto parsed = parseBytes(llvm::cantFail(w.toBytes()), "src.gguf");
  REQUIRE_MESSAGE(parsed, llvm::toString(parsed.takeError()));
  GgufWriter copy;
  for (const auto& kv : (*parsed)->metadata()) copy.set(kv.key, MetaValue::fromParsed(kv.value));
  GgufWriter plain = baseWriter();
  CHECK(llvm::cantFail(copy.toBytes()) == llvm::cantFail(plain.toBytes()));
}

// ---------------------------------------------------------------------------------------------
// Corruption cases.

TEST_CASE("the base file is valid") {
  auto parsed = parseBytes(base().bytes, "base.gguf");
  REQUIRE_MESSAGE(parsed, llvm::toString(parsed.takeError()));
  CHECK((*parsed)->tensors().size() == baseTensors().size());
}

TEST_CASE("header: bad magic, unknown versions, big-endian") {
  {
    std::vector<uint8_t> b = base().bytes;
    b[0] = 'X';
    expectError("bad-magic.gguf", b, {"magic", "58 47 55 46"}, 0);
  }
  {
    std::vector<uint8_t> b = base().bytes;
    std::memcpy(b.data(), "GGML", 4);
    expectError("ggml-magic.gguf", b, {"magic", "47 47 4d 4c"}, 0);
  }
  for (uint32_t v : {0u, 1u, 4u, 0xFFFFFFFFu}) {
    std::vector<uint8_t> b = base().bytes;
    patchU32(b, base().layout.version, v);
    expectError("version-" + std::to_string(v) + ".gguf", b, {"version", "version " + std::to_string(v)},
                base().layout.version);
  }
  for (uint32_t v : {2u, 3u}) {
    std::vector<uint8_t> b = base().bytes;
    patchU32(b, base().layout.version, __builtin_bswap32(v));
    expectError("big-endian-v" + std::to_string(v) + ".gguf", b, {"big-endian", "version"}, base().layout.version);
  }
}

TEST_CASE("truncation at every offset of the header, metadata and tensor infos, and a sample in the data") {
  const Base& b = base();
  const uint64_t header_end = b.layout.data_start;
  std::vector<uint64_t> cuts;
  for (uint64_t n = 0; n <= header_end; ++n) cuts.push_back(n);
  for (const auto& t : b.layout.tensors) {
    for (uint64_t d : {uint64_t{1}, t.data_size / 2, t.data_size - 1}) cuts.push_back(t.data + d);
  }
  cuts.push_back(b.bytes.size() - 1);
  int checked = 0;
  for (uint64_t n : cuts) {
    std::vector<uint8_t> cut(b.bytes.begin(), b.bytes.begin() + n);
    const std::string name = "cut-" + std::to_string(n) + ".gguf";
    auto file = parseBytes(cut, name);
    if (file) {
      FAIL_CHECK(name << " parsed although " << (b.bytes.size() - n) << " bytes are missing");
      continue;
    }
    const std::string message = llvm::toString(file.takeError());
    INFO(message);
    CHECK(message.rfind(name + ": ", 0) == 0);
    const bool says_short = message.find("remain") != std::string::npos ||
                            message.find("past the end") != std::string::npos ||
                            message.find("outside the file") != std::string::npos;
    CHECK(says_short);
    if (n > header_end) {
      // Data cut: the first tensor (in info order) whose data no longer fits is named, with the size.
      const auto* victim = &b.layout.tensors.front();
      for (const auto& t : b.layout.tensors) {
        if (t.data + t.data_size > n) {
          victim = &t;
          break;
        }
      }
      CHECK(message.find("'" + victim->name + "'") != std::string::npos);
      CHECK(message.find("size " + std::to_string(n)) != std::string::npos);
    }
    ++checked;
  }
  CHECK(checked == static_cast<int>(cuts.size()));
}

TEST_CASE("strings and arrays that run past the end; absurd counts") {
  const Base& b = base();
  {
    std::vector<uint8_t> c = b.bytes;
    patchU64(c, kvAt("general.name").key_length, 1000000);
    expectError("key-length.gguf", c, {"metadata kv #1 key length", "1000000"}, kvAt("general.name").key_length);
  }
  {
    std::vector<uint8_t> c = b.bytes;
    patchU64(c, kvAt("general.name").value, 1000000);
    expectError("string-length.gguf", c, {"general.name", "1000000"}, kvAt("general.name").value);
  }
  {
    std::vector<uint8_t> c = b.bytes;
    patchU64(c, kvAt("general.name").value, ~0ull);
    expectError("string-length-max.gguf", c, {"general.name", "18446744073709551615"}, kvAt("general.name").value);
  }
  {
    // Length of token 5 inside the string array: elements start after the count.
    const auto& kv = kvAt("tokenizer.ggml.tokens");
    uint64_t at = kv.elements;
    const std::vector<std::string> tokens = tokenList();
    for (int k = 0; k < 5; ++k) at += 8 + tokens[k].size();
    std::vector<uint8_t> c = b.bytes;
    patchU64(c, at, 5000000);
    expectError("token-length.gguf", c, {"tokenizer.ggml.tokens", "[5]", "5000000"}, at);
  }
  {
    const auto& t = tensorAt("blk.0.ffn_down.weight");
    std::vector<uint8_t> c = b.bytes;
    patchU64(c, t.name_length, 1u << 20);
    expectError("tensor-name-length.gguf", c, {"tensor info #4 name", "1048576"}, t.name_length);
  }
  for (uint64_t count : {uint64_t{10000000}, uint64_t{1} << 60}) {
    const std::string n = std::to_string(count);
    for (const char* key : {"tokenizer.ggml.scores", "tokenizer.ggml.tokens", "test.nested", "test.u64_array"}) {
      std::vector<uint8_t> c = b.bytes;
      patchU64(c, kvAt(key).array_count, count);
      expectError(std::string("array-count-") + key + "-" + n + ".gguf", c, {key, "count", n},
                  kvAt(key).array_count);
    }
  }
  for (uint64_t count : {uint64_t{1} << 60, uint64_t{~0ull}, uint64_t{1000000}}) {
    const std::string n = std::to_string(count);
    std::vector<uint8_t> c = b.bytes;
    patchU64(c, b.layout.tensor_count, count);
    expectError("tensor-count-" + n + ".gguf", c, {"tensor count", n}, b.layout.tensor_count);
    c = b.bytes;
    patchU64(c, b.layout.kv_count, count);
    expectError("kv-count-" + n + ".gguf", c, {"kv count", n}, b.layout.kv_count);
  }
}

TEST_CASE("metadata: unknown value types, bad bools, duplicates, nesting bomb") {
  const Base& b = base();
  for (uint32_t type : {13u, 1000u}) {
    std::vector<uint8_t> c = b.bytes;
    patchU32(c, kvAt("test.u16").type, type);
    expectError("value-type-" + std::to_string(type) + ".gguf", c,
                {"test.u16", "unknown metadata value type " + std::to_string(type)}, kvAt("test.u16").type);
    c = b.bytes;
    patchU32(c, kvAt("test.u64_array").value, type);
    expectError("elem-type-" + std::to_string(type) + ".gguf", c,
                {"test.u64_array", "element type", "unknown metadata value type " + std::to_string(type)},
                kvAt("test.u64_array").value);
  }
  {
    std::vector<uint8_t> c = b.bytes;
    c[kvAt("test.false").value] = 7;
    expectError("bool-7.gguf", c, {"test.false", "bool value 7"}, kvAt("test.false").value);
  }
  {
    const auto bytes = buildInvalid([](GgufWriter& w) { w.append("test.i16", MetaValue::i16(5)); });
    expectError("duplicate-key.gguf", bytes,
                {"'test.i16'", "duplicate key", "first defined at offset " + hex(kvAt("test.i16").key_length)});
  }
  {
    // Duplicate by patching: two keys that differ in their last byte become equal.
    GgufWriter w = baseWriter();
    w.setU32("test.dup_a", 1);
    w.setU32("test.dup_b", 2);
    addBaseTensors(w);
    std::vector<uint8_t> c = llvm::cantFail(w.toBytes());
    const GgufLayout layout = llvm::cantFail(w.layout());
    const auto* second = layout.kv("test.dup_b");
    c[second->key_bytes + 9] = 'a';
    expectError("duplicate-key-patched.gguf", c,
                {"'test.dup_a'", "duplicate key", "first defined at offset " + hex(layout.kv("test.dup_a")->key_length)},
                second->key_length);
  }
  {
    MetaValue bomb = MetaValue::u32Array({1, 2});
    for (int depth = 0; depth < 1000; ++depth) bomb = MetaValue::arrayOfArrays({std::move(bomb)});
    const auto bytes = buildInvalid([&](GgufWriter& w) { w.set("test.bomb", bomb); });
    expectError("nesting-bomb.gguf", bytes,
                {"test.bomb", "nested deeper than " + std::to_string(minfer::gguf::kMaxArrayNesting)});
  }
  {
    // Nested up to the limit is fine.
    MetaValue deep = MetaValue::u32Array({1, 2});
    for (uint64_t depth = 1; depth < minfer::gguf::kMaxArrayNesting; ++depth)
      deep = MetaValue::arrayOfArrays({std::move(deep)});
    GgufWriter w = baseWriter();
    w.set("test.deep", deep);
    auto parsed = parseBytes(llvm::cantFail(w.toBytes()), "deep.gguf");
    CHECK_MESSAGE(parsed, llvm::toString(parsed.takeError()));
  }
}

TEST_CASE("well-known keys with the wrong type or value") {
  struct Case {
    const char* name;
    const char* key;
    MetaValue value;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      {"alignment-string", "general.alignment", MetaValue::string("32"), {"general.alignment", "STRING"}},
      {"alignment-zero", "general.alignment", MetaValue::u32(0), {"general.alignment", "alignment 0"}},
      {"alignment-48", "general.alignment", MetaValue::u32(48), {"general.alignment", "alignment 48"}},
      {"alignment-negative", "general.alignment", MetaValue::i32(-64), {"general.alignment", "-64"}},
      {"block-count-string", "llama.block_count", MetaValue::string("1"), {"llama.block_count", "STRING", "integer"}},
      {"eps-int", "llama.attention.layer_norm_rms_epsilon", MetaValue::u32(1),
       {"llama.attention.layer_norm_rms_epsilon", "UINT32", "FLOAT32"}},
      {"tokens-int", "tokenizer.ggml.tokens", MetaValue::i32Array({1, 2, 3}),
       {"tokenizer.ggml.tokens", "ARRAY of INT32", "ARRAY of STRING"}},
      {"scores-string", "tokenizer.ggml.scores", MetaValue::stringArray({"a"}),
       {"tokenizer.ggml.scores", "ARRAY of STRING", "ARRAY of FLOAT32"}},
      {"arch-int", "general.architecture", MetaValue::u32(7), {"general.architecture", "UINT32", "STRING"}},
  };
  for (const Case& c : cases) {
    const auto bytes = buildInvalid([&](GgufWriter& w) { w.set(c.key, c.value); });
    GgufWriter w = baseWriter();
    w.setValidate(false);
    w.set(c.key, c.value);
    expectError(std::string(c.name) + ".gguf", bytes, c.words, llvm::cantFail(w.layout()).kv(c.key)->key_length);
  }
}

TEST_CASE("tensor infos: duplicates, unknown types, dims, block multiples") {
  const Base& b = base();
  {
    const auto bytes = buildInvalid([](GgufWriter& w) {
      w.addTensor("blk.0.attn_k.weight", GgmlType::F32, {16}, randomBytes(64, 5));
    });
    expectError("duplicate-tensor.gguf", bytes,
                {"'blk.0.attn_k.weight'", "duplicate tensor name",
                 "first defined at offset " + hex(tensorAt("blk.0.attn_k.weight").name_length)});
  }
  for (uint32_t type : {4u, 5u, 31u, 1000u}) {
    std::vector<uint8_t> c = b.bytes;
    const auto& t = tensorAt("blk.0.attn_q.weight");
    patchU32(c, t.type, type);
    expectError("tensor-type-" + std::to_string(type) + ".gguf", c,
                {"'blk.0.attn_q.weight'", "unknown tensor type " + std::to_string(type)}, t.type);
  }
  for (size_t dims : {size_t{0}, size_t{5}}) {
    const auto bytes = buildInvalid([&](GgufWriter& w) {
      w.addTensor("odd.weight", GgmlType::F32, std::vector<uint64_t>(dims, 2), randomBytes(4 << dims, 9));
    });
    expectError("n-dims-" + std::to_string(dims) + ".gguf", bytes,
                {"'odd.weight'", "n_dims", "n_dims = " + std::to_string(dims)});
  }
  {
    std::vector<uint8_t> c = b.bytes;
    const auto& t = tensorAt("blk.0.ffn_down.weight");
    patchU32(c, t.n_dims, 5);
    expectError("n-dims-5-patched.gguf", c, {"'blk.0.ffn_down.weight'", "n_dims = 5"}, t.n_dims);
  }
  {
    // A dim of 0 is an empty tensor, valid GGUF as in ggml's gguf.cpp: parsed, with no data; the model
    // code refuses it where a block would use it (tests/model).
    std::vector<uint8_t> c = b.bytes;
    const auto& t = tensorAt("blk.0.ffn_gate_exps.weight");
    patchU64(c, t.ne[1], 0);
    auto file = parseBytes(c, "zero-dim.gguf");
    REQUIRE_MESSAGE(bool(file), llvm::toString(file.takeError()));
    const minfer::gguf::TensorInfo* info = (*file)->findTensor("blk.0.ffn_gate_exps.weight");
    REQUIRE(info);
    CHECK(info->ne[1] == 0);
    CHECK(info->elements() == 0);
    CHECK(info->size == 0);
    CHECK((*file)->tensorData(*info).empty());
  }
  {
    // Empty tensors share offsets with their neighbours without overlapping them.
    const auto bytes = buildInvalid([&](GgufWriter& w) {
      w.addTensor("empty.weight", GgmlType::F32, {0, 4}, std::vector<uint8_t>{});
      w.addTensor("after.weight", GgmlType::F32, {2}, randomBytes(8, 3));
    });
    auto file = parseBytes(bytes, "empty-tensor.gguf");
    REQUIRE_MESSAGE(bool(file), llvm::toString(file.takeError()));
    const minfer::gguf::TensorInfo* empty = (*file)->findTensor("empty.weight");
    const minfer::gguf::TensorInfo* after = (*file)->findTensor("after.weight");
    REQUIRE((empty && after));
    CHECK(empty->elements() == 0);
    CHECK(empty->ne[1] == 4);
    CHECK(after->size == 8);
  }
  {
    // The non-zero dims of an empty tensor are still bounded.
    const auto bytes = buildInvalid([&](GgufWriter& w) {
      w.addTensor("huge-empty.weight", GgmlType::F32, {0, uint64_t{1} << 40, uint64_t{1} << 40}, std::vector<uint8_t>{});
    });
    expectError("huge-empty.gguf", bytes, {"'huge-empty.weight'", "ne[2]", "overflow"});
  }
  {
    // 2^32 * 2^32 elements overflow u64 (ne[0] stays a multiple of the Q8_0 block).
    std::vector<uint8_t> c = b.bytes;
    const auto& t = tensorAt("blk.0.attn_q.weight");
    patchU64(c, t.ne[0], uint64_t{1} << 32);
    patchU64(c, t.ne[1], uint64_t{1} << 32);
    expectError("dims-overflow.gguf", c, {"'blk.0.attn_q.weight'", "ne[1]", "overflow", "4294967296"}, t.ne[1]);
  }
  {
    std::vector<uint8_t> c = b.bytes;
    const auto& t = tensorAt("token_embd.weight");
    patchU64(c, t.ne[0], 100);
    expectError("q4k-row-100.gguf", c, {"'token_embd.weight'", "ne[0] = 100", "Q4_K", "256"});
  }
  {
    std::vector<uint8_t> c = b.bytes;
    const auto& t = tensorAt("output.weight");
    patchU64(c, t.ne[0], 784);  // 24.5 Q4_0 blocks
    expectError("q4_0-row-784.gguf", c, {"'output.weight'", "ne[0] = 784", "Q4_0", "32"});
  }
}

TEST_CASE("tensor data: outside the file, misaligned, overlapping") {
  const Base& b = base();
  const auto& last = b.layout.tensors.back();
  const uint64_t rel_last = last.data - b.layout.data_start;
  {
    std::vector<uint8_t> c = b.bytes;
    const uint64_t rel = (b.bytes.size() - b.layout.data_start + 31) / 32 * 32;
    patchU64(c, last.offset, rel);
    expectError("data-outside.gguf", c,
                {"'output.weight'", "outside the file", "size " + std::to_string(b.bytes.size())}, last.name_length);
  }
  {
    std::vector<uint8_t> c = b.bytes;
    patchU64(c, last.offset, rel_last + 32);  // aligned, but the end runs past the file
    expectError("data-tail-outside.gguf", c, {"'output.weight'", "outside the file"}, last.name_length);
  }
  {
    std::vector<uint8_t> c = b.bytes;
    patchU64(c, last.offset, 0xFFFFFFFFFFFFFFE0ull);  // aligned; start + size overflows u64
    expectError("data-offset-overflow.gguf", c, {"'output.weight'", "outside the file"}, last.name_length);
  }
  {
    std::vector<uint8_t> c = b.bytes;
    const auto& t = tensorAt("blk.0.attn_k.weight");
    const uint64_t rel = t.data - b.layout.data_start;
    patchU64(c, t.offset, rel + 1);
    expectError("misaligned.gguf", c,
                {"'blk.0.attn_k.weight'", "offset " + std::to_string(rel + 1), "general.alignment 32"}, t.offset);
  }
  {
    std::vector<uint8_t> c = b.bytes;
    const auto& first = tensorAt("token_embd.weight");
    const auto& second = tensorAt("blk.0.attn_q.weight");
    patchU64(c, second.offset, 64);  // inside token_embd's [0, 17280)
    expectError("overlap.gguf", c, {"'blk.0.attn_q.weight'", "overlaps tensor 'token_embd.weight'", "17280"},
                second.name_length);
    (void)first;
  }
  {
    std::vector<uint8_t> c = b.bytes;
    const auto& t = tensorAt("blk.0.attn_norm.weight");
    patchU64(c, t.offset, 0);  // identical start to token_embd
    expectError("same-offset.gguf", c, {"overlaps"});
  }
}

TEST_CASE("single-byte mutations of the header never crash the reader") {
  const Base& b = base();
  int failures = 0, successes = 0;
  for (uint64_t at = 0; at < b.layout.infos_end; ++at) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0xFF}, uint8_t{0x80}}) {
      if (b.bytes[at] == v) continue;
      std::vector<uint8_t> c = b.bytes;
      c[at] = v;
      auto file = parseBytes(c, "mutated.gguf");
      if (file) {
        ++successes;
      } else {
        const std::string message = llvm::toString(file.takeError());
        CHECK(message.rfind("mutated.gguf: ", 0) == 0);
        ++failures;
      }
    }
  }
  CHECK(failures > 0);
  MESSAGE(failures << " mutations rejected, " << successes << " accepted");
}

// ---------------------------------------------------------------------------------------------
// Typed accessors.

TEST_CASE("typed accessors: missing keys are named; wrong types name both types") {
  auto parsed = parseBytes(base().bytes, "accessors.gguf");
  REQUIRE_MESSAGE(parsed, llvm::toString(parsed.takeError()));
  const GgufFile& f = **parsed;
  auto message = [](auto expected) {
    REQUIRE(!expected);
    return llvm::toString(expected.takeError());
  };
  auto has = [](const std::string& m, std::initializer_list<const char*> words) {
    INFO(m);
    CHECK(m.rfind("accessors.gguf: ", 0) == 0);
    for (const char* w : words) CHECK_MESSAGE(m.find(w) != std::string::npos, "missing '" << w << "'");
  };
  has(message(f.getU32("llama.nope")), {"'llama.nope'", "missing"});
  has(message(f.getF32("llama.nope2")), {"'llama.nope2'", "missing"});
  has(message(f.getStringArray("tokenizer.nope")), {"'tokenizer.nope'", "missing"});
  has(message(f.getU32("general.name")), {"'general.name'", "STRING", "integer"});
  has(message(f.getString("llama.block_count")), {"'llama.block_count'", "UINT32", "STRING"});
  has(message(f.getF32("test.i32")), {"'test.i32'", "INT32", "FLOAT32"});
  has(message(f.getBool("test.u8")), {"'test.u8'", "UINT8", "BOOL"});
  has(message(f.getStringArray("tokenizer.ggml.scores")), {"'tokenizer.ggml.scores'", "ARRAY of FLOAT32", "ARRAY of STRING"});
  has(message(f.getF32Array("tokenizer.ggml.tokens")), {"'tokenizer.ggml.tokens'", "ARRAY of STRING", "ARRAY of FLOAT32"});
  has(message(f.getI32Array("general.name")), {"'general.name'", "STRING", "ARRAY of INT32"});
  has(message(f.getU32("test.u64")), {"'test.u64'", "18364758544493064720", "UINT32"});
  has(message(f.getU32("test.i8")), {"'test.i8'", "-100", "UINT32"});
  has(message(f.getU32Or("general.name", 5)), {"'general.name'", "STRING"});
  CHECK(*f.getU32Or("llama.nope", 5) == 5u);
  CHECK(*f.getF32Or("llama.nope", 0.5f) == 0.5f);
  CHECK(*f.getBoolOr("llama.nope", true) == true);
  CHECK(*f.getBool("tokenizer.ggml.add_bos_token") == true);
  CHECK(*f.getI64("test.i8") == -100);
  CHECK(*f.getU32("test.u16") == 60000u);
  CHECK(*f.getF32("test.f64") == static_cast<float>(-2.5e-300));
  CHECK(f.getI32Array("tokenizer.ggml.token_type")->at(3) == 1);
}
