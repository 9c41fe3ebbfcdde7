// Fault tests of minfer-compile: the disk fills up, the output directory is read-only or missing, and
// the GGUF is rewritten while the compiler has it mapped. In every failure: exit 1, a message naming
// the path and the cause, no partial or temporary file left, a previous artifact byte-identical.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "compiler/gguf/gguf_writer.h"
#include "minfer/artifact.h"
#include "minfer/runtime.h"
#include "tests/faults/fault_support.h"
#include "tests/test_support.h"

using minfer::test::ChildLimits;
using minfer::test::ChildResult;
using minfer::test::TinyGgufSpec;

namespace fs = std::filesystem;

namespace {

struct Setup {
  std::string dir;       // output directory (holds the previous artifact)
  std::string gguf;      // the model to compile now (outside `dir`)
  std::string out;       // dir + "/model.mfb"
  std::vector<uint8_t> previous;  // bytes of the previous artifact at `out`
};

// A directory holding a previous artifact (compiled from another seed), and a new GGUF beside it.
Setup makeSetup(const std::string& name) {
  Setup s;
  const std::string base = minfer::test::scratchDir() + "/" + name;
  fs::remove_all(base);
  s.dir = base + "/out";
  fs::create_directories(s.dir);
  s.out = s.dir + "/model.mfb";
  TinyGgufSpec old_spec;
  old_spec.seed = 101;
  const std::string old_gguf = base + "/old.gguf";
  minfer::test::writeTinyGguf(old_spec, old_gguf);
  minfer::test::compileWithTool(old_gguf, s.out);
  s.previous = minfer::test::fileBytes(s.out);
  REQUIRE(s.previous.size() > 16 * 1024);
  TinyGgufSpec spec;
  spec.seed = 202;
  s.gguf = base + "/new.gguf";
  minfer::test::writeTinyGguf(spec, s.gguf);
  return s;
}

ChildResult compile(const Setup& s, const ChildLimits& limits) {
  return minfer::test::runChild(
      {minfer::test::toolPath("minfer-compile"), s.gguf, "-o", s.out, "--target=", "-j", "1"}, limits);
}

// The failure contract: exit 1 with a message, nothing but the previous artifact in the directory,
// and its bytes unchanged.
void expectCleanFailure(const Setup& s, const ChildResult& r, const std::vector<std::string>& words) {
  INFO(r.output);
  CHECK(r.describe() == "exit 1");
  CHECK(r.output.rfind("minfer-compile: ", 0) == 0);
  for (const std::string& w : words) CHECK_MESSAGE(r.output.find(w) != std::string::npos, "missing '" << w << "'");
  CHECK(minfer::test::listDir(s.dir) == std::vector<std::string>{"model.mfb"});
  CHECK(minfer::test::fileBytes(s.out) == s.previous);
}

}  // namespace

TEST_CASE("disk full (file size limit): clear error, temp file removed, previous artifact untouched") {
  const Setup s = makeSetup("disk-full");
  // The new artifact is ~86 KB; the limit lets the temporary file be created but not reserved.
  ChildLimits limits;
  limits.file_size = 32 * 1024;
  limits.ignore_sigxfsz = true;  // the call fails with EFBIG, as a full disk fails with ENOSPC
  expectCleanFailure(s, compile(s, limits), {"artifact " + s.out, "reserving", "File too large"});

  // With SIGXFSZ at its default disposition the kernel signals the tool, but the handler LLVM installs
  // for RemoveFileOnSignal catches it (removing the temporary file) and returns, so the call still
  // fails with EFBIG and the tool reports it like the case above instead of dying.
  limits.ignore_sigxfsz = false;
  expectCleanFailure(s, compile(s, limits), {"artifact " + s.out, "reserving", "File too large"});

  // Control: without the limit the same command succeeds and replaces the artifact.
  const ChildResult ok = compile(s, {});
  INFO(ok.output);
  REQUIRE(ok.describe() == "exit 0");
  CHECK(minfer::test::fileBytes(s.out) != s.previous);
  CHECK(minfer::test::listDir(s.dir) == std::vector<std::string>{"model.mfb"});
}

TEST_CASE("disk full (a real filesystem out of space: 128 KiB tmpfs, where mounting is permitted)") {
  const Setup s = makeSetup("tmpfs-full");
  const std::string mnt = s.dir;  // mount over the output directory, then put the previous artifact in it
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=128k") != 0) {
    MESSAGE("SKIPPED: cannot mount a tmpfs here (" << std::strerror(errno) << "); the file-size-limit case covers it");
    return;
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  minfer::test::writeBytes(s.out, s.previous);
  expectCleanFailure(s, compile(s, {}), {"artifact " + s.out, "No space left on device"});
}

