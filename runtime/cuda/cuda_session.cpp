// CUDA backend, allocate + execute phases: session buffers, launch records, decode graph, forward.
#include <algorithm>
#include <cstring>

#include "kernels/argmax.cuh"
#include "kernels/attention.cuh"
#include "kernels/dense_matmul.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/embed.cuh"
#include "kernels/gemv.cuh"
#include "kernels/mmq.cuh"
#include "kernels/quantize_act.cuh"
#include "kernels/rms_norm.cuh"
#include "kernels/rope.cuh"
#include "runtime/cuda/cuda_internal.h"

namespace minfer::cuda {
namespace {

constexpr uint64_t kAlign = 256;
uint64_t align(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

const char* opName(fb::OpKind op) {
  const char* n = fb::EnumNameOpKind(op);
  return (n && *n) ? n : "unknown";
}

}  // namespace

struct CudaSession::State {
  const CudaBackend::State* be = nullptr;
  std::shared_ptr<CudaDevice> dev;
  int n_ctx = 0, max_batch = 0, n_vocab = 0;
  uint32_t logits_buffer = 0, ids_buffer = 0;
  std::vector<CUdeviceptr> buf;      // buffer id → device address
  std::vector<uint32_t> buf_width;   // buffer id → width
  DeviceBuffer arena;                // activations | KV cache | attention partials | pos | argmax
  CUdeviceptr pos = 0, argmax_out = 0;
  PinnedBuffer pinned;               // ids (max_batch int32) | pos | argmax
  int32_t* h_ids = nullptr;
  int32_t* h_pos = nullptr;
  int32_t* h_argmax = nullptr;
  Stream stream;
  std::vector<Launch> prefill, decode;
  // First prefill launch of the tail: the steps after the last attention, all row-wise (matmuls,
  // norms, activation quantization, elementwise), so that when only the last token's logits are wanted
  // they run on that row alone (llama.cpp likewise keeps only the output rows after the last layer's
  // attention). prefill.size() when the plan has no such tail.
  size_t tail = 0;
  std::vector<bool> fresh;  // per buffer: rewritten (at row 0) by the tail so far (runPlan scratch)
  Launch argmax;
  bool have_argmax = false;
  CUgraph graph = nullptr;
  CUgraphExec graph_exec = nullptr;
  uint64_t allocated = 0;
  // Profiling: one event pair per plan step, accumulated milliseconds and calls.
  bool profiling = false;
  std::vector<Event> ev_prefill, ev_decode;  // 2 per step
  std::vector<double> ms_prefill, ms_decode;
  std::vector<uint64_t> calls_prefill, calls_decode;

  ~State() {
    if (dev) (void)dev->makeCurrent();
    if (graph_exec) dev->cu().cuGraphExecDestroy(graph_exec);
    if (graph) dev->cu().cuGraphDestroy(graph);
  }

  const CudaDriver& cu() const { return dev->cu(); }

  // row_shift > 0: the launch runs on one row; inputs not yet rewritten in the tail (`fresh`) are read
  // at row row_shift, everything else at row 0.
  Status launch(const Launch& l, unsigned n_tokens, unsigned row_shift = 0, const std::vector<bool>* fresh = nullptr) {
    void* argp[10];
    Launch::Arg args[10];
    std::memcpy(args, l.args, sizeof args);
    if (row_shift > 0)
      for (int r = 0; r < l.n_rows; ++r)
        if (!l.rows[r].written && !(*fresh)[l.rows[r].buffer]) args[l.rows[r].arg].p += row_shift * l.rows[r].row_bytes;
    if (l.ntok >= 0) args[l.ntok].i = static_cast<int32_t>(n_tokens);
    for (int i = 0; i < l.n_args; ++i) argp[i] = &args[i];
    const kern::LaunchShape s = l.shape(n_tokens);
    const CUresult r = cu().cuLaunchKernel(l.fn, s.grid.x, s.grid.y, s.grid.z, s.block.x, s.block.y, s.block.z, s.smem,
                                           stream.get(), argp, nullptr);
    if (r != CUDA_SUCCESS) return dev->check(r, std::string("CUDA: launch of ") + l.entry);
    return Status::ok();
  }

