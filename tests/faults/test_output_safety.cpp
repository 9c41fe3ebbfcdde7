// Writing outputs never destroys something else: minfer-compile -o, minfer-synth -o and minfer-run
// --logits-out refuse the input itself (also through a symlink or a hard link), a device, a FIFO, a
// socket and a directory, leaving each as it was; they write through a symlink (the link stays, its
// target is replaced); a failed write names its reason; an ignored SIGINT stays ignored.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "minfer/artifact.h"
#include "tests/faults/fault_support.h"
#include "tests/test_support.h"

using minfer::test::ChildLimits;
using minfer::test::ChildResult;
using minfer::test::TinyGgufSpec;

namespace fs = std::filesystem;

namespace {

struct Inputs {
  std::string dir, gguf, mfb;
};

const Inputs& inputs() {
  static const Inputs in = [] {
    Inputs in;
    in.dir = minfer::test::scratchDir() + "/output-safety";
    fs::remove_all(in.dir);
    fs::create_directories(in.dir);
    in.gguf = in.dir + "/tiny.gguf";
    in.mfb = in.dir + "/tiny.mfb";
    minfer::test::writeTinyGguf(TinyGgufSpec{}, in.gguf);
    minfer::test::compileWithTool(in.gguf, in.mfb);
    return in;
  }();
  return in;
}

// One tool that writes a file: its command line for an output path, and the input it reads.
struct Tool {
  std::string name;
  std::string input;
  std::vector<std::string> (*argv)(const std::string& out);
};

std::vector<Tool> tools() {
  return {
      {"minfer-compile", inputs().gguf,
       [](const std::string& out) {
         return std::vector<std::string>{minfer::test::toolPath("minfer-compile"), inputs().gguf, "-o", out,
                                         "--target=", "-j", "1"};
       }},
      {"minfer-synth", inputs().gguf,  // --vocab is its input
       [](const std::string& out) {
         return std::vector<std::string>{minfer::test::toolPath("minfer-synth"), "tiny-llama", "--types", "q8_0",
                                         "--layers", "1", "--threads", "1", "--vocab", inputs().gguf, "-o", out};
       }},
      {"minfer-run", inputs().mfb,
       [](const std::string& out) {
         return std::vector<std::string>{minfer::test::toolPath("minfer-run"), inputs().mfb, "-p", "the cat", "-n",
                                         "2", "--temp", "0", "--device", "cpu", "-t", "1", "--logits-out", out};
       }},
  };
}

mode_t fileType(const std::string& path, bool follow = true) {
  struct stat st {};
  REQUIRE((follow ? ::stat(path.c_str(), &st) : ::lstat(path.c_str(), &st)) == 0);
  return st.st_mode & S_IFMT;
}

// A fresh, empty directory for one case.
std::string caseDir(const std::string& tool, const std::string& name) {
  const std::string dir = inputs().dir + "/" + tool + "-" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The refusal contract: exit 1, a message with the path and the reason, nothing written.
void expectRefused(const Tool& tool, const std::string& out, const std::string& reason) {
  CAPTURE(tool.name);
  CAPTURE(out);
  const ChildResult r = minfer::test::runChild(tool.argv(out));
  INFO(r.output);
  CHECK(r.describe() == "exit 1");
  CHECK(r.output.find(out) != std::string::npos);
  CHECK(r.output.find(reason) != std::string::npos);
  CHECK(r.output.find("nothing was written") != std::string::npos);
}

// A Unix socket bound at `path` (the socket file stays after the descriptor is closed).
void makeSocket(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(path.size() < sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  ::close(fd);
}

}  // namespace

TEST_CASE("the input itself, through a symlink or a hard link, is refused and left byte-identical") {
  for (const Tool& tool : tools()) {
    const std::vector<uint8_t> before = minfer::test::fileBytes(tool.input);
    const std::string dir = caseDir(tool.name, "input");
    const std::string link = dir + "/link", hard = dir + "/hard";
    fs::create_symlink(tool.input, link);
    fs::create_hard_link(tool.input, hard);
    for (const std::string& out : {tool.input, link, hard}) expectRefused(tool, out, "is the same file as the input");
    CHECK(minfer::test::fileBytes(tool.input) == before);
    CHECK(fileType(link, false) == S_IFLNK);
    CHECK(minfer::test::listDir(dir) == std::vector<std::string>{"hard", "link"});
  }
}

TEST_CASE("a device, a FIFO, a socket or a directory is refused and stays what it was") {
  for (const Tool& tool : tools()) {
    const std::string dir = caseDir(tool.name, "special");
    const std::string fifo = dir + "/fifo", sock = dir + "/sock", sub = dir + "/sub", to_null = dir + "/to-null";
    REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
    makeSocket(sock);
    fs::create_directories(sub);
    fs::create_symlink("/dev/null", to_null);
    expectRefused(tool, fifo, "is a FIFO");
    expectRefused(tool, sock, "is a socket");
    expectRefused(tool, sub, "is a directory");
    expectRefused(tool, to_null, "is a character device");  // a link to a device: the device counts
    expectRefused(tool, "/dev/null", "is a character device");
    if (fs::exists("/dev/full")) expectRefused(tool, "/dev/full", "is a character device");
    CHECK(fileType(fifo) == S_IFIFO);
    CHECK(fileType(sock) == S_IFSOCK);
    CHECK(fileType(sub) == S_IFDIR);
    CHECK(fs::is_empty(sub));
    CHECK(fileType(to_null, false) == S_IFLNK);
    CHECK(fileType("/dev/null") == S_IFCHR);
    if (fs::exists("/dev/full")) CHECK(fileType("/dev/full") == S_IFCHR);
    CHECK(minfer::test::listDir(dir) == std::vector<std::string>{"fifo", "sock", "sub", "to-null"});
  }
}

TEST_CASE("a symlink is written through: the link stays, its target is replaced, no temp file is left") {
  for (const Tool& tool : tools()) {
    CAPTURE(tool.name);
    const std::string link_dir = caseDir(tool.name, "link"), target_dir = caseDir(tool.name, "target");
    const std::string target = target_dir + "/out.bin", link = link_dir + "/out.bin";
    minfer::test::writeBytes(target, {'o', 'l', 'd'});
    fs::create_symlink(target, link);
    const ChildResult r = minfer::test::runChild(tool.argv(link));
    INFO(r.output);
    REQUIRE(r.describe() == "exit 0");
    CHECK(fileType(link, false) == S_IFLNK);
    CHECK(fs::read_symlink(link) == target);
    CHECK(fileType(target, false) == S_IFREG);
    CHECK(minfer::test::fileBytes(target).size() > 1000);
    CHECK(minfer::test::listDir(link_dir) == std::vector<std::string>{"out.bin"});    // no temp beside the link
    CHECK(minfer::test::listDir(target_dir) == std::vector<std::string>{"out.bin"});  // nor beside the target

    // A dangling link is not written through (GNU cp's rule).
    const std::string dangling = link_dir + "/dangling";
    fs::create_symlink(target_dir + "/missing.bin", dangling);
    expectRefused(tool, dangling, "symbolic link");
    CHECK(!fs::exists(target_dir + "/missing.bin"));
  }
}

TEST_CASE("--help of each tool says that a symlink is written through") {
  for (const Tool& tool : tools()) {
    CAPTURE(tool.name);
    const ChildResult r = minfer::test::runChild({minfer::test::toolPath(tool.name), "--help"});
    CHECK(r.describe() == "exit 0");
    CHECK(r.output.find("symbolic link is written through") != std::string::npos);
  }
}

TEST_CASE("a failed write names its reason (File too large) and leaves no file") {
  // minfer-compile's case is in test_compile_faults ("disk full"); here the other two writers.
  ChildLimits limits;
  limits.file_size = 2048;  // the GGUF is ~1 MB; the logits are ~1 KiB per row
  limits.ignore_sigxfsz = true;
  for (const Tool& tool : tools()) {
    if (tool.name == "minfer-compile") continue;
    CAPTURE(tool.name);
    const std::string dir = caseDir(tool.name, "efbig");
    const ChildResult r = minfer::test::runChild(tool.argv(dir + "/out.bin"), limits);
    INFO(r.output);
    CHECK(r.describe() == "exit 1");
    CHECK(r.output.find("File too large") != std::string::npos);
    CHECK(r.output.find(dir + "/") != std::string::npos);
    CHECK(minfer::test::listDir(dir).empty());
  }
}

TEST_CASE("minfer-compile with SIGINT or SIGTERM ignored at start (a script's background job) ignores it") {
  // Larger than the other models, so the compile lasts long enough to be signalled mid-write.
  TinyGgufSpec spec;
  spec.n_embd = 256, spec.n_layer = 4, spec.n_head = 4, spec.n_head_kv = 2, spec.n_ff = 1024;
  const std::string dir = caseDir("minfer-compile", "signals");
  const std::string gguf = dir + "/model.gguf";
  minfer::test::writeTinyGguf(spec, gguf);
  const std::string out_dir = dir + "/out", out = out_dir + "/model.mfb";

  for (const int sig : {SIGINT, SIGTERM}) {
    for (const bool ignored : {true, false}) {
      const std::string signal_name = strsignal(sig);
      CAPTURE(signal_name);
      CAPTURE(ignored);
      fs::remove_all(out_dir);
      fs::create_directories(out_dir);
      ChildLimits limits;
      if (ignored) limits.ignored_signals = {sig};
      // Sends `sig` once the temporary file exists, then every 2 ms until the compile ends.
      bool sent_with_temp = false;
      const auto send = [&](pid_t pid, const std::atomic<bool>& done) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (!done.load() && std::chrono::steady_clock::now() < deadline) {
          const auto names = minfer::test::listDir(out_dir);
          const bool temp = !names.empty() && names[0].rfind(".model.mfb.tmp-", 0) == 0;
          if (temp || sent_with_temp) {
            sent_with_temp |= temp;
            ::kill(pid, sig);
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(temp ? 2 : 1));
        }
      };
      const ChildResult r = minfer::test::runChild(
          {minfer::test::toolPath("minfer-compile"), gguf, "-o", out, "--target=", "-j", "1"}, limits, send);
      INFO(r.output);
      if (!sent_with_temp) MESSAGE("the compile ended before its temporary file was seen; the signal was not sent");
      if (ignored) {
        CHECK(r.describe() == "exit 0");
        CHECK(minfer::test::listDir(out_dir) == std::vector<std::string>{"model.mfb"});
        auto file = minfer::ArtifactFile::open(out);
        CHECK_MESSAGE(file.isOk(), file.status().message());
      } else if (sent_with_temp) {
        CHECK(!r.exited);
        CHECK(r.signal == sig);
        for (const std::string& name : minfer::test::listDir(out_dir))  // the handler removed the temp file
          CHECK_MESSAGE(name.rfind(".model.mfb.tmp-", 0) != 0, name);
      }
    }
  }
}
