// Helpers of the fault tests: run a tool in a child process under imposed limits (file size limit,
// another user, no SIGXFSZ), capture its output and how it ended; tiny models compiled on demand.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tests/fuzz/tiny_gguf.h"

namespace minfer::test {

struct ChildLimits {
  rlim_t file_size = RLIM_INFINITY;  // RLIMIT_FSIZE in bytes
  bool ignore_sigxfsz = false;       // exceeding file_size: EFBIG from the call instead of death by SIGXFSZ
  bool as_nobody = false;            // when root: run as uid/gid 65534 (so permission bits apply)
  std::vector<int> ignored_signals;  // set to SIG_IGN before exec (as a shell starts a background job)
};

struct ChildResult {
  bool exited = false;     // ended by exit(); else killed by `signal`
  int status = -1;         // exit status when exited
  int signal = 0;          // terminating signal otherwise
  std::string output;      // stdout and stderr, interleaved
  bool no_nobody = false;  // as_nobody was asked and switching to uid/gid 65534 failed (the tool did not run)
  std::string describe() const;  // "exit 1" / "killed by signal 25 (File size limit exceeded)"
};

// Called on another thread while the child runs; `done` turns true once the child has closed its
// output (it exited; the pid stays valid, not yet reaped, until the callback returns).
using WhileRunning = std::function<void(pid_t pid, const std::atomic<bool>& done)>;

// Runs argv[0] (a path) with the given arguments and limits; waits for it.
ChildResult runChild(const std::vector<std::string>& argv, const ChildLimits& limits = {},
                     const WhileRunning& while_running = {});

// Path of a minfer tool in the build's bin directory.
std::string toolPath(const std::string& name);

// Writes `spec` as a GGUF to `path`; fails the test on error.
void writeTinyGguf(const TinyGgufSpec& spec, const std::string& path);

// Compiles `gguf` to `mfb` with minfer-compile (no kernel targets unless given); fails the test
// when the tool fails. Returns the tool's output.
std::string compileWithTool(const std::string& gguf, const std::string& mfb, const std::vector<std::string>& extra = {});

std::vector<uint8_t> fileBytes(const std::string& path);
void writeBytes(const std::string& path, const std::vector<uint8_t>& bytes);
// Names in `dir` (not recursive), sorted.
std::vector<std::string> listDir(const std::string& dir);

}  // namespace minfer::test
