// Launch fusion (schema Step.fused): a QuantizeAct step runs inside the launch of the step that produces
// its input (see op_family.h). Which producers can carry it, and the check both kernels make.
#include "compiler/codegen/ops/op_family.h"

namespace minfer::codegen {

bool fusesQuantize(const model::StepDesc& producer, const model::StepDesc& quant, PlanVariant variant) {
  const bool decode_attention =
      producer.op == fb::OpKind::Attention && variant == PlanVariant::kDecode && producer.head_dim % 32 == 0;
  const bool carrier = producer.op == fb::OpKind::RmsNorm || producer.op == fb::OpKind::SwiGlu ||
                       producer.op == fb::OpKind::GeGlu || decode_attention;
  // Column views (phi3's gate|up halves) keep their own kernels: the fused forms take whole buffers.
  const bool whole = producer.input_views.empty() && producer.output_views.empty();
  return carrier && whole && quant.op == fb::OpKind::QuantizeAct && producer.outputs.size() == 1 &&
         quant.inputs.size() == 1 && quant.inputs[0] == producer.outputs[0];
}

Launches fusedQuantizeLaunches(const StepContext& producer, const StepContext& quant) {
  switch (producer.step().op) {
    case fb::OpKind::RmsNorm: return rmsNormQuantizeLaunches(producer, quant);
    case fb::OpKind::Attention: return attentionQuantizeLaunches(producer, quant);
    default: return gluQuantizeLaunches(producer, quant);
  }
}

llvm::Error checkFusedQuantize(const StepContext& quant, uint32_t width) {
  auto q = quant.output(0, "output");
  if (!q) return q.takeError();
  if (width % 32 != 0 || (*q)->width != width || (*q)->type != fb::BufferType::I8)
    return quant.error(llvm::formatv("fused into the step before it: quantizes a width-{0} buffer into a width-{1} "
                                     "buffer; both must match, be a multiple of 32, and the output I8",
                                     width, (*q)->width));
  return llvm::Error::success();
}

}  // namespace minfer::codegen
