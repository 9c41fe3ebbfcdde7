// minfer-make-fuzz-corpus: writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/).
//
//   minfer-make-fuzz-corpus OUT_DIR
//
// fuzz_gguf_reader: small writer-made models (every tensor type, llama/qwen2, tied output), a
//   metadata-only file of every value type (v2 and v3), named corruption cases of a small base file
//   (the cases of tests/gguf/test_gguf_corruption.cpp, re-made here on a smaller base), files whose
//   counts and lengths lie, and the first bytes of fixture models (when ../shared/fixtures exists).
// fuzz_artifact: artifacts compiled by compileModel (no kernel targets) from the small models (and the
//   tiny-phi3 / tiny-qwen3moe / tiny-gemma2 fixtures: column views, expert axes, ring KV caches), the
//   same truncated to the manifest, and one with a damaged data segment.
// fuzz_tokenizer: llama.cpp's vocab test strings (fixtures) or built-in strings, with several flag
//   bytes, invalid UTF-8, special-token texts and raw id sequences.
// Deterministic: the same inputs give the same files.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "compiler/compile_model.h"
#include "compiler/gguf/gguf_writer.h"
#include "llvm/Support/Error.h"
#include "tests/fuzz/tiny_gguf.h"

namespace {

namespace fs = std::filesystem;
using minfer::GgmlType;
using minfer::gguf::GgufWriter;
using minfer::gguf::MetaValue;
using minfer::gguf::ValueType;
using minfer::test::TinyGgufSpec;

fs::path g_out;
size_t g_files = 0, g_bytes = 0;

void put(const std::string& target, const std::string& name, const std::vector<uint8_t>& bytes) {
  const fs::path dir = g_out / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "minfer-make-fuzz-corpus: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
  ++g_files;
  g_bytes += bytes.size();
}

std::vector<uint8_t> bytesOf(const GgufWriter& w) { return llvm::cantFail(w.toBytes()); }

std::vector<uint8_t> readFile(const fs::path& path, size_t limit = SIZE_MAX) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> out(std::istreambuf_iterator<char>(in), {});
  if (out.size() > limit) out.resize(limit);
  return out;
}

void patchU64(std::vector<uint8_t>& b, uint64_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); }
void patchU32(std::vector<uint8_t>& b, uint64_t at, uint32_t v) { std::memcpy(b.data() + at, &v, 4); }

std::string fixturesDir() {
  const char* env = std::getenv("MINFER_FIXTURES");
  return (env && *env) ? env : MINFER_DEFAULT_FIXTURES;
}

// ---------------------------------------------------------------------------------------------
// fuzz_gguf_reader

std::vector<TinyGgufSpec> modelSpecs() {
  std::vector<TinyGgufSpec> specs;
  TinyGgufSpec llama;
  llama.byte_tokens = false;
  specs.push_back(llama);  // Q8_0 / F16 / Q4_0
  TinyGgufSpec qwen;
  qwen.arch = "qwen2";
  qwen.byte_tokens = false;
  qwen.n_ff = 256;
  qwen.embd = GgmlType::F16;
  qwen.attn = GgmlType::Q4_1;
  qwen.ffn = GgmlType::Q5_1;
  qwen.down = GgmlType::Q4_K;
  qwen.output = GgmlType::Q5_0;
  qwen.seed = 2;
  specs.push_back(qwen);
  TinyGgufSpec tied;
  tied.byte_tokens = false;
  tied.tied = true;
  tied.n_head = 4;
  tied.n_head_kv = 2;
  tied.embd = GgmlType::BF16;
  tied.attn = GgmlType::F32;
  tied.ffn = GgmlType::Q8_0;
  tied.down = GgmlType::Q5_0;
  tied.seed = 3;
  specs.push_back(tied);
  for (GgmlType down : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    TinyGgufSpec k;
    k.byte_tokens = false;
    k.n_ff = 256;
    k.ffn = GgmlType::Q4_0;
    k.down = down;
    k.seed = 10 + static_cast<uint64_t>(down);
    specs.push_back(k);
  }
  return specs;
}

