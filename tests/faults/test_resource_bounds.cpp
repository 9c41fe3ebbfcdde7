// Resource bounds of the GGUF reader: counts and lengths that lie (billions of tensors or key/values,
// multi-GB strings and arrays) are refused before any allocation of that size, and files that are
// valid but dense in small items cost memory proportional to their size. Each parse runs in a forked
// child whose peak RSS growth is measured (VmHWM after a reset through /proc/self/clear_refs), so a
// huge allocation shows up as memory, or kills only the child.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "compiler/gguf/gguf_reader.h"
#include "tests/test_support.h"
#include "llvm/Support/MemoryBuffer.h"

namespace {

// Little-endian GGUF bytes, written field by field.
struct Bytes {
  std::vector<uint8_t> b;
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    return raw(s.data(), s.size());
  }
  Bytes& raw(const void* p, size_t n) {
    b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv) {
    raw("GGUF", 4);
    u32(3);
    u64(n_tensors);
    return u64(n_kv);
  }
  Bytes& pad(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

constexpr uint32_t kString = 8, kArray = 9, kFloat32 = 6, kUint8 = 0;

// Peak RSS growth per byte of file, worst case (nested empty arrays: a 12-byte element becomes a
// Value): measured 16.5x in a release build, ~100x under ASan (redzones, allocator metadata).
#if defined(__SANITIZE_ADDRESS__)
constexpr double kMaxFactor = 160;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr double kMaxFactor = 160;
#else
constexpr double kMaxFactor = 24;
#endif
#else
constexpr double kMaxFactor = 24;
#endif

struct Outcome {
  bool child_ok = false;     // the child exited normally and reported
  bool measured = false;     // peak RSS could be reset and read
  bool parsed = false;       // GgufFile::parse succeeded
  long peak_growth_kb = 0;   // peak RSS growth during the parse
  std::string message;       // the parse error
};

// Parses `bytes` in a forked child; reports success, the error and the peak RSS growth.
Outcome parseInChild(const std::vector<uint8_t>& bytes) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    const bool measured = minfer::test::resetPeakRss();
    const long before = minfer::test::procStatusKb("VmRSS");
    std::string report;
    {
      auto buffer = llvm::MemoryBuffer::getMemBuffer(
          llvm::StringRef(reinterpret_cast<const char*>(bytes.data()), bytes.size()), "bounds.gguf", false);
      auto file = minfer::gguf::GgufFile::parse(std::move(buffer), "bounds.gguf");
      const long growth = minfer::test::procStatusKb("VmHWM") - before;
      report = std::string(file ? "1" : "0") + (measured && before >= 0 ? "1" : "0") + std::to_string(growth) + "\n" +
               (file ? std::string() : llvm::toString(file.takeError()));
    }
    size_t done = 0;
    while (done < report.size()) {
      const ssize_t n = ::write(fds[1], report.data() + done, report.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string report;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) report.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  Outcome o;
  o.child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 && report.size() >= 3;
  if (!o.child_ok) return o;
  o.parsed = report[0] == '1';
  o.measured = report[1] == '1';
  const size_t eol = report.find('\n');
  o.peak_growth_kb = std::stol(report.substr(2, eol - 2));
  o.message = report.substr(eol + 1);
  return o;
}

struct LyingCase {
  const char* name;
  std::vector<uint8_t> bytes;
  std::vector<std::string> words;  // in the error message
};

std::vector<LyingCase> lyingCases() {
  std::vector<LyingCase> cases;
  cases.push_back({"2^40 tensors", Bytes().header(uint64_t{1} << 40, 0).pad(64).b, {"tensor count", "1099511627776"}});
  cases.push_back({"3 billion tensors", Bytes().header(3000000000ull, 0).pad(4096).b, {"tensor count", "3000000000"}});
  cases.push_back({"2^62 key/values", Bytes().header(0, uint64_t{1} << 62).pad(64).b, {"metadata kv count"}});
  cases.push_back({"a 4 GiB string",
                   Bytes().header(0, 1).str("general.name").u32(kString).u64(uint64_t{1} << 32).pad(100).b,
                   {"string length 4294967296", "past the end"}});
  cases.push_back({"a 2^63-byte key", Bytes().header(0, 1).u64(uint64_t{1} << 63).pad(100).b, {"past the end"}});
  cases.push_back({"2^61 floats",
                   Bytes().header(0, 1).str("t.floats").u32(kArray).u32(kFloat32).u64(uint64_t{1} << 61).pad(64).b,
                   {"array of 2305843009213693952 FLOAT32 elements"}});
  cases.push_back({"10^9 uint8 in 1 KiB",
                   Bytes().header(0, 1).str("t.bytes").u32(kArray).u32(kUint8).u64(1000000000).pad(1024).b,
                   {"array of 1000000000 UINT8 elements"}});
  cases.push_back({"2^60 strings",
                   Bytes().header(0, 1).str("t.strings").u32(kArray).u32(kString).u64(uint64_t{1} << 60).pad(64).b,
                   {"array of 1152921504606846976 STRING elements"}});
  cases.push_back({"2^50 nested arrays",
                   Bytes().header(0, 1).str("t.nested").u32(kArray).u32(kArray).u64(uint64_t{1} << 50).pad(64).b,
                   {"array of 1125899906842624 ARRAY elements"}});
  // A tensor whose shape implies 2^62 bytes of data.
  cases.push_back({"a 2^62-byte tensor",
                   Bytes().header(1, 0).str("t").u32(2).u64(uint64_t{1} << 30).u64(uint64_t{1} << 30).u32(0).u64(0).pad(64).b,
                   {"'t' data", "outside the file"}});
  return cases;
}

}  // namespace

TEST_CASE("counts and lengths that lie are refused before any allocation of that size") {
  for (const LyingCase& c : lyingCases()) {
    CAPTURE(std::string(c.name));
    const Outcome o = parseInChild(c.bytes);
    REQUIRE(o.child_ok);  // the child did not die (an attempted huge allocation aborts under ASan)
    CHECK_FALSE(o.parsed);
    INFO(o.message);
    CHECK(o.message.rfind("bounds.gguf: ", 0) == 0);
    for (const std::string& w : c.words) CHECK_MESSAGE(o.message.find(w) != std::string::npos, "missing '" << w << "'");
    if (o.measured) {
      MESSAGE(std::string(c.name) << " (" << c.bytes.size() << " bytes): peak RSS +" << o.peak_growth_kb << " kB");
      CHECK(o.peak_growth_kb < 4 * 1024);
    }
  }
}

TEST_CASE("per-file caps: more than 65536 key/values or arrays inside arrays are refused, 65536 parse") {
  using minfer::gguf::kMaxInnerArrays;
  using minfer::gguf::kMaxMetadataKeys;
  // Declared counts whose minimal encodings do fit in the file (so only the cap can refuse them).
  const Outcome kvs = parseInChild(Bytes().header(0, kMaxMetadataKeys + 1).pad((kMaxMetadataKeys + 1) * 13).b);
  REQUIRE(kvs.child_ok);
  CHECK_FALSE(kvs.parsed);
  CHECK_MESSAGE(kvs.message.find("metadata kv count") != std::string::npos, kvs.message);
  CHECK_MESSAGE(kvs.message.find("65537 key/value pairs exceed the limit of 65536") != std::string::npos, kvs.message);
  if (kvs.measured) CHECK(kvs.peak_growth_kb < 4 * 1024);

  const Outcome inner = parseInChild(Bytes()
                                         .header(0, 1)
                                         .str("t.nested")
                                         .u32(kArray)
                                         .u32(kArray)
                                         .u64(kMaxInnerArrays + 1)
                                         .pad((kMaxInnerArrays + 1) * 12)
                                         .b);
  REQUIRE(inner.child_ok);
  CHECK_FALSE(inner.parsed);
  CHECK_MESSAGE(inner.message.find("metadata 't.nested' count") != std::string::npos, inner.message);
  CHECK_MESSAGE(inner.message.find("65537 inner arrays on top of the 0 already read exceed the limit of 65536") !=
                    std::string::npos,
                inner.message);
  if (inner.measured) CHECK(inner.peak_growth_kb < 4 * 1024);

  // The cap is per file: two keys of 40000 empty inner arrays each.
  Bytes split;
  split.header(0, 2);
  for (const char* key : {"t.a", "t.b"}) {
    split.str(key).u32(kArray).u32(kArray).u64(40000);
    for (int k = 0; k < 40000; ++k) split.u32(kUint8).u64(0);
  }
  const Outcome two = parseInChild(split.b);
  REQUIRE(two.child_ok);
  CHECK_FALSE(two.parsed);
  CHECK_MESSAGE(two.message.find("metadata 't.b' count at offset") != std::string::npos, two.message);
  CHECK_MESSAGE(two.message.find("40000 inner arrays on top of the 40000 already read") != std::string::npos,
                two.message);

  // Exactly at the caps: 65536 one-byte key/values; 65536 empty inner arrays under one key.
  Bytes at_kv;
  at_kv.header(0, kMaxMetadataKeys);
  for (uint64_t k = 0; k < kMaxMetadataKeys; ++k) {
    char key[16];
    std::snprintf(key, sizeof(key), "k%07llu", static_cast<unsigned long long>(k));
    const uint8_t v = 1;
    at_kv.str(key).u32(kUint8).raw(&v, 1);
  }
  const Outcome ok_kv = parseInChild(at_kv.b);
  REQUIRE(ok_kv.child_ok);
  CHECK_MESSAGE(ok_kv.parsed, ok_kv.message);
  Bytes at_inner;
  at_inner.header(0, 1).str("t.nested").u32(kArray).u32(kArray).u64(kMaxInnerArrays);
  for (uint64_t k = 0; k < kMaxInnerArrays; ++k) at_inner.u32(kUint8).u64(0);
  const Outcome ok_inner = parseInChild(at_inner.b);
  REQUIRE(ok_inner.child_ok);
  CHECK_MESSAGE(ok_inner.parsed, ok_inner.message);
}

TEST_CASE("valid files dense in small items: memory proportional to the file (measured factors in TESTING.md)") {
  constexpr size_t kTarget = 1 << 20;  // ~1 MiB of metadata per case
  struct Dense {
    const char* name;
    std::vector<uint8_t> bytes;
  };
  std::vector<Dense> cases;
  {
    // empty inner arrays: 12 bytes each in the file; at most kMaxInnerArrays (768 KiB) per file
    const uint64_t n = std::min<uint64_t>((kTarget - 64) / 12, minfer::gguf::kMaxInnerArrays);
    Bytes b;
    b.header(0, 1).str("t.nested").u32(kArray).u32(kArray).u64(n);
    for (uint64_t k = 0; k < n; ++k) b.u32(kUint8).u64(0);
    cases.push_back({"empty nested arrays (12 bytes each)", b.b});
  }
  {
    const uint64_t n = (kTarget - 64) / 8;  // empty strings: 8 bytes each
    Bytes b;
    b.header(0, 1).str("t.strings").u32(kArray).u32(kString).u64(n);
    for (uint64_t k = 0; k < n; ++k) b.u64(0);
    cases.push_back({"empty strings (8 bytes each)", b.b});
  }
  {
    const uint64_t n = kTarget / 24;  // key "kNNNNNNN" + UINT8 value: 8 + 8 + 4 + 1 = 21..24 bytes
    Bytes b;
    b.header(0, n);
    for (uint64_t k = 0; k < n; ++k) {
      char key[16];
      std::snprintf(key, sizeof(key), "k%07llu", static_cast<unsigned long long>(k));
      b.str(key).u32(kUint8);
      const uint8_t v = 1;
      b.raw(&v, 1);
    }
    cases.push_back({"one-byte key/values (~21 bytes each)", b.b});
  }
  {
    const uint64_t n = kTarget / (40 + 32);  // 1-element F32 tensors: 40-byte info + 32 bytes of data
    Bytes b;
    b.header(n, 0);
    for (uint64_t k = 0; k < n; ++k) {
      char name[16];
      std::snprintf(name, sizeof(name), "t%07llu", static_cast<unsigned long long>(k));
      b.str(name).u32(1).u64(1).u32(0).u64(k * 32);
    }
    b.pad((32 - b.b.size() % 32) % 32).pad(n * 32);
    cases.push_back({"1-element tensors (40-byte infos)", b.b});
  }
  for (const Dense& c : cases) {
    CAPTURE(std::string(c.name));
    const Outcome o = parseInChild(c.bytes);
    REQUIRE(o.child_ok);
    INFO(o.message);
    CHECK(o.parsed);
    if (!o.measured) continue;
    const double factor = double(o.peak_growth_kb) * 1024.0 / double(c.bytes.size());
    MESSAGE(std::string(c.name) << ": " << c.bytes.size() << " bytes, peak RSS +" << o.peak_growth_kb << " kB = " << factor
                   << " x the file");
    CHECK(factor < kMaxFactor);
  }
}
