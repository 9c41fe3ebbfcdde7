// Child processes under limits, and tiny compiled models, for the fault tests (see fault_support.h).
#include "tests/faults/fault_support.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/test_support.h"

namespace minfer::test {

std::string ChildResult::describe() const {
  if (exited) return "exit " + std::to_string(status);
  return "killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
}

ChildResult runChild(const std::vector<std::string>& argv, const ChildLimits& limits, const WhileRunning& while_running) {
  ChildResult r;
  int pipefd[2];
  REQUIRE(::pipe2(pipefd, O_CLOEXEC) == 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    if (limits.ignore_sigxfsz) ::signal(SIGXFSZ, SIG_IGN);
    for (const int sig : limits.ignored_signals) ::signal(sig, SIG_IGN);
    if (limits.file_size != RLIM_INFINITY) {
      const struct rlimit rl = {limits.file_size, limits.file_size};
      if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) ::_exit(120);
    }
    if (limits.as_nobody && ::geteuid() == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(121);
    }
    ::execv(args[0], args.data());
    ::_exit(122);
  }
  ::close(pipefd[1]);
  std::atomic<bool> done{false};
  std::thread watcher;
  if (while_running) watcher = std::thread([&] { while_running(pid, done); });
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof(buf))) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    r.output.append(buf, static_cast<size_t>(n));
  }
  ::close(pipefd[0]);
  done = true;
  if (watcher.joinable()) watcher.join();
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    r.exited = true;
    r.status = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  }
  r.no_nobody = r.exited && r.status == 121;
  REQUIRE_MESSAGE(!(r.exited && (r.status == 120 || r.status == 122)), "child setup failed: " << r.status);
  return r;
}

std::string toolPath(const std::string& name) { return std::string(MINFER_TOOLS_DIR) + "/" + name; }

void writeTinyGguf(const TinyGgufSpec& spec, const std::string& path) {
  llvm::Error err = makeTinyGguf(spec).write(path);
  REQUIRE_MESSAGE(!err, llvm::toString(std::move(err)));
}

std::string compileWithTool(const std::string& gguf, const std::string& mfb, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {toolPath("minfer-compile"), gguf, "-o", mfb, "-j", "1"};
  bool has_target = false;
  for (const std::string& e : extra) has_target |= e.rfind("--target", 0) == 0;
  if (!has_target) argv.push_back("--target=");
  argv.insert(argv.end(), extra.begin(), extra.end());
  const ChildResult r = runChild(argv);
  INFO(r.output);
  REQUIRE_MESSAGE((r.exited && r.status == 0), "minfer-compile " << r.describe());
  return r.output;
}

std::vector<uint8_t> fileBytes(const std::string& path) { return readFile(path); }

void writeBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(static_cast<bool>(out));
}

std::vector<std::string> listDir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace minfer::test
