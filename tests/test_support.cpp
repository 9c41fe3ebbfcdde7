// Fixture lookup and file helpers for the doctest suites.
#include "tests/test_support.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace minfer::test {

std::string fixturesDir() {
  const char* env = std::getenv("MINFER_FIXTURES");
  std::string dir = (env && *env) ? env : MINFER_DEFAULT_FIXTURES;
  std::error_code ec;
  return std::filesystem::is_directory(dir + "/models", ec) ? dir : std::string();
}

bool haveFixtures() {
  if (!fixturesDir().empty()) return true;
  const char* ci = std::getenv("CI");
  if (ci && std::string(ci) == "true") {
    FAIL("fixtures not found (set MINFER_FIXTURES or place them at ../shared/fixtures); required under CI");
  } else {
    MESSAGE("SKIPPED: fixtures not found (set MINFER_FIXTURES or place them at ../shared/fixtures)");
  }
  return false;
}

std::vector<uint8_t> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    FAIL_CHECK("cannot open " << path);
    return {};
  }
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> readF32File(const std::string& path) {
  const std::vector<uint8_t> bytes = readFile(path);
  if (bytes.size() % 4 != 0) {
    FAIL_CHECK(path << ": size " << bytes.size() << " is not a multiple of 4");
    return {};
  }
  std::vector<float> out(bytes.size() / 4);
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// One fresh directory per test process (mkdtemp: a reused pid never meets an earlier run's files, which made
// output-safety tests fail at random), removed with everything in it when the process exits. The path is
// leaked on purpose: the exit handler runs after function-local statics are destroyed.
std::string scratchDir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string((tmp && *tmp) ? tmp : "/tmp") + "/minfer-test-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) FAIL("cannot create a scratch directory " << pattern << ": " << std::strerror(errno));
    const std::string* made = new std::string(buf.data());
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(*dir, ec);
    });
    return made;
  }();
  return *dir;
}

long procStatusKb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(key) + ":";
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) return std::stol(line.substr(prefix.size()));
  return -1;
}

bool resetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace minfer::test