  // last_only: the tail (see `tail`) runs on row n − 1 only, leaving that row's logits in row 0.
  Status runPlan(bool prefill, unsigned n, bool last_only = false) {
    std::vector<Launch>& ls = prefill ? this->prefill : decode;
    std::vector<Event>& ev = prefill ? ev_prefill : ev_decode;
    const size_t tail_begin = prefill && last_only && n > 1 ? tail : ls.size();
    std::fill(fresh.begin(), fresh.end(), false);
    int current = -1;
    for (size_t i = 0; i < ls.size(); ++i) {
      const Launch& l = ls[i];
      if (profiling && l.step != current) {
        if (current >= 0) cu().cuEventRecord(ev[2 * current + 1].get(), stream.get());
        current = l.step;
        cu().cuEventRecord(ev[2 * current].get(), stream.get());
      }
      if (i < tail_begin) {
        MINFER_RETURN_IF_ERROR(launch(l, n));
      } else {
        MINFER_RETURN_IF_ERROR(launch(l, 1, n - 1, &fresh));
        for (int r = 0; r < l.n_rows; ++r)
          if (l.rows[r].written) fresh[l.rows[r].buffer] = true;
      }
    }
    if (profiling && current >= 0) cu().cuEventRecord(ev[2 * current + 1].get(), stream.get());
    return Status::ok();
  }

