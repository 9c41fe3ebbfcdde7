// Activation-quantization plan rewrite (see plan_rewrite.h).
#include "compiler/codegen/plan_rewrite.h"

#include <map>

#include "llvm/Support/FormatVariadic.h"
#include "schema/op_traits.h"

namespace minfer::codegen {

llvm::Error insertActivationQuantization(model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts) {
  std::map<uint32_t, uint32_t> q8_of;  // source buffer id → its q8 buffer id (shared by both plans)
  for (std::vector<model::StepDesc>* plan : {&desc.plan.prefill, &desc.plan.decode}) {
    std::vector<model::StepDesc> out;
    out.reserve(plan->size() * 2);
    std::map<uint32_t, bool> fresh;  // q8 copy of a buffer is up to date
    for (model::StepDesc& step : *plan) {
      const bool quantized = step.op == fb::OpKind::MatMul && step.inputs.size() == 1 && !step.weights.empty() &&
                             step.weights[0] < layouts.size() &&
                             layouts[step.weights[0]].find(PlaneKind::kBlocks) >= 0;  // a quantized weight
      if (quantized) {
        const uint32_t src = step.inputs[0];
        if (src >= desc.plan.buffers.size())
          return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                         llvm::formatv("plan step '{0}': input buffer {1} out of range", step.name, src)
                                             .str());
        const model::BufferDesc b = desc.plan.buffers[src];
        if (b.width % 32 != 0)
          return llvm::createStringError(
              llvm::inconvertibleErrorCode(),
              llvm::formatv("plan step '{0}': quantized matmul input '{1}' has width {2}, not a multiple of 32",
                            step.name, b.name, b.width)
                  .str());
        auto it = q8_of.find(src);
        if (it == q8_of.end()) {
          desc.plan.buffers.push_back({b.name + ".q8", b.width, fb::BufferType::I8});
          it = q8_of.emplace(src, static_cast<uint32_t>(desc.plan.buffers.size() - 1)).first;
        }
        if (!fresh[src]) {
          model::StepDesc q{.op = fb::OpKind::QuantizeAct, .inputs = {src}, .outputs = {it->second}};
          q.cols = b.width;
          q.name = step.name + ".quantize_act";
          out.push_back(std::move(q));
          fresh[src] = true;
        }
        step.inputs.push_back(it->second);
      }
      for (uint32_t o : step.outputs) fresh[o] = false;
      out.push_back(std::move(step));
    }
    *plan = std::move(out);
  }
  return llvm::Error::success();
}

void buildLoadPlan(model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts) {
  desc.plan.load.clear();
  for (size_t i = 0; i < layouts.size(); ++i)
    if (std::find(layouts[i].derived.begin(), layouts[i].derived.end(), true) != layouts[i].derived.end())
      desc.plan.load.push_back({.op = fb::OpKind::ExpandBlocks,
                                .weights = {static_cast<uint32_t>(i)},
                                .name = layouts[i].desc.name + ".expand"});
}

size_t lastTokenTailBegin(const std::vector<model::StepDesc>& steps, uint32_t logits) {
  size_t begin = steps.size();
  while (begin > 0) {
    const OpTraits* t = opTraits(steps[begin - 1].op);
    if (!t || !t->row_wise || t->in_place) break;
    --begin;
  }
  // The tail must end in the logits and leave something before it (a plan of row-wise steps only has
  // nothing to save).
  const bool ends_in_logits = !steps.empty() && steps.back().outputs.size() == 1 && steps.back().outputs[0] == logits;
  return ends_in_logits && begin > 0 ? begin : steps.size();
}

}  // namespace minfer::codegen
