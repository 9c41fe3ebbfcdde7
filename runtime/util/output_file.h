// Output files of the tools: refuses paths whose replacement would destroy something else, writes
// through symbolic links, and writes via a temporary file renamed over the output.
//
// Every tool that writes a file (minfer-compile, minfer-synth, minfer-run --logits-out) resolves its
// output with resolveOutputPath first, so `-o model.gguf` (the input), `-o /dev/full`, a FIFO, a
// socket or a directory is refused before anything is written, and `-o link` replaces the link's
// target while the link stays. Header-only (POSIX calls): the runtime, which links no LLVM, and the
// compiler share it.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/include/minfer/status.h"

namespace minfer::util {

// Where an output named on the command line is written.
struct OutputTarget {
  std::string requested;      // the path as given (for messages)
  std::string path;           // the file to replace: `requested`, or the canonical path of a link's target
  bool through_link = false;  // `requested` is a symbolic link: the link is kept, its target replaced
};

namespace output_detail {

inline Status refuse(const std::string& path, const std::string& reason) {
  return Status::error(path + ": " + reason + "; refusing to replace it (nothing was written)");
}

// "a character device" etc. for a st_mode that a regular file must not replace; nullptr otherwise.
inline const char* specialKind(mode_t mode) {
  if (S_ISCHR(mode)) return "is a character device";
  if (S_ISBLK(mode)) return "is a block device";
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "is a socket";
  return nullptr;
}

}  // namespace output_detail

// Checks `requested` as the output of a tool that reads `inputs` (paths; empty ones are skipped) and
// says which file to replace. A path that does not exist yet is accepted (its directory is checked
// when the temporary file is created, which reports ENOENT, ENOTDIR, EACCES with the temp path). Errors ("PATH: REASON; refusing to replace it (nothing was
// written)", or stat's strerror): an empty path; a directory; a character or block device, FIFO or
// socket (links followed: renaming a regular file over it would destroy the node); the same file as
// an input (equal st_dev and st_ino, so a hard link or a link to the input counts too); a symbolic
// link whose target does not exist (GNU cp's rule: no writing through a dangling link).
inline Result<OutputTarget> resolveOutputPath(const std::string& requested, const std::vector<std::string>& inputs) {
  using output_detail::refuse;
  if (requested.empty()) return Status::error("the output path is empty");
  OutputTarget target{requested, requested, false};
  struct stat link_st, st;
  // Nothing there (or a path that cannot be looked at): creating the temporary file reports why.
  if (::lstat(requested.c_str(), &link_st) != 0) return target;
  if (S_ISLNK(link_st.st_mode)) {
    char resolved[PATH_MAX];
    if (::realpath(requested.c_str(), resolved) == nullptr)
      return refuse(requested, std::string("is a symbolic link whose target cannot be resolved (") +
                                   std::strerror(errno) + ")");
    target.path = resolved;
    target.through_link = true;
  }
  if (::stat(target.path.c_str(), &st) != 0)
    return Status::error(requested + ": cannot examine the output path: " + std::strerror(errno));
  const std::string shown = target.through_link ? requested + " (a link to " + target.path + ")" : requested;
  if (S_ISDIR(st.st_mode)) return refuse(shown, "is a directory; give a file name inside it");
  if (const char* kind = output_detail::specialKind(st.st_mode)) return refuse(shown, kind);
  for (const std::string& input : inputs) {
    struct stat in;
    if (input.empty() || ::stat(input.c_str(), &in) != 0) continue;
    if (in.st_dev == st.st_dev && in.st_ino == st.st_ino)
      return refuse(shown, "is the same file as the input " + input);
  }
  return target;
}

// A temporary file created beside `path` (same directory, so a rename over `path` is atomic).
struct TempFile {
  std::string path;
  int fd = -1;
};

// Creates "<dir of path>/.<name>.tmp-<pid>-<n>" with O_EXCL, mode 0666 & ~umask like any output file
// (mkstemp would give 0600). Error: "cannot create temporary file TEMP: <strerror>" (callers prefix
// the output path).
inline Result<TempFile> createTempBeside(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  TempFile t;
  int err = 0;
  for (int attempt = 0; attempt < 64; ++attempt) {
    t.path = dir + "." + name + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
    t.fd = ::open(t.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (t.fd >= 0) return t;
    err = errno;
    if (err != EEXIST) break;
  }
  return Status::error("cannot create temporary file " + t.path + ": " + std::strerror(err));
}

// A streamed output file: bytes go to a temporary beside the target, commit() renames it over the
// target, so a reader never sees a partial file and a failed or abandoned write leaves the previous
// file as it was (the destructor removes the temporary). Not thread-safe.
class OutputFile {
 public:
  // Errors: those of createTempBeside, prefixed with the requested path.
  static Result<std::unique_ptr<OutputFile>> create(const OutputTarget& target) {
    auto temp = createTempBeside(target.path);
    if (!temp) return Status::error(target.requested + ": " + temp.status().message());
    return std::unique_ptr<OutputFile>(new OutputFile(target, *temp));
  }
  ~OutputFile() {
    if (temp_.fd >= 0) ::close(temp_.fd);
    if (!committed_) ::unlink(temp_.path.c_str());
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Appends `n` bytes. Error: "PATH: write of N bytes at offset X failed: <strerror>" (e.g. "No
  // space left on device", "File too large"); after a failure every later call returns it again.
  Status write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    const uint64_t start = written_;
    for (size_t left = n; left > 0 && error_.isOk();) {
      const ssize_t k = ::write(temp_.fd, p, left);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0)
        error_ = Status::error(target_.requested + ": write of " + std::to_string(n) + " bytes at offset " +
                               std::to_string(start) + " failed: " + std::strerror(k < 0 ? errno : ENOSPC));
      else p += k, left -= static_cast<size_t>(k), written_ += static_cast<uint64_t>(k);
    }
    return error_;
  }
  // fsync, close and rename over the target. Errors: an earlier write's, or the failing call's
  // strerror; the temporary is removed on error.
  Status commit() {
    if (!error_) return error_;
    const auto fail = [&](const char* what) {
      error_ = Status::error(target_.requested + ": " + what + " " + temp_.path + " failed: " + std::strerror(errno));
      return error_;
    };
    if (::fsync(temp_.fd) != 0) return fail("fsync of");
    const int fd = temp_.fd;
    temp_.fd = -1;
    if (::close(fd) != 0) return fail("closing");
    if (::rename(temp_.path.c_str(), target_.path.c_str()) != 0) return fail("renaming over the output");
    committed_ = true;
    return Status::ok();
  }
  const std::string& tempPath() const { return temp_.path; }
  uint64_t bytesWritten() const { return written_; }

 private:
  OutputFile(OutputTarget target, TempFile temp) : target_(std::move(target)), temp_(std::move(temp)) {}
  OutputTarget target_;
  TempFile temp_;
  uint64_t written_ = 0;
  Status error_;
  bool committed_ = false;
};

}  // namespace minfer::util
