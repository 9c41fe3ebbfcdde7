// CUDA backend, allocate + execute phases: session buffers, launch records, decode graph, forward.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>

#include "kernels/topk.cuh"
#include "runtime/cuda/cuda_internal.h"
#include "runtime/kv_ring.h"
#include "schema/op_traits.h"

namespace minfer::cuda {
namespace {

constexpr uint64_t kAlign = 256;
uint64_t align(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

struct CudaSession::State {
  const CudaBackend::State* be = nullptr;
  std::shared_ptr<CudaDevice> dev;
  int n_ctx = 0, max_batch = 0, n_vocab = 0;
  uint32_t logits_buffer = 0, ids_buffer = 0;
  std::vector<CUdeviceptr> buf;      // buffer id → device address
  std::vector<uint32_t> buf_width;   // buffer id → width
  std::vector<fb::BufferType> buf_type;
  DeviceBuffer arena;                // activations | KV cache | attention partials | pos | argmax (max_batch)
                                     // | top-k slot [| rows]
  CUdeviceptr pos = 0, argmax_out = 0;
  CUdeviceptr topk_slot = 0;         // kern::TopKSlot (0 when the artifact has no top-k, or paged)
  PinnedBuffer pinned;               // ids (max_batch int32) | pos (16 words) [| row positions | block tables]
                                     // | argmax (max_batch) | pinned_rows logits rows (n_vocab f32, 16-byte pitch)
                                     // | top-k slot (SessionBuilder::allocate)
  int32_t* h_ids = nullptr;
  int32_t* h_pos = nullptr;
  int32_t* h_argmax = nullptr;
  // 16-byte aligned; a single row's download lands here, or host_exec's output head stores it here: forwardLast hands
  // it out (Session::logits() may show it), forward, forwardRows and lastLogits copy it on; each of them overwrites it.
  float* h_logits = nullptr;
  kern::TopKSlot* h_topk = nullptr;  // 16-byte aligned pinned mirror of topk_slot
  // A paged session (CudaBackend::createPagedSession): the prefill plan with each step's paged launches
  // (Step.paged_launches), the KV cache a pool of kv_slots slots, rows placed by forwardRows; the decode plan
  // likewise (and its graph) when every positional decode step has paged launches (CudaBackend paged_decode).
  bool paged = false;
  int block_size = 0, table_words = 0;
  int pinned_rows = 1;  // logits rows at h_logits (a paged session's PagedSessionConfig::pinned_rows)
  int64_t kv_slots = 0;                     // slots of the pool per layer (kv_slots / block_size blocks)
  CUdeviceptr row_pos = 0, tables = 0;      // (max_batch) int32; (table_words) int32 (schema BlockTables)
  int32_t* h_row_pos = nullptr;             // pinned mirrors of the two
  int32_t* h_tables = nullptr;
  Stream stream;
  std::vector<Launch> prefill, decode;
  // First prefill launch of the plan's last-token tail (schema Plan: the steps the compiler marked
  // `tail`), run on the last row alone when only the last token's logits are wanted. prefill.size()
  // when the plan has no tail.
  size_t tail = SIZE_MAX;
  std::vector<bool> fresh;  // per buffer: rewritten (at row 0) by the tail so far (runPlan scratch)
  Launch argmax;
  bool have_argmax = false;
  Launch topk;
  bool have_topk = false;
  // Byte offset in the logits buffer of the row the latest forwardArgmax / forwardTopK sampled; empty before
  // one has run, and again once any other forward (which rewrites the logits buffer) has started.
  std::optional<uint64_t> sampled_row;
  CUgraph graph = nullptr;
  CUgraphExec graph_exec = nullptr;
  // CudaBackendOptions::logits_to_host: `row_writer` is the decode launch that writes the logits row, with that
  // argument pointed at h_logits' device address; the decode graph captured with it in place of decode[row_writer_at]
  // is host_exec. row_on_host: the latest forward left its row at h_logits (host_exec ran).
  Launch row_writer;
  size_t row_writer_at = SIZE_MAX;
  bool capturing_host_row = false;
  CUgraph host_graph = nullptr;
  CUgraphExec host_exec = nullptr;
  bool row_on_host = false;
  // A paged session's steps of n ≤ kGraphRows rows without a gathered tail as CUDA graphs, index n, each captured at
  // the first step of that many rows (CudaBackendOptions::decode_graph; a one-time capture and instantiation per row
  // count): a step's launches, grids and n_tokens depend on its row count alone, its rows' ids, positions and block
  // tables are read from device memory. A row count whose capture failed launches directly from then on (`failed`).
  struct RowsGraph {
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    bool failed = false;
  };
  // The batched decode steps (the server's -np is at most 64 in the measurements, BENCHMARKS.md); longer steps are
  // prompt chunks, whose launches outlast their launch overhead.
  static constexpr unsigned kGraphRows = 64;
  std::vector<RowsGraph> rows_graphs;  // kGraphRows + 1 entries where rows_graphs_on (sized when the session is built)
  bool rows_graphs_on = false;
  // Programmatic dependent launch for records marked `overlap` (sm_90+ GPUs, CudaBackendOptions), where
  // `overlapping` allows it (see CudaBackendOptions::overlap_launches).
  bool overlap = false;
  // This call's launches may overlap: the decode plan's, and a paged session's steps of at most kOverlapRows rows
  // (batched decode; longer prompt chunks launch without, as single-sequence prefill does).
  bool overlapping = false;
  static constexpr unsigned kOverlapRows = 64;
  uint64_t allocated = 0, kv_bytes = 0;
  KvRingTracker rings;    // what the sliding-window layers' ring caches (schema Step.kv_ring) still hold
  // Profiling: one event pair per plan step, accumulated milliseconds and calls.
  bool profiling = false;
  bool capturing = false;                    // inside capture(): events become graph nodes
  CUgraph profile_graph = nullptr;           // the decode graph with an event pair around every step
  CUgraphExec profile_exec = nullptr;
  std::vector<Event> ev_prefill, ev_decode;  // 2 per step
  std::vector<double> ms_prefill, ms_decode;
  std::vector<uint64_t> calls_prefill, calls_decode;
  std::vector<double> bytes_prefill, bytes_decode;
  int last_pos0 = 0, last_n = 0;  // the forward pass being profiled

  ~State() {
    if (dev) (void)dev->makeCurrent();
    if (graph_exec) dev->cu().cuGraphExecDestroy(graph_exec);
    if (graph) dev->cu().cuGraphDestroy(graph);
    if (host_exec) dev->cu().cuGraphExecDestroy(host_exec);
    if (host_graph) dev->cu().cuGraphDestroy(host_graph);
    if (profile_exec) dev->cu().cuGraphExecDestroy(profile_exec);
    if (profile_graph) dev->cu().cuGraphDestroy(profile_graph);
    for (RowsGraph& g : rows_graphs) {
      if (g.exec) dev->cu().cuGraphExecDestroy(g.exec);
      if (g.graph) dev->cu().cuGraphDestroy(g.graph);
    }
  }

  const CudaDriver& cu() const { return dev->cu(); }

  // row_shift > 0: the launch runs on one row; inputs not yet rewritten in the tail (`fresh`) are read
  // at row row_shift, everything else at row 0.
  Status launch(const Launch& l, unsigned n_tokens, unsigned row_shift = 0, const std::vector<bool>* fresh = nullptr) {
    void* argp[kArtifactMaxKernelArgs];
    if (!l.serves(n_tokens)) return Status::ok();  // the step's other form (small-batch or not) runs this call
    Launch::Arg args[kArtifactMaxKernelArgs];
    std::memcpy(args, l.args, sizeof args);
    if (row_shift > 0)
      for (int r = 0; r < l.n_rows; ++r)
        if (!l.rows[r].written && !(*fresh)[l.rows[r].buffer]) args[l.rows[r].arg].p += row_shift * l.rows[r].row_bytes;
    if (l.ntok >= 0) args[l.ntok].i = static_cast<int32_t>(n_tokens);
    for (int i = 0; i < l.n_args; ++i) argp[i] = &args[i];
    const kern::LaunchShape s = l.rule.at(n_tokens);
    CUresult r;
    if (overlap && overlapping && l.overlap && !profiling) {
      // The kernel may start while the previous one of the stream runs; it waits for it itself
      // (kernels/common.cuh overlapPrologue). Under stream capture this becomes a programmatic edge.
      CUlaunchAttribute attr = {};
      attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attr.value.programmaticStreamSerializationAllowed = 1;
      CUlaunchConfig config = {};
      config.gridDimX = s.grid.x, config.gridDimY = s.grid.y, config.gridDimZ = s.grid.z;
      config.blockDimX = s.block.x, config.blockDimY = s.block.y, config.blockDimZ = s.block.z;
      config.sharedMemBytes = s.smem;
      config.hStream = stream.get();
      config.attrs = &attr;
      config.numAttrs = 1;
      r = cu().cuLaunchKernelEx(&config, l.fn, argp, nullptr);
    } else {
      r = cu().cuLaunchKernel(l.fn, s.grid.x, s.grid.y, s.grid.z, s.block.x, s.block.y, s.block.z, s.smem,
                              stream.get(), argp, nullptr);
    }
    if (r != CUDA_SUCCESS) return dev->check(r, std::string("CUDA: launch of ") + l.entry);
    return Status::ok();
  }

  // last_only: the tail (see `tail`) runs on row n − 1 only, leaving that row's logits in row 0.
  Status runPlan(bool prefill, unsigned n, bool last_only = false) {
    std::vector<Launch>& ls = prefill ? this->prefill : decode;
    std::vector<Event>& ev = prefill ? ev_prefill : ev_decode;
    const size_t tail_begin = prefill && last_only && n > 1 ? tail : ls.size();
    overlapping = !prefill || (paged && n <= kOverlapRows);
    std::fill(fresh.begin(), fresh.end(), false);
    int current = -1;
    for (size_t i = 0; i < ls.size(); ++i) {
      const Launch& l = !prefill && capturing_host_row && i == row_writer_at ? row_writer : ls[i];
      if (profiling && l.step != current) {
        if (current >= 0) record(ev[2 * current + 1]);
        current = l.step;
        record(ev[2 * current]);
      }
      if (i < tail_begin) {
        MINFER_RETURN_IF_ERROR(launch(l, n));
      } else if (l.serves(1)) {
        MINFER_RETURN_IF_ERROR(launch(l, 1, n - 1, &fresh));
        for (int r = 0; r < l.n_rows; ++r)
          if (l.rows[r].written) fresh[l.rows[r].buffer] = true;
      }
    }
    if (profiling && current >= 0) record(ev[2 * current + 1]);
    return Status::ok();
  }

  // forwardRows' arguments, each bounded before anything is uploaded (the paged KV store writes where they point):
  // the row count, each row's position inside the context, its table inside `tables` after the row offsets and every
  // block it covers inside the pool; the output rows; what `out` asks for.
  Status checkRows(std::span<const int32_t> tokens, std::span<const int32_t> positions, std::span<const int32_t> tables,
                   std::span<const int> out_rows, const CudaSession::RowsOutput& out) const {
    const int n = static_cast<int>(tokens.size());
    if (!paged) return Status::error("CUDA forwardRows: not a paged session (CudaBackend::createPagedSession)");
    if (n < 1 || n > max_batch || positions.size() != tokens.size())
      return Status::error("CUDA forwardRows: " + std::to_string(n) + " rows (" + std::to_string(positions.size()) +
                           " positions); the artifact's max batch is " + std::to_string(max_batch));
    if (tables.size() < tokens.size() || tables.size() > static_cast<size_t>(table_words))
      return Status::error("CUDA forwardRows: block tables of " + std::to_string(tables.size()) + " words for " +
                           std::to_string(n) + " rows (at least one per row, at most " + std::to_string(table_words) + ")");
    const int64_t n_blocks = kv_slots / block_size;
    for (int t = 0; t < n; ++t) {
      const int64_t p = positions[static_cast<size_t>(t)], at = tables[static_cast<size_t>(t)];
      if (p < 0 || p >= n_ctx)
        return Status::error("CUDA forwardRows: row " + std::to_string(t) + ": position " + std::to_string(p) +
                             " outside the context of " + std::to_string(n_ctx));
      const int64_t last = at + p / block_size;  // the word of the block that holds position p
      if (at < n || last >= static_cast<int64_t>(tables.size()))
        return Status::error("CUDA forwardRows: row " + std::to_string(t) + ": its block table at word " +
                             std::to_string(at) + " needs words up to " + std::to_string(last) + " of " +
                             std::to_string(tables.size()) + " (after the " + std::to_string(n) + " row offsets)");
      for (int64_t w = at; w <= last; ++w)
        if (tables[static_cast<size_t>(w)] < 0 || tables[static_cast<size_t>(w)] >= n_blocks)
          return Status::error("CUDA forwardRows: row " + std::to_string(t) + ": block " +
                               std::to_string(tables[static_cast<size_t>(w)]) + " (table word " + std::to_string(w) +
                               ") outside the pool of " + std::to_string(n_blocks) + " blocks");
    }
    if (n == 1 && !decode.empty() && (out_rows.size() != 1 || out_rows[0] != 0))
      return Status::error("CUDA forwardRows: one row, " + std::to_string(out_rows.size()) + " output rows");
    for (size_t i = 0; i < out_rows.size(); ++i)
      if (out_rows[i] < 0 || out_rows[i] >= n || (i > 0 && out_rows[i] <= out_rows[i - 1]))
        return Status::error("CUDA forwardRows: output row " + std::to_string(out_rows[i]) + " (index " +
                             std::to_string(i) + ") of " + std::to_string(n) + " rows: need increasing rows < the row count");
    if (out_rows.empty()) return Status::error("CUDA forwardRows: no output rows");
    if (!out.download.empty() && out.download.size() != out_rows.size())
      return Status::error("CUDA forwardRows: " + std::to_string(out.download.size()) + " download flags for " +
                           std::to_string(out_rows.size()) + " output rows");
    if (out.argmax && !have_argmax) return Status::error("CUDA forwardRows: the artifact has no argmax kernel image");
    if (!out.logits && out_rows.size() > static_cast<size_t>(pinned_rows))
      return Status::error("CUDA forwardRows: " + std::to_string(out_rows.size()) +
                           " output rows into the pinned buffer of " + std::to_string(pinned_rows) +
                           " rows (PagedSessionConfig::pinned_rows)");
    return Status::ok();
  }

  // After a forwardRows pass whose k output rows' logits are in rows rowOf(0) < … < rowOf(k−1) of the logits buffer:
  // the argmax of rows 0 … rowOf(k−1) when `out` asks (the artifact's argmax launch, one block per row), then the rows
  // `out` asks for to dst (row i at dst + i·n_vocab; consecutive rows in one copy: a step of decode rows is one), a
  // synchronization, and each output row's argmax moved to h_argmax[i] (rowOf(i) ≥ i: read before it is written).
  template <class RowOf>
  Status downloadOutputs(size_t k, RowOf rowOf, const CudaSession::RowsOutput& out, float* dst) {
    CUstream s = stream.get();
    if (out.argmax) {
      const size_t n = rowOf(k - 1) + 1;
      MINFER_RETURN_IF_ERROR(launch(argmax, static_cast<unsigned>(n)));
      MINFER_RETURN_IF_ERROR(
          dev->check(cu().cuMemcpyDtoHAsync(h_argmax, argmax_out, n * sizeof(int32_t), s), "CUDA argmax download"));
    }
    const uint64_t row = static_cast<uint64_t>(n_vocab) * sizeof(float);
    auto wanted = [&](size_t i) { return out.download.empty() || out.download[i] != 0; };
    for (size_t i = 0; i < k;) {
      if (!wanted(i)) {
        ++i;
        continue;
      }
      size_t j = i + 1;
      while (j < k && wanted(j) && rowOf(j) == rowOf(j - 1) + 1) ++j;
      MINFER_RETURN_IF_ERROR(dev->check(
          cu().cuMemcpyDtoHAsync(dst + i * n_vocab, buf[logits_buffer] + rowOf(i) * row, (j - i) * row, s),
          "CUDA forwardRows: logits download"));
      i = j;
    }
    MINFER_RETURN_IF_ERROR(dev->check(cu().cuStreamSynchronize(s), "CUDA forwardRows"));
    if (out.argmax)
      for (size_t i = 0; i < k; ++i) h_argmax[i] = h_argmax[rowOf(i)];
    return Status::ok();
  }

  // A paged session's step of n rows without a gathered tail: its graph (rows_graphs), captured first where there is
  // none yet, else (profiling, longer steps, graphs off, a failed capture) the launches themselves: the graphs only
  // save launch overhead, so a row count whose capture fails runs without one.
  Status runRows(unsigned n) {
    if (!rows_graphs_on || profiling || n > kGraphRows || rows_graphs[n].failed) return runPlan(/*prefill=*/true, n);
    RowsGraph& g = rows_graphs[n];
    if (!g.exec && !capture(&g.graph, &g.exec, n).isOk()) {
      g.failed = true;
      return runPlan(/*prefill=*/true, n);
    }
    return dev->check(cu().cuGraphLaunch(g.exec, stream.get()),
                      "CUDA forwardRows: the graph of a step of " + std::to_string(n) + " rows: launch");
  }

  // Prefill launches [begin, end) on n rows (a paged session's forwardRows; no profiling).
  Status launchRange(size_t begin, size_t end, unsigned n) {
    overlapping = paged && n <= kOverlapRows;
    for (size_t i = begin; i < end; ++i) MINFER_RETURN_IF_ERROR(launch(prefill[i], n));
    return Status::ok();
  }

  // One row-major part of a buffer the tail reads before writing it: `row_bytes` per row from `base`.
  struct TailInput {
    CUdeviceptr base;
    uint64_t row_bytes;
  };
  std::vector<TailInput> tail_inputs;  // gatherTailRows' copies, found once from the plan (findTailInputs)

  // The parts gatherTailRows moves: every buffer the tail (prefill launches [tail, end)) reads before it
  // writes it, its inputs from the steps before the tail. F32/I32/F16 buffers whole rows; q8 buffers both
  // parts (values, then the Q8Meta rows). Called once, after the plan is bound.
  void findTailInputs() {
    tail_inputs.clear();
    std::vector<bool> written(buf.size(), false), moved(buf.size(), false);
    for (size_t li = tail; li < prefill.size(); ++li) {
      const Launch& l = prefill[li];
      for (int r = 0; r < l.n_rows; ++r) {
        const uint32_t b = l.rows[r].buffer;
        if (l.rows[r].written || written[b] || moved[b]) continue;
        moved[b] = true;
        const uint64_t w = buf_width[b];
        switch (buf_type[b]) {
          case fb::BufferType::F32: case fb::BufferType::I32: tail_inputs.push_back({buf[b], 4 * w}); break;
          case fb::BufferType::F16: tail_inputs.push_back({buf[b], 2 * w}); break;
          case fb::BufferType::I8:
            tail_inputs.push_back({buf[b], w});
            tail_inputs.push_back({buf[b] + kern::q8MetaOffset(static_cast<unsigned>(max_batch), static_cast<unsigned>(w)),
                                   w / kern::kQ8Block * sizeof(kern::Q8Meta)});
            break;
        }
      }
      for (int r = 0; r < l.n_rows; ++r)
        if (l.rows[r].written) written[l.rows[r].buffer] = true;
    }
  }

  // Before the tail runs on rows[0..k) alone: row rows[i] of every tail input (tail_inputs) copied to row
  // i. rows is increasing with rows[i] ≥ i, so a copy never overwrites a row still to be read. Consecutive
  // rows move together: a run rows[i..j) of consecutive rows is one copy per part, split into pieces of at
  // most rows[i] − i rows where source and destination would overlap (each piece's destination ends where
  // its source begins; the stream orders the pieces). Cost: (runs + overlap splits) × parts device copies,
  // no allocation. D decode rows then a chunk: one copy per part (the decode rows stay); a chunk of C rows
  // then D decode rows: ⌈(D + 1) / (C − 1)⌉ per part, where a copy per moved row made D + 1.
  Status gatherTailRows(std::span<const int> rows) {
    for (size_t i = 0; i < rows.size();) {
      size_t j = i + 1;
      while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
      const uint64_t shift = static_cast<uint64_t>(rows[i]) - i;  // ≥ 0; the same for the whole run
      for (size_t p = i; shift > 0 && p < j;) {
        const size_t len = std::min<uint64_t>(j - p, shift);
        for (const TailInput& t : tail_inputs)
          MINFER_RETURN_IF_ERROR(dev->check(cu().cuMemcpyDtoDAsync(t.base + p * t.row_bytes, t.base + (p + shift) * t.row_bytes,
                                                                   len * t.row_bytes, stream.get()),
                                            "CUDA forwardRows: gathering the tail's input rows"));
        p += len;
      }
      i = j;
    }
    return Status::ok();
  }

  // A profiling event on the stream; while capturing, an event-record node of the graph.
  void record(Event& e) {
    if (capturing)
      cu().cuEventRecordWithFlags(e.get(), stream.get(), CU_EVENT_RECORD_EXTERNAL);
    else
      cu().cuEventRecord(e.get(), stream.get());
  }

  // Captures the decode plan (n_tokens = 1, positions read from device memory) as a graph, or with `rows` > 0 the
  // prefill plan's launches for that many rows (a paged session's step); with `profiling` on, an event pair around
  // every step is part of it.
  // host_row: the decode plan with row_writer in place of its launch (host_exec).
  Status capture(CUgraph* graph, CUgraphExec* exec, unsigned rows = 0, bool host_row = false) {
    CUstream s = stream.get();
    MINFER_RETURN_IF_ERROR(dev->check(cu().cuStreamSynchronize(s), "CUDA session: cuStreamSynchronize"));
    MINFER_RETURN_IF_ERROR(
        dev->check(cu().cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "CUDA session: begin capture"));
    capturing = true;
    capturing_host_row = host_row;
    Status launched = rows > 0 ? runPlan(/*prefill=*/true, rows) : runPlan(/*prefill=*/false, 1);
    capturing = false;
    capturing_host_row = false;
    const CUresult end = cu().cuStreamEndCapture(s, graph);
    Status done = !launched.isOk() ? launched
                  : end != CUDA_SUCCESS ? dev->check(end, "CUDA session: end capture")
                                        : dev->check(cu().cuGraphInstantiateWithFlags(exec, *graph, 0),
                                                     "CUDA session: graph instantiate");
    if (!done.isOk()) {  // nothing half-made stays behind
      if (*graph) cu().cuGraphDestroy(*graph);
      *graph = nullptr;
      *exec = nullptr;
    }
    return done;
  }

  void collectProfile(bool prefill) {
    std::vector<Launch>& ls = prefill ? this->prefill : decode;
    std::vector<Event>& ev = prefill ? ev_prefill : ev_decode;
    std::vector<double>& ms = prefill ? ms_prefill : ms_decode;
    std::vector<uint64_t>& calls = prefill ? calls_prefill : calls_decode;
    std::vector<double>& bytes = prefill ? bytes_prefill : bytes_decode;
    for (const Launch& l : ls) {
      if (!l.serves(static_cast<unsigned>(last_n))) continue;  // the step's other form ran
      uint64_t kv_positions = static_cast<uint64_t>(last_pos0 + last_n);
      if (l.window > 0) kv_positions = std::min<uint64_t>(kv_positions, l.window);
      const uint64_t slices = std::min<uint64_t>(l.experts, uint64_t{l.experts_used} * last_n);
      const double weights = (l.gathers ? static_cast<double>(l.weight_row_bytes) * last_n : static_cast<double>(l.weight_bytes)) +
                             static_cast<double>(l.expert_slice_bytes) * slices;
      bytes[l.step] += weights + static_cast<double>(l.kv_write_per_token) * last_n +
                       (prefill ? 0.0 : static_cast<double>(l.kv_read_per_pos) * kv_positions);
    }
    int last = -1;
    for (const Launch& l : ls) {
      if (l.step == last) continue;
      last = l.step;
      float t = 0;
      if (cu().cuEventElapsedTime(&t, ev[2 * l.step].get(), ev[2 * l.step + 1].get()) == CUDA_SUCCESS) {
        ms[l.step] += t;
        ++calls[l.step];
      }
    }
  }

  // last_only: only the last token's logits are needed (they land in row 0 of the logits buffer
  // when the plan has a tail, see lastRowOffset). row_to_host: a decode step may leave its row at h_logits instead
  // (host_exec; row_on_host says whether it did).
  Status forward(std::span<const int32_t> tokens, int pos0, bool last_only, bool row_to_host = false) {
    if (paged) return Status::error("CUDA forward: a paged session runs rows placed by forwardRows only");
    const int n = static_cast<int>(tokens.size());
    if (n < 1 || n > max_batch)
      return Status::error("CUDA forward: " + std::to_string(n) + " tokens; the artifact's max batch is " +
                           std::to_string(max_batch));
    if (pos0 < 0 || pos0 + n > n_ctx)
      return Status::error("CUDA forward: positions " + std::to_string(pos0) + ".." + std::to_string(pos0 + n - 1) +
                           " exceed the context of " + std::to_string(n_ctx));
    MINFER_RETURN_IF_ERROR(rings.check(pos0).withContext("CUDA "));
    MINFER_RETURN_IF_ERROR(dev->makeCurrent());
    sampled_row.reset();  // the logits buffer is about to be rewritten
    std::memcpy(h_ids, tokens.data(), static_cast<size_t>(n) * sizeof(int32_t));
    *h_pos = pos0;
    last_pos0 = pos0;
    last_n = n;
    CUstream s = stream.get();
    MINFER_RETURN_IF_ERROR(dev->check(cu().cuMemcpyHtoDAsync(buf[ids_buffer], h_ids, n * sizeof(int32_t), s),
                                      "CUDA forward: token upload"));
    MINFER_RETURN_IF_ERROR(dev->check(cu().cuMemcpyHtoDAsync(pos, h_pos, sizeof(int32_t), s), "CUDA forward: pos upload"));
    const bool prefill_plan = n > 1;
    if (!prefill_plan && graph_exec && profiling && !profile_exec)
      MINFER_RETURN_IF_ERROR(capture(&profile_graph, &profile_exec));
    // Counted before the launches: a run that fails part way may already have overwritten ring slots, and
    // the tracker must then refuse to resume from the positions they held.
    rings.advance(pos0, n);
    row_on_host = !prefill_plan && row_to_host && host_exec && !profiling;
    if (!prefill_plan && graph_exec)
      MINFER_RETURN_IF_ERROR(dev->check(cu().cuGraphLaunch(row_on_host ? host_exec : profiling ? profile_exec : graph_exec, s),
                                        "CUDA forward: decode graph launch"));
    else
      MINFER_RETURN_IF_ERROR(runPlan(prefill_plan, static_cast<unsigned>(n), last_only));
    return Status::ok();
  }

  // Byte offset of the last token's logits row after forward(tokens, pos0, /*last_only=*/true).
  uint64_t lastRowOffset(size_t n_tokens) const {
    const bool tail_ran = n_tokens > 1 && tail < prefill.size();
    return tail_ran ? 0 : (n_tokens - 1) * static_cast<uint64_t>(n_vocab) * sizeof(float);
  }
};

Status CudaSession::forwardRows(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                                std::span<const int32_t> tables, std::span<const int> out_rows, const RowsOutput& out) {
  State& st = *s_;
  MINFER_RETURN_IF_ERROR(st.checkRows(tokens, positions, tables, out_rows, out));
  const int n = static_cast<int>(tokens.size());
  const bool one = n == 1 && !st.decode.empty();  // one row: the decode plan (GEMVs), as its graph when there is one
  const bool pinned = out.logits == nullptr;      // the rows stay in the pinned buffer (pinnedLogits)
  MINFER_RETURN_IF_ERROR(st.dev->makeCurrent());
  st.sampled_row.reset();  // the logits buffer is about to be rewritten
  const size_t rows_bytes = tokens.size() * sizeof(int32_t);
  std::memcpy(st.h_ids, tokens.data(), rows_bytes);
  std::memcpy(st.h_row_pos, positions.data(), rows_bytes);
  std::memcpy(st.h_tables, tables.data(), tables.size() * sizeof(int32_t));
  CUstream s = st.stream.get();
  const CudaDriver& cu = st.cu();
  MINFER_RETURN_IF_ERROR(st.dev->check(cu.cuMemcpyHtoDAsync(st.buf[st.ids_buffer], st.h_ids, rows_bytes, s),
                                       "CUDA forwardRows: token upload"));
  MINFER_RETURN_IF_ERROR(st.dev->check(cu.cuMemcpyHtoDAsync(st.row_pos, st.h_row_pos, rows_bytes, s),
                                       "CUDA forwardRows: position upload"));
  MINFER_RETURN_IF_ERROR(st.dev->check(cu.cuMemcpyHtoDAsync(st.tables, st.h_tables, tables.size() * sizeof(int32_t), s),
                                       "CUDA forwardRows: block table upload"));
  if (one) {
    if (st.graph_exec)
      MINFER_RETURN_IF_ERROR(st.dev->check(cu.cuGraphLaunch(st.graph_exec, s), "CUDA forwardRows: decode graph launch"));
    else
      MINFER_RETURN_IF_ERROR(st.runPlan(/*prefill=*/false, 1));
    // The row through the pinned row buffer, as CudaSession::forward, then on to the caller's memory.
    MINFER_RETURN_IF_ERROR(st.downloadOutputs(1, [](size_t) { return size_t{0}; }, out, st.h_logits));
    if (!pinned && (out.download.empty() || out.download[0]))
      std::memcpy(out.logits, st.h_logits, static_cast<size_t>(st.n_vocab) * sizeof(float));
    return Status::ok();
  }
  // When some rows' logits are not wanted (prompt chunks) and the plan has a last-token tail, the tail runs
  // on the wanted rows only, gathered to rows 0 … k−1; their logits are then rows 0 … k−1.
  const size_t k = out_rows.size();
  const bool gather = k < tokens.size() && st.tail < st.prefill.size() && st.be->options.last_token_tail;
  if (gather) {
    MINFER_RETURN_IF_ERROR(st.launchRange(0, st.tail, static_cast<unsigned>(n)));
    MINFER_RETURN_IF_ERROR(st.gatherTailRows(out_rows));
    MINFER_RETURN_IF_ERROR(st.launchRange(st.tail, st.prefill.size(), static_cast<unsigned>(k)));
  } else {
    MINFER_RETURN_IF_ERROR(st.runRows(static_cast<unsigned>(n)));
  }
  // Output row i's logits are in row gather ? i : out_rows[i] of the logits buffer (i when every row is wanted).
  return st.downloadOutputs(
      k, [&](size_t i) { return gather ? i : static_cast<size_t>(out_rows[i]); }, out, pinned ? st.h_logits : out.logits);
}

const float* CudaSession::pinnedLogits() const { return s_->h_logits; }
const int32_t* CudaSession::pinnedArgmax() const { return s_->h_argmax; }

CudaSession::CudaSession(std::unique_ptr<State> state) : s_(std::move(state)) {}
CudaSession::~CudaSession() = default;
int CudaSession::maxBatch() const { return s_->max_batch; }
int CudaSession::contextLength() const { return s_->n_ctx; }
uint64_t CudaSession::allocatedBytes() const { return s_->allocated; }
uint64_t CudaSession::kvCacheBytes() const { return s_->kv_bytes; }
bool CudaSession::canResumeAt(int pos0) const { return s_->rings.canResumeAt(pos0); }
bool CudaSession::usesDecodeGraph() const { return s_->graph_exec != nullptr; }
bool CudaSession::rowStoredByHead() const { return s_->row_on_host; }
double CudaSession::peakBytesPerSecond() const { return s_->dev->info().peak_bytes_per_s; }

Status CudaSession::forward(std::span<const int32_t> tokens, int pos0, float* logits, bool all_rows) {
  State& st = *s_;
  const uint64_t row = static_cast<uint64_t>(st.n_vocab) * sizeof(float);
  const uint64_t n = tokens.size();
  // One row (every decode step) goes through the pinned row buffer (forwardLast): stored there by the output head or
  // a DMA straight from the device, then a host copy, where a download into pageable memory is staged by the driver
  // in pieces (BENCHMARKS.md: the gap between decode steps). Many rows go straight to the caller's memory.
  if (!all_rows || n == 1) {
    Result<std::span<const float>> last = forwardLast(tokens, pos0);
    if (!last) return last.takeStatus();
    std::memcpy(logits, last->data(), row);
    return Status::ok();
  }
  MINFER_RETURN_IF_ERROR(st.forward(tokens, pos0, /*last_only=*/false));
  MINFER_RETURN_IF_ERROR(st.dev->check(
      st.cu().cuMemcpyDtoHAsync(logits, st.buf[st.logits_buffer], n * row, st.stream.get()), "CUDA forward: logits download"));
  MINFER_RETURN_IF_ERROR(st.dev->check(st.cu().cuStreamSynchronize(st.stream.get()), "CUDA forward"));
  if (st.profiling) st.collectProfile(n > 1);
  return Status::ok();
}

Result<std::span<const float>> CudaSession::forwardLast(std::span<const int32_t> tokens, int pos0) {
  State& st = *s_;
  MINFER_RETURN_IF_ERROR(st.forward(tokens, pos0, /*last_only=*/true, /*row_to_host=*/true));
  const uint64_t row = static_cast<uint64_t>(st.n_vocab) * sizeof(float);
  const CUdeviceptr src = st.buf[st.logits_buffer] + st.lastRowOffset(tokens.size());
  if (!st.row_on_host)
    MINFER_RETURN_IF_ERROR(st.dev->check(st.cu().cuMemcpyDtoHAsync(st.h_logits, src, row, st.stream.get()),
                                         "CUDA forward: logits download"));
  MINFER_RETURN_IF_ERROR(st.dev->check(st.cu().cuStreamSynchronize(st.stream.get()), "CUDA forward"));
  if (st.profiling) st.collectProfile(tokens.size() > 1);
  return std::span<const float>(st.h_logits, static_cast<size_t>(st.n_vocab));
}

DeviceSampling CudaSession::deviceSampling() const {
  DeviceSampling d;
  d.argmax = s_->have_argmax;
  if (s_->have_topk) {
    d.top_k_max = static_cast<int>(std::min<unsigned>(kern::kTopKMax, static_cast<unsigned>(s_->n_vocab)));
    d.penalized_max = static_cast<int>(kern::kTopKMaxPenalized);
  }
  return d;
}

namespace {

// A sampling launch (argmax, top-k) pointed at the row of the logits buffer that holds the last token's
// logits after forward(tokens, ·, /*last_only=*/true).
Launch onLastRow(const CudaSession::State& st, const Launch& sampler, size_t n_tokens) {
  Launch l = sampler;
  for (int r = 0; r < l.n_rows; ++r)
    if (l.rows[r].buffer == st.logits_buffer) l.args[l.rows[r].arg].p += st.lastRowOffset(n_tokens);
  return l;
}

}  // namespace

Result<int32_t> CudaSession::forwardArgmax(std::span<const int32_t> tokens, int pos0) {
  State& st = *s_;
  if (!st.have_argmax) return Status::error("CUDA: the artifact has no argmax kernel image");
  MINFER_RETURN_IF_ERROR(st.forward(tokens, pos0, /*last_only=*/true));
  MINFER_RETURN_IF_ERROR(st.launch(onLastRow(st, st.argmax, tokens.size()), 1));
  MINFER_RETURN_IF_ERROR(st.dev->check(
      st.cu().cuMemcpyDtoHAsync(st.h_argmax, st.argmax_out, sizeof(int32_t), st.stream.get()), "CUDA argmax download"));
  MINFER_RETURN_IF_ERROR(st.dev->check(st.cu().cuStreamSynchronize(st.stream.get()), "CUDA forward"));
  st.sampled_row = st.lastRowOffset(tokens.size());
  if (st.profiling) st.collectProfile(tokens.size() > 1);
  return *st.h_argmax;
}

Status CudaSession::forwardTopK(std::span<const int32_t> tokens, int pos0, float repeat_penalty,
                                std::span<const int32_t> penalized, std::span<TokenLogit> out) {
  State& st = *s_;
  if (!st.have_topk) return Status::error("CUDA: the artifact has no top-k kernel image (format 1.9)");
  const size_t k_max = std::min<size_t>(kern::kTopKMax, static_cast<size_t>(st.n_vocab));
  if (out.empty() || out.size() > k_max || penalized.size() > kern::kTopKMaxPenalized || !(repeat_penalty > 0.0f))
    return Status::error("CUDA top-k: k " + std::to_string(out.size()) + " (1.." + std::to_string(k_max) + "), " +
                         std::to_string(penalized.size()) + " penalized tokens (at most " +
                         std::to_string(kern::kTopKMaxPenalized) + "), repeat penalty " + std::to_string(repeat_penalty) +
                         " (> 0)");
  MINFER_RETURN_IF_ERROR(st.forward(tokens, pos0, /*last_only=*/true));
  kern::TopKSlot& h = *st.h_topk;
  h.k = static_cast<int32_t>(out.size());
  h.repeat_penalty = repeat_penalty;
  h.n_penalized = static_cast<int32_t>(penalized.size());
  h.reserved = 0;
  std::copy(penalized.begin(), penalized.end(), h.penalized);
  CUstream s = st.stream.get();
  MINFER_RETURN_IF_ERROR(st.dev->check(
      st.cu().cuMemcpyHtoDAsync(st.topk_slot, &h, kern::kTopKRequestHeader + penalized.size() * sizeof(int32_t), s),
      "CUDA top-k request upload"));
  MINFER_RETURN_IF_ERROR(st.launch(onLastRow(st, st.topk, tokens.size()), 1));
  MINFER_RETURN_IF_ERROR(st.dev->check(st.cu().cuMemcpyDtoHAsync(h.out, st.topk_slot + offsetof(kern::TopKSlot, out),
                                                                 out.size() * sizeof(kern::TopKPair), s),
                                       "CUDA top-k download"));
  MINFER_RETURN_IF_ERROR(st.dev->check(st.cu().cuStreamSynchronize(s), "CUDA forward"));
  st.sampled_row = st.lastRowOffset(tokens.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = {h.out[i].id, h.out[i].logit};
  if (st.profiling) st.collectProfile(tokens.size() > 1);
  return Status::ok();
}

Status CudaSession::lastLogits(float* logits) {
  State& st = *s_;
  if (!st.sampled_row)
    return Status::error("CUDA lastLogits: no device-sampled row to copy back (forwardArgmax / forwardTopK has not "
                         "completed since the session began or since the latest forward / forwardRows)");
  const uint64_t row = static_cast<uint64_t>(st.n_vocab) * sizeof(float);
  MINFER_RETURN_IF_ERROR(st.dev->makeCurrent());
  MINFER_RETURN_IF_ERROR(st.dev->check(
      st.cu().cuMemcpyDtoHAsync(st.h_logits, st.buf[st.logits_buffer] + *st.sampled_row, row, st.stream.get()),
      "CUDA logits download"));
  MINFER_RETURN_IF_ERROR(st.dev->check(st.cu().cuStreamSynchronize(st.stream.get()), "CUDA logits download"));
  std::memcpy(logits, st.h_logits, row);
  return Status::ok();
}

void CudaSession::setProfiling(bool on) {
  State& st = *s_;
  if (on && st.ev_prefill.empty()) {
    auto make = [&](size_t steps, std::vector<Event>& ev) {
      for (size_t i = 0; i < 2 * steps; ++i) {
        Result<Event> e = st.dev->createEvent(/*timing=*/true);
        if (!e) return false;
        ev.push_back(std::move(*e));
      }
      return true;
    };
    if (!make(st.be->prefill.size(), st.ev_prefill) || !make(st.be->decode.size(), st.ev_decode)) return;
    st.ms_prefill.assign(st.be->prefill.size(), 0);
    st.ms_decode.assign(st.be->decode.size(), 0);
    st.calls_prefill.assign(st.be->prefill.size(), 0);
    st.calls_decode.assign(st.be->decode.size(), 0);
    st.bytes_prefill.assign(st.be->prefill.size(), 0);
    st.bytes_decode.assign(st.be->decode.size(), 0);
  }
  st.profiling = on;
}

void CudaSession::resetProfile() {
  std::fill(s_->ms_prefill.begin(), s_->ms_prefill.end(), 0.0);
  std::fill(s_->ms_decode.begin(), s_->ms_decode.end(), 0.0);
  std::fill(s_->calls_prefill.begin(), s_->calls_prefill.end(), 0);
  std::fill(s_->calls_decode.begin(), s_->calls_decode.end(), 0);
  std::fill(s_->bytes_prefill.begin(), s_->bytes_prefill.end(), 0.0);
  std::fill(s_->bytes_decode.begin(), s_->bytes_decode.end(), 0.0);
}

std::vector<StepTime> CudaSession::profile() const {
  std::vector<StepTime> out;
  for (bool prefill : {true, false}) {
    const auto& steps = prefill ? s_->be->prefill : s_->be->decode;
    const auto& ms = prefill ? s_->ms_prefill : s_->ms_decode;
    const auto& calls = prefill ? s_->calls_prefill : s_->calls_decode;
    const auto& bytes = prefill ? s_->bytes_prefill : s_->bytes_decode;
    for (size_t i = 0; i < ms.size(); ++i)
      if (calls[i] > 0)
        out.push_back({steps[i].step->name() ? steps[i].step->name()->str() : "", opName(steps[i].step->op()), prefill,
                       ms[i], calls[i], bytes[i]});
  }
  return out;
}

Result<std::unique_ptr<BackendSession>> CudaBackend::createSession(const BackendSessionConfig& config) const {
  Result<std::unique_ptr<CudaSession>> s = createCudaSession(config);
  if (!s) return s.takeStatus();
  return std::unique_ptr<BackendSession>(std::move(*s));
}

namespace {

// The allocate phase of a session, one step per function: arena layout (activation buffers, the KV
// cache of every layer a launch record names, step scratch, counters, positions, argmax slot; all but the
// activations zeroed at allocation, which the counters rely on), allocation, the
// generic binder (every launch from its record), the decode graph.
class SessionBuilder {
 public:
  SessionBuilder(const CudaBackend::State& be, CudaSession::State& st)
      : be_(be), st_(st), m_(be.artifact->manifest()), path_(be.artifact->path()) {}

  // kv_slots: positions of the KV cache per layer (n_ctx, or a paged session's pool); table_words > 0: a
  // paged session (its row positions and block tables are laid out too).
  Status layout(int n_ctx, int64_t kv_slots, int block_size = 0, int table_words = 0, int pinned_rows = 1) {
    st_.paged = table_words > 0;
    st_.pinned_rows = pinned_rows;
    st_.block_size = block_size;
    st_.kv_slots = kv_slots;
    st_.table_words = table_words;
    const fb::MemoryPlan* mem = m_->memory();
    if (!mem || !mem->buffers()) return Status::error(path_ + ": the artifact has no memory plan");
    if (n_ctx < 1) return Status::error("CUDA session: n_ctx must be ≥ 1");
    st_.n_ctx = n_ctx;
    st_.max_batch = static_cast<int>(mem->max_batch());
    st_.n_vocab = static_cast<int>(m_->config()->n_vocab());
    st_.logits_buffer = mem->logits();
    st_.ids_buffer = mem->input_ids();
    const uint32_t n_buf = mem->buffers()->size();
    for (uint32_t i = 0; i < n_buf; ++i) {
      const fb::Buffer* b = mem->buffers()->Get(i);
      const uint64_t rows = mem->max_batch(), w = b->width();
      uint64_t bytes = 0;
      switch (b->type()) {
        case fb::BufferType::F32: case fb::BufferType::I32: bytes = rows * w * 4; break;
        case fb::BufferType::F16: bytes = rows * w * 2; break;
        case fb::BufferType::I8: bytes = kern::q8BufferBytes(static_cast<unsigned>(rows), static_cast<unsigned>(w)); break;
      }
      buf_offset_.push_back(reserve(bytes));
      st_.buf_width.push_back(b->width());
      st_.buf_type.push_back(b->type());
    }
    act_bytes_ = total_;
    MINFER_RETURN_IF_ERROR(layoutCaches(kv_slots));
    kv_bytes_ = total_ - act_bytes_;
    st_.kv_bytes = kv_bytes_;
    scratch_offset_ = reserve(scratch_bytes_);
    counter_offset_ = reserve(counter_bytes_);
    pos_offset_ = reserve(4);
    argmax_offset_ = reserve(4ull * st_.max_batch);
    if (topk()) topk_offset_ = reserve(sizeof(kern::TopKSlot));
    if (st_.paged) {
      row_pos_offset_ = reserve(4ull * st_.max_batch);
      tables_offset_ = reserve(4ull * static_cast<uint64_t>(table_words));
    }
    return Status::ok();
  }

  Status allocate() {
    Result<std::pair<uint64_t, uint64_t>> mi = be_.dev->memInfo();
    if (!mi) return mi.takeStatus();
    if (total_ > mi->first)
      return Status::error("CUDA session: needs " + std::to_string(total_) + " bytes of device memory (activations " +
                           std::to_string(act_bytes_) + " for max batch " + std::to_string(st_.max_batch) +
                           ", KV cache " + std::to_string(kv_bytes_) + " for n_ctx " + std::to_string(st_.n_ctx) +
                           ") but " + be_.dev->info().name + " has " + std::to_string(mi->first) + " bytes free of " +
                           std::to_string(mi->second) + "; lower --ctx");
    Result<DeviceBuffer> arena = be_.dev->alloc(total_, "CUDA session");
    if (!arena) return arena.takeStatus();
    st_.arena = std::move(*arena);
    st_.allocated = total_;
    base_ = st_.arena.ptr();
    for (uint64_t off : buf_offset_) st_.buf.push_back(base_ + off);
    st_.pos = base_ + pos_offset_;
    st_.argmax_out = base_ + argmax_offset_;
    // Pinned int32 words: ids (max_batch) | pos (kPosWords) [| row positions (max_batch) | block tables] | argmax
    // (max_batch); then, 16-byte aligned, the logits rows and the top-k slot.
    constexpr uint64_t kPosWords = 16;
    const uint64_t paged_words = st_.paged ? static_cast<uint64_t>(st_.max_batch) + st_.table_words : 0;
    const uint64_t small = alignUp((2ull * st_.max_batch + kPosWords + paged_words) * 4, 16);
    const uint64_t logits_bytes = alignUp(static_cast<uint64_t>(st_.n_vocab) * sizeof(float), 16) * st_.pinned_rows;
    Result<PinnedBuffer> pinned =
        be_.dev->allocPinned(small + logits_bytes + (topk() ? sizeof(kern::TopKSlot) : 0), "CUDA session",
                             /*mapped=*/be_.options.logits_to_host && !st_.paged);
    if (!pinned) return pinned.takeStatus();
    st_.pinned = std::move(*pinned);
    st_.h_ids = static_cast<int32_t*>(st_.pinned.data());
    st_.h_pos = st_.h_ids + st_.max_batch;
    st_.h_argmax = st_.h_pos + kPosWords + paged_words;
    st_.h_logits = reinterpret_cast<float*>(static_cast<uint8_t*>(st_.pinned.data()) + small);
    if (topk()) {
      st_.topk_slot = base_ + topk_offset_;
      st_.h_topk = reinterpret_cast<kern::TopKSlot*>(static_cast<uint8_t*>(st_.pinned.data()) + small + logits_bytes);
    }
    if (st_.paged) {
      st_.row_pos = base_ + row_pos_offset_;
      st_.tables = base_ + tables_offset_;
      st_.h_row_pos = st_.h_pos + kPosWords;
      st_.h_tables = st_.h_row_pos + st_.max_batch;
    }
    Result<Stream> stream = be_.dev->createStream();
    if (!stream) return stream.takeStatus();
    st_.stream = std::move(*stream);
    st_.overlap = be_.options.overlap_launches && be_.dev->info().cc_major >= 9;
    st_.rows_graphs_on = st_.paged && be_.options.decode_graph;
    if (st_.rows_graphs_on) st_.rows_graphs.resize(st_.kGraphRows + 1);
    // Poison the activations (NaN bit pattern) so a kernel that reads an unwritten element shows it.
    const CudaDriver& cu = be_.dev->cu();
    MINFER_RETURN_IF_ERROR(be_.dev->check(cu.cuMemsetD32Async(base_, 0x7FC00000u, act_bytes_ / 4, st_.stream.get()),
                                          "CUDA session: memset"));
    return be_.dev->check(cu.cuMemsetD8Async(base_ + act_bytes_, 0, total_ - act_bytes_, st_.stream.get()),
                          "CUDA session: memset");
  }

  // The launches a step runs in this session: a paged session takes the step's paged launches where it
  // has them (CudaBackend::State::paged says every positional step does).
  const std::vector<BoundLaunch>& used(const StepKernels& sk) const {
    return st_.paged && !sk.paged.empty() ? sk.paged : sk.launches;
  }

  // The generic binder: every launch of both plans (and the argmax) from its record alone.
  void bind() {
    for (bool prefill : {true, false}) {
      if (st_.paged && !prefill && !be_.paged_decode) continue;  // a paged session without a paged decode plan
      const std::vector<StepKernels>& steps = prefill ? be_.prefill : be_.decode;
      std::vector<Launch>& out = prefill ? st_.prefill : st_.decode;
      for (size_t si = 0; si < steps.size(); ++si) {
        if (prefill && steps[si].step->tail() && st_.tail == SIZE_MAX) st_.tail = out.size();
        const StepKernels& sk = steps[si];
        for (const BoundLaunch& bl : used(sk)) {
          out.push_back(bindLaunch(bl, static_cast<int>(si)));
          if (!sk.small.empty()) out.back().min_rows = sk.small_rows + 1;
        }
        for (const BoundLaunch& bl : sk.small) {  // Step.small_launches (1.7): calls of n ≤ small_rows
          // 1.10: those of its row range, [min_rows, max_rows] ∩ [1, small_rows] (0: no bound on that side).
          out.push_back(bindLaunch(bl, static_cast<int>(si)));
          out.back().min_rows = std::max(bl.record->min_rows(), 1u);
          const uint32_t max_rows = bl.record->max_rows();
          out.back().max_rows = max_rows != 0 ? std::min(max_rows, sk.small_rows) : sk.small_rows;
        }
        for (size_t k = out.size() - used(sk).size() - sk.small.size(); k < out.size(); ++k) {
          out[k].window = sk.step->window();
          out[k].gathers = sk.step->op() == fb::OpKind::Embed;
          out[k].experts_used = sk.step->n_expert_used();
        }
      }
    }
    if (st_.tail == SIZE_MAX) st_.tail = st_.prefill.size();
    st_.fresh.assign(st_.buf.size(), false);
    st_.findTailInputs();
    if (be_.argmax.record) {
      st_.argmax = bindLaunch(be_.argmax, -1);
      st_.argmax.overlap = false;  // launched after a graph or a download, not after a kernel of the plan
      st_.have_argmax = true;
    }
    if (topk()) {
      st_.topk = bindLaunch(be_.topk, -1);
      st_.topk.overlap = false;  // as the argmax
      st_.have_topk = true;
    }
  }

  // Decode plan → CUDA graph (n_tokens = 1 is baked into the captured launches; pos0 is read from
  // device memory by the kernels).
  Status captureDecodeGraph() {
    if (!be_.options.decode_graph || st_.decode.empty()) return Status::ok();
    MINFER_RETURN_IF_ERROR(st_.capture(&st_.graph, &st_.graph_exec));
    if (!be_.options.logits_to_host || st_.paged || !findRowWriter()) return Status::ok();
    // The second graph only takes the row's download off the step: where its capture fails (capture() leaves nothing
    // behind), decode steps run the first and download the row.
    (void)st_.capture(&st_.host_graph, &st_.host_exec, 0, /*host_row=*/true);
    return Status::ok();
  }

 private:
  // CudaBackendOptions::logits_to_host: true with st_.row_writer set where one decode launch touches the logits
  // buffer, an argument it only writes (Access Write), and that launch is a MatMul step's (the decode GEMVs: gemv.cuh,
  // gemv_blocks.cuh, dense_matmul.cuh store each output value once, never read it back or accumulate into it, so no
  // atomics or read-backs cross the bus); the argument keeps its offset into the row.
  bool findRowWriter() {
    size_t at = SIZE_MAX;
    int arg = -1, uses = 0;
    bool write_only = false;
    for (size_t i = 0; i < st_.decode.size(); ++i)
      for (int r = 0; r < st_.decode[i].n_rows; ++r)
        if (st_.decode[i].rows[r].buffer == st_.logits_buffer) {
          ++uses;
          at = i, arg = st_.decode[i].rows[r].arg;
          write_only = st_.decode[i].rows[r].written && !st_.decode[i].rows[r].read;
        }
    if (uses != 1 || !write_only || be_.decode[static_cast<size_t>(st_.decode[at].step)].step->op() != fb::OpKind::MatMul)
      return false;
    st_.row_writer = st_.decode[at];
    const uint64_t host_row = reinterpret_cast<uint8_t*>(st_.h_logits) - static_cast<uint8_t*>(st_.pinned.data());
    st_.row_writer.args[arg].p = st_.pinned.device() + host_row + (st_.decode[at].args[arg].p - st_.buf[st_.logits_buffer]);
    st_.row_writer_at = at;
    return true;
  }

  // The session launches the artifact's top-k (format 1.9): single-sequence sessions only, like the argmax.
  bool topk() const { return be_.topk.record != nullptr && !st_.paged; }

  uint64_t reserve(uint64_t bytes) {
    const uint64_t at = total_;
    total_ += align(bytes);
    return at;
  }

  // One (K, V) pair per layer that a launch record names, each kv_slots × width f16, or min(kv_slots,
  // kv_ring) × width in a single-sequence session for a layer whose Attention steps have a ring (schema
  // Step.kv_ring: its kernels index slot p % kv_ring; a paged session's pool holds every position); the
  // step scratch is the largest any record asks for (the verifier bounded all three).
  Status layoutCaches(int64_t kv_slots) {
    std::map<uint32_t, std::pair<uint32_t, uint32_t>> ring;  // layer → (kv_ring, window) of its Attention steps
    for (const std::vector<StepKernels>* steps : {&be_.prefill, &be_.decode})
      for (const StepKernels& sk : *steps) {
        const fb::Step& s = *sk.step;
        if (st_.paged || s.op() != fb::OpKind::Attention || s.layer() < 0) continue;
        auto [it, inserted] = ring.try_emplace(static_cast<uint32_t>(s.layer()), s.kv_ring(), s.window());
        if (!inserted && it->second != std::pair<uint32_t, uint32_t>(s.kv_ring(), s.window()))
          return Status::error(path_ + ": " + sk.label + ": KV cache layer " + std::to_string(s.layer()) +
                               " has a ring of " + std::to_string(s.kv_ring()) + " positions (window " +
                               std::to_string(s.window()) + ") here but " + std::to_string(it->second.first) +
                               " (window " + std::to_string(it->second.second) + ") in another step");
      }
    std::map<uint32_t, uint32_t> width;  // layer → f16 values per position
    for (const std::vector<StepKernels>* steps : {&be_.prefill, &be_.decode}) {
      if (st_.paged && steps == &be_.decode && !be_.paged_decode) continue;  // not bound in this paged session
      for (const StepKernels& sk : *steps)
        for (const std::vector<BoundLaunch>* list : {&used(sk), &sk.small})
          for (const BoundLaunch& bl : *list)
            if (bl.record->args())
              for (const fb::KernelArg* a : *bl.record->args()) {
                if (a->kind() == fb::ArgKind::Scratch) scratch_bytes_ = std::max(scratch_bytes_, a->bytes());
                if (a->kind() == fb::ArgKind::Counters) counter_bytes_ = std::max(counter_bytes_, a->bytes());
                if (a->kind() != fb::ArgKind::KCache && a->kind() != fb::ArgKind::VCache) continue;
                auto [it, inserted] = width.try_emplace(a->layer(), a->width());
                if (!inserted && it->second != a->width())
                  return Status::error(path_ + ": " + sk.label + ": KV cache layer " + std::to_string(a->layer()) +
                                       " is " + std::to_string(a->width()) + " wide here but " +
                                       std::to_string(it->second) + " in another launch");
              }
    }
    if (topk() && be_.topk.record->args())  // its per-block lists and its counter word
      for (const fb::KernelArg* a : *be_.topk.record->args()) {
        if (a->kind() == fb::ArgKind::Scratch) scratch_bytes_ = std::max(scratch_bytes_, a->bytes());
        if (a->kind() == fb::ArgKind::Counters) counter_bytes_ = std::max(counter_bytes_, a->bytes());
      }
    for (const auto& [layer, w] : width) {
      const auto r = ring.find(layer);
      const uint32_t kv_ring = r != ring.end() ? r->second.first : 0;
      if (kv_ring > 0) st_.rings.addLayer(kv_ring, static_cast<int>(r->second.second), static_cast<int>(kv_slots));
      const uint64_t slots = kv_ring > 0 ? std::min<uint64_t>(kv_slots, kv_ring) : static_cast<uint64_t>(kv_slots);
      const uint64_t bytes = slots * w * 2;
      const uint64_t k = reserve(bytes);
      kv_[layer] = {k, reserve(bytes)};
    }
    return Status::ok();
  }

  // Row bytes of buffer b as an argument of `kind`: f32/i32 rows, f16 rows, or a q8 buffer's two parts.
  uint64_t rowBytes(fb::ArgKind kind, uint32_t b) const {
    const uint64_t w = st_.buf_width[b];
    if (kind == fb::ArgKind::Q8Values) return w;
    if (kind == fb::ArgKind::Q8Meta) return w / kern::kQ8Block * sizeof(kern::Q8Meta);
    return st_.buf_type[b] == fb::BufferType::F16 ? 2 * w : 4 * w;
  }

  Launch bindLaunch(const BoundLaunch& bl, int step) const {
    const LoadedImage& img = be_.images[static_cast<size_t>(bl.image)];
    Launch l;
    l.fn = img.fn;
    l.step = step;
    l.overlap = bl.record->overlap();
    l.entry = img.entry.c_str();
    l.rule = launchRule(*bl.record);
    const unsigned mb = static_cast<unsigned>(st_.max_batch);
    if (bl.record->args())
      for (const fb::KernelArg* a : *bl.record->args()) {
        const uint32_t b = a->buffer();
        const bool written = a->access() != fb::Access::Read, read = a->access() != fb::Access::Write;
        switch (a->kind()) {
          case fb::ArgKind::Null: l.push(0); break;
          case fb::ArgKind::Activation: {  // a column view (1.4) starts view_offset elements into row 0
            const uint64_t elem = st_.buf_type[b] == fb::BufferType::F16 ? 2 : 4;
            l.pushRow(st_.buf[b] + a->view_offset() * elem, b, rowBytes(a->kind(), b), written, read);
            break;
          }
          case fb::ArgKind::Q8Values:
            l.pushRow(st_.buf[b], b, rowBytes(a->kind(), b), written, read);
            break;
          case fb::ArgKind::Q8Meta:
            l.pushRow(st_.buf[b] + kern::q8MetaOffset(mb, st_.buf_width[b]), b, rowBytes(a->kind(), b), written, read);
            break;
          case fb::ArgKind::Weight:  // the verifier checked that the tensor has this plane, with this table
            l.push(be_.tensors[a->tensor()].plane(static_cast<PlaneKind>(a->plane()->kind())));
            if (a->plane()->experts() > 1) {
              l.experts = a->plane()->experts();
              l.expert_slice_bytes += a->plane()->expert_pitch();
            } else {
              l.weight_bytes += static_cast<uint64_t>(a->plane()->rows()) * a->plane()->row_pitch();
            }
            l.weight_row_bytes += a->plane()->row_pitch();
            break;
          case fb::ArgKind::KCache: case fb::ArgKind::VCache:
            l.push(base_ + (a->kind() == fb::ArgKind::KCache ? kv_.at(a->layer()).first : kv_.at(a->layer()).second));
            (a->access() == fb::Access::Read ? l.kv_read_per_pos : l.kv_write_per_token) += 2ull * a->width();
            break;
          case fb::ArgKind::Scratch: l.push(base_ + scratch_offset_); break;
          case fb::ArgKind::Counters: l.push(base_ + counter_offset_); break;
          case fb::ArgKind::Positions: l.push(st_.pos); break;
          case fb::ArgKind::TokenCount: l.pushTokens(); break;
          case fb::ArgKind::Int: l.pushInt(a->value()); break;
          case fb::ArgKind::TokenOut: l.push(st_.argmax_out); break;
          case fb::ArgKind::TopK: l.push(st_.topk_slot); break;  // Artifact.topk only (verifier)
          case fb::ArgKind::RowPositions: l.push(st_.row_pos); break;   // paged sessions only (verifier)
          case fb::ArgKind::BlockTables: l.push(st_.tables); break;
          case fb::ArgKind::BlockSize: l.pushInt(st_.block_size); break;
        }
      }
    return l;
  }

  const CudaBackend::State& be_;
  CudaSession::State& st_;
  const fb::Artifact* m_;
  const std::string path_;
  uint64_t total_ = 0, act_bytes_ = 0, kv_bytes_ = 0, scratch_bytes_ = 0, counter_bytes_ = 0;
  uint64_t scratch_offset_ = 0, counter_offset_ = 0, pos_offset_ = 0, argmax_offset_ = 0, topk_offset_ = 0;
  uint64_t row_pos_offset_ = 0, tables_offset_ = 0;  // paged sessions
  std::vector<uint64_t> buf_offset_;
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> kv_;  // layer → arena offsets of K and V
  CUdeviceptr base_ = 0;
};

}  // namespace

Result<std::unique_ptr<CudaSession>> CudaBackend::createCudaSession(const BackendSessionConfig& config) const {
  auto st = std::make_unique<CudaSession::State>();
  st->be = s_.get();
  st->dev = s_->dev;
  SessionBuilder builder(*s_, *st);
  MINFER_RETURN_IF_ERROR(builder.layout(config.n_ctx, config.n_ctx));
  MINFER_RETURN_IF_ERROR(builder.allocate());
  builder.bind();
  MINFER_RETURN_IF_ERROR(builder.captureDecodeGraph());
  MINFER_RETURN_IF_ERROR(s_->dev->check(s_->dev->cu().cuStreamSynchronize(st->stream.get()), "CUDA session: setup"));
  return std::make_unique<CudaSession>(std::move(st));
}

bool CudaBackend::supportsPagedSessions() const { return s_->paged; }

Result<std::unique_ptr<CudaSession>> CudaBackend::createPagedSession(const PagedSessionConfig& config) const {
  if (!s_->paged)
    return Status::error(s_->artifact->path() + ": the artifact's prefill plan has no paged launches for every "
                         "positional step (Step.paged_launches, format 1.6): recompile it for batched sessions");
  if (config.n_ctx < 1 || config.kv_slots < 0 || config.block_size < 1 || config.table_words < 1 || config.pinned_rows < 1)
    return Status::error("CUDA paged session: n_ctx " + std::to_string(config.n_ctx) + ", kv_slots " +
                         std::to_string(config.kv_slots) + ", block_size " + std::to_string(config.block_size) +
                         ", table_words " + std::to_string(config.table_words) + ", pinned_rows " +
                         std::to_string(config.pinned_rows) + ": need kv_slots ≥ 0, the rest ≥ 1");
  auto st = std::make_unique<CudaSession::State>();
  st->be = s_.get();
  st->dev = s_->dev;
  SessionBuilder builder(*s_, *st);
  MINFER_RETURN_IF_ERROR(
      builder.layout(config.n_ctx, config.kv_slots, config.block_size, config.table_words, config.pinned_rows));
  MINFER_RETURN_IF_ERROR(builder.allocate());
  builder.bind();
  MINFER_RETURN_IF_ERROR(builder.captureDecodeGraph());  // when the decode plan is bound (paged_decode)
  MINFER_RETURN_IF_ERROR(s_->dev->check(s_->dev->cu().cuStreamSynchronize(st->stream.get()), "CUDA session: setup"));
  return std::make_unique<CudaSession>(std::move(st));
}

}  // namespace minfer::cuda
