// ArtifactFile: a .mfb artifact mapped read-only and verified before anything else reads it.
//
// Format (DESIGN.md §2, schema/artifact.fbs): bytes [0, N) are a size-prefixed FlatBuffer manifest
// with file identifier "MFB1"; data segments (weight planes, cubins, PTX) follow at multiples of
// 4096 and are referenced by (offset, size, xxh64).
//
// open() runs two stages before returning, and nothing reads the mapping before both have passed:
//   1. structure: file large enough for the header, identifier "MFB1", size prefix within the file,
//      flatbuffers::Verifier over [0, N) (depth ≤ kVerifierMaxDepth, tables ≤ kVerifierMaxTables);
//   2. meaning: format version, manifest_check extent, every segment 4096-aligned, after the
//      manifest, inside the file and overlapping no other; every stride table self-consistent and
//      its bytes() equal to its plane's segment size; plane shape equal to the tensor's (cols = ne[0],
//      rows = ne[1]·ne[2]·ne[3]); every buffer id, tensor index and kernel index of the plans in
//      range; enums in range; model config and tokenizer consistent (see artifact_verifier.cpp).
// Failures name the file, the field ("tensors[12].planes[1].data"), the manifest offset of that
// field and the numbers involved. Then the manifest's own checksum (manifest_check), always: it is
// small. The data segments' checksums are not read by open() (that would read the whole file once
// more): the runtime checks them by default in the pass that reads the bytes anyway (Model::open,
// ModelOptions::verify_checksums; the CUDA backend hashes while staging the upload, the CPU backend
// calls verifySegments()); verifyChecksums() checks everything, padding included (minfer-inspect
// --verify).
//
// Padding (the < 4096 zero bytes after the manifest and after each segment): checked only by
// verifyChecksums(), not by the runtime's default check. Nothing reads those bytes, so damage there
// cannot change a result; checking them at load would mean reading bytes for no other purpose.
//
// Thread-safety: after open() the object is immutable; all methods may be called concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/stride_table.h"
#include "minfer/status.h"
#include "schema/artifact_generated.h"

namespace minfer {

// The artifact format this runtime reads: major must match, minor from kArtifactFormatMinorOldest (1.1:
// the first with launch records) up to kArtifactFormatMinor. The compiler writes this version.
inline constexpr uint16_t kArtifactFormatMajor = 1;
inline constexpr uint16_t kArtifactFormatMinor = 10;
inline constexpr uint16_t kArtifactFormatMinorOldest = 1;
// Limits on what an artifact may ask for, bounded once by the verifier (and used by the compiler for
// its options): tokens per forward call (memory.max_batch), and the launch records' extents.
inline constexpr uint32_t kArtifactMaxBatch = 65536;
inline constexpr uint32_t kArtifactMaxKernelArgs = 16;
inline constexpr uint32_t kArtifactMaxSharedBytes = 227 * 1024;      // sm_90's opt-in maximum per block
inline constexpr uint64_t kArtifactMaxScratchBytes = uint64_t{1} << 30;
// The largest counter region (KernelArg.bytes of a Counters argument, format 1.5): 1 MiB of 32-bit words.
inline constexpr uint64_t kArtifactMaxCounterBytes = uint64_t{1} << 20;
inline constexpr uint64_t kArtifactSegmentAlignment = 4096;
// Limits handed to flatbuffers::Verifier (the schema nests 4 tables deep; a 70B model has ~10k tables).
inline constexpr uint32_t kVerifierMaxDepth = 16;
inline constexpr uint32_t kVerifierMaxTables = 1000000;

// Appended to a checksum mismatch found while loading for a run (Model::open, the CUDA backend,
// minfer-bench): what it means and how to skip the check.
inline constexpr char kChecksumHint[] =
    "the artifact changed after it was written (copy it again or recompile it); --no-verify "
    "(ModelOptions::verify_checksums = false) skips this check";

class ArtifactFile {
 public:
  // One data segment the manifest refers to, named by its field path, e.g.
  // "tensors[3].planes[1].data" or "kernels[0].cubin".
  struct SegmentRef {
    std::string field;
    const fb::Segment* segment;  // inside the mapping
    std::string owner;           // what the bytes are: tensor "blk.0.attn_q.weight", kernel "rms_norm_f32"
  };

  // Maps `path` read-only and runs both verification stages. Errors: I/O (open, fstat, mmap), and
  // every structural or semantic failure above; the message starts with the path.
  static Result<std::unique_ptr<ArtifactFile>> open(const std::string& path);
  ~ArtifactFile();
  ArtifactFile(const ArtifactFile&) = delete;
  ArtifactFile& operator=(const ArtifactFile&) = delete;

  // Recomputes XXH64 (seed 0) of the manifest (its manifest_check field taken as zero) and of every
  // segment, in file order, and checks that every byte no segment covers after the manifest is zero.
  // Error names the first mismatching segment and both hashes, or the offset of the stray byte.
  Status verifyChecksums() const;
  // The manifest's checksum alone (manifest_check); open() runs it, since the manifest is small.
  Status verifyManifestChecksum() const;
  // XXH64 (seed 0) of every segment for which `include` returns true (every segment when it is
  // empty), on up to `threads` threads (0: hardware concurrency, at most 16), each hashing whole
  // segments, largest first; padding is not checked (see above). One pass over the bytes, about
  // 10 GB/s per thread from the page cache (12.7 GB of planes in 0.36 s on 16 cores of an H200
  // host). Error: checksumMismatch() of the mismatching segment with the lowest offset, with
  // kChecksumHint.
  Status verifySegments(const std::function<bool(const SegmentRef&)>& include = {}, unsigned threads = 0) const;
  // The error for segment `ref` whose bytes hash to `computed` (not ref.segment->xxh64()):
  // "<path>: tensors[3].planes[1].data [<offset>, +<size>) (tensor "x"): xxh64 <computed> computed,
  // <recorded> recorded in the manifest: damaged data". `hint` is appended after "; ".
  Status checksumMismatch(const SegmentRef& ref, uint64_t computed, const std::string& hint = "") const;
  // The entry of segments() for `segment` (a segment of this manifest), or nullptr when it is empty
  // or not one of them. O(log n).
  const SegmentRef* findSegment(const fb::Segment& segment) const;

  // The verified manifest (valid as long as this object lives).
  const fb::Artifact* manifest() const { return manifest_; }
  // First byte of a segment of this artifact's manifest; nullptr when it lies outside the file
  // (cannot happen for a segment taken from manifest(), since open() checked every one).
  const uint8_t* segmentData(const fb::Segment& segment) const;
  // Every non-empty segment, sorted by offset.
  const std::vector<SegmentRef>& segments() const { return segments_; }

  const std::string& path() const { return path_; }
  // The open file behind the mapping (read-only, close-on-exec), for reading segment bytes with pread
  // without faulting the mapping's pages into the process (the CUDA upload does): -1 for none.
  int fd() const { return fd_; }
  uint64_t fileSize() const { return size_; }
  // N: bytes of the size-prefixed manifest at the start of the file (prefix included).
  uint64_t manifestSize() const { return manifest_size_; }

 private:
  ArtifactFile() = default;

  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t manifest_size_ = 0;
  const fb::Artifact* manifest_ = nullptr;
  std::vector<SegmentRef> segments_;
};

// The StrideTable (kernels/stride_table.h) of a plane of a verified manifest: a field-by-field copy.
StrideTable toStrideTable(const fb::StrideTable& t);

}  // namespace minfer