std::string specName(const TinyGgufSpec& s) {
  std::string name = "tiny-" + s.arch + (s.tied ? "-tied" : "") + "-" + minfer::ggmlTypeTraits(s.down).name;
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

// Every value type, nested arrays, empty values; no tensors.
GgufWriter metadataOnly(uint32_t version) {
  GgufWriter w(version);
  w.setString("general.architecture", "llama");
  w.setString("general.name", "");
  w.setU32("general.alignment", 64);
  w.setU8("t.u8", 200);
  w.setI8("t.i8", -100);
  w.setU16("t.u16", 60000);
  w.setI16("t.i16", -30000);
  w.setU32("t.u32", 4000000000u);
  w.setI32("t.i32", -2000000000);
  w.setU64("t.u64", 0xFEDCBA9876543210ull);
  w.setI64("t.i64", -0x123456789ABCDEFll);
  w.setF32("t.f32", -1.5f);
  w.setF64("t.f64", 2.5e-300);
  w.setBool("t.bool", true);
  w.setStringArray("t.strings", {"a", "", "\xE2\x96\x81x", "\xFF\xFE"});
  w.setF32Array("t.floats", {1.0f, -0.0f, 3.5f});
  w.setI32Array("t.ints", {-1, 0, 2147483647});
  w.set("t.u64s", MetaValue::scalarArray(ValueType::UINT64, std::vector<uint8_t>(24, 0xAB)));
  w.set("t.f64s", MetaValue::scalarArray(ValueType::FLOAT64, std::vector<uint8_t>(16, 0x7F)));  // huge/NaN-ish doubles
  w.set("t.bools", MetaValue::scalarArray(ValueType::BOOL, {0, 1, 1}));
  w.setArrayOfArrays("t.nested", {MetaValue::i32Array({7}), MetaValue::stringArray({"x"}),
                                  MetaValue::arrayOfArrays({MetaValue::f32Array({0.25f})})});
  w.setU32("llama.block_count", 1);
  w.setU32("llama.embedding_length", 32);
  w.setString("tokenizer.ggml.model", "llama");
  w.setStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
  return w;
}

// The small base of the corruption cases: metadata of several types and three small tensors.
GgufWriter corruptionBase(bool validate) {
  GgufWriter w = metadataOnly(3);
  w.setValidate(validate);
  std::vector<uint8_t> f32(8 * 3 * 4), q8(2 * 34), q4k(144);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<uint8_t>(i * 7);
  for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(i * 13 + 1);
  for (size_t i = 0; i < q4k.size(); ++i) q4k[i] = static_cast<uint8_t>(i * 29 + 3);
  q8[1] = q8[35] = 0x20;  // f16 scales of moderate size
  w.addTensor("a.weight", GgmlType::F32, {8, 3}, f32);
  w.addTensor("b.weight", GgmlType::Q8_0, {64}, q8);
  w.addTensor("c.weight", GgmlType::Q4_K, {256}, q4k);
  return w;
}

void ggufSeeds() {
  const std::string T = "fuzz_gguf_reader";
  for (const TinyGgufSpec& s : modelSpecs()) put(T, specName(s) + ".gguf", bytesOf(minfer::test::makeTinyGguf(s)));
  put(T, "metadata-v3.gguf", bytesOf(metadataOnly(3)));
  put(T, "metadata-v2.gguf", bytesOf(metadataOnly(2)));

  const GgufWriter base_writer = corruptionBase(true);
  const std::vector<uint8_t> base = bytesOf(base_writer);
  const minfer::gguf::GgufLayout L = llvm::cantFail(base_writer.layout());
  put(T, "base.gguf", base);
  auto variant = [&](const std::string& name, auto&& edit) {
    std::vector<uint8_t> c = base;
    edit(c);
    put(T, "bad-" + name + ".gguf", c);
  };
  variant("magic", [](auto& c) { c[0] = 'g'; });
  variant("version-1", [](auto& c) { patchU32(c, 4, 1); });
  variant("version-big-endian", [](auto& c) { patchU32(c, 4, 0x03000000); });
  variant("tensor-count-2^40", [](auto& c) { patchU64(c, 8, uint64_t{1} << 40); });
  variant("kv-count-2^62", [](auto& c) { patchU64(c, 16, uint64_t{1} << 62); });
  variant("kv-count-plus-one", [&](auto& c) { patchU64(c, 16, L.kvs.size() + 1); });
  variant("key-length-huge", [&](auto& c) { patchU64(c, L.kvs[1].key_length, uint64_t{3} << 32); });
  variant("string-length-4GB", [&](auto& c) { patchU64(c, L.kv("general.architecture")->value, uint64_t{1} << 32); });
  variant("value-type-13", [&](auto& c) { patchU32(c, L.kv("t.u8")->type, 13); });
  variant("bool-2", [&](auto& c) { c[L.kv("t.bool")->value] = 2; });
  variant("array-count-2^61", [&](auto& c) { patchU64(c, L.kv("t.floats")->array_count, uint64_t{1} << 61); });
  variant("string-array-count-huge", [&](auto& c) { patchU64(c, L.kv("t.strings")->array_count, ~uint64_t{0} / 8); });
  variant("nested-count-huge", [&](auto& c) { patchU64(c, L.kv("t.nested")->array_count, uint64_t{1} << 50); });
  variant("alignment-3", [&](auto& c) { patchU32(c, L.kv("general.alignment")->value, 3); });
  variant("duplicate-key", [&](auto& c) { c[L.kv("t.u16")->key_bytes + 3] = '8'; c[L.kv("t.u16")->key_bytes + 2] = 'u'; });
  variant("n-dims-5", [&](auto& c) { patchU32(c, L.tensor("a.weight")->n_dims, 5); });
  variant("dim-0", [&](auto& c) { patchU64(c, L.tensor("a.weight")->ne[1], 0); });
  variant("dims-overflow", [&](auto& c) {
    patchU64(c, L.tensor("a.weight")->ne[0], uint64_t{1} << 32);
    patchU64(c, L.tensor("a.weight")->ne[1], uint64_t{1} << 32);
  });
  variant("type-99", [&](auto& c) { patchU32(c, L.tensor("b.weight")->type, 99); });
  variant("q4k-row-100", [&](auto& c) { patchU64(c, L.tensor("c.weight")->ne[0], 100); });
  variant("offset-misaligned", [&](auto& c) { patchU64(c, L.tensor("b.weight")->offset, 1); });
  variant("offset-outside", [&](auto& c) { patchU64(c, L.tensor("c.weight")->offset, 1 << 20); });
  variant("offset-overflow", [&](auto& c) { patchU64(c, L.tensor("c.weight")->offset, 0xFFFFFFFFFFFFFFC0ull); });
  variant("overlap", [&](auto& c) { patchU64(c, L.tensor("b.weight")->offset, 0); });
  variant("name-length-past-end", [&](auto& c) { patchU64(c, L.tensor("a.weight")->name_length, 1 << 30); });
  {
    std::vector<uint8_t> c = base;
    c.resize(L.data_start + 10);
    put(T, "bad-truncated-data.gguf", c);
    c.resize(L.infos_end - 5);
    put(T, "bad-truncated-infos.gguf", c);
  }
  {
    GgufWriter deep(3);
    deep.setValidate(false);
    MetaValue v = MetaValue::i32Array({1});
    for (int d = 0; d < 10; ++d) v = MetaValue::arrayOfArrays({v});
    deep.set("t.deep", v);
    put(T, "bad-nested-10-deep.gguf", bytesOf(deep));
  }

  const std::string fx = fixturesDir();
  const std::pair<const char*, size_t> heads[] = {{"models/stories260K.gguf", 4096},
                                                  {"models/stories260K.gguf", 16384},
                                                  {"models/tiny-qwen2-Q4_K_M.gguf", 12288}};
  for (const auto& [rel, n] : heads) {
    const fs::path p = fs::path(fx) / rel;
    if (!fs::exists(p)) continue;
    put(T, "head" + std::to_string(n) + "-" + p.filename().string(), readFile(p, n));
  }
}

// ---------------------------------------------------------------------------------------------
// fuzz_artifact

// The artifact of `gguf` (CPU-only: no kernel targets, max batch 4), written at `mfb` and read back.
std::vector<uint8_t> compileSeed(const fs::path& gguf, const fs::path& mfb) {
  minfer::CompileOptions o;
  o.input = gguf.string();
  o.output = mfb.string();
  o.max_batch = 4;
  o.jobs = 1;
  o.kernel_cache_dir = "off";
  auto summary = minfer::compileModel(o);
  if (!summary) {
    std::fprintf(stderr, "minfer-make-fuzz-corpus: %s\n", llvm::toString(summary.takeError()).c_str());
    std::exit(1);
  }
  return readFile(mfb);
}

void artifactSeeds(const fs::path& scratch) {
  const std::string T = "fuzz_artifact";
  const std::vector<TinyGgufSpec> specs = modelSpecs();
  for (size_t k : {size_t{0}, size_t{1}, size_t{2}}) {
    const std::string name = specName(specs[k]);
    const fs::path gguf = scratch / (name + ".gguf"), mfb = scratch / (name + ".mfb");
    if (auto err = minfer::test::makeTinyGguf(specs[k]).write(gguf.string())) {
      std::fprintf(stderr, "minfer-make-fuzz-corpus: %s\n", llvm::toString(std::move(err)).c_str());
      std::exit(1);
    }
    const std::vector<uint8_t> bytes = compileSeed(gguf, mfb);
    put(T, name + ".artifact", bytes);
    if (k != 0) continue;
    uint32_t n = 0;
    std::memcpy(&n, bytes.data(), 4);
    const size_t manifest = std::min<size_t>(bytes.size(), size_t{n} + 4);
    put(T, name + "-manifest-only.artifact", std::vector<uint8_t>(bytes.begin(), bytes.begin() + manifest));
    std::vector<uint8_t> damaged = bytes;
    damaged[bytes.size() - 100] ^= 0x40;  // inside the last data segment: checksums fail, the model still opens
    put(T, name + "-damaged-segment.artifact", damaged);
  }
  // Structures the writer-made models lack, from the fixtures when present: column views (format 1.4,
  // phi3's fused q|k|v and gate|up), expert axes with the MoE ops (qwen3moe) and the sliding-window layers'
  // ring KV caches (format 1.6 Step.kv_ring, gemma2). Paged launches (1.6) and small-batch launches (1.7) need kernel
  // images, which these CPU-only seeds do not carry.
  for (const char* model : {"tiny-phi3-Q4_K_M", "tiny-qwen3moe-Q4_K_M", "tiny-gemma2-Q4_K_M"}) {
    const fs::path gguf = fs::path(fixturesDir()) / "arch" / "models" / (std::string(model) + ".gguf");
    if (!fs::exists(gguf)) continue;
    const fs::path mfb = scratch / (std::string(model) + ".mfb");
    put(T, std::string(model) + ".artifact", compileSeed(gguf, mfb));
  }
  put(T, "empty.artifact", {});
  put(T, "identifier-only.artifact", {8, 0, 0, 0, 4, 0, 0, 0, 'M', 'F', 'B', '1'});
}

// ---------------------------------------------------------------------------------------------
// fuzz_tokenizer

std::vector<std::string> splitInp(const std::string& content) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < content.size()) {
    const size_t next = content.find(sep, pos);
    if (next == std::string::npos) break;
    out.push_back(content.substr(pos, next - pos));
    pos = next + sep.size();
  }
  return out;
}

