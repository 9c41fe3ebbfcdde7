// CUDA backend: runs the artifact's execution plans with its NVRTC kernel images (DESIGN.md §1, §5).
//
// Phases:
//   create (plan): open the GPU (driver loaded with dlopen, cuda_driver.h); choose the image arch —
//     the cubin for the GPU's exact arch, else the PTX of the newest arch below it, JIT-compiled by the
//     driver (noted once), else an error naming the GPU arch and the archs the artifact holds; load
//     each image the plans use once (cuModuleLoadData); check every plan step's kernels against its op;
//     upload every weight plane from the mapping into one device allocation through pinned staging
//     buffers: up to 4 threads, each with two 32 MiB buffers and a stream, memcpy into one buffer while
//     the DMA engine drains the other; with verify_checksums, 8 threads, each taking whole planes and
//     streaming XXH64 over the bytes it stages, so checking costs no second read of the file.
//   createSession (allocate): activation buffers (memory plan, max_batch rows; q8 buffers as
//     kernels/common.cuh lays them out), the f16 KV cache for n_ctx positions, decode-attention
//     partials, the position word; launch records with every argument resolved; the decode plan
//     captured into a CUDA graph. Fails with the bytes needed and free when the GPU is short.
//   forward (execute): uploads token ids and pos0 (pinned → device), launches the prefill steps
//     (n > 1) or replays the decode graph (n == 1; kernels read pos0 from device memory, so the graph
//     stays valid as the position advances), copies the logits back. Allocates nothing. When only the
//     last row's logits are wanted, the prefill steps after the last attention (all row-wise) run on
//     that row alone.
//
// Thread-safety: as Backend/BackendSession (runtime/backend.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace minfer {

struct CudaBackendOptions {
  int device = -1;          // GPU ordinal; −1: $MINFER_CUDA_DEVICE, else 0
  // Capture the decode plan in a CUDA graph, and a paged session's steps of at most 64 rows without a gathered
  // tail in one graph per row count (at the first step of that many rows).
  bool decode_graph = true;
  // Launch the decode plan's records marked `overlap` with programmatic dependent launch on sm_90+ GPUs:
  // a kernel's launch and prologue (e.g. a GEMV's weight prefetch) overlap the previous kernel's tail.
  // Measured on an H200 (7B Q4_K_M, BENCHMARKS.md): decode +11%; the prefill of 128 tokens −6% with it
  // (pp512 unchanged), so prefill launches without it, except a paged session's steps of at most 64 rows
  // (batched decode: +3 … +10% at 8 … 64 sequences).
  bool overlap_launches = true;
  // A single-sequence session's decode step whose logits the host reads (forwardLast) runs a second decode graph in
  // which the output head's GEMV stores the row straight into the session's pinned host buffer (mapped memory), so
  // the row's download (608 KB for a 152,064-token vocabulary) leaves the critical path between two steps. Only where
  // one launch of the decode plan touches the logits row and it is a GEMV that only stores it; else (and off) the
  // row is written to device memory and downloaded after the graph.
  bool logits_to_host = true;
  // A paged session's step whose output rows are not all its rows (prompt chunks) runs the plan's last-token tail on
  // the output rows alone, gathered to the first rows. Off: the whole plan on every row and the outputs read from
  // their own rows, as with a plan that has no tail (for tests of that path; the head then costs every row).
  bool last_token_tail = true;
  // Check every data segment's XXH64: planes while they are staged for upload, kernel images before
  // cuModuleLoadData, the images not loaded at the end. Error names segment, tensor/kernel, hashes.
  bool verify_checksums = true;
};

// The CUDA backend as the runtime sees it. `artifact` must outlive the backend and its sessions.
// Errors: no driver / no GPU (message says so), no kernel images in the artifact ("compiled without
// --target"), no image usable on this GPU (names the GPU arch and the artifact's archs), a module that
// fails to load (driver JIT log), a plan step whose kernels do not match its op, out of device memory.
Result<std::unique_ptr<Backend>> createCudaBackend(const ArtifactFile& artifact, const CudaBackendOptions& options = {});

