// Kernel uses per plan step (see kernel_spec.h): the table of op families, the step context and the
// helpers the families share.
#include "compiler/codegen/kernel_spec.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "compiler/codegen/ops/op_family.h"
#include "compiler/codegen/plan_rewrite.h"
#include "kernels/mmq.cuh"
#include "schema/op_traits.h"

namespace minfer::codegen {
namespace {

llvm::Error makeError(const llvm::Twine& message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message.str());
}

// Which family serves which op, indexed by OpKind (schema/op_traits.h MINFER_OPS).
using Family = Launches (*)(const StepContext&);
#define MINFER_FAMILY_ROW(kind, family, ...) family##Launches,
constexpr Family kFamilies[] = {MINFER_OPS(MINFER_FAMILY_ROW)};
#undef MINFER_FAMILY_ROW
static_assert(std::size(kFamilies) == std::size(kOpTraits), "one op family per OpKind");

}  // namespace

const std::vector<model::StepDesc>& planSteps(const model::ExecutionPlan& plan, PlanVariant variant) {
  switch (variant) {
    case PlanVariant::kPrefill: return plan.prefill;
    case PlanVariant::kDecode: return plan.decode;
    case PlanVariant::kLoad: return plan.load;
  }
  return plan.decode;
}

const char* planName(PlanVariant variant) {
  switch (variant) {
    case PlanVariant::kPrefill: return "prefill";
    case PlanVariant::kDecode: return "decode";
    case PlanVariant::kLoad: return "load";
  }
  return "unknown";
}

StepContext::StepContext(const model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts,
                         PlanVariant variant, size_t index)
    : desc_(desc),
      layouts_(layouts),
      variant_(variant),
      index_(index),
      step_(planSteps(desc.plan, variant)[index]) {}

bool StepContext::inTail() const {
  return prefill() && index_ >= lastTokenTailBegin(desc_.plan.prefill, desc_.plan.logits);
}

llvm::Error StepContext::error(const llvm::Twine& what) const {
  return makeError(llvm::formatv("{0} plan step {1} ('{2}'): ", planName(variant_), index_, step_.name) +
                   what);
}

llvm::Expected<const model::BufferDesc*> StepContext::input(size_t i, const char* what) const {
  if (i >= step_.inputs.size() || step_.inputs[i] >= desc_.plan.buffers.size())
    return error(llvm::formatv("{0} buffer (input #{1}) is missing or out of range", what, i));
  return &desc_.plan.buffers[step_.inputs[i]];
}

llvm::Expected<const model::BufferDesc*> StepContext::output(size_t i, const char* what) const {
  if (i >= step_.outputs.size() || step_.outputs[i] >= desc_.plan.buffers.size())
    return error(llvm::formatv("{0} buffer (output #{1}) is missing or out of range", what, i));
  return &desc_.plan.buffers[step_.outputs[i]];
}

model::ColumnView StepContext::inputView(size_t i) const {
  if (i < step_.input_views.size()) return step_.input_views[i];
  return {0, desc_.plan.buffers[step_.inputs[i]].width};
}

model::ColumnView StepContext::outputView(size_t i) const {
  if (i < step_.output_views.size()) return step_.output_views[i];
  return {0, desc_.plan.buffers[step_.outputs[i]].width};
}

llvm::Expected<const planes::TensorLayout*> StepContext::weight(size_t i) const {
  if (i >= step_.weights.size() || step_.weights[i] >= layouts_.size())
    return error(llvm::formatv("weight #{0} is missing or out of range", i));
  return &layouts_[step_.weights[i]];
}

llvm::Expected<const StrideTable*> StepContext::vector(size_t i, uint64_t n) const {
  auto w = weight(i);
  if (!w) return w.takeError();
  const StrideTable* t = findPlane(**w, PlaneKind::kF32);
  if (!t || t->rows * t->cols != n)
    return error(llvm::formatv("weight '{0}' needs an f32 plane of {1} values", (*w)->desc.name, n));
  return t;
}

SpecBuilder::SpecBuilder(std::string key, const char* source, const char* entry) {
  spec.key = std::move(key);
  spec.source = source;
  spec.entry = entry;
}

SpecBuilder& SpecBuilder::define(const char* name, std::string v) {
  spec.defines.emplace_back(name, std::move(v));
  return *this;
}

SpecBuilder& SpecBuilder::flag(const char* f) {
  spec.flags.emplace_back(f);
  return *this;
}

KernelArgDesc activationArg(const char* name, uint32_t buffer, uint32_t width, fb::Access access) {
  return {.kind = fb::ArgKind::Activation, .name = name, .buffer = buffer, .access = access, .width = width};
}

KernelArgDesc viewArg(const char* name, uint32_t buffer, uint32_t pitch, model::ColumnView view, fb::Access access) {
  KernelArgDesc a = activationArg(name, buffer, pitch, access);
  if (view.offset != 0 || view.width != pitch) a.view_offset = view.offset, a.view_width = view.width;
  return a;
}

