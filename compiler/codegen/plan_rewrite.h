// GPU plan rewrite: activation quantization before every MatMul on quantized weights.
//
// The GPU MatMul on a quantized weight (kI8 plane) reads its input as q8 (kernels/common.cuh: int8
// per 32 with scale and sums). This pass inserts, before the first such MatMul after each write of an
// input buffer B, a step  QuantizeAct {inputs: [B], outputs: [B.q8]}  (one q8 buffer per B, type I8,
// width = B's width), and appends B.q8 as the MatMul's second input. Consecutive MatMuls on the same
// B (q, k, v; gate, up) share one QuantizeAct. The CPU backend skips QuantizeAct and reads only the
// first MatMul input, so CPU results are unchanged. Applied to the prefill and the decode plan.
#pragma once

#include "compiler/model/model_desc.h"
#include "compiler/planes/layout_planner.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

namespace minfer::codegen {

// `layouts[i]` is the TensorLayout of desc.weights[i]. Idempotent: a MatMul that already has a
// second input is left alone. Errors: an input width not a multiple of 32 for a quantized weight.
llvm::Error insertActivationQuantization(model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts);

// The load plan: one ExpandBlocks step per tensor with derived planes (layouts[i].derived), named
// "<tensor>.expand", in tensor order, replacing desc.plan.load. CPU-only artifacts get it too (the CPU
// backend skips it: it reads the kBlocks planes).
void buildLoadPlan(model::ModelDescription& desc, llvm::ArrayRef<planes::TensorLayout> layouts);

// The plan's last-token tail (schema Plan): the first step of the longest suffix of row-wise, not
// in-place steps (op_traits.h), provided it ends by writing `logits` and does not cover the whole
// plan; steps.size() when there is none. For a llama-like plan: everything after the last attention.
size_t lastTokenTailBegin(const std::vector<model::StepDesc>& steps, uint32_t logits);

}  // namespace minfer::codegen
