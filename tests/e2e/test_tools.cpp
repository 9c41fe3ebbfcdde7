// The command-line tools end to end: minfer-compile → minfer-run prints llama.cpp's story;
// minfer-perplexity reproduces llama-perplexity's value; bad inputs give clear errors and exit 1.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "compiler/gguf/gguf_reader.h"
#include "compiler/gguf/gguf_writer.h"
#include "minfer/runtime.h"
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
  // The default --target (auto): this machine's GPU, or without one the portable set with PTX.
  const bool gpu = std::filesystem::exists("/dev/nvidia0");
  if (r.output.find("kernels:") != std::string::npos) {  // a build without NVRTC writes no images
    CHECK(r.output.find("(--target auto: ") != std::string::npos);
    if (!gpu) CHECK(r.output.find("4 targets: sm_80,sm_86,sm_89,sm_90 (--target auto: no usable GPU here") != std::string::npos);
  }
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

TEST_CASE("minfer-run --verbose: the model's facts, then each token's id, a line ended before the summary") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  const std::string err = minfer::test::scratchDir() + "/verbose.err";
  const RunResult r = run("(" + tool("minfer-run") + " " + artifact + " -p 'Once upon a time' -n 4 --temp 0 " +
                              "--device cpu --verbose 2>" + err + ")", /*stdout_only=*/true);
  CHECK(r.status == 0);
  std::ifstream in(err);
  const std::string e((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO(e);
  // stories260K (fixtures README): 512 tokens, 64-wide embedding, 8 heads, 4 KV heads.
  CHECK(e.find("n_vocab 512, n_embd 64, n_head 8, n_head_kv 4") != std::string::npos);
  // The first generated token of the golden story is 432 (" ,"); ids on one line, ended before the summary.
  CHECK(e.find("[432]") != std::string::npos);
  CHECK(std::regex_search(e, std::regex("(\\[[0-9]+\\]){4}\nminfer-run: prompt 5 tokens")));
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

TEST_CASE("minfer-bench -d: tests at a depth (llama-bench's -d), named and reported with it; bad depths refused") {
  if (!minfer::test::haveFixtures()) return;
  const std::string mfb = compileStories();
  const RunResult r = run(tool("minfer-bench") + " " + mfb + " -p 8 -n 4 -d 0,16 -r 2 --device cpu --json", true);
  INFO(r.output);
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.output);
  REQUIRE(j.size() == 4);  // per depth: pp8, tg4
  const std::pair<const char*, int> want[] = {{"pp8", 0}, {"tg4", 0}, {"pp8 @ d16", 16}, {"tg4 @ d16", 16}};
  for (size_t i = 0; i < 4; ++i) {
    CHECK(j[i]["test"] == want[i].first);
    CHECK(j[i]["n_depth"] == want[i].second);
    CHECK(j[i]["avg_ts"].get<double>() > 0);
    CHECK(j[i]["samples_ts"].size() == 2);
  }
  // A depth plus the test beyond the artifact's context is the session's refusal, not a crash.
  for (const char* bad : {"-1", "99999999"}) {
    const RunResult e = run(tool("minfer-bench") + " " + mfb + " -p 8 -n 0 -r 1 --device cpu -d " + bad);
    INFO(e.output);
    CHECK(e.status == 1);
    CHECK(e.output.find("-d values must be in 0..2^24") != std::string::npos);
  }
}

TEST_CASE("minfer-bench --parallel: llama-batched-bench's rows per B through the BatchSession; bad lists refused") {
  if (!minfer::test::haveFixtures()) return;
  const std::string mfb = compileStories();
  const std::string bench = tool("minfer-bench") + " " + mfb + " --device cpu -t 1 -p 8 -n 4 -r 2 --parallel 1,2";
  const RunResult r = run(bench + " --json", true);
  INFO(r.output);
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.output);
  REQUIRE(j.size() == 2);  // one row per B
  for (int i = 0; i < 2; ++i) {
    const int b = i + 1;
    CHECK(j[i]["backend"] == "CPU");
    CHECK(j[i]["n_parallel"] == b);
    CHECK(j[i]["n_prompt"] == 8);
    CHECK(j[i]["n_gen"] == 4);
    CHECK(j[i]["n_kv"] == b * (8 + 4));
    for (const char* key : {"pp_avg_ts", "tg_avg_ts", "total_avg_ts", "ttft_avg_ms", "itl_avg_ms"}) {
      INFO(key);
      CHECK(j[i][key].get<double>() > 0);
    }
    CHECK(j[i]["tg_samples_ts"].size() == 2);  // -r 2
  }
  // The markdown table: PP, TG, B, N_KV, then five "mean ± sd" columns, one row per B.
  const RunResult md = run(bench, true);
  REQUIRE(md.status == 0);
  const std::regex row(R"(\| stories260K\.gguf \| [^|]+ \| [^|]+ \| CPU \| 8 \| 4 \| ([12]) \| (12|24) \|)"
                       R"(( [0-9.]+ ± [0-9.]+ \|){5}\n)");
  CHECK(std::distance(std::sregex_iterator(md.output.begin(), md.output.end(), row), std::sregex_iterator()) == 2);
  const RunResult csv = run(bench + " --csv", true);
  REQUIRE(csv.status == 0);
  CHECK(std::count(csv.output.begin(), csv.output.end(), '\n') == 3);  // header + one line per B
  CHECK(csv.output.rfind("model,backend,batched_kernels,n_prompt,n_gen,n_parallel,n_kv,", 0) == 0);

  // More sequences and tokens than one step holds (--max-batch 4): prompts split across steps, decode
  // steps split across batches.
  const std::string small = minfer::test::scratchDir() + "/stories260K-mb4.mfb";
  REQUIRE(run(tool("minfer-compile") + " " + minfer::test::fixturesDir() + "/models/stories260K.gguf -o " + small +
              " --target= --max-batch 4").status == 0);
  const RunResult split = run(tool("minfer-bench") + " " + small + " --device cpu -t 1 -p 6 -n 2 -r 1 --parallel 5 --json", true);
  INFO(split.output);
  REQUIRE(split.status == 0);
  CHECK(nlohmann::json::parse(split.output)[0]["n_kv"] == 5 * 8);
  // --parallel-argmax: the argmax instead of the rows (prompts split across steps: the chunks before a prompt's last
  // ask for nothing); the backend column says so.
  const RunResult greedy =
      run(tool("minfer-bench") + " " + small + " --device cpu -t 1 -p 6 -n 2 -r 1 --parallel 5 --parallel-argmax --json", true);
  INFO(greedy.output);
  REQUIRE(greedy.status == 0);
  const nlohmann::json g = nlohmann::json::parse(greedy.output);
  CHECK(g[0]["backend"] == "CPU argmax");
  CHECK(g[0]["n_kv"] == 5 * 8);
  CHECK(g[0]["tg_avg_ts"].get<double>() > 0);

  // Bad values: the option, the value and what is wrong; exit status 1.
  const std::pair<const char*, const char*> bad[] = {
      {"--parallel 0", "--parallel 0: element 1 (0) is out of range 1..4096"},
      {"--parallel 4097", "--parallel 4097: element 1 (4097) is out of range 1..4096"},
      {"--parallel 1,x", "--parallel 1,x: element 2 (\"x\") is not an integer"},
      {"--parallel 1,,2", "--parallel 1,,2: element 2 is empty"},
      {"--parallel 2,", "--parallel 2,: element 2 is empty"},
      {"--parallel 99999999999", "out of range 1..4096"},
      {"--parallel 1 -p 0", "-p 0: with --parallel every prompt needs at least 1 token"},
      {"--parallel 1 -n 0", "-n 0: with --parallel every sequence needs at least 1 decode step"},
      {"--parallel 1 -d 8", "-d is not supported with --parallel"},
      {"--parallel-argmax", "--parallel-argmax needs --parallel"},
  };
  for (const auto& [args, says] : bad) {
    const RunResult e = run(tool("minfer-bench") + " " + mfb + " --device cpu -r 1 " + args);
    INFO(args << " → " << e.output);
    CHECK(e.status == 1);
    CHECK(e.output.find(says) != std::string::npos);
  }
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
  for (const char* bad : {"-c -5", "-n -7", "--device tpu", "--top-p 2"}) {
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
  // Both streams to one pipe: the text and its newline come out before the summary on stderr.
  const RunResult both = run(tool("minfer-example") + " " + artifact + " 'Once upon a time' 20");
  CHECK_MESSAGE(both.output.find("outsid\n5 prompt tokens, 20 generated (token limit)\n") != std::string::npos,
                both.output);
  // n_tokens that is not a number: usage error, nothing generated.
  const RunResult bad = run(tool("minfer-example") + " " + artifact + " 'Once upon a time' 20x");
  CHECK(bad.status == 2);
  CHECK(bad.output.find("n_tokens '20x' is not a number") != std::string::npos);
}

namespace {

// fixtures README §5: llama-completion's greedy continuation of "Once upon a time" (64 tokens).
const char kStory[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw "
    "a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said\n";

// stderr only (run() adds "2>&1" after the group).
std::string stderrOf(const std::string& command) { return run("{ " + command + " 2>&1 >/dev/null; }").output; }

// stories260K.gguf copied with `key` = `id` added, compiled by minfer-compile; returns the artifact.
std::string storiesWithTokenKey(const std::string& key, uint32_t id) {
  auto file = minfer::gguf::GgufFile::open(minfer::test::fixturesDir() + "/models/stories260K.gguf");
  REQUIRE_MESSAGE(bool(file), llvm::toString(file.takeError()));
  minfer::gguf::GgufWriter w(3);
  for (const auto& kv : (*file)->metadata()) w.set(kv.key, minfer::gguf::MetaValue::fromParsed(kv.value));
  for (const auto& t : (*file)->tensors()) {
    const llvm::ArrayRef<uint8_t> data = (*file)->tensorData(t);
    w.addTensor(t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims), std::vector<uint8_t>(data.begin(), data.end()));
  }
  w.setU32(key, id);
  const std::string base = minfer::test::scratchDir() + "/stories260K-" + key.substr(key.rfind('.') + 1);
  llvm::Error written = w.write(base + ".gguf");
  REQUIRE_MESSAGE(!written, llvm::toString(std::move(written)));
  const RunResult r = run(tool("minfer-compile") + " " + base + ".gguf -o " + base + ".mfb");
  INFO(r.output);
  REQUIRE(r.status == 0);
  return base + ".mfb";
}

}  // namespace

TEST_CASE("minfer-run: llama.cpp's flag spellings, --temp < 0 greedy, --top-k <= 0 off, -ngl accepted") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  RunResult r = run(tool("minfer-run") + " --model " + artifact +
                        " --prompt 'Once upon a time' --n-predict 64 --temp -1 --top-k -3 --ctx-size 256 --threads 1 "
                        "-ngl 99 --device cpu",
                    /*stdout_only=*/true);
  CHECK(r.status == 0);
  CHECK(r.output == kStory);
  r = run(tool("minfer-run") + " -m " + artifact + " -p 'Once upon a time' -n 64 --temp 0 --top-k 0 --device cpu",
          /*stdout_only=*/true);
  CHECK(r.output == kStory);
  CHECK(stderrOf(tool("minfer-run") + " -m " + artifact + " -p hi -n 1 --temp 0 -ngl 99 --device cpu")
            .find("-ngl is ignored") != std::string::npos);
  const std::string help = run(tool("minfer-run") + " --help", true).output;
  for (const char* flag : {"--no-parse-special", "--no-escape", "--prompt", "--file", "--ctx-size", "--n-predict",
                           "--threads", "--model", "-ngl"}) {
    CAPTURE(flag);
    CHECK(help.find(flag) != std::string::npos);
  }
  r = run(tool("minfer-run") + " -p hi");
  CHECK(r.status == 1);
  CHECK(r.output.find("no model") != std::string::npos);
}