void tokenizerSeeds() {
  const std::string T = "fuzz_tokenizer";
  auto text = [&](const std::string& name, uint8_t flags, const std::string& s) {
    std::vector<uint8_t> b = {flags};
    b.insert(b.end(), s.begin(), s.end());
    put(T, name, b);
  };
  // Flags: bit 0 gpt-2 vocabulary, bit 1 parse_special, bit 2 add_special, bit 3 render_special.
  for (const char* vocab : {"llama-spm", "gpt-2"}) {
    const uint8_t bpe = std::string(vocab) == "gpt-2" ? 1 : 0;
    const std::vector<uint8_t> inp =
        readFile(fs::path(fixturesDir()) / "tokenizer" / ("ggml-vocab-" + std::string(vocab) + ".gguf.inp"));
    const std::vector<std::string> strings = splitInp(std::string(inp.begin(), inp.end()));
    for (size_t k = 0; k < strings.size(); ++k) {
      if (strings[k].size() > 512) continue;
      text(std::string(vocab) + "-inp" + std::to_string(k), static_cast<uint8_t>(bpe | ((k % 4) << 1)), strings[k]);
    }
  }
  const std::pair<const char*, std::string> builtin[] = {
      {"plain", "Hello world, the cat sat on the mat."},
      {"spaces", "   leading  and trailing   "},
      {"unicode", "\xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\xA6\x99 \xE4\xBD\xA0\xE5\xA5\xBD"},
      {"invalid-utf8", "a\xFF" "b\xC3(\xE2\x82\xED\xA0\x80\xF4\x90\x80\x80\xC0\x80"},
      {"specials", "<s>x</s><unk><|endoftext|> <s>"},
      {"digits", "3.14159 1234567890 0x7F"},
      {"newlines", "line1\nline2\r\n\tTab\n\n"},
  };
  for (const auto& [name, s] : builtin) {
    text(std::string("spm-") + name, 0, s);
    text(std::string("spm-special-") + name, 2 | 4 | 8, s);
    text(std::string("bpe-") + name, 1, s);
    text(std::string("bpe-special-") + name, 1 | 2 | 4 | 8, s);
  }
  // Raw id sequences (read as int32 by the decode half): byte tokens of an emoji split across tokens,
  // control ids, negative and out-of-range ids.
  auto ids = [&](const std::string& name, uint8_t flags, std::vector<int32_t> v) {
    std::vector<uint8_t> b = {flags};
    b.resize(1 + 4 * v.size());
    std::memcpy(b.data() + 1, v.data(), 4 * v.size());
    put(T, name, b);
  };
  ids("spm-ids-emoji-bytes", 8, {3 + 0xF0, 3 + 0x9F, 3 + 0xA6, 3 + 0x99, 1, 2, 0});
  ids("spm-ids-out-of-range", 8, {-1, 32000, INT32_MAX, INT32_MIN, 259, 3 + 0xE2});
  ids("bpe-ids-mixed", 9, {50256, 0, 255, 256, 50257, -7, 220, 198});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: minfer-make-fuzz-corpus OUT_DIR\n");
    return 2;
  }
  g_out = argv[1];
  const fs::path scratch = fs::temp_directory_path() / ("minfer-fuzz-corpus-" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  ggufSeeds();
  artifactSeeds(scratch);
  tokenizerSeeds();
  fs::remove_all(scratch);
  std::printf("minfer-make-fuzz-corpus: wrote %zu files, %zu bytes, under %s\n", g_files, g_bytes, g_out.c_str());
  return 0;
}
