// ArtifactWriter: temp file + pwrite of fixed-offset segments + manifest at 0 + fsync + rename.
#include "compiler/artifact/artifact_writer.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <limits>

#include "compiler/artifact/temp_file_signals.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Signals.h"
#include "runtime/util/output_file.h"

namespace minfer::artifact {
namespace {

llvm::Error makeError(const llvm::Twine& message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message.str());
}

bool alignUp(uint64_t x, uint64_t* out) {
  if (__builtin_add_overflow(x, kSegmentAlignment - 1, out)) return false;
  *out &= ~(kSegmentAlignment - 1);
  return true;
}

uint32_t readLE32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SegmentStream

SegmentStream::SegmentStream(ArtifactWriter* writer, SegmentId id)
    : writer_(writer), id_(id), state_(XXH64_createState()) {
  XXH64_reset(state_, 0);
}

SegmentStream::SegmentStream(SegmentStream&& other) noexcept
    : writer_(other.writer_), id_(other.id_), written_(other.written_), state_(other.state_),
      finished_(other.finished_) {
  other.state_ = nullptr;
  other.finished_ = true;
}

SegmentStream::~SegmentStream() {
  if (state_) XXH64_freeState(state_);
}

llvm::Error SegmentStream::append(llvm::ArrayRef<uint8_t> bytes) {
  uint64_t offset, size;
  {
    std::lock_guard<std::mutex> lock(writer_->mu_);
    offset = writer_->segments_[id_].offset;
    size = writer_->segments_[id_].size;
  }
  if (finished_)
    return makeError(llvm::formatv("artifact {0}: segment {1}: append after finish", writer_->path_, id_));
  if (bytes.size() > size - written_)
    return makeError(llvm::formatv("artifact {0}: segment {1}: appending {2} bytes at {3} exceeds its reserved "
                                   "size of {4} bytes",
                                   writer_->path_, id_, bytes.size(), written_, size));
  if (auto err = writer_->writeAt(offset + written_, bytes, llvm::formatv("segment {0}", id_))) return err;
  XXH64_update(state_, bytes.data(), bytes.size());
  written_ += bytes.size();
  return llvm::Error::success();
}

llvm::Error SegmentStream::finish() {
  if (finished_)
    return makeError(llvm::formatv("artifact {0}: segment {1}: finished twice", writer_->path_, id_));
  std::lock_guard<std::mutex> lock(writer_->mu_);
  auto& s = writer_->segments_[id_];
  if (written_ != s.size)
    return makeError(llvm::formatv("artifact {0}: segment {1}: {2} bytes written, {3} reserved", writer_->path_,
                                   id_, written_, s.size));
  s.xxh64 = XXH64_digest(state_);
  s.written = true;
  finished_ = true;
  return llvm::Error::success();
}

// ---------------------------------------------------------------------------------------------
// ArtifactWriter

ArtifactWriter::ArtifactWriter(std::string path, std::string target_path, std::string temp_path, int fd)
    : path_(std::move(path)), target_path_(std::move(target_path)), temp_path_(std::move(temp_path)), fd_(fd) {}

llvm::Expected<std::unique_ptr<ArtifactWriter>> ArtifactWriter::create(llvm::StringRef path) {
  // A directory, device, FIFO or socket at `path` is refused; a symbolic link is written through.
  auto target = util::resolveOutputPath(path.str(), {});
  if (!target) return makeError("artifact " + target.status().message());
  armTempFileSignals();  // before the temporary file exists (a signal ignored at start stays ignored)
  Result<util::TempFile> temp = Status::error("");
  {
    const TempFileSignalBlock block;  // created and registered for removal as one step
    temp = util::createTempBeside(target->path);
    if (temp) llvm::sys::RemoveFileOnSignal(temp->path);
  }
  if (!temp) return makeError(llvm::formatv("artifact {0}: {1}", path, temp.status().message()));
  return std::unique_ptr<ArtifactWriter>(new ArtifactWriter(path.str(), target->path, temp->path, temp->fd));
}

ArtifactWriter::~ArtifactWriter() {
  if (!committed_) discard();
  if (fd_ >= 0) ::close(fd_);
}

void ArtifactWriter::discard() {
  std::lock_guard<std::mutex> lock(mu_);
  if (temp_removed_ || committed_) return;
  ::unlink(temp_path_.c_str());
  llvm::sys::DontRemoveFileOnSignal(temp_path_);
  temp_removed_ = true;
}

llvm::Error ArtifactWriter::ioError(const llvm::Twine& what, int err) const {
  return makeError(llvm::formatv("artifact {0}: {1} failed: {2}", path_, what.str(), std::strerror(err)));
}

llvm::Error ArtifactWriter::writeAt(uint64_t offset, llvm::ArrayRef<uint8_t> bytes, const llvm::Twine& what) {
  const uint8_t* p = bytes.data();
  uint64_t left = bytes.size();
  uint64_t at = offset;
  while (left > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(left, uint64_t{1} << 30));
    const ssize_t n = ::pwrite(fd_, p, chunk, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      discard();  // frees the space now; other threads' pwrites go to the unlinked inode
      const std::string partial = at == offset ? std::string() : llvm::formatv(" at offset {0}", at).str();
      return makeError(llvm::formatv("artifact {0}: {1}: write of {2} bytes at offset {3} failed{4}: {5} (temp file "
                                     "{6} removed)",
                                     path_, what.str(), bytes.size(), offset, partial, std::strerror(err), temp_path_));
    }
    p += n;
    at += static_cast<uint64_t>(n);
    left -= static_cast<uint64_t>(n);
  }
  return llvm::Error::success();
}

