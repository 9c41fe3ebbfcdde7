// The command-line tools end to end: minfer-compile → minfer-run prints llama.cpp's story;
// minfer-perplexity reproduces llama-perplexity's value; bad inputs give clear errors and exit 1.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "tests/test_support.h"

namespace {

struct RunResult {
  int status = -1;
  std::string output;  // stdout (and stderr, unless stdout_only)
};

// Runs `command` through the shell; captures stdout, plus stderr unless `stdout_only`.
RunResult run(const std::string& command, bool stdout_only = false) {
  RunResult r;
  FILE* pipe = popen((command + (stdout_only ? " 2>/dev/null" : " 2>&1")).c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

std::string tool(const char* name) { return std::string(MINFER_TOOLS_DIR) + "/" + name; }

std::string compileStories() {
  static std::string path;
  if (!path.empty()) return path;
  const std::string out = minfer::test::scratchDir() + "/stories260K-tools.mfb";
  const RunResult r = run(tool("minfer-compile") + " " + minfer::test::fixturesDir() + "/models/stories260K.gguf -o " + out);
  INFO(r.output);
  REQUIRE(r.status == 0);
  path = out;
  return path;
}

}  // namespace

TEST_CASE("minfer-run prints llama.cpp's stories260K story") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  const RunResult r = run(tool("minfer-run") + " " + artifact +
                          " -p 'Once upon a time' -n 64 --temp 0 --device cpu", /*stdout_only=*/true);
  CHECK(r.status == 0);
  // fixtures README §5: llama-completion's output for this prompt.
  const std::string story =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw "
      "a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said\n";
  CHECK(r.output == story);
}

TEST_CASE("minfer-run --logits-out writes (n_prompt + n_fed) × n_vocab floats") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  const std::string logits = minfer::test::scratchDir() + "/logits.f32";
  const RunResult r = run(tool("minfer-run") + " " + artifact + " -p 'Once upon a time' -n 8 --temp 0 --device cpu --logits-out " + logits);
  INFO(r.output);
  REQUIRE(r.status == 0);
  const std::vector<float> got = minfer::test::readF32File(logits);
  // 5 prompt rows, then one row per generated token fed back: 8 generated, the last one not fed.
  CHECK(got.size() == (5 + 7) * 512u);
  const std::vector<float> golden =
      minfer::test::readF32File(minfer::test::fixturesDir() + "/goldens/stories260K-F32_once.prefill.f32");
  REQUIRE(got.size() >= golden.size());
  double max_diff = 0;
  for (size_t i = 0; i < golden.size(); ++i) max_diff = std::max(max_diff, double(std::fabs(got[i] - golden[i])));
  CHECK(max_diff < 1e-4);  // F32 model, max |logit| ≈ 19: the 1e-5 relative bound of test_goldens_cpu
}

TEST_CASE("minfer-perplexity reproduces llama-perplexity on story.txt") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  const RunResult r = run(tool("minfer-perplexity") + " " + artifact + " -f " + minfer::test::fixturesDir() +
                          "/text/story.txt -c 128 --device cpu");
  INFO(r.output);
  REQUIRE(r.status == 0);
  std::smatch m;
  const std::regex final_re("Final estimate: PPL = ([0-9.]+) \\+/- ([0-9.]+)");
  REQUIRE(std::regex_search(r.output, m, final_re));
  // llama.cpp: PPL = 3.1974 +/- 0.23449 (fixtures README §7). Measured 3.1973 +/- 0.23446: the
  // printed value is rounded to 4 decimals, and the F32 logits agree to ~1e-6.
  CHECK(std::stod(m[1]) == doctest::Approx(3.1974).epsilon(2e-4));
  CHECK(std::stod(m[2]) == doctest::Approx(0.23449).epsilon(5e-4));
  CHECK(r.output.find("[7]") != std::string::npos);
}

TEST_CASE("tools refuse bad inputs with a message and exit code 1, leaving no output file") {
  const std::string dir = minfer::test::scratchDir();
  const std::string junk = dir + "/junk.gguf";
  std::ofstream(junk) << "this is not a gguf file";
  const std::string out = dir + "/junk.mfb";
  RunResult r = run(tool("minfer-compile") + " " + junk + " -o " + out);
  CHECK(r.status == 1);
  CHECK(r.output.find("not a GGUF file") != std::string::npos);
  CHECK(!std::filesystem::exists(out));

  r = run(tool("minfer-run") + " " + junk + " -p hi");
  CHECK(r.status == 1);
  CHECK(r.output.find("junk.gguf") != std::string::npos);

  r = run(tool("minfer-inspect") + " " + junk);
  CHECK(r.status == 1);
  CHECK(r.output.find("magic") != std::string::npos);

  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  for (const char* bad : {"-c -5", "-n -7", "--device tpu", "--temp -1"}) {
    CAPTURE(bad);
    r = run(tool("minfer-run") + " " + artifact + " -p hi " + bad);
    CHECK(r.status == 1);
    CHECK(r.output.find("minfer-run:") != std::string::npos);
  }
  r = run(tool("minfer-run") + " " + artifact + " -p 'Once upon a time there was a girl' -c 4 --temp 0");
  CHECK(r.status == 1);
  CHECK(r.output.find("does not fit the context") != std::string::npos);
  r = run(tool("minfer-compile") + " " + minfer::test::fixturesDir() + "/models/stories260K.gguf --max-batch 0 -o " + out);
  CHECK(r.status == 1);
  CHECK(!std::filesystem::exists(out));
}

TEST_CASE("minfer-inspect --json shows each fixture model's tensor types as the goldens list them") {
  if (!minfer::test::haveFixtures()) return;
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(minfer::test::fixturesDir() + "/goldens")) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    const nlohmann::json golden = nlohmann::json::parse(in);
    const std::string model = golden.at("model").get<std::string>();
    CAPTURE(model);
    const RunResult r = run(tool("minfer-inspect") + " --json " + minfer::test::fixturesDir() + "/models/" + model,
                            /*stdout_only=*/true);
    REQUIRE(r.status == 0);
    const nlohmann::json j = nlohmann::json::parse(r.output);
    std::map<std::string, std::string> type_of;
    for (const auto& t : j.at("tensors")) type_of[t.at("name").get<std::string>()] = t.at("type").get<std::string>();
    size_t listed = 0;
    for (const auto& [type, names] : golden.at("model_tensor_types").items())
      for (const auto& name : names) {
        CHECK(type_of[name.get<std::string>()] == type);
        ++listed;
      }
    CHECK(listed == type_of.size());
    const auto& hp = golden.at("model_hparams");
    const std::string arch = golden.at("model_arch").get<std::string>();
    CHECK(j.at("metadata").at(arch + ".embedding_length").get<int>() == hp.at("n_embd").get<int>());
    CHECK(j.at("metadata").at(arch + ".block_count").get<int>() == hp.at("n_layer").get<int>());
    ++checked;
  }
  CHECK(checked >= 20);
}

TEST_CASE("examples/generate.cpp: the runtime embedded in a program continues the story") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  const RunResult r = run(tool("minfer-example") + " " + artifact + " 'Once upon a time' 20", /*stdout_only=*/true);
  CHECK(r.status == 0);
  CHECK(r.output == "Once upon a time, there was a little girl named Lily. She loved to play outsid\n");
}
