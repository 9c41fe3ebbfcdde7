// Replays every checked-in fuzz input (tests/fuzz/corpus/<target>/ and tests/fuzz/regressions/<target>/)
// through its harness in the ordinary sanitized build, and reports the peak memory each input needed.
//
// A harness that finds a violated invariant aborts (fuzz_harness.h); ASan/UBSan stop on any memory or
// undefined-behaviour error. Peak memory per input is the growth of the process's peak RSS (VmHWM,
// reset through /proc/self/clear_refs before each input); every input must stay under kMaxInputRssMb.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "compiler/gguf/gguf_reader.h"
#include "compiler/gguf/gguf_writer.h"
#include "llvm/Support/MemoryBuffer.h"
#include "tests/fuzz/fuzz_harness.h"
#include "tests/test_support.h"

namespace {

namespace fs = std::filesystem;

constexpr long kMaxInputRssMb = 256;

struct Target {
  const char* name;
  int (*run)(const uint8_t*, size_t);
};

const Target kTargets[] = {
    {"fuzz_gguf_reader", minfer::fuzz::runGgufReader},
    {"fuzz_artifact", minfer::fuzz::runArtifact},
    {"fuzz_tokenizer", minfer::fuzz::runTokenizer},
};

// The checked-in inputs, plus <dir>/<target>/ when MINFER_FUZZ_EXTRA_CORPUS=<dir> is set (e.g. the
// corpus a long local run grew, to measure its peak memory per input).
std::vector<fs::path> inputsOf(const std::string& target) {
  std::vector<fs::path> files;
  std::vector<fs::path> dirs = {fs::path(MINFER_FUZZ_DIR) / "corpus" / target,
                                fs::path(MINFER_FUZZ_DIR) / "regressions" / target};
  if (const char* extra = std::getenv("MINFER_FUZZ_EXTRA_CORPUS"); extra && *extra)
    dirs.push_back(fs::path(extra) / target);
  for (const fs::path& dir : dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST_CASE("every corpus and regression input runs through its fuzz harness without a finding") {
  for (const Target& t : kTargets) {
    const std::vector<fs::path> files = inputsOf(t.name);
    INFO("target " << std::string(t.name));
    CHECK_MESSAGE(files.size() >= 3, "expected a seed corpus in tests/fuzz/corpus/" << t.name);
    struct Peak {
      long kb;
      std::string file;
    };
    std::vector<Peak> peaks;
    const uint8_t warm_up[1] = {0};
    t.run(warm_up, 1);  // one-time costs (vocabularies, the memfd, worker threads) are not an input's
    for (const fs::path& path : files) {
      INFO("input " << path.string());
      const std::vector<uint8_t> bytes = minfer::test::readFile(path.string());
      // An allocation of exactly the input's size, as libFuzzer passes it: a vector's spare capacity
      // would hide a read just past the end from ASan.
      const std::unique_ptr<uint8_t[]> exact(new uint8_t[std::max<size_t>(bytes.size(), 1)]);
      std::copy(bytes.begin(), bytes.end(), exact.get());
      const bool measured = minfer::test::resetPeakRss();
      const long before = minfer::test::procStatusKb("VmRSS");
      CHECK(t.run(exact.get(), bytes.size()) == 0);
      if (measured && before >= 0) {
        const long grew = minfer::test::procStatusKb("VmHWM") - before;
        CHECK_MESSAGE(grew < kMaxInputRssMb * 1024, "peak RSS grew by " << grew << " kB");
        peaks.push_back({grew, path.filename().string()});
      }
    }
    std::sort(peaks.begin(), peaks.end(), [](const Peak& a, const Peak& b) { return a.kb > b.kb; });
    std::string top;
    for (size_t k = 0; k < peaks.size() && k < 3; ++k)
      top += " " + peaks[k].file + " +" + std::to_string(peaks[k].kb) + " kB;";
    MESSAGE(std::string(t.name) << ": " << files.size() << " inputs; largest peak-RSS growth:" << top);
  }
}

TEST_CASE("the harness UTF-8 validator follows Table 3-7") {
  using minfer::fuzz::isWellFormedUtf8;
  CHECK(isWellFormedUtf8(""));
  CHECK(isWellFormedUtf8("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\xA6\x99"));  // é € 🦙
  CHECK(isWellFormedUtf8("\xED\x9F\xBF\xF4\x8F\xBF\xBF"));            // U+D7FF, U+10FFFF
  for (const char* bad : {"\x80", "\xC0\x80", "\xC1\xBF", "\xE0\x9F\xBF", "\xED\xA0\x80", "\xF0\x8F\xBF\xBF",
                          "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xC3", "\xE2\x82", "\xE2\x28\xA1", "\xFF"}) {
    INFO(std::string(bad));
    CHECK_FALSE(isWellFormedUtf8(bad));
  }
}

// Regression of fuzz finding 1 (TESTING.md): GCC's -fsanitize=undefined does not include
// float-cast-overflow, so the replay alone would not catch the old cast in this build.
TEST_CASE("regression: Value::integerAt of float elements truncates, saturates, and maps NaN to 0") {
  const double values[] = {std::numeric_limits<double>::quiet_NaN(), 1e306, -1e306, 2.9, -2.9,
                           9223372036854775808.0, -9223372036854775808.0, 4611686018427387904.0};
  std::vector<uint8_t> raw(sizeof(values));
  std::memcpy(raw.data(), values, sizeof(values));
  minfer::gguf::GgufWriter w(3);
  w.set("t.f64", minfer::gguf::MetaValue::scalarArray(minfer::gguf::ValueType::FLOAT64, raw));
  const std::vector<uint8_t> bytes = llvm::cantFail(w.toBytes());
  auto file = minfer::gguf::GgufFile::parse(
      llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(reinterpret_cast<const char*>(bytes.data()), bytes.size())),
      "f64.gguf");
  REQUIRE(file);
  const minfer::gguf::Value& v = (*file)->find("t.f64")->value;
  REQUIRE(v.count == 8);
  CHECK(v.integerAt(0) == 0);
  CHECK(v.integerAt(1) == INT64_MAX);
  CHECK(v.integerAt(2) == INT64_MIN);
  CHECK(v.integerAt(3) == 2);
  CHECK(v.integerAt(4) == -2);
  CHECK(v.integerAt(5) == INT64_MAX);
  CHECK(v.integerAt(6) == INT64_MIN);
  CHECK(v.integerAt(7) == int64_t{1} << 62);
}