namespace cuda {

class CudaDevice;

// Which images to use on a GPU of compute capability cc_major.cc_minor, given the archs the artifact
// holds ("sm_80", "sm_90", "sm_90a", …): the exact arch's cubins (an "a" arch only on its own GPU),
// else the PTX of the highest portable arch ≤ the GPU's (JIT), else an error naming both sides.
struct ArchChoice {
  std::string arch;     // the artifact arch whose images are used
  bool jit_ptx = false; // true: load the PTX (driver JIT), false: the cubin
  std::string note;     // one line for the user
};
Result<ArchChoice> chooseImageArch(int cc_major, int cc_minor, const std::vector<std::string>& artifact_archs);

// Per-step GPU time, accumulated over forward() calls while profiling is on: CUDA events around each
// step, recorded inside the decode graph (a second graph with event nodes, so decode runs as a graph
// while profiled; without programmatic overlap, so a step's time is its kernels' alone).
struct StepTime {
  std::string name;   // plan step name, e.g. "blk.3.attn_q"
  std::string op;     // OpKind name
  bool prefill = true;
  double ms = 0;      // total milliseconds
  uint64_t calls = 0;
  // Bytes the step's kernels moved over those calls: whole weight planes read (one row per token for
  // Embed, which gathers; for expert planes, the slices of at most n_expert_used · n_tokens experts),
  // K/V cache positions read
  // by decode attention (prefill attention's re-reads of K/V tiles are not counted) and written by the
  // store. Activations are not counted (≤ a few KB per decode step).
  double bytes = 0;
};

class CudaSession final : public BackendSession {
 public:
  ~CudaSession() override;
  Status forward(std::span<const int32_t> tokens, int pos0, float* logits, bool all_rows) override;
  Result<std::span<const float>> forwardLast(std::span<const int32_t> tokens, int pos0) override;
  int maxBatch() const override;
  int contextLength() const override;
  uint64_t allocatedBytes() const override;
  uint64_t kvCacheBytes() const override;
  bool canResumeAt(int pos0) const override;

  // A paged session (CudaBackend::createPagedSession) only: evaluates rows of several sequences in one pass
  // of the prefill plan with each positional step's paged launches (kernels/paged_attention.cuh); a single
  // row runs the decode plan so (its GEMVs, as a CUDA graph) where every positional decode step has paged
  // launches too (artifacts of format 1.6 with paged launches on every positional step). Row t is
  // token tokens[t] at position positions[t] of its sequence, whose block table starts at word tables[t] of
  // `tables` (schema ArgKind BlockTables: tables[0 .. rows) are those indices, the tables follow); each row's
  // K and V land in its slot of the pool and it attends to its own sequence's positions 0..positions[t].
  // out_rows: the rows whose outputs come back (increasing; when they are not every row, the plan's last-token
  // tail runs on those rows alone, gathered to the first rows of its input buffers: a prompt chunk's other rows skip
  // the output head). Requires 1 ≤ rows ≤ maxBatch(), positions.size() == rows, rows ≤ tables.size() ≤ the session's
  // table_words, and tables that cover every row's position with blocks inside the pool; each is checked before
  // anything is uploaded and a violation is an error naming the row, the value and the bound. What comes back of
  // the output rows is `out`'s: their logits (all or some of them; into the caller's memory or the pinned buffer;
  // the rows not asked for are left as they were) and their argmax. Errors too: out_rows empty, not increasing or
  // not below the row count; download neither empty nor one flag per output row; argmax asked for without the
  // kernel; more output rows than the pinned buffer holds; a CUDA call that fails (named).
  struct RowsOutput {
    // out_rows.size() × n_vocab floats, row i the logits of row out_rows[i]; null: the rows go to the session's pinned
    // buffer instead (pinnedLogits; at most the PagedSessionConfig's pinned_rows rows, else an error).
    float* logits = nullptr;
    std::span<const uint8_t> download;   // per output row, nonzero: its logits row is copied; empty: every row
    // Every output row's argmax (kernels/argmax.cuh, the artifact's argmax launch record) into pinnedArgmax(),
    // 4 bytes back per row. Error when the artifact has no argmax kernel image (deviceSampling().argmax false).
    bool argmax = false;
  };
  Status forwardRows(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                     std::span<const int32_t> tables, std::span<const int> out_rows, const RowsOutput& out);
  // The pinned host rows forwardRows with null RowsOutput::logits left: (out_rows.size(), n_vocab) f32, row i the
  // logits of row out_rows[i] (where downloaded); valid until the next forward of this session.
  const float* pinnedLogits() const;
  // The pinned argmax forwardRows(…, {.argmax = true}) left: out_rows.size() token ids in [0, n_vocab), entry i row
  // out_rows[i]'s; valid until the next forward of this session.
  const int32_t* pinnedArgmax() const;