SegmentId ArtifactWriter::reserveSegment(uint64_t size) {
  assert(!laid_out_ && "reserveSegment after layout");
  SegmentState s;
  s.size = size;
  segments_.push_back(s);
  return static_cast<SegmentId>(segments_.size() - 1);
}

llvm::Error ArtifactWriter::layout(uint64_t manifest_bytes) {
  if (laid_out_) return makeError(llvm::formatv("artifact {0}: layout called twice", path_));
  if (manifest_bytes < 12)
    return makeError(llvm::formatv("artifact {0}: manifest size {1} is smaller than a size-prefixed FlatBuffer "
                                   "header (12 bytes)",
                                   path_, manifest_bytes));
  uint64_t end = manifest_bytes;
  for (size_t i = 0; i < segments_.size(); ++i) {
    SegmentState& s = segments_[i];
    if (s.size == 0) continue;  // empty segment: (0, 0)
    uint64_t offset, seg_end;
    if (!alignUp(end, &offset) || __builtin_add_overflow(offset, s.size, &seg_end))
      return makeError(llvm::formatv("artifact {0}: segment {1} of {2} bytes after offset {3} overflows 64-bit "
                                     "file offsets",
                                     path_, i, s.size, end));
    s.offset = offset;
    end = seg_end;
  }
  if (end > static_cast<uint64_t>(std::numeric_limits<off_t>::max()))
    return makeError(llvm::formatv("artifact {0}: file size {1} exceeds the largest file offset", path_, end));
  // Allocate up front so a full disk fails here, before hours of transforms. Filesystems without
  // fallocate fall back to a sparse file (ftruncate), which still reads as zeros between segments.
  if (end > 0) {
    int rc;
    do rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(end));
    while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
      const int err = errno;
      discard();
      return ioError(llvm::formatv("reserving {0} bytes for temp file {1}", end, temp_path_), err);
    }
  }
  if (::ftruncate(fd_, static_cast<off_t>(end)) != 0) {
    const int err = errno;
    discard();
    return ioError(llvm::formatv("sizing the temp file to {0} bytes", end), err);
  }
  manifest_reserved_ = manifest_bytes;
  file_size_ = end;
  laid_out_ = true;
  return llvm::Error::success();
}

llvm::Error ArtifactWriter::claim(SegmentId id, uint64_t* offset, uint64_t* size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!laid_out_) return makeError(llvm::formatv("artifact {0}: segment {1} written before layout", path_, id));
  if (id >= segments_.size())
    return makeError(llvm::formatv("artifact {0}: segment id {1} out of range ({2} reserved)", path_, id,
                                   segments_.size()));
  if (temp_removed_)
    return makeError(llvm::formatv("artifact {0}: segment {1}: an earlier write failed", path_, id));
  SegmentState& s = segments_[id];
  if (s.started) return makeError(llvm::formatv("artifact {0}: segment {1} written twice", path_, id));
  if (*size != s.size)
    return makeError(llvm::formatv("artifact {0}: segment {1}: {2} bytes given, {3} reserved", path_, id, *size,
                                   s.size));
  s.started = true;
  *offset = s.offset;
  return llvm::Error::success();
}

llvm::Error ArtifactWriter::writeSegment(SegmentId id, llvm::ArrayRef<uint8_t> bytes) {
  uint64_t offset = 0, size = bytes.size();
  if (auto err = claim(id, &offset, &size)) return err;
  if (auto err = writeAt(offset, bytes, llvm::formatv("segment {0}", id))) return err;
  const uint64_t hash = XXH64(bytes.data(), bytes.size(), 0);
  std::lock_guard<std::mutex> lock(mu_);
  segments_[id].xxh64 = hash;
  segments_[id].written = true;
  return llvm::Error::success();
}

