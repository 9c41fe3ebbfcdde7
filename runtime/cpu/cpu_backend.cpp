// CPU backend: interprets the artifact's execution plan with the float32 reference ops (cpu_ops.h).
//
// Creation (plan phase) resolves every weight a step uses into plane views of the mapped artifact,
// materializes norm weights and biases as float vectors, and checks every step's buffers, weights and
// parameters against each other. A session (allocate phase) then owns the activation buffers
// (max_batch rows of each F32/I32 buffer the CPU uses; GPU-only I8 buffers are not allocated), an
// f32 KV cache of n_ctx positions per attention layer, per-thread scratch and a thread pool; forward()
// (execute phase) allocates nothing. Skipped on the CPU: QuantizeAct steps, kPacked planes, and the
// 2nd+ inputs of MatMul (GPU-side quantized copies of the input).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "minfer/artifact.h"
#include "runtime/backend.h"
#include "runtime/cpu/cpu_ops.h"
#include "runtime/cpu/thread_pool.h"

namespace minfer {
namespace {

using cpu::RowSource;
using cpu::WeightPlanes;

const char* opName(fb::OpKind op) {
  const char* n = fb::EnumNameOpKind(op);
  return (n && *n) ? n : "unknown";
}

// One plan step after validation: buffer ids, weight, and parameters as the ops take them.
struct StepInfo {
  fb::OpKind op = fb::OpKind::Embed;
  std::string label;  // "prefill step 12 'blk.0.attn_q' (MatMul)"
  uint32_t in[3] = {0, 0, 0};
  uint32_t out[2] = {0, 0};
  int weight = -1;                // tensor index (Embed, MatMul)
  RowSource src = RowSource::kDense;
  const float* vec = nullptr;     // norm weight (RmsNorm, HeadRmsNorm) or bias (MatMul), else null
  int layer = -1;
  float eps = 0;
  int n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  cpu::RopeStyle rope_style = cpu::RopeStyle::kNorm;
  float rope_base = 10000, rope_scale = 1;
  int rows = 0, cols = 0;         // MatMul; width of elementwise ops in `cols`
  bool skip = false;              // GPU-only step
  bool logits = false;            // writes memory.logits
};

struct KvShape {
  int n_head_kv = 0, head_dim = 0;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const ArtifactFile& file) : file_(file), m_(file.manifest()) {}
  const char* name() const override { return "cpu"; }
  Result<std::unique_ptr<BackendSession>> createSession(const BackendSessionConfig& config) const override;
  Status init();

  const ArtifactFile& file_;
  const fb::Artifact* m_;
  std::vector<WeightPlanes> weights_;             // per tensor index (resolved when a step uses it)
  std::vector<bool> resolved_;
  std::vector<std::vector<float>> vectors_;       // per tensor index: materialized vector weights
  std::vector<StepInfo> prefill_, decode_;
  std::vector<bool> used_;                        // per buffer: read or written by a CPU step
  std::map<int, KvShape> kv_layers_;              // attention layer → cache shape
  int max_batch_ = 0;
  int n_vocab_ = 0;
  uint32_t ids_ = 0, logits_ = 0;
  int max_matmul_cols_ = 0;

 private:
  Status resolveTensor(uint32_t index, const std::string& label);
  Result<const float*> vectorWeight(uint32_t index, uint64_t length, const std::string& label);
  Status prepare(const fb::Plan* plan, const char* which, std::vector<StepInfo>& out);
  Status prepareStep(const fb::Step& s, StepInfo& info);
  Status buffer(const StepInfo& info, uint32_t id, uint64_t width, const char* role, bool ids = false);
};

class CpuSession final : public BackendSession {
 public:
  CpuSession(const CpuBackend& backend, int n_ctx, int n_threads)
      : b_(backend), n_ctx_(n_ctx), pool_(n_threads) {}
  Status allocate();
  Status forward(std::span<const int32_t> tokens, int pos0, float* logits, bool all_rows) override;
  int maxBatch() const override { return b_.max_batch_; }
  int contextLength() const override { return n_ctx_; }
  uint64_t allocatedBytes() const override { return bytes_; }

