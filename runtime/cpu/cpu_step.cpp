// CPU backend plan steps: weight and buffer resolution for the op families, the arity check, and the
// prepare / run dispatch tables expanded from schema/op_traits.h MINFER_OPS.
#include "runtime/cpu/cpu_step.h"

#include <algorithm>
#include <cstring>
#include <iterator>

namespace minfer::cpu {
namespace {

// Which family serves which op, indexed by OpKind.
using PrepareFn = Status (*)(PrepareContext&, const fb::Step&, StepInfo&);
using RunFn = void (*)(RunContext&, const StepInfo&);
#define MINFER_CPU_PREPARE_ROW(kind, family, ...) family##Prepare,
#define MINFER_CPU_RUN_ROW(kind, family, ...) family##Run,
constexpr PrepareFn kPrepare[] = {MINFER_OPS(MINFER_CPU_PREPARE_ROW)};
constexpr RunFn kRun[] = {MINFER_OPS(MINFER_CPU_RUN_ROW)};
#undef MINFER_CPU_PREPARE_ROW
#undef MINFER_CPU_RUN_ROW
static_assert(std::size(kPrepare) == std::size(kOpTraits) && std::size(kRun) == std::size(kOpTraits),
              "one CPU op family per OpKind");

constexpr bool stepSlotsFitEveryOp() {
  for (const OpTraits& t : kOpTraits)
    if (t.max_inputs > StepInfo::kMaxIn || t.outputs > StepInfo::kMaxOut) return false;
  return true;
}
static_assert(stepSlotsFitEveryOp(), "StepInfo::in / out hold the buffers of every op in schema/op_traits.h");

// Checks the step's input, output and weight counts against its op's arity (schema/op_traits.h) and
// copies the buffer ids into `info`.
Status checkArity(const fb::Step& s, const OpTraits& t, StepInfo& info) {
  const uint32_t n_in = count(s.inputs()), n_out = count(s.outputs()), n_w = count(s.weights());
  if (n_in < t.min_inputs || n_in > t.max_inputs || n_out != t.outputs || n_w < t.min_weights ||
      n_w > t.max_weights)
    return Status::error(info.label + ": has " + std::to_string(n_in) + " inputs, " + std::to_string(n_out) +
                         " outputs, " + std::to_string(n_w) + " weights; expected " +
                         std::to_string(t.min_inputs) +
                         (t.max_inputs != t.min_inputs ? ".." + std::to_string(t.max_inputs) : "") + " inputs, " +
                         std::to_string(t.outputs) + " outputs, " + std::to_string(t.min_weights) +
                         (t.max_weights != t.min_weights ? ".." + std::to_string(t.max_weights) : "") + " weights");
  info.n_in = std::min(n_in, StepInfo::kMaxIn);
  for (uint32_t i = 0; i < info.n_in; ++i) info.in[i] = s.inputs()->Get(i);
  for (uint32_t i = 0; i < std::min(n_out, StepInfo::kMaxOut); ++i) info.out[i] = s.outputs()->Get(i);
  return Status::ok();
}

// The operands' column views (format 1.4) into info: from Step.input_views / output_views when present
// (only on ops that take them, one per operand, inside the buffer), else whole buffers. Buffer ids out
// of range are left to the families' buffer checks.
Status readViews(const PrepareContext& c, const fb::Step& s, StepInfo& info) {
  const auto side = [&](const flatbuffers::Vector<uint32_t>* ids, const flatbuffers::Vector<const fb::ColumnView*>* views,
                        uint32_t max, uint32_t* off, uint32_t* w, int64_t* pitch, const char* what) -> Status {
    const uint32_t n = std::min(count(ids), max);
    const bool has = views && views->size() > 0;
    if (has && !takesColumnViews(s.op()))
      return Status::error(info.label + ": has " + what + " column views, which the CPU backend takes on Rope, "
                           "Attention, SwiGlu, GeGlu and Add only");
    if (has && views->size() != count(ids))
      return Status::error(info.label + ": " + std::to_string(views->size()) + " " + what + " views for " +
                           std::to_string(count(ids)) + " " + what + "s");
    for (uint32_t i = 0; i < n; ++i) {
      const uint64_t bw = c.bufferWidth(ids->Get(i));
      pitch[i] = static_cast<int64_t>(bw);
      off[i] = 0;
      w[i] = static_cast<uint32_t>(bw);
      if (!has) continue;
      const fb::ColumnView* v = views->Get(i);
      if (v->width() == 0 || uint64_t{v->offset()} + v->width() > bw)
        return Status::error(info.label + ": " + what + " view " + std::to_string(i) + " (columns " +
                             std::to_string(v->offset()) + " + " + std::to_string(v->width()) +
                             ") is empty or outside its buffer of width " + std::to_string(bw));
      off[i] = v->offset();
      w[i] = v->width();
      info.views |= v->width() != bw;
    }
    return Status::ok();
  };
  MINFER_RETURN_IF_ERROR(side(s.inputs(), s.input_views(), StepInfo::kMaxIn, info.in_off, info.in_w, info.in_pitch, "input"));
  return side(s.outputs(), s.output_views(), StepInfo::kMaxOut, info.out_off, info.out_w, info.out_pitch, "output");
}

// The plane slot of `w` a plane of `kind` fills; nullptr for kPacked (skipped) and unknown kinds.
PlaneView* planeSlot(WeightPlanes& w, PlaneKind kind) {
  switch (kind) {
    case PlaneKind::kF32: case PlaneKind::kF16: case PlaneKind::kBF16: return &w.dense;
    case PlaneKind::kI8: return &w.q;
    case PlaneKind::kScale: return &w.scale;
    case PlaneKind::kMin: return &w.min;
    case PlaneKind::kBlocks: return &w.blocks;
    default: return nullptr;
  }
}

}  // namespace

Status PrepareContext::resolveTensor(uint32_t index, const std::string& label) {
  if (index >= weights.size())
    return Status::error(label + ": weight index " + std::to_string(index) + " ≥ " +
                         std::to_string(weights.size()) + " tensors");
  if (resolved[index]) return Status::ok();
  const fb::Tensor* t = m->tensors()->Get(index);
  WeightPlanes w;
  w.name = t->name()->c_str();
  if (!t->planes() || t->planes()->size() == 0)
    return Status::error(label + ": tensor '" + w.name + "' has no planes");
  for (const fb::Plane* p : *t->planes()) {
    if (p->derived()) continue;  // materialized on the GPU at load; the CPU reads the kBlocks plane
    const fb::StrideTable* l = p->layout();
    PlaneView v;
    v.table = toStrideTable(*l);
    v.data = file.segmentData(*p->data());
    v.size = p->data()->size();
    if (!v.data) return Status::error(label + ": tensor '" + w.name + "': a plane's segment lies outside the file");
    if (v.table.kind == PlaneKind::kPacked) continue;  // decode GEMV on the GPU only
    PlaneView* slot = planeSlot(w, v.table.kind);
    if (!slot)
      return Status::error(label + ": tensor '" + w.name + "' has a plane of unknown kind " +
                           std::to_string(l->kind()));
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
  MINFER_RETURN_IF_ERROR(checkWeightPlanes(w).withContext(label + ": "));
  weights[index] = w;
  resolved[index] = true;
  return Status::ok();
}

Result<const float*> PrepareContext::vectorWeight(uint32_t index, uint64_t length, const std::string& label) {
  MINFER_RETURN_IF_ERROR(resolveTensor(index, label));
  const WeightPlanes& w = weights[index];
  if (w.rows * w.cols != length || (w.rows != 1 && w.cols != 1))
    return Status::error(label + ": tensor '" + w.name + "' is " + std::to_string(w.rows) + " x " +
                         std::to_string(w.cols) + ", expected a vector of " + std::to_string(length));
  std::vector<float>& v = vectors[index];
  if (v.empty()) {
    Result<RowSource> src = pickRowSource(w, false);
    if (!src) return src.takeStatus().withContext(label + ": ");
    v.resize(length);
    std::vector<float> row(w.cols);
    for (uint64_t r = 0; r < w.rows; ++r) {
      dequantizeRow(w, *src, r, row.data());
      std::copy(row.begin(), row.end(), v.begin() + static_cast<int64_t>(r * w.cols));
    }
  }
  return static_cast<const float*>(v.data());
}

uint64_t PrepareContext::bufferWidth(uint32_t id) const {
  const auto* bufs = m->memory()->buffers();
  return id < bufs->size() ? bufs->Get(id)->width() : 0;
}

Status PrepareContext::buffer(const StepInfo& info, uint32_t id, uint64_t width, const char* role, bool ids) {
  const auto* bufs = m->memory()->buffers();
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
  used[id] = true;
  return Status::ok();
}

Status PrepareContext::operand(const StepInfo& info, bool input, uint32_t i, uint64_t width, const char* role) {
  const uint32_t id = input ? info.in[i] : info.out[i];
  const uint64_t w = input ? info.in_w[i] : info.out_w[i];
  if (w != bufferWidth(id) || (input ? info.in_off[i] : info.out_off[i]) != 0) {  // a proper view
    if (w != width)
      return Status::error(info.label + ": " + role + " view of buffer " + std::to_string(id) + " is " +
                           std::to_string(w) + " wide, expected " + std::to_string(width));
    return buffer(info, id, bufferWidth(id), role);
  }
  return buffer(info, id, width, role);
}

Status positive(const StepInfo& info, uint32_t v, const char* field) {
  if (v == 0 || v > (1u << 20))
    return Status::error(info.label + ": " + field + " = " + std::to_string(v) + " is out of range 1..2^20");
  return Status::ok();
}

Status prepareStep(PrepareContext& c, const fb::Step& s, StepInfo& info) {
  const OpTraits* traits = opTraits(s.op());
  if (!traits)
    return Status::error(info.label + ": op kind " + std::to_string(static_cast<int>(s.op())) +
                         " is not implemented by the CPU backend");
  if (!traits->gpu_only) {
    MINFER_RETURN_IF_ERROR(checkArity(s, *traits, info));
    MINFER_RETURN_IF_ERROR(readViews(c, s, info));
  }
  return kPrepare[static_cast<size_t>(s.op())](c, s, info);
}

void runStep(RunContext& c, const StepInfo& s) { kRun[static_cast<size_t>(s.op)](c, s); }

void findTail(PreparedPlan& plan, uint32_t logits) {
  const std::vector<StepInfo>& steps = plan.steps;
  size_t begin = steps.size();
  while (begin > 0 && steps[begin - 1].tail) --begin;
  plan.tail = steps.size();
  plan.tail_inputs.clear();
  if (begin == 0 || begin == steps.size() || steps.back().out[0] != logits) return;
  for (size_t i = 0; i < begin; ++i)
    if (steps[i].tail) return;  // not a suffix
  std::vector<uint32_t> written;
  for (size_t i = begin; i < steps.size(); ++i) {
    const StepInfo& s = steps[i];
    const OpTraits* t = opTraits(s.op);
    if (!t || !t->row_wise || t->in_place) return;
    if (s.skip) continue;  // GPU-only: reads and writes nothing here
    for (uint32_t k = 0; k < s.n_in; ++k)
      if (std::find(written.begin(), written.end(), s.in[k]) == written.end() &&
          std::find(plan.tail_inputs.begin(), plan.tail_inputs.end(), s.in[k]) == plan.tail_inputs.end())
        plan.tail_inputs.push_back(s.in[k]);
    for (uint32_t k = 0; k < t->outputs; ++k) written.push_back(s.out[k]);
  }
  plan.tail = begin;
}

namespace {

// Moves row out_rows[i] of every tail input to row i (out_rows increasing, so a row is read before it is
// overwritten) and makes out_rows 0 .. k−1. Buffers the CPU does not allocate are left alone.
void compactTailInputs(RunContext& c, const PreparedPlan& plan, uint32_t ids) {
  const size_t k = c.out_rows.size();
  for (uint32_t id : plan.tail_inputs) {
    const bool is_ids = id == ids;
    if (!is_ids && c.f32[id].empty()) continue;
    const size_t width = is_ids ? 1 : c.f32[id].size() / static_cast<size_t>(c.max_batch);
    uint8_t* base = is_ids ? reinterpret_cast<uint8_t*>(c.ids.data()) : reinterpret_cast<uint8_t*>(c.f32[id].data());
    const size_t row_bytes = width * 4;  // f32 and i32 rows alike
    for (size_t i = 0; i < k; ++i)
      if (static_cast<size_t>(c.out_rows[i]) != i)
        std::memcpy(base + i * row_bytes, base + static_cast<size_t>(c.out_rows[i]) * row_bytes, row_bytes);
  }
  for (size_t i = 0; i < k; ++i) c.out_rows[i] = static_cast<int32_t>(i);
}

}  // namespace

void runPlan(RunContext& c, const PreparedPlan& plan, uint32_t ids) {
  const int n = c.n;
  const bool shrink = plan.tail < plan.steps.size() && c.out_rows.size() < static_cast<size_t>(n);
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    if (shrink && i == plan.tail) {
      compactTailInputs(c, plan, ids);
      c.n = static_cast<int>(c.out_rows.size());
    }
    if (!plan.steps[i].skip) runStep(c, plan.steps[i]);
  }
  c.n = n;
}

}  // namespace minfer::cpu