  // Device sampling (runtime/backend.h): the artifact's argmax (1.1) and top-k (1.9, kernels/topk.cuh) launch
  // records (top-k in sessions that are not paged; a paged session's argmax is forwardRows'). forwardArgmax copies 4
  // bytes back instead of the logits row, forwardTopK k (id, logit) pairs (the request, 16 + 4·penalized bytes, goes
  // up first).
  DeviceSampling deviceSampling() const override;
  Result<int32_t> forwardArgmax(std::span<const int32_t> tokens, int pos0) override;
  Status forwardTopK(std::span<const int32_t> tokens, int pos0, float repeat_penalty,
                     std::span<const int32_t> penalized, std::span<TokenLogit> out) override;
  Status lastLogits(float* logits) override;
  void setProfiling(bool on);
  std::vector<StepTime> profile() const;  // steps with calls > 0, plan order (prefill then decode)
  void resetProfile();
  bool usesDecodeGraph() const;
  // The latest forward's logits row was stored into the pinned buffer by the output head itself (the decode graph of
  // CudaBackendOptions::logits_to_host, where the plan allows it), not downloaded.
  bool rowStoredByHead() const;
  double peakBytesPerSecond() const;  // the GPU's DRAM bandwidth from its attributes (0: unknown)

  struct State;
  explicit CudaSession(std::unique_ptr<State> state);

 private:
  std::unique_ptr<State> s_;
};

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(const ArtifactFile& artifact, const CudaBackendOptions& options);
  ~CudaBackend() override;
  const char* name() const override { return "cuda"; }
  Result<std::unique_ptr<BackendSession>> createSession(const BackendSessionConfig& config) const override;
  Result<std::unique_ptr<CudaSession>> createCudaSession(const BackendSessionConfig& config) const;
  // A CudaBatchSession (cuda_batch_session.cpp) when supportsPagedSessions(), else null (Model then builds
  // the sequential fallback). Errors: out of device memory (bytes needed and free).
  Result<std::unique_ptr<BatchSession>> createBatchSession(const BatchConfig& config) const override;

  // Sessions whose rows come from several sequences over a paged KV pool (CudaSession::forwardRows): the
  // artifact has paged launches for every positional prefill step (format 1.6; older artifacts have none).
  bool supportsPagedSessions() const;
  struct PagedSessionConfig {
    int n_ctx = 0;        // positions per sequence at most
    int64_t kv_slots = 0; // KV pool slots per layer (n_blocks · block_size)
    int block_size = 0;   // positions per block
    int table_words = 0;  // int32 words of the largest `tables` argument of forwardRows
    int pinned_rows = 1;  // logits rows the pinned buffer holds (forwardRows with null logits), ≥ 1
  };
  // Errors: no paged launches in the artifact, out of device memory.
  Result<std::unique_ptr<CudaSession>> createPagedSession(const PagedSessionConfig& config) const;

  // "NVIDIA H200 (sm_90, 132 SMs, 143 GB), driver 13.0: 26 kernel images (sm_90 cubins), 5.2 GB of
  // weights uploaded in 1.3 s".
  const std::string& note() const;
  uint64_t weightBytes() const;
  double uploadSeconds() const;

  struct State;
  explicit CudaBackend(std::unique_ptr<State> state);

 private:
  std::unique_ptr<State> s_;
};

}  // namespace cuda
}  // namespace minfer