TEST_CASE("minfer-run: escapes in -p and -f (llama.cpp's --escape), one trailing newline of -f dropped") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  // -n 0 prints the prompt as it was read, then a newline.
  RunResult r = run(tool("minfer-run") + " " + artifact + " -p 'a\\tb\\x41\\\\n\\q' -n 0 --device cpu", true);
  CHECK(r.output == "a\tbA\\n\\q\n");
  r = run(tool("minfer-run") + " " + artifact + " -p 'a\\tb' -n 0 --no-escape --device cpu", true);
  CHECK(r.output == "a\\tb\n");
  // "Once upon a\x20time" + newline in a file reads as "Once upon a time": the golden story follows.
  const std::string file = minfer::test::scratchDir() + "/prompt-escaped.txt";
  std::ofstream(file, std::ios::binary) << "Once upon a\\x20time\n";
  r = run(tool("minfer-run") + " " + artifact + " --file " + file + " -n 64 --temp 0 --device cpu", true);
  CHECK(r.output == kStory);
  r = run(tool("minfer-run") + " " + artifact + " -f " + file + " -n 0 --no-escape --device cpu", true);
  CHECK(r.output == "Once upon a\\x20time\n");
}

TEST_CASE("minfer-run: control-token text in the prompt is that token (Hello</s>world: 8 tokens, 11 without)") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  const std::regex prompt_re("prompt ([0-9]+) tokens");
  std::smatch m;
  std::string err = stderrOf(tool("minfer-run") + " " + artifact + " -p 'Hello</s>world' -n 1 --temp 0 --device cpu");
  REQUIRE(std::regex_search(err, m, prompt_re));
  CHECK(m[1] == "8");
  err = stderrOf(tool("minfer-run") + " " + artifact + " -p 'Hello</s>world' -n 1 --temp 0 --no-parse-special --device cpu");
  REQUIRE(std::regex_search(err, m, prompt_re));
  CHECK(m[1] == "11");
}

