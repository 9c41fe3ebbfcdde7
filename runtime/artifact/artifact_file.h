// Internal interface of the artifact loader: the two verification stages behind ArtifactFile::open.
//
// Both stages read only [0, N) of the mapping (the manifest), never segment data. They are split out
// so tests and tools can run them on bytes that are not a file, and so the checks of one stride table
// can be reused (minfer-inspect prints the same verdict).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/stride_table.h"
#include "minfer/artifact.h"
#include "minfer/status.h"
#include "runtime/artifact/message_format.h"

namespace minfer::artifact {

// Stage 1 over `size` bytes at `data` (the whole file): header size, identifier "MFB1", size prefix
// within the file, flatbuffers::Verifier. On success sets *manifest_size = N (4 + size prefix).
// When the Verifier fails, the message names the first top-level field (and vector element) that
// fails on its own, e.g. "tensors[3]".
Status verifyStructure(const std::string& path, const uint8_t* data, uint64_t size, uint64_t* manifest_size);

// Stage 2 (after stage 1 passed): the semantic checks listed in minfer/artifact.h. Fills `segments`
// with every non-empty segment, sorted by offset.
Status verifySemantics(const std::string& path, const uint8_t* data, uint64_t size, uint64_t manifest_size,
                       std::vector<ArtifactFile::SegmentRef>* segments);

// Why the stride table `t` is not self-consistent, or "" when it is: enums in range, nonzero
// rows/cols/row_pitch, element type matching the plane kind, row_pitch large enough for the row
// (dense: cols·elemBytes; scale/min: ceil(cols/group_size)·group_pitch; packed 4-bit: cols/2 with
// cols % 32 == 0; packed 8-bit: cols; blocks: cols/block_size·block bytes of ggml_type),
// rows·row_pitch without 64-bit overflow.
std::string strideTableProblem(const fb::StrideTable& t);

// A problem found in a launch record: the sub-field ("args[2].plane.row_pitch", relative to the
// launch), the manifest object it is in, and what is wrong.
struct LaunchProblem {
  std::string field;
  const void* at = nullptr;
  std::string what;
};

// Checks one launch record (schema Launch) of a verified-structure manifest `m` against the rest of
// it: one image per target arch, of that arch, all with one entry point; at most
// kArtifactMaxKernelArgs arguments, each in range for its kind (buffer ids, buffer types and widths,
// tensor indices, KV layers < n_layer); every Weight argument's stride table equal, field by field, to
// the table of the plane it binds (the offset gate at load: a kernel specialized for one pitch never
// runs on a plane of another); grid extents in CUDA's limits for 1..memory.max_batch tokens; block
// and dynamic shared memory in range. In a `tail` step (schema Plan): no in-place buffer, KV cache,
// positions or scratch argument. Weight arguments are read, except in the load plan, whose launches
// write derived planes (Plane.derived) and read only stored ones. The paged arguments (RowPositions,
// BlockTables, BlockSize; 1.6) appear in paged launches (Step.paged_launches) only, which take no
// Positions. The TopK argument (1.9) appears in Artifact.topk only, with bytes = sizeof(kern::TopKSlot)
// (the slot layout this runtime uploads and reads). Returns false and fills *problem on the first failure.
enum class LaunchPlace { kStep, kTailStep, kLoadStep, kPagedStep, kTopK };  // kStep also for Artifact.argmax
bool checkLaunch(const fb::Artifact& m, const fb::Launch& launch, LaunchPlace place, LaunchProblem* problem);

}  // namespace minfer::artifact
