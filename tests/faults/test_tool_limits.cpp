// -c / -n / --max-batch at 0, negative and huge for minfer-run, minfer-perplexity and minfer-compile:
// each either works (where the value means something) or exits 1 with a message naming the flag or
// the limit; none crashes, and a failed compile leaves no file.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "minfer/artifact.h"
#include "minfer/runtime.h"
#include "tests/faults/fault_support.h"
#include "tests/test_support.h"

using minfer::test::ChildResult;
using minfer::test::TinyGgufSpec;

namespace fs = std::filesystem;

namespace {

struct Paths {
  std::string dir, gguf, mfb, text;
};

const Paths& paths() {
  static const Paths p = [] {
    Paths p;
    p.dir = minfer::test::scratchDir() + "/tool-limits";
    fs::create_directories(p.dir);
    p.gguf = p.dir + "/tiny.gguf";
    p.mfb = p.dir + "/tiny.mfb";
    p.text = p.dir + "/text.txt";
    minfer::test::writeTinyGguf(TinyGgufSpec{}, p.gguf);
    minfer::test::compileWithTool(p.gguf, p.mfb);
    std::ofstream(p.text) << "the cat sat on the mat and the cat sat on the mat. a cat sat on a mat.";
    return p;
  }();
  return p;
}

struct Case {
  std::vector<std::string> args;  // after the tool's positional file arguments
  int status;                     // expected exit status
  std::string words;              // expected in the output ("" = anything)
};

void runCases(const std::string& tool, const std::vector<std::string>& positional, const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    std::vector<std::string> argv = {minfer::test::toolPath(tool)};
    argv.insert(argv.end(), positional.begin(), positional.end());
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    std::string shown;
    for (const std::string& a : c.args) shown += " " + a;
    CAPTURE(tool);
    CAPTURE(shown);
    const ChildResult r = minfer::test::runChild(argv);
    INFO(r.output);
    CHECK(r.describe() == "exit " + std::to_string(c.status));
    if (!c.words.empty()) CHECK_MESSAGE(r.output.find(c.words) != std::string::npos, "missing '" << c.words << "'");
  }
}

}  // namespace

TEST_CASE("minfer-run: -c and -n at 0, negative and huge") {
  const Paths& p = paths();
  const std::vector<std::string> base = {p.mfb, "-p", "the cat", "--temp", "0", "--device", "cpu"};
  runCases("minfer-run", base,
           {
               {{"-c", "0", "-n", "3"}, 0, "context 64"},  // 0 = the model's context (64 here)
               {{"-c", "-1"}, 1, "-c -1 is out of range"},
               {{"-c", "-2147483648"}, 1, "out of range"},
               {{"-c", "1048577"}, 1, "-c 1048577 is out of range 0..1048576"},
               {{"-c", "99999999999"}, 1, "minfer-run"},  // not an int: llvm::cl refuses it
               {{"-c", "2"}, 1, "does not fit the context"},  // BOS + 2 prompt tokens
               {{"-c", "1048576", "-n", "2"}, 0, "context 1048576"},  // the largest context, tiny model: fits
               {{"-n", "0"}, 0, "generated 0 tokens"},
               {{"-n", "-1", "-c", "12"}, 0, "stop: "},  // unlimited: until end of generation or a full context
               {{"-n", "-2", "-c", "12"}, 0, "stop: context full"},  // llama.cpp's -2: until the context is full
               {{"-n", "-3"}, 1, "-n -3 must be -1 or -2"},
               {{"-n", "2147483647", "-c", "12"}, 0, "stop: "},
               {{"-n", "99999999999"}, 1, "minfer-run"},
           });
}

TEST_CASE("minfer-perplexity: -c at 0, negative, below the minimum and huge") {
  const Paths& p = paths();
  const std::vector<std::string> base = {p.mfb, "-f", p.text, "--device", "cpu"};
  runCases("minfer-perplexity", base,
           {
               {{"-c", "0"}, 1, "-c 0 is out of range 4..1048576"},
               {{"-c", "-4"}, 1, "-c -4 is out of range"},
               {{"-c", "3"}, 1, "-c 3 is out of range"},
               {{"-c", "1048577"}, 1, "out of range"},
               {{"-c", "99999999999"}, 1, "minfer-perplexity"},
               // llama-perplexity's refusal (2·n_ctx tokens needed), before any allocation
               {{"-c", "1048576"}, 1, "you need at least 2097152 tokens to evaluate perplexity with a context of 1048576"},
               {{"-c", "8"}, 0, "Final estimate: PPL = "},
           });
}

TEST_CASE("minfer-compile: --max-batch at 0, negative, past the limit, huge and at the limit") {
  const Paths& p = paths();
  const std::string out = p.dir + "/limits.mfb";
  const std::vector<std::string> base = {p.gguf, "-o", out, "--target=", "-j", "1"};
  runCases("minfer-compile", base,
           {
               {{"--max-batch", "0"}, 1, "--max-batch 0 is out of range 1..65536"},
               {{"--max-batch", "-1"}, 1, "minfer-compile"},  // not an unsigned: llvm::cl refuses it
               {{"--max-batch", "65537"}, 1, "--max-batch 65537 is out of range 1..65536"},
               {{"--max-batch", "4294967296"}, 1, "minfer-compile"},
               {{"--max-batch", "99999999999999999999"}, 1, "minfer-compile"},
           });
  CHECK(!fs::exists(out));
  for (const char* ok : {"1", "65536"}) {
    CAPTURE(ok);
    runCases("minfer-compile", base, {{{"--max-batch", ok}, 0, "wrote"}});
    auto file = minfer::ArtifactFile::open(out);
    REQUIRE_MESSAGE(file.isOk(), file.status().message());
    CHECK((*file)->manifest()->memory()->max_batch() == static_cast<uint32_t>(std::stoul(ok)));
  }
  // The largest batch is honoured by the runtime too (activation buffers for 65536 rows, tiny widths).
  runCases("minfer-run", {out, "-p", "the cat", "-n", "2", "--temp", "0", "--device", "cpu"}, {{{}, 0, "stop: "}});
}
