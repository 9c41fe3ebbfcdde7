// ArtifactFile: read-only mapping of a .mfb, the two verification stages, checksums on demand.
#include "runtime/artifact/artifact_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

namespace minfer {
namespace {

using artifact_detail::cat;
std::string hex(uint64_t v) { return artifact_detail::hex(v, 16); }

// Offset of the first nonzero byte in [p, p + n), or n.
uint64_t firstNonZero(const uint8_t* p, uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w != 0) break;
  }
  for (; i < n; ++i)
    if (p[i] != 0) return i;
  return n;
}

}  // namespace

Result<std::unique_ptr<ArtifactFile>> ArtifactFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error(cat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::error(cat(path, ": fstat failed: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error(cat(path, ": not a regular file"));
  }
  std::unique_ptr<ArtifactFile> file(new ArtifactFile());
  file->path_ = path;
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return Status::error(cat(path, ": mmap of ", file->size_, " bytes failed: ", std::strerror(err)));
    }
    file->data_ = static_cast<const uint8_t*>(p);
  }
  file->fd_ = fd;  // kept for pread (fd()): the same file as the mapping, whatever happens to the path

  static const uint8_t kEmpty[1] = {0};
  const uint8_t* bytes = file->data_ ? file->data_ : kEmpty;
  MINFER_RETURN_IF_ERROR(artifact::verifyStructure(path, bytes, file->size_, &file->manifest_size_));
  MINFER_RETURN_IF_ERROR(
      artifact::verifySemantics(path, bytes, file->size_, file->manifest_size_, &file->segments_));
  file->manifest_ = fb::GetSizePrefixedArtifact(file->data_);
  // The manifest's own checksum is cheap (it is small) and always checked: a flipped byte in a token,
  // a float of the config or a plan parameter passes both verifiers but not this.
  MINFER_RETURN_IF_ERROR(file->verifyManifestChecksum());
  return file;
}

ArtifactFile::~ArtifactFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

const uint8_t* ArtifactFile::segmentData(const fb::Segment& segment) const {
  uint64_t end;
  if (__builtin_add_overflow(segment.offset(), segment.size(), &end) || end > size_) return nullptr;
  return data_ + segment.offset();
}

Status ArtifactFile::verifyManifestChecksum() const {
  // The manifest, with manifest_check.xxh64 read as zero (schema/artifact.fbs).
  const fb::Segment* check = manifest_->manifest_check();
  const uint64_t at = static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(check) - data_) + 16;
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  XXH64_update(state, data_, at);
  const uint8_t zeros[8] = {};
  XXH64_update(state, zeros, 8);
  XXH64_update(state, data_ + at + 8, manifest_size_ - at - 8);
  const uint64_t manifest_hash = XXH64_digest(state);
  XXH64_freeState(state);
  if (manifest_hash != check->xxh64())
    return Status::error(cat(path_, ": manifest [0, +", manifest_size_, "): xxh64 ", hex(manifest_hash),
                             " computed, ", hex(check->xxh64()),
                             " recorded in manifest_check: damaged manifest"));
  return Status::ok();
}

Status ArtifactFile::verifyChecksums() const {
  MINFER_RETURN_IF_ERROR(verifyManifestChecksum());

  // Bytes outside every segment must be zero: the writer leaves them so, and this makes every
  // byte of the file covered by some check.
  uint64_t pos = manifest_size_;
  std::string after = "the manifest";
  auto checkGap = [&](uint64_t end, const std::string& before) -> Status {
    const uint64_t k = firstNonZero(data_ + pos, end - pos);
    if (k == end - pos) return Status::ok();
    char byte[8];
    std::snprintf(byte, sizeof(byte), "0x%02x", data_[pos + k]);
    return Status::error(cat(path_, ": byte ", byte, " at offset ", pos + k, " (between ", after, " and ", before,
                             ") is not zero: stray data outside every segment"));
  };
  for (const SegmentRef& s : segments_) {
    MINFER_RETURN_IF_ERROR(checkGap(s.segment->offset(), s.field));
    const uint64_t hash = XXH64(data_ + s.segment->offset(), s.segment->size(), 0);
    if (hash != s.segment->xxh64()) return checksumMismatch(s, hash);
    pos = s.segment->offset() + s.segment->size();
    after = s.field;
  }
  return checkGap(size_, "the end of the file");
}

Status ArtifactFile::checksumMismatch(const SegmentRef& ref, uint64_t computed, const std::string& hint) const {
  return Status::error(cat(path_, ": ", ref.field, " [", ref.segment->offset(), ", +", ref.segment->size(), ") (",
                           ref.owner, "): xxh64 ", hex(computed), " computed, ", hex(ref.segment->xxh64()),
                           " recorded in the manifest: damaged data", hint.empty() ? "" : "; ", hint));
}

const ArtifactFile::SegmentRef* ArtifactFile::findSegment(const fb::Segment& segment) const {
  // segments_ is sorted by offset and its segments are non-empty and disjoint (verifySemantics).
  auto it = std::lower_bound(segments_.begin(), segments_.end(), segment.offset(),
                             [](const SegmentRef& r, uint64_t offset) { return r.segment->offset() < offset; });
  if (it == segments_.end() || it->segment->offset() != segment.offset() || it->segment->size() != segment.size())
    return nullptr;
  return &*it;
}

Status ArtifactFile::verifySegments(const std::function<bool(const SegmentRef&)>& include, unsigned threads) const {
  std::vector<size_t> order;  // indices into segments_, largest first (whole segments per thread)
  uint64_t total = 0;
  for (size_t i = 0; i < segments_.size(); ++i)
    if (!include || include(segments_[i])) {
      order.push_back(i);
      total += segments_[i].segment->size();
    }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return segments_[a].segment->size() > segments_[b].segment->size();
  });
  std::vector<uint64_t> computed(segments_.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k = next++; k < order.size(); k = next++) {
      const fb::Segment* s = segments_[order[k]].segment;
      computed[order[k]] = XXH64(data_ + s->offset(), s->size(), 0);
    }
  };
  if (threads == 0) threads = std::min(16u, std::max(1u, std::thread::hardware_concurrency()));
  // Below a few MiB a thread costs more than it saves.
  const uint64_t n_threads = std::min<uint64_t>({threads, order.size(), total / (4ull << 20) + 1});
  std::vector<std::thread> pool;
  for (uint64_t t = 1; t < n_threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  std::sort(order.begin(), order.end());  // report the damaged segment with the lowest offset
  for (size_t i : order)
    if (computed[i] != segments_[i].segment->xxh64()) return checksumMismatch(segments_[i], computed[i], kChecksumHint);
  return Status::ok();
}

StrideTable toStrideTable(const fb::StrideTable& t) {
  StrideTable s;
  s.kind = static_cast<PlaneKind>(t.kind());
  s.elem = static_cast<ElemType>(t.elem());
  s.rows = t.rows();
  s.cols = t.cols();
  s.row_pitch = t.row_pitch();
  s.group_size = t.group_size();
  s.group_pitch = t.group_pitch();
  s.bits = t.bits();
  s.q_offset = t.q_offset();
  s.ggml_type = t.ggml_type();
  s.experts = t.experts();
  s.expert_pitch = t.expert_pitch();
  return s;
}

}  // namespace minfer