llvm::Expected<SegmentStream> ArtifactWriter::beginSegment(SegmentId id) {
  uint64_t offset = 0, size;
  {
    std::lock_guard<std::mutex> lock(mu_);
    size = id < segments_.size() ? segments_[id].size : 0;
  }
  if (auto err = claim(id, &offset, &size)) return err;
  return SegmentStream(this, id);
}

fb::Segment ArtifactWriter::segment(SegmentId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  assert(id < segments_.size());
  const SegmentState& s = segments_[id];
  return fb::Segment(s.offset, s.size, s.written ? s.xxh64 : 0);
}

llvm::Error ArtifactWriter::commit(llvm::ArrayRef<uint8_t> manifest) {
  auto fail = [&](llvm::Error err) {
    discard();
    return err;
  };
  if (committed_) return makeError(llvm::formatv("artifact {0}: committed twice", path_));
  if (!laid_out_) return fail(makeError(llvm::formatv("artifact {0}: commit before layout", path_)));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (temp_removed_) return makeError(llvm::formatv("artifact {0}: commit after a failed write", path_));
  }
  for (size_t i = 0; i < segments_.size(); ++i)
    if (!segments_[i].written)
      return fail(makeError(llvm::formatv("artifact {0}: segment {1} ({2} bytes at offset {3}) was never written",
                                          path_, i, segments_[i].size, segments_[i].offset)));
  const uint64_t n = manifest.size();
  if (n > manifest_reserved_)
    return fail(makeError(llvm::formatv("artifact {0}: manifest is {1} bytes but layout reserved {2} (the manifest "
                                        "must be built with the same fields both times)",
                                        path_, n, manifest_reserved_)));
  if (n < 12 || readLE32(manifest.data()) != n - 4)
    return fail(makeError(llvm::formatv("artifact {0}: manifest of {1} bytes does not start with its size prefix "
                                        "(FinishSizePrefixed)",
                                        path_, n)));
  // The bytes came from our own builder, but a wrong root type or a missing identifier would only
  // show at load time; refuse them here.
  std::vector<uint8_t> bytes(manifest.begin(), manifest.end());
  flatbuffers::Verifier verifier(bytes.data(), bytes.size());
  if (!fb::VerifySizePrefixedArtifactBuffer(verifier))
    return fail(makeError(llvm::formatv("artifact {0}: manifest of {1} bytes is not a verifiable size-prefixed "
                                        "Artifact FlatBuffer with identifier {2}",
                                        path_, n, fb::ArtifactIdentifier())));
  const fb::Artifact* root = fb::GetSizePrefixedArtifact(bytes.data());
  const fb::Segment* check = root->manifest_check();
  if (!check)
    return fail(makeError(llvm::formatv("artifact {0}: manifest has no manifest_check (pass a placeholder "
                                        "Segment; commit fills it)",
                                        path_)));
  const size_t at = static_cast<size_t>(reinterpret_cast<const uint8_t*>(check) - bytes.data());
  const fb::Segment zeroed(0, n, 0);
  std::memcpy(bytes.data() + at, &zeroed, sizeof(zeroed));
  const fb::Segment filled(0, n, XXH64(bytes.data(), bytes.size(), 0));
  std::memcpy(bytes.data() + at, &filled, sizeof(filled));

  if (auto err = writeAt(0, bytes, "manifest")) return fail(std::move(err));
  if (::fsync(fd_) != 0) {
    const int err = errno;
    return fail(ioError(llvm::formatv("fsync of temp file {0}", temp_path_), err));
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    return fail(ioError(llvm::formatv("closing temp file {0}", temp_path_), err));
  }
  if (::rename(temp_path_.c_str(), target_path_.c_str()) != 0) {
    const int err = errno;
    return fail(ioError(llvm::formatv("renaming {0} to {1}", temp_path_, target_path_), err));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    committed_ = true;
    llvm::sys::DontRemoveFileOnSignal(temp_path_);
  }
  // Persist the rename itself (best effort: some filesystems refuse fsync on directories).
  llvm::StringRef dir = llvm::sys::path::parent_path(target_path_);
  const std::string dir_path = dir.empty() ? "." : dir.str();
  const int dfd = ::open(dir_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return llvm::Error::success();
}

}  // namespace minfer::artifact