TEST_CASE("minfer-run: ' [end of text]' at an end-of-generation token (eot/eom ids from the GGUF), context full") {
  if (!minfer::test::haveFixtures()) return;
  // The greedy continuation's first token is 432 "," (fixtures README §5). Declared as the EOT or EOM
  // token, it ends generation at once: llama-completion prints the prompt, then " [end of text]".
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    CAPTURE(key);
    const std::string artifact = storiesWithTokenKey(key, 432);
    const RunResult r = run(tool("minfer-run") + " " + artifact + " -p 'Once upon a time' --temp 0 --device cpu", true);
    CHECK(r.status == 0);
    CHECK(r.output == "Once upon a time [end of text]\n");
  }
  // A full context: llama-completion samples n_ctx − n_prompt tokens (5 prompt tokens, -c 12: 7), then
  // warns on stderr. The 7 tokens are the golden's first 7.
  const std::string artifact = compileStories();
  const std::string cmd = tool("minfer-run") + " " + artifact + " -p 'Once upon a time' -c 12 --temp 0 --device cpu";
  const std::string out = run(cmd, true).output;
  REQUIRE(out.size() > 17);
  CHECK(out.back() == '\n');
  CHECK(std::string(kStory).compare(0, out.size() - 1, out, 0, out.size() - 1) == 0);  // the golden's start
  const std::string err = stderrOf(cmd);
  CHECK(err.find("context full and context shift is disabled => stopping") != std::string::npos);
  CHECK(err.find("generated 7 tokens") != std::string::npos);
}