KernelArgDesc weightArg(const char* name, uint32_t tensor, const StrideTable& plane) {
  return {.kind = fb::ArgKind::Weight, .name = name, .tensor = tensor, .plane = plane};
}

KernelArgDesc kindArg(fb::ArgKind kind, const char* name) { return {.kind = kind, .name = name}; }

void pushQ8Args(std::vector<KernelArgDesc>& args, const char* values, const char* meta, uint32_t buffer,
                uint32_t width, fb::Access access) {
  args.push_back({.kind = fb::ArgKind::Q8Values, .name = values, .buffer = buffer, .access = access, .width = width});
  args.push_back({.kind = fb::ArgKind::Q8Meta, .name = meta, .buffer = buffer, .access = access, .width = width});
}

const StrideTable* findPlane(const planes::TensorLayout& layout, PlaneKind kind) {
  const int i = layout.find(kind);
  return i < 0 ? nullptr : &layout.planes[static_cast<size_t>(i)];
}

const StrideTable* densePlane(const planes::TensorLayout& layout) {
  for (PlaneKind k : {PlaneKind::kF32, PlaneKind::kF16, PlaneKind::kBF16})
    if (const StrideTable* t = findPlane(layout, k)) return t;
  return nullptr;
}

const char* denseTag(PlaneKind kind) {
  switch (kind) {
    case PlaneKind::kF32: return "f32";
    case PlaneKind::kF16: return "f16";
    case PlaneKind::kBF16: return "bf16";
    default: return "?";
  }
}

std::string keyNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  std::string s;
  for (const char* p = buf; *p; ++p)
    if (*p != '+') s += *p;
  return s;
}

std::string KernelSpec::identity() const {
  std::string s = source + '\n' + entry + '\n';
  for (const auto& [name, value] : defines) s += "-D" + name + "=" + value + '\n';
  for (const std::string& f : flags) s += f + '\n';
  s += inline_source;
  return s;
}

std::string KernelSpec::define(const std::string& name) const {
  for (const auto& [n, v] : defines)
    if (n == name) return v;
  return "";
}

llvm::Expected<std::vector<KernelLaunch>> launchesForStep(const model::ModelDescription& desc,
                                                          llvm::ArrayRef<planes::TensorLayout> layouts,
                                                          PlanVariant variant, size_t step_index) {
  const auto& steps = planSteps(desc.plan, variant);
  if (step_index >= steps.size())
    return makeError(llvm::formatv("plan step {0} out of range ({1} steps)", step_index, steps.size()));
  const StepContext c(desc, layouts, variant, step_index);
  if (!opTraits(c.step().op))
    return c.error(llvm::formatv("unknown op kind {0}", static_cast<unsigned>(c.step().op)));
  const model::StepDesc& s = c.step();
  if (!s.input_views.empty() || !s.output_views.empty()) {  // format 1.4 column views
    if (!takesColumnViews(s.op)) return c.error(llvm::formatv("{0} steps take no column views", opName(s.op)));
    if (s.input_views.size() != s.inputs.size() || s.output_views.size() != s.outputs.size())
      return c.error("column views must be given for every operand or none");
    for (size_t i = 0; i < s.inputs.size() + s.outputs.size(); ++i) {
      const bool in = i < s.inputs.size();
      const size_t j = in ? i : i - s.inputs.size();
      const uint32_t id = in ? s.inputs[j] : s.outputs[j];
      const model::ColumnView v = in ? s.input_views[j] : s.output_views[j];
      if (id >= desc.plan.buffers.size() || v.width == 0 || uint64_t{v.offset} + v.width > desc.plan.buffers[id].width)
        return c.error(llvm::formatv("column view {0} + {1} of operand {2} is empty or outside its buffer", v.offset,
                                     v.width, i));
    }
  }
  return kFamilies[static_cast<size_t>(c.step().op)](c);
}

unsigned attnDecodeSplits(unsigned n_head_kv) {
  unsigned splits = 16;
  while (splits < 128 && splits * n_head_kv < 256) splits *= 2;
  return splits;
}

std::pair<unsigned, unsigned> chooseMmqTile(uint64_t n, uint64_t /*k*/) {
  const unsigned tm = n >= 1024 ? 128 : 64, tn = 64;
  static_assert(kern::kMmqThreads == 256, "tile choice assumes 8 warps");
  return {tm, tn};
}

std::string typeTag(uint32_t ggml_type) {
  std::string s;
  for (const char* p = ggmlTypeTraits(ggml_type).name; *p; ++p)
    if (*p != '_') s += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
  return s;
}

std::string floatLiteral(float v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // "10000" → "10000.0" ("inf"/"nan" have 'n')
  return s + "f";
}

}  // namespace minfer::codegen