  void collectProfile(bool prefill) {
    std::vector<Launch>& ls = prefill ? this->prefill : decode;
    std::vector<Event>& ev = prefill ? ev_prefill : ev_decode;
    std::vector<double>& ms = prefill ? ms_prefill : ms_decode;
    std::vector<uint64_t>& calls = prefill ? calls_prefill : calls_decode;
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
  // when the plan has a tail, see lastRowOffset).
  Status forward(std::span<const int32_t> tokens, int pos0, bool last_only) {
    const int n = static_cast<int>(tokens.size());
    if (n < 1 || n > max_batch)
      return Status::error("CUDA forward: " + std::to_string(n) + " tokens; the artifact's max batch is " +
                           std::to_string(max_batch));
    if (pos0 < 0 || pos0 + n > n_ctx)
      return Status::error("CUDA forward: positions " + std::to_string(pos0) + ".." + std::to_string(pos0 + n - 1) +
                           " exceed the context of " + std::to_string(n_ctx));
    MINFER_RETURN_IF_ERROR(dev->makeCurrent());
    std::memcpy(h_ids, tokens.data(), static_cast<size_t>(n) * sizeof(int32_t));
    *h_pos = pos0;
    CUstream s = stream.get();
    MINFER_RETURN_IF_ERROR(dev->check(cu().cuMemcpyHtoDAsync(buf[ids_buffer], h_ids, n * sizeof(int32_t), s),
                                      "CUDA forward: token upload"));
    MINFER_RETURN_IF_ERROR(dev->check(cu().cuMemcpyHtoDAsync(pos, h_pos, sizeof(int32_t), s), "CUDA forward: pos upload"));
    const bool prefill_plan = n > 1;
    if (!prefill_plan && graph_exec && !profiling)
      MINFER_RETURN_IF_ERROR(dev->check(cu().cuGraphLaunch(graph_exec, s), "CUDA forward: decode graph launch"));
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

CudaSession::CudaSession(std::unique_ptr<State> state) : s_(std::move(state)) {}
CudaSession::~CudaSession() = default;
int CudaSession::maxBatch() const { return s_->max_batch; }
int CudaSession::contextLength() const { return s_->n_ctx; }
uint64_t CudaSession::allocatedBytes() const { return s_->allocated; }
bool CudaSession::usesDecodeGraph() const { return s_->graph_exec != nullptr; }

Status CudaSession::forward(std::span<const int32_t> tokens, int pos0, float* logits, bool all_rows) {
  State& st = *s_;
  MINFER_RETURN_IF_ERROR(st.forward(tokens, pos0, !all_rows));
  const uint64_t row = static_cast<uint64_t>(st.n_vocab) * sizeof(float);
  const uint64_t n = tokens.size();
  const CUdeviceptr src = st.buf[st.logits_buffer] + (all_rows ? 0 : st.lastRowOffset(n));
  MINFER_RETURN_IF_ERROR(st.dev->check(st.cu().cuMemcpyDtoHAsync(logits, src, all_rows ? n * row : row, st.stream.get()),
                                       "CUDA forward: logits download"));
  MINFER_RETURN_IF_ERROR(st.dev->check(st.cu().cuStreamSynchronize(st.stream.get()), "CUDA forward"));
  if (st.profiling) st.collectProfile(n > 1);
  return Status::ok();
}

Result<int32_t> CudaSession::forwardArgmax(std::span<const int32_t> tokens, int pos0) {
  State& st = *s_;
  if (!st.have_argmax) return Status::error("CUDA: the artifact has no argmax kernel image");
  MINFER_RETURN_IF_ERROR(st.forward(tokens, pos0, /*last_only=*/true));
  Launch l = st.argmax;
  l.args[0].p = st.buf[st.logits_buffer] + st.lastRowOffset(tokens.size());
  MINFER_RETURN_IF_ERROR(st.launch(l, 1));
  MINFER_RETURN_IF_ERROR(st.dev->check(
      st.cu().cuMemcpyDtoHAsync(st.h_argmax, st.argmax_out, sizeof(int32_t), st.stream.get()), "CUDA argmax download"));
  MINFER_RETURN_IF_ERROR(st.dev->check(st.cu().cuStreamSynchronize(st.stream.get()), "CUDA forward"));
  if (st.profiling) st.collectProfile(tokens.size() > 1);
  return *st.h_argmax;
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
  }
  st.profiling = on;
}

void CudaSession::resetProfile() {
  std::fill(s_->ms_prefill.begin(), s_->ms_prefill.end(), 0.0);
  std::fill(s_->ms_decode.begin(), s_->ms_decode.end(), 0.0);
  std::fill(s_->calls_prefill.begin(), s_->calls_prefill.end(), 0);
  std::fill(s_->calls_decode.begin(), s_->calls_decode.end(), 0);
}

std::vector<StepTime> CudaSession::profile() const {
  std::vector<StepTime> out;
  for (bool prefill : {true, false}) {
    const auto& steps = prefill ? s_->be->prefill : s_->be->decode;
    const auto& ms = prefill ? s_->ms_prefill : s_->ms_decode;
    const auto& calls = prefill ? s_->calls_prefill : s_->calls_decode;
    for (size_t i = 0; i < ms.size(); ++i)
      if (calls[i] > 0)
        out.push_back({steps[i].step->name() ? steps[i].step->name()->str() : "", opName(steps[i].step->op()), prefill,
                       ms[i], calls[i]});
  }
  return out;
}

Result<std::unique_ptr<BackendSession>> CudaBackend::createSession(const BackendSessionConfig& config) const {
  Result<std::unique_ptr<CudaSession>> s = createCudaSession(config);
  if (!s) return s.takeStatus();
  return std::unique_ptr<BackendSession>(std::move(*s));
}

Result<std::unique_ptr<CudaSession>> CudaBackend::createCudaSession(const BackendSessionConfig& config) const {
  const State& be = *s_;
  const fb::Artifact* m = be.artifact->manifest();
  const fb::MemoryPlan* mem = m->memory();
  const std::string path = be.artifact->path();
  if (!mem || !mem->buffers()) return Status::error(path + ": the artifact has no memory plan");
  auto st = std::make_unique<CudaSession::State>();
  st->be = &be;
  st->dev = be.dev;
  st->n_ctx = config.n_ctx;
  st->max_batch = static_cast<int>(mem->max_batch());
  st->n_vocab = static_cast<int>(m->config()->n_vocab());
  st->logits_buffer = mem->logits();
  st->ids_buffer = mem->input_ids();
  if (config.n_ctx < 1) return Status::error("CUDA session: n_ctx must be ≥ 1");

  // Layout of the arena: buffers, then per attention layer K and V, then partials, pos, argmax.
  const uint32_t n_buf = mem->buffers()->size();
  std::vector<uint64_t> offs(n_buf);
  uint64_t total = 0;
  st->buf_width.resize(n_buf);
  for (uint32_t i = 0; i < n_buf; ++i) {
    const fb::Buffer* b = mem->buffers()->Get(i);
    const uint64_t rows = mem->max_batch(), w = b->width();
    uint64_t bytes = 0;
    switch (b->type()) {
      case fb::BufferType::F32: case fb::BufferType::I32: bytes = rows * w * 4; break;
      case fb::BufferType::F16: bytes = rows * w * 2; break;
      case fb::BufferType::I8: bytes = kern::q8BufferBytes(static_cast<unsigned>(rows), static_cast<unsigned>(w)); break;
    }
    offs[i] = total;
    st->buf_width[i] = b->width();
    total += align(bytes);
  }
  const uint64_t act_bytes = total;
  // KV cache: one (K, V) pair per attention layer, each n_ctx × kv_width f16.
  std::map<int, std::pair<uint64_t, uint64_t>> kv;  // layer → (offset, bytes of K)
  uint64_t part_floats = 0;
  for (const StepKernels& sk : be.prefill)
    if (sk.step->op() == fb::OpKind::Attention && !kv.count(sk.step->layer())) {
      const uint64_t k_bytes = static_cast<uint64_t>(config.n_ctx) * sk.step->n_head_kv() * sk.step->head_dim() * 2;
      kv[sk.step->layer()] = {total, k_bytes};
      total += 2 * align(k_bytes);
    }
  const uint64_t kv_bytes = total - act_bytes;
  for (const StepKernels& sk : be.decode)
    if (sk.step->op() == fb::OpKind::Attention)
      part_floats = std::max<uint64_t>(part_floats, kern::attnDecodePartFloats(sk.step->n_head(), sk.step->head_dim(),
                                                                     static_cast<unsigned>(
                                                                         be.images[sk.images[1]].define("ATT_SPLITS", 1))));
  const uint64_t part_off = total;
  total += align(part_floats * 4);
  const uint64_t pos_off = total;
  total += kAlign;
  const uint64_t argmax_off = total;
  total += kAlign;

  Result<std::pair<uint64_t, uint64_t>> mi = be.dev->memInfo();
  if (!mi) return mi.takeStatus();
  if (total > mi->first)
    return Status::error("CUDA session: needs " + std::to_string(total) + " bytes of device memory (activations " +
                         std::to_string(act_bytes) + " for max batch " + std::to_string(st->max_batch) + ", KV cache " +
                         std::to_string(kv_bytes) + " for n_ctx " + std::to_string(config.n_ctx) + ") but " +
                         be.dev->info().name + " has " + std::to_string(mi->first) + " bytes free of " +
                         std::to_string(mi->second) + "; lower --ctx");
  Result<DeviceBuffer> arena = be.dev->alloc(total, "CUDA session");
  if (!arena) return arena.takeStatus();
  st->arena = std::move(*arena);
  st->allocated = total;
  const CUdeviceptr base = st->arena.ptr();
  for (uint32_t i = 0; i < n_buf; ++i) st->buf.push_back(base + offs[i]);
  st->pos = base + pos_off;
  st->argmax_out = base + argmax_off;
  const CUdeviceptr part = base + part_off;

  Result<PinnedBuffer> pinned = be.dev->allocPinned(static_cast<uint64_t>(st->max_batch) * 4 + 64, "CUDA session");
  if (!pinned) return pinned.takeStatus();
  st->pinned = std::move(*pinned);
  st->h_ids = static_cast<int32_t*>(st->pinned.data());
  st->h_pos = st->h_ids + st->max_batch;
  st->h_argmax = st->h_pos + 4;
  Result<Stream> stream = be.dev->createStream();
  if (!stream) return stream.takeStatus();
  st->stream = std::move(*stream);
  // Poison the activations (NaN bit pattern) so a kernel that reads an unwritten element shows it.
  MINFER_RETURN_IF_ERROR(be.dev->check(
      be.dev->cu().cuMemsetD32Async(base, 0x7FC00000u, act_bytes / 4, st->stream.get()), "CUDA session: memset"));
  MINFER_RETURN_IF_ERROR(be.dev->check(be.dev->cu().cuMemsetD8Async(base + act_bytes, 0, total - act_bytes,
                                                                    st->stream.get()),
                                       "CUDA session: memset"));

  // Launch records.
  const unsigned mb = static_cast<unsigned>(st->max_batch);
  auto q8meta = [&](uint32_t id) { return st->buf[id] + kern::q8MetaOffset(mb, st->buf_width[id]); };
  auto vec = [&](const fb::Step* s, uint32_t i) -> CUdeviceptr {
    if (!s->weights() || i >= s->weights()->size()) return 0;
    return be.tensors[s->weights()->Get(i)].plane(PlaneKind::kF32);
  };
  auto build = [&](bool prefill) -> Status {
    const std::vector<StepKernels>& steps = prefill ? be.prefill : be.decode;
    std::vector<Launch>& out = prefill ? st->prefill : st->decode;
    for (size_t si = 0; si < steps.size(); ++si) {
      const StepKernels& sk = steps[si];
      const fb::Step* s = sk.step;
      auto in = [&](uint32_t i) { return st->buf[s->inputs()->Get(i)]; };
      auto outb = [&](uint32_t i) { return st->buf[s->outputs()->Get(i)]; };
      // Row-addressed pushes of input i / output i: f32 rows (width × 4 bytes), or the two parts of a
      // q8 buffer (int8 rows of width bytes; Q8Meta rows of width / 32 × 8 bytes).
      auto pushIn = [&](Launch& l, uint32_t i) {
        const uint32_t b = s->inputs()->Get(i);
        l.pushRow(st->buf[b], b, uint64_t{st->buf_width[b]} * 4, false);
      };
      auto pushOut = [&](Launch& l, uint32_t i) {
        const uint32_t b = s->outputs()->Get(i);
        l.pushRow(st->buf[b], b, uint64_t{st->buf_width[b]} * 4, true);
      };
      auto pushQ8 = [&](Launch& l, uint32_t b, bool written) {
        l.pushRow(st->buf[b], b, st->buf_width[b], written);
        l.pushRow(q8meta(b), b, uint64_t{st->buf_width[b]} / kern::kQ8Block * sizeof(kern::Q8Meta), written);
      };
      auto need = [&](size_t n_in, size_t n_out, size_t n_w) -> Status {
        if (!s->inputs() || s->inputs()->size() < n_in || !s->outputs() || s->outputs()->size() < n_out ||
            (n_w && (!s->weights() || s->weights()->size() < n_w)))
          return Status::error(path + ": " + sk.label + ": needs " + std::to_string(n_in) + " inputs, " +
                               std::to_string(n_out) + " outputs and " + std::to_string(n_w) + " weights");
        return Status::ok();
      };
      for (size_t k = 0; k < sk.images.size(); ++k) {
        const LoadedImage& img = be.images[sk.images[k]];
        Launch l;
        l.fn = img.fn;
        l.step = static_cast<int>(si);
        l.entry = img.entry.c_str();
        const std::string& e = img.entry;
        if (e == "minfer_embed") {
          MINFER_RETURN_IF_ERROR(need(1, 1, 1));
          const CUdeviceptr table = be.tensors[s->weights()->Get(0)].plane(static_cast<PlaneKind>(img.define("EMBED_PLANE")));
          if (!table) return Status::error(path + ": " + sk.label + ": the embedding plane is missing");
          l.push(in(0));
          l.push(table);
          l.push(outb(0));
          l.pushTokens();
          l.shape = [](unsigned n) { return kern::embedLaunch(n); };
        } else if (e == "minfer_rms_norm") {
          MINFER_RETURN_IF_ERROR(need(1, 1, 1));
          pushIn(l, 0);
          l.push(vec(s, 0));
          pushOut(l, 0);
          l.pushTokens();
          l.shape = [](unsigned n) { return kern::rmsNormLaunch(n); };
        } else if (e == "minfer_head_rms_norm") {
          MINFER_RETURN_IF_ERROR(need(1, 1, 1));
          l.push(in(0));
          l.push(vec(s, 0));
          l.pushTokens();
          const unsigned h = static_cast<unsigned>(img.define("HRMS_NHEAD"));
          l.shape = [h](unsigned n) { return kern::headRmsNormLaunch(n, h); };
        } else if (e == "minfer_quantize_act") {
          MINFER_RETURN_IF_ERROR(need(1, 1, 0));
          pushIn(l, 0);
          pushQ8(l, s->outputs()->Get(0), true);
          l.pushTokens();
          const unsigned k = static_cast<unsigned>(img.define("QA_K"));
          l.shape = [k](unsigned n) { return kern::quantizeActLaunch(n, k); };
        } else if (e == "minfer_mmq" || e == "minfer_gemv") {
          MINFER_RETURN_IF_ERROR(need(2, 1, 1));
          const DeviceTensor& w = be.tensors[s->weights()->Get(0)];
          const bool gemv = e == "minfer_gemv";
          const CUdeviceptr wq =
              gemv && img.define("GEMV_BITS") == 4 ? w.plane(PlaneKind::kPacked) : w.plane(PlaneKind::kI8);
          if (!wq || !w.plane(PlaneKind::kScale))
            return Status::error(path + ": " + sk.label + ": '" + w.name + "' lacks the planes " + e + " reads");
          l.push(wq);
          l.push(w.plane(PlaneKind::kScale));
          l.push(w.plane(PlaneKind::kMin));
          l.push(vec(s, 1));
          pushQ8(l, s->inputs()->Get(1), false);
          pushOut(l, 0);
          if (gemv) {
            const unsigned n_rows = static_cast<unsigned>(img.define("GEMV_N"));
            l.shape = [n_rows](unsigned) { return kern::gemvLaunch(n_rows); };
          } else {
            l.pushTokens();
            const unsigned n_rows = static_cast<unsigned>(img.define("MMQ_N"));
            const unsigned tm = static_cast<unsigned>(img.define("MMQ_TM")), tn = static_cast<unsigned>(img.define("MMQ_TN"));
            const unsigned group = static_cast<unsigned>(img.define("MMQ_GROUP"));
            const bool has_min = img.define("MMQ_HAS_MIN") != 0;
            l.shape = [n_rows, tm, tn, group, has_min](unsigned n) {
              return kern::mmqLaunch(n_rows, n, tm, tn, group, has_min);
            };
          }
        } else if (e == "minfer_dense_mm" || e == "minfer_dense_gemv") {
          MINFER_RETURN_IF_ERROR(need(1, 1, 1));
          const bool gemv = e == "minfer_dense_gemv";
          const DeviceTensor& w = be.tensors[s->weights()->Get(0)];
          const CUdeviceptr wd =
              w.plane(static_cast<PlaneKind>(img.define(gemv ? "DGEMV_PLANE" : "DMM_PLANE")));
          if (!wd) return Status::error(path + ": " + sk.label + ": '" + w.name + "' lacks its dense plane");
          l.push(wd);
          l.push(vec(s, 1));
          pushIn(l, 0);
          pushOut(l, 0);
          const unsigned n_rows = static_cast<unsigned>(img.define(gemv ? "DGEMV_N" : "DMM_N"));
          if (gemv) {
            l.shape = [n_rows](unsigned) { return kern::denseGemvLaunch(n_rows); };
          } else {
            l.pushTokens();
            l.shape = [n_rows](unsigned n) { return kern::denseMmLaunch(n_rows, n); };
          }
        } else if (e == "minfer_rope") {
          MINFER_RETURN_IF_ERROR(need(2, 0, 0));
          l.push(in(0));
          l.push(in(1));
          l.push(st->pos);
          l.pushTokens();
          const unsigned h = s->n_head(), hkv = s->n_head_kv();
          l.shape = [h, hkv](unsigned n) { return kern::ropeLaunch(n, h, hkv); };
        } else if (e == "minfer_kv_store" || e == "minfer_attn_prefill" || e == "minfer_attn_decode" ||
                   e == "minfer_attn_combine") {
          MINFER_RETURN_IF_ERROR(need(3, 1, 0));
          const auto [koff, kbytes] = kv.at(s->layer());
          const CUdeviceptr kc = base + koff, vc = base + koff + align(kbytes);
          const unsigned h = s->n_head(), hkv = s->n_head_kv(), d = s->head_dim();
          const unsigned splits = static_cast<unsigned>(img.define("ATT_SPLITS", 1));
          if (e == "minfer_kv_store") {
            l.push(in(1));
            l.push(in(2));
            l.push(kc);
            l.push(vc);
            l.push(st->pos);
            l.pushTokens();
            l.shape = [hkv, d](unsigned n) { return kern::kvStoreLaunch(n, hkv, d); };
          } else if (e == "minfer_attn_prefill") {
            l.push(in(0));
            l.push(kc);
            l.push(vc);
            l.push(outb(0));
            l.push(st->pos);
            l.pushTokens();
            l.shape = [h, d](unsigned n) { return kern::attnPrefillLaunch(n, h, d); };
          } else if (e == "minfer_attn_decode") {
            l.push(in(0));
            l.push(kc);
            l.push(vc);
            l.push(part);
            l.push(st->pos);
            l.shape = [h, splits](unsigned) { return kern::attnDecodeLaunch(h, splits); };
          } else {
            l.push(part);
            l.push(outb(0));
            l.shape = [h](unsigned) { return kern::attnCombineLaunch(h); };
          }
        } else if (e == "minfer_swiglu" || e == "minfer_add") {
          MINFER_RETURN_IF_ERROR(need(2, 1, 0));
          pushIn(l, 0);
          pushIn(l, 1);
          pushOut(l, 0);
          l.pushTokens();
          const unsigned w = static_cast<unsigned>(img.define("EW_WIDTH"));
          l.shape = [w](unsigned n) { return kern::elementwiseLaunch(n, w); };
        } else {
          return Status::error(path + ": " + sk.label + ": unknown kernel entry " + e);
        }
        out.push_back(std::move(l));
      }
    }
    return Status::ok();
  };
  MINFER_RETURN_IF_ERROR(build(true));
  MINFER_RETURN_IF_ERROR(build(false));
  // The tail: launches after the last attention step's, provided every one is row-wise and ends in
  // the logits buffer.
  st->tail = st->prefill.size();
  st->fresh.assign(st->buf.size(), false);
  size_t after_attn = 0;
  bool row_wise = true;
  for (size_t i = 0; i < st->prefill.size(); ++i) {
    const fb::OpKind op = be.prefill[st->prefill[i].step].step->op();
    if (op == fb::OpKind::Attention) {
      after_attn = i + 1;
      row_wise = true;
    } else if (op != fb::OpKind::MatMul && op != fb::OpKind::RmsNorm && op != fb::OpKind::QuantizeAct &&
               op != fb::OpKind::Add && op != fb::OpKind::SwiGlu) {
      row_wise = false;
    }
  }
  if (row_wise && after_attn > 0 && after_attn < st->prefill.size()) {
    const Launch& last = st->prefill.back();
    for (int r = 0; r < last.n_rows; ++r)
      if (last.rows[r].written && last.rows[r].buffer == st->logits_buffer) st->tail = after_attn;
  }
  if (be.argmax_image >= 0) {
    Launch& l = st->argmax;
    l.fn = be.images[be.argmax_image].fn;
    l.entry = "minfer_argmax";
    l.push(st->buf[st->logits_buffer]);
    l.push(st->argmax_out);
    l.pushInt(1);
    l.shape = [](unsigned) { return kern::argmaxLaunch(1); };
    st->have_argmax = true;
  }

  // Decode plan → CUDA graph (n_tokens = 1 is baked into the captured launches; pos0 is read from
  // device memory by the kernels).
  if (be.options.decode_graph && !st->decode.empty()) {
    const CudaDriver& cu = be.dev->cu();
    CUstream s = st->stream.get();
    MINFER_RETURN_IF_ERROR(be.dev->check(cu.cuStreamSynchronize(s), "CUDA session: cuStreamSynchronize"));
    MINFER_RETURN_IF_ERROR(
        be.dev->check(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "CUDA session: begin capture"));
    Status launched = st->runPlan(/*prefill=*/false, 1);
    CUgraph graph = nullptr;
    const CUresult end = cu.cuStreamEndCapture(s, &graph);
    MINFER_RETURN_IF_ERROR(launched);
    MINFER_RETURN_IF_ERROR(be.dev->check(end, "CUDA session: end capture"));
    st->graph = graph;
    MINFER_RETURN_IF_ERROR(
        be.dev->check(cu.cuGraphInstantiateWithFlags(&st->graph_exec, graph, 0), "CUDA session: graph instantiate"));
  }
  MINFER_RETURN_IF_ERROR(be.dev->check(be.dev->cu().cuStreamSynchronize(st->stream.get()), "CUDA session: setup"));
  return std::make_unique<CudaSession>(std::move(st));
}

}  // namespace minfer::cuda