TEST_CASE("minfer-perplexity: llama-perplexity's tokens, windows, refusal and PPL at several -c") {
  if (!minfer::test::haveFixtures()) return;
  const std::string artifact = compileStories();
  const std::string text_path = minfer::test::fixturesDir() + "/text/story.txt";
  std::ifstream in(text_path, std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(raw.back() == '\n');
  auto model = minfer::Model::open(artifact, minfer::BackendKind::kCpu);
  REQUIRE_MESSAGE(model.isOk(), model.status().message());
  // llama-perplexity: -f drops one trailing newline; tokens with BOS, no special parsing.
  const std::vector<int32_t> tokens = *(*model)->tokenize(raw.substr(0, raw.size() - 1), true, false);
  const size_t with_newline = (*model)->tokenize(raw, true, false)->size();
  REQUIRE(with_newline > tokens.size());
  const int n = static_cast<int>(tokens.size());
  const int n_vocab = (*model)->info().n_vocab;
  // A -c where keeping the newline would make one more window, plus ordinary ones and 128 (README §7).
  int c_edge = 0;
  for (int c = 8; c <= n / 2 && !c_edge; ++c)
    if (with_newline / c != tokens.size() / c) c_edge = c;
  if (c_edge == 0) c_edge = 100;  // no divisor of the count in range: nothing at the edge to check
  MESSAGE("story.txt: " << n << " tokens (" << with_newline << " with the trailing newline); edge -c " << c_edge);
  for (const int c : {c_edge, 64, 128, 300, n / 2}) {
    CAPTURE(c);
    const RunResult r = run(tool("minfer-perplexity") + " " + artifact + " -f " + text_path + " --ctx-size " +
                            std::to_string(c) + " --device cpu");
    INFO(r.output);
    REQUIRE(r.status == 0);
    const int windows = n / c;
    CHECK(r.output.find(std::to_string(n) + " tokens, " + std::to_string(windows) + " windows of " + std::to_string(c)) !=
          std::string::npos);
    CHECK(r.output.find("[" + std::to_string(windows) + "]") != std::string::npos);
    CHECK(r.output.find("[" + std::to_string(windows + 1) + "]") == std::string::npos);
    // The definition, summed here from the CPU backend's logits: BOS first in each window, positions
    // c/2 … c−2 predict the next token.
    auto session = (*model)->createSession({.n_ctx = c, .n_threads = 2});
    REQUIRE(session.isOk());
    double nll = 0;
    long count = 0;
    std::vector<float> logits(static_cast<size_t>(c) * n_vocab);
    for (int w = 0; w < windows; ++w) {
      std::vector<int32_t> window(tokens.begin() + w * c, tokens.begin() + (w + 1) * c);
      window[0] = 1;  // BOS
      (*session)->reset();
      REQUIRE((*session)->prefill(window, logits).isOk());
      for (int p = c / 2; p < c - 1; ++p) {
        const float* row = &logits[static_cast<size_t>(p) * n_vocab];
        long double sum = 0;
        for (int v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<long double>(row[v]));
        nll += static_cast<double>(std::log(sum) - row[window[p + 1]]);
        ++count;
      }
    }
    std::smatch m;
    const std::regex final_re("Final estimate: PPL = ([0-9.]+)");
    REQUIRE(std::regex_search(r.output, m, final_re));
    CHECK(std::stod(m[1]) == doctest::Approx(std::exp(nll / count)).epsilon(1e-4));
  }
  // Fewer than 2·n_ctx tokens: llama-perplexity's refusal.
  const int c = n / 2 + 1;
  const RunResult r = run(tool("minfer-perplexity") + " " + artifact + " -f " + text_path + " -c " + std::to_string(c) +
                          " --device cpu");
  CHECK(r.status == 1);
  CHECK(r.output.find("you need at least " + std::to_string(2 * c) + " tokens to evaluate perplexity with a context of " +
                      std::to_string(c)) != std::string::npos);
  CHECK(r.output.find("the data file you provided tokenizes to only " + std::to_string(n) + " tokens") !=
        std::string::npos);
}
