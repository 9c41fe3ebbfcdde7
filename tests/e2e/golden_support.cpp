// Loading golden cases and compiling fixture models for the end-to-end tests.
#include "tests/e2e/golden_support.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "compiler/compile_model.h"
#include "compiler/gguf/gguf_reader.h"
#include "compiler/gguf/gguf_writer.h"
#include "tests/test_support.h"

namespace minfer::test {

namespace {

// Case-name prefixes of fixtures/arch/goldens whose architecture minfer compiles (README §8).
constexpr const char* kSupportedArchCases[] = {"tiny-llama31-", "tiny-gemma2-", "tiny-gemma3-", "tiny-phi3-",
                                                 "tiny-qwen3moe-"};
constexpr const char* kArchPrefix = "arch/";

std::vector<std::string> jsonStems(const std::string& dir) {
  std::vector<std::string> names;
  if (!std::filesystem::is_directory(dir)) return names;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::vector<std::string> goldenCaseNames() {
  std::vector<std::string> names = jsonStems(fixturesDir() + "/goldens");
  for (const std::string& stem : jsonStems(fixturesDir() + "/arch/goldens"))
    for (const char* prefix : kSupportedArchCases)
      if (stem.rfind(prefix, 0) == 0) names.push_back(kArchPrefix + stem);
  return names;
}

GoldenCase loadGolden(const std::string& name) {
  const bool arch = name.rfind(kArchPrefix, 0) == 0;
  const std::string base = fixturesDir() + (arch ? "/arch/goldens/" + name.substr(std::strlen(kArchPrefix)) : "/goldens/" + name);
  std::ifstream in(base + ".json");
  REQUIRE_MESSAGE(bool(in), "cannot open " << base << ".json");
  const nlohmann::json j = nlohmann::json::parse(in);
  GoldenCase g;
  g.name = name;
  g.model = j.at("model").get<std::string>();
  if (arch) g.model_dir = "arch/models";
  g.prompt_ids = j.at("prompt_ids").get<std::vector<int32_t>>();
  g.generated_ids = j.at("generated_ids").get<std::vector<int32_t>>();
  g.n_vocab = j.at("n_vocab").get<int>();
  g.prefill_margin = j.at("prefill_top1_margin").get<std::vector<double>>();
  g.decode_margin = j.at("decode_top1_margin").get<std::vector<double>>();
  g.generated_text = j.at("generated_text").get<std::string>();
  if (!j.at("prompt_text").is_null()) g.prompt_text = j.at("prompt_text").get<std::string>();
  g.prefill = readF32File(base + ".prefill.f32");
  g.ref64 = readF32File(base + ".ref64.f32");
  g.decode = readF32File(base + ".decode.f32");
  g.decode_ref64 = readF32File(base + ".decode.ref64.f32");
  const size_t prompt_size = g.prompt_ids.size() * g.n_vocab, decode_size = g.generated_ids.size() * g.n_vocab;
  REQUIRE(g.prefill.size() == prompt_size);
  REQUIRE(g.ref64.size() == prompt_size);
  REQUIRE(g.decode.size() == decode_size);
  REQUIRE(g.decode_ref64.size() == decode_size);
  return g;
}

std::string compiledFixture(const std::string& model, const std::string& dir) {
  static std::map<std::string, std::string> compiled;
  if (auto it = compiled.find(model); it != compiled.end()) return it->second;
  CompileOptions options;
  options.input = fixturesDir() + "/" + dir + "/" + model;
  options.output = scratchDir() + "/" + model + ".mfb";
  options.max_batch = 64;  // < 72 tokens of the longest golden: prefill must span several batches
  auto summary = compileModel(options);
  if (!summary) {
    FAIL_CHECK("compiling " << model << ": " << llvm::toString(summary.takeError()));
    return {};
  }
  compiled[model] = options.output;
  return options.output;
}

std::string ggufCopy(const std::string& src, const std::string& name, const std::function<void(gguf::GgufWriter&)>& edit,
                     const TensorEdit& tensor_edit) {
  auto file = gguf::GgufFile::open(fixturesDir() + "/" + src);
  REQUIRE_MESSAGE(bool(file), llvm::toString(file.takeError()));
  gguf::GgufWriter w(3);
  for (const gguf::KeyValue& kv : (*file)->metadata()) w.set(kv.key, gguf::MetaValue::fromParsed(kv.value));
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    const llvm::ArrayRef<uint8_t> data = (*file)->tensorData(t);
    std::vector<uint8_t> bytes(data.begin(), data.end());
    if (tensor_edit) tensor_edit(std::string(t.name), bytes);
    w.addTensor(t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims), std::move(bytes));
  }
  edit(w);
  const std::string path = scratchDir() + "/" + name + ".gguf";
  llvm::Error written = w.write(path);
  REQUIRE_MESSAGE(!written, llvm::toString(std::move(written)));
  return path;
}

std::string ggufVariant(const std::string& src, const std::string& name, const std::function<void(gguf::GgufWriter&)>& edit,
                        const TensorEdit& tensor_edit, uint32_t n_ctx) {
  CompileOptions options;
  options.input = ggufCopy(src, name, edit, tensor_edit);
  options.output = scratchDir() + "/" + name + ".mfb";
  options.max_batch = 64;
  options.n_ctx = n_ctx;
  auto summary = compileModel(options);
  REQUIRE_MESSAGE(bool(summary), llvm::toString(summary.takeError()));
  return options.output;
}

LogitDiff compareLogits(const float* got, const float* want, int rows, int n_vocab, const std::vector<double>& margin,
                        double allowed_abs) {
  LogitDiff d;
  double sq_diff = 0, sq_ref = 0;
  for (int r = 0; r < rows; ++r) {
    const float* g = got + static_cast<size_t>(r) * n_vocab;
    const float* w = want + static_cast<size_t>(r) * n_vocab;
    for (int t = 0; t < n_vocab; ++t) {
      const double diff = std::isfinite(g[t]) ? std::fabs(static_cast<double>(g[t]) - w[t]) : INFINITY;
      d.max_abs = std::max(d.max_abs, diff);
      d.max_ref = std::max(d.max_ref, std::fabs(static_cast<double>(w[t])));
      sq_diff += diff * diff;
      sq_ref += static_cast<double>(w[t]) * w[t];
    }
    if (r < static_cast<int>(margin.size()) && margin[r] > 2 * allowed_abs) {
      ++d.argmax_checked;
      if (std::max_element(g, g + n_vocab) - g != std::max_element(w, w + n_vocab) - w) ++d.argmax_mismatch;
    }
  }
  d.rms_rel = sq_ref > 0 ? std::sqrt(sq_diff / sq_ref) : std::sqrt(sq_diff);
  return d;
}

}  // namespace minfer::test