 private:
  float* buf(uint32_t id) { return f32_[id].data(); }
  void run(const StepInfo& s, int n, bool all_rows);

  const CpuBackend& b_;
  int n_ctx_;
  cpu::ThreadPool pool_;
  std::vector<std::vector<float>> f32_;       // per buffer id: max_batch × width (empty if unused)
  std::vector<int32_t> ids_;                  // max_batch token ids
  std::map<int, std::vector<float>> kv_;      // layer → K then V, each (n_ctx, n_head_kv, head_dim)
  std::map<int, cpu::KvLayer> kv_views_;
  std::vector<float> matmul_scratch_;         // threads × max matmul cols
  std::vector<float> attn_scratch_;           // threads × n_ctx
  uint64_t bytes_ = 0;
  int pos0_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Plan phase.

Status CpuBackend::init() {
  const fb::MemoryPlan* mem = m_->memory();
  if (!mem || !mem->buffers()) return Status::error(file_.path() + ": the artifact has no memory plan");
  if (mem->max_batch() < 1 || mem->max_batch() > 65536)
    return Status::error(file_.path() + ": memory.max_batch = " + std::to_string(mem->max_batch()) +
                         " is out of range 1..65536");
  max_batch_ = static_cast<int>(mem->max_batch());
  n_vocab_ = static_cast<int>(m_->config()->n_vocab());
  const auto* bufs = mem->buffers();
  ids_ = mem->input_ids();
  logits_ = mem->logits();
  if (ids_ >= bufs->size() || bufs->Get(ids_)->type() != fb::BufferType::I32 || bufs->Get(ids_)->width() != 1)
    return Status::error(file_.path() + ": memory.input_ids = " + std::to_string(ids_) +
                         " is not an I32 buffer of width 1");
  if (logits_ >= bufs->size() || bufs->Get(logits_)->type() != fb::BufferType::F32 ||
      bufs->Get(logits_)->width() != static_cast<uint32_t>(n_vocab_) || n_vocab_ < 1)
    return Status::error(file_.path() + ": memory.logits = " + std::to_string(logits_) +
                         " is not an F32 buffer of width n_vocab = " + std::to_string(n_vocab_));
  const size_t n_tensors = m_->tensors() ? m_->tensors()->size() : 0;
  weights_.resize(n_tensors);
  resolved_.assign(n_tensors, false);
  vectors_.resize(n_tensors);
  used_.assign(bufs->size(), false);
  used_[ids_] = used_[logits_] = true;

  const fb::Plan* prefill = m_->prefill() && m_->prefill()->steps() ? m_->prefill() : nullptr;
  const fb::Plan* decode = m_->decode() && m_->decode()->steps() ? m_->decode() : nullptr;
  if (!prefill && !decode) return Status::error(file_.path() + ": the artifact has neither a prefill nor a decode plan");
  MINFER_RETURN_IF_ERROR(prepare(prefill ? prefill : decode, prefill ? "prefill" : "decode", prefill_));
  MINFER_RETURN_IF_ERROR(prepare(decode ? decode : prefill, decode ? "decode" : "prefill", decode_));
  return Status::ok();
}

Status CpuBackend::resolveTensor(uint32_t index, const std::string& label) {
  if (index >= weights_.size())
    return Status::error(label + ": weight index " + std::to_string(index) + " ≥ " +
                         std::to_string(weights_.size()) + " tensors");
  if (resolved_[index]) return Status::ok();
  const fb::Tensor* t = m_->tensors()->Get(index);
  WeightPlanes w;
  w.name = t->name()->c_str();
  if (!t->planes() || t->planes()->size() == 0)
    return Status::error(label + ": tensor '" + w.name + "' has no planes");
  for (const fb::Plane* p : *t->planes()) {
    const fb::StrideTable* l = p->layout();
    cpu::PlaneView v;
    v.table.kind = static_cast<PlaneKind>(l->kind());
    v.table.elem = static_cast<ElemType>(l->elem());
    v.table.rows = l->rows();
    v.table.cols = l->cols();
    v.table.row_pitch = l->row_pitch();
    v.table.group_size = l->group_size();
    v.table.group_pitch = l->group_pitch();
    v.table.bits = l->bits();
    v.table.q_offset = l->q_offset();
    v.table.ggml_type = l->ggml_type();
    v.data = file_.segmentData(*p->data());
    v.size = p->data()->size();
    if (!v.data) return Status::error(label + ": tensor '" + w.name + "': a plane's segment lies outside the file");
    cpu::PlaneView* slot = nullptr;
    switch (v.table.kind) {
      case PlaneKind::kF32: case PlaneKind::kF16: case PlaneKind::kBF16: slot = &w.dense; break;
      case PlaneKind::kI8: slot = &w.q; break;
      case PlaneKind::kScale: slot = &w.scale; break;
      case PlaneKind::kMin: slot = &w.min; break;
      case PlaneKind::kBlocks: slot = &w.blocks; break;
      case PlaneKind::kPacked: continue;  // decode GEMV on the GPU only
      default:
        return Status::error(label + ": tensor '" + w.name + "' has a plane of unknown kind " +
                             std::to_string(l->kind()));
    }
    if (slot->present())
      return Status::error(label + ": tensor '" + w.name + "' has two planes of kind " + std::to_string(l->kind()));
    if (w.rows == 0 && w.cols == 0) {
      w.rows = v.table.rows;
      w.cols = v.table.cols;
    }
    *slot = v;
  }
  if (w.cols > (1u << 30) || w.rows > (1u << 30))
    return Status::error(label + ": tensor '" + w.name + "' is " + std::to_string(w.rows) + " x " +
                         std::to_string(w.cols) + ", larger than the CPU backend's 2^30 per dimension");
  MINFER_RETURN_IF_ERROR(cpu::checkWeightPlanes(w).withContext(label + ": "));
  weights_[index] = w;
  resolved_[index] = true;
  return Status::ok();
}

Result<const float*> CpuBackend::vectorWeight(uint32_t index, uint64_t length, const std::string& label) {
  MINFER_RETURN_IF_ERROR(resolveTensor(index, label));
  const WeightPlanes& w = weights_[index];
  if (w.rows * w.cols != length || (w.rows != 1 && w.cols != 1))
    return Status::error(label + ": tensor '" + w.name + "' is " + std::to_string(w.rows) + " x " +
                         std::to_string(w.cols) + ", expected a vector of " + std::to_string(length));
  std::vector<float>& v = vectors_[index];
  if (v.empty()) {
    Result<RowSource> src = cpu::pickRowSource(w, false);
    if (!src) return src.takeStatus().withContext(label + ": ");
    v.resize(length);
    std::vector<float> row(w.cols);
    for (uint64_t r = 0; r < w.rows; ++r) {
      cpu::dequantizeRow(w, *src, r, row.data());
      std::copy(row.begin(), row.end(), v.begin() + static_cast<int64_t>(r * w.cols));
    }
  }
  return static_cast<const float*>(v.data());
}

Status CpuBackend::buffer(const StepInfo& info, uint32_t id, uint64_t width, const char* role, bool ids) {
  const auto* bufs = m_->memory()->buffers();
  if (id >= bufs->size())
    return Status::error(info.label + ": " + role + " buffer id " + std::to_string(id) + " ≥ " +
                         std::to_string(bufs->size()) + " buffers");
  const fb::Buffer* b = bufs->Get(id);
  const fb::BufferType want = ids ? fb::BufferType::I32 : fb::BufferType::F32;
  if (b->type() != want)
    return Status::error(info.label + ": " + role + " buffer '" + b->name()->str() + "' has type " +
                         fb::EnumNameBufferType(b->type()) + ", the CPU needs " + fb::EnumNameBufferType(want));
  if (b->width() != width)
    return Status::error(info.label + ": " + role + " buffer '" + b->name()->str() + "' has width " +
                         std::to_string(b->width()) + ", expected " + std::to_string(width));
  used_[id] = true;
  return Status::ok();
}

Status CpuBackend::prepare(const fb::Plan* plan, const char* which, std::vector<StepInfo>& out) {
  out.resize(plan->steps()->size());
  for (uint32_t i = 0; i < plan->steps()->size(); ++i) {
    const fb::Step* s = plan->steps()->Get(i);
    StepInfo& info = out[i];
    info.op = s->op();
    info.label = file_.path() + ": " + which + " step " + std::to_string(i) + " '" +
                 (s->name() ? s->name()->str() : std::string()) + "' (" + opName(s->op()) + ")";
    MINFER_RETURN_IF_ERROR(prepareStep(*s, info));
  }
  return Status::ok();
}

Status CpuBackend::prepareStep(const fb::Step& s, StepInfo& info) {
  const auto count = [&](const flatbuffers::Vector<uint32_t>* v) { return v ? v->size() : 0u; };
  const uint32_t n_in = count(s.inputs()), n_out = count(s.outputs()), n_w = count(s.weights());
  const auto need = [&](uint32_t min_in, uint32_t max_in, uint32_t outs, uint32_t min_w, uint32_t max_w) -> Status {
    if (n_in < min_in || n_in > max_in || n_out != outs || n_w < min_w || n_w > max_w)
      return Status::error(info.label + ": has " + std::to_string(n_in) + " inputs, " + std::to_string(n_out) +
                           " outputs, " + std::to_string(n_w) + " weights; expected " + std::to_string(min_in) +
                           (max_in != min_in ? ".." + std::to_string(max_in) : "") + " inputs, " +
                           std::to_string(outs) + " outputs, " + std::to_string(min_w) +
                           (max_w != min_w ? ".." + std::to_string(max_w) : "") + " weights");
    for (uint32_t i = 0; i < std::min(n_in, 3u); ++i) info.in[i] = s.inputs()->Get(i);
    for (uint32_t i = 0; i < std::min(n_out, 2u); ++i) info.out[i] = s.outputs()->Get(i);
    return Status::ok();
  };
  const auto positive = [&](uint32_t v, const char* field) -> Status {
    if (v == 0 || v > (1u << 20))
      return Status::error(info.label + ": " + field + " = " + std::to_string(v) + " is out of range 1..2^20");
    return Status::ok();
  };
  const auto bufferWidth = [&](uint32_t id) -> uint64_t {
    const auto* bufs = m_->memory()->buffers();
    return id < bufs->size() ? bufs->Get(id)->width() : 0;
  };

  switch (s.op()) {
    case fb::OpKind::QuantizeAct:
      info.skip = true;
      return Status::ok();

    case fb::OpKind::Embed: {
      MINFER_RETURN_IF_ERROR(need(1, 1, 1, 1, 1));
      info.weight = static_cast<int>(s.weights()->Get(0));
      MINFER_RETURN_IF_ERROR(resolveTensor(info.weight, info.label));
      const WeightPlanes& w = weights_[info.weight];
      if (w.rows != static_cast<uint64_t>(n_vocab_))
        return Status::error(info.label + ": embedding '" + w.name + "' has " + std::to_string(w.rows) +
                             " rows, n_vocab is " + std::to_string(n_vocab_));
      Result<RowSource> src = cpu::pickRowSource(w, true);
      if (!src) return src.takeStatus().withContext(info.label + ": ");
      info.src = *src;
      info.cols = static_cast<int>(w.cols);
      MINFER_RETURN_IF_ERROR(buffer(info, info.in[0], 1, "input", true));
      MINFER_RETURN_IF_ERROR(buffer(info, info.out[0], w.cols, "output"));
      break;
    }

    case fb::OpKind::RmsNorm: {
      MINFER_RETURN_IF_ERROR(need(1, 1, 1, 1, 1));
      const uint64_t width = bufferWidth(info.in[0]);
      MINFER_RETURN_IF_ERROR(positive(static_cast<uint32_t>(width), "input width"));
      MINFER_RETURN_IF_ERROR(buffer(info, info.in[0], width, "input"));
      MINFER_RETURN_IF_ERROR(buffer(info, info.out[0], width, "output"));
      Result<const float*> w = vectorWeight(s.weights()->Get(0), width, info.label);
      if (!w) return w.takeStatus();
      info.vec = *w;
      info.cols = static_cast<int>(width);
      info.eps = s.eps();
      break;
    }

    case fb::OpKind::HeadRmsNorm: {
      MINFER_RETURN_IF_ERROR(need(1, 1, 1, 1, 1));
      MINFER_RETURN_IF_ERROR(positive(s.n_head(), "n_head"));
      MINFER_RETURN_IF_ERROR(positive(s.head_dim(), "head_dim"));
      if (info.out[0] != info.in[0])
        return Status::error(info.label + ": works in place, but output buffer " + std::to_string(info.out[0]) +
                             " ≠ input buffer " + std::to_string(info.in[0]));
      info.n_head = static_cast<int>(s.n_head());
      info.head_dim = static_cast<int>(s.head_dim());
      MINFER_RETURN_IF_ERROR(buffer(info, info.in[0], uint64_t{s.n_head()} * s.head_dim(), "input"));
      Result<const float*> w = vectorWeight(s.weights()->Get(0), s.head_dim(), info.label);
      if (!w) return w.takeStatus();
      info.vec = *w;
      info.eps = s.eps();
      break;
    }

    case fb::OpKind::MatMul: {
      MINFER_RETURN_IF_ERROR(need(1, 3, 1, 1, 2));  // inputs[1..]: GPU-side quantized input, ignored
      MINFER_RETURN_IF_ERROR(positive(s.rows(), "rows"));
      MINFER_RETURN_IF_ERROR(positive(s.cols(), "cols"));
      info.rows = static_cast<int>(s.rows());
      info.cols = static_cast<int>(s.cols());
      info.weight = static_cast<int>(s.weights()->Get(0));
      MINFER_RETURN_IF_ERROR(resolveTensor(info.weight, info.label));
      const WeightPlanes& w = weights_[info.weight];
      if (w.rows != s.rows() || w.cols != s.cols())
        return Status::error(info.label + ": weight '" + w.name + "' is " + std::to_string(w.rows) + " x " +
                             std::to_string(w.cols) + ", the step says rows = " + std::to_string(s.rows()) +
                             ", cols = " + std::to_string(s.cols()));
      Result<RowSource> src = cpu::pickRowSource(w, false);
      if (!src) return src.takeStatus().withContext(info.label + ": ");
      info.src = *src;
      if (info.in[0] == info.out[0])
        return Status::error(info.label + ": output buffer " + std::to_string(info.out[0]) + " is its input");
      MINFER_RETURN_IF_ERROR(buffer(info, info.in[0], s.cols(), "input"));
      MINFER_RETURN_IF_ERROR(buffer(info, info.out[0], s.rows(), "output"));
      if (n_w == 2) {
        Result<const float*> bias = vectorWeight(s.weights()->Get(1), s.rows(), info.label);
        if (!bias) return bias.takeStatus();
        info.vec = *bias;
      }
      max_matmul_cols_ = std::max(max_matmul_cols_, info.cols);
      info.logits = info.out[0] == logits_;
      break;
    }

    case fb::OpKind::Rope: {
      MINFER_RETURN_IF_ERROR(need(2, 2, 2, 0, 0));
      MINFER_RETURN_IF_ERROR(positive(s.n_head(), "n_head"));
      MINFER_RETURN_IF_ERROR(positive(s.n_head_kv(), "n_head_kv"));
      MINFER_RETURN_IF_ERROR(positive(s.head_dim(), "head_dim"));
      if (info.out[0] != info.in[0] || info.out[1] != info.in[1])
        return Status::error(info.label + ": works in place, but its outputs differ from its inputs");
      if (s.n_rot() % 2 != 0 || s.n_rot() > s.head_dim() || s.n_rot() > static_cast<uint32_t>(cpu::kMaxRot))
        return Status::error(info.label + ": n_rot = " + std::to_string(s.n_rot()) +
                             " must be even and ≤ head_dim = " + std::to_string(s.head_dim()) + " and ≤ " +
                             std::to_string(cpu::kMaxRot));
      if (!(s.rope_freq_base() > 0) || !(s.rope_freq_scale() > 0))
        return Status::error(info.label + ": rope_freq_base = " + std::to_string(s.rope_freq_base()) +
                             ", rope_freq_scale = " + std::to_string(s.rope_freq_scale()) + " must be > 0");
      if (s.rope_style() != fb::RopeStyle::Norm && s.rope_style() != fb::RopeStyle::Neox)
        return Status::error(info.label + ": unknown rope_style " + std::to_string(static_cast<int>(s.rope_style())));
      info.n_head = static_cast<int>(s.n_head());
      info.n_head_kv = static_cast<int>(s.n_head_kv());
      info.head_dim = static_cast<int>(s.head_dim());
      info.n_rot = static_cast<int>(s.n_rot());
      info.rope_style = s.rope_style() == fb::RopeStyle::Neox ? cpu::RopeStyle::kNeox : cpu::RopeStyle::kNorm;
      info.rope_base = s.rope_freq_base();
      info.rope_scale = s.rope_freq_scale();
      MINFER_RETURN_IF_ERROR(buffer(info, info.in[0], uint64_t{s.n_head()} * s.head_dim(), "q"));
      MINFER_RETURN_IF_ERROR(buffer(info, info.in[1], uint64_t{s.n_head_kv()} * s.head_dim(), "k"));
      break;
    }

    case fb::OpKind::Attention: {
      MINFER_RETURN_IF_ERROR(need(3, 3, 1, 0, 0));
      MINFER_RETURN_IF_ERROR(positive(s.n_head(), "n_head"));
      MINFER_RETURN_IF_ERROR(positive(s.n_head_kv(), "n_head_kv"));
      MINFER_RETURN_IF_ERROR(positive(s.head_dim(), "head_dim"));
      if (s.n_head() % s.n_head_kv() != 0)
        return Status::error(info.label + ": n_head = " + std::to_string(s.n_head()) +
                             " is not a multiple of n_head_kv = " + std::to_string(s.n_head_kv()));
      if (s.layer() < 0 || s.layer() > (1 << 16))
        return Status::error(info.label + ": layer = " + std::to_string(s.layer()) + " is out of range 0..65536");
      if (info.out[0] == info.in[0])
        return Status::error(info.label + ": output buffer is the q buffer");
      info.layer = s.layer();
      info.n_head = static_cast<int>(s.n_head());
      info.n_head_kv = static_cast<int>(s.n_head_kv());
      info.head_dim = static_cast<int>(s.head_dim());
      const uint64_t q_width = uint64_t{s.n_head()} * s.head_dim(), kv_width = uint64_t{s.n_head_kv()} * s.head_dim();
      MINFER_RETURN_IF_ERROR(buffer(info, info.in[0], q_width, "q"));
      MINFER_RETURN_IF_ERROR(buffer(info, info.in[1], kv_width, "k"));
      MINFER_RETURN_IF_ERROR(buffer(info, info.in[2], kv_width, "v"));
      MINFER_RETURN_IF_ERROR(buffer(info, info.out[0], q_width, "output"));
      auto [it, inserted] = kv_layers_.try_emplace(info.layer, KvShape{info.n_head_kv, info.head_dim});
      if (!inserted && (it->second.n_head_kv != info.n_head_kv || it->second.head_dim != info.head_dim))
        return Status::error(info.label + ": layer " + std::to_string(info.layer) + " was used with n_head_kv = " +
                             std::to_string(it->second.n_head_kv) + ", head_dim = " +
                             std::to_string(it->second.head_dim) + " by another step");
      break;
    }

    case fb::OpKind::SwiGlu:
    case fb::OpKind::Add: {
      MINFER_RETURN_IF_ERROR(need(2, 2, 1, 0, 0));
      const uint64_t width = bufferWidth(info.in[0]);
      MINFER_RETURN_IF_ERROR(positive(static_cast<uint32_t>(width), "input width"));
      MINFER_RETURN_IF_ERROR(buffer(info, info.in[0], width, "1st input"));
      MINFER_RETURN_IF_ERROR(buffer(info, info.in[1], width, "2nd input"));
      MINFER_RETURN_IF_ERROR(buffer(info, info.out[0], width, "output"));
      info.cols = static_cast<int>(width);
      break;
    }

    default:
      return Status::error(info.label + ": op kind " + std::to_string(static_cast<int>(s.op())) +
                           " is not implemented by the CPU backend");
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Allocate phase.

Result<std::unique_ptr<BackendSession>> CpuBackend::createSession(const BackendSessionConfig& config) const {
  int threads = config.n_threads > 0 ? config.n_threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp(threads, 1, 256);
  auto session = std::make_unique<CpuSession>(*this, config.n_ctx, threads);
  MINFER_RETURN_IF_ERROR(session->allocate());
  return std::unique_ptr<BackendSession>(std::move(session));
}

Status CpuSession::allocate() {
  const auto* bufs = b_.m_->memory()->buffers();
  const uint64_t threads = static_cast<uint64_t>(pool_.threads());
  // Count first, so an impossible request fails with the numbers instead of inside the allocator.
  uint64_t floats = 0;
  for (uint32_t id = 0; id < bufs->size(); ++id)
    if (b_.used_[id] && id != b_.ids_) floats += uint64_t(b_.max_batch_) * bufs->Get(id)->width();
  uint64_t kv_floats = 0;
  for (const auto& [layer, shape] : b_.kv_layers_) kv_floats += 2ull * n_ctx_ * shape.n_head_kv * shape.head_dim;
  floats += kv_floats + threads * b_.max_matmul_cols_ + threads * n_ctx_;
  const uint64_t bytes = floats * sizeof(float) + uint64_t(b_.max_batch_) * sizeof(int32_t);
  const uint64_t phys = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  if (phys > 0 && bytes > phys)
    return Status::error(b_.file_.path() + ": a CPU session with n_ctx = " + std::to_string(n_ctx_) + " needs " +
                         std::to_string(bytes) + " bytes (KV cache " + std::to_string(kv_floats * 4) +
                         "), more than the machine's " + std::to_string(phys) + " bytes of memory");
  try {
    f32_.resize(bufs->size());
    for (uint32_t id = 0; id < bufs->size(); ++id)
      if (b_.used_[id] && id != b_.ids_) f32_[id].assign(size_t(b_.max_batch_) * bufs->Get(id)->width(), 0.0f);
    ids_.assign(size_t(b_.max_batch_), 0);
    for (const auto& [layer, shape] : b_.kv_layers_) {
      const size_t per = size_t(n_ctx_) * shape.n_head_kv * shape.head_dim;
      std::vector<float>& kv = kv_[layer];
      kv.assign(2 * per, 0.0f);
      kv_views_[layer] = cpu::KvLayer{kv.data(), kv.data() + per, n_ctx_, shape.n_head_kv, shape.head_dim};
    }
    matmul_scratch_.assign(threads * b_.max_matmul_cols_, 0.0f);
    attn_scratch_.assign(threads * n_ctx_, 0.0f);
  } catch (const std::bad_alloc&) {
    return Status::error(b_.file_.path() + ": cannot allocate " + std::to_string(bytes) +
                         " bytes for a CPU session with n_ctx = " + std::to_string(n_ctx_));
  }
  bytes_ = bytes;
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Execute phase.

void CpuSession::run(const StepInfo& s, int n, bool all_rows) {
  switch (s.op) {
    case fb::OpKind::Embed:
      cpu::embed(b_.weights_[s.weight], s.src, ids_.data(), n, buf(s.out[0]));
      return;
    case fb::OpKind::RmsNorm:
      cpu::rmsNorm(buf(s.in[0]), s.vec, n, s.cols, s.eps, buf(s.out[0]));
      return;
    case fb::OpKind::HeadRmsNorm:
      cpu::headRmsNorm(buf(s.in[0]), s.vec, n, s.n_head, s.head_dim, s.eps);
      return;
    case fb::OpKind::MatMul: {
      // The logits projection computes only the last row unless every row is wanted.
      const int first = (s.logits && !all_rows) ? n - 1 : 0;
      cpu::matmul(b_.weights_[s.weight], s.src, s.vec, buf(s.in[0]) + int64_t(first) * s.cols, n - first,
                  buf(s.out[0]) + int64_t(first) * s.rows, &pool_, matmul_scratch_.data());
      return;
    }
    case fb::OpKind::Rope:
      cpu::rope(buf(s.in[0]), n, s.n_head, s.head_dim, s.n_rot, s.rope_style, s.rope_base, s.rope_scale, pos0_);
      cpu::rope(buf(s.in[1]), n, s.n_head_kv, s.head_dim, s.n_rot, s.rope_style, s.rope_base, s.rope_scale, pos0_);
      return;
    case fb::OpKind::Attention: {
      const cpu::KvLayer& cache = kv_views_.at(s.layer);
      cpu::kvStore(cache, buf(s.in[1]), buf(s.in[2]), n, pos0_);
      cpu::attention(buf(s.in[0]), cache, n, pos0_, s.n_head, buf(s.out[0]), &pool_, attn_scratch_.data());
      return;
    }
    case fb::OpKind::SwiGlu:
      cpu::swiGlu(buf(s.in[0]), buf(s.in[1]), int64_t(n) * s.cols, buf(s.out[0]));
      return;
    case fb::OpKind::Add:
      cpu::add(buf(s.in[0]), buf(s.in[1]), int64_t(n) * s.cols, buf(s.out[0]));
      return;
    default:
      return;  // QuantizeAct (skipped); prepareStep rejected everything else
  }
}

Status CpuSession::forward(std::span<const int32_t> tokens, int pos0, float* logits, bool all_rows) {
  const int n = static_cast<int>(tokens.size());
  if (n < 1 || n > b_.max_batch_ || pos0 < 0 || pos0 + n > n_ctx_)
    return Status::error("cpu forward: " + std::to_string(n) + " tokens at position " + std::to_string(pos0) +
                         " do not fit (max batch " + std::to_string(b_.max_batch_) + ", n_ctx " +
                         std::to_string(n_ctx_) + ")");
  for (int t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= b_.n_vocab_)
      return Status::error("cpu forward: token id " + std::to_string(tokens[t]) + " at batch row " +
                           std::to_string(t) + " is outside [0, " + std::to_string(b_.n_vocab_) + ")");
    ids_[t] = tokens[t];
  }
  pos0_ = pos0;
  for (const StepInfo& s : n == 1 ? b_.decode_ : b_.prefill_)
    if (!s.skip) run(s, n, all_rows);
  const float* src = f32_[b_.logits_].data();
  const size_t v = static_cast<size_t>(b_.n_vocab_);
  if (all_rows)
    std::memcpy(logits, src, sizeof(float) * v * n);
  else
    std::memcpy(logits, src + v * (n - 1), sizeof(float) * v);
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Backend>> createCpuBackend(const ArtifactFile& artifact) {
  auto backend = std::make_unique<CpuBackend>(artifact);
  MINFER_RETURN_IF_ERROR(backend->init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace minfer
