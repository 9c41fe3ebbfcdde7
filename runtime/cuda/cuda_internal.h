// Internal state shared by cuda_backend.cpp (plan phase: images, weights) and cuda_session.cpp
// (allocate + execute phases). Not part of the runtime's interface.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "minfer/artifact.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_device.h"

namespace minfer::cuda {

// A kernel image loaded on the device.
struct LoadedImage {
  Module module;
  CUfunction fn = nullptr;
  std::string key;
  std::string entry;
  unsigned smem_optin = 0;  // dynamic shared memory the function has been opted in to (above 48 KiB)
};

// A weight plane on the device.
struct DevicePlane {
  StrideTable table;
  CUdeviceptr ptr = 0;
};

struct DeviceTensor {
  std::string name;
  std::vector<DevicePlane> planes;
  CUdeviceptr plane(PlaneKind kind) const {
    for (const DevicePlane& p : planes)
      if (p.table.kind == kind) return p.ptr;
    return 0;
  }
};

// A launch record of the artifact and the loaded image of the chosen arch that it launches.
struct BoundLaunch {
  const fb::Launch* record = nullptr;
  int image = -1;  // index into CudaBackend::State::images
};

// One plan step and its launches, in launch order.
struct StepKernels {
  const fb::Step* step = nullptr;
  std::vector<BoundLaunch> launches;
  std::vector<BoundLaunch> paged;  // Step.paged_launches (1.6): what a batch session launches instead
  std::vector<BoundLaunch> small;  // Step.small_launches (1.7): what a call of n ≤ small_rows launches instead
  uint32_t small_rows = 0;
  std::string label;  // "prefill step 12 'blk.0.attn_q' (MatMul)"
};

struct CudaBackend::State {
  const ArtifactFile* artifact = nullptr;
  std::shared_ptr<CudaDevice> dev;
  CudaBackendOptions options;
  ArchChoice arch;
  std::vector<LoadedImage> images;
  std::vector<StepKernels> prefill, decode;
  std::vector<StepKernels> load;  // run once by CudaBackend::create, after the upload
  BoundLaunch argmax;     // image −1 when the artifact has none
  BoundLaunch topk;       // likewise (format 1.9)
  // The prefill plan can run a batch of rows from several sequences (pagedPlanComplete): batch sessions
  // are CudaBatchSessions, else the sequential fallback. paged_decode: the decode plan can too (a step of
  // one row then runs it: the GEMVs and a graph instead of the prefill plan's GEMMs).
  bool paged = false, paged_decode = false;
  DeviceBuffer weights;   // every plane, 256-byte aligned, one allocation
  std::vector<DeviceTensor> tensors;
  std::string note;
  uint64_t weight_bytes = 0;    // device bytes of all planes (stored and derived)
  uint64_t derived_bytes = 0;   // of which derived planes, written by the load plan
  double upload_seconds = 0;
  double expand_seconds = 0;    // the load plan
};

// One kernel launch with every argument resolved (by the session's binder, from a launch record);
// the int argument `ntok` (if ≥ 0) receives n_tokens.
struct Launch {
  union Arg {
    CUdeviceptr p;
    int32_t i;
  };
  CUfunction fn = nullptr;
  kern::LaunchRule rule;
  Arg args[kArtifactMaxKernelArgs] = {};
  int n_args = 0;
  int ntok = -1;
  int step = -1;  // index into the plan's steps (profiling)
  // The calls this launch serves: n_tokens in [min_rows, max_rows] (a step with small-batch launches,
  // schema Step.small_launches, binds both forms and each call runs one: its launches from small_rows + 1 on,
  // or the small launches whose row range, Launch.min_rows / max_rows (1.10), holds n; every other launch
  // serves all).
  uint32_t min_rows = 0, max_rows = UINT32_MAX;
  bool serves(unsigned n_tokens) const { return n_tokens >= min_rows && n_tokens <= max_rows; }
  bool overlap = false;  // schema Launch.overlap: may start before the previous kernel ends (sm_90+)
  // Bytes this launch moves, for profiles: weight planes read (whole planes), K/V cache bytes per
  // cached position read (attention) and per token written (the store).
  uint64_t weight_bytes = 0, kv_read_per_pos = 0, kv_write_per_token = 0;
  uint64_t weight_row_bytes = 0;  // one row of each weight plane
  bool gathers = false;           // reads one weight row per token (Embed), not whole planes
  // Planes with an expert axis (MoE): bytes of one expert's slice of them, the experts, and how many
  // a token uses (the step's n_expert_used): a call reads at most min(experts, used·n_tokens) slices.
  uint64_t expert_slice_bytes = 0;
  uint32_t experts = 0, experts_used = 0;
  uint32_t window = 0;  // the step's attention window (0: none): positions read ≤ window
  const char* entry = "";
  // Arguments that address rows of an activation buffer (row t at p + t·row_bytes), for running the
  // plan's tail on the last token only (CudaSession::State::runPlan).
  struct RowArg {
    int arg = 0;
    uint32_t buffer = 0;
    uint64_t row_bytes = 0;
    bool written = false;  // an output of the launch (else an input)
    bool read = true;      // an input of the launch (access Read or ReadWrite)
  };
  RowArg rows[kArtifactMaxKernelArgs] = {};
  int n_rows = 0;
  void push(CUdeviceptr p) { args[n_args++].p = p; }
  void pushRow(CUdeviceptr p, uint32_t buffer, uint64_t row_bytes, bool written, bool read) {
    rows[n_rows++] = {n_args, buffer, row_bytes, written, read};
    push(p);
  }
  void pushInt(int32_t v) { args[n_args++].i = v; }
  void pushTokens() {
    ntok = n_args;
    args[n_args++].i = 0;
  }
};

// One segment of the weight upload: `bytes` to device address `dst`, read with pread from `fd` at
// `file_offset` when fd ≥ 0 (the artifact's file: the kernel copies from its page cache straight into
// the pinned staging buffer, and no page of the mapping enters the process's resident set), else
// copied from `src`.
struct UploadSegment {
  const uint8_t* src;
  CUdeviceptr dst;
  uint64_t bytes;
  int fd = -1;
  uint64_t file_offset = 0;
};
inline constexpr uint64_t kUploadChunkBytes = 4ull << 20;  // one pinned staging buffer
inline constexpr uint64_t kHashPieceBytes = 256ull << 10;   // memcpy then XXH64 while it is in L2

// Copies every segment to the device on up to 8 threads, each with two pinned staging buffers of
// kUploadChunkBytes and its own stream (reading one chunk into a buffer overlaps the DMA of the other).
// A worker takes whole segments, largest first, and sends each one's chunks in order, so that with
// `hashes` non-null it can stream XXH64 (seed 0) over the staged bytes, kHashPieceBytes at a time right
// after reading them (the hash reads L2, not memory: the bytes are read from the file once), and store
// the segment's digest in (*hashes)[i]. Errors: pinned allocation, a failed or short pread (with the
// offset and errno), the driver's copy/stream errors (with the byte counts).
Status uploadSegments(const CudaDevice& dev, const std::vector<UploadSegment>& segments, std::vector<uint64_t>* hashes);

// True when every step of a plan whose launches read the batch's first position (ArgKind Positions, or the
// KV cache) has paged launches (Step.paged_launches, format 1.6), and the plan is not empty: then the plan,
// each such step's paged launches in place of its own, runs rows of many sequences at once.
bool pagedPlanComplete(const std::vector<StepKernels>& plan);

// The LaunchRule (kernels/common.cuh) a launch record carries.
kern::LaunchRule launchRule(const fb::Launch& record);

}  // namespace minfer::cuda
