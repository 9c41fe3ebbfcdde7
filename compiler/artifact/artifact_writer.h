// ArtifactWriter: writes a .mfb artifact (DESIGN.md §2) by streaming data segments to a temporary file
// and renaming it over the output path only when the manifest is committed.
//
// File layout: bytes [0, N) hold the size-prefixed FlatBuffer manifest (schema/artifact.fbs); data
// segments follow, each at the next multiple of kSegmentAlignment, in reservation order; every byte
// that no segment or manifest covers is zero. The same reservations, segment bytes and manifest give a
// byte-identical file, whatever the order or thread in which segments were written.
//
// Protocol (every size is known before any data is written: the layout planner knows plane sizes and
// kernels are compiled first):
//   auto w = ArtifactWriter::create("model.mfb");
//   SegmentId a = w->reserveSegment(bytes_a), ...;       // one per plane / cubin / PTX
//   N = size of the manifest built with w->segment(id)    // placeholders: same size as final values
//   w->layout(N);                                         // offsets fixed; the temp file is sized
//   w->writeSegment(a, bytes) ... (any thread, any order) // or beginSegment(a) + append() for streams
//   manifest built again with w->segment(id)              // now with offsets and xxh64
//   w->commit(manifest);                                  // manifest at 0, fsync, rename
// FlatBuffers stores structs inline at a fixed size, so replacing placeholder Segments by their final
// values does not change the manifest's size. The manifest must carry `manifest_check` (any value):
// commit fills it with (0, N, xxh64 of the manifest).
//
// Output path (runtime/util/output_file.h, resolveOutputPath): a directory, device, FIFO or socket is
// refused; a symbolic link is written through (the temporary file goes beside its target, the rename
// replaces the target, the link stays).
//
// Failure: until commit succeeds the output lives only in a temporary file beside the output path
// (same directory, so the rename is atomic); it is removed on error, on destruction without commit,
// and on SIGINT/SIGTERM (llvm::sys::RemoveFileOnSignal; a signal ignored when the process started
// stays ignored, temp_file_signals.h). A previous file at the output path is never touched before the
// rename. Errors name the path, the segment, the offset, the byte counts and strerror's reason.
//
// Thread-safety: writeSegment, beginSegment and SegmentStream::append/finish may be called
// concurrently for different segments; reserveSegment, layout and commit are single-threaded phases.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "schema/artifact_generated.h"

struct XXH64_state_s;

namespace minfer::artifact {

// Every data segment starts at a multiple of this many bytes (DESIGN.md §2; page size, so planes can
// be mapped and uploaded without copies).
inline constexpr uint64_t kSegmentAlignment = 4096;

using SegmentId = uint32_t;

class ArtifactWriter;

// Writes one segment in pieces, in order, hashing as it goes (one pass over the bytes, no buffering).
// Obtained from ArtifactWriter::beginSegment; finish() must be called once all bytes are appended.
class SegmentStream {
 public:
  SegmentStream(SegmentStream&&) noexcept;
  SegmentStream& operator=(SegmentStream&&) = delete;
  ~SegmentStream();

  // Writes `bytes` at the current position. Errors: more bytes than reserved, I/O failure.
  llvm::Error append(llvm::ArrayRef<uint8_t> bytes);
  // Checks that exactly the reserved size was appended and records the segment's xxh64.
  llvm::Error finish();

 private:
  friend class ArtifactWriter;
  SegmentStream(ArtifactWriter* writer, SegmentId id);
  ArtifactWriter* writer_;
  SegmentId id_;
  uint64_t written_ = 0;
  XXH64_state_s* state_;
  bool finished_ = false;
};

class ArtifactWriter {
 public:
  // Creates the temporary file beside `path` (beside its target when `path` is a symbolic link;
  // nothing is written at `path` itself until commit). Errors: `path` is a directory, device, FIFO,
  // socket or dangling link; the directory does not exist or is not writable (message names the
  // temp path and the reason).
  static llvm::Expected<std::unique_ptr<ArtifactWriter>> create(llvm::StringRef path);
  ~ArtifactWriter();  // removes the temporary file unless commit succeeded
  ArtifactWriter(const ArtifactWriter&) = delete;
  ArtifactWriter& operator=(const ArtifactWriter&) = delete;

  // Reserves a segment of `size` bytes (0 allowed: an empty segment is (offset 0, size 0)). Only
  // before layout(); ids are dense, in call order, and fix the order of segments in the file. Every
  // reserved segment, empty ones included, must be written before commit.
  SegmentId reserveSegment(uint64_t size);

  // Fixes the offsets: the first segment at alignUp(manifest_bytes, 4096), each next one at the
  // alignUp of the previous end. Sizes the temporary file (and asks the filesystem to allocate it,
  // so a full disk fails here rather than half-way). Errors: called twice, manifest_bytes < 12
  // (smaller than a size-prefixed FlatBuffer header), I/O (message has the byte count).
  llvm::Error layout(uint64_t manifest_bytes);

  // Writes the whole segment at its offset (pwrite; thread-safe) and records its xxh64.
  // Errors: before layout, unknown id, size differs from the reservation, written twice, I/O
  // ("write of N bytes at offset X failed: No space left on device").
  llvm::Error writeSegment(SegmentId id, llvm::ArrayRef<uint8_t> bytes);
  // Starts writing segment `id` in pieces (same errors as writeSegment, reported by append/finish).
  llvm::Expected<SegmentStream> beginSegment(SegmentId id);

  // The segment as the manifest records it: (0, size, 0) before layout, (offset, size, 0) after,
  // (offset, size, xxh64) once written. Same FlatBuffers size in every state.
  fb::Segment segment(SegmentId id) const;

  // Writes the manifest (a size-prefixed "MFB1" FlatBuffer with manifest_check present) at offset 0,
  // fills manifest_check, fsyncs and renames the temporary file to the output path.
  // Errors: manifest larger than the size given to layout(), not a verifiable Artifact buffer,
  // manifest_check absent, a reserved segment never written, I/O. On error the temp file is removed.
  llvm::Error commit(llvm::ArrayRef<uint8_t> manifest);

  const std::string& path() const { return path_; }
  const std::string& tempPath() const { return temp_path_; }
  // Total bytes of the artifact (valid after layout).
  uint64_t fileSize() const { return file_size_; }
  // Bytes reserved for the manifest at the start of the file (valid after layout).
  uint64_t manifestReserved() const { return manifest_reserved_; }

 private:
  friend class SegmentStream;
  struct SegmentState {
    uint64_t offset = 0;
    uint64_t size = 0;
    uint64_t xxh64 = 0;
    bool started = false;
    bool written = false;
  };

  ArtifactWriter(std::string path, std::string target_path, std::string temp_path, int fd);
  llvm::Error ioError(const llvm::Twine& what, int err) const;
  llvm::Error writeAt(uint64_t offset, llvm::ArrayRef<uint8_t> bytes, const llvm::Twine& what);
  llvm::Error claim(SegmentId id, uint64_t* offset, uint64_t* size);
  void discard();

  std::string path_;         // as given (messages)
  std::string target_path_;  // the file the rename replaces: path_, or its target when path_ is a symlink
  std::string temp_path_;
  int fd_ = -1;
  bool laid_out_ = false;
  bool committed_ = false;
  bool temp_removed_ = false;  // guarded by mu_
  uint64_t manifest_reserved_ = 0;
  uint64_t file_size_ = 0;
  mutable std::mutex mu_;  // guards segments_ after layout
  std::vector<SegmentState> segments_;
};

}  // namespace minfer::artifact
