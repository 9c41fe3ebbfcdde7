// On-disk cache of compiled kernel images, shared by every minfer-compile run of a user.
//
// Location: $MINFER_CACHE_DIR, else $XDG_CACHE_HOME/minfer/kernels, else $HOME/.cache/minfer/kernels.
// Entry: <dir>/<image key>-<hash>.kimg, hash = first 16 hex digits of SHA-256 over the embedded kernel
// sources (names and bytes), the spec identity, the NVRTC options, the arch and the NVRTC version, so
// any change to what would be compiled selects a different entry; the readable key makes the directory
// browsable. File format: "MFKCACHE" magic, u64 cubin bytes, u64 PTX bytes (little-endian), cubin, PTX.
//
// Concurrency: entries are written to a unique temporary file in the same directory and renamed into
// place (atomic on POSIX), so two compilers filling the cache at once never expose a partial entry.
// A compiler also holds <entry>.lock (an advisory file lock) while it compiles an entry, and looks the
// entry up again once it has the lock, so two compilers do not both run NVRTC for it. A malformed
// entry (truncated, wrong sizes) reads as a miss and is overwritten. Cache I/O errors never fail a
// compilation: a cache that cannot be written is skipped (counted in writeFailures()).
#pragma once

#include <atomic>
#include <optional>
#include <string>

#include "compiler/codegen/nvrtc_compiler.h"

namespace minfer::codegen {

class KernelCache {
 public:
  // The default directory (see above); "" when no environment variable gives one.
  static std::string defaultDirectory();

  // `dir` empty: caching disabled (every lookup misses, store does nothing).
  explicit KernelCache(std::string dir) : dir_(std::move(dir)) {}

  bool enabled() const { return !dir_.empty(); }
  const std::string& directory() const { return dir_; }

  // Cache file name for a spec compiled for `arch` with `options` (see above).
  static std::string entryName(const KernelSpec& spec, const std::string& arch, const std::vector<std::string>& options);

  std::optional<CompiledKernel> lookup(const std::string& entry) const;

  // Holds the advisory lock of one entry until destroyed (no-op when caching is disabled or the lock
  // file cannot be opened: the lock only saves duplicate work, correctness never depends on it).
  class EntryLock {
   public:
    EntryLock(const KernelCache& cache, const std::string& entry);
    ~EntryLock();
    EntryLock(const EntryLock&) = delete;
    EntryLock& operator=(const EntryLock&) = delete;

   private:
    int fd_ = -1;
  };

  void store(const std::string& entry, const CompiledKernel& kernel);
  unsigned writeFailures() const { return write_failures_.load(); }

 private:
  std::string dir_;
  std::atomic<unsigned> write_failures_{0};
};

}  // namespace minfer::codegen
