// On-disk kernel image cache (see kernel_cache.h).
#include "compiler/codegen/kernel_cache.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "compiler/codegen/kernel_sources.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/raw_ostream.h"

namespace minfer::codegen {
namespace {

constexpr char kMagic[8] = {'M', 'F', 'K', 'C', 'A', 'C', 'H', 'E'};
constexpr size_t kHeaderBytes = 8 + 8 + 8;

void putU64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
}
uint64_t getU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

std::string KernelCache::defaultDirectory() {
  if (const char* d = std::getenv("MINFER_CACHE_DIR"); d && *d) return d;
  llvm::SmallString<256> path;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    path = x;
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    path = h;
    llvm::sys::path::append(path, ".cache");
  } else {
    return "";
  }
  llvm::sys::path::append(path, "minfer", "kernels");
  return std::string(path);
}

std::string KernelCache::entryName(const KernelSpec& spec, const std::string& arch,
                                   const std::vector<std::string>& options) {
  llvm::SHA256 h;
  auto add = [&](llvm::StringRef s) {
    h.update(s);
    h.update(llvm::StringRef("\0", 1));
  };
  for (const EmbeddedSource& s : kernelSources()) {
    add(s.name);
    add(llvm::StringRef(s.text, s.size));
  }
  add(spec.identity());
  for (const std::string& o : options) add(o);
  add(arch);
  add(nvrtcVersionString());
  const llvm::StringRef digest = h.final();  // 32 raw bytes
  return spec.key + "_" + archTag(arch) + "-" + llvm::toHex(digest.take_front(8), /*LowerCase=*/true) + ".kimg";
}

std::optional<CompiledKernel> KernelCache::lookup(const std::string& entry) const {
  if (!enabled()) return std::nullopt;
  llvm::SmallString<256> path(dir_);
  llvm::sys::path::append(path, entry);
  auto buf = llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buf) return std::nullopt;
  const llvm::StringRef data = (*buf)->getBuffer();
  if (data.size() < kHeaderBytes || std::memcmp(data.data(), kMagic, 8) != 0) return std::nullopt;
  const uint64_t cubin = getU64(data.data() + 8), ptx = getU64(data.data() + 16);
  if (cubin == 0 || ptx == 0 || cubin > data.size() || ptx > data.size() || kHeaderBytes + cubin + ptx != data.size())
    return std::nullopt;
  CompiledKernel k;
  const char* p = data.data() + kHeaderBytes;
  k.cubin.assign(reinterpret_cast<const uint8_t*>(p), reinterpret_cast<const uint8_t*>(p) + cubin);
  k.ptx.assign(p + cubin, ptx);
  return k;
}

KernelCache::EntryLock::EntryLock(const KernelCache& cache, const std::string& entry) {
  if (!cache.enabled() || llvm::sys::fs::create_directories(cache.directory())) return;
  llvm::SmallString<256> path(cache.directory());
  llvm::sys::path::append(path, entry + ".lock");
  if (llvm::sys::fs::openFileForWrite(path, fd_, llvm::sys::fs::CD_OpenAlways)) {
    fd_ = -1;
    return;
  }
  if (llvm::sys::fs::lockFile(fd_)) {
    ::close(fd_);
    fd_ = -1;
  }
}

KernelCache::EntryLock::~EntryLock() {
  if (fd_ < 0) return;
  llvm::sys::fs::unlockFile(fd_);
  ::close(fd_);
}

void KernelCache::store(const std::string& entry, const CompiledKernel& kernel) {
  if (!enabled()) return;
  if (llvm::sys::fs::create_directories(dir_)) {
    ++write_failures_;
    return;
  }
  std::string bytes(kMagic, 8);
  putU64(bytes, kernel.cubin.size());
  putU64(bytes, kernel.ptx.size());
  bytes.append(reinterpret_cast<const char*>(kernel.cubin.data()), kernel.cubin.size());
  bytes += kernel.ptx;

  llvm::SmallString<256> model(dir_), temp, final_path(dir_);
  llvm::sys::path::append(model, entry + ".%%%%%%%%.tmp");
  llvm::sys::path::append(final_path, entry);
  int fd = -1;
  if (llvm::sys::fs::createUniqueFile(model, fd, temp)) {
    ++write_failures_;
    return;
  }
  {
    llvm::raw_fd_ostream os(fd, /*shouldClose=*/true);
    os << bytes;
    os.close();
    if (os.has_error()) {
      os.clear_error();
      llvm::sys::fs::remove(temp);
      ++write_failures_;
      return;
    }
  }
  if (llvm::sys::fs::rename(temp, final_path)) {
    llvm::sys::fs::remove(temp);
    ++write_failures_;
  }
}

}  // namespace minfer::codegen