TEST_CASE("read-only or missing output directory: clear error, previous artifact untouched") {
  const Setup s = makeSetup("read-only");
  ChildLimits limits;
  limits.as_nobody = true;  // root ignores permission bits; run as nobody there
  // The tool must be able to read its input as that user, or the case tests something else.
  const ChildResult readable = minfer::test::runChild({"/usr/bin/test", "-r", s.gguf}, limits);
  if (readable.no_nobody || readable.describe() != "exit 0") {
    MESSAGE("SKIPPED (read-only part): cannot run as uid 65534 or it cannot read " << s.gguf);
  } else {
    REQUIRE(::chmod(s.dir.c_str(), 0555) == 0);
    const ChildResult r = compile(s, limits);
    ::chmod(s.dir.c_str(), 0755);
    expectCleanFailure(s, r, {"cannot create temporary file", "Permission denied", s.dir});
  }

  const std::string missing = s.dir + "/no/such/dir/model.mfb";
  const ChildResult m = minfer::test::runChild(
      {minfer::test::toolPath("minfer-compile"), s.gguf, "-o", missing, "--target="});
  INFO(m.output);
  CHECK(m.describe() == "exit 1");
  CHECK(m.output.find("cannot create temporary file") != std::string::npos);
  CHECK(m.output.find("No such file or directory") != std::string::npos);
  CHECK(!fs::exists(s.dir + "/no"));
}

TEST_CASE("GGUF rewritten (same size) while minfer-compile has it mapped: no crash") {
  // Larger than the other models so the compile lasts long enough to be overlapped.
  TinyGgufSpec spec;
  spec.n_embd = 256;
  spec.n_layer = 4;
  spec.n_head = 4;
  spec.n_head_kv = 2;
  spec.n_ff = 1024;
  spec.attn = minfer::GgmlType::Q8_0;
  spec.ffn = minfer::GgmlType::Q8_0;
  spec.down = minfer::GgmlType::Q4_K;
  const minfer::gguf::GgufWriter writer = minfer::test::makeTinyGguf(spec);
  const uint64_t data_start = llvm::cantFail(writer.layout()).data_start;
  const std::string dir = minfer::test::scratchDir() + "/rewrite";
  fs::remove_all(dir);
  fs::create_directories(dir);

  for (const bool header_too : {false, true}) {
    CAPTURE(header_too);
    const std::string gguf = dir + "/model.gguf", out = dir + "/model.mfb";
    {
      llvm::Error err = writer.write(gguf);
      REQUIRE_MESSAGE(!err, llvm::toString(std::move(err)));
    }
    const uint64_t size = fs::file_size(gguf);
    std::atomic<bool> done{false};
    std::atomic<uint64_t> writes{0};
    // Overwrites random 4 KiB ranges in place (never truncating) until the compile has finished.
    std::thread rewriter([&] {
      const int fd = ::open(gguf.c_str(), O_WRONLY);
      if (fd < 0) return;
      std::mt19937_64 rng(header_too ? 7 : 8);
      std::vector<uint8_t> junk(4096);
      const uint64_t lo = header_too ? 0 : data_start;
      // The header case starts a little later so that most runs get past parsing before bytes change
      // (a 7B-free tiny model compiles in ~10-20 ms once the process is up: the delay must stay below that).
      std::this_thread::sleep_for(std::chrono::milliseconds(header_too ? 2 : 0));
      while (!done.load()) {
        for (uint8_t& b : junk) b = static_cast<uint8_t>(rng());
        const uint64_t at = lo + rng() % (size - lo);
        const size_t n = static_cast<size_t>(std::min<uint64_t>(junk.size(), size - at));
        if (::pwrite(fd, junk.data(), n, static_cast<off_t>(at)) > 0) writes.fetch_add(1);
      }
      ::close(fd);
    });
    const auto t0 = std::chrono::steady_clock::now();
    const ChildResult r =
        minfer::test::runChild({minfer::test::toolPath("minfer-compile"), gguf, "-o", out, "--target=", "-j", "1"});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    done = true;
    rewriter.join();
    INFO(r.output);
    MESSAGE("header_too=" << header_too << ": " << r.describe() << " after " << seconds << " s, " << writes.load()
                          << " rewrites during the compile");
    CHECK(writes.load() > 0);
    REQUIRE(r.exited);  // never a signal (SIGSEGV, SIGBUS, abort)
    if (!header_too) {
      // Only tensor bytes changed: they are numbers to the transforms, so the compile succeeds and
      // the artifact is sound (its recorded SHA-256 describes bytes the file no longer holds).
      REQUIRE(r.status == 0);
      auto model = minfer::Model::open(out, minfer::BackendKind::kCpu, {.verify_checksums = true});
      CHECK_MESSAGE(model.isOk(), model.status().message());
    } else if (r.status == 0) {
      auto file = minfer::ArtifactFile::open(out);
      CHECK_MESSAGE(file.isOk(), file.status().message());
      if (file) CHECK((*file)->verifyChecksums().isOk());
    } else {
      CHECK(r.status == 1);
      CHECK(r.output.rfind("minfer-compile: ", 0) == 0);
      CHECK(!fs::exists(out));
    }
    fs::remove(out);
  }
  // (A GGUF truncated under the mapping cannot be guarded: reading a mapped page past the new end
  // of the file raises SIGBUS. See TESTING.md.)
}
